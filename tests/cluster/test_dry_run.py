"""The dry run is the real plan: the same scenario, dry then real on the same cluster state (the
dry run changes nothing), gives the same decisions: eviction limits, PodDisruptionBudget
refusals, backoffs and gangs; the cordon budget under its Lease. (The Katib pause: in
tests/cluster/test_katib.py.) The fault it guards against: with a limit of 1 and 3 units, the dry
run
said "would evict 3" where the real run evicted 1 and refused."""

from __future__ import annotations

import time
from typing import Any

from nodeguard.actions.base import ActionResult
from nodeguard.actions.cordon import LABEL, CordonConfig
from nodeguard.actions.limits import EvictionBackoff, EvictionLimiter
from nodeguard.kube.client import KubeClient
from tests.support.acting import env_for, run_action
from tests.support.kube_helpers import Cluster, cordoned, name_of, unique

GiB = 1 << 30


def _decisions(result: ActionResult) -> dict[str, Any]:
    """What a run decided, without the words that differ between dry and real."""
    d = result.details
    return {
        "outcome": result.outcome,
        "evicted": [(u["unit"], sorted(u["pods"])) for u in d["evicted"]],
        # A unit still in backoff says how long is left: that moves between the two runs.
        "blocked": [
            (b["unit"], b["pod"], "in backoff" if b["in_backoff"] else b["retry_in_seconds"])
            for b in d["blocked"]
        ],
        "skipped": [(s["unit"], s["reason"]) for s in d["skipped"]],
        "freed": d["freed_bytes"],
        "limit_used": d["limit_used"],
        "limit": "eviction limit reached" in result.message,
    }


def _alive(cluster: Cluster, ns: str, name: str) -> bool:
    pod = cluster.pod_json(ns, name)
    return pod is not None and not pod["metadata"].get("deletionTimestamp")


async def test_evict_dry_then_real_decides_the_same(cluster: Cluster, kube: KubeClient) -> None:
    ns, node, other = cluster.namespace("dry-evict"), cluster.node(), cluster.node()
    low = "nodeguard-test-low"

    def pod(name: str, *, on: str = node, **kw: Any) -> str:
        created = cluster.pod(
            namespace=ns, node=on, name=name, request="1Gi", priority_class=low, **kw
        )
        return str(created["metadata"]["uid"])

    usage = {
        pod("serving", labels={"app": "serving"}): 20 * GiB,  # a PDB allows no disruption
        pod("trial-a", labels={"katib.kubeflow.org/trial": "t1"}): 10 * GiB,  # a gang of two
        pod("in-backoff"): 9 * GiB,  # refused earlier: in backoff
        pod("batch-1"): 8 * GiB,
        pod("batch-2"): 7 * GiB,
        pod("batch-3"): 6 * GiB,
    }
    pod("trial-b", on=other, labels={"katib.kubeflow.org/trial": "t1"})  # the gang's other half
    # What the disruption controller would write: nothing may be disrupted.
    cluster.blocking_pdb(ns, name="serving", labels={"app": "serving"})
    now = time.time()
    env = env_for(
        kube,
        node,
        usage=usage,
        limiter=EvictionLimiter(max_units=3, window=600, store={node: [now - 60]}),
        backoff=EvictionBackoff(store={f"pod/{ns}/in-backoff": [1, now + 100]}),
    )
    args = {"free": "100Gi"}

    # As the agent's rules run it (source "local"): a refused unit is backed off, not retried.
    (dry,) = await run_action(
        env=env, node=node, action="evict", args=args, dry_run=True, source="local"
    )
    assert all(_alive(cluster, ns, n) for n in ("serving", "trial-a", "trial-b", "batch-1"))
    assert env.limiter.used(node) == 1  # the dry run spent a copy, not the real limit
    (real,) = await run_action(env=env, node=node, action="evict", args=args, source="local")

    assert _decisions(dry) == _decisions(real)

    # The Events say what happens next, and promise nothing else ("tried again" would not be
    # true: the unit is left alone until the backoff ends, and only tried when a rule fires).
    def blocked(result: ActionResult) -> str:
        return next(e.message for e in result.events if e.reason == "NodeguardEvictionBlocked")

    assert blocked(dry).endswith(
        "never by DELETE; a real run would leave it alone for 10s (backoff)"
    )
    assert blocked(real).endswith("never by DELETE; left alone for 10s (backoff)")
    decided = _decisions(real)
    # Two units left of the limit of 3 (one eviction a minute ago): the budget refuses the
    # first, the gang goes whole, the next is in backoff, one more, then the limit.
    assert decided["evicted"] == [
        (f"katib-trial/{ns}/t1", [f"{ns}/trial-a", f"{ns}/trial-b"]),
        (f"pod/{ns}/batch-1", [f"{ns}/batch-1"]),
    ]
    assert [b[0] for b in decided["blocked"]] == [f"pod/{ns}/serving", f"pod/{ns}/in-backoff"]
    assert decided["blocked"][0][2] == 10  # the first refusal's backoff, in both
    assert decided["limit"] and decided["limit_used"] == 3 and decided["outcome"] == "done"
    assert not _alive(cluster, ns, "trial-b") and not _alive(cluster, ns, "batch-1")
    assert _alive(cluster, ns, "batch-2") and _alive(cluster, ns, "serving")


async def test_cordon_budget_dry_then_real_decides_the_same(
    cluster: Cluster, kube: KubeClient
) -> None:
    lease = unique("budget")
    for n in cluster.core.list_node(label_selector=f"{LABEL}=true").items:
        cluster.core.patch_node(name_of(n), {"metadata": {"labels": {LABEL: None}}})
    first, second = cluster.node(), cluster.node()
    cfg = CordonConfig(budget_nodes=1, lease_name=lease, lease_namespace="default")
    for node, expected in ((first, "done"), (second, "refused")):
        env = env_for(kube, node, cordon=cfg)
        (dry,) = await run_action(env=env, node=node, action="cordon", dry_run=True)
        (real,) = await run_action(env=env, node=node, action="cordon")
        assert (dry.outcome, real.outcome) == (expected, expected), (dry.message, real.message)
        assert dry.details == real.details
    assert cordoned(cluster.core.read_node(first))
    assert not cordoned(cluster.core.read_node(second))
