"""Review of issue 22 points 4 and 6: the state filesystem fills up between an eviction and
its write-ahead note.

The eviction's API call goes through; its note in the journal (``inflight.done``) cannot be
written, so the step stops (StateNotPersisted) before the pod's Event is written, and goes on
once the disk has room. The step run again counts the pod as "reported" (it is in ``done``):
it writes no Event for it and names no pod in its result. A full disk makes a real eviction
without its Event (commit df8cfca: "no evicted pod without its Event"). The same cause as
tests/test_review22_evict_event.py, reached without a kill."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.agent import get, running_agent, wait_until
from tests.controlplane.cluster import TestCluster
from tests.fullfs import PAGE, can_mount, fill, small_tmpfs
from tests.kube_helpers import Cluster
from tests.test_restarts import _agent_args, _evicted, _metric, _pods, _rules, _until


@pytest.mark.skipif(not can_mount(), reason="mounting a tmpfs needs root")
def test_review22_disk_full_right_after_an_eviction_its_event_is_still_written(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    ns, node = cluster.namespace("r22-full"), cluster.node()
    names = _pods(cluster, ns, node, 2)
    rules = _rules(tmp_path, actions='[{action: evict, args: {free: "0"}}]')
    with small_tmpfs(tmp_path / "state", size=64 * PAGE) as fs:
        args = _agent_args(tmp_path, node=node, kubeconfig=proxied.kubeconfig, rules=rules)
        held = proxied.hold("POST", r"/pods/[^/]+/eviction")
        with running_agent(args=args, log_path=tmp_path / "agent.log") as base:
            held.wait_hit(timeout=60)
            filler = fill(fs)  # full while the eviction is on the wire
            held.release()
            (victim,) = _until("the eviction", lambda: _evicted(cluster, ns, names))
            _until(
                "the state not persisted",
                lambda: (
                    _metric(base, "nodeguard_state_persisted") == 0.0
                    or "cannot be written" in (tmp_path / "agent.log").read_text()
                ),
            )
            filler.unlink()
            # A failed checkpoint never wakes the state writer (tests/test_review22_checkpoint_
            # wedge.py): a forced rule reload saves the engine's state, which does.
            os.kill(base.pid, signal.SIGHUP)
            (incident,) = _until(
                "the runbook", lambda: json.loads(get(f"{base}/incidents")[1]), timeout=60
            )
            full = json.loads(get(f"{base}/incidents/{incident['id']}")[1])
            wait_until(
                "the evicted pod's Event",
                lambda: cluster.events(ns, name=victim, reason="NodeguardEvicted"),
                timeout=10,
            )
    (evicted,) = full["actions"][0]["details"]["evicted"]
    assert evicted["pods"] == [f"{ns}/{victim}"], evicted
    assert len(_evicted(cluster, ns, names)) == 1
