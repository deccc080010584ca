"""Loading rule files with errors that name file, line and field, and reloading them safely.

YAML is parsed with PyYAML's composer, which keeps every node's position; pydantic validates
the data; each validation error's location (``spec.rules[1].when[0].signal``) is walked back
through the YAML node tree to its line. A reload that fails keeps the last good rules in force.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from nodeguard.rules.schema import AlertRule, Rule, RuleFile

__all__ = ["RuleError", "RuleSet", "RuleSource", "expand_paths", "load_rule_file", "load_rules"]

log = logging.getLogger(__name__)


class RuleError(Exception):
    """A rule file (or set of files) that cannot be used. ``messages`` are one per problem,
    each ``FILE:LINE: FIELD: what is wrong`` (promtool's style)."""

    def __init__(self, messages: Sequence[str]) -> None:
        super().__init__("\n".join(messages))
        self.messages = list(messages)


@dataclass(frozen=True, slots=True, kw_only=True)
class RuleSet:
    """Rules and alert rules loaded from files, in file order; ``files`` are the paths they
    came from."""

    rules: tuple[Rule, ...]
    alerts: tuple[AlertRule, ...]
    files: tuple[Path, ...]


def _line_of(node: yaml.Node | None, loc: Sequence[int | str]) -> int | None:
    """The 1-based line of the YAML node at a pydantic error location."""
    line = None if node is None else node.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if k.value == part), None)
            if match is None:
                key = next((k for k, _ in node.value if k.value == part), None)
                return key.start_mark.line + 1 if key is not None else line
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                return line
            node = node.value[part]
        else:
            return line
        line = node.start_mark.line + 1
    return line


def _field(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a mapping with the same key twice (PyYAML keeps the last
    silently: ``for: 1m`` then ``for: 0s`` would mean 0 s without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_rule_file(path: Path) -> RuleFile:
    """Parse and validate one rule file. Raises :class:`RuleError` with every problem found."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise RuleError([f"{path}: cannot read: {exc.strerror or exc}"]) from exc
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data: Any = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise RuleError([f"{where}: invalid YAML: {problem}"]) from exc
    if not isinstance(data, dict):
        raise RuleError([f"{path}:1: a rule file is a mapping with apiVersion, kind and spec"])
    try:
        rf = RuleFile.model_validate(data)
    except ValidationError as exc:
        messages = []
        for err in exc.errors():
            # pydantic puts a model validator's error at the model, with no field of its own.
            loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
            line = _line_of(node, loc)
            msg = err["msg"].removeprefix("Value error, ")
            messages.append(f"{path}:{line or 1}: {_field(loc)}: {msg}")
        raise RuleError(messages) from exc
    seen: set[str] = set()
    duplicates = []
    named = [("rules", i, r.name) for i, r in enumerate(rf.spec.rules)]
    named += [("alerts", i, a.name) for i, a in enumerate(rf.spec.alerts)]
    for section, i, name in named:
        if name in seen:
            loc = ["spec", section, i, "name"]
            duplicates.append(
                f"{path}:{_line_of(node, loc)}: {_field(loc)}: duplicate rule name {name!r}"
            )
        seen.add(name)
    if duplicates:
        raise RuleError(duplicates)
    return rf


def expand_paths(paths: Sequence[Path]) -> list[Path]:
    """Files as given, and the ``*.yaml``/``*.yml`` files of directories (a ConfigMap mount),
    sorted; hidden files (ConfigMap's ``..data`` links) are skipped."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += sorted(
                f
                for f in p.iterdir()
                if f.suffix in (".yaml", ".yml") and not f.name.startswith(".")
            )
        else:
            out.append(p)
    return out


def load_rules(paths: Sequence[Path]) -> RuleSet:
    """Load every file; all or nothing. Rule names must be unique across files."""
    messages: list[str] = []
    rules: list[Rule] = []
    alerts: list[AlertRule] = []
    seen: dict[str, Path] = {}
    files = expand_paths(paths)
    for path in files:
        try:
            rf = load_rule_file(path)
        except RuleError as exc:
            messages += exc.messages
            continue
        items: list[Rule | AlertRule] = [*rf.spec.rules, *rf.spec.alerts]
        for item in items:
            if item.name in seen:
                messages.append(
                    f"{path}: spec: duplicate rule name {item.name!r} (also in {seen[item.name]})"
                )
            seen[item.name] = path
        rules += rf.spec.rules
        alerts += rf.spec.alerts
    if messages:
        raise RuleError(messages)
    return RuleSet(rules=tuple(rules), alerts=tuple(alerts), files=tuple(files))


class RuleSource:
    """Rule files that reload on change (mtime and size) or on demand (SIGHUP), keeping the
    last good rules when a new version is bad. ``errors_total`` counts bad loads;
    ``last_error`` holds the latest problem (``None`` after a good load)."""

    def __init__(self, *, paths: Sequence[Path]) -> None:
        self.paths = list(paths)
        self.current = load_rules(self.paths)  # at start, a bad file is fatal: say so and stop
        self._stamp = self._stamps()
        self.errors_total = 0
        self.reloads_total = 0
        self.last_error: str | None = None

    def _stamps(self) -> tuple[tuple[str, float, int], ...]:
        stamps = []
        for p in expand_paths(self.paths):
            try:
                st = p.stat()
                stamps.append((str(p), st.st_mtime, st.st_size))
            except OSError:
                stamps.append((str(p), -1.0, -1))
        return tuple(stamps)

    def maybe_reload(self, *, force: bool = False) -> bool:
        """Reload if the files changed (or ``force``); True when new rules are in force."""
        stamp = self._stamps()
        if stamp == self._stamp and not force:
            return False
        self._stamp = stamp
        try:
            new = load_rules(self.paths)
        except RuleError as exc:
            self.errors_total += 1
            self.last_error = str(exc)
            log.error("rule reload failed; the last good rules stay in force:\n%s", exc)
            return False
        self.current = new
        self.reloads_total += 1
        self.last_error = None
        log.info("rules reloaded: %d rule(s) from %d file(s)", len(new.rules), len(new.files))
        return True
