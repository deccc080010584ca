"""Loading rule files with errors that name file, line and field, and reloading them safely.

A rule file is read only when it is a regular file (after symlinks: a ConfigMap mount links each
key into ``..data``), at most :data:`MAX_FILE_BYTES`, all files together at most
:data:`MAX_TOTAL_BYTES` (a ConfigMap's own limit), and UTF-8. YAML is parsed with the bounds of
:mod:`nodeguard.rules.safe_yaml` (aliases, nesting, numbers), which keeps every node's position;
pydantic validates the data; each validation error's location (``spec.rules[1].when[0].signal``)
is walked back through the YAML node tree to its line. Every failure, whatever the input, is a
:class:`RuleError` of ``FILE:LINE: FIELD: message`` lines; a reload that fails keeps the last
good rules in force.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from nodeguard.fields import model_at, unknown_field
from nodeguard.logs import AUDIT
from nodeguard.rules.hints import rule_hints
from nodeguard.rules.safe_yaml import YamlProblem, field_path, load_bounded
from nodeguard.rules.schema import AlertRule, Rule, RuleFile

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_TOTAL_BYTES",
    "RuleError",
    "RuleSet",
    "RuleSource",
    "expand_paths",
    "load_rule_file",
    "load_rules",
]

log = logging.getLogger(__name__)

#: One rule file: rules/default.yaml is 4.5 KB; PyYAML parses about 0.6 MB/s in Python, so a
#: file at the bound costs well under a second, in a worker thread.
MAX_FILE_BYTES = 256 << 10
#: All rule files together: the most a ConfigMap can hold.
MAX_TOTAL_BYTES = 1 << 20
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


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


def _kind(mode: int) -> str | None:
    """What a file that is not a regular file is (``None`` for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def read_rule_text(path: Path, *, limit: int = MAX_FILE_BYTES) -> str:
    """The text of a rule file. Raises :class:`RuleError` when it is not a regular file (a
    FIFO would block the reader, a link to ``/dev/zero`` never ends), is longer than ``limit``
    bytes (read no further than that), cannot be read, or is not UTF-8 (the line of the first
    bad byte)."""
    where = f"{path}:1: (file)"
    try:
        # stat first: a FIFO or a device is never opened (an open can have effects of its own);
        # fstat after the open again, for a file swapped in between.
        kind = _kind(os.stat(path).st_mode)
        if kind is None:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
            try:
                kind = _kind(os.fstat(fd).st_mode)
                data = b"" if kind else _read_at_most(fd, limit + 1)
            finally:
                os.close(fd)
    except OSError as exc:
        reason = "a symlink loop" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
        raise RuleError([f"{where}: cannot read: {reason}"]) from None
    if kind is not None:
        raise RuleError([f"{where}: {kind}, not a regular file"])
    if len(data) > limit:
        raise RuleError([f"{where}: larger than {limit} bytes"])
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise RuleError(
            [f"{path}:{line}: (file): not UTF-8: byte {data[exc.start]:#04x} at offset {exc.start}"]
        ) from None


def _read_at_most(fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    left = size
    while left > 0 and (chunk := os.read(fd, min(left, 1 << 16))):
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _name_lines(node: yaml.Node | None, rf: RuleFile) -> list[int]:
    """The line of each rule's then each alert rule's ``name`` (1 where the tree has none)."""
    locs: list[list[int | str]] = [["spec", "rules", i, "name"] for i in range(len(rf.spec.rules))]
    locs += [["spec", "alerts", i, "name"] for i in range(len(rf.spec.alerts))]
    return [_line_of(node, loc) or 1 for loc in locs]


class RuleNames:
    """Rule and alert-rule names, unique within a file and across the files loaded together
    (the engine keys its state, the incidents and the webhook's mapping by name)."""

    def __init__(self) -> None:
        self._seen: dict[str, str] = {}  # name -> "path:line" of its first use

    def claim(self, *, path: Path, rule_file: RuleFile) -> list[str]:
        """Take the names of ``rule_file`` (rules, then alert rules); one ``FILE:LINE: FIELD:
        duplicate rule name`` message for each name already taken."""
        lines = rule_file.name_lines()
        items = [("rules", i, r.name) for i, r in enumerate(rule_file.spec.rules)]
        items += [("alerts", i, a.name) for i, a in enumerate(rule_file.spec.alerts)]
        messages = []
        for (section, i, name), line in zip(items, lines, strict=True):
            where = f"{path}:{line}"
            first = self._seen.get(name)
            if first is None:
                self._seen[name] = where
            else:
                messages.append(
                    f"{where}: {field_path(['spec', section, i, 'name'])}: "
                    f"duplicate rule name {name!r} (also at {first})"
                )
        return messages


def load_rule_file(path: Path, *, limit: int = MAX_FILE_BYTES) -> RuleFile:
    """Parse and validate one rule file. Raises :class:`RuleError` with every problem found,
    and nothing else, whatever the file holds."""
    text = read_rule_text(path, limit=limit)
    try:
        return _parse(path, text)
    except RuleError:
        raise
    except Exception as exc:  # the last line of defence against hostile input
        # Every kind of bad input found so far has its own message above; an input that finds
        # a new way to fail is still a bad file, never a crash of the agent or of `check`.
        log.debug("rule file %s failed unexpectedly", path, exc_info=exc)
        raise RuleError([f"{path}:1: (file): cannot load: {type(exc).__name__}: {exc}"]) from None


def _parse(path: Path, text: str) -> RuleFile:
    try:
        node, data = load_bounded(text)
    except YamlProblem as exc:
        raise RuleError([f"{path}:{exc.line}: {exc.field}: {exc.message}"]) from None
    if not isinstance(data, dict):
        raise RuleError(
            [f"{path}:1: (top level): a rule file is a mapping with apiVersion, kind and spec"]
        )
    try:
        rf = RuleFile.model_validate(data)
    except ValidationError as exc:
        messages = []
        for err in exc.errors():
            # pydantic puts a model validator's error at the model, with no field of its own.
            loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
            line = _line_of(node, loc)
            msg = err["msg"].removeprefix("Value error, ")
            holder = model_at(RuleFile, loc) if err["type"] == "extra_forbidden" else None
            if holder is not None:
                msg = unknown_field(holder, str(loc[-1]))
            messages.append(f"{path}:{line or 1}: {field_path(loc)}: {msg}")
        raise RuleError(messages) from None
    rf.set_name_lines(_name_lines(node, rf))
    rf.set_hints(
        rule_hints(path=str(path), rule_file=rf, data=data, line_of=lambda loc: _line_of(node, loc))
    )
    duplicates = RuleNames().claim(path=path, rule_file=rf)
    if duplicates:
        raise RuleError(duplicates)
    return rf


def expand_paths(paths: Sequence[Path]) -> list[Path]:
    """Files as given, and the ``*.yaml``/``*.yml`` entries of directories (a ConfigMap
    mount), sorted, each file once; hidden files (ConfigMap's ``..data`` links) are skipped. A
    directory that cannot be listed is given as itself, so that loading it says why."""
    out: list[Path] = []
    for p in paths:
        try:
            entries = list(os.scandir(p)) if p.is_dir() else None
        except OSError:
            entries = None
        if entries is None:
            out.append(p)
            continue
        out += sorted(
            Path(e.path)
            for e in entries
            if e.name.endswith((".yaml", ".yml")) and not e.name.startswith(".")
        )
    # A file named twice (given twice, or a directory and a file in it) is read once: else its
    # rules would be duplicates of themselves.
    seen: set[Path] = set()
    unique = []
    for path in out:
        key = Path(os.path.realpath(path))
        if key not in seen:
            seen.add(key)
            unique.append(path)
    return unique


def load_rules(paths: Sequence[Path]) -> RuleSet:
    """Load every file; all or nothing. Rule names must be unique across files; the files
    together are at most :data:`MAX_TOTAL_BYTES`."""
    messages: list[str] = []
    rules: list[Rule] = []
    alerts: list[AlertRule] = []
    names = RuleNames()
    files = expand_paths(paths)
    budget = MAX_TOTAL_BYTES
    for path in files:
        size = _size(path)
        if budget < size <= MAX_FILE_BYTES:
            messages.append(
                f"{path}:1: (file): not read: the rule files together are larger than "
                f"{MAX_TOTAL_BYTES} bytes"
            )
            budget = 0
            continue
        budget -= size
        try:
            # The limit holds also when the file grows between the stat and the read.
            rf = load_rule_file(path, limit=min(MAX_FILE_BYTES, max(budget + size, 0)))
        except RuleError as exc:
            messages += exc.messages
            continue
        messages += names.claim(path=path, rule_file=rf)
        for hint in rf.hints():
            log.warning("%s", hint)
        rules += rf.spec.rules
        alerts += rf.spec.alerts
    if messages:
        raise RuleError(messages)
    return RuleSet(rules=tuple(rules), alerts=tuple(alerts), files=tuple(files))


def _size(path: Path) -> int:
    """A file's size as stat gives it (0 for what cannot be stat'ed or is not regular)."""
    try:
        st = os.stat(path)
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


class RuleSource:
    """Rule files that reload on change (mtime and size) or on demand (SIGHUP), keeping the
    last good rules when a new version is bad (each logged with file, line and field), or when
    every file has gone. ``errors_total`` counts bad loads, ``reloads_total`` good ones."""

    def __init__(self, *, paths: Sequence[Path]) -> None:
        self.paths = list(paths)
        self.current = load_rules(self.paths)  # at start, a bad file is fatal: say so and stop
        if not self.current.files:
            log.warning(
                "no rule file (*.yaml, *.yml) in %s: no rule is in force",
                ", ".join(map(str, self.paths)),
                extra=AUDIT,
            )
        self._stamp = self._stamps()
        self.errors_total = 0
        self.reloads_total = 0

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
            if not new.files and self.current.files:
                # Every file gone at once is a broken mount far more often than a wish; an
                # empty rule file (`rules: []`) turns every rule off on purpose.
                raise RuleError(
                    [
                        f"{', '.join(map(str, self.paths))}: no rule file (*.yaml, *.yml) any "
                        "more; to turn every rule off, leave one whose spec has `rules: []`"
                    ]
                )
        except RuleError as exc:
            self.errors_total += 1
            log.error(
                "rule reload failed; the last good rules stay in force:\n%s", exc, extra=AUDIT
            )
            return False
        self.current = new
        self.reloads_total += 1
        log.info(
            "rules reloaded: %d rule(s) and %d alert rule(s) from %d file(s)",
            len(new.rules),
            len(new.alerts),
            len(new.files),
        )
        return True
