"""One webhook alert as the :class:`~nodeguard.firing.Firing` the remediator runs: the same
path as a local rule's, with the alert's labels for its target and its annotations for its
summary."""

from __future__ import annotations

import time

from nodeguard.alerts.dedupe import delivery_key
from nodeguard.alerts.payload import WebhookAlert
from nodeguard.firing import Firing
from nodeguard.rules.schema import AlertRule
from nodeguard.snapshot import NodeSnapshot

__all__ = ["alert_firing"]

# An incident keeps the summary of its firing: cut, so 200 kept incidents stay small.
_SUMMARY_CHARS = 2000


def alert_firing(
    alert: WebhookAlert,
    *,
    rule: AlertRule,
    node: str,
    latest: NodeSnapshot | None,
    global_dry_run: bool,
) -> Firing:
    """The firing (or resolution) of ``alert`` on ``node``: the pod named by its ``namespace``
    and ``pod`` labels where it has both, else the node; ``latest`` (the agent's own snapshot)
    is its evidence only where it is of ``node``. ``key`` is its :func:`delivery_key`; the
    summary (alertname, status, labels, then ``summary`` or ``description``) is cut to
    2000 characters."""
    ns, pod = alert.labels.get("namespace"), alert.labels.get("pod")
    pod_ref = (ns, pod) if ns and pod else None
    text = alert.annotations.get("summary") or alert.annotations.get("description") or ""
    labels = ",".join(f"{k}={v}" for k, v in sorted(alert.labels.items()))
    summary = f"alert {alert.labels.get('alertname')} {alert.status} ({labels})" + (
        f": {text}" if text else ""
    )
    if len(summary) > _SUMMARY_CHARS:  # an incident keeps it: bounded
        summary = summary[: _SUMMARY_CHARS - 3] + "..."
    return Firing(
        rule=rule.name,
        kind="firing" if alert.status == "firing" else "resolved",
        scope="pod" if pod_ref else "node",
        target=f"{ns}/{pod}" if pod_ref else node,
        node=node,
        time=time.time(),
        steps=tuple(a.step for a in (rule.actions if alert.status == "firing" else rule.resolve)),
        dry_run=global_dry_run or bool(rule.dry_run),
        pod_ref=pod_ref,
        source="alertmanager",
        summary=summary,
        key=delivery_key(alert),
        snapshot=latest if latest is not None and latest.node_name == node else None,
    )
