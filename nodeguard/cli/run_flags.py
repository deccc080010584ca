"""The flag groups of ``nodeguard run``, one function each, in ``--help`` order.

Adding a group of flags to ``run`` is one function here and one entry in
:data:`RUN_FLAG_GROUPS`; :mod:`nodeguard.cli.run` reads the values into the agent's settings.
Groups shared with other subcommands (host paths, collectors, actions' settings, ``--kubeconfig``,
``--log.level``) live in :mod:`nodeguard.cli.flags`.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from pathlib import Path

from nodeguard.cli.flags import (
    add_host,
    add_kubeconfig,
    add_log_level,
    add_settings,
    add_state,
    byte_size,
    count,
    duration,
    percent,
    registered_settings,
)
from nodeguard.connections import ConnectionLimits
from nodeguard.units import DURATION_EXAMPLES

#: --focus.interval when not given (off when --interval is not longer).
DEFAULT_FOCUS_INTERVAL = 0.25

__all__ = ["DEFAULT_LISTEN", "MIN_INTERVAL", "RUN_FLAG_GROUPS", "listen_address"]

DEFAULT_LISTEN = ":9847"
#: The shortest sampling interval, in seconds.
MIN_INTERVAL = 0.05


def listen_address(text: str) -> tuple[str | None, int]:
    """``HOST:PORT``; an empty host (``:9847``) means every address, IPv4 and IPv6."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"not HOST:PORT with a port 0-65535: {text!r}")
    return host.strip("[]") or None, int(port)


def _interval(text: str) -> float:
    seconds = duration(text)
    if seconds < MIN_INTERVAL:
        raise argparse.ArgumentTypeError(f"interval below {MIN_INTERVAL * 1000:.0f}ms: {text!r}")
    return seconds


def web(parser: argparse.ArgumentParser) -> None:
    """Where ``/metrics``, ``/snapshot``, the probes and the webhook are served."""
    g = parser.add_argument_group("web")
    g.add_argument(
        "--listen-address",
        type=listen_address,
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"where to serve; an empty host is every address (default {DEFAULT_LISTEN})",
    )
    g.add_argument(
        "--web.max-connections",
        dest="max_connections",
        type=count,
        default=ConnectionLimits().max_connections,
        metavar="COUNT",
        help="HTTP connections at once; at the cap a new one replaces the oldest that is not "
        "in a request (default 64, less where RLIMIT_NOFILE is low)",
    )


def sampling(parser: argparse.ArgumentParser) -> None:
    """What is read from the host, and how often."""
    add_host(parser)
    g = parser.add_argument_group("sampling")
    g.add_argument(
        "--interval",
        type=_interval,
        default="5s",
        metavar="DURATION",
        help=f"time between samples ({DURATION_EXAMPLES}; default 5s, at least 50ms)",
    )
    g.add_argument(
        "--collector.cgroups.keep-open",
        dest="keep_open",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep cgroup files open between samples and re-read them, raising the soft "
        "RLIMIT_NOFILE toward 16384 (five descriptors per cgroup; default on)",
    )


def _focus_interval(text: str) -> float:
    if text.strip() in ("0", "0s", "off"):
        return 0.0
    seconds = duration(text)
    if seconds < MIN_INTERVAL:
        raise argparse.ArgumentTypeError(f"below {MIN_INTERVAL * 1000:.0f}ms: {text!r}")
    return seconds


def _off_or_duration(text: str) -> float:
    return 0.0 if text.strip() in ("0", "0s", "off") else duration(text)


def _max_body(text: str) -> int:
    # aiohttp's client_max_size of 0 is no bound at all; one alert's delivery is about 1 KiB.
    value = byte_size(text)
    if value < 1024:
        raise argparse.ArgumentTypeError(f"below 1Ki (an Alertmanager delivery): {text!r}")
    return value


def _psi_window(text: str) -> float:
    seconds = duration(text)
    if not 0.5 <= seconds <= 10:
        raise argparse.ArgumentTypeError(f"the kernel takes PSI windows of 500ms to 10s: {text!r}")
    return seconds


def focus(parser: argparse.ArgumentParser) -> None:
    """Focus sampling and the kernel's notifications (:mod:`nodeguard.sampling.sampler`,
    :mod:`nodeguard.sampling.focus`)."""
    g = parser.add_argument_group("focus sampling and kernel notifications (react within a second)")
    g.add_argument(
        "--focus.interval",
        dest="focus_interval",
        type=_focus_interval,
        default=None,
        metavar="DURATION",
        help="re-read the cgroups near their limits (and the node when MemAvailable is low) "
        f"this often between samples ({DURATION_EXAMPLES}; shorter than --interval; 0 turns "
        "it off; default 250ms, off when --interval is as short)",
    )
    g.add_argument(
        "--focus.container-percent",
        dest="focus_percent",
        type=percent,
        default=80.0,
        metavar="PERCENT",
        help="a pod or container is focused at this share of its memory limit "
        "(working set; default 80)",
    )
    g.add_argument(
        "--focus.node-available-percent",
        dest="focus_node_percent",
        type=percent,
        default=10.0,
        metavar="PERCENT",
        help="the node is focused while MemAvailable is below this share of usable memory "
        "(MemTotal - hugetlb pool - HardwareCorrupted; default 10)",
    )
    for flag, what in (
        ("thresholds", "cgroup v1 memory thresholds (eventfd) at the focus and rule levels"),
        ("psi", "PSI triggers on /proc/pressure/memory (and pods' memory.pressure on v2)"),
        ("events", "cgroup v2 memory.events change notifications (inotify)"),
    ):
        g.add_argument(
            f"--notify.{flag}",
            dest=f"notify_{flag}",
            action=argparse.BooleanOptionalAction,
            default=True,
            help=f"{what}: a sample at once when the kernel signals (default on)",
        )
    g.add_argument(
        "--notify.psi-stall",
        dest="psi_stall",
        type=duration,
        default="200ms",
        metavar="DURATION",
        help=f"a PSI trigger fires when tasks stalled on memory this long within the window "
        f"({DURATION_EXAMPLES}; at most the window; default 200ms)",
    )
    g.add_argument(
        "--notify.psi-window",
        dest="psi_window",
        type=_psi_window,
        default="2s",
        metavar="DURATION",
        help=f"the PSI trigger's window ({DURATION_EXAMPLES}; 500ms to 10s; without "
        "CAP_SYS_RESOURCE the kernel takes only whole multiples of 2s; default 2s)",
    )


def _lease_seconds(text: str) -> int:
    """A Lease's duration: whole seconds (``leaseDurationSeconds`` is an integer), at least 1."""
    return max(1, math.ceil(duration(text)))


def remediation(parser: argparse.ArgumentParser) -> None:
    """Rules, the cluster, dry run, and where state and incidents are kept."""
    g = parser.add_argument_group("remediation")
    g.add_argument(
        "--dry-run",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="record what actions would do without doing them (default on)",
    )
    add_kubeconfig(g, used_for="pod names and actions", home=False)
    g.add_argument(
        "--rules",
        type=Path,
        action="append",
        default=[],
        metavar="PATH",
        help="rule file, or directory of *.yaml rule files (a ConfigMap mount); repeat for "
        "more; reloaded on change and on SIGHUP (default: none, nothing acts)",
    )
    add_state(g)
    g.add_argument(
        "--shutdown.timeout",
        dest="shutdown_timeout",
        type=duration,
        default=20.0,
        metavar="DURATION",
        help="after SIGTERM, wait at most this long for what is under way (API calls that "
        "the API server does not answer) before stopping; what is left is in the journal for "
        "the next start. Keep it below the pod's terminationGracePeriodSeconds "
        f"({DURATION_EXAMPLES}; default 20s, the DaemonSet's grace period is 30s)",
    )
    g.add_argument(
        "--remediation.pod-list-wait",
        dest="pod_list_wait",
        type=duration,
        default=None,
        metavar="DURATION",
        help="how long an eviction decided (or resumed) before this node's pod list is known "
        "waits for it, then is abandoned with why and its rule may fire again "
        f"({DURATION_EXAMPLES}; default: two --interval and 20s, one API call's timeout)",
    )
    g.add_argument(
        "--posture.interval",
        dest="posture_interval",
        type=_off_or_duration,
        default="1m",
        metavar="DURATION",
        help="with a cluster, how often nodeguard doctor's node checks run on this node's pods "
        "and Node when one changed, for nodeguard_posture_findings "
        f"({DURATION_EXAMPLES}; default 1m, 0 turns it off)",
    )
    g.add_argument(
        "--actor.lease-namespace",
        dest="actor_namespace",
        default=None,
        metavar="NAMESPACE",
        help="namespace of the per-node Lease nodeguard-<node> that makes one agent the actor "
        "for its node (default: --cordon.lease-namespace's)",
    )
    g.add_argument(
        "--actor.lease-duration",
        dest="actor_lease_seconds",
        type=_lease_seconds,
        default="30s",
        metavar="DURATION",
        help=f"leaseDurationSeconds of the per-node Lease, whole seconds ({DURATION_EXAMPLES}): "
        "renewed every third of it; another agent takes the node over once it went unrenewed "
        "this long (default 30s)",
    )
    g.add_argument(
        "--incidents.keep",
        dest="incidents_keep",
        type=count,
        default=200,
        metavar="COUNT",
        help="incident records kept, oldest removed first (default 200)",
    )


def webhook(parser: argparse.ArgumentParser) -> None:
    """The Alertmanager webhook (``POST /webhook/alertmanager``)."""
    w = parser.add_argument_group("Alertmanager webhook (POST /webhook/alertmanager)")
    w.add_argument(
        "--webhook.token-file",
        dest="webhook_token_file",
        type=Path,
        default=None,
        metavar="FILE",
        help="file holding the bearer token Alertmanager must send, at least 32 bytes "
        "(`openssl rand -hex 32`; default: none, and the webhook is off)",
    )
    w.add_argument(
        "--webhook.allow-unauthenticated",
        dest="webhook_unauthenticated",
        action="store_true",
        help="take deliveries without a token (only for a test on loopback; default off: "
        "without --webhook.token-file the webhook answers 403)",
    )
    w.add_argument(
        "--webhook.node-label",
        dest="webhook_node_label",
        default="node",
        metavar="LABEL",
        help="the alert label naming the node to act on (default node)",
    )
    w.add_argument(
        "--webhook.max-body",
        dest="webhook_max_body",
        type=_max_body,
        default="1Mi",
        metavar="BYTES",
        help="largest accepted delivery, a quantity (1Mi, 512k) or bytes, at least 1Ki; 413 "
        "above (default 1Mi)",
    )


def settings(parser: argparse.ArgumentParser) -> None:
    """The actions' settings, each from its registry entry (cordon: the mode and the
    cluster-wide budget)."""
    add_settings(parser, settings=registered_settings())


def evict(parser: argparse.ArgumentParser) -> None:
    """The per-node eviction limit."""
    g = parser.add_argument_group("evict")
    g.add_argument(
        "--evict.max-per-window",
        dest="evict_max",
        type=count,
        default=5,
        metavar="COUNT",
        help="evictions (units: a pod, or a gang) per node per window (default 5)",
    )
    g.add_argument(
        "--evict.window",
        dest="evict_window",
        type=duration,
        default="10m",
        metavar="DURATION",
        help=f"the eviction window ({DURATION_EXAMPLES}; default 10m)",
    )


def _patterns(text: str) -> tuple[str, ...]:
    patterns = tuple(p.strip() for p in text.split(",") if p.strip())
    for p in patterns:
        try:
            re.compile(p)
        except re.error as exc:
            raise argparse.ArgumentTypeError(f"not a regular expression: {p!r} ({exc})") from None
    return patterns


def metrics(parser: argparse.ArgumentParser) -> None:
    """``--metric-allowlist`` / ``--metric-denylist`` (mutually exclusive, as in
    kube-state-metrics; :mod:`nodeguard.exposition.metric_filter`)."""
    group = parser.add_argument_group("metric families (as kube-state-metrics takes them)")
    flags = group.add_mutually_exclusive_group()
    flags.add_argument(
        "--metric-allowlist",
        dest="metric_allowlist",
        type=_patterns,
        default=(),
        metavar="REGEX,...",
        help="write only the metric families whose name (a counter's with _total) one of "
        "these regular expressions matches whole (default: every family)",
    )
    flags.add_argument(
        "--metric-denylist",
        dest="metric_denylist",
        type=_patterns,
        default=(),
        metavar="REGEX,...",
        help="write every metric family but those whose name one of these regular expressions "
        "matches whole (e.g. 'nodeguard_pod_memory_.*'; default: none dropped)",
    )


def logging_(parser: argparse.ArgumentParser) -> None:
    """``--log.level``, at info for the agent."""
    add_log_level(parser, default="info")


#: Every flag group of ``nodeguard run``, in ``--help`` order. A new group of run flags is a
#: function above and a line here.
RUN_FLAG_GROUPS: tuple[Callable[[argparse.ArgumentParser], None], ...] = (
    web,
    sampling,
    focus,
    remediation,
    webhook,
    settings,
    evict,
    metrics,
    logging_,
)
