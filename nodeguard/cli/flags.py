"""Flag groups and value types that several subcommands share.

Every flag's help says its default and, for a value, its unit: the value types below name
their grammar in the usage line (``--evict.window DURATION``), and a test walks every flag of
every subcommand to keep it so. Defaults are written as a person would type them
(``default="10m"``); argparse runs them through the flag's type, so ``--help`` shows ``10m``
and the program gets seconds.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from nodeguard.actions.cordon import CORDON_SETTINGS, CordonConfig
from nodeguard.actions.registry import ACTIONS, Settings
from nodeguard.cli.model_flags import add_model_flags
from nodeguard.collectors.base import ordered
from nodeguard.kube.objects import parse_bytes
from nodeguard.logs import install_log_filters
from nodeguard.paths import HostPaths
from nodeguard.sampling.sampler import SamplerConfig
from nodeguard.units import DURATION_EXAMPLES, parse_duration

__all__ = [
    "DEFAULT_STATE",
    "add_collectors",
    "add_host",
    "add_json",
    "add_kubeconfig",
    "add_log_level",
    "add_settings",
    "add_state",
    "byte_size",
    "cordon_config",
    "count",
    "duration",
    "registered_settings",
    "sampler_config",
    "settings_value",
    "setup_logging",
]

#: Where ``nodeguard run`` keeps its state by default (the DaemonSet's hostPath).
DEFAULT_STATE = Path("/var/lib/nodeguard")
LOG_LEVELS = ("debug", "info", "warning", "error")
#: A parser or one of its argument groups: where a flag is added.
Flags = argparse._ActionsContainer


# -- value types ---------------------------------------------------------------------------------
def duration(text: str) -> float:
    """A positive duration in the one grammar of :mod:`nodeguard.units`, as seconds."""
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"a duration above 0 ({DURATION_EXAMPLES}): {text!r}")
    return seconds


def count(text: str) -> int:
    """A whole number, 0 or more."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"not a count (0 or more): {text!r}")
    return int(text)


def byte_size(text: str) -> int:
    """A Kubernetes memory quantity (``1Mi``, ``500k``, ``1048576``) in bytes."""
    try:
        value = parse_bytes(text.strip(), exact=True)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a size: {text!r} (a Kubernetes quantity: 1Mi, 500k, 1048576)"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a negative size: {text!r}")
    return value


def percent(text: str) -> float:
    """A percent above 0 and at most 100 (``10`` or ``10%``)."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percent: {text!r}") from None
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"a percent above 0 and at most 100: {text!r}")
    return value


# -- groups --------------------------------------------------------------------------------------
def add_log_level(parser: argparse.ArgumentParser, *, default: str) -> None:
    """``--log.level``: one flag, one set of levels, for every subcommand."""
    parser.add_argument(
        "--log.level",
        dest="log_level",
        default=default,
        choices=LOG_LEVELS,
        help=f"the least severe log lines written to stderr (default {default})",
    )


def add_json(parser: argparse.ArgumentParser, *, what: str) -> None:
    """``--json``: the same output for a machine (bytes and seconds, exact)."""
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"print {what} as JSON, in bytes and seconds (default: tables for people)",
    )


def add_host(parser: argparse.ArgumentParser) -> None:
    """Where the host's files are, which collectors run, and who this node is."""
    g = parser.add_argument_group("host paths")
    g.add_argument(
        "--path.procfs",
        dest="procfs",
        type=Path,
        default=Path("/proc"),
        metavar="DIR",
        help="procfs mount point (default /proc; /host/proc in the DaemonSet)",
    )
    g.add_argument(
        "--path.sysfs",
        dest="sysfs",
        type=Path,
        default=Path("/sys"),
        metavar="DIR",
        help="sysfs mount point; cgroups are read under <sysfs>/fs/cgroup (default /sys; "
        "/host/sys in the DaemonSet)",
    )
    g.add_argument(
        "--path.kmsg",
        dest="kmsg",
        type=Path,
        default=Path("/dev/kmsg"),
        metavar="FILE",
        help="kernel log device, for OOM kills (default /dev/kmsg; /host/dev/kmsg in the "
        "DaemonSet)",
    )
    add_collectors(parser)
    n = parser.add_argument_group("node")
    n.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME") or socket.gethostname(),
        metavar="NAME",
        help="this node's name (default $NODE_NAME, else the hostname)",
    )
    n.add_argument(
        "--top-processes",
        type=count,
        default=10,
        metavar="COUNT",
        help="processes kept by RSS, for evidence and the report (default 10)",
    )


def add_collectors(parser: argparse.ArgumentParser) -> None:
    """``--collector.NAME`` / ``--no-collector.NAME`` for every collector."""
    c = parser.add_argument_group("collectors")
    for name in (cls.name for cls in ordered()):  # registered now, not at import
        c.add_argument(
            f"--collector.{name}",
            dest=f"collector_{name}",
            action=argparse.BooleanOptionalAction,
            default=True,
            help=f"the {name} collector (default on)",
        )


def add_kubeconfig(parser: Flags, *, used_for: str, home: bool) -> None:
    """``--kubeconfig``, in the order of :func:`nodeguard.kube.config.cluster_named` (``home``:
    whether ``~/.kube/config`` is the last resort, as for the interactive commands)."""
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"kubeconfig, for {used_for} (default: $KUBECONFIG, else the in-cluster config "
        f"in a pod{', else ~/.kube/config' if home else ''}; otherwise none)",
    )


def add_state(parser: Flags) -> None:
    """``--path.state`` and ``--incidents.dir``: where the agent keeps what outlives it."""
    parser.add_argument(
        "--path.state",
        dest="state",
        type=Path,
        default=DEFAULT_STATE,
        metavar="DIR",
        help="directory of the state kept across restarts: kernel-log position, remediation "
        f"state, incident records (default {DEFAULT_STATE}, the DaemonSet's hostPath; "
        "scripts/run uses .nodeguard/state in the checkout)",
    )
    parser.add_argument(
        "--incidents.dir",
        dest="incidents_dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="incident records (default <path.state>/incidents)",
    )


def registered_settings() -> list[Settings]:
    """The settings of the registered actions, each once (``cordon`` and ``uncordon`` share
    theirs), in registration order."""
    out: list[Settings] = []
    for action in ACTIONS.values():
        if action.settings is not None and action.settings not in out:
            out.append(action.settings)
    return out


def add_settings(
    parser: argparse.ArgumentParser, *, settings: list[Settings], aliases: bool = False
) -> None:
    """The flags of actions' settings (``--cordon.mode``, ...: :class:`Settings` ``group``
    and field), spelled the same for ``run`` and ``act`` (``act`` also takes the spellings of
    earlier versions, ``--mode`` ...: ``aliases``)."""
    for s in settings:
        add_model_flags(
            parser.add_argument_group(s.title),
            model=s.model,
            prefix=s.group,
            aliases=aliases,
            defaults=True,
        )


# -- what the groups make ------------------------------------------------------------------------
def settings_value(args: argparse.Namespace, settings: Settings) -> Any:
    """What ``Env`` holds for ``settings`` (:attr:`Settings.make`), from
    :func:`add_settings`' flags."""
    values = {
        name: getattr(args, f"{settings.group}_{name}") for name in settings.model.model_fields
    }
    return settings.make(settings.model.model_validate(values))


def cordon_config(args: argparse.Namespace) -> CordonConfig:
    """The cordon settings (``cordon``'s entry) of :func:`add_settings`' flags."""
    config: CordonConfig = settings_value(args, CORDON_SETTINGS)
    return config


def sampler_config(
    args: argparse.Namespace, *, state: Path | None, interval: float, max_open_files: int = 0
) -> SamplerConfig:
    """The sampler settings of :func:`add_host`'s flags."""
    return SamplerConfig(
        max_open_files=max_open_files,
        paths=HostPaths(procfs=args.procfs, sysfs=args.sysfs, kmsg=args.kmsg, state=state),
        node_name=args.node_name,
        interval=interval,
        collectors=frozenset(
            cls.name for cls in ordered() if getattr(args, f"collector_{cls.name}")
        ),
        top_processes=args.top_processes,
    )


def setup_logging(level: str) -> None:
    """Log lines to stderr at ``level`` and above, repeats rate-limited."""
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    install_log_filters()
