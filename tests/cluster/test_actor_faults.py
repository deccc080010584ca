"""Faults of one agent acting for a node (issue 22 point 3: nodeguard/remediation/actor.py),
against the test kube-apiserver and the fault-injecting proxy (tests/support/apiproxy.py), on a fake
monotonic clock as tests/cluster/test_actor.py does.

Each test is one fault found in review; its docstring says what happened before the fix and
what happens now, with the rule relied on (client-go ``tools/leaderelection/leaderelection.go``;
the module's own)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes import client

from nodeguard.alerts.claims import AlertClaims
from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import Fenced
from nodeguard.remediation.actor import ANN_STATE, claimant_alive, lease_name
from tests.support.actors import DURATION, NS, Clock, make_actor
from tests.support.controlplane.cluster import TestCluster
from tests.support.kube_helpers import Cluster, unique


@pytest.fixture
async def kube(control_plane: TestCluster) -> AsyncIterator[KubeClient]:
    k = KubeClient.load(kubeconfig=control_plane.kubeconfig_path)
    yield k
    k.close()


async def _renew_time(kube: KubeClient, node: str) -> str:
    lease = await kube.get_lease(name=lease_name(node), namespace=NS)
    return str(lease["spec"]["renewTime"])


# -- 1. double action: a fence whose answer comes back after the renew deadline ----------------
async def test_a_fence_answered_after_its_renew_deadline_does_not_let_the_write_go(
    kube: KubeClient, control_plane: TestCluster, proxied: Any
) -> None:
    """The fence's renewal reaches the API server, but its answer comes back late (a slow or
    congested API server, a SIGSTOPped or GC-paused agent that reads it on resuming). Meanwhile
    the observer saw that renewal stay unchanged for a whole lease and took the node over.

    Before, ``fence()`` returns as soon as the write succeeded, without looking at the clock: the
    eviction or Node patch goes out while the other agent holds the node (two actors). Should:
    a renewal answered after ``sent + duration * 2/3`` (this module's own renew deadline; in
    client-go the renew runs under a context of ``RenewDeadline`` and a late success is a
    failure: ``renew`` in ``leaderelection.go``) does not fence anything: :class:`Fenced`."""
    node, ca, cb = unique("node"), Clock(), Clock()
    ka = KubeClient.load(kubeconfig=proxied.kubeconfig)
    try:
        a, b = make_actor(ka, node, "pod-a-1", ca), make_actor(kube, node, "pod-b-1", cb)
        assert await a.attempt() and a.is_actor()
        assert not await b.attempt() and b.state == "observer"
        before = await _renew_time(kube, node)
        held = proxied.hold("PUT", rf"/leases/{lease_name(node)}$", after=True)
        fence = asyncio.create_task(a.fence())
        await asyncio.to_thread(held.wait_hit)
        # A loop of its own, not wait_until_async: the condition is awaited (an API read).
        for _ in range(200):  # the renewal is done at the API server; only its answer waits
            if await _renew_time(kube, node) != before:
                break
            await asyncio.sleep(0.05)
        assert not await b.attempt()  # b sees the fence's renewal: a full lease from now
        cb.now += DURATION
        assert await b.attempt() and b.is_actor()  # no renewal since: b takes the node
        ca.now += DURATION  # a's monotonic clock ran on while it waited for the answer
        held.release()
        with pytest.raises(Fenced):
            await fence
    finally:
        proxied.clear()
        ka.close()


# -- 2. double action: a delivery of a live agent whose Lease a person deleted is taken over --
async def test_a_delivery_of_a_live_agent_whose_lease_was_deleted_is_not_taken_over(
    kube: KubeClient, cluster: Cluster
) -> None:
    """Agent a holds its node and has claimed a delivery (its runbook under way). A person
    deletes ``nodeguard-<node>`` (a cleanup of old Leases; or ``--actor.lease-namespace``
    changed in a rollout, so the new agents look for it elsewhere). a is alive: its next renew
    answers 409 and the one after creates the Lease again (``attempt``), and it goes on.

    Before, ``claimant_alive`` takes a missing Lease for a dead claimant: a copy of the alert
    that reaches agent y in that window is ``taken_over`` and acted on a second time. A
    missing Lease proves nothing about its holder (it is not removed with the agent, nor with
    the Node); dead is what this module defines for a taker: the same record seen unrenewed
    for a whole lease. Should: ``duplicate`` now (the claimant gets its lease time to show
    itself again)."""
    node, ca = unique("a"), Clock()
    a = make_actor(kube, node, "pod-a-1", ca)
    assert await a.attempt() and a.is_actor()
    target = cluster.node()
    key = "f00dbeef:1796032800000000:firing"
    mine = AlertClaims(kube=kube, claimant=f"{node}/pod-a-1")
    assert await mine.claim(node=target, key=key) == "claimed"
    client.CoordinationV1Api(cluster.api).delete_namespaced_lease(lease_name(node), NS)

    async def alive(who: str) -> bool:
        return await claimant_alive(kube=kube, namespace=NS, claimant=who)

    y = AlertClaims(kube=kube, claimant=f"{unique('y')}/pod-y-1", alive=alive)
    assert await y.claim(node=target, key=key) == "duplicate"
    ca.now += DURATION / 3
    await a.attempt()
    ca.now += DURATION / 3
    assert await a.attempt() and a.is_actor()  # a goes on acting on the delivery


# -- 3. double action: a live claimant on a node whose clock is behind is taken for dead -------
@pytest.fixture
def skewed_holder(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """Node x's agent holds x's Lease and renews it every 0.3 s, with a clock 10 minutes
    behind (``renewTime`` is the holder's clock, ``_micro_now``): ``(node, identity)``."""
    node, identity = unique("x"), "pod-x-1"
    api = client.CoordinationV1Api(cluster.api)

    def now() -> dt.datetime:
        return dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10)

    api.create_namespaced_lease(
        NS,
        client.V1Lease.model_validate(
            {
                "metadata": {"name": lease_name(node)},
                "spec": {
                    "holderIdentity": identity,
                    "leaseDurationSeconds": DURATION,
                    "acquireTime": now(),
                    "renewTime": now(),
                },
            },
        ),
    )
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(0.3):
            api.patch_namespaced_lease(lease_name(node), NS, {"spec": {"renewTime": now()}})

    t = threading.Thread(target=renew, daemon=True)
    t.start()
    try:
        yield node, identity
    finally:
        stop.set()
        t.join(timeout=10)


async def test_a_live_claimant_whose_clock_is_behind_keeps_its_delivery(
    kube: KubeClient, cluster: Cluster, skewed_holder: tuple[str, str]
) -> None:
    """Agent x (its node's clock 10 minutes behind; no NTP, a VM restored from a snapshot)
    claims a delivery and works on it, renewing its Lease every ``duration / 3``. Alertmanager
    re-sends the alert to agent y.

    Before, ``claimant_alive`` compares x's ``renewTime`` (x's clock) with y's clock, allowing
    ``2 * leaseDurationSeconds``: x is taken for dead and y takes the delivery over while x
    acts on it (two actions for one delivery). The module's own rule is "never by comparing
    another node's timestamps with this clock" (client-go: ``observedTime`` is the local time
    a *change* of the record was seen, ``leaderelection.go``): a Lease still renewed by its
    claimant is alive, whatever its timestamps say."""
    x, identity = skewed_holder
    claimant = f"{x}/{identity}"
    await asyncio.sleep(1.0)  # x renews meanwhile: its renewTime changes every 0.3 s
    target = cluster.node()
    key = "f00dfeed:1796032800000000:firing"
    assert await AlertClaims(kube=kube, claimant=claimant).claim(node=target, key=key) == "claimed"

    async def alive(who: str) -> bool:
        return await claimant_alive(kube=kube, namespace=NS, claimant=who)

    y = AlertClaims(kube=kube, claimant=f"{unique('y')}/pod-y-1", alive=alive)
    assert await y.claim(node=target, key=key) == "duplicate"


# -- 4. lost handover: the cap on the mirrored journal drops the runbook under way -------------
def _entry(i: int, *, inflight: bool) -> dict[str, Any]:
    # The shape of a journal entry (nodeguard/remediation/worker.py ``submit``): an alert's
    # firing with its labels and annotations, as a webhook flood queues them.
    return {
        "firing": {
            "rule": "am-node-memory-low",
            "source": "alert",
            "labels": {"alertname": "NodeguardNodeMemoryLow", "node": "n", "i": str(i)},
            "annotations": {"description": "d" * 2000},
        },
        "next": 0,
        "results": [],
        "progress": {"0": {"inflight": {"ns/batch-0": "uid-0"}}} if inflight else {},
        "created": 1000.0 + i,
        "attempts": 0,
    }


async def test_the_mirrored_journal_keeps_the_runbook_under_way_when_it_is_cut(
    kube: KubeClient,
) -> None:
    """Runbooks are journaled when queued (``Remediator.submit``), so the oldest entry is the
    one being worked on: here its eviction is on the wire (``progress``), and 63 queued
    deliveries (the default queue of 64) come after it, each ~2 KiB of alert annotations.

    Before, ``_mirrored`` cuts the journal to 96 KiB by dropping "the oldest runbooks" first, in
    insertion order: the one under way goes, silently, and the agent that takes over never
    finishes its eviction (it plans a fresh unit of its own: the on-the-wire eviction plus a
    second one). Should: the cut drops entries nothing has started (no ``progress``, a queued
    delivery Alertmanager re-sends anyway) before any runbook under way, and says it cut."""
    node, ca = unique("node"), Clock()
    journal = {f"inc-{i:03d}": _entry(i, inflight=i == 0) for i in range(64)}
    a = make_actor(kube, node, "pod-a-1", ca, mirror=lambda: {"journal": journal, "evictions": []})
    assert await a.attempt()
    lease = await kube.get_lease(name=lease_name(node), namespace=NS)
    mirrored = json.loads(lease["metadata"]["annotations"][ANN_STATE])["journal"]
    assert 0 < len(mirrored) < 64  # it was cut
    assert "inc-000" in mirrored


# -- 5. lost action: a real agent that takes the node from a live dry run waits a cooldown -----
async def test_a_real_agent_taking_the_node_from_a_dry_run_assumes_nothing_was_done(
    kube: KubeClient,
) -> None:
    """A dry-run agent holds the node (a trial DaemonSet, a debug copy); the real agent starts
    and takes the Lease at once, as designed. But the takeover is recorded as ``lapsed`` (the
    previous holder "was cut off, what it did is unknown"), so ``nodeguard.agent`` calls
    ``engine.assume_recent``: every rule waits a whole cooldown and has a firing counted
    against ``maxFirings`` — with ``maxFirings 1/1h`` the real agent does nothing for an hour.
    A dry-run holder sends no destructive write (``fence`` is skipped in dry run and its
    mirror keeps the last real agent's journal): nothing it did is unknown. Should: taking the
    Lease from a dry-run holder is not ``lapsed``."""
    node, cd, cr = unique("node"), Clock(), Clock()
    d = make_actor(kube, node, "pod-dry-1", cd, dry_run=True)
    r = make_actor(kube, node, "pod-real-1", cr)
    assert await d.attempt() and d.is_actor()
    assert await r.attempt() and r.is_actor()
    assert r.inherited is not None
    assert not r.inherited.lapsed
