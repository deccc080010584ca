"""Auditing every action: a Kubernetes Event on the object, a structured log line, a metric.

Events are core/v1 Events with ``source.component=nodeguard``; their reasons are
``Nodeguard<Did>`` (``NodeguardCordoned``, ``NodeguardEvicted``, ``NodeguardEvictionBlocked``,
...) and, in dry run, ``NodeguardWould<Do>`` (``NodeguardWouldCordon``), so a dry run leaves the
same trail with a name nobody mistakes for the real thing. An Event that cannot be written is
logged and never fails the action.
"""

from __future__ import annotations

import datetime as dt
import logging

from prometheus_client import CollectorRegistry, Counter

from nodeguard.actions.base import ActionResult
from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import KubeError

__all__ = ["ActionMetrics", "Auditor", "ObjectRef"]

log = logging.getLogger("nodeguard.audit")


class ActionMetrics:
    """``nodeguard_actions_total{action,outcome,dry_run}`` in the given registry."""

    def __init__(self, *, registry: CollectorRegistry | None) -> None:
        self.actions = Counter(
            "nodeguard_actions",
            "Runbook actions by outcome (done, noop, refused, blocked, failed) and dry run",
            ["action", "outcome", "dry_run"],
            registry=registry,
        )


class ObjectRef:
    """The object an Event is about: ``kind`` (Node, Pod, Experiment), ``name``,
    ``namespace`` (``""`` for a Node), ``uid`` and ``api_version``."""

    __slots__ = ("api_version", "kind", "name", "namespace", "uid")

    def __init__(
        self, *, kind: str, name: str, namespace: str = "", uid: str = "", api_version: str = "v1"
    ) -> None:
        self.kind, self.name, self.namespace = kind, name, namespace
        self.uid, self.api_version = uid, api_version


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Auditor:
    """Writes the audit trail of actions taken from ``node_name``."""

    def __init__(
        self, *, kube: KubeClient | None, node_name: str, metrics: ActionMetrics | None
    ) -> None:
        self._kube = kube
        self._node = node_name
        self._metrics = metrics
        self.events_written = 0

    async def record(
        self,
        *,
        result: ActionResult,
        obj: ObjectRef,
        reason: str,
        event_type: str = "Normal",
    ) -> None:
        """Log, count and write an Event for ``result`` about ``obj``. ``reason`` is the
        real-run reason (``NodeguardCordoned``); dry run turns it into its ``Would`` form."""
        if self._metrics is not None:
            self._metrics.actions.labels(
                result.action, result.outcome, "true" if result.dry_run else "false"
            ).inc()
        log.info(
            "action=%s outcome=%s dry_run=%s node=%s object=%s/%s/%s message=%r",
            result.action,
            result.outcome,
            str(result.dry_run).lower(),
            result.node,
            obj.kind,
            obj.namespace,
            obj.name,
            result.message,
        )
        await self.event(
            obj=obj,
            reason=dry_reason(reason) if result.dry_run else reason,
            message=result.message,
            event_type=event_type,
        )

    async def event(self, *, obj: ObjectRef, reason: str, message: str, event_type: str) -> None:
        """Write one core/v1 Event; failures are logged, not raised."""
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
        try:
            await self._kube.create_event(namespace=namespace, body=body)
            self.events_written += 1
        except KubeError as exc:
            log.warning("cannot write Event %s on %s %s: %s", reason, obj.kind, obj.name, exc)


_WOULD = {
    "NodeguardCordoned": "NodeguardWouldCordon",
    "NodeguardUncordoned": "NodeguardWouldUncordon",
    "NodeguardEvicted": "NodeguardWouldEvict",
    "NodeguardEvictionBlocked": "NodeguardWouldBeBlocked",
    "NodeguardKatibPaused": "NodeguardWouldPauseKatib",
    "NodeguardKatibResumed": "NodeguardWouldResumeKatib",
}


def dry_reason(reason: str) -> str:
    """The dry-run form of an Event reason."""
    return _WOULD.get(reason, reason.replace("Nodeguard", "NodeguardDryRun", 1))
