"""Review of issue 22 point 6: an agent SIGKILLed while the Event of a pod it has just evicted
is on the wire. The eviction is in the journal (``inflight.done``), its Event is not on the
cluster; the restarted agent resumes the step and must write it (DESIGN: "no evicted pod
without its Event"; commit df8cfca)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.agent import get, running_agent, wait_until
from tests.controlplane.cluster import TestCluster
from tests.kube_helpers import Cluster
from tests.test_restarts import _agent_args, _evicted, _kill, _pods, _rules, _until, _zombie


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_review22_killed_while_the_eviction_event_is_on_the_wire_the_resume_writes_it(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any, sig: int
) -> None:
    # SIGTERM (a rollout) too: the remediator cancels its workers at once on stop, inside the
    # Event's API call, well within --shutdown.timeout.
    ns, node = cluster.namespace("r22-event"), cluster.node()
    names = _pods(cluster, ns, node, 2)
    rules = _rules(tmp_path, actions='[{action: evict, args: {free: "0"}}]')
    args = _agent_args(tmp_path, node=node, kubeconfig=proxied.kubeconfig, rules=rules)
    # The pod's Event (its namespace's first) is held: the eviction itself went through.
    held = proxied.hold("POST", rf"^/api/v1/namespaces/{ns}/events")
    with running_agent(args=args, log_path=tmp_path / "agent-1.log") as base:
        held.wait_hit(timeout=60)
        (victim,) = _evicted(cluster, ns, names)
        if sig == signal.SIGKILL:
            _kill(base.pid)
        else:
            os.kill(base.pid, sig)
            _until("the agent to stop", lambda: _zombie(base.pid), timeout=30)
    held.drop()  # that Event is lost with the agent
    proxied.clear()
    state = json.loads((tmp_path / "state" / "remediation-state.json").read_text())
    (entry,) = state["sections"]["journal"].values()
    assert entry["progress"]["0"]["inflight"]["done"] == [f"{ns}/{victim}"]
    with running_agent(args=args, log_path=tmp_path / "agent-2.log") as base:
        (incident,) = _until("the resumed runbook", lambda: json.loads(get(f"{base}/incidents")[1]))
        full = json.loads(get(f"{base}/incidents/{incident['id']}")[1])
    assert full["resumed"] == 1
    # The evicted pod has its Event, and is named in the resumed step's result.
    wait_until(
        "the evicted pod's Event",
        lambda: cluster.events(ns, name=victim, reason="NodeguardEvicted"),
        timeout=10,
    )
    (evicted,) = full["actions"][0]["details"]["evicted"]
    assert evicted["pods"] == [f"{ns}/{victim}"], evicted
    assert len(_evicted(cluster, ns, names)) == 1
