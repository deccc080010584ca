"""Runbook actions against the real kube-apiserver (etcd-backed, RBAC on, no kubelet)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import pytest
from kubernetes import client

from nodeguard.actions import registry
from nodeguard.actions.audit import ActionMetrics, Auditor
from nodeguard.actions.base import ActionResult
from nodeguard.actions.cordon import LABEL, CordonConfig, cordon, uncordon
from nodeguard.actions.evict import GANGS_ANNOTATION as GANGS
from nodeguard.actions.limits import EvictionBackoff, EvictionLimiter
from nodeguard.actions.ranking import EvictFilter, plan_eviction, usage_measure
from nodeguard.kube.client import KubeClient
from nodeguard.kube.objects import pod_meta
from tests.support.acting import env_for, evict_plan, run_action
from tests.support.controlplane.cluster import TestCluster
from tests.support.kube_helpers import (
    Cluster,
    annotations_of,
    cordoned,
    given,
    labels_of,
    name_of,
    taints_of,
    unique,
)

GiB = 1 << 30


def auditor_for(kube: KubeClient, node: str) -> Auditor:
    return Auditor(kube=kube, node_name=node, metrics=ActionMetrics(registry=None))


async def audited(kube: KubeClient, node: str, result: ActionResult) -> ActionResult:
    """Audit a result as dispatch() does (its Events written), and return it."""
    await auditor_for(kube, node).record(
        result=result, default_reason=registry.get(result.action).reasons[result.outcome]
    )
    return result


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- cordon ------------------------------------------------------------------------------------
async def test_cordon_uncordon_round_trip(cluster: Cluster, kube: KubeClient) -> None:
    node = cluster.node()
    res = await cordon(
        kube=kube,
        node=node,
        rule="node-memory-low",
        reason="MemAvailable 3% < 5% for 60s",
        identity=node,
        dry_run=False,
    )
    await audited(kube, node, res)
    assert res.outcome == "done", res.message
    n = cluster.core.read_node(node)
    assert cordoned(n)
    assert labels_of(n)[LABEL] == "true"
    assert annotations_of(n)["nodeguard.io/cordon-rule"] == "node-memory-low"
    assert "MemAvailable 3%" in annotations_of(n)["nodeguard.io/cordon-reason"]
    assert cluster.events("default", name=node, reason="NodeguardCordoned")

    again = await cordon(kube=kube, node=node, rule="r", reason="x", identity=node, dry_run=False)
    assert again.outcome == "noop"

    res = await uncordon(kube=kube, node=node, rule="node-memory-low", dry_run=False)
    assert res.outcome == "done", res.message
    n = cluster.core.read_node(node)
    assert not cordoned(n)
    assert LABEL not in labels_of(n)
    assert not any(k.startswith("nodeguard.io/") for k in annotations_of(n))


async def test_only_uncordons_what_it_cordoned(cluster: Cluster, kube: KubeClient) -> None:
    node = cluster.node()
    cluster.core.patch_node(node, {"spec": {"unschedulable": True}})  # an operator's cordon
    res = await cordon(kube=kube, node=node, rule="r", reason="x", identity=node, dry_run=False)
    assert res.outcome == "noop" and "someone else" in res.message
    res = await uncordon(kube=kube, node=node, rule="r", dry_run=False)
    assert res.outcome == "noop"
    assert cordoned(cluster.core.read_node(node))


async def test_taint_mode(cluster: Cluster, kube: KubeClient) -> None:
    node = cluster.node()
    cfg = CordonConfig(mode="taint")
    assert (
        await cordon(
            kube=kube,
            node=node,
            rule="r",
            reason="x",
            identity=node,
            dry_run=False,
            config=cfg,
        )
    ).outcome == "done"
    # The API server's TaintNodesByCondition adds not-ready to a node without a kubelet.
    taints = {(t.key, t.effect) for t in taints_of(cluster.core.read_node(node))}
    assert ("nodeguard.io/memory-pressure", "NoSchedule") in taints
    assert (
        await uncordon(kube=kube, node=node, rule="r", dry_run=False, config=cfg)
    ).outcome == "done"
    after = {(t.key, t.effect) for t in taints_of(cluster.core.read_node(node))}
    assert after == taints - {("nodeguard.io/memory-pressure", "NoSchedule")}


async def test_budget_of_one_two_agents_race(cluster: Cluster, control_plane: TestCluster) -> None:
    a, b = cluster.node(), cluster.node()
    cfg = CordonConfig(budget_nodes=1, lease_name=unique("budget"), lease_namespace="default")
    # Two agents: separate clients, identities and auditors, started together.
    ka = KubeClient.load(kubeconfig=control_plane.kubeconfig_path)
    kb = KubeClient.load(kubeconfig=control_plane.kubeconfig_path)
    # Nodes that other tests left cordoned would spend the budget: clear nodeguard's label.
    for n in cluster.core.list_node(label_selector=f"{LABEL}=true").items:
        cluster.core.patch_node(name_of(n), {"metadata": {"labels": {LABEL: None}}})
    try:
        results = await asyncio.gather(
            cordon(
                kube=ka,
                node=a,
                rule="r",
                reason="race",
                identity=a,
                dry_run=False,
                config=cfg,
            ),
            cordon(
                kube=kb,
                node=b,
                rule="r",
                reason="race",
                identity=b,
                dry_run=False,
                config=cfg,
            ),
        )
    finally:
        ka.close()
        kb.close()
    outcomes = sorted(r.outcome for r in results)
    assert outcomes == ["done", "refused"], [r.message for r in results]
    held = [n for n in (a, b) if cordoned(cluster.core.read_node(n))]
    assert len(held) == 1
    refused = next(r for r in results if r.outcome == "refused")
    assert "budget spent, 1 of 1" in refused.message


# -- eviction ----------------------------------------------------------------------------------
def realistic_node(cluster: Cluster) -> tuple[str, str, dict[str, dict[str, Any]]]:
    """A GPU node's pods: system-critical, DaemonSet, static, Guaranteed, Burstable at several
    priorities, BestEffort, and a two-pod Katib trial."""
    ns, node = cluster.namespace("evict"), cluster.node()
    p = {
        "critical": cluster.pod(
            namespace=ns,
            node=node,
            name="critical",
            request="1Gi",
            priority_class="system-node-critical",
        ),
        "daemonset": cluster.pod(
            namespace=ns,
            node=node,
            name="exporter",
            request="100Mi",
            owner=("DaemonSet", "exporter"),
        ),
        "static": cluster.pod(
            namespace=ns,
            node=node,
            name=f"etcd-{node}",
            request="1Gi",
            annotations={
                "kubernetes.io/config.mirror": "abc",
                "kubernetes.io/config.source": "file",
            },
        ),
        "guaranteed": cluster.pod(
            namespace=ns,
            node=node,
            name="trainer",
            request="16Gi",
            limit="16Gi",
            priority_class="nodeguard-test-high",
        ),
        "burst-low": cluster.pod(
            namespace=ns,
            node=node,
            name="pandas-prep",
            request="4Gi",
            priority_class="nodeguard-test-low",
        ),
        "burst-mid": cluster.pod(
            namespace=ns,
            node=node,
            name="notebook",
            request="8Gi",
            priority_class="nodeguard-test-mid",
        ),
        "besteffort": cluster.pod(namespace=ns, node=node, name="debug-shell"),
        "trial-a": cluster.pod(
            namespace=ns,
            node=node,
            name="trial-1-master",
            request="2Gi",
            priority_class="nodeguard-test-low",
            labels={
                "katib.kubeflow.org/experiment": "random",
                "katib.kubeflow.org/trial": "random-trial-1",
            },
        ),
        "trial-b": cluster.pod(
            namespace=ns,
            node=node,
            name="trial-1-worker",
            request="2Gi",
            priority_class="nodeguard-test-low",
            labels={
                "katib.kubeflow.org/experiment": "random",
                "katib.kubeflow.org/trial": "random-trial-1",
            },
        ),
    }
    return ns, node, p


def usage_of(p: dict[str, dict[str, Any]]) -> dict[str, int]:
    uid = {k: v["metadata"]["uid"] for k, v in p.items()}
    return {
        uid["guaranteed"]: 15 * GiB,  # within its request
        uid["burst-low"]: 40 * GiB,  # 36 GiB over its request, low priority
        uid["burst-mid"]: 10 * GiB,  # 2 GiB over, mid priority
        uid["besteffort"]: 1 * GiB,  # 1 GiB over a request of 0, priority 0
        uid["trial-a"]: 3 * GiB,  # the trial: 6 GiB over 4 GiB together
        uid["trial-b"]: 3 * GiB,
        uid["critical"]: 2 * GiB,
        uid["daemonset"]: 1 * GiB,
        uid["static"]: 3 * GiB,
    }


def test_eviction_ranking_on_a_realistic_node(cluster: Cluster) -> None:
    _, _, p = realistic_node(cluster)
    metas = {m.uid: m for m in (pod_meta(v) for v in p.values())}
    plan = plan_eviction(pods=metas, usage=usage_of(p), flt=EvictFilter())
    order = [(u.kind, tuple(sorted(x.name for x in u.pods))) for u, _ in plan.ranked]
    # Over request first; then lower priority; then larger excess. Guaranteed last.
    assert order == [
        ("pod", ("debug-shell",)),  # priority 0, 1 GiB over
        ("pod", ("pandas-prep",)),  # priority 100, 36 GiB over
        ("katib-trial", ("trial-1-master", "trial-1-worker")),  # priority 100, 2 GiB over
        ("pod", ("notebook",)),  # priority 1000
        ("pod", ("trainer",)),  # within its request
    ]
    excluded = {e.pod.name: e.reason for e in plan.excluded}
    assert set(excluded) == {"critical", "exporter", p["static"]["metadata"]["name"]}
    assert "system-critical" in excluded["critical"]
    assert "DaemonSet" in excluded["exporter"]
    assert "static pod" in excluded[p["static"]["metadata"]["name"]]
    assert "evicted together" in plan.ranked[2][1]
    # The reasons name what is counted: what eviction frees, unreclaimable memory from the
    # snapshot; the working set where memory.stat lacks its lines; both where they mix.
    assert plan.ranked[1][1] == "unreclaimable memory 36.0 GiB above its request; priority 100"
    assert usage_measure(unreclaimable=3, working_set=0) == "unreclaimable memory"
    assert usage_measure(unreclaimable=0, working_set=3) == "working set"
    assert usage_measure(unreclaimable=2, working_set=1) == "unreclaimable memory or working set"
    ws = plan_eviction(pods=metas, usage=usage_of(p), flt=EvictFilter(), measure="working set")
    assert ws.ranked[1][1] == "working set 36.0 GiB above its request; priority 100"
    assert metas[p["guaranteed"]["metadata"]["uid"]].qos_class == "guaranteed"
    assert metas[p["besteffort"]["metadata"]["uid"]].qos_class == "besteffort"

    low = plan_eviction(pods=metas, usage=usage_of(p), flt=EvictFilter(max_priority=100))
    assert [u.pods[0].name for u, _ in low.ranked] == [
        "debug-shell",
        "pandas-prep",
        "trial-1-master",
    ]
    assert "above the maximum 100" in {e.pod.name: e.reason for e in low.excluded}["notebook"]


async def test_evict_until_target_freed_and_dry_run_is_the_same_plan(
    cluster: Cluster, kube: KubeClient
) -> None:
    ns, node, p = realistic_node(cluster)
    metas = {m.uid: m for m in (pod_meta(v) for v in p.values())}
    plan = plan_eviction(pods=metas, usage=usage_of(p), flt=EvictFilter(max_priority=100))
    before = {
        k: v["metadata"]["resourceVersion"]
        for k, v in ((k, cluster.pod_json(ns, v["metadata"]["name"])) for k, v in p.items())
        if v
    }

    async def run(dry: bool) -> Any:
        res = await evict_plan(
            kube, node, plan, target=30 * GiB, dry_run=dry, rule="node-memory-low"
        )
        return await audited(kube, node, res)

    dry = await run(True)
    after_dry = {k: cluster.pod_json(ns, v["metadata"]["name"]) for k, v in p.items()}
    assert {k: v["metadata"]["resourceVersion"] for k, v in after_dry.items() if v} == before
    assert all(not v["metadata"].get("deletionTimestamp") for v in after_dry.values() if v)
    # A dry run changes nothing: its Events are Normal, or event exporters would page on them.
    [would] = cluster.events(ns, name="debug-shell", reason="NodeguardWouldEvict")
    assert would.type == "Normal"

    real = await run(False)
    assert real.outcome == dry.outcome == "done"
    [evicted] = cluster.events(ns, name="debug-shell", reason="NodeguardEvicted")
    assert evicted.type == "Warning"  # as the kubelet's own Evicted
    # 1 GiB (besteffort) + 40 GiB (pandas) >= 30 GiB: two units, then stop.
    assert [u["pods"] for u in real.details["evicted"]] == [
        [f"{ns}/debug-shell"],
        [f"{ns}/pandas-prep"],
    ]
    assert real.details["evicted"] == dry.details["evicted"]
    assert real.details["freed_bytes"] == 41 * GiB
    for name in ("debug-shell", "pandas-prep"):
        pod = cluster.pod_json(ns, name)
        assert pod is None or pod["metadata"].get("deletionTimestamp"), name
        assert cluster.events(ns, name=name, reason="NodeguardEvicted")
    for name in ("trial-1-master", "notebook", "trainer"):
        pod = cluster.pod_json(ns, name)
        assert pod is not None and not pod["metadata"].get("deletionTimestamp"), name


async def test_gang_is_evicted_together(cluster: Cluster, kube: KubeClient) -> None:
    ns, node = cluster.namespace("gang"), cluster.node()
    other = cluster.node()
    trial = {"katib.kubeflow.org/experiment": "e", "katib.kubeflow.org/trial": "e-t1"}
    here = cluster.pod(namespace=ns, node=node, name="t1-master", request="1Gi", labels=trial)
    cluster.pod(namespace=ns, node=other, name="t1-worker", request="1Gi", labels=trial)
    metas = {here["metadata"]["uid"]: pod_meta(here)}
    plan = plan_eviction(pods=metas, usage={here["metadata"]["uid"]: 2 * GiB}, flt=EvictFilter())
    res = await evict_plan(kube, node, plan, target=1)
    assert res.outcome == "done"
    assert sorted(res.details["evicted"][0]["pods"]) == [f"{ns}/t1-master", f"{ns}/t1-worker"]
    for name in ("t1-master", "t1-worker"):
        pod = cluster.pod_json(ns, name)
        assert pod is None or pod["metadata"].get("deletionTimestamp")


async def test_pdb_blocks_then_backs_off(cluster: Cluster, kube: KubeClient) -> None:
    ns, node = cluster.namespace("pdb"), cluster.node()
    pod = cluster.pod(
        namespace=ns, node=node, name="serving", request="1Gi", labels={"app": "serving"}
    )
    # What the disruption controller would write: nothing may be disrupted.
    cluster.blocking_pdb(ns, name="serving", labels={"app": "serving"})
    metas = {pod["metadata"]["uid"]: pod_meta(pod)}
    plan = plan_eviction(pods=metas, usage={pod["metadata"]["uid"]: 2 * GiB}, flt=EvictFilter())
    clock = FakeClock()
    backoff = EvictionBackoff(base=10, cap=40, clock=clock)
    limiter = EvictionLimiter(clock=clock)

    async def attempt() -> Any:
        res = await evict_plan(kube, node, plan, target=1 * GiB, limiter=limiter, backoff=backoff)
        return await audited(kube, node, res)

    first = await attempt()
    assert first.outcome == "blocked"
    assert first.details["blocked"][0]["retry_in_seconds"] == 10
    live = cluster.pod_json(ns, "serving")
    assert live is not None and not live["metadata"].get("deletionTimestamp")
    assert len(cluster.events(ns, name="serving", reason="NodeguardEvictionBlocked")) == 1

    # Within the backoff nothing is sent: no new Event, the pod untouched.
    clock.now += 5
    second = await attempt()
    assert second.outcome == "blocked"
    assert "backoff" in second.details["blocked"][0]["reason"]
    assert len(cluster.events(ns, name="serving", reason="NodeguardEvictionBlocked")) == 1

    # After it, one more try, refused again: the wait doubles, and stays capped.
    for expected in (20, 40, 40):
        clock.now += 100
        again = await attempt()
        assert again.outcome == "blocked"
        assert again.details["blocked"][0]["retry_in_seconds"] == expected
    assert len(cluster.events(ns, name="serving", reason="NodeguardEvictionBlocked")) == 4
    assert cluster.pod_json(ns, "serving") is not None


async def test_apiserver_stopped_mid_eviction(
    cluster: Cluster,
    kube: KubeClient,
    control_plane: TestCluster,
) -> None:
    ns, node = cluster.namespace("outage"), cluster.node()
    pods = [
        cluster.pod(namespace=ns, node=node, name=f"batch-{i}", request="1Gi") for i in range(2)
    ]
    usage = {p["metadata"]["uid"]: (3 - i) * GiB for i, p in enumerate(pods)}

    real_evict = kube.evict_pod

    async def evict_then_stop(**kw: Any) -> None:
        await real_evict(**kw)
        if not kw["dry_run"] and control_plane.apiserver_running:
            await asyncio.to_thread(control_plane.stop_apiserver)

    def plan_now() -> Any:
        items = [cluster.pod_json(ns, p["metadata"]["name"]) for p in pods]
        metas = {m.uid: m for m in (pod_meta(i) for i in items if i)}
        return plan_eviction(pods=metas, usage=usage, flt=EvictFilter())

    limiter, backoff = EvictionLimiter(), EvictionBackoff()
    kube.evict_pod = evict_then_stop
    try:
        res = await evict_plan(
            kube, node, plan_now(), target=10 * GiB, limiter=limiter, backoff=backoff
        )
        assert res.outcome == "failed" and res.retry
        assert "ServerError" in res.message and "unreachable" in res.message
        # What was evicted before the outage is in the result, and evented once it is back.
        assert [u["pods"] for u in res.details["evicted"]] == [[f"{ns}/batch-0"]]
    finally:
        kube.evict_pod = real_evict
        await asyncio.to_thread(control_plane.start_apiserver)
    await audited(kube, node, res)
    # The retry plans again from the API: batch-0 is terminating, so only batch-1 is evicted.
    retry = await evict_plan(
        kube, node, plan_now(), target=10 * GiB, limiter=limiter, backoff=backoff
    )
    await audited(kube, node, retry)
    assert retry.outcome == "done"
    assert [u["pods"] for u in retry.details["evicted"]] == [[f"{ns}/batch-1"]]
    assert len(cluster.events(ns, name="batch-0", reason="NodeguardEvicted")) == 1
    assert len(cluster.events(ns, name="batch-1", reason="NodeguardEvicted")) == 1


async def test_cordon_dry_run_changes_nothing(cluster: Cluster, kube: KubeClient) -> None:
    node = cluster.node()
    before = given(cluster.core.read_node(node).metadata).resource_version
    cfg = CordonConfig(budget_nodes=1000, lease_name=unique("budget"), lease_namespace="default")
    res = await cordon(
        kube=kube,
        node=node,
        rule="r",
        reason="x",
        identity=node,
        dry_run=True,
        config=cfg,
    )
    await audited(kube, node, res)
    assert res.outcome == "done" and res.dry_run
    assert res.message.startswith(f"would cordon {node}")
    assert given(cluster.core.read_node(node).metadata).resource_version == before
    [would] = cluster.events("default", name=node, reason="NodeguardWouldCordon")
    assert would.type == "Normal"
    assert not cluster.events("default", name=node, reason="NodeguardCordoned")
    # The budget's Lease was only read, never written.
    names = [
        name_of(item)
        for item in client.CoordinationV1Api(cluster.api).list_namespaced_lease("default").items
    ]
    assert cfg.lease_name not in names


def _lease(cluster: Cluster, name: str, holder: str, renew: dt.datetime) -> None:
    client.CoordinationV1Api(cluster.api).create_namespaced_lease(
        "default",
        client.V1Lease.model_validate(
            {
                "metadata": {"name": name},
                "spec": {
                    "holderIdentity": holder,
                    "leaseDurationSeconds": 2,
                    "acquireTime": renew,
                    "renewTime": renew,
                },
            }
        ),
    )


async def test_a_held_lease_is_judged_on_our_own_clock(cluster: Cluster, kube: KubeClient) -> None:
    # The holder's renewTime is years old (its clock is behind, or it died): only watching it
    # stay unchanged for leaseDurationSeconds (2 s) on this agent's clock lets us take it over.
    # The agent's clock here is a fake one that the Lease's own waits advance.
    node = cluster.node()
    name = unique("budget")
    _lease(cluster, name, "another-agent", dt.datetime(2020, 1, 1, 0, 0, 0, 1, tzinfo=dt.UTC))
    clock = FakeClock()

    async def sleep(seconds: float) -> None:
        clock.now += seconds

    async def attempt(lock_timeout: float) -> Any:
        return await cordon(
            kube=kube,
            node=node,
            rule="r",
            reason="x",
            identity="me",
            dry_run=False,
            config=CordonConfig(
                budget_nodes=100,
                lease_name=name,
                lease_namespace="default",
                lock_timeout=lock_timeout,
            ),
            clock=clock,
            sleep=sleep,
        )

    res = await attempt(1.0)
    assert res.outcome == "refused" and "still held" in res.message, res.message
    assert clock.now - 1000.0 == pytest.approx(
        1.0
    )  # gave up at its 1 s (a last try then), before the 2 s lease ran out
    started = clock.now
    res = await attempt(10.0)
    assert res.outcome == "done", res.message
    assert 2.0 <= clock.now - started < 4.0  # taken over once seen unchanged for 2 s


async def test_a_cordon_made_while_waiting_is_left_alone(
    cluster: Cluster, kube: KubeClient
) -> None:
    node = cluster.node()
    name = unique("budget")
    _lease(cluster, name, "another-agent", dt.datetime(2099, 1, 1, 0, 0, 0, 1, tzinfo=dt.UTC))
    cfg = CordonConfig(
        budget_nodes=100, lease_name=name, lease_namespace="default", lock_timeout=10.0
    )
    task = asyncio.create_task(
        cordon(
            kube=kube,
            node=node,
            rule="r",
            reason="x",
            identity="me",
            dry_run=False,
            config=cfg,
        )
    )
    await asyncio.sleep(0.5)
    cluster.core.patch_node(node, {"spec": {"unschedulable": True}})  # the operator
    res = await task
    assert res.outcome == "noop" and "someone else" in res.message
    assert LABEL not in labels_of(cluster.core.read_node(node))


async def test_stale_mark_and_recorded_mode(cluster: Cluster, kube: KubeClient) -> None:
    node = cluster.node()
    taint = CordonConfig(mode="taint")
    assert (
        await cordon(
            kube=kube,
            node=node,
            rule="r",
            reason="x",
            identity="me",
            dry_run=False,
            config=taint,
        )
    ).outcome == "done"
    # Uncordon with the default (unschedulable) settings still undoes the taint it made.
    assert (await uncordon(kube=kube, node=node, rule="r", dry_run=False)).outcome == "done"
    n = cluster.core.read_node(node)
    assert not any(t.key == "nodeguard.io/memory-pressure" for t in taints_of(n))
    assert LABEL not in labels_of(n)

    assert (
        await cordon(kube=kube, node=node, rule="r", reason="x", identity="me", dry_run=False)
    ).outcome == "done"
    cluster.core.patch_node(node, {"spec": {"unschedulable": None}})  # kubectl uncordon
    res = await cordon(kube=kube, node=node, rule="r", reason="again", identity="me", dry_run=False)
    assert res.outcome == "done"  # the stale mark did not make it a noop
    assert cordoned(cluster.core.read_node(node))
    cluster.core.patch_node(node, {"spec": {"unschedulable": None}})
    res = await uncordon(kube=kube, node=node, rule="r", dry_run=False)
    assert res.outcome == "noop" and "stale mark removed" in res.message
    assert LABEL not in labels_of(cluster.core.read_node(node))


def _alive(cluster: Cluster, ns: str, name: str) -> bool:
    pod = cluster.pod_json(ns, name)
    return pod is not None and not pod["metadata"].get("deletionTimestamp")


async def test_a_gang_is_never_half_evicted_and_two_budgets_skip_the_unit(
    cluster: Cluster, kube: KubeClient
) -> None:
    ns, node, other = cluster.namespace("gangpdb"), cluster.node(), cluster.node()
    # A Volcano PodGroup with a member on another node that a PDB protects.
    group = {"scheduling.k8s.io/group-name": "pg-1"}
    here = cluster.pod(namespace=ns, node=node, name="pg-1-here", request="1Gi", annotations=group)
    cluster.pod(
        namespace=ns,
        node=other,
        name="pg-1-there",
        request="1Gi",
        annotations=group,
        labels={"protect": "yes"},
    )
    cluster.blocking_pdb(ns, name="protect", labels={"protect": "yes"})
    # A pod covered by two budgets: the API refuses it with a 500, for good.
    twice = cluster.pod(
        namespace=ns, node=node, name="twice", request="1Gi", labels={"a": "1", "b": "1"}
    )
    for name, labels in (("pdb-a", {"a": "1"}), ("pdb-b", {"b": "1"})):
        cluster.policy.create_namespaced_pod_disruption_budget(
            ns,
            client.V1PodDisruptionBudget.model_validate(
                {
                    "metadata": {"name": name},
                    "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}},
                }
            ),
        )
    # A plain Job's pod: not a gang, evicted alone.
    batch = cluster.pod(
        namespace=ns, node=node, name="batch-0", request="1Gi", owner=("Job", "batch")
    )
    cluster.pod(namespace=ns, node=other, name="batch-1", request="1Gi", owner=("Job", "batch"))
    pods = [here, twice, batch]
    metas = {m.uid: m for m in (pod_meta(p) for p in pods)}
    usage = {
        here["metadata"]["uid"]: 9 * GiB,
        twice["metadata"]["uid"]: 8 * GiB,
        batch["metadata"]["uid"]: 2 * GiB,
    }
    plan = plan_eviction(pods=metas, usage=usage, flt=EvictFilter())
    assert [u.kind for u, _ in plan.ranked] == ["podgroup", "pod", "pod"]
    res = await evict_plan(kube, node, plan, target=1 * GiB)
    assert res.outcome == "done", res.details
    assert [u["pods"] for u in res.details["evicted"]] == [[f"{ns}/batch-0"]]
    reasons = {b["unit"]: b["reason"] for b in res.details["blocked"]}
    # Counted whole before any eviction: the member elsewhere needs a disruption it has not.
    assert reasons[f"podgroup/{ns}/pg-1"].startswith(f"budget {ns}/protect allows 0 of 1")
    assert "more than one PodDisruptionBudget" in reasons[f"pod/{ns}/twice"]
    assert _alive(cluster, ns, "pg-1-here") and _alive(cluster, ns, "pg-1-there")
    assert _alive(cluster, ns, "twice") and _alive(cluster, ns, "batch-1")
    assert not _alive(cluster, ns, "batch-0")


async def test_a_podgroup_is_evicted_across_nodes(cluster: Cluster, kube: KubeClient) -> None:
    ns, node, other = cluster.namespace("pg"), cluster.node(), cluster.node()
    group = {"scheduling.k8s.io/group-name": "pg-2"}
    here = cluster.pod(namespace=ns, node=node, name="pg-2-0", request="1Gi", annotations=group)
    cluster.pod(namespace=ns, node=other, name="pg-2-1", request="1Gi", annotations=group)
    cluster.pod(namespace=ns, node=other, name="bystander", request="1Gi")
    plan = plan_eviction(
        pods={here["metadata"]["uid"]: pod_meta(here)},
        usage={here["metadata"]["uid"]: 2 * GiB},
        flt=EvictFilter(),
    )
    res = await evict_plan(kube, node, plan)
    assert sorted(res.details["evicted"][0]["pods"]) == [f"{ns}/pg-2-0", f"{ns}/pg-2-1"]
    assert not _alive(cluster, ns, "pg-2-1") and _alive(cluster, ns, "bystander")


async def test_a_rules_undo_leaves_another_rules_cordon(cluster: Cluster, kube: KubeClient) -> None:
    node = cluster.node()
    assert (
        await cordon(
            kube=kube,
            node=node,
            rule="slab-unreclaimable-high",
            reason="leak",
            identity="me",
            dry_run=False,
        )
    ).outcome == "done"
    res = await uncordon(
        kube=kube,
        node=node,
        rule="node-memory-low",
        dry_run=False,
        only_rule="node-memory-low",
    )
    assert res.outcome == "noop" and "cordoned by rule slab-unreclaimable-high" in res.message
    assert cordoned(cluster.core.read_node(node))


async def test_a_gang_recorded_but_never_started_is_not_evicted_later(
    cluster: Cluster, kube: KubeClient
) -> None:
    # Found by a reviewer: the record is written before the first eviction; a run stopped at
    # that point and then abandoned left a record that, days later, made `act evict` evict the
    # whole gang, outside the namespace it was told. A record whose members all still run is
    # no decision: it is dropped. A half-evicted gang outside --namespace is left alone.
    ns, other_ns = cluster.namespace("stale-gang"), cluster.namespace("elsewhere")
    node, other = cluster.node(), cluster.node()
    trial = {"katib.kubeflow.org/trial": "t2"}
    # Priority 1000: above the default cap, so no plan of these runs may choose it.
    members = [
        cluster.pod(
            namespace=ns,
            node=n,
            name=f"t2-{i}",
            request="1Gi",
            labels=trial,
            priority_class="nodeguard-test-mid",
        )
        for i, n in enumerate((node, other))
    ]
    cluster.pod(namespace=other_ns, node=node, name="wanted", request="1Gi")
    cluster.pod(namespace=ns, node=node, name="bystander", request="1Gi")
    record = {
        f"katib-trial/{ns}/t2": {
            "members": [
                [ns, m["metadata"]["name"], m["metadata"]["uid"], m["spec"]["nodeName"]]
                for m in members
            ],
            "at": "2026-11-27T00:00:00Z",
            "by": node,
            "rule": "r",
        }
    }
    cluster.core.patch_node(node, {"metadata": {"annotations": {GANGS: json.dumps(record)}}})
    env = env_for(kube, node, usage={})
    (res,) = await run_action(
        env=env, node=node, action="evict", args={"free": "0", "namespaces": [other_ns]}
    )
    assert [u["pods"] for u in res.details["evicted"]] == [[f"{other_ns}/wanted"]]
    assert _alive(cluster, ns, "t2-0") and _alive(cluster, ns, "t2-1")
    # Outside --namespace: the record is left for a run that may touch it.
    assert GANGS in annotations_of(cluster.core.read_node(node))
    (res,) = await run_action(env=env, node=node, action="evict", args={"free": "0"})
    assert [u["pods"] for u in res.details["evicted"]] == [[f"{ns}/bystander"]]
    assert _alive(cluster, ns, "t2-0") and _alive(cluster, ns, "t2-1")  # never started: dropped
    assert GANGS not in annotations_of(cluster.core.read_node(node))


async def test_a_gangs_members_on_other_nodes_pass_the_same_filter(
    cluster: Cluster, kube: KubeClient
) -> None:
    # Found by a reviewer: the default priority cap (999) was applied to this node's member of
    # a trial only; its member at priority 100000 on another node was evicted with it.
    ns, node, other = cluster.namespace("gang-cap"), cluster.node(), cluster.node()
    trial = {"katib.kubeflow.org/trial": "t1"}
    cluster.pod(
        namespace=ns,
        node=node,
        name="low",
        request="1Gi",
        labels=trial,
        priority_class="nodeguard-test-low",
    )
    cluster.pod(
        namespace=ns,
        node=other,
        name="high",
        request="1Gi",
        labels=trial,
        priority_class="nodeguard-test-high",
    )
    (res,) = await run_action(
        env=env_for(kube, node), node=node, action="evict", args={"free": "0"}
    )
    assert res.details["evicted"] == []
    (skip,) = res.details["skipped"]
    assert skip["pod"] == f"{ns}/high" and "above the maximum 999" in skip["reason"]
    assert _alive(cluster, ns, "low") and _alive(cluster, ns, "high")
