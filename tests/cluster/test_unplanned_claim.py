"""An alert whose runbook is abandoned for lack of pods gives back its cluster-wide claim.

Issue 22 review, point 2. Commit 8a0f209 forgets the delivery in the agent's own dedupe "so its
re-sent copy acts". But the agent had already claimed the delivery on the target Node
(nodeguard.alerts.claims, before the first step): the claim stays, naming it. Alertmanager
re-sends the firing alert every repeat_interval to the Service, and the copy that reaches
another agent is dropped there as a duplicate (held by the agent that abandoned it): the alert
that nothing acted on is never acted on (for the claim's 24 h). The worker's docstring: "nothing
was planned ... the rule fires again once the data is there"; webhook.py: "of all the agents
behind the Service exactly one acts"."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

from tests.support.agent import get, running_agent, wait_until
from tests.support.controlplane.cluster import TestCluster
from tests.support.hosts import host_flags
from tests.support.kube_helpers import Cluster
from tests.support.remediation import (
    ALERT_RULES,
    alert_delivery,
    evicted_pods,
    incidents,
    low_priority_pods,
    metric_value,
    pod_list_request,
    post_delivery,
)


def test_an_abandoned_alert_is_acted_on_by_the_agent_its_copy_reaches(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    ns, target = cluster.namespace("unplanned-claim"), cluster.node()
    names = low_priority_pods(cluster, ns, target, 2)
    other = cluster.node(name=f"agent-b-{ns}")
    (tmp_path / "rules.yaml").write_text(ALERT_RULES)
    token = "t" * 40
    (tmp_path / "token").write_text(token)

    def args(node: str, kubeconfig: Path, state: str, *extra: str) -> list[str]:
        return [
            *host_flags("v2-systemd-containerd"),
            f"--kubeconfig={kubeconfig}",
            f"--rules={tmp_path / 'rules.yaml'}",
            f"--node-name={node}",
            "--interval=200ms",
            "--no-dry-run",
            f"--path.state={tmp_path / state}",
            f"--webhook.token-file={tmp_path / 'token'}",
            *extra,
        ]

    # Agent A, on the alert's node, never gets its pod list: its eviction is abandoned.
    proxied.hold("GET", pod_list_request(target), times=1000)
    delivery = alert_delivery(target, "2026-11-30T10:00:00Z")
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(
            running_agent(
                args=args(target, proxied.kubeconfig, "a", "--remediation.pod-list-wait=1s"),
                log_path=tmp_path / "a.log",
            )
        )
        assert asyncio.run(post_delivery(f"{a}/webhook/alertmanager", delivery, token)) == 200
        (incident,) = wait_until("A's abandon", lambda: incidents(a), timeout=30, step=0.05)
        full = json.loads(get(f"{a}/incidents/{incident['id']}")[1])
        assert "abandoned" in full
        assert evicted_pods(cluster, ns, names) == []
        # Alertmanager re-sends the firing alert; the Service gives the copy to agent B.
        b = stack.enter_context(
            running_agent(
                args=args(other, control_plane.kubeconfig_path, "b"), log_path=tmp_path / "b.log"
            )
        )
        assert asyncio.run(post_delivery(f"{b}/webhook/alertmanager", delivery, token)) == 200
        wait_until(
            "B's claim",
            lambda: sum(
                metric_value(b, "nodeguard_webhook_claims_total", outcome=o)
                for o in ("claimed", "ours", "duplicate", "stale")
            ),
            timeout=30,
            step=0.05,
        )
        time.sleep(2)
        duplicate = metric_value(b, "nodeguard_webhook_claims_total", outcome="duplicate")
        assert duplicate == 0, "B dropped the copy: the claim of A's abandoned delivery stands"
        wait_until(
            "B's eviction",
            lambda: len(evicted_pods(cluster, ns, names)) == 1,
            timeout=30,
            step=0.05,
        )
