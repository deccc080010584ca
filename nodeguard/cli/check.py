"""``nodeguard check FILE...``: validate rule files as ``promtool check rules`` does.

A line per file, every problem as ``FILE:LINE: FIELD: message`` (a threshold outside its
signal's range gives the range; an unknown field lists the allowed ones and the closest);
exit status 0 when all are good, 1 otherwise. A file that loads but probably does not say what
was meant (a duration without a unit, a byte threshold under 1Mi: :mod:`nodeguard.rules.hints`)
gets its warnings in the same form and still exits 0. Rule names must also be unique across the
files.
A directory is read as the agent's ``--rules DIR`` reads it (its ``*.yaml``/``*.yml`` files,
hidden ones skipped: ``expand_paths``); one with no rule file is an error, since the agent given
it would run with no rule in force, and files in it that are not read are named.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from nodeguard.cli.flags import add_log_level
from nodeguard.rules.load import RuleError, RuleNames, expand_paths, load_rule_file

__all__ = ["add_arguments", "check_files", "run"]

HELP = "validate rule files (exit status 1 on any error)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``nodeguard check``."""
    parser.add_argument(
        "files",
        type=Path,
        nargs="+",
        metavar="PATH",
        help="rule files, or directories of *.yaml rule files (no default: at least one)",
    )
    add_log_level(parser, default="warning")


def check_files(files: Sequence[Path], *, out: TextIO) -> int:
    """Check each file; write a line per file and one per problem; the exit status."""
    failed = False
    for given in files:
        if given.is_dir() and not _directory_read(given, out=out):
            failed = True
    names = RuleNames()
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
        dupes = names.claim(path=path, rule_file=rf)
        if dupes:
            failed = True
            out.write(f"  FAILED: {len(dupes)} error(s)\n")
        for msg in dupes:
            out.write(f"{msg}\n")
        if not dupes:
            extra = f", {len(rf.spec.alerts)} alert rules" if rf.spec.alerts else ""
            hints = rf.hints()
            warned = f", {len(hints)} warning(s)" if hints else ""
            out.write(f"  SUCCESS: {len(rf.spec.rules)} rules found{extra}{warned}\n")
            for hint in hints:
                out.write(f"{hint}\n")
    return 1 if failed else 0


def _directory_read(directory: Path, *, out: TextIO) -> bool:
    """Say what of ``directory`` is not read; False when no rule file is in it."""
    read = {p.name for p in expand_paths([directory])}
    try:
        others = sorted(
            e.name
            for e in directory.iterdir()
            if e.name not in read and not e.name.startswith(".") and e.is_file()
        )
    except OSError as exc:
        out.write(f"{directory}: cannot list: {exc.strerror}\n")
        return False
    if others:
        out.write(f"{directory}: not read (not *.yaml or *.yml): {', '.join(others)}\n")
    if not read:
        out.write(f"{directory}: FAILED: no rule file (*.yaml, *.yml) in this directory\n")
        return False
    return True


def run(args: argparse.Namespace) -> int:
    """Run ``nodeguard check``."""
    return check_files(args.files, out=sys.stdout)
