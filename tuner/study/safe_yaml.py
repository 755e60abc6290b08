"""YAML text to plain data, with bounds checked before anything walks the result.

A study file is small, hand-written configuration; what PyYAML's safe loader alone lets
through is not: a few kilobytes of nested anchors expand to billions of nodes once a
validator or the renderer walks them (the composed graph shares nodes, the walk does not),
a few thousand nested brackets exhaust the recursion limit, an anchor may contain its own
alias, a 100,000-digit integer or ``.inf`` reaches code that expects an ordinary number,
and a key given twice silently takes its last value. ``load_bounded`` refuses each of
these with a ``YamlInputError`` whose message is one line naming the line and column
(where there is one), and only then constructs Python objects.

Pure: text in, data out (the caller reads the file and bounds its size in bytes).
"""

from __future__ import annotations

import math
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

__all__ = ["YamlInputError", "load_bounded", "MAX_BYTES", "MAX_DEPTH", "MAX_NODES"]

# A shipped study file is 2-6 KB, about 400 nodes and 6 levels deep; these leave two
# orders of magnitude of room and keep the parsed document to a few MB of memory.
MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_NODES = 200_000
# Longest scalar that is turned into a number (Python's own limit is 4300 digits and
# raises a ValueError deep in the constructor).
_MAX_NUMBER_CHARS = 100


class YamlInputError(ValueError):
    """The text is not YAML the tuner accepts; the message is one line."""


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "unknown position"


def one_line(exc: yaml.YAMLError) -> str:
    """PyYAML's multi-line message (context, problem, a snippet with a caret) as one line."""

    if isinstance(exc, yaml.MarkedYAMLError):
        parts = [p for p in (exc.context, exc.problem) if p]
        text = "; ".join(" ".join(str(p).split()) for p in parts) or "invalid YAML"
        return f"{text} ({_where(exc.problem_mark or exc.context_mark)})"
    return " ".join(str(exc).split())


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that bounds composition depth, refuses duplicate keys and non-finite or
    oversized numbers. (The C loader cannot be hooked; study files are small.)"""

    max_depth = MAX_DEPTH

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        # Composition recurses once per nesting level: stop long before Python's limit.
        self._depth += 1
        try:
            if self._depth > self.max_depth:
                event = self.peek_event()  # type: ignore[no-untyped-call]
                raise YamlInputError(f"nested deeper than {self.max_depth} levels ({_where(event.start_mark)})")
            node: Node | None = super().compose_node(parent, index)
            return node
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # '<<: *base' merges; explicit keys beside it override on purpose
            key = self.construct_object(key_node, deep=False)
            try:
                earlier = seen.get(key)
            except TypeError:
                raise YamlInputError(f"a mapping key must be a plain value ({_where(key_node.start_mark)})") from None
            if earlier is not None:
                raise YamlInputError(f"key {_short(key)} is given twice ({_where(earlier.start_mark)} and "
                                     f"{_where(key_node.start_mark)}); keep one")
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        if len(node.value) > _MAX_NUMBER_CHARS:
            raise YamlInputError(f"number with {len(node.value)} characters ({_where(node.start_mark)}); "
                                 "no setting needs more than a few digits")
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node: ScalarNode) -> float:
        if len(node.value) > _MAX_NUMBER_CHARS:
            raise YamlInputError(f"number with {len(node.value)} characters ({_where(node.start_mark)})")
        value = super().construct_yaml_float(node)
        if not math.isfinite(value):
            raise YamlInputError(f"{node.value!s} is not a finite number ({_where(node.start_mark)}); "
                                 "give an ordinary number")
        return value


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)
_BoundedLoader.add_constructor("tag:yaml.org,2002:float", _BoundedLoader.construct_yaml_float)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_expansion(root: Node, *, max_nodes: int, max_depth: int) -> None:
    """Refuse a graph whose expansion (every alias counted where it is used) is too big or
    too deep, or that contains itself. Each node is visited once (memoised), so a bomb
    costs its composed size to check, not its expanded size."""

    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_nodes: set[int] = set()

    def visit(node: Node) -> tuple[int, int]:
        key = id(node)
        if key in size:
            return size[key], depth[key]
        if key in open_nodes:
            raise YamlInputError(f"an alias refers to a node that contains it ({_where(node.start_mark)})")
        open_nodes.add(key)
        total, deepest = 1, 0
        if isinstance(node, SequenceNode):
            children = list(node.value)
        elif isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        for child in children:
            n, d = visit(child)
            total += n
            deepest = max(deepest, d)
            if total > max_nodes:
                raise YamlInputError(
                    f"the document expands to more than {max_nodes:,} values (anchors and aliases "
                    f"count each time they are used; {_where(node.start_mark)})")
        if deepest + 1 > max_depth:
            raise YamlInputError(f"nested deeper than {max_depth} levels once aliases are expanded "
                                 f"({_where(node.start_mark)})")
        open_nodes.discard(key)
        size[key], depth[key] = total, deepest + 1
        return total, deepest + 1

    visit(root)


def load_bounded(text: str, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH,
                 max_nodes: int = MAX_NODES) -> Any:
    """The one YAML document in ``text`` as plain data, within the bounds above.

    Raises:
        YamlInputError: too large, too deep, too many values once expanded, a recursive
            alias, a duplicate key, a non-finite or oversized number, or not YAML at all.
    """

    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > max_bytes:
        raise YamlInputError(f"{size:,} bytes; a study file may have at most {max_bytes:,}")
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text)   # the reader refuses control characters here
        loader.max_depth = max_depth
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, max_nodes=max_nodes, max_depth=max_depth)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise YamlInputError(one_line(exc)) from None
    except RecursionError:
        # Only reachable with a lowered interpreter limit; the depth bound is far below it.
        raise YamlInputError(f"nested too deeply (more than {max_depth} levels)") from None
    finally:
        if loader is not None:
            loader.dispose()
