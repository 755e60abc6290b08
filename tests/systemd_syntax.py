"""A reader of the few unit-file rules the export relies on, written from systemd's own
code (src/basic/extract-word.c, src/basic/escape.c cunescape_one, config_parse_exec and
config_parse_environ in src/core/load-fragment.c, replace_env_argv in src/basic/env-util.c)
rather than from the tuner's writer, so a test can check the writer against it.

- A unit file is read line by line; a line ending in a backslash continues on the next
  one (the backslash becomes a space); lines starting with '#' or ';' are comments.
- Environment= and ExecStart= values are split into words by extract_first_word with
  EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE: whitespace separates words; '...' and "..." quote
  (anywhere in a word); a backslash starts a C escape inside and outside quotes.
- Each word then goes through specifier expansion: '%%' is '%' (the export writes no
  other specifier, so any other '%x' is an error here).
- ExecStart= words are expanded at start: '$$' is '$', '${NAME}' the variable's value;
  a word that is exactly ';' (unquoted) separates commands, and the first word may carry
  the prefixes @ - : + !.
- Environment= takes NAME=VALUE words; '$' means nothing there.
"""

from __future__ import annotations

import re

__all__ = ["UnitSyntaxError", "read_unit", "environment_words", "exec_words", "expand_exec_word"]

WHITESPACE = " \t\n\r"


class UnitSyntaxError(ValueError):
    pass


def read_unit(text: str) -> list[tuple[str, str, str]]:
    """(section, key, raw value) for every assignment, in order."""

    out: list[tuple[str, str, str]] = []
    section = ""
    pending = ""
    for line in text.split("\n"):
        if pending:
            line = pending + line
            pending = ""
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        if stripped.endswith("\\"):
            pending = stripped[:-1] + " "
            continue
        if stripped.startswith("[") and stripped.endswith("]"):
            section = stripped[1:-1]
            continue
        if "=" not in stripped:
            raise UnitSyntaxError(f"not an assignment: {stripped!r}")
        key, value = stripped.split("=", 1)
        out.append((section, key.strip(), value.strip()))
    if pending:
        raise UnitSyntaxError("file ends in a continuation")
    return out


_SIMPLE = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
           "\\": "\\", '"': '"', "'": "'", "s": " "}


def _cunescape_one(text: str, i: int) -> tuple[str, int]:
    """The character escaped at text[i:] (after the backslash) and how many characters
    the escape used; UnitSyntaxError where systemd refuses it (it would warn and keep the
    backslash: a writer must never produce that)."""

    if i >= len(text):
        raise UnitSyntaxError("trailing backslash")
    c = text[i]
    if c in _SIMPLE:
        return _SIMPLE[c], 1
    if c == "x":
        digits = text[i + 1:i + 3]
        if not re.fullmatch(r"[0-9a-fA-F]{2}", digits) or int(digits, 16) == 0:
            raise UnitSyntaxError(f"bad \\x escape {text[i:i + 3]!r}")
        return chr(int(digits, 16)), 3
    if c in "uU":
        n = 4 if c == "u" else 8
        digits = text[i + 1:i + 1 + n]
        if not re.fullmatch(rf"[0-9a-fA-F]{{{n}}}", digits) or int(digits, 16) == 0:
            raise UnitSyntaxError(f"bad \\{c} escape")
        return chr(int(digits, 16)), 1 + n
    if c in "01234567":
        digits = text[i:i + 3]
        if not re.fullmatch(r"[0-7]{3}", digits) or int(digits, 8) == 0:
            raise UnitSyntaxError("bad octal escape")
        return chr(int(digits, 8)), 3
    raise UnitSyntaxError(f"unknown escape \\{c}")


def split_words(value: str) -> list[tuple[str, str]]:
    """extract_first_word(EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE) repeated: (word, raw text)."""

    words: list[tuple[str, str]] = []
    i, n = 0, len(value)
    while True:
        while i < n and value[i] in WHITESPACE:
            i += 1
        if i >= n:
            return words
        start = i
        word: list[str] = []
        quote = ""
        while i < n:
            c = value[i]
            if quote:
                if c == quote:
                    quote = ""
                    i += 1
                elif c == "\\":
                    ch, used = _cunescape_one(value, i + 1)
                    word.append(ch)
                    i += 1 + used
                else:
                    word.append(c)
                    i += 1
            elif c in "'\"":
                quote = c
                i += 1
            elif c == "\\":
                ch, used = _cunescape_one(value, i + 1)
                word.append(ch)
                i += 1 + used
            elif c in WHITESPACE:
                break
            else:
                word.append(c)
                i += 1
        if quote:
            raise UnitSyntaxError(f"unbalanced quoting in {value[start:]!r}")
        words.append(("".join(word), value[start:i]))


def _specifiers(word: str) -> str:
    out, i = [], 0
    while i < len(word):
        if word[i] == "%":
            if word[i + 1:i + 2] != "%":
                raise UnitSyntaxError(f"specifier %{word[i + 1:i + 2]} in {word!r}")
            out.append("%")
            i += 2
        else:
            out.append(word[i])
            i += 1
    return "".join(out)


def environment_words(value: str) -> dict[str, str]:
    """The variables one Environment= line sets."""

    env = {}
    for word, _ in split_words(value):
        word = _specifiers(word)
        name, sep, val = word.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise UnitSyntaxError(f"invalid environment assignment {word!r}")
        env[name] = val
    return env


def exec_words(value: str) -> list[str]:
    """The words of one ExecStart= line (one command; prefixes on the first word refused:
    the export never writes them), before variable expansion."""

    words = []
    for word, raw in split_words(value):
        if raw == ";":
            raise UnitSyntaxError("a second command (lone ';') in ExecStart=")
        words.append(_specifiers(word))
    if not words:
        raise UnitSyntaxError("empty ExecStart=")
    if words[0][:1] in ("@", "-", ":", "+", "!") or not words[0].startswith("/"):
        raise UnitSyntaxError(f"ExecStart= program {words[0]!r} is not a plain absolute path")
    return words


def expand_exec_word(word: str, env: dict[str, str]) -> str:
    """replace_env_argv for one word: '$$' -> '$', '${NAME}' -> its value (unknown: empty).
    A bare '$NAME' word would be split at whitespace: the export never writes one."""

    out, i = [], 0
    while i < len(word):
        c = word[i]
        if c != "$":
            out.append(c)
            i += 1
            continue
        nxt = word[i + 1:i + 2]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "{":
            end = word.find("}", i + 2)
            if end < 0:
                raise UnitSyntaxError(f"unterminated ${{ in {word!r}")
            out.append(env.get(word[i + 2:end], ""))
            i = end + 1
        elif re.match(r"[A-Za-z_]", nxt):
            raise UnitSyntaxError(f"bare $NAME in {word!r}")
        else:
            out.append("$")
            i += 1
    return "".join(out)
