"""The cordon budget under a cluster-wide incident, on the test kube-apiserver behind the
recording proxy: a burst of cordons lists every Node once (the count is on the budget Lease
for the next holders), a budget already spent is refused before the Lease is contended for
(no Lease write at all), and an agent waiting for the Lease gives up as soon as the holders
before it wrote that the budget is spent, instead of polling until its turn."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Any

from kubernetes import client

from nodeguard.actions.cordon import LABEL, CordonConfig, cordon
from nodeguard.actions.cordon_budget import ANN_CORDONED, ANN_NODES, ANN_NODES_AT
from nodeguard.kube.client import KubeClient
from tests.support.kube_helpers import Cluster, cordoned, given, name_of, unique


def _clear(cluster: Cluster) -> None:
    """Nodes other tests left cordoned by nodeguard would spend the budget."""
    for n in cluster.core.list_node(label_selector=f"{LABEL}=true").items:
        cluster.core.patch_node(
            name_of(n), {"metadata": {"labels": {LABEL: None}}, "spec": {"unschedulable": None}}
        )


def _full_lists(seen: list[tuple[str, str]]) -> int:
    """Lists of every Node (no label selector)."""
    return sum(
        1
        for m, p in seen
        if m == "GET" and p.split("?")[0] == "/api/v1/nodes" and "labelSelector" not in p
    )


def _lease_writes(seen: list[tuple[str, str]], name: str) -> int:
    return sum(1 for m, p in seen if m in ("PUT", "POST") and "/leases" in p and name in p)


async def _cordon(kube: KubeClient, node: str, cfg: CordonConfig) -> Any:
    return await cordon(
        kube=kube,
        node=node,
        rule="r",
        reason="incident",
        identity=f"{node}/a",
        dry_run=False,
        config=cfg,
    )


def _percent_for_one(cluster: Cluster) -> float:
    """A ``--cordon.budget-percent`` that allows one node of the cluster as it is (other tests
    share it and add Nodes)."""
    return 150.0 / len(cluster.core.list_node().items)


async def test_a_burst_counts_the_nodes_once_and_a_spent_budget_takes_no_lease(
    cluster: Cluster, proxied: Any
) -> None:
    _clear(cluster)
    nodes = [cluster.node() for _ in range(4)]
    lease = unique("budget")
    one = CordonConfig(
        budget_percent=_percent_for_one(cluster), lease_name=lease, lease_namespace="default"
    )
    kube = KubeClient.load(kubeconfig=proxied.kubeconfig)
    try:
        first = await _cordon(kube, nodes[0], one)
        assert first.outcome == "done", first.message
        writes = _lease_writes(proxied.seen, lease)
        # The burst after it: refused on the count the first holder left on the Lease,
        # before contending for it (no Lease write), and no list of every Node.
        for node in nodes[1:]:
            res = await _cordon(kube, node, one)
            assert res.outcome == "refused" and "budget spent, 1 of 1" in res.message
            assert not cordoned(cluster.core.read_node(node))
        assert _full_lists(proxied.seen) == 1
        assert _lease_writes(proxied.seen, lease) == writes
        notes = (
            given(
                given(
                    client.CoordinationV1Api(cluster.api).read_namespaced_lease(lease, "default")
                ).metadata
            ).annotations
            or {}
        )
        assert notes[ANN_CORDONED] == "1" and int(notes[ANN_NODES]) >= 4
    finally:
        kube.close()
        _clear(cluster)


async def test_a_hand_edited_node_count_never_cordons_past_the_budget(
    cluster: Cluster, control_plane: Any
) -> None:
    # The budget Lease says the cluster has a million Nodes (edited by hand, or counted
    # before a scale-down): 10 % of that would allow every cordon. The count only refuses;
    # each cordon is decided on the Nodes listed then, so one node of these three is cordoned.
    _clear(cluster)
    nodes = [cluster.node() for _ in range(3)]
    lease = unique("budget")
    client.CoordinationV1Api(cluster.api).create_namespaced_lease(
        "default",
        client.V1Lease.model_validate(
            {
                "metadata": {
                    "name": lease,
                    "annotations": {ANN_NODES: "1000000", ANN_NODES_AT: f"{time.time():.0f}"},
                },
                "spec": {"leaseDurationSeconds": 15},
            }
        ),
    )
    cfg = CordonConfig(
        budget_percent=_percent_for_one(cluster), lease_name=lease, lease_namespace="default"
    )
    kube = KubeClient.load(kubeconfig=control_plane.kubeconfig_path)
    try:
        results = [await _cordon(kube, n, cfg) for n in nodes]
    finally:
        kube.close()
        held = [n for n in nodes if cordoned(cluster.core.read_node(n))]
        _clear(cluster)
    assert [r.outcome for r in results] == ["done", "refused", "refused"], [
        r.message for r in results
    ]
    assert held == nodes[:1]


def _mark(cluster: Cluster, node: str) -> None:
    """nodeguard's cordon as another agent writes it."""
    cluster.core.patch_node(
        node, {"metadata": {"labels": {LABEL: "true"}}, "spec": {"unschedulable": True}}
    )


async def test_a_waiter_gives_up_when_the_holders_say_the_budget_is_spent(
    cluster: Cluster, control_plane: Any
) -> None:
    _clear(cluster)
    node, first, second, lease = cluster.node(), cluster.node(), cluster.node(), unique("budget")
    _mark(cluster, first)  # one of a budget of two: the check before the Lease lets it contend
    leases = client.CoordinationV1Api(cluster.api)
    now = dt_now()
    leases.create_namespaced_lease(
        "default",
        client.V1Lease.model_validate(
            {
                "metadata": {"name": lease},
                "spec": {
                    "holderIdentity": "other/agent",
                    "leaseDurationSeconds": 15,
                    "acquireTime": now,
                    "renewTime": now,
                },
            }
        ),
    )
    cfg = CordonConfig(budget_nodes=2, lease_name=lease, lease_namespace="default")
    kube = KubeClient.load(kubeconfig=control_plane.kubeconfig_path)
    try:
        waiting = asyncio.create_task(_cordon(kube, node, cfg))
        await asyncio.sleep(1.0)
        assert not waiting.done()  # waiting for the other agent's Lease
        # The holder cordons the second node and lets the Lease go with its notes... but
        # another agent takes it at once (renewed, still held): our agent must not wait on.
        _mark(cluster, second)
        held = leases.read_namespaced_lease(lease, "default")
        given(held.metadata).annotations = {
            ANN_CORDONED: "2",
            ANN_NODES: "100",
            ANN_NODES_AT: f"{time.time():.0f}",
        }
        given(held.spec).holder_identity = "third/agent"
        given(held.spec).renew_time = dt.datetime.now(dt.UTC)
        leases.replace_namespaced_lease(lease, "default", held)
        res = await asyncio.wait_for(waiting, timeout=20)
    finally:
        kube.close()
        _clear(cluster)
    # Not "still held by another agent" after the 30 s lock timeout: the notes' word, which
    # the label-selected list confirmed.
    assert res.outcome == "refused", res.message
    assert "budget spent, 2 of 2 node(s) already cordoned by nodeguard" in res.message
    assert not cordoned(cluster.core.read_node(node))


async def test_stale_notes_after_an_uncordon_do_not_refuse(
    cluster: Cluster, control_plane: Any
) -> None:
    # The notes say two of two, but both were uncordoned since (an SRE after the incident):
    # the label-selected list is the truth, so the agent waits for the Lease (held by an agent
    # that died: 2 s and never renewed) and cordons, instead of giving up on the notes.
    _clear(cluster)
    node, lease = cluster.node(), unique("budget")
    client.CoordinationV1Api(cluster.api).create_namespaced_lease(
        "default",
        client.V1Lease.model_validate(
            {
                "metadata": {
                    "name": lease,
                    "annotations": {ANN_CORDONED: "2"},
                },
                "spec": {
                    "holderIdentity": "dead/agent",
                    "leaseDurationSeconds": 2,
                    "renewTime": dt_now(),
                },
            }
        ),
    )
    cfg = CordonConfig(budget_nodes=2, lease_name=lease, lease_namespace="default")
    kube = KubeClient.load(kubeconfig=control_plane.kubeconfig_path)
    try:
        res = await _cordon(kube, node, cfg)
    finally:
        kube.close()
        _clear(cluster)
    assert res.outcome == "done", res.message


def dt_now() -> str:
    """Now as a Lease's MicroTime."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
