"""A nodeguard agent's ``nodeguard run`` arguments read by the agent's own flags
(:data:`nodeguard.cli.run_flags.RUN_FLAG_GROUPS`), for ``nodeguard doctor``, which finds them
in the agents' pod specs (:mod:`nodeguard.doctor.read_agents`)."""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Sequence

from nodeguard.cli.parser import Parser
from nodeguard.cli.run_flags import RUN_FLAG_GROUPS
from nodeguard.doctor.agent_inputs import AgentSettings

__all__ = ["agent_settings"]


def agent_settings(args: Sequence[str]) -> AgentSettings | None:
    """The settings of ``run FLAG...`` as ``nodeguard run`` parses them (defaults included:
    ``--dry-run`` is on unless ``--no-dry-run`` comes last); ``None`` for arguments that are
    not ``run`` or that it would refuse. Flags of another nodeguard version that this one does
    not know are left out. ``$(VAR)`` references stay as written (the kubelet expands them)."""
    if not args or args[0] != "run":
        return None
    parser = Parser(prog="nodeguard-run", add_help=False, exit_on_error=False)
    for group in RUN_FLAG_GROUPS:
        group(parser)
    try:
        # argparse writes its refusal to stderr before exiting: kept out of the doctor's output.
        with contextlib.redirect_stderr(io.StringIO()):
            parsed, _unknown = parser.parse_known_args(list(args[1:]))
    except (SystemExit, argparse.ArgumentError):
        return None
    host, _port = parsed.listen_address
    return AgentSettings(
        dry_run=bool(parsed.dry_run),
        webhook_token_file=parsed.webhook_token_file is not None,
        webhook_unauthenticated=bool(parsed.webhook_unauthenticated),
        listen_host=host,
        rules=tuple(str(p) for p in parsed.rules),
    )
