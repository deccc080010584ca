"""The ``nodeguard`` command, with node_exporter's flag conventions: one module per subcommand.

- ``nodeguard run`` (:mod:`~nodeguard.cli.run`, flags in :mod:`~nodeguard.cli.run_flags`):
  sample every ``--interval``, serve ``/metrics`` and act on rules (dry run by default).
- ``nodeguard snapshot`` (:mod:`~nodeguard.cli.snapshot`): one sample, as a report or JSON.
- ``nodeguard check`` (:mod:`~nodeguard.cli.check`): validate rule files.
- ``nodeguard incidents`` (:mod:`~nodeguard.cli.incidents`): the incident records.
- ``nodeguard act`` (:mod:`~nodeguard.cli.act`): one runbook action by hand.
- ``nodeguard doctor`` (:mod:`~nodeguard.cli.doctor`): the cluster's memory posture, read-only.
- ``nodeguard trials`` (:mod:`~nodeguard.cli.trials`): a Katib experiment's trials' memory.

Each module has ``HELP``, ``add_arguments(parser)`` and ``run(args) -> exit status``; flag
groups that several share (host paths, collectors, cordon, ``--kubeconfig``, ``--json``,
``--log.level``) and the value types (one duration grammar, sizes, counts) are in
:mod:`~nodeguard.cli.flags`. Every flag's help gives its default and unit.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from types import ModuleType

from nodeguard import __version__
from nodeguard.cli import act, check, doctor, incidents, run, snapshot, trials
from nodeguard.cli.flags import setup_logging
from nodeguard.cli.parser import Parser

__all__ = ["SUBCOMMANDS", "build_parser", "main"]

#: Subcommand -> its module, in ``--help`` order.
SUBCOMMANDS: dict[str, ModuleType] = {
    "run": run,
    "snapshot": snapshot,
    "check": check,
    "incidents": incidents,
    "act": act,
    "doctor": doctor,
    "trials": trials,
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``nodeguard`` command."""
    parser = Parser(
        prog="nodeguard",
        usage="%(prog)s COMMAND [flags]",
        description="Node memory agent for GPU/ML Kubernetes nodes: exporter and remediation.",
    )
    parser.add_argument("--version", action="version", version=f"nodeguard {__version__}")
    # prog: each subcommand named "nodeguard run", not after the short usage line.
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", prog="nodeguard")
    for name, module in SUBCOMMANDS.items():
        p = sub.add_parser(
            # EPILOG: optional (act and doctor list their exit statuses there).
            name,
            help=module.HELP,
            description=module.HELP,
            epilog=getattr(module, "EPILOG", None),
        )
        module.add_arguments(p)
        p.set_defaults(handler=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nodeguard`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)
