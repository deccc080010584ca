"""One agent acts for a node (nodeguard/remediation/actor.py): real agent processes, two for one
node with their own ``--path.state``, killed with SIGKILL at the worst moment, against the test
kube-apiserver (RBAC on) and the fault-injecting proxy (tests/support/apiproxy.py).

The faults: a second agent for a node evicted a second round (2 pods where 1 was due, two sets
of Events and incidents, no warning); and an alert delivery claimed by an agent that then died
was dropped by every other agent as a duplicate for 24 h."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
from pathlib import Path
from typing import Any

from kubernetes import client

from nodeguard.remediation.actor import lease_name
from tests.support.agent import get, kill_9, running_agent, wait_until
from tests.support.controlplane.cluster import TestCluster
from tests.support.kube_helpers import Cluster, given
from tests.support.remediation import (
    ALERT_RULES,
    EVICT_ONE,
    LEASE_SECONDS,
    actor_args,
    actor_state,
    alert_delivery,
    evicted_events,
    evicted_pods,
    incidents,
    low_priority_pods,
    metric_value,
    post_delivery,
    slab_rules,
)


def test_two_agents_for_one_node_evict_once_and_the_second_says_it_observes(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path
) -> None:
    # maxFirings 1/1h and free: "0": one pod is due. Two agents, each with its own state file.
    ns, node = cluster.namespace("two-agents"), cluster.node()
    names = low_priority_pods(cluster, ns, node, 3)
    rules = slab_rules(tmp_path, actions=EVICT_ONE)
    kubeconfig = control_plane.kubeconfig_path
    with contextlib.ExitStack() as stack:
        agents = [
            stack.enter_context(
                running_agent(
                    args=actor_args(tmp_path, name, node=node, kubeconfig=kubeconfig, rules=rules),
                    log_path=tmp_path / f"{name}.log",
                )
            )
            for name in ("agent-a", "agent-b")
        ]
        wait_until("an eviction", lambda: evicted_pods(cluster, ns, names), timeout=30, step=0.05)
        wait_until(
            "a runbook to finish", lambda: any(incidents(a) for a in agents), timeout=30, step=0.05
        )
        # Both sample 30 more times: time for a second agent to act, were it going to.
        marks = [metric_value(a, "nodeguard_sampler_samples_total") for a in agents]
        wait_until(
            "30 more samples on both",
            lambda: all(
                metric_value(a, "nodeguard_sampler_samples_total") >= m + 30
                for a, m in zip(agents, marks, strict=True)
            ),
            timeout=30,
            step=0.05,
        )
        assert len(evicted_pods(cluster, ns, names)) == 1
        assert evicted_events(cluster, ns, names) == 1
        assert sum(len(incidents(a)) for a in agents) == 1
        states = sorted((actor_state(a, "actor"), actor_state(a, "observer")) for a in agents)
        assert states == [(0.0, 1.0), (1.0, 0.0)]
        observer = next(a for a in agents if actor_state(a, "observer") == 1.0)
        log = (tmp_path / ("agent-a.log" if observer == agents[0] else "agent-b.log")).read_text()
    assert f"observer: node {node}'s actions are held by " in log
    assert log.count("observer: node") == 1  # said once, not every sample
    lease = client.CoordinationV1Api(cluster.api).read_namespaced_lease(lease_name(node), "default")
    assert given(lease.spec).lease_duration_seconds == LEASE_SECONDS


def test_the_actor_killed_with_its_eviction_on_the_wire_the_observer_finishes_it_once(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    ns, node = cluster.namespace("takeover"), cluster.node()
    names = low_priority_pods(cluster, ns, node, 3)
    rules = slab_rules(tmp_path, actions=EVICT_ONE)
    held = proxied.hold("POST", r"/pods/[^/]+/eviction")
    a_args = actor_args(tmp_path, "agent-a", node=node, kubeconfig=proxied.kubeconfig, rules=rules)
    b_args = actor_args(
        tmp_path, "agent-b", node=node, kubeconfig=control_plane.kubeconfig_path, rules=rules
    )
    with running_agent(args=a_args, log_path=tmp_path / "agent-a.log") as a:
        held.wait_hit()  # a's eviction is on the wire
        kill_9(a.pid)
    proxied.clear()  # it reaches the API server after a died
    wait_until(
        "the in-flight eviction", lambda: evicted_pods(cluster, ns, names), timeout=30, step=0.05
    )
    # b comes up while a's Lease still looks live to it: it observes, then takes the node over.
    with running_agent(args=b_args, log_path=tmp_path / "agent-b.log") as b:
        (incident,) = wait_until("b's runbook", lambda: incidents(b), timeout=30, step=0.05)
        full = json.loads(get(f"{b}/incidents/{incident['id']}")[1])
        marks = metric_value(b, "nodeguard_sampler_samples_total")
        wait_until(
            "30 more samples",
            lambda: metric_value(b, "nodeguard_sampler_samples_total") >= marks + 30,
            timeout=30,
            step=0.05,
        )
        assert len(evicted_pods(cluster, ns, names)) == 1
        assert len(incidents(b)) == 1
        assert actor_state(b, "actor") == 1.0
    # b finished a's unit (adopted from the Lease), not a second one of its own.
    assert full["resumed"] == 1
    assert [(x["action"], x["outcome"]) for x in full["actions"]] == [("evict", "done")]
    assert "completed" in full["actions"][0]["details"]["evicted"][0]["why"]
    assert len(evicted_pods(cluster, ns, names)) == 1
    b_log = (tmp_path / "agent-b.log").read_text()
    assert f"observer: node {node}'s actions are held by " in b_log
    assert "adopted 1 runbook(s) of the last actor" in b_log


def _lapsed(cluster: Cluster, node: str) -> bool:
    try:
        api = client.CoordinationV1Api(cluster.api)
        lease = api.read_namespaced_lease(lease_name(node), "default")
    except client.ApiException as exc:
        return bool(exc.status == 404)
    renewed = given(given(lease.spec).renew_time)
    assert isinstance(renewed, dt.datetime)
    return dt.datetime.now(dt.UTC) > renewed + dt.timedelta(seconds=3 * LEASE_SECONDS)


def _sent(base: str, delivery: bytes, token: str) -> bool:
    return asyncio.run(post_delivery(f"{base}/webhook/alertmanager", delivery, token)) == 200


def test_a_delivery_whose_claimant_died_is_taken_over(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    # Agent x claims the delivery and dies with its eviction on the wire (the request lost);
    # its node does not come back. Alertmanager sends the alert again, to agent y.
    ns, target = cluster.namespace("claimant-died"), cluster.node()
    names = low_priority_pods(cluster, ns, target, 3)
    (tmp_path / "rules.yaml").write_text(ALERT_RULES)
    token = "t" * 40
    (tmp_path / "token").write_text(token)
    x, y = cluster.node(name=f"x-{ns}"), cluster.node(name=f"y-{ns}")

    def args(name: str, node: str, kubeconfig: Path) -> list[str]:
        return [
            *actor_args(
                tmp_path, name, node=node, kubeconfig=kubeconfig, rules=tmp_path / "rules.yaml"
            ),
            f"--webhook.token-file={tmp_path / 'token'}",
        ]

    held = proxied.hold("POST", r"/pods/[^/]+/eviction")
    delivery = alert_delivery(target, "2026-11-30T10:00:00Z")
    with running_agent(
        args=args("agent-y", y, control_plane.kubeconfig_path), log_path=tmp_path / "y.log"
    ) as ay:
        with running_agent(
            args=args("agent-x", x, proxied.kubeconfig), log_path=tmp_path / "x.log"
        ) as ax:
            # 503 until x acts for its node (an agent that only observes takes no delivery).
            wait_until(
                "x to take the delivery", lambda: _sent(ax, delivery, token), timeout=30, step=0.05
            )
            held.wait_hit()
            kill_9(ax.pid)
        held.drop()  # x's eviction is lost with it
        wait_until("x's Lease to lapse", lambda: _lapsed(cluster, x), timeout=30, step=0.05)
        # y sees x's claim for the first time: alive until y has seen x's Lease unrenewed for
        # two leases on its own clock; Alertmanager's re-sent copies then take it over.
        wait_until(
            "y to take the delivery over",
            lambda: (
                _sent(ay, delivery, token)
                and metric_value(ay, "nodeguard_webhook_claims_total", outcome="taken_over") == 1
            ),
            timeout=60,
            step=0.05,
        )
        wait_until("y's eviction", lambda: evicted_pods(cluster, ns, names), timeout=30, step=0.05)
        (incident,) = wait_until("y's runbook", lambda: incidents(ay), timeout=30, step=0.05)
    assert len(evicted_pods(cluster, ns, names)) == 1
    assert incident["rule"] == "am-node-memory-low"
