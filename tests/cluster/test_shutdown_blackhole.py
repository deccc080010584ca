"""SIGTERM while the API server black-holes every request: the agent stops within the
DaemonSet's terminationGracePeriodSeconds, and what it could not finish is in its journal for
the next start (issue 22, point 6)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import yaml

from tests.support.agent import exited, get, running_agent, wait_until
from tests.support.controlplane.cluster import TestCluster
from tests.support.kube_helpers import Cluster, cordoned
from tests.support.remediation import agent_args, incidents, slab_rules

REPO = Path(__file__).resolve().parents[2]


def _grace_seconds() -> float:
    """The DaemonSet's own terminationGracePeriodSeconds: the kubelet's SIGKILL comes then."""
    spec = yaml.safe_load((REPO / "daemonset/base/daemonset.yaml").read_text())
    return float(spec["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])


def test_sigterm_with_the_api_black_holed_stops_within_the_grace_period(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    node = cluster.node()
    rules = slab_rules(tmp_path, actions="[{action: cordon}]")
    args = agent_args(tmp_path, node=node, kubeconfig=proxied.kubeconfig, rules=rules)
    cordon = proxied.hold("PATCH", rf"/nodes/{node}$", times=10_000)
    with running_agent(args=args, log_path=tmp_path / "agent-1.log") as base:
        cordon.wait_hit()
        # From now on every request is held too: the watch's, the Lease's, the Events'.
        for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
            proxied.hold(method, r".", times=10_000)
        started = time.monotonic()
        os.kill(base.pid, signal.SIGTERM)
        # Bounded by the DaemonSet's own setting: the kubelet SIGKILLs the agent then.
        wait_until("the agent to stop", lambda: exited(base.pid), timeout=_grace_seconds())
        took = time.monotonic() - started
    log = (tmp_path / "agent-1.log").read_text()
    assert "stopping: " in log and "stays in the journal" in log, (took, log[-2000:])
    assert log.rstrip().endswith("nodeguard stopped"), log[-2000:]
    held = list(proxied.rules)
    proxied.rules = []
    for rule in held:
        rule.drop()  # what was held never reaches the API server: lost with the agent
    # The next start finds the cordon it could not finish, and finishes it.
    args2 = agent_args(tmp_path, node=node, kubeconfig=control_plane.kubeconfig_path, rules=rules)
    with running_agent(args=args2, log_path=tmp_path / "agent-2.log") as base:
        (incident,) = wait_until("the resumed cordon", lambda: incidents(base), timeout=30)
        full = json.loads(get(f"{base}/incidents/{incident['id']}")[1])
    assert full["resumed"] == 1, full
    assert [(a["action"], a["outcome"]) for a in full["actions"]] == [("cordon", "done")]
    assert cordoned(cluster.core.read_node(node))
