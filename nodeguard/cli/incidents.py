"""``nodeguard incidents [ID]``: list the incident records (newest first), or show one.

The list fits 80 columns (``kubectl exec`` without a TTY): each incident is named by the
shortest prefix of its id that is unique among the records, at least the id's time to the
second (``20261130T101500``, UTC), and ``nodeguard incidents PREFIX`` takes any unique prefix.
Rule names are never broken (the target and the actions wrap instead). One incident is shown
for people (what fired, on what, what was done, the node's memory and the largest containers
then); ``--json`` gives its whole record, and ``--html FILE`` writes it as a self-contained
page with its timeline as charts (:mod:`nodeguard.remediation.incident_page`), the page the
agent serves at ``/incidents/ID.html``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from nodeguard.cli.console import stdout_console
from nodeguard.cli.flags import add_json, add_log_level, add_state
from nodeguard.cli.incident_view import show_one
from nodeguard.cli.parser import BAD_FLAGS
from nodeguard.remediation.incident_page import page
from nodeguard.remediation.incidents import IncidentStore

__all__ = ["SHORTEST_ID", "add_arguments", "run", "short_ids", "show_incidents"]

HELP = "list incident records, or show one (any unique prefix of its id)"

#: The shortest id shown: its time to the second, ``20261130T101500``.
SHORTEST_ID = 15
_AMBIGUOUS_SHOWN = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``nodeguard incidents``."""
    parser.add_argument(
        "id",
        nargs="?",
        help="show this incident: its id or any unique prefix of it (default: list them all; "
        "with --json, its whole record)",
    )
    parser.add_argument(
        "--html",
        type=Path,
        default=None,
        metavar="FILE",
        help="write incident ID to FILE (- for stdout) as one self-contained HTML page: what "
        "happened, the node's memory and the containers before it as charts, the evidence; "
        "opens offline (default: show it in the terminal)",
    )
    add_state(parser)
    add_json(parser, what="the list, or the whole record of one")
    add_log_level(parser, default="warning")


def short_ids(ids: Sequence[str], *, least: int = SHORTEST_ID) -> dict[str, str]:
    """Each id -> its shortest prefix of at least ``least`` characters that no other id
    starts with (the whole id where another id is a prefix of it)."""
    ordered = sorted(set(ids))

    def common(a: str, b: str) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    out = {}
    for i, name in enumerate(ordered):
        shared = max(
            common(name, ordered[i - 1]) if i > 0 else 0,
            common(name, ordered[i + 1]) if i + 1 < len(ordered) else 0,
        )
        out[name] = name[: max(least, shared + 1)]
    return out


def _table(records: list[dict[str, Any]]) -> Table:
    short = short_ids([r["id"] for r in records])
    t = Table(
        title="Incidents, newest first",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    t.add_column("id (UTC)", no_wrap=True, min_width=SHORTEST_ID)
    # A rule name is read whole: the target and the actions wrap instead.
    t.add_column("rule", no_wrap=True)
    t.add_column("kind", no_wrap=True)
    t.add_column("target", overflow="fold")
    t.add_column("dry", no_wrap=True)
    t.add_column("actions", overflow="fold")
    for r in records:
        actions = ", ".join(f"{a['action']}:{a['outcome']}" for a in r.get("actions", []))
        t.add_row(
            short[r["id"]],
            str(r.get("rule", "?")),
            str(r.get("kind", "?")),
            str(r.get("target", "?")),
            "yes" if r.get("dry_run") else "no",
            actions or "-",
        )
    return t


def _when(record: dict[str, Any]) -> str:
    return dt.datetime.fromtimestamp(record["time"], tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def show_incidents(
    directory: Path,
    *,
    incident: str | None,
    as_json: bool,
    console: Console,
    html: Path | None = None,
) -> int:
    """List the incidents (newest first) or print one, or with ``html`` write its page there;
    exit status 1 when ``incident`` names none or more than one, or the page cannot be
    written."""
    store = IncidentStore(directory=directory if directory.exists() else None)
    if incident:
        found = store.matching(incident)
        record = store.get(found[0]) if len(found) == 1 else None
        if len(found) > 1:
            shown = ", ".join(sorted(found, reverse=True)[:_AMBIGUOUS_SHOWN])
            console.print(
                f"{incident!r} is the start of {len(found)} incident ids (newest: {shown}); "
                "give more of it",
                soft_wrap=True,
            )
            return 1
        if record is None:
            console.print(f"no incident {incident!r} in {directory}", soft_wrap=True)
            return 1
        if as_json and html is None:
            console.print_json(json.dumps(record, default=str))
            return 0
        try:
            if html is not None:
                return _write_page(record, html=html, console=console)
            show_one(record, console=console)
        except (AttributeError, KeyError, TypeError, ValueError, ArithmeticError) as exc:
            # A record edited by hand (or by an older nodeguard): said, never a traceback.
            console.print(
                f"incident {incident!r} cannot be shown: a field is not as "
                f"nodeguard writes it ({type(exc).__name__}: {exc}); "
                "`nodeguard incidents ID --json` prints it as stored",
                soft_wrap=True,
            )
            return 1
        return 0
    records = store.list()
    if as_json:
        console.print_json(json.dumps(records, default=str))
        return 0
    if not records:
        console.print(
            f"no incidents in {directory} (where `nodeguard run --path.state` keeps them; "
            "scripts/run keeps them in .nodeguard/state/incidents)",
            soft_wrap=True,
        )
        return 0
    console.print(_table(records))
    newest, oldest = _when(records[0]), _when(records[-1])
    console.print(
        f"{len(records)} incident(s) from {oldest} to {newest} UTC in {directory}; "
        "`nodeguard incidents ID` shows one (any unique start of its id)"
    )
    return 0


def _write_page(record: dict[str, Any], *, html: Path, console: Console) -> int:
    """Write ``record``'s HTML page to ``html`` (``-``: stdout, alone); 1 when it cannot be
    written."""
    if str(html) == "-":
        sys.stdout.write(page(record=record))
        return 0
    try:
        html.write_text(page(record=record), encoding="utf-8")
    except OSError as exc:
        console.print(f"cannot write {html}: {exc.strerror or exc}", soft_wrap=True)
        return 1
    console.print(
        f"wrote incident {record['id']} to {html} (one HTML file: open it in a browser)",
        soft_wrap=True,
    )
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``nodeguard incidents``."""
    if args.html is not None and not args.id:
        sys.stderr.write(
            "nodeguard incidents: error: --html writes one incident's page: give its ID "
            "(nodeguard incidents ID --html FILE)\nSee 'nodeguard incidents --help'.\n"
        )
        return BAD_FLAGS
    if args.html is not None and args.json:
        sys.stderr.write(
            "nodeguard incidents: error: --html and --json are two ways to write one record: "
            "give one\nSee 'nodeguard incidents --help'.\n"
        )
        return BAD_FLAGS
    directory = args.incidents_dir or args.state / "incidents"
    return show_incidents(
        directory,
        incident=args.id,
        as_json=args.json,
        console=stdout_console(),
        html=args.html,
    )
