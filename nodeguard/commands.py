"""``nodeguard check`` and ``nodeguard incidents``: small commands over rule files and records."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.table import Table

from nodeguard.remediation.incidents import IncidentStore
from nodeguard.rules.load import RuleError, expand_paths, load_rule_file
from nodeguard.rules.schema import AlertRule, Rule

__all__ = ["check_files", "show_incidents"]


def check_files(files: Sequence[Path], *, out: TextIO) -> int:
    """Validate each rule file as ``promtool check rules`` does: a line per file, every problem
    as ``FILE:LINE: FIELD: message``; exit status 0 when all are good, 1 otherwise. Rule names
    must also be unique across the files given."""
    failed = False
    seen: dict[str, Path] = {}
    for path in expand_paths(files):
        out.write(f"Checking {path}\n")
        try:
            rf = load_rule_file(path)
        except RuleError as exc:
            failed = True
            out.write(f"  FAILED: {len(exc.messages)} error(s)\n")
            for msg in exc.messages:
                out.write(f"{msg}\n")
            continue
        items: list[Rule | AlertRule] = [*rf.spec.rules, *rf.spec.alerts]
        dupes = [r.name for r in items if r.name in seen]
        for name in dupes:
            failed = True
            out.write(f"{path}: spec.rules: duplicate rule name {name!r} (also in {seen[name]})\n")
        seen.update({r.name: path for r in items})
        if not dupes:
            extra = f", {len(rf.spec.alerts)} alert rules" if rf.spec.alerts else ""
            out.write(f"  SUCCESS: {len(rf.spec.rules)} rules found{extra}\n")
    return 1 if failed else 0


def show_incidents(
    directory: Path, *, incident: str | None, as_json: bool, console: Console
) -> int:
    """List the incidents (newest first) or print one; exit status 1 if it is unknown."""
    store = IncidentStore(directory=directory if directory.exists() else None)
    if incident:
        record = store.get(incident)
        if record is None:
            console.print(f"no incident {incident!r} in {directory}")
            return 1
        console.print_json(json.dumps(record, default=str))
        return 0
    records = store.list()
    if as_json:
        console.print_json(json.dumps(records, default=str))
        return 0
    if not records:
        console.print(f"no incidents in {directory}")
        return 0
    t = Table(title=f"Incidents in {directory} (newest first)", title_justify="left")
    for col in ("time (UTC)", "rule", "kind", "target", "dry run", "actions", "id"):
        t.add_column(col)
    for r in records:
        when = dt.datetime.fromtimestamp(r["time"], tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        actions = ", ".join(f"{a['action']}:{a['outcome']}" for a in r.get("actions", []))
        t.add_row(
            when,
            r["rule"],
            r["kind"],
            r["target"],
            "yes" if r["dry_run"] else "no",
            actions or "-",
            r["id"],
        )
    console.print(t)
    return 0
