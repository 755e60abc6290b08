"""Reading a study file: YAML text -> a checked ``StudySpec``, or ``SpecError`` whose lines
each name the file, the field path, the bad value and what is allowed.

Above both ``tuner.study.spec`` (the models) and ``tuner.study.space`` (conditions,
forbidden rules): a study's baseline and starting points must be complete and allowed,
which only the space can tell.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from tuner.errors import SpecError
from tuner.study import space
from tuner.study.parameters import BoolParam, CategoricalParam, FloatParam, IntParam
from tuner.study.safe_yaml import YamlInputError, load_bounded
from tuner.study.spec import StudySpec

__all__ = ["parse_study", "load_study_data"]


def _format_loc(loc: tuple[Any, ...], data: Any) -> str:
    """Render a pydantic location as ``parameters[2] (cudagraph_mode).values``."""

    parts: list[str] = []
    node = data
    for item in loc:
        if isinstance(item, int):
            label = f"[{item}]"
            if isinstance(node, list) and 0 <= item < len(node):
                node = node[item]
                if isinstance(node, dict) and "name" in node:
                    label += f" ({node['name']})"
            else:
                node = None
            parts.append(label)
        else:
            if item in ("categorical", "int", "float", "bool") and isinstance(node, dict):
                continue  # the discriminator tag adds nothing for the reader
            parts.append(("." if parts else "") + str(item))
            node = node.get(item) if isinstance(node, dict) else None
    return "".join(parts) or "(top level)"


def _lookup(data: Any, loc: tuple[Any, ...]) -> tuple[bool, Any]:
    node = data
    for item in loc:
        if isinstance(node, dict) and item in node:
            node = node[item]
        elif isinstance(node, list) and isinstance(item, int) and 0 <= item < len(node):
            node = node[item]
        elif item in ("categorical", "int", "float", "bool"):
            continue
        else:
            return False, None
    return True, node


def _allowed_keys(loc: tuple[Any, ...], data: Any) -> list[str]:
    """Field names of the model at ``loc``, for 'unknown key' messages."""

    import typing

    model: Any = StudySpec
    node = data
    for item in loc:
        if isinstance(item, int):
            node = node[item] if isinstance(node, list) and item < len(node) else None
            continue
        if item in ("categorical", "int", "float", "bool"):
            model = {"categorical": CategoricalParam, "int": IntParam,
                     "float": FloatParam, "bool": BoolParam}[item]
            continue
        field = getattr(model, "model_fields", {}).get(item)
        if field is None:
            return []
        node = node.get(item) if isinstance(node, dict) else None
        model = None
        stack = [field.annotation]
        while stack:
            ann = stack.pop()
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                model = ann
                break
            stack.extend(typing.get_args(ann))
        if model is None:
            return []
    return sorted(getattr(model, "model_fields", {}))


_MAX_ERROR_LINES = 10


def _printable(text: str, limit: int = 300) -> str:
    """One line of at most ``limit`` characters: control characters escaped (a value with
    a newline must not start a line of its own in a terminal or a log)."""

    text = "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_study_data(text: str, source: str = "<study>") -> dict[str, Any]:
    """A study file's YAML as a mapping, within safe_yaml's bounds (size, depth, aliases,
    duplicate keys, numbers), or SpecError in one line."""

    try:
        data = load_bounded(text)
    except YamlInputError as exc:
        raise SpecError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{source}: the study file must be a mapping of sections, got {type(data).__name__}")
    return data


def parse_study(text: str, source: str = "<study>", *, saved: bool = False) -> StudySpec:
    """Parse YAML text into a StudySpec, or raise SpecError naming source, field and value
    (one line per problem, at most ten). ``saved``: a study's own spec.yaml, which may hold
    keys a study file may no longer set (e.g. the retired template probe's)."""

    data = load_study_data(text, source)
    try:
        spec = StudySpec.model_validate(data, context={"saved": saved})
    except ValidationError as exc:
        lines = []
        errors = exc.errors()
        for err in errors[:_MAX_ERROR_LINES]:
            loc = tuple(err["loc"])
            where = _format_loc(loc, data)
            message = err["msg"].removeprefix("Value error, ")
            found, value = _lookup(data, loc)
            got = ""
            if found and err["type"] not in ("missing",) and not isinstance(value, (dict, list)):
                got = f" (got {_printable(repr(value), 80)})"
            if err["type"] == "extra_forbidden":
                where = _format_loc(loc[:-1], data)
                allowed = _allowed_keys(loc[:-1], data)
                message = f"unknown key {_printable(repr(loc[-1]), 80)}" + (
                    f"; allowed: {', '.join(allowed)}" if allowed else "")
                got = ""
            prefix = f"{source}: {_printable(where, 200)}: " if loc else f"{source}: "
            lines.append(prefix + _printable(message, 400) + got)
        if len(errors) > _MAX_ERROR_LINES:
            lines.append(f"{source}: ... and {len(errors) - _MAX_ERROR_LINES} more problem(s)")
        raise SpecError("\n".join(lines)) from None
    # The points that run first must be complete and allowed (the space's conditions and
    # forbidden rules: the reason this is not in the spec module, which the space builds on).
    try:
        space.baseline_values(spec)
        space.starting_point_values(spec)
    except ValueError as exc:
        raise SpecError(f"{source}: {_printable(str(exc), 400)}") from None
    return spec
