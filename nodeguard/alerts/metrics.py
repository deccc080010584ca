"""``nodeguard_webhook_requests_total{code}``, ``nodeguard_webhook_alerts_total{status,outcome}``
and ``nodeguard_webhook_claims_total{outcome}`` from the receiver's counters."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nodeguard.alerts.webhook import WebhookReceiver

__all__ = ["NodeInfoCollector", "WebhookCollector"]


class NodeInfoCollector(Collector):
    """``nodeguard_node_info{node} 1``: the node this agent runs on. Alert rules join it
    (``* on (instance, job) group_left (node) nodeguard_node_info``) so every alert names the
    node to act on, whatever the scrape config's target labels are."""

    def __init__(self, *, node_name: str) -> None:
        self._node = node_name

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "nodeguard_node_info", "the node this agent runs on", labels=["node"]
        )
        info.add_metric([self._node], 1)
        yield info


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
            "no_node, nothing_to_undo, queue_full, state_not_persisted, observer)",
            labels=["status", "outcome"],
        )
        for (status, outcome), n in sorted(self._receiver.counts.items()):
            alerts.add_metric([status, outcome], n)
        claims = CounterMetricFamily(
            "nodeguard_webhook_claims",
            "claims of alert deliveries on their target Node, by outcome (claimed, ours, "
            "duplicate: another agent has it, stale, unavailable: tried again later)",
            labels=["outcome"],
        )
        for outcome, n in sorted(self._receiver.claims.items()):
            claims.add_metric([outcome], n)
        yield from (requests, alerts, claims)
