"""Which values of a study are secrets, and how each is written instead: as a reference.

A secret is the value of
- an environment variable with a secret-looking name (``HF_TOKEN``, ``*_API_KEY``,
  ``*_TOKEN``, ``*PASSWORD*``, ``*SECRET*``, ...) or listed in ``server.secret_env``;
- a flag with such a name (``api_key``, ``hf_token``, ``ssl_keyfile_password``, a config
  field ``kv_transfer_config.auth_token``) or listed in ``server.secret_flags``.

Every secret has a *reference*: the environment variable that holds it where the study
is run and where an export is deployed - the variable's own name, the flag's upper-cased
(``api_key`` -> ``API_KEY``), or the name the study gives when it writes the value as a
reference itself (``api_key: ${VLLM_API_KEY}``). Nothing the tuner writes (study folder,
storage, logs, outputs, exports) holds a secret's value; it holds ``${REF}``:

- ``public_server`` replaces every secret value of a server section by ``${REF}`` (the
  saved spec.yaml, exports and ``tuner validate`` are rendered from it);
- ``resolve_server`` does the opposite from an environment mapping, where a study is run
  (a resumed study reads its secrets from the environment: they were never saved);
- ``Redactor`` replaces known values wherever they appear in text or data (server logs,
  commands, verification records, outcomes): the net for what is rendered from the real
  values, or printed by the server itself.

Pure: the environment is passed in as a mapping.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tuner.vllm.knobs import env_text

__all__ = ["is_secret_name", "flag_reference", "as_reference", "reference_name", "SecretSlot",
           "secret_slots", "public_server", "public_spec", "resolve_server", "known_values", "Redactor",
           "MIN_SECRET_CHARS", "MARK", "split_marked", "API_KEY_ENV", "api_key_ref", "api_key", "bearer"]

# Words of a name that make it a secret: a whole word (API_KEY, TOKEN, ...) - 'tokens' or
# 'tokenizer' are not - or anywhere for PASSWORD/PASSWD/SECRET.
_SECRET_WORDS = re.compile(
    r"(^|_)(API_?KEY|APIKEY|TOKEN|AUTH_?TOKEN|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIALS?|PASSPHRASE)($|_)")
_SECRET_ANYWHERE = re.compile(r"PASSWORD|PASSWD|SECRET")
_REFERENCE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")

# A secret shorter than this cannot be told apart from ordinary text in a server log
# (replacing every "abc" in it would garble what verification reads); no real token is.
MIN_SECRET_CHARS = 8

# How an export marks a reference inside a word: MARK + name + MARK. NUL never occurs in
# a real argument or environment value (exec cannot carry it), so the mark is unambiguous.
MARK = "\0"


def _words_of(name: str) -> str:
    return re.sub(r"[^A-Z0-9]+", "_", name.upper())


def is_secret_name(name: str) -> bool:
    """A variable or flag name (``HF_TOKEN``, ``api_key``, ``a.auth_token``) whose value is a secret."""

    words = _words_of(name)
    return bool(_SECRET_WORDS.search(words) or _SECRET_ANYWHERE.search(words))


def flag_reference(target: str) -> str:
    """The variable a secret flag's value is referred to by: ``api_key`` -> ``API_KEY``."""

    return _words_of(target).strip("_")


def reference_name(value: Any) -> str | None:
    """``NAME`` when ``value`` is written as a reference ``${NAME}``, else None."""

    found = _REFERENCE.match(value) if isinstance(value, str) else None
    return found.group(1) if found else None


def as_reference(name: str) -> str:
    return "${" + name + "}"


@dataclass(frozen=True)
class SecretSlot:
    """One secret of a server section: where it is (``env:NAME`` or a flag target), the
    reference it is written as, and its value as the section holds it (a literal, the
    reference itself, or None: passed through from the environment, never in the study)."""

    where: str
    ref: str
    value: str | None


def _leaves(prefix: str, value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(f"{prefix}.{k}", v)]
    return [(prefix, value)]


def secret_slots(server: Any) -> list[SecretSlot]:
    """The secrets of a ``ServerSpec`` (or anything with ``env``, ``flags``,
    ``secret_env`` and ``secret_flags``), in file order."""

    listed_env = set(getattr(server, "secret_env", ()) or ())
    listed_flags = set(getattr(server, "secret_flags", ()) or ())
    slots: list[SecretSlot] = []
    for name, value in server.env.items():
        if value is not None and (name in listed_env or is_secret_name(name)):
            text = env_text(value)
            slots.append(SecretSlot(f"env:{name}", reference_name(text) or name, text))
    for name in getattr(server, "secret_env", ()) or ():
        if name not in server.env:
            slots.append(SecretSlot(f"env:{name}", name, None))
    for key, value in server.flags.items():
        for target, leaf in _leaves(key, value):
            if leaf is None:
                continue
            if target in listed_flags or key in listed_flags or is_secret_name(target.split(".")[-1]):
                text = env_text(leaf)
                slots.append(SecretSlot(target, reference_name(text) or flag_reference(target), text))
    return slots


def _replace_leaves(flags: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    def walk(prefix: str, node: Any) -> Any:
        if isinstance(node, dict):
            return {k: walk(f"{prefix}.{k}", v) for k, v in node.items()}
        return values.get(prefix, node)

    return {k: walk(k, v) for k, v in flags.items()}


def _with(server: Any, values: Mapping[str, str]) -> Any:
    """``server`` with the slots in ``values`` (where -> new value) replaced."""

    env = {name: values.get(f"env:{name}", value) for name, value in server.env.items()}
    flags = _replace_leaves(server.flags, values)
    return server.model_copy(update={"env": env, "flags": flags})


def public_server(server: Any) -> Any:
    """``server`` with every secret value written as its reference ``${REF}``."""

    return _with(server, {s.where: as_reference(s.ref) for s in secret_slots(server) if s.value is not None})


def resolve_server(server: Any, environ: Mapping[str, str]) -> Any:
    """``server`` with every secret given as a reference read from ``environ``.

    Raises:
        ValueError: a referenced variable is not set (or empty), or a secret is shorter
            than MIN_SECRET_CHARS; the message names the variables and says what to do.
    """

    values: dict[str, str] = {}
    missing: list[str] = []
    for slot in secret_slots(server):
        ref = reference_name(slot.value)
        if ref is None:
            continue
        if environ.get(ref):
            values[slot.where] = environ[ref]
        else:
            missing.append(f"{ref} (for {slot.where.removeprefix('env:')})")
    if missing:
        raise ValueError(
            f"secret(s) not set in the environment: {', '.join(missing)}; a study never writes a "
            "secret's value, so set each variable before `tuner run`/`resume`")
    resolved = _with(server, values)
    short = [s.ref for s in secret_slots(resolved)
             if s.value is not None and reference_name(s.value) is None and len(s.value) < MIN_SECRET_CHARS]
    if short:
        raise ValueError(f"secret(s) {', '.join(short)} shorter than {MIN_SECRET_CHARS} characters: too short "
                         "to be told apart from ordinary text in server logs")
    return resolved


def known_values(server: Any) -> dict[str, str]:
    """reference -> value of the secrets a (resolved) server section holds itself; those
    passed through from the environment (``secret_env`` only) are not among them."""

    return {s.ref: s.value for s in secret_slots(server)
            if s.value is not None and reference_name(s.value) is None}


def public_spec(spec: Any) -> Any:
    """A study spec (anything with a ``server`` section) with its secrets as references."""

    return spec.model_copy(update={"server": public_server(spec.server)})


class Redactor:
    """Replaces every known secret value in text and data by its reference.

    ``values``: reference -> value. A value is also found in the forms a server or a
    JSON writer prints it in (JSON-escaped, Python-repr-escaped). Values shorter than
    MIN_SECRET_CHARS are ignored (they are refused where a study is run).
    """

    def __init__(self, values: Mapping[str, str | None] | Iterable[tuple[str, str | None]] = ()) -> None:
        pairs = values.items() if isinstance(values, Mapping) else values
        forms: dict[str, str] = {}
        for ref, value in pairs:
            if not value or len(value) < MIN_SECRET_CHARS or reference_name(value) is not None:
                continue
            for form in (value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1],
                         repr(value)[1:-1]):
                forms.setdefault(form, ref)
        # Longest first: a secret that contains another is replaced whole.
        self._forms = sorted(forms.items(), key=lambda item: -len(item[0]))
        self.refs = sorted(set(forms.values()))

    def __bool__(self) -> bool:
        return bool(self._forms)

    @property
    def longest(self) -> int:
        return len(self._forms[0][0]) if self._forms else 0

    @property
    def has_newline(self) -> bool:
        return any("\n" in form for form, _ in self._forms)

    def text(self, text: str, *, marked: bool = False) -> str:
        """``text`` with each value replaced by ``${REF}`` (``marked``: by MARK REF MARK)."""

        for form, ref in self._forms:
            if form in text:
                text = text.replace(form, MARK + ref + MARK if marked else as_reference(ref))
        return text

    def data(self, value: Any) -> Any:
        """JSON-like ``value`` with every string (keys too) passed through ``text``."""

        if not self._forms:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.data(k): self.data(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.data(v) for v in value]
        return value

    def mapping(self, value: Mapping[str, Any]) -> dict[str, Any]:
        """``data`` of a JSON object, typed as one."""

        redacted: dict[str, Any] = self.data(dict(value))
        return redacted


def split_marked(word: str) -> list[tuple[bool, str]]:
    """A marked word as (is_reference, text) parts: literal text and reference names."""

    parts = word.split(MARK)
    if len(parts) % 2 == 0:
        raise ValueError("unbalanced reference mark")
    return [(i % 2 == 1, part) for i, part in enumerate(parts) if part or i % 2 == 1]


API_KEY_ENV = "VLLM_API_KEY"
"""The variable vLLM reads its API key from when ``--api-key`` is not given."""


def api_key_ref(server: Any) -> str | None:
    """The reference of the API key a server section starts its server with: the
    ``api_key`` flag's, else ``VLLM_API_KEY``'s in ``env``/``secret_env`` (vLLM: the flag
    wins); None when the section names neither."""

    slots = {s.where: s.ref for s in secret_slots(server)}
    return slots.get("api_key") or slots.get(f"env:{API_KEY_ENV}")


def api_key(ref: str | None, values: Mapping[str, str], environ: Mapping[str, str]) -> str | None:
    """The key a server started that way requires: the study's (``ref``: its value in
    ``values``, the study's own secrets, else in ``environ``), or with none named
    ``VLLM_API_KEY`` from ``environ``, the environment the server inherits, as vLLM reads it."""

    if ref is not None:
        return values.get(ref) or environ.get(ref) or None
    return environ.get(API_KEY_ENV) or None


def bearer(key: str | None) -> dict[str, str]:
    """The headers that carry ``key`` as vLLM's ``--api-key`` checks it; none without one."""

    return {"Authorization": f"Bearer {key}"} if key else {}
