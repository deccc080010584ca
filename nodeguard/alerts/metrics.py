"""``nodeguard_webhook_requests_total{code}`` and
``nodeguard_webhook_alerts_total{status,outcome}`` from the receiver's counters."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from nodeguard.alerts.webhook import WebhookReceiver

__all__ = ["WebhookCollector"]


class WebhookCollector(Collector):
    """Renders the webhook receiver's counters."""

    def __init__(self, *, receiver: WebhookReceiver) -> None:
        self._receiver = receiver

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "nodeguard_webhook_requests",
            "Alertmanager webhook deliveries by HTTP status",
            labels=["code"],
        )
        for code, n in sorted(self._receiver.requests.items()):
            requests.add_metric([str(code)], n)
        alerts = CounterMetricFamily(
            "nodeguard_webhook_alerts",
            "alerts received by status and outcome (queued, duplicate, stale, unmatched, "
            "no_node, nothing_to_undo, queue_full)",
            labels=["status", "outcome"],
        )
        for (status, outcome), n in sorted(self._receiver.counts.items()):
            alerts.add_metric([status, outcome], n)
        yield from (requests, alerts)
