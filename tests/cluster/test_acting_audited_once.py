"""One firing, one "acting on" audit line (issue 22 review, points 2 and 6).

worker.py logs "acting on <summary>" (extra=AUDIT) when a journal entry's first step starts
(``next == 0 and not attempts``). A firing that waits for the pod list (point 2) or for the
state to be written (point 4) is handled again later with ``next`` still 0 and no attempt
counted, so the audit trail says it acted on the firing twice (or once per wait): the log, the
audit trail of issue 22 point 6, shows two firings where there was one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.agent import running_agent, wait_until
from tests.support.controlplane.cluster import TestCluster
from tests.support.kube_helpers import Cluster
from tests.support.remediation import (
    SLAB_HIGH,
    SLAB_LOW,
    host_args,
    incidents,
    pod_list_request,
    slab_rules,
    starved_host,
)


def test_a_firing_that_waits_for_its_pods_is_audited_once(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    ns, node = cluster.namespace("audit-once"), cluster.node()
    host = starved_host(tmp_path, cluster, ns, node)
    meminfo = host / "proc" / "meminfo"
    meminfo.write_text(meminfo.read_text().replace(SLAB_LOW, SLAB_HIGH))
    args = host_args(host, tmp_path, node=node, kubeconfig=proxied.kubeconfig)
    slab_rules(tmp_path, actions='[{action: evict, args: {free: "1Gi"}}]')  # the eviction first
    listing = proxied.hold("GET", pod_list_request(node), times=2)
    log = tmp_path / "agent.log"
    with running_agent(args=args, log_path=log) as base:
        listing.wait_hit()
        wait_until(
            "the wait for pods", lambda: "waits up to" in log.read_text(), timeout=30, step=0.05
        )
        listing.release()
        (incident,) = wait_until("the runbook", lambda: incidents(base), timeout=30, step=0.05)
    acting = [line for line in log.read_text().splitlines() if "acting on slab-high" in line]
    assert len(acting) == 1, acting
    assert incident
