"""Auditing every action result once: a structured log line, a metric, and Kubernetes Events.

:func:`nodeguard.actions.registry.dispatch` hands every result of every action to
:meth:`Auditor.record`, whatever its outcome (done, noop, refused, blocked, failed, a Lease
timeout, the runbook's own refusals): one log line, one increment of
``nodeguard_actions_total{action,outcome,dry_run}``, and the result's Events (one on the node
with the action's reason for that outcome when the result names none).

Events are core/v1 Events with ``source.component=nodeguard``; their reasons are
``Nodeguard<Did>`` (``NodeguardCordoned``, ``NodeguardEvicted``, ...) and, in dry run,
``NodeguardWould<Do>`` (``NodeguardWouldCordon``) or ``NodeguardDryRun<...>``, so a dry run
leaves the same trail under a name nobody mistakes for the real thing (each action's entry
names its ``Would`` forms: :func:`nodeguard.actions.registry.dry_reason`). An Event that cannot be
written (the API server down) is kept, at most :data:`PENDING_EVENTS` of them, and written again
with the next result or :meth:`Auditor.flush`; it never fails the action. With a ``store`` (the
agent's state file) the kept Events outlive the process: one whose call timed out while the
agent stopped (an API server that does not answer within ``--shutdown.timeout``) is written by
the next start (the remediator flushes when it starts), never lost with the process.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import deque
from collections.abc import Callable, MutableMapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from nodeguard.actions.base import ActionResult, AuditEvent, ObjectRef
from nodeguard.actions.registry import dry_reason
from nodeguard.kube.client import JSON, KubeClient
from nodeguard.kube.errors import KubeError
from nodeguard.logs import AUDIT

__all__ = ["PENDING_EVENTS", "ActionMetrics", "Auditor", "ObjectRef"]

log = logging.getLogger("nodeguard.audit")

#: Events kept for a later try while the API server cannot take them (oldest dropped first).
PENDING_EVENTS = 256


class ActionMetrics:
    """``nodeguard_actions_total{action,outcome,dry_run}`` in the given registry."""

    def __init__(self, *, registry: CollectorRegistry | None) -> None:
        self.actions = Counter(
            "nodeguard_actions",
            "Runbook action results by outcome (done, noop, refused, blocked, failed) and dry run",
            ["action", "outcome", "dry_run"],
            registry=registry,
        )


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Auditor:
    """Writes the audit trail of actions taken from ``node_name``. ``store``: where the Events
    kept for a later try are mirrored (``pending``: ``[namespace, body]`` pairs; a state-file
    section), ``changed`` called after each change; without it they live in memory only."""

    def __init__(
        self,
        *,
        kube: KubeClient | None,
        node_name: str,
        metrics: ActionMetrics | None,
        store: MutableMapping[str, Any] | None = None,
        changed: Callable[[], None] = lambda: None,
    ) -> None:
        self._kube = kube
        self._node = node_name
        self._metrics = metrics
        self._store, self._changed = store, changed
        self._pending: deque[tuple[str, JSON]] = deque(
            (
                (str(e[0]), e[1])
                for e in (store or {}).get("pending", [])
                if isinstance(e, list) and len(e) == 2 and isinstance(e[1], dict)
            ),
            maxlen=PENDING_EVENTS,
        )
        self.events_written = 0
        #: Every reason written (dry-run forms included), for tests and the README check.
        self.reasons_seen: set[str] = set()

    async def record(self, *, result: ActionResult, default_reason: str) -> None:
        """Log, count and event one result. ``default_reason`` (real-run form) is used for an
        Event on the node when the result carries no Events of its own."""
        if self._metrics is not None:
            self._metrics.actions.labels(
                result.action, result.outcome, "true" if result.dry_run else "false"
            ).inc()
        events = result.events or (
            AuditEvent(
                obj=ObjectRef(kind="Node", name=result.node),
                reason=default_reason,
                message=result.message,
                type="Normal" if result.outcome in ("done", "noop") else "Warning",
            ),
        )
        log.info(
            "action=%s outcome=%s dry_run=%s node=%s objects=%s message=%r",
            result.action,
            result.outcome,
            str(result.dry_run).lower(),
            result.node,
            ",".join(
                f"{e.obj.kind}/{e.obj.namespace + '/' if e.obj.namespace else ''}{e.obj.name}"
                for e in events
            ),
            result.message,
            extra=AUDIT,
        )
        await self.flush()
        for e in events:
            if e.written:
                continue
            reason = dry_reason(e.reason) if result.dry_run else e.reason
            # A dry run changed nothing, so what it would have done is Normal (event exporters
            # page on Warning); a dry run that failed (an API error) is still a Warning.
            quiet = result.dry_run and result.outcome != "failed"
            kind = "Normal" if quiet else e.type
            await self.event(obj=e.obj, reason=reason, message=e.message, event_type=kind)

    async def event(self, *, obj: ObjectRef, reason: str, message: str, event_type: str) -> None:
        """Write one core/v1 Event; a failure is logged and the Event kept for a later try."""
        self.reasons_seen.add(reason)
        if self._kube is None:
            return
        now = _now()
        namespace = obj.namespace or "default"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": "nodeguard-", "namespace": namespace},
            "involvedObject": {
                "kind": obj.kind,
                "name": obj.name,
                "namespace": obj.namespace,
                "uid": obj.uid,
                "apiVersion": obj.api_version,
            },
            "reason": reason,
            "message": message[:1024],
            "type": event_type,
            "source": {"component": "nodeguard", "host": self._node},
            "reportingComponent": "nodeguard",
            "reportingInstance": self._node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        if not await self._write(namespace, body):
            self._pending.append((namespace, body))
            self._kept()

    def _kept(self) -> None:
        """Mirror the kept Events into the store (a kill loses none the state file got)."""
        if self._store is not None:
            self._store["pending"] = [[ns, body] for ns, body in self._pending]
            self._changed()

    async def _write(self, namespace: str, body: JSON) -> bool:
        assert self._kube is not None
        try:
            await self._kube.create_event(namespace=namespace, body=body)
        except KubeError as exc:
            log.warning(
                "cannot write Event %s on %s %s (kept for a later try): %s",
                body["reason"],
                body["involvedObject"]["kind"],
                body["involvedObject"]["name"],
                exc,
            )
            return False
        self.events_written += 1
        return True

    async def flush(self) -> None:
        """Write the Events kept from earlier failures, oldest first; stop at the first that
        fails again (the API server is still away)."""
        while self._pending and self._kube is not None:
            namespace, body = self._pending[0]
            if not await self._write(namespace, body):
                return
            self._pending.popleft()
            self._kept()

    @property
    def pending(self) -> int:
        """Events waiting for the API server."""
        return len(self._pending)
