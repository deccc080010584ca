"""Pausing Katib experiments against Katib's real Experiment controller (v0.19.0, built from Go
modules and run on the test control plane; tests/support/katib.py plays its suggestion service and
Trial controller). The pause must never delete or kill a trial, must stop new ones from
starting, and the resume must make Katib start the trials it is owed."""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path
from typing import Any

from kubernetes import client

from nodeguard.actions.katib import QUOTA_LABEL, census, quota_name
from nodeguard.kube.client import KubeClient
from tests.support.acting import env_for, run_action
from tests.support.agent import get, kill_9, running_agent, wait_until
from tests.support.controlplane.cluster import TestCluster
from tests.support.katib import (
    GROUP,
    VERSION,
    Katib,
    experiment,
    nodeguard_command,
    quota_refusals,
    started_trials,
)
from tests.support.kube_helpers import (
    Cluster,
    annotations_of,
    custom_json,
    given,
    labels_of,
    name_of,
)
from tests.support.remediation import agent_args, incidents, slab_rules


def _legacy_pause(cluster: Cluster, ns: str, name: str, *, original: str, by: str) -> None:
    """What nodeguard < 0.2 left on a paused experiment: parallelTrialCount lowered to 1, the
    original value (or "unset") and the pauser in annotations."""
    cluster.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        "experiments",
        name,
        {
            "metadata": {
                "annotations": {
                    "nodeguard.io/paused-parallel-trial-count": original,
                    "nodeguard.io/paused-at-parallel-trial-count": "1",
                    "nodeguard.io/paused-by": by,
                }
            },
            "spec": {"parallelTrialCount": 1},
        },
    )


def test_lowering_parallel_trial_count_makes_katib_delete_running_trials(
    katib: Katib, cluster: Cluster
) -> None:
    # Why nodeguard's pause never touches parallelTrialCount: Katib deletes active - parallel
    # of the newest trials at once (experiment_controller.go ReconcileTrials/deleteTrials).
    # This also shows the controller here really acts, so the tests below cannot pass by its
    # doing nothing.
    ns = cluster.namespace("katib-del")
    katib.experiment(ns, "exp", parallel=4, max_trials=20)
    before = started_trials(katib, ns, "exp", 4)
    cluster.custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, "experiments", "exp", {"spec": {"parallelTrialCount": 1}}
    )
    after = wait_until(
        "Katib to delete trials",
        lambda: len(katib.trials(ns, "exp")) == 1 and 1,
        timeout=30,
        detail=katib.log_tail,
    )
    assert after
    assert len(set(before) - set(katib.trials(ns, "exp"))) == 3


async def test_pause_deletes_no_trial_and_starts_none_then_resume_starts_them(
    katib: Katib, cluster: Cluster, kube: KubeClient
) -> None:
    ns, node = cluster.namespace("katib-pause"), cluster.node()
    katib.experiment(ns, "exp", parallel=4, max_trials=20)
    katib.experiment(ns, "neighbour", parallel=1, max_trials=5)
    trials = started_trials(katib, ns, "exp", 4)
    started_trials(katib, ns, "neighbour", 1)
    spec_before = experiment(cluster, ns, "exp")["spec"]
    env = env_for(kube, node)
    args = {"experiments": [f"{ns}/exp"]}

    # The dry run says exactly what the real run does, and changes nothing.
    (dry,) = await run_action(env=env, node=node, action="pause_katib", args=args, dry_run=True)
    assert dry.outcome == "done" and dry.message.startswith("would pause")
    assert sorted(dry.details["running_trials"]) == sorted(trials)
    assert dry.details["trials_katib_deletes"] == 0
    assert dry.details["trials_that_may_start"] == 0
    assert dry.details["namespace_experiments_held"] == ["neighbour"]
    assert "Katib deletes none" in dry.message and "also experiment(s) neighbour" in dry.message
    assert cluster.core.list_namespaced_resource_quota(ns).items == []
    assert cluster.events(ns, name="exp", reason="NodeguardWouldPauseKatib")

    (real,) = await run_action(env=env, node=node, action="pause_katib", args=args)
    assert real.outcome == "done", real.message
    # The same facts, but whether it is enforced: the dry run made no quota to wait for.
    assert dry.details["enforced"] is None and real.details["enforced"] is True
    assert real.details["trials_counted"] is True
    known = ("experiment", "enforced", "trials_counted")
    assert {k: v for k, v in real.details.items() if k not in known} == {
        k: v for k, v in dry.details.items() if k not in known
    }
    quota = cluster.core.read_namespaced_resource_quota(quota_name("exp"), ns)
    assert given(quota.spec).hard == {"count/trials.kubeflow.org": "0"}
    assert labels_of(quota)[QUOTA_LABEL] == "true"
    assert annotations_of(quota)["nodeguard.io/paused-by"] == f"{node}/manual"
    exp = experiment(cluster, ns, "exp")
    assert exp["spec"] == spec_before  # parallelTrialCount and maxTrialCount untouched
    assert exp["metadata"]["annotations"]["nodeguard.io/paused-by"] == f"{node}/manual"
    assert cluster.events(ns, name="exp", reason="NodeguardKatibPaused")

    # Two trials finish: Katib reconciles and wants two new ones; the quota refuses them.
    refused_before = quota_refusals(katib, ns)
    done = sorted(trials)[:2]
    for name in done:
        katib.finish(ns, name)
    wait_until(
        "Katib to try creating trials",
        lambda: quota_refusals(katib, ns) > refused_before,
        timeout=30,
        detail=katib.log_tail,
    )
    await asyncio.sleep(2)  # Katib does not requeue a refused create: nothing comes later
    now = katib.trials(ns, "exp")
    assert {n: t["metadata"]["uid"] for n, t in now.items()} == trials  # none deleted, none new
    assert katib.running(ns, "exp") == set(trials) - set(done)  # the others still run
    neighbour_trials = set(katib.trials(ns, "neighbour"))
    katib.finish(ns, next(iter(neighbour_trials)))  # the namespace is held: it starts none
    await asyncio.sleep(2)
    assert set(katib.trials(ns, "neighbour")) == neighbour_trials

    again = await run_action(env=env, node=node, action="pause_katib", args=args)
    assert [r.outcome for r in again] == ["noop"]

    # Resumed by another agent (another process, no memory of the pause): from the cluster.
    other = env_for(kube, "another-node")
    (resumed,) = await run_action(
        env=other, node=node, action="resume_katib", args={}, rule="cleanup"
    )
    assert resumed.outcome == "done", resumed.message
    assert resumed.details["trials_that_may_start"] == 2
    assert cluster.core.list_namespaced_resource_quota(ns).items == []
    annotations = experiment(cluster, ns, "exp")["metadata"]["annotations"]
    assert "nodeguard.io/paused-by" not in annotations and "nodeguard.io/resumed-at" in annotations
    wait_until(
        "Katib to start the owed trials",
        lambda: len(katib.running(ns, "exp")) == 4,
        timeout=30,
        detail=katib.log_tail,
    )
    assert set(trials) - set(done) <= katib.running(ns, "exp")


async def test_resume_of_an_experiment_with_no_running_trial_starts_new_ones(
    katib: Katib, cluster: Cluster, kube: KubeClient
) -> None:
    # With every trial finished while paused, only the resume's update of the Experiment makes
    # Katib reconcile: deleting the quota alone is not enough (it does not requeue).
    ns, node = cluster.namespace("katib-idle"), cluster.node()
    katib.experiment(ns, "exp", parallel=2, max_trials=10)
    trials = started_trials(katib, ns, "exp", 2)
    env = env_for(kube, node)
    args = {"experiments": [f"{ns}/exp"]}
    assert [
        r.outcome for r in await run_action(env=env, node=node, action="pause_katib", args=args)
    ] == ["done"]
    for name in trials:
        katib.finish(ns, name)
    wait_until(
        "Katib to see no running trial",
        lambda: not katib.running(ns, "exp"),
        timeout=30,
        detail=katib.log_tail,
    )
    # Katib asked its Suggestion for the trials the quota then refused: the stand-in suggestion
    # service answers that (a Suggestion's status change reconciles the Experiment). Its
    # answer must land before the quota goes, or that reconcile, not the resume's update,
    # would start the trials (in a full run the stand-in lists every test's Suggestions).
    wait_until(
        "the stand-in suggestion service to answer Katib's requests",
        lambda: _suggested(cluster, ns, "exp"),
        timeout=30,
        detail=katib.log_tail,
    )
    await asyncio.sleep(1)
    cluster.core.delete_namespaced_resource_quota(quota_name("exp"), ns)  # the quota alone
    await asyncio.sleep(3)
    assert set(katib.trials(ns, "exp")) == set(trials), "Katib reconciled without an update"
    (resumed,) = await run_action(env=env, node=node, action="resume_katib", args=args)
    assert resumed.outcome == "done", resumed.message
    wait_until(
        "two new trials",
        lambda: len(katib.running(ns, "exp")) == 2,
        timeout=30,
        detail=katib.log_tail,
    )


async def test_act_resume_finds_the_pause_without_trial_pods_on_the_node(
    katib: Katib, cluster: Cluster, kube: KubeClient, control_plane: TestCluster, tmp_path: Path
) -> None:
    # Paused by a rule on node-a; its trial pods are gone (evicted): `nodeguard act
    # resume-katib --node node-a` still finds it, from the quota's paused-by.
    ns, node = cluster.namespace("katib-act"), cluster.node()
    katib.experiment(ns, "exp", parallel=1, max_trials=5)
    started_trials(katib, ns, "exp", 1)
    env = env_for(kube, node)
    await run_action(
        env=env,
        node=node,
        action="pause_katib",
        args={"experiments": [f"{ns}/exp"]},
        rule="memory-pressure-katib",
        source="local",
    )
    proc = await asyncio.create_subprocess_exec(
        *nodeguard_command(),
        "act",
        "resume-katib",
        f"--node={node}",
        f"--kubeconfig={control_plane.kubeconfig_path}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out = " ".join((await proc.communicate())[0].decode().split())  # results wrap at 80
    assert proc.returncode == 0, out
    assert f"resumed Katib experiment {ns}/exp" in out
    assert cluster.core.list_namespaced_resource_quota(ns).items == []

    missing = await asyncio.create_subprocess_exec(
        *nodeguard_command(),
        "act",
        "pause-katib",
        f"--node={node}",
        f"--experiment={ns}/no-such-experiment",
        f"--kubeconfig={control_plane.kubeconfig_path}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    # A result wraps at 80 columns: its words are read joined.
    out = " ".join((await missing.communicate())[0].decode().split())
    assert missing.returncode == 4 and "not found" in out, out


async def test_a_rules_resume_leaves_what_others_paused_and_says_the_namespace_stays_held(
    katib: Katib, cluster: Cluster, kube: KubeClient
) -> None:
    ns, node = cluster.namespace("katib-two"), cluster.node()
    katib.experiment(ns, "a", parallel=1, max_trials=5)
    katib.experiment(ns, "b", parallel=1, max_trials=5)
    env = env_for(kube, node)
    for exp, rule in (("a", "rule-a"), ("b", "rule-b")):
        await run_action(
            env=env,
            node=node,
            action="pause_katib",
            args={"experiments": [f"{ns}/{exp}"]},
            rule=rule,
            source="local",
        )
    # rule-a's resolve: resumes only what rule-a paused.
    results = await run_action(
        env=env, node=node, action="resume_katib", rule="rule-a", source="local", kind="resolved"
    )
    assert [(r.details["experiment"], r.outcome) for r in results] == [(f"{ns}/a", "done")]
    assert "until the pause(s) of b" in results[0].message
    assert results[0].details["trials_that_may_start"] == 0
    names = {name_of(q) for q in cluster.core.list_namespaced_resource_quota(ns).items}
    assert names == {quota_name("b")}


async def test_a_pause_cut_short_is_completed_and_a_finished_experiment_is_left(
    katib: Katib, cluster: Cluster, kube: KubeClient
) -> None:
    # Killed between the quota and the experiment's mark: the next pause completes the mark
    # (and says so); resume works from either half.
    ns, node = cluster.namespace("katib-half"), cluster.node()
    katib.experiment(ns, "exp", parallel=1, max_trials=5)
    cluster.core.create_namespaced_resource_quota(
        ns,
        client.V1ResourceQuota.model_validate(
            {
                "metadata": {
                    "name": quota_name("exp"),
                    "labels": {QUOTA_LABEL: "true", "katib.kubeflow.org/experiment": "exp"},
                    "annotations": {"nodeguard.io/paused-by": f"{node}/r"},
                },
                "spec": {"hard": {"count/trials.kubeflow.org": "0"}},
            }
        ),
    )
    env = env_for(kube, node)
    (res,) = await run_action(
        env=env, node=node, action="pause_katib", args={"experiments": [f"{ns}/exp"]}, rule="r"
    )
    assert res.outcome == "done" and "mark on the experiment completed" in res.message
    annotations = experiment(cluster, ns, "exp")["metadata"]["annotations"]
    assert annotations["nodeguard.io/paused-by"] == f"{node}/r"
    cluster.custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        ns,
        "experiments",
        "exp",
        {"status": {"conditions": [{"type": "Succeeded", "status": "True"}]}},
    )
    ns2 = cluster.namespace("katib-done")
    katib.experiment(ns2, "exp", parallel=1, max_trials=5)
    cluster.custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        ns2,
        "experiments",
        "exp",
        {"status": {"conditions": [{"type": "Succeeded", "status": "True"}]}},
    )
    (done,) = await run_action(
        env=env, node=node, action="pause_katib", args={"experiments": [f"{ns2}/exp"]}
    )
    assert done.outcome == "noop" and "succeeded" in done.message
    assert cluster.core.list_namespaced_resource_quota(ns2).items == []


async def test_a_pause_made_by_nodeguard_before_0_2_is_still_resumed(
    katib: Katib, cluster: Cluster, kube: KubeClient
) -> None:
    # nodeguard < 0.2 lowered parallelTrialCount (3 -> 1) and kept the original in annotations.
    ns, node = cluster.namespace("katib-legacy"), cluster.node()
    katib.experiment(ns, "random", parallel=3, max_trials=10)
    _legacy_pause(cluster, ns, "random", original="3", by=f"{node}/memory-pressure-katib")
    env = env_for(kube, node)
    results = await run_action(env=env, node=node, action="resume_katib")
    assert [r.outcome for r in results] == ["done"], [r.message for r in results]
    exp = experiment(cluster, ns, "random")
    assert exp["spec"]["parallelTrialCount"] == 3
    assert not any(
        k.startswith("nodeguard.io/paused") for k in exp["metadata"].get("annotations", {})
    )


def test_census_counts_as_katib_does() -> None:
    # status_util.go updateTrialsSummary: killed, failed, succeeded, early-stopped, running,
    # metrics-unavailable, else pending; ReconcileTrials: active = pending + running.
    def trial(name: str, *true: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name},
            "status": {"conditions": [{"type": t, "status": "True"} for t in true]},
        }

    exp = {"spec": {"parallelTrialCount": 3, "maxTrialCount": 6}}
    c = census(
        exp,
        [
            trial("a", "Created", "Running"),
            trial("b", "Created"),
            trial("c", "Created", "Running", "Succeeded"),
            trial("d", "Created", "Failed"),
            trial("e", "Created", "MetricsUnavailable"),
        ],
    )
    assert (c.running, c.pending, c.completed, c.active) == (("a",), ("b",), 2, 2)
    # min(parallel 3, max 6 - completed 2) - active 2
    assert c.may_start() == 1 and c.deletes() == 0
    c2 = census({"spec": {"parallelTrialCount": 1}}, [trial(x, "Running") for x in "xyz"])
    assert c2.deletes() == 2 and c2.may_start() == 0


async def test_the_last_resume_in_a_namespace_restarts_every_experiment_it_held(
    katib: Katib, cluster: Cluster, kube: KubeClient
) -> None:
    # Found by a reviewer: a and b paused, every trial ended, a resumed while b still held the
    # namespace, then b: Katib reconciled only b, and a, no longer marked, stayed stopped for
    # good. A neighbour never paused but held by the quota must restart too.
    ns, node = cluster.namespace("katib-held"), cluster.node()
    for name in ("a", "b", "bystander"):
        katib.experiment(ns, name, parallel=1, max_trials=5)
        started_trials(katib, ns, name, 1)
    env = env_for(kube, node)
    args = {"experiments": [f"{ns}/a", f"{ns}/b"]}
    assert [
        r.outcome for r in await run_action(env=env, node=node, action="pause_katib", args=args)
    ] == ["done", "done"]
    for name in ("a", "b", "bystander"):
        (trial,) = katib.trials(ns, name)
        katib.finish(ns, trial)
    wait_until(
        "no running trial",
        lambda: not any(katib.running(ns, n) for n in ("a", "b", "bystander")),
        timeout=30,
        detail=katib.log_tail,
    )
    (first,) = await run_action(
        env=env, node=node, action="resume_katib", args={"experiments": [f"{ns}/a"]}
    )
    assert first.details["trials_that_may_start"] == 0 and "pause(s) of b" in first.message
    await asyncio.sleep(2)
    assert not katib.running(ns, "a")  # still held by b's quota
    (last,) = await run_action(
        env=env, node=node, action="resume_katib", args={"experiments": [f"{ns}/b"]}
    )
    assert "reconcile too (a, bystander)" in last.message, last.message
    for name in ("a", "b", "bystander"):
        wait_until(
            f"{name} to start a trial",
            functools.partial(katib.runs, ns, name, 1),
            timeout=30,
            detail=katib.log_tail,
        )


async def test_a_pause_does_not_outlive_its_experiment(
    katib: Katib, cluster: Cluster, kube: KubeClient
) -> None:
    ns, node = cluster.namespace("katib-gone"), cluster.node()
    katib.experiment(ns, "a", parallel=1, max_trials=5)
    katib.experiment(ns, "b", parallel=1, max_trials=5)
    (trial_b,) = list(started_trials(katib, ns, "b", 1))
    env = env_for(kube, node)
    await run_action(env=env, node=node, action="pause_katib", args={"experiments": [f"{ns}/a"]})
    quota = cluster.core.read_namespaced_resource_quota(quota_name("a"), ns)
    exp_uid = experiment(cluster, ns, "a")["metadata"]["uid"]
    # Owned by the experiment: the garbage collector deletes it with the experiment.
    (owner,) = given(given(quota.metadata).owner_references)
    assert (owner.kind, owner.name, owner.uid) == ("Experiment", "a", exp_uid)
    cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "experiments", "a")
    katib.finish(ns, trial_b)
    # No garbage collector runs here: the resume by hand finds the orphan quota and frees b.
    (res,) = await run_action(env=env, node=node, action="resume_katib")
    assert res.outcome == "done" and "which is gone" in res.message, res.message
    assert cluster.core.list_namespaced_resource_quota(ns).items == []
    wait_until(
        "b to start a new trial",
        lambda: len(katib.running(ns, "b")) == 1,
        timeout=30,
        detail=katib.log_tail,
    )


async def test_a_legacy_pause_of_an_unset_count_restores_katibs_default(
    katib: Katib, cluster: Cluster, kube: KubeClient
) -> None:
    # Removing the field would leave Katib's controller dereferencing nil on every reconcile.
    ns, node = cluster.namespace("katib-unset"), cluster.node()
    katib.experiment(ns, "random", parallel=1, max_trials=10)
    _legacy_pause(cluster, ns, "random", original="unset", by=f"{node}/r")
    (res,) = await run_action(env=env_for(kube, node), node=node, action="resume_katib")
    assert res.outcome == "done" and "Katib's default" in res.message
    assert experiment(cluster, ns, "random")["spec"]["parallelTrialCount"] == 3


def test_an_agent_killed_mid_pause_is_resumed_once_and_deletes_no_trial(
    katib: Katib, cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    # SIGKILL between the quota and the mark on the experiment (the pause's two writes): the
    # next agent completes the pause it finds half done, once, and Katib deletes no trial.
    ns, node = cluster.namespace("katib-kill"), cluster.node()
    katib.experiment(ns, "exp", parallel=2, max_trials=10)
    trials = started_trials(katib, ns, "exp", 2)
    rules = slab_rules(
        tmp_path, actions=f"[{{action: pause_katib, args: {{experiments: [{ns}/exp]}}}}]"
    )
    args = agent_args(tmp_path, node=node, kubeconfig=proxied.kubeconfig, rules=rules)
    held = proxied.hold("PATCH", rf"/namespaces/{ns}/experiments/exp")
    with running_agent(args=args, log_path=tmp_path / "agent-1.log") as base:
        held.wait_hit()  # the quota is made, the mark is on the wire
        assert len(cluster.core.list_namespaced_resource_quota(ns).items) == 1
        kill_9(base.pid)
    held.drop()  # the mark is lost with the agent: the pause is left half done
    proxied.clear()
    assert "nodeguard.io/paused-by" not in (
        experiment(cluster, ns, "exp")["metadata"].get("annotations") or {}
    )
    with running_agent(args=args, log_path=tmp_path / "agent-2.log") as base:
        (incident,) = wait_until(
            "the resumed runbook",
            lambda: incidents(base),
            timeout=60,
            step=0.05,
        )
        full = json.loads(get(f"{base}/incidents/{incident['id']}")[1])
    assert full["resumed"] == 1
    assert [(a["action"], a["outcome"]) for a in full["actions"]] == [("pause_katib", "done")]
    assert "mark on the experiment completed" in full["actions"][0]["message"]
    (quota,) = cluster.core.list_namespaced_resource_quota(ns).items
    assert given(quota.spec).hard == {"count/trials.kubeflow.org": "0"}
    exp = experiment(cluster, ns, "exp")
    assert exp["metadata"]["annotations"]["nodeguard.io/paused-by"].startswith(f"{node}/")
    assert exp["spec"]["parallelTrialCount"] == 2
    now = katib.trials(ns, "exp")
    assert {n: t["metadata"]["uid"] for n, t in now.items()} == trials  # none deleted, none new
    assert katib.running(ns, "exp") == set(trials)


def _suggested(cluster: Cluster, ns: str, name: str) -> bool:
    """Whether the experiment's Suggestion has as many suggestions as Katib requested."""
    s = custom_json(
        cluster.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "suggestions", name)
    )
    have = len((s.get("status") or {}).get("suggestions") or [])
    return have >= int((s.get("spec") or {}).get("requests") or 0)
