"""The ``nodeguard`` command, with node_exporter's flag conventions.

- ``nodeguard run``: sample every ``--interval`` and serve ``/metrics``, ``/snapshot``,
  ``/healthz``, ``/readyz`` on ``--listen-address``. Dry run is on unless ``--no-dry-run``.
- ``nodeguard snapshot``: take one sample and print a report (``--json``: the same as JSON).
- ``nodeguard act ACTION --node NODE [--dry-run]``: one runbook action by hand.

Both take the same ``--path.*`` and ``--collector.*`` flags, so either can be pointed at a
fixture tree or at the host's filesystems mounted under ``/host``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from nodeguard import __version__
from nodeguard.act import add_act_arguments, run_act
from nodeguard.actions.cordon import CordonConfig
from nodeguard.agent import AgentConfig, run_agent
from nodeguard.commands import check_files, show_incidents
from nodeguard.connections import ConnectionLimits, connection_cap
from nodeguard.kube.errors import KubeError
from nodeguard.logs import install_log_filters
from nodeguard.metric_filter import add_metric_filter_flags, metric_filter_from_args
from nodeguard.paths import HostPaths
from nodeguard.report import render_report
from nodeguard.rules.load import RuleError
from nodeguard.sampler import COLLECTORS, Sampler, SamplerConfig
from nodeguard.snapshot import to_jsonable
from nodeguard.sources.open_files import descriptor_budget

__all__ = ["main", "parse_duration"]

log = logging.getLogger("nodeguard")

DEFAULT_LISTEN = ":9847"
_DURATION_RE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>ms|s|m|h)?$")
_MIN_INTERVAL = 0.05
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """``"5s"``, ``"500ms"``, ``"1m"``, ``"2h"`` or a bare number of seconds, as seconds.
    Raises ``argparse.ArgumentTypeError`` for anything else or a non-positive value."""
    m = _DURATION_RE.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 5s, 500ms, 1m)")
    seconds = float(m.group("n")) * _UNIT_SECONDS[m.group("unit")]
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"duration must be positive: {text!r}")
    return seconds


def _listen_address(text: str) -> tuple[str | None, int]:
    """``HOST:PORT``; an empty host (``:9847``) means every address, IPv4 and IPv6."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"not HOST:PORT with a port 0-65535: {text!r}")
    return host.strip("[]") or None, int(port)


def _interval(text: str) -> float:
    seconds = parse_duration(text)
    if seconds < _MIN_INTERVAL:
        raise argparse.ArgumentTypeError(f"interval below {_MIN_INTERVAL * 1000:.0f}ms: {text!r}")
    return seconds


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"not a count (0 or more): {text!r}")
    return int(text)


def _common(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("host paths")
    g.add_argument(
        "--path.procfs",
        dest="procfs",
        type=Path,
        default=Path("/proc"),
        help="procfs mount point (default /proc; /host/proc in the DaemonSet)",
    )
    g.add_argument(
        "--path.sysfs",
        dest="sysfs",
        type=Path,
        default=Path("/sys"),
        help="sysfs mount point; cgroups are read under <sysfs>/fs/cgroup",
    )
    g.add_argument(
        "--path.kmsg",
        dest="kmsg",
        type=Path,
        default=Path("/dev/kmsg"),
        help="kernel log device, for OOM kills (default /dev/kmsg)",
    )
    c = parser.add_argument_group("collectors")
    for name in COLLECTORS:
        c.add_argument(
            f"--collector.{name}",
            dest=f"collector_{name}",
            action=argparse.BooleanOptionalAction,
            default=True,
            help=f"enable the {name} collector (default on)",
        )
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME") or socket.gethostname(),
        help="this node's name (default $NODE_NAME, else the hostname)",
    )
    parser.add_argument(
        "--top-processes",
        type=_count,
        default=10,
        help="how many processes to keep by RSS, for evidence",
    )
    parser.add_argument(
        "--log.level",
        dest="log_level",
        default="info",
        choices=["debug", "info", "warning", "error"],
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``nodeguard`` command."""
    parser = argparse.ArgumentParser(
        prog="nodeguard",
        description="Node memory agent for GPU/ML Kubernetes nodes: exporter and remediation.",
    )
    parser.add_argument("--version", action="version", version=f"nodeguard {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="sample continuously and serve /metrics")
    _common(run)
    run.add_argument(
        "--listen-address",
        type=_listen_address,
        default=DEFAULT_LISTEN,
        help=f"HOST:PORT to serve on (default {DEFAULT_LISTEN})",
    )
    run.add_argument(
        "--web.max-connections",
        dest="max_connections",
        type=_count,
        default=ConnectionLimits().max_connections,
        help="HTTP connections at once; at the cap a new one replaces the oldest that is not "
        "in a request (default 64, less where RLIMIT_NOFILE is low)",
    )
    run.add_argument(
        "--interval",
        type=_interval,
        default=5.0,
        help="time between samples (default 5s, min 50ms)",
    )
    run.add_argument(
        "--collector.cgroups.keep-open",
        dest="keep_open",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep cgroup files open between samples and re-read them, raising the soft "
        "RLIMIT_NOFILE toward 16384 (five descriptors per cgroup; default on)",
    )
    run.add_argument(
        "--dry-run",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="record what actions would do without doing them (default on)",
    )
    run.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="kubeconfig for pod names and actions (default: the in-cluster config when "
        "running in a pod; otherwise no cluster)",
    )
    run.add_argument(
        "--path.state",
        dest="state",
        type=Path,
        default=Path("/var/lib/nodeguard"),
        help="directory for state kept across restarts (OOM kill log position)",
    )
    run.add_argument(
        "--rules",
        type=Path,
        action="append",
        default=[],
        help="rule file, or directory of *.yaml rule files (a ConfigMap mount); repeat for more. "
        "Reloaded on change and on SIGHUP",
    )
    run.add_argument(
        "--incidents.dir",
        dest="incidents_dir",
        type=Path,
        default=None,
        help="where incident records are kept (default <path.state>/incidents)",
    )
    run.add_argument(
        "--incidents.keep",
        dest="incidents_keep",
        type=_count,
        default=200,
        help="incident records kept, oldest removed first (default 200)",
    )
    add_metric_filter_flags(run)
    w = run.add_argument_group("Alertmanager webhook (POST /webhook/alertmanager)")
    w.add_argument(
        "--webhook.token-file",
        dest="webhook_token_file",
        type=Path,
        default=None,
        help="file holding the bearer token Alertmanager must send, at least 32 bytes "
        "(`openssl rand -hex 32`; default: none, and the webhook is off)",
    )
    w.add_argument(
        "--webhook.allow-unauthenticated",
        dest="webhook_unauthenticated",
        action="store_true",
        help="take deliveries without a token (only for a test on loopback; default: without "
        "--webhook.token-file the webhook is off and answers 403)",
    )
    w.add_argument(
        "--webhook.node-label",
        dest="webhook_node_label",
        default="node",
        help="the alert label naming the node to act on (default node)",
    )
    w.add_argument(
        "--webhook.max-body",
        dest="webhook_max_body",
        type=_count,
        default=1 << 20,
        help="largest accepted delivery in bytes; 413 above (default 1 MiB)",
    )
    g = run.add_argument_group("actions")
    g.add_argument(
        "--cordon.mode",
        dest="cordon_mode",
        choices=["unschedulable", "taint"],
        default="unschedulable",
    )
    g.add_argument(
        "--cordon.budget-nodes",
        dest="budget_nodes",
        type=int,
        default=None,
        help="at most this many nodes cordoned by nodeguard at once",
    )
    g.add_argument(
        "--cordon.budget-percent",
        dest="budget_percent",
        type=float,
        default=None,
        help="at most this percent of nodes cordoned by nodeguard at once",
    )
    g.add_argument(
        "--cordon.lease-namespace",
        dest="lease_namespace",
        default="kube-system",
        help="namespace of the budget's Lease (default kube-system)",
    )
    g.add_argument(
        "--evict.max-per-window",
        dest="evict_max",
        type=_count,
        default=5,
        help="evictions (units) per node per window (default 5)",
    )
    g.add_argument(
        "--evict.window",
        dest="evict_window",
        type=parse_duration,
        default=600.0,
        help="the eviction window (default 10m)",
    )

    snap = sub.add_parser("snapshot", help="take one sample and print it")
    _common(snap)
    snap.add_argument("--json", action="store_true", help="print JSON (bytes, seconds)")

    check = sub.add_parser("check", help="validate rule files (exit 1 on any error)")
    check.add_argument("files", type=Path, nargs="+")

    inc = sub.add_parser("incidents", help="list incident records, or show one")
    inc.add_argument("id", nargs="?", help="show this incident in full (JSON)")
    inc.add_argument("--path.state", dest="state", type=Path, default=Path("/var/lib/nodeguard"))
    inc.add_argument("--incidents.dir", dest="incidents_dir", type=Path, default=None)
    inc.add_argument("--json", action="store_true")

    for p in (check, inc):
        p.add_argument(
            "--log.level",
            dest="log_level",
            default="warning",
            choices=["debug", "info", "warning", "error"],
        )

    act = sub.add_parser("act", help="run one runbook action by hand (see --dry-run)")
    add_act_arguments(act)
    act.add_argument(
        "--log.level",
        dest="log_level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
    )
    return parser


def _config(
    args: argparse.Namespace, *, state: Path | None, interval: float, max_open_files: int = 0
) -> SamplerConfig:
    enabled = frozenset(n for n in COLLECTORS if getattr(args, f"collector_{n}"))
    return SamplerConfig(
        max_open_files=max_open_files,
        paths=HostPaths(procfs=args.procfs, sysfs=args.sysfs, kmsg=args.kmsg, state=state),
        node_name=args.node_name,
        interval=interval,
        collectors=enabled,
        top_processes=args.top_processes,
    )


def _usable_state_dir(path: Path) -> Path | None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning(
            "state directory %s unusable (%s): OOM kill counts restart with the agent", path, exc
        )
        return None
    if not os.access(path, os.W_OK):
        log.warning("state directory %s not writable: OOM kill counts restart with the agent", path)
        return None
    return path


#: The placeholder nodeguard's manifests once shipped in their Secret: never a token.
PLACEHOLDER_TOKENS = frozenset({"replace-me-with-the-output-of-openssl-rand-hex-32"})
MIN_TOKEN_BYTES = 32


def read_token(path: Path | None) -> str | None:
    """The webhook's bearer token from ``path`` (surrounding whitespace dropped). Raises
    ``SystemExit`` with one line when the file cannot be read, or holds a shipped placeholder
    or fewer than :data:`MIN_TOKEN_BYTES` bytes (``openssl rand -hex 32`` makes 64)."""
    if path is None:
        return None
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SystemExit(f"nodeguard: --webhook.token-file {path}: {reason}") from None
    if token in PLACEHOLDER_TOKENS:
        raise SystemExit(
            f"nodeguard: --webhook.token-file {path} holds the shipped placeholder, not a "
            "token: make one with `openssl rand -hex 32`"
        )
    if len(token.encode()) < MIN_TOKEN_BYTES:
        raise SystemExit(
            f"nodeguard: --webhook.token-file {path}: the token has {len(token.encode())} "
            f"bytes, at least {MIN_TOKEN_BYTES} are needed (`openssl rand -hex 32`)"
        )
    return token


def _run(args: argparse.Namespace) -> int:
    state = _usable_state_dir(args.state)
    host, port = args.listen_address
    held = descriptor_budget(raise_limit=True) if args.keep_open else 0
    cfg = AgentConfig(
        sampler=_config(args, state=state, interval=args.interval, max_open_files=held),
        host=host,
        port=port,
        dry_run=args.dry_run,
        kubeconfig=args.kubeconfig,
        rules=tuple(args.rules),
        incidents_dir=args.incidents_dir or (state / "incidents" if state else None),
        incidents_keep=args.incidents_keep,
        cordon=CordonConfig(
            mode=args.cordon_mode,
            budget_nodes=args.budget_nodes,
            budget_percent=args.budget_percent,
            lease_namespace=args.lease_namespace,
        ),
        evictions_per_window=args.evict_max,
        eviction_window=args.evict_window,
        webhook_token=read_token(args.webhook_token_file),
        webhook_unauthenticated=args.webhook_unauthenticated,
        webhook_node_label=args.webhook_node_label,
        webhook_max_body=args.webhook_max_body,
        limits=ConnectionLimits(
            max_connections=connection_cap(wanted=args.max_connections, held_files=held)
        ),
        metric_filter=metric_filter_from_args(args),
    )
    try:
        return asyncio.run(run_agent(cfg))
    except RuleError as exc:
        log.error("rules not loaded, not starting:\n%s", exc)
        return 1
    except KubeError as exc:
        log.error("Kubernetes API not usable, not starting: %s", exc)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nodeguard`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    install_log_filters()
    if args.command == "run":
        return _run(args)
    if args.command == "act":
        return run_act(args)
    if args.command == "check":
        return check_files(args.files, out=sys.stdout)
    if args.command == "incidents":
        directory = args.incidents_dir or args.state / "incidents"
        return show_incidents(directory, incident=args.id, as_json=args.json, console=Console())
    # A one-off snapshot keeps no state: it must not move the running agent's kmsg position.
    sampler = Sampler(config=_config(args, state=None, interval=5.0))
    try:
        snap = sampler.sample_once()
    finally:
        sampler.close()
    if args.json:
        json.dump(to_jsonable(snap), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        render_report(snap, console=Console(), top=args.top_processes)
    return 0
