"""What values a vLLM knob accepts, and the one spelling two values compare in.

Each entry of the knob table (``tuner.vllm.knobs.KNOBS``) names one of these: ``check``
gives the error text a study file sees for an invalid value, ``canonical`` lets the
verifier and the compile-cache key compare YAML's ``"4"`` with the log's ``4``, or
cudagraph mode ``2`` with ``FULL``. Below them, vLLM's own vocabularies (cudagraph and
compilation modes, speculative methods, dtypes, NCCL algorithms).

Pure. Sources: ../shared/reference/vllm-knobs.md sections 1-4 and 7.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Values", "Choice", "Flag", "Int", "EnvInt", "IntList", "NcclList", "ANY"]


class Values:
    """A knob's valid values: ``check`` gives an error text (None: valid, or null), and
    ``canonical`` the one spelling two values compare in (None: cannot interpret it)."""

    def check(self, value: Any) -> str | None:
        return None

    def canonical(self, value: Any) -> Any:
        """Loose equality for any argument: YAML gives "4", vLLM's log 4."""
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, str):
            if value.strip().lower() in ("true", "false"):
                return value.strip().lower() == "true"
            if (number := _int(value)) is not None:
                return number
            try:
                return float(value)
            except ValueError:
                return value.strip().lower()
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, list | tuple):
            return [self.canonical(v) for v in value]
        if isinstance(value, dict):
            return {k: self.canonical(v) for k, v in value.items()}
        return value


_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}
_INT_RE = re.compile(r"[+-]?[0-9]+")


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INT_RE.fullmatch(value.strip()):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    return None


@dataclass(frozen=True)
class Choice(Values):
    """Named values; ``ints`` are vLLM's integer aliases, ``aliases`` other spellings."""

    names: tuple[str, ...]
    ints: Mapping[int, str] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)
    case_sensitive: bool = False

    def check(self, value: Any) -> str | None:
        if value is None:
            return None
        allowed = ", ".join(self.names)
        if self.ints and isinstance(value, int) and not isinstance(value, bool):
            return None if value in self.ints else (
                f"{value!r} is not allowed; allowed: {allowed} or {', '.join(map(str, self.ints))}")
        if isinstance(value, str):
            ok = value in self.names if self.case_sensitive else value.upper() in {
                n.upper() for n in self.names}
            if ok:
                return None
        return f"{value!r} is not allowed; allowed: {allowed}"

    def canonical(self, value: Any) -> Any:
        if (number := _int(value)) is not None:
            return self.ints.get(number)
        if not isinstance(value, str) or not value.strip():
            return None
        text = value.strip().lower().removeprefix("torch.")
        text = self.aliases.get(text, text)
        return text if self.case_sensitive else text.upper()


@dataclass(frozen=True)
class Flag(Values):
    """A boolean argument; ``env=True``: an environment switch written 0/1."""

    env: bool = False

    def check(self, value: Any) -> str | None:
        if self.env:
            ok = value is None or str(value).strip().lower() in {"0", "1", "true", "false"}
            return None if ok else f"{value!r} is not allowed; allowed: 0, 1"
        if value is None or isinstance(value, bool):
            return None
        return f"{value!r} is not a boolean; allowed: true, false"

    def canonical(self, value: Any) -> Any:
        return _bool(value)


@dataclass(frozen=True)
class Int(Values):
    low: int
    high: int | None = None
    choices: tuple[int, ...] = ()

    def check(self, value: Any) -> str | None:
        if value is None:
            return None
        if self.choices:  # an environment value: text that must spell one of the choices
            number = _int(value) if not isinstance(value, float) else None
            if number in self.choices and str(value).strip() == str(number):
                return None
            return f"{value!r} is not allowed; allowed: {', '.join(map(str, self.choices))}"
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{value!r} is not an integer"
        if value < self.low or (self.high is not None and value > self.high):
            upper = f"..{self.high}" if self.high is not None else " or more"
            return f"{value!r} is out of range; allowed: {self.low}{upper}"
        return None

    def canonical(self, value: Any) -> Any:
        return _int(value)


@dataclass(frozen=True)
class EnvInt(Values):
    """An environment variable holding a whole number, ``low`` or more; ``why`` says why."""

    low: int
    why: str = ""

    def check(self, value: Any) -> str | None:
        if value is None:
            return None
        allowed = f"allowed: a whole number, {self.low} or more" + (
            f" ({self.why})" if self.why else "")
        number = _int(value) if not isinstance(value, float) else None
        if number is None or str(value).strip() != str(number):
            return f"{value!r} is not a whole number; {allowed}"
        if number < self.low:
            return f"{value!r} is too low; {allowed}"
        return None

    def canonical(self, value: Any) -> Any:
        return _int(value)


class IntList(Values):
    def canonical(self, value: Any) -> Any:
        if not isinstance(value, list | tuple):
            return None
        numbers = [_int(v) for v in value]
        return None if any(n is None for n in numbers) else sorted(n for n in numbers if n is not None)


@dataclass(frozen=True)
class NcclList(Values):
    """NCCL list syntax: ``A,B``, ``^A`` (exclude); NCCL_ALGO also ``a,b;allreduce:tree``."""

    names: tuple[str, ...]
    per_collective: bool = False

    def check(self, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            return (f"{value!r} is not allowed; give a comma list of {', '.join(self.names)} "
                    "(optionally ^-prefixed)")
        lowered = {n.lower() for n in self.names}
        for section in value.split(";") if self.per_collective else [value]:
            names = section.split(":", 1)[1] if self.per_collective and ":" in section else section
            for name in names.removeprefix("^").split(","):
                if name.strip().lower() not in lowered:
                    return (f"{value!r} is not allowed: {name.strip()!r} is not one of "
                            f"{', '.join(self.names)} (comma list, optionally ^-prefixed to exclude)")
        return None

    def canonical(self, value: Any) -> Any:
        return str(value).replace(" ", "").upper()


ANY = Values()
