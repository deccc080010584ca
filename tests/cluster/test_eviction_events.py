"""An evicted pod has its Event, whatever stops the agent between the eviction and the Event.

The eviction's step notes each pod evicted (``inflight.done``, written ahead) and, once its
Event is written, that too (``inflight.announced``): a step cut short between the two (SIGKILL;
SIGTERM with the API server not answering past ``--shutdown.timeout``; the state disk full
right after the eviction) leaves the Event owed, and the resumed step writes it, once, and names
the pod in its result. On SIGTERM a step under way is let finish within the shutdown timeout
(not cancelled at once); an Event call that fails is kept, in the state file, and written by
a later call or the next start. Issue 22 review (point 6: "no evicted pod without its Event")."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from nodeguard.actions.audit import Auditor
from nodeguard.actions.base import ObjectRef
from nodeguard.kube.client import KubeClient
from tests.support.agent import exited, get, kill_9, running_agent, wait_until
from tests.support.controlplane.cluster import TestCluster
from tests.support.fullfs import PAGE, can_mount, fill, small_tmpfs
from tests.support.kube_helpers import Cluster
from tests.support.remediation import (
    agent_args,
    evicted_pods,
    incidents,
    low_priority_pods,
    metric_value,
    slab_rules,
)
from tests.support.state import state_at

STATE = "remediation-state.json"


def _resumed_result(cluster: Cluster, ns: str, victim: str, base: str) -> dict[str, Any]:
    (incident,) = wait_until(
        "the resumed runbook",
        lambda: incidents(base),
        timeout=30,
        step=0.05,
    )
    full: dict[str, Any] = json.loads(get(f"{base}/incidents/{incident['id']}")[1])
    wait_until(
        "the evicted pod's Event",
        lambda: cluster.events(ns, name=victim, reason="NodeguardEvicted"),
        timeout=10,
    )
    return full


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM past the shutdown timeout"])
def test_stopped_while_the_eviction_event_is_on_the_wire_the_resume_writes_it(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any, how: str
) -> None:
    ns, node = cluster.namespace("ev-event"), cluster.node()
    names = low_priority_pods(cluster, ns, node, 2)
    rules = slab_rules(tmp_path, actions='[{action: evict, args: {free: "0"}}]')
    # Below the API client's 15 s read timeout: the Event's call is still on the wire when the
    # grace ends, and cancelled.
    extra = ("--shutdown.timeout=1s",) if how.startswith("SIGTERM") else ()
    args = agent_args(tmp_path, node=node, kubeconfig=proxied.kubeconfig, rules=rules, extra=extra)
    # The pod's Event (its namespace's first) is held: the eviction itself went through.
    held = proxied.hold("POST", rf"^/api/v1/namespaces/{ns}/events")
    log = tmp_path / "agent-1.log"
    with running_agent(args=args, log_path=log) as base:
        held.wait_hit(timeout=60)
        (victim,) = evicted_pods(cluster, ns, names)
        if how == "SIGKILL":
            kill_9(base.pid)
        else:
            os.kill(base.pid, signal.SIGTERM)
            wait_until("the agent to stop", lambda: exited(base.pid), timeout=30, step=0.05)
    held.drop()  # that Event is lost with the agent
    proxied.clear()
    state = json.loads((tmp_path / "state" / STATE).read_text())
    (entry,) = state["sections"]["journal"].values()
    inflight = entry["progress"]["0"]["inflight"]
    assert inflight["done"] == [f"{ns}/{victim}"]
    assert inflight.get("announced", []) == []  # owed
    if how.startswith("SIGTERM"):
        assert "step 1 (evict) cut short by the stop" in log.read_text()  # audited
    with running_agent(args=args, log_path=tmp_path / "agent-2.log") as base:
        full = _resumed_result(cluster, ns, victim, base)
    assert full["resumed"] == 1
    # The evicted pod has its Event (once), and is named in the resumed step's result.
    (evicted,) = full["actions"][0]["details"]["evicted"]
    assert evicted["pods"] == [f"{ns}/{victim}"], evicted
    assert len(cluster.events(ns, name=victim, reason="NodeguardEvicted")) == 1
    assert len(evicted_pods(cluster, ns, names)) == 1


def test_sigterm_lets_the_step_under_way_finish_within_the_shutdown_timeout(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    # The default --shutdown.timeout (20 s) is longer than the Event call's read timeout
    # (15 s): the step is not cancelled at the stop; its Event call times out, the Event is
    # kept and written with the step's result (the next call passes), and the runbook ends.
    ns, node = cluster.namespace("ev-term"), cluster.node()
    names = low_priority_pods(cluster, ns, node, 2)
    rules = slab_rules(tmp_path, actions='[{action: evict, args: {free: "0"}}]')
    args = agent_args(tmp_path, node=node, kubeconfig=proxied.kubeconfig, rules=rules)
    held = proxied.hold("POST", rf"^/api/v1/namespaces/{ns}/events")
    log = tmp_path / "agent-1.log"
    with running_agent(args=args, log_path=log) as base:
        held.wait_hit(timeout=60)
        (victim,) = evicted_pods(cluster, ns, names)
        os.kill(base.pid, signal.SIGTERM)
        wait_until("the agent to stop", lambda: exited(base.pid), timeout=30, step=0.05)
    held.drop()
    assert "cut short by the stop" not in log.read_text()
    state = json.loads((tmp_path / "state" / STATE).read_text())
    assert state["sections"]["journal"] == {}  # the step finished within the grace
    assert state["sections"]["events"]["pending"] == []
    assert len(cluster.events(ns, name=victim, reason="NodeguardEvicted")) == 1
    assert len(evicted_pods(cluster, ns, names)) == 1


async def test_an_event_kept_for_a_later_try_outlives_the_process(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    # An Event whose call fails (here a 503; at a stop, a call that times out) is kept in the
    # state file, and the next process writes it.
    ns, node = cluster.namespace("ev-kept"), cluster.node()
    proxied.fail("POST", rf"^/api/v1/namespaces/{ns}/events", status=503, times=10)
    kube = KubeClient.load(kubeconfig=proxied.kubeconfig)
    try:
        state = state_at(path=tmp_path / STATE, node=node)
        first = Auditor(
            kube=kube,
            node_name=node,
            metrics=None,
            store=state.section("events"),
            changed=state.save,
        )
        pod = ObjectRef(kind="Pod", name="batch-0", namespace=ns, uid="u-1")
        await first.event(obj=pod, reason="NodeguardEvicted", message="m", event_type="Warning")
        assert first.pending == 1
        assert await state.persist()  # then killed
        proxied.clear()
        state = state_at(path=tmp_path / STATE, node=node)  # the next process
        second = Auditor(
            kube=kube,
            node_name=node,
            metrics=None,
            store=state.section("events"),
            changed=state.save,
        )
        assert second.pending == 1
        await second.flush()
        assert second.pending == 0 and state.section("events")["pending"] == []
        (event,) = cluster.events(ns, name="batch-0", reason="NodeguardEvicted")
        assert event.involved_object.uid == "u-1"
    finally:
        kube.close()


@pytest.mark.skipif(not can_mount(), reason="mounting a tmpfs needs root")
def test_disk_full_right_after_an_eviction_its_event_is_still_written(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    # The eviction's note (inflight.done) cannot be written: the step stops before the pod's
    # Event (StateNotPersisted), and goes on once the disk has room (the failed write-ahead
    # checkpoint wakes the state writer, which retries).
    ns, node = cluster.namespace("ev-full"), cluster.node()
    names = low_priority_pods(cluster, ns, node, 2)
    rules = slab_rules(tmp_path, actions='[{action: evict, args: {free: "0"}}]')
    with small_tmpfs(tmp_path / "state", size=64 * PAGE) as fs:
        args = agent_args(tmp_path, node=node, kubeconfig=proxied.kubeconfig, rules=rules)
        held = proxied.hold("POST", r"/pods/[^/]+/eviction")
        with running_agent(args=args, log_path=tmp_path / "agent.log") as base:
            held.wait_hit(timeout=60)
            filler = fill(fs)  # full while the eviction is on the wire
            held.release()
            (victim,) = wait_until(
                "the eviction", lambda: evicted_pods(cluster, ns, names), timeout=30, step=0.05
            )
            wait_until(
                "the state not persisted",
                lambda: (
                    metric_value(base, "nodeguard_state_persisted") == 0.0
                    or "cannot be written" in (tmp_path / "agent.log").read_text()
                ),
                timeout=30,
                step=0.05,
            )
            filler.unlink()  # nothing else: the writer's own retry takes it from here
            full = _resumed_result(cluster, ns, victim, base)
    (evicted,) = full["actions"][0]["details"]["evicted"]
    assert evicted["pods"] == [f"{ns}/{victim}"], evicted
    assert len(cluster.events(ns, name=victim, reason="NodeguardEvicted")) == 1
    assert len(evicted_pods(cluster, ns, names)) == 1
