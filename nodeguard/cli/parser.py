"""The argument parser every ``nodeguard`` command and subcommand is built on.

As kubectl does: a bad flag is the one useful line and where to look, not the whole usage
(``nodeguard run`` has forty flags, whose usage alone is 37 lines); ``--help`` fits 80 columns,
the usage line being ``nodeguard run [flags]`` with every flag listed below it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["Parser"]

#: argparse's exit status for bad flags, kept: scripts test for it.
BAD_FLAGS = 2


class Parser(argparse.ArgumentParser):
    """:class:`argparse.ArgumentParser` with a short error and a usage line of one line. A
    subparser is made of the same class (argparse uses its parent's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._short_usage = "usage" not in kwargs
        super().__init__(*args, **kwargs)

    def format_usage(self) -> str:
        """``usage: PROG [flags] POSITIONAL...``: the positionals (``ACTION``, ``[ID]``) named,
        the flags listed below it."""
        self._shorten()
        return super().format_usage()

    def format_help(self) -> str:
        """argparse's help, with the one-line usage of :meth:`format_usage`."""
        self._shorten()
        return super().format_help()

    def _shorten(self) -> None:
        if not self._short_usage:
            return
        names = []
        for action in self._get_positional_actions():
            name = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
            many = "..." if action.nargs in ("+", "*") else ""
            names.append(f"[{name}{many}]" if action.nargs in ("?", "*") else f"{name}{many}")
        self.usage = " ".join(["%(prog)s", "[flags]", *names])

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """As argparse's; a subcommand without subcommands of its own refuses a flag it does
        not know itself, so the error names it (``See 'nodeguard act evict --help'``) rather
        than the top-level command."""
        parsed, extra = super().parse_known_args(args, namespace)
        if extra and " " in self.prog and self._subparsers is None:
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed, extra

    def error(self, message: str) -> NoReturn:
        """``PROG: error: MESSAGE`` and ``See 'PROG --help'.`` on stderr; exit status 2."""
        sys.stderr.write(f"{self.prog}: error: {message}\nSee '{self.prog} --help'.\n")
        sys.exit(BAD_FLAGS)
