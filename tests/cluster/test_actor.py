"""The per-node Lease (nodeguard/remediation/actor.py) against the test kube-apiserver, on a fake
monotonic clock: when an observer may take the node over (client-go leader election's rule:
a full ``leaseDurationSeconds`` of the same ``renewTime`` seen here), dry run against real,
the fence before a destructive write, and a claimant's liveness."""

from __future__ import annotations

import pytest

from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import Fenced
from nodeguard.remediation.actor import ClaimantWatch, claimant_alive, lease_name
from tests.support.actors import DURATION, Clock, make_actor
from tests.support.kube_helpers import Cluster, unique


async def test_an_observer_takes_over_only_after_a_full_lease_of_no_renewal(
    kube: KubeClient,
) -> None:
    node, ca, cb = unique("node"), Clock(), Clock()
    journal = {"inc-1": {"firing": {"rule": "r"}, "next": 0, "progress": {"0": {"inflight": 1}}}}
    a = make_actor(
        kube, node, "pod-a-1", ca, mirror=lambda: {"journal": journal, "evictions": [5.0]}
    )
    b = make_actor(kube, node, "pod-b-1", cb)
    assert await a.attempt() and a.is_actor()
    assert not await b.attempt() and b.state == "observer" and b.holder == "pod-a-1"
    cb.now += DURATION - 0.5  # a seems silent, but not for a whole lease yet
    assert not await b.attempt()
    cb.now += 0.5
    assert await b.attempt() and b.is_actor()
    lease = await kube.get_lease(name=lease_name(node), namespace="default")
    assert lease["spec"]["holderIdentity"] == "pod-b-1"
    assert lease["spec"]["leaseTransitions"] == 1
    # What a had written down came with the Lease.
    assert b.inherited is not None and b.inherited.lapsed and not b.inherited.same_state
    assert b.inherited.journal == journal and b.inherited.evictions == [5.0]
    # a's view is stale: its renew deadline (2/3 of the lease after its last write) passed, and
    # a fenced write is not sent.
    ca.now += DURATION
    assert not a.is_actor()
    with pytest.raises(Fenced):
        await a.fence()
    assert not await a.attempt() and a.state == "observer"


async def test_a_renewing_actor_is_never_taken_over(kube: KubeClient) -> None:
    node, ca, cb = unique("node"), Clock(), Clock()
    a, b = make_actor(kube, node, "pod-a-1", ca), make_actor(kube, node, "pod-b-1", cb)
    await a.attempt()
    for _ in range(6):  # both clocks run; a renews every third of the lease
        ca.now += DURATION / 3
        cb.now += DURATION / 3
        assert await a.attempt()
        assert not await b.attempt()
    assert a.transitions == 0


async def test_a_dry_run_never_takes_the_node_from_a_real_agent(kube: KubeClient) -> None:
    node, ca, cb = unique("node"), Clock(), Clock()
    real, dry = (
        make_actor(kube, node, "real-1", ca),
        make_actor(kube, node, "dry-1", cb, dry_run=True),
    )
    assert await real.attempt()
    assert not await dry.attempt()
    cb.now += 10 * DURATION  # lapsed, as far as the dry run can see: still not taken
    assert not await dry.attempt()
    assert not await dry.attempt() and dry.state == "observer"


async def test_a_real_agent_takes_the_node_from_a_live_dry_run_at_once(
    kube: KubeClient,
) -> None:
    node, ca, cb = unique("node"), Clock(), Clock()
    dry, real = (
        make_actor(kube, node, "dry-1", ca, dry_run=True),
        make_actor(kube, node, "real-1", cb),
    )
    assert await dry.attempt()
    assert await real.attempt()
    lease = await kube.get_lease(name=lease_name(node), namespace="default")
    assert lease["spec"]["holderIdentity"] == "real-1"
    assert lease["metadata"]["annotations"]["nodeguard.io/actor-dry-run"] == "false"


async def test_the_fence_stops_an_eviction_once_another_agent_wrote_the_lease(
    kube: KubeClient, cluster: Cluster
) -> None:
    ns, node = cluster.namespace("fence"), cluster.node()
    cluster.pod(namespace=ns, node=node, name="victim", request="1Gi")
    ca = Clock()
    a = make_actor(kube, node, "pod-a-1", ca)
    await a.attempt()
    # Someone else writes the Lease while a still believes it holds it (its deadline not
    # passed): a's conditional write gets 409, and the eviction is never sent.
    lease = await kube.get_lease(name=lease_name(node), namespace="default")
    lease["spec"]["holderIdentity"] = "pod-b-1"
    await kube.replace_lease(name=lease_name(node), namespace="default", body=lease)
    kube.fence = a.fence
    try:
        with pytest.raises(Fenced):
            await kube.evict_pod(name="victim", namespace=ns, dry_run=False)
    finally:
        kube.fence = None
    pod = cluster.pod_json(ns, "victim")
    assert pod is not None and not pod["metadata"].get("deletionTimestamp")


async def test_a_claimant_is_alive_while_it_holds_its_node(kube: KubeClient) -> None:
    node, ca, seen = unique("node"), Clock(), Clock()
    a = make_actor(kube, node, "pod-a-1", ca)
    await a.attempt()
    watch = ClaimantWatch(clock=seen)
    claimant = f"{node}/pod-a-1"
    assert await claimant_alive(kube=kube, namespace="default", claimant=claimant, watch=watch)
    # Its record seen unchanged for just under two leases on this agent's own clock: alive.
    seen.now += 2 * DURATION - 1
    assert await claimant_alive(kube=kube, namespace="default", claimant=claimant, watch=watch)
    # A renewal seen is a change: watched anew from now.
    ca.now += DURATION / 3
    assert await a.attempt()
    seen.now += 2
    assert await claimant_alive(kube=kube, namespace="default", claimant=claimant, watch=watch)
    # Not renewed for two leases, as this agent's clock says: dead.
    seen.now += 2 * DURATION
    assert not await claimant_alive(kube=kube, namespace="default", claimant=claimant, watch=watch)
    # Replaced (the Lease now names another process): dead, whatever the clocks say.
    assert not await claimant_alive(kube=kube, namespace="default", claimant=f"{node}/pod-a-0")
    # Its node has no Lease at all (deleted, another namespace): that proves nothing, alive;
    # an older agent's claim (a bare node name): alive.
    assert await claimant_alive(kube=kube, namespace="default", claimant="gone-node/pod-x")
    assert await claimant_alive(kube=kube, namespace="default", claimant=node)
