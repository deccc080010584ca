"""``nodeguard run``: sample every ``--interval``, serve ``/metrics``, ``/snapshot``,
``/healthz``, ``/readyz`` (and the webhook) on ``--listen-address``, and run the rules. Dry run
is on unless ``--no-dry-run``. Its flags are :data:`nodeguard.cli.run_flags.RUN_FLAG_GROUPS`."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import threading
from pathlib import Path

from nodeguard.agent import AgentConfig, run_agent
from nodeguard.cli.flags import cordon_config, sampler_config
from nodeguard.cli.run_flags import DEFAULT_FOCUS_INTERVAL, RUN_FLAG_GROUPS
from nodeguard.connections import ConnectionLimits, connection_cap
from nodeguard.exposition.metric_filter import MetricFilter
from nodeguard.kube.client import KUBE_THREAD_PREFIX
from nodeguard.kube.errors import KubeError
from nodeguard.rules.load import RuleError
from nodeguard.sampling.focus import NotifyConfig
from nodeguard.sources.open_files import descriptor_budget
from nodeguard.units import format_duration

__all__ = ["MIN_TOKEN_BYTES", "PLACEHOLDER_TOKENS", "add_arguments", "read_token", "run"]

log = logging.getLogger("nodeguard")

HELP = "sample continuously, serve /metrics and act on rules (dry run by default)"

#: The placeholder nodeguard's manifests once shipped in their Secret: never a token.
PLACEHOLDER_TOKENS = frozenset({"replace-me-with-the-output-of-openssl-rand-hex-32"})
MIN_TOKEN_BYTES = 32


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag group of ``nodeguard run``."""
    for group in RUN_FLAG_GROUPS:
        group(parser)


def _usable_state_dir(path: Path) -> Path | None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning(
            "state directory %s unusable (%s): OOM kill counts, remediation state and "
            "incidents restart with the agent (set --path.state)",
            path,
            exc,
        )
        return None
    if not os.access(path, os.W_OK):
        log.warning(
            "state directory %s not writable: OOM kill counts, remediation state and incidents "
            "restart with the agent (set --path.state)",
            path,
        )
        return None
    return path


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


def notify_config(args: argparse.Namespace) -> NotifyConfig:
    """The kernel notifications of the ``--notify.*`` flags. Raises ``SystemExit`` with one
    line when PSI triggers are on and ``--notify.psi-stall`` is longer than
    ``--notify.psi-window`` (the kernel refuses such a trigger:
    Documentation/accounting/psi.rst)."""
    if args.notify_psi and args.psi_stall > args.psi_window:
        raise SystemExit(
            f"nodeguard: --notify.psi-stall ({format_duration(args.psi_stall)}) is longer than "
            f"--notify.psi-window ({format_duration(args.psi_window)}): a stall is measured "
            "within the window"
        )
    return NotifyConfig(
        thresholds=args.notify_thresholds,
        psi=args.notify_psi,
        events=args.notify_events,
        psi_stall=args.psi_stall,
        psi_window=args.psi_window,
    )


def focus_interval(args: argparse.Namespace) -> float:
    """``--focus.interval`` in seconds, 0 for off: by default 250 ms, off where ``--interval``
    is not longer. Raises ``SystemExit`` with one line when it is given and not shorter than
    ``--interval``."""
    if args.focus_interval is None:
        return DEFAULT_FOCUS_INTERVAL if args.interval > DEFAULT_FOCUS_INTERVAL else 0.0
    if args.focus_interval and args.focus_interval >= args.interval:
        raise SystemExit(
            f"nodeguard: --focus.interval ({format_duration(args.focus_interval)}) is not "
            f"shorter than --interval ({format_duration(args.interval)}): focused samples come "
            "between full ones (0 turns them off)"
        )
    return float(args.focus_interval)


def config(args: argparse.Namespace) -> AgentConfig:
    """The agent's settings from the flags (the state directory created where it can be)."""
    focus, notify = focus_interval(args), notify_config(args)
    state = _usable_state_dir(args.state)
    host, port = args.listen_address
    held = descriptor_budget(raise_limit=True) if args.keep_open else 0
    cordon = cordon_config(args)
    return AgentConfig(
        sampler=dataclasses.replace(
            sampler_config(args, state=state, interval=args.interval, max_open_files=held),
            focus_interval=focus,
            focus_share=args.focus_percent / 100,
            node_focus_share=args.focus_node_percent / 100,
        ),
        notify=notify,
        host=host,
        port=port,
        dry_run=args.dry_run,
        kubeconfig=args.kubeconfig,
        rules=tuple(args.rules),
        incidents_dir=args.incidents_dir or (state / "incidents" if state else None),
        incidents_keep=args.incidents_keep,
        cordon=cordon,
        actor_namespace=args.actor_namespace or cordon.lease_namespace,
        actor_lease_seconds=args.actor_lease_seconds,
        evictions_per_window=args.evict_max,
        eviction_window=args.evict_window,
        webhook_token=read_token(args.webhook_token_file),
        webhook_unauthenticated=args.webhook_unauthenticated,
        webhook_node_label=args.webhook_node_label,
        webhook_max_body=args.webhook_max_body,
        limits=ConnectionLimits(
            max_connections=connection_cap(wanted=args.max_connections, held_files=held)
        ),
        metric_filter=metric_filter(args),
        shutdown_timeout=args.shutdown_timeout,
        pod_list_wait=args.pod_list_wait,
        posture_interval=args.posture_interval,
    )


def metric_filter(args: argparse.Namespace) -> MetricFilter:
    """The filter ``--metric-allowlist`` / ``--metric-denylist`` describe."""
    return MetricFilter(allow=tuple(args.metric_allowlist), deny=tuple(args.metric_denylist))


def run(args: argparse.Namespace) -> int:
    """Run the agent until SIGTERM; 1 when the rules or the cluster are not usable at start."""
    try:
        rc = asyncio.run(run_agent(config(args)))
    except RuleError as exc:
        log.error("rules not loaded, not starting:\n%s", exc)
        return 1
    except KubeError as exc:
        log.error("Kubernetes API not usable, not starting: %s", exc)
        return 1
    if any(t.name.startswith(KUBE_THREAD_PREFIX) and t.is_alive() for t in threading.enumerate()):
        # A thread still inside an API call the API server never answers: the interpreter
        # would join it at exit (concurrent.futures does), past the grace period, only to
        # drop its answer. Everything that matters is saved by now (the journal, the state).
        logging.shutdown()
        os._exit(rc)
    return rc
