"""A gang checked against its PodDisruptionBudgets as a whole, and finished pods that are
neither targets nor blockers, against the real API server and its disruption controller
(kube-controller-manager writes every budget's status here, as in a cluster).

The right values come from kubernetes v1.35: the eviction handler
(pkg/registry/core/pod/storage/eviction.go: ``checkAndDecrement`` never writes a dry run's
decrement; ``canIgnorePDB``; "more than one PodDisruptionBudget"; unready pods under
``IfHealthyBudget``/``AlwaysAllow``; a stale budget's 429) and the disruption controller
(pkg/controller/disruption/disruption.go: ``disruptionsAllowed = currentHealthy -
desiredHealthy``, an integer ``minAvailable`` is ``desiredHealthy``)."""

from __future__ import annotations

from typing import Any

import pytest

from nodeguard.actions.budgets import check_budgets
from nodeguard.actions.evict import GANGS_ANNOTATION
from nodeguard.actions.katib import experiments_on_node
from nodeguard.actions.limits import EvictionBackoff
from nodeguard.actions.ranking import EvictFilter, EvictionPlan, plan_eviction
from nodeguard.kube.budgets import budget_of
from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import TooManyRequests
from nodeguard.kube.objects import pod_meta
from nodeguard.snapshot import PodMeta
from tests.support.acting import env_for, evict_plan, run_action
from tests.support.controlplane.cluster import TestCluster
from tests.support.kube_helpers import Cluster, annotations_of, given

GiB = 1024**3
PYTORCH = {"training.kubeflow.org/job-name": "job-1", "app": "train"}
TRIAL = {"katib.kubeflow.org/experiment": "e", "katib.kubeflow.org/trial": "e-t1", "app": "train"}
INDEX = "batch.kubernetes.io/job-completion-index"


def _alive(cluster: Cluster, ns: str, name: str) -> bool:
    pod = cluster.pod_json(ns, name)
    return pod is not None and not pod["metadata"].get("deletionTimestamp")


def _plan(pods: list[dict[str, Any]], usage: list[int]) -> EvictionPlan:
    metas = [pod_meta(p) for p in pods]
    return plan_eviction(
        pods={m.uid: m for m in metas},
        usage={m.uid: u for m, u in zip(metas, usage, strict=True)},
        flt=EvictFilter(),
    )


def _unready(cluster: Cluster, ns: str, name: str) -> None:
    """Running, but its readiness probe fails: the Ready condition False."""
    cluster.core.patch_namespaced_pod_status(
        name, ns, {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    )


def _verb(dry_run: bool) -> str:
    return "would not evict" if dry_run else "did not evict"


# -- 4. a gang against its budgets, whole --------------------------------------------------------
@pytest.mark.parametrize(
    ("labels", "key"),
    [(PYTORCH, "training-job/{ns}/job-1"), (TRIAL, "katib-trial/{ns}/e-t1")],
    ids=["pytorchjob", "katib-trial"],
)
async def test_a_gang_its_budget_affords_one_of_is_refused_whole_dry_and_real(
    cluster: Cluster, kube: KubeClient, labels: dict[str, str], key: str
) -> None:
    ns, node, other = cluster.namespace("gangbudget"), cluster.node(), cluster.node()
    master = cluster.pod(namespace=ns, node=node, name="master", request="1Gi", labels=labels)
    cluster.pod(namespace=ns, node=other, name="worker", request="1Gi", labels=labels)
    # minAvailable 1 over two healthy pods: the controller writes disruptionsAllowed 1.
    pdb = cluster.budget(ns, name="train", labels={"app": "train"}, min_available=1, healthy=2)
    assert pdb["status"]["disruptionsAllowed"] == 1
    plan = _plan([master], [4 * GiB])
    unit = key.format(ns=ns)
    for dry_run in (True, False):
        res = await evict_plan(kube, node, plan, dry_run=dry_run)
        assert res.outcome == "blocked", res.message
        assert f"{_verb(dry_run)} gang {unit}: budget {ns}/train allows 1 of 2" in res.message
        (blocked,) = res.details["blocked"]
        assert blocked["budget"] == f"{ns}/train" and blocked["partial"] == []
        assert res.details["evicted"] == [] and res.details["half_done"] == []
        (event,) = [e for e in res.events if e.reason == "NodeguardEvictionBlocked"]
        assert event.message.startswith(f"{_verb(dry_run)} gang {unit}: budget {ns}/train")
        assert _alive(cluster, ns, "master") and _alive(cluster, ns, "worker")
    assert GANGS_ANNOTATION not in annotations_of(cluster.core.read_node(node))


async def test_a_gang_its_budget_affords_is_evicted_whole(
    cluster: Cluster, kube: KubeClient
) -> None:
    # The look-alike: minAvailable 1 over three healthy pods allows 2, the gang needs 2.
    ns, node, other = cluster.namespace("gangfits"), cluster.node(), cluster.node()
    master = cluster.pod(namespace=ns, node=node, name="master", request="1Gi", labels=TRIAL)
    cluster.pod(namespace=ns, node=other, name="worker", request="1Gi", labels=TRIAL)
    cluster.pod(namespace=ns, node=other, name="spare", request="1Gi", labels={"app": "train"})
    cluster.budget(ns, name="train", labels={"app": "train"}, min_available=1, healthy=3)
    plan = _plan([master], [4 * GiB])
    dry = await evict_plan(kube, node, plan, dry_run=True)
    real = await evict_plan(kube, node, plan, dry_run=False)
    for res in (dry, real):
        assert res.outcome == "done", res.message
        assert sorted(res.details["evicted"][0]["pods"]) == [f"{ns}/master", f"{ns}/worker"]
    assert not _alive(cluster, ns, "master") and not _alive(cluster, ns, "worker")
    assert _alive(cluster, ns, "spare")


async def test_two_gangs_sharing_a_budget_dry_run_decides_as_the_real_run(
    cluster: Cluster, kube: KubeClient
) -> None:
    # minAvailable 2 over four healthy pods allows 2: the first gang takes both. A dry run
    # spends nothing on the server, so it must keep the count itself.
    ns, node, other = cluster.namespace("gangshare"), cluster.node(), cluster.node()
    here = []
    for gang in ("a", "b"):
        labels = {"katib.kubeflow.org/trial": f"t-{gang}", "app": "train"}
        here.append(
            cluster.pod(namespace=ns, node=node, name=f"{gang}-0", request="1Gi", labels=labels)
        )
        cluster.pod(namespace=ns, node=other, name=f"{gang}-1", request="1Gi", labels=labels)
    cluster.budget(ns, name="train", labels={"app": "train"}, min_available=2, healthy=4)
    plan = _plan(here, [8 * GiB, 4 * GiB])  # gang a first
    decided = []
    for dry_run in (True, False):
        res = await evict_plan(kube, node, plan, dry_run=dry_run, target=100 * GiB)
        assert res.outcome == "done", res.message
        assert [u["unit"] for u in res.details["evicted"]] == [f"katib-trial/{ns}/t-a"]
        (blocked,) = res.details["blocked"]
        assert blocked["unit"] == f"katib-trial/{ns}/t-b"
        assert blocked["reason"].startswith(f"budget {ns}/train allows 0 of 2")
        assert f"{_verb(dry_run)} gang katib-trial/{ns}/t-b: budget {ns}/train" in res.message
        decided.append((res.details["evicted"][0]["pods"], blocked["unit"], blocked["budget"]))
        if dry_run:
            assert "2 of its 2 spent earlier in this run" in blocked["reason"]
    assert decided[0] == decided[1]
    assert not _alive(cluster, ns, "a-0") and not _alive(cluster, ns, "a-1")
    assert _alive(cluster, ns, "b-0") and _alive(cluster, ns, "b-1")


async def test_lone_pods_against_their_budget(cluster: Cluster, kube: KubeClient) -> None:
    # One budget allowing 1 over two lone pods: one goes, the next is refused, dry and real;
    # a lone pod whose budget allows 0 is refused before any request.
    ns, node = cluster.namespace("lonebudget"), cluster.node()
    p1 = cluster.pod(namespace=ns, node=node, name="p1", request="1Gi", labels={"app": "web"})
    p2 = cluster.pod(namespace=ns, node=node, name="p2", request="1Gi", labels={"app": "web"})
    cluster.budget(ns, name="web", labels={"app": "web"}, min_available=1, healthy=2)
    plan = _plan([p1, p2], [8 * GiB, 4 * GiB])
    for dry_run in (True, False):
        res = await evict_plan(kube, node, plan, dry_run=dry_run, target=100 * GiB)
        assert [u["unit"] for u in res.details["evicted"]] == [f"pod/{ns}/p1"], res.message
        assert f"{_verb(dry_run)} pod/{ns}/p2: budget {ns}/web allows 0 of 1" in res.message
    assert not _alive(cluster, ns, "p1") and _alive(cluster, ns, "p2")
    again = await evict_plan(kube, node, _plan([p2], [4 * GiB]), dry_run=False)
    assert again.outcome == "blocked"
    assert again.details["blocked"][0]["reason"].startswith(f"budget {ns}/web allows 0 of 1")
    assert _alive(cluster, ns, "p2")


async def test_two_budgets_each_over_part_of_the_gang(cluster: Cluster, kube: KubeClient) -> None:
    # Budget "a" covers two members and allows 1; budget "b" covers the third and allows 1.
    # Each member alone passes a dry-run eviction; the gang needs 2 of "a".
    ns, node, other = cluster.namespace("gangparts"), cluster.node(), cluster.node()
    gang = {"training.kubeflow.org/job-name": "job-1"}
    m0 = cluster.pod(namespace=ns, node=node, name="m0", labels={**gang, "part": "a"})
    cluster.pod(namespace=ns, node=other, name="m1", labels={**gang, "part": "a"})
    cluster.pod(namespace=ns, node=other, name="m2", labels={**gang, "part": "b"})
    cluster.pod(namespace=ns, node=other, name="spare", labels={"part": "b"})
    cluster.budget(ns, name="a", labels={"part": "a"}, min_available=1, healthy=2)
    cluster.budget(ns, name="b", labels={"part": "b"}, min_available=1, healthy=2)
    plan = _plan([m0], [4 * GiB])
    for dry_run in (True, False):
        res = await evict_plan(kube, node, plan, dry_run=dry_run)
        assert res.outcome == "blocked", res.message
        assert f"{_verb(dry_run)} gang training-job/{ns}/job-1: budget {ns}/a allows 1 of 2" in (
            res.message
        )
    assert all(_alive(cluster, ns, n) for n in ("m0", "m1", "m2", "spare"))


async def test_a_member_under_two_budgets_refuses_the_gang_and_is_backed_off(
    cluster: Cluster, kube: KubeClient
) -> None:
    # The API answers 500 "more than one PodDisruptionBudget" for such a pod, for good.
    ns, node, other = cluster.namespace("gangtwice"), cluster.node(), cluster.node()
    m0 = cluster.pod(namespace=ns, node=node, name="m0", labels=TRIAL)
    cluster.pod(namespace=ns, node=other, name="m1", labels={**TRIAL, "x": "1"})
    cluster.budget(ns, name="train", labels={"app": "train"}, min_available=0, healthy=2)
    cluster.budget(ns, name="x", labels={"x": "1"}, min_available=0, healthy=1)
    plan = _plan([m0], [4 * GiB])
    backoff = EvictionBackoff()
    for attempt in range(2):
        res = await evict_plan(kube, node, plan, backoff=backoff)
        (blocked,) = res.details["blocked"]
        if attempt == 0:
            assert blocked["reason"].startswith(
                f"budgets {ns}/train and {ns}/x both select {ns}/m1: the eviction API refuses "
                "a pod under more than one PodDisruptionBudget (500)"
            )
        else:  # no retry storm: within the backoff nothing is asked
            assert blocked["in_backoff"] is True
    assert _alive(cluster, ns, "m0") and _alive(cluster, ns, "m1")


async def test_a_stale_budget_refuses_as_the_api_does(
    cluster: Cluster, control_plane: TestCluster, kube: KubeClient
) -> None:
    ns, node, other = cluster.namespace("gangstale"), cluster.node(), cluster.node()
    m0 = cluster.pod(namespace=ns, node=node, name="m0", labels=TRIAL)
    cluster.pod(namespace=ns, node=other, name="m1", labels=TRIAL)
    cluster.budget(ns, name="train", labels={"app": "train"}, min_available=0, healthy=2)
    plan = _plan([m0], [4 * GiB])
    with control_plane.controllers_frozen():
        # The spec changes while the controller is down: generation 2, status still of 1,
        # which says 2 disruptions allowed.
        cluster.policy.patch_namespaced_pod_disruption_budget(
            "train", ns, {"spec": {"minAvailable": 1}}
        )
        pdb = cluster.policy.read_namespaced_pod_disruption_budget("train", ns)
        assert (given(pdb.metadata).generation, given(pdb.status).observed_generation) == (2, 1)
        assert given(pdb.status).disruptions_allowed == 2
        for dry_run in (True, False):
            res = await evict_plan(kube, node, plan, dry_run=dry_run)
            assert res.outcome == "blocked", res.message
            (blocked,) = res.details["blocked"]
            assert blocked["reason"].startswith(
                f"budget {ns}/train allows 0 of 2: its status is stale (observedGeneration 1 "
                "< generation 2)"
            )
            assert blocked["retry_in_seconds"] == 10  # the API's Retry-After for it
        # The API agrees: a member alone is refused with its 429 "still being processed".
        with pytest.raises(TooManyRequests) as refused:
            await kube.evict_pod(name="m1", namespace=ns, dry_run=True)
        assert refused.value.disruption_budget and refused.value.retry_after == 10
    assert _alive(cluster, ns, "m0") and _alive(cluster, ns, "m1")


@pytest.mark.parametrize(
    ("policy", "evicted"),
    [(None, False), ("AlwaysAllow", True)],
    ids=["IfHealthyBudget", "AlwaysAllow"],
)
async def test_an_unready_member_counts_as_the_unhealthy_pod_eviction_policy_says(
    cluster: Cluster, kube: KubeClient, policy: str | None, evicted: bool
) -> None:
    # The budget covers the gang's unready worker and one healthy pod, minAvailable 2: one
    # healthy of two desired, 0 allowed. Under IfHealthyBudget (the default) the unready pod
    # needs a disruption (currentHealthy < desiredHealthy); under AlwaysAllow it needs none.
    ns, node, other = cluster.namespace("gangunready"), cluster.node(), cluster.node()
    gang = {"katib.kubeflow.org/trial": "t1"}
    m0 = cluster.pod(namespace=ns, node=node, name="m0", labels=gang)
    cluster.pod(namespace=ns, node=other, name="m1", labels={**gang, "app": "train"})
    _unready(cluster, ns, "m1")
    cluster.pod(namespace=ns, node=other, name="spare", labels={"app": "train"})
    cluster.budget(
        ns, name="train", labels={"app": "train"}, min_available=2, healthy=1, policy=policy
    )
    plan = _plan([m0], [4 * GiB])
    for dry_run in (True, False):
        res = await evict_plan(kube, node, plan, dry_run=dry_run)
        if evicted:
            assert res.outcome == "done", res.message
        else:
            assert res.outcome == "blocked", res.message
            assert f"budget {ns}/train allows 0 of 1: it needs 2 healthy pods and has 1" in (
                res.message
            )
    assert _alive(cluster, ns, "m1") is not evicted and _alive(cluster, ns, "m0") is not evicted
    assert _alive(cluster, ns, "spare")


def _meta(
    name: str, *, phase: str = "Running", ready: bool = True, labels: dict[str, str] | None = None
) -> PodMeta:
    return pod_meta(
        {
            "metadata": {"name": name, "namespace": "ns", "uid": name, "labels": labels or {}},
            "spec": {"nodeName": "n"},
            "status": {
                "phase": phase,
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }
    )


def _pdb(selector: dict[str, Any] | None, *, allowed: int, current: int, desired: int) -> Any:
    spec: dict[str, Any] = {} if selector is None else {"selector": selector}
    return budget_of(
        {
            "metadata": {"name": "b", "namespace": "ns", "generation": 1},
            "spec": spec,
            "status": {
                "observedGeneration": 1,
                "disruptionsAllowed": allowed,
                "currentHealthy": current,
                "desiredHealthy": desired,
            },
        }
    )


def test_which_members_a_budget_counts() -> None:
    """The eviction handler's rules, member by member (pure)."""
    web = {"app": "web"}
    one = _pdb({"matchLabels": web}, allowed=1, current=3, desired=2)

    def needs(*members: PodMeta, budget: Any = one) -> dict[str, int]:
        return dict(check_budgets(members=members, budgets=[budget], spent={}).needs)

    assert needs(_meta("a", labels=web), _meta("b", labels=web)) == {"ns/b": 2}
    # canIgnorePDB: Pending, finished and terminating pods are evicted without the budget.
    assert needs(_meta("a", labels=web), _meta("p", phase="Pending", labels=web)) == {"ns/b": 1}
    assert needs(_meta("s", phase="Succeeded", labels=web)) == {}
    # Unready under IfHealthyBudget with currentHealthy >= desiredHealthy > 0: free.
    assert needs(_meta("u", ready=False, labels=web)) == {}
    short = _pdb({"matchLabels": web}, allowed=0, current=1, desired=2)
    assert needs(_meta("u", ready=False, labels=web), budget=short) == {"ns/b": 1}
    # Selectors as LabelSelectorAsSelector reads them: none matches nothing, {} everything.
    assert needs(_meta("a", labels=web), budget=_pdb(None, allowed=1, current=1, desired=0)) == {}
    assert needs(_meta("a"), budget=_pdb({}, allowed=1, current=1, desired=0)) == {"ns/b": 1}
    expr = {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "api"]}]}
    api = _meta("a", labels={"app": "api"})
    assert needs(api, budget=_pdb(expr, allowed=1, current=1, desired=0)) == {"ns/b": 1}
    bad = {"matchExpressions": [{"key": "app", "operator": "In", "values": []}]}
    assert needs(_meta("a", labels=web), budget=_pdb(bad, allowed=1, current=1, desired=0)) == {}
    notin = {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]}
    assert needs(_meta("a"), budget=_pdb(notin, allowed=1, current=1, desired=0)) == {"ns/b": 1}


# -- 5. finished pods: neither targets nor blockers ------------------------------------------------
async def test_an_indexed_job_with_finished_members_is_evicted_by_its_running_ones(
    cluster: Cluster, kube: KubeClient
) -> None:
    ns, node, other = cluster.namespace("indexed"), cluster.node(), cluster.node()

    def member(i: int, on: str) -> dict[str, Any]:
        return cluster.pod(
            namespace=ns,
            node=on,
            name=f"train-{i}",
            request="1Gi",
            owner=("Job", "train"),
            annotations={INDEX: str(i)},
        )

    for i, on in enumerate((node, node, other, other)):
        member(i, on)
    cluster.finish_pod(ns, "train-0")  # a completed index, here
    cluster.finish_pod(ns, "train-3", phase="Failed")  # one that failed, elsewhere
    done, running = cluster.pod_json(ns, "train-0") or {}, cluster.pod_json(ns, "train-1") or {}
    plan = _plan([done, running], [0, 4 * GiB])
    ((unit, _),) = plan.ranked
    assert unit.key == f"job/{ns}/train" and [p.name for p in unit.pods] == ["train-1"]
    assert [(e.pod.name, e.reason) for e in plan.excluded] == [
        ("train-0", "phase Succeeded: finished")
    ]
    res = await evict_plan(kube, node, plan, dry_run=False)
    assert res.outcome == "done", res.message
    assert sorted(res.details["evicted"][0]["pods"]) == [f"{ns}/train-1", f"{ns}/train-2"]
    # The finished ones are left as they are (an eviction would delete them, and their logs).
    assert _alive(cluster, ns, "train-0") and _alive(cluster, ns, "train-3")


def test_finished_pods_are_never_ranked() -> None:
    trial = {"katib.kubeflow.org/trial": "t1"}
    pods = [
        _meta("done", phase="Succeeded", ready=False),
        _meta("failed", phase="Failed", ready=False),
        _meta("trial-0", labels=trial),
        _meta("trial-1", phase="Succeeded", ready=False, labels=trial),
    ]
    plan = plan_eviction(
        pods={p.uid: p for p in pods}, usage={p.uid: GiB for p in pods}, flt=EvictFilter()
    )
    assert [(u.key, [p.name for p in u.pods]) for u, _ in plan.ranked] == [
        ("katib-trial/ns/t1", ["trial-0"])
    ]
    assert sorted(e.pod.name for e in plan.excluded) == ["done", "failed", "trial-1"]


async def test_a_retained_finished_trial_pod_holds_no_experiment(
    cluster: Cluster, kube: KubeClient
) -> None:
    ns, node = cluster.namespace("retained"), cluster.node()
    labels = {"katib.kubeflow.org/experiment": "done", "katib.kubeflow.org/trial": "done-1"}
    cluster.pod(namespace=ns, node=node, name="done-1-worker", labels=labels)
    cluster.finish_pod(ns, "done-1-worker")  # retain: true keeps it after the trial
    (res,) = await run_action(env=env_for(kube, node), node=node, action="pause_katib")
    assert res.outcome == "noop", res.message
    assert cluster.core.list_namespaced_resource_quota(ns).items == []
    # The look-alike: a running trial pod of another experiment is held, the finished is not.
    live = {"katib.kubeflow.org/experiment": "live", "katib.kubeflow.org/trial": "live-1"}
    running = cluster.pod(namespace=ns, node=node, name="live-1-worker", labels=live)
    finished = cluster.pod_json(ns, "done-1-worker") or {}
    metas = {m.uid: m for m in (pod_meta(running), pod_meta(finished))}
    assert experiments_on_node(metas) == [(ns, "live")]
