"""YAML for rule files with bounds, so that no file can freeze or exhaust the agent.

PyYAML's ``SafeLoader`` builds no arbitrary objects, but it still lets a small file describe an
enormous value: an alias names a node again without copying it (a 740-byte "billion laughs"
file is a tree of some 10**9 nodes once expanded, which validation and error messages then
walk), nesting recurses in the composer, and a 5,000-digit number overflows ``int`` (Python
refuses to convert more than 4,300 digits: ``sys.get_int_max_str_digits``). This loader is a
``SafeLoader`` subclass that composes the node graph with a depth bound, then checks the graph
before a single Python value is constructed from it:

- nesting at most :data:`MAX_DEPTH` levels, also through aliases;
- at most :data:`MAX_NODES` nodes with every alias and merge key (``<<``) counted as the copy it
  stands for; a recursive alias (``&a [*a]``) is refused;
- keys are scalars (a sequence or mapping key is unhashable in Python), never twice in a
  mapping (PyYAML keeps the last silently: ``for: 1m`` then ``for: 0s`` would mean 0 s);
- numbers at most :data:`MAX_NUMBER_CHARS` characters;
- text is Unicode that UTF-8 can write (a ``"\\ud800"`` escape gives a lone surrogate, which
  every later encode would fail on).

Each problem is a :class:`YamlProblem` with the 1-based line and the field path
(``spec.rules[0].for``) of the node at fault.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import yaml

__all__ = [
    "MAX_DEPTH",
    "MAX_NODES",
    "MAX_NUMBER_CHARS",
    "YamlProblem",
    "field_path",
    "load_bounded",
]

#: Nesting levels; a rule file needs about 7 (spec, rules, a rule, actions, an action, args).
MAX_DEPTH = 64
#: Nodes once aliases are expanded; rules/default.yaml has about 200 in 4.5 KB, and a file at
#: the loader's size bound (256 KiB) of plain YAML stays below this.
MAX_NODES = 200_000
#: Characters of one number: a threshold, a count or a duration in seconds never needs more.
MAX_NUMBER_CHARS = 64

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_MERGE = "tag:yaml.org,2002:merge"


class YamlProblem(Exception):
    """A YAML text that is not loaded: the 1-based ``line``, the ``field`` path of the node at
    fault (``(yaml)`` for the text itself) and what is wrong."""

    def __init__(self, *, line: int, field: str, message: str) -> None:
        super().__init__(f"{line}: {field}: {message}")
        self.line, self.field, self.message = line, field, message


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")


def field_path(loc: Sequence[int | str]) -> str:
    """``("spec", "rules", 0, "for")`` -> ``spec.rules[0].for``; ``(top level)`` when empty. A
    key that is not a plain name is quoted (``spec['a b:']``, spaces escaped, cut to 40
    characters), so the path is one word whatever the file holds."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(str(part)):
            out += ("." if out else "") + str(part)
        else:
            out += "[" + ascii(str(part)[:40]).replace(" ", "\\x20") + "]"
    return out or "(top level)"


class _BoundedLoader(yaml.SafeLoader):
    """A SafeLoader whose composer stops at :data:`MAX_DEPTH` levels (it recurses once per
    level, so a deeper file would exhaust the interpreter's stack first)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_DEPTH} levels", mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


class _Checker:
    """One walk over the composed graph: expanded size and depth per node (memoised, so an
    alias costs one look-up however often it is used), cycles, keys, numbers and text."""

    def __init__(self) -> None:
        self._size: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded nodes, depth)
        self._open: set[int] = set()

    def check(self, node: yaml.Node, loc: list[int | str]) -> tuple[int, int]:
        key = id(node)
        done = self._size.get(key)
        if done is not None:
            return done
        if key in self._open:
            raise YamlProblem(
                line=_line(node),
                field=field_path(loc),
                message="recursive alias (refers to itself)",
            )
        self._open.add(key)
        size, depth = 1, 1
        if isinstance(node, yaml.ScalarNode):
            self._scalar(node, loc)
        elif isinstance(node, yaml.SequenceNode):
            for i, child in enumerate(node.value):
                s, d = self.check(child, [*loc, i])
                size, depth = size + s, max(depth, d + 1)
                self._bound(size, depth, child, loc)
        elif isinstance(node, yaml.MappingNode):
            seen: set[tuple[str, str]] = set()
            for k, v in node.value:
                if not isinstance(k, yaml.ScalarNode):
                    raise YamlProblem(
                        line=_line(k), field=field_path(loc), message="a key must be a scalar"
                    )
                self._scalar(k, loc)
                if k.tag != _MERGE:
                    if (k.tag, k.value) in seen:
                        raise YamlProblem(
                            line=_line(k),
                            field=field_path([*loc, k.value]),
                            message=f"duplicate key {k.value!r}",
                        )
                    seen.add((k.tag, k.value))
                s, d = self.check(v, [*loc, k.value])
                size, depth = size + 1 + s, max(depth, d + 1)
                self._bound(size, depth, v, loc)
        self._open.discard(key)
        self._size[key] = (size, depth)
        return size, depth

    @staticmethod
    def _bound(size: int, depth: int, node: yaml.Node, loc: list[int | str]) -> None:
        if size > MAX_NODES:
            raise YamlProblem(
                line=_line(node),
                field=field_path(loc),
                message=f"more than {MAX_NODES} values with aliases expanded (an alias bomb?)",
            )
        if depth > MAX_DEPTH:
            raise YamlProblem(
                line=_line(node),
                field=field_path(loc),
                message=f"nested deeper than {MAX_DEPTH} levels with aliases expanded",
            )

    @staticmethod
    def _scalar(node: yaml.ScalarNode, loc: list[int | str]) -> None:
        value = str(node.value)
        if node.tag in (_INT, _FLOAT) and len(value) > MAX_NUMBER_CHARS:
            raise YamlProblem(
                line=_line(node),
                field=field_path(loc),
                message=f"a number of {len(value)} characters (at most {MAX_NUMBER_CHARS})",
            )
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise YamlProblem(
                line=_line(node),
                field=field_path(loc),
                message=f"not Unicode text: lone surrogate {value[exc.start]!r}",
            ) from None


def load_bounded(text: str) -> tuple[yaml.Node | None, Any]:
    """The composed node tree (for error lines) and the constructed value of one YAML
    document; ``(None, None)`` for an empty one. Raises :class:`YamlProblem`."""
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text)  # checks that every character is allowed
        node = loader.get_single_node()
        if node is None:
            return None, None
        _Checker().check(node, [])
        return node, loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = int(mark.line) + 1 if mark is not None else 1
        problem = exc.problem or exc.context or "not YAML"
        raise YamlProblem(line=line, field="(yaml)", message=f"invalid YAML: {problem}") from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1 if isinstance(exc.position, int) else 1
        raise YamlProblem(
            line=line,
            field="(yaml)",
            message=f"invalid YAML: character U+{exc.character:04X} is not allowed",
        ) from None
    except yaml.YAMLError as exc:
        raise YamlProblem(line=1, field="(yaml)", message=f"invalid YAML: {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()
