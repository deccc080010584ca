"""Alertmanager webhook deliveries as the receiver is sent them (version 4), and a receiver of
node gpu-1 with two alert rules that queues what it accepts."""

from __future__ import annotations

from typing import Any

from nodeguard.alerts.webhook import WebhookReceiver
from nodeguard.firing import Firing
from nodeguard.rules.schema import AlertRule

WEBHOOK_RULES = (
    AlertRule.model_validate(
        {
            "name": "am-node-memory-low",
            "alertname": "NodeguardNodeMemoryLow",
            "actions": [{"action": "cordon"}],
            "resolve": [{"action": "uncordon"}],
        }
    ),
    AlertRule.model_validate(
        {
            "name": "am-container-near-limit",
            "alertname": "NodeguardContainerNearLimit",
            "matchers": {"severity": "warning", "pod": "*"},
            "actions": [{"action": "evict", "args": {"maxPriority": 999}}],
        }
    ),
)


def alert(
    name: str = "NodeguardNodeMemoryLow",
    status: str = "firing",
    *,
    fingerprint: str = "fp1",
    starts: str = "2026-11-30T06:00:00.123456789Z",
    **labels: str,
) -> dict[str, Any]:
    """One alert of a delivery (labels ``alertname``, ``node=gpu-1`` and ``labels``)."""
    return {
        "status": status,
        "labels": {"alertname": name, "node": "gpu-1", **labels},
        "annotations": {"summary": "MemAvailable 3%"},
        "startsAt": starts,
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prom/graph",
        "fingerprint": fingerprint,
    }


def payload(*alerts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A version-4 webhook body holding ``alerts``, ``extra`` fields on top."""
    return {
        "version": "4",
        "groupKey": "{}:{}",
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "nodeguard",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://am",
        "alerts": list(alerts),
        **extra,
    }


class RecordingQueue:
    """The remediator's ``submit`` stand-in: keeps each firing, refuses past ``capacity``."""

    def __init__(self, capacity: int = 100) -> None:
        self.items: list[Firing] = []
        self.capacity = capacity

    def submit(self, firing: Firing) -> bool:
        if len(self.items) >= self.capacity:
            return False
        self.items.append(firing)
        return True


def receiver_of(queue: RecordingQueue, **options: Any) -> WebhookReceiver:
    """A receiver for node gpu-1 with the test rules, queueing into ``queue``."""
    return WebhookReceiver(
        node_name="gpu-1",
        rules=lambda: WEBHOOK_RULES,
        submit=queue.submit,
        latest=lambda: None,
        global_dry_run=True,
        token="s3cret",
        **options,
    )


WEBHOOK_AUTH = {"Authorization": "Bearer s3cret"}
