"""A Katib pause holds its whole namespace; when it ends, every experiment it held must be woken
(Katib's ``createTrials`` logs a refused create and goes on: only an event reconciles again).
Against Katib's real Experiment controller, the real ResourceQuota controller and, where it
applies, the real garbage collector (kube-controller-manager), with nodeguard a real process
killed at the worst moment."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from nodeguard.actions.katib import quota_name
from nodeguard.actions.katib_hold import TRIAL_COUNT as TRIALS
from nodeguard.actions.katib_hold import enforcement
from nodeguard.kube.client import KubeClient
from tests.support.acting import env_for, run_action
from tests.support.agent import kill_9, running_agent, wait_until
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
from tests.support.kube_helpers import Cluster, given, name_of
from tests.support.remediation import agent_args

HELD = "nodeguard.io/katib-held"


async def _act(*flags: str, kubeconfig: Path) -> tuple[int, str]:
    proc = await _spawn(*flags, kubeconfig=kubeconfig)
    # Results wrap at 80 columns (an indented continuation): read with their words joined.
    out = " ".join((await proc.communicate())[0].decode().split())
    assert proc.returncode is not None
    return proc.returncode, out


async def _spawn(*flags: str, kubeconfig: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *nodeguard_command(),
        "act",
        *flags,
        f"--kubeconfig={kubeconfig}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )


async def _pause(kube: KubeClient, node: str, *names: str, rule: str = "manual") -> None:
    results = await run_action(
        env=env_for(kube, node),
        node=node,
        action="pause_katib",
        args={"experiments": list(names)},
        rule=rule,
        source="local",
    )
    assert [r.outcome for r in results] == ["done"] * len(names), [r.message for r in results]


async def _all_trials_end(katib: Katib, ns: str, names: tuple[str, ...]) -> None:
    for name in names:
        for trial in katib.trials(ns, name):
            katib.finish(ns, trial)
    await asyncio.to_thread(
        wait_until,
        "no running trial",
        lambda: not any(katib.running(ns, n) for n in names),
        timeout=30,
        detail=katib.log_tail,
    )


async def _paused_when_idle(
    katib: Katib,
    kube: KubeClient,
    *,
    ns: str,
    node: str,
    names: tuple[str, ...],
    paused: tuple[str, ...],
) -> None:
    """Each of ``names`` an experiment in ``ns`` with one trial running (five at most), those
    of ``paused`` paused by ``node``, then every trial ended: only a kick starts one again."""
    for name in names:
        katib.experiment(ns, name, parallel=1, max_trials=5)
        started_trials(katib, ns, name, 1)
    await _pause(kube, node, *(f"{ns}/{name}" for name in paused))
    await _all_trials_end(katib, ns, names)


async def _each_starts_a_trial(katib: Katib, ns: str, names: tuple[str, ...]) -> None:
    for name in names:
        await asyncio.to_thread(
            wait_until,
            f"{name} to start a trial",
            functools.partial(katib.runs, ns, name, 1),
            timeout=30,
            detail=katib.log_tail,
        )


async def test_a_resume_killed_between_its_kicks_is_completed_by_the_rerun(
    katib: Katib, cluster: Cluster, kube: KubeClient, control_plane: TestCluster, proxied: Any
) -> None:
    # `nodeguard act resume-katib` SIGKILLed after the quota's delete, its kick of neighbour n2
    # on the wire: before, the rerun found nothing paused ("noop") and n2 never started again.
    ns, node = cluster.namespace("katib-killkick"), cluster.node()
    names = ("a", "n1", "n2")
    await _paused_when_idle(katib, kube, ns=ns, node=node, names=names, paused=("a",))
    delete = proxied.hold("DELETE", rf"/namespaces/{ns}/resourcequotas/{quota_name('a')}")
    proc = await _spawn(
        "resume-katib", f"--node={node}", f"--experiment={ns}/a", kubeconfig=proxied.kubeconfig
    )
    await asyncio.to_thread(delete.wait_hit)
    kick = proxied.hold("PATCH", rf"/namespaces/{ns}/experiments/n2(\?|$)")
    delete.release()
    await asyncio.to_thread(kick.wait_hit)
    os.kill(proc.pid, signal.SIGKILL)
    await proc.wait()
    kick.drop()  # the kick is lost with the process
    proxied.clear()
    assert cluster.core.list_namespaced_resource_quota(ns).items == []
    await asyncio.sleep(2)
    assert not katib.running(ns, "n2"), "n2 was kicked after all: the test proves nothing"

    code, out = await _act(
        "resume-katib",
        f"--node={node}",
        f"--experiment={ns}/a",
        kubeconfig=control_plane.kubeconfig_path,
    )
    assert code == 0, out
    assert "restarted Katib experiment(s) n2" in out, out
    await _each_starts_a_trial(katib, ns, names)
    assert not any(
        HELD in (experiment(cluster, ns, n)["metadata"].get("labels") or {}) for n in names
    )


async def test_two_resumes_at_once_in_one_namespace_wake_every_experiment(
    katib: Katib, cluster: Cluster, control_plane: TestCluster, kube: KubeClient, proxied: Any
) -> None:
    # Two `nodeguard act resume-katib` processes, a's and b's, both past their reads when the
    # deletes go: before, each had read the other's pause and kicked no neighbour, so the
    # bystander stayed stopped and both said the namespace was still held.
    ns, node = cluster.namespace("katib-twoat"), cluster.node()
    names = ("a", "b", "bystander")
    await _paused_when_idle(katib, kube, ns=ns, node=node, names=names, paused=("a", "b"))
    deletes = proxied.hold("DELETE", rf"/namespaces/{ns}/resourcequotas/", times=2)
    procs = [
        await _spawn(
            "resume-katib",
            f"--node={node}",
            f"--experiment={ns}/{e}",
            kubeconfig=proxied.kubeconfig,
        )
        for e in ("a", "b")
    ]
    await asyncio.to_thread(
        wait_until,
        "both deletes on the wire",
        lambda: deletes.matched == 2,
        timeout=30,
        detail=katib.log_tail,
    )
    deletes.release()
    outs = [(await p.communicate())[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert cluster.core.list_namespaced_resource_quota(ns).items == []
    # At most one may say the other still held the namespace; one woke them all.
    assert sum("until the pause(s) of" in o for o in outs) <= 1, outs
    assert any("reconcile too" in o for o in outs), outs
    await _each_starts_a_trial(katib, ns, names)


async def test_a_paused_experiment_deleted_under_the_garbage_collector_wakes_its_neighbour(
    katib: Katib, cluster: Cluster, kube: KubeClient, control_plane: TestCluster
) -> None:
    # The owner reference makes the garbage collector delete the pause with its experiment;
    # before, nothing kicked the neighbour and every nodeguard command said nothing was paused.
    ns, node = cluster.namespace("katib-gc"), cluster.node()
    katib.experiment(ns, "a", parallel=1, max_trials=5)
    katib.experiment(ns, "b", parallel=1, max_trials=5)
    started_trials(katib, ns, "a", 1)
    started_trials(katib, ns, "b", 1)
    await _pause(kube, node, f"{ns}/a")
    refused = quota_refusals(katib, ns)
    await _all_trials_end(katib, ns, ("b",))
    await asyncio.to_thread(
        wait_until,
        "b's create refused",
        lambda: quota_refusals(katib, ns) > refused,
        timeout=30,
        detail=katib.log_tail,
    )
    with control_plane.garbage_collector() as gc_log:
        cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "experiments", "a")
        await asyncio.to_thread(
            wait_until,
            "the garbage collector to delete the pause quota",
            lambda: not cluster.core.list_namespaced_resource_quota(ns).items,
            timeout=90,
            detail=katib.log_tail,
        )
        assert "garbage" in gc_log.read_text().lower()
    await asyncio.sleep(2)
    assert not katib.running(ns, "b"), "b started on its own: the test proves nothing"
    code, out = await _act(
        "resume-katib", f"--node={node}", kubeconfig=control_plane.kubeconfig_path
    )
    assert code == 0, out
    assert f"restarted Katib experiment(s) b in {ns}" in out, out
    await asyncio.to_thread(
        wait_until,
        "b to start a trial",
        lambda: len(katib.running(ns, "b")) == 1,
        timeout=30,
        detail=katib.log_tail,
    )


async def test_a_pause_is_done_only_once_the_quota_controller_enforces_it(
    katib: Katib, cluster: Cluster, kube: KubeClient, control_plane: TestCluster
) -> None:
    # Admission checks status.hard, which only the quota controller writes: with it down the
    # quota restricts nothing and Katib creates trials. Before, nodeguard said "paused".
    node = cluster.node()
    ns_a, ns_b = cluster.namespace("katib-unenforced"), cluster.namespace("katib-meanwhile")
    for ns in (ns_a, ns_b):
        katib.experiment(ns, "exp", parallel=2, max_trials=10)
        started_trials(katib, ns, "exp", 2)
    env = env_for(kube, node)
    control_plane.stop_controller_manager()
    try:
        (unenforced,) = await run_action(
            env=env,
            node=node,
            action="pause_katib",
            args={"experiments": [f"{ns_a}/exp"], "enforceWaitSeconds": 1},
        )
        assert unenforced.outcome == "failed" and unenforced.retry, unenforced.message
        assert "not enforced" in unenforced.message and "status.hard" in unenforced.message
        assert unenforced.details["enforced"] is False
        # What it warned of: the quota stands and Katib still creates a trial.
        katib.finish(ns_a, sorted(katib.running(ns_a, "exp"))[0])
        await asyncio.to_thread(
            wait_until,
            "a trial admitted",
            lambda: len(katib.running(ns_a, "exp")) == 2,
            timeout=30,
            detail=katib.log_tail,
        )

        pause = asyncio.create_task(
            run_action(
                env=env,
                node=node,
                action="pause_katib",
                args={"experiments": [f"{ns_b}/exp"], "enforceWaitSeconds": 120},
            )
        )
        await asyncio.to_thread(
            wait_until,
            "the quota made",
            lambda: cluster.core.list_namespaced_resource_quota(ns_b).items,
            timeout=30,
            detail=katib.log_tail,
        )
        before = set(katib.trials(ns_b, "exp"))
        katib.finish(ns_b, sorted(before)[0])
        slipped = await asyncio.to_thread(
            wait_until,
            "a trial created before the quota is enforced",
            lambda: set(katib.trials(ns_b, "exp")) - before,
            timeout=30,
            detail=katib.log_tail,
        )
        assert not pause.done()
    finally:
        control_plane.start_controller_manager()
    (res,) = await asyncio.wait_for(pause, 150)
    assert res.outcome == "done", res.message
    assert res.details["enforced"] is True
    assert res.details["trials_created_meanwhile"] == sorted(slipped)
    assert "before the quota was enforced" in res.message
    # Enforced now: a finished trial's successor is refused as exceeding the quota.
    refused, trials = quota_refusals(katib, ns_b), set(katib.trials(ns_b, "exp"))
    katib.finish(ns_b, sorted(katib.running(ns_b, "exp"))[0])
    await asyncio.to_thread(
        wait_until,
        "an 'exceeded quota' refusal",
        lambda: quota_refusals(katib, ns_b) > refused,
        timeout=30,
        detail=katib.log_tail,
    )
    assert set(katib.trials(ns_b, "exp")) == trials
    (again,) = await run_action(
        env=env, node=node, action="pause_katib", args={"experiments": [f"{ns_a}/exp"]}
    )
    assert again.outcome == "noop" and again.details["enforced"] is True, again.message


async def test_a_users_quota_of_the_pauses_name_is_not_taken_for_the_pause(
    katib: Katib, cluster: Cluster, kube: KubeClient, control_plane: TestCluster
) -> None:
    ns, node = cluster.namespace("katib-userquota"), cluster.node()
    katib.experiment(ns, "exp", parallel=1, max_trials=5)
    katib.experiment(ns, "other", parallel=1, max_trials=5)
    env = env_for(kube, node)
    # No label: a user's own quota that happens to bear the name.
    cluster.core.create_namespaced_resource_quota(
        ns,
        client.V1ResourceQuota.model_validate(
            {"metadata": {"name": quota_name("exp")}, "spec": {"hard": {"pods": "50"}}}
        ),
    )
    (res,) = await run_action(
        env=env, node=node, action="pause_katib", args={"experiments": [f"{ns}/exp"]}
    )
    assert res.outcome == "failed" and "is not nodeguard's pause" in res.message, res.message
    assert "nodeguard.io/paused-by" not in (
        experiment(cluster, ns, "exp")["metadata"].get("annotations") or {}
    )
    # nodeguard's labels but other limits: not the pause either; a resume leaves it.
    cluster.core.create_namespaced_resource_quota(
        ns,
        client.V1ResourceQuota.model_validate(
            {
                "metadata": {
                    "name": quota_name("other"),
                    "labels": {
                        "nodeguard.io/katib-pause": "true",
                        "katib.kubeflow.org/experiment": "other",
                    },
                    "annotations": {"nodeguard.io/paused-by": f"{node}/manual"},
                },
                "spec": {"hard": {"count/trials.kubeflow.org": "3"}},
            }
        ),
    )
    (res2,) = await run_action(
        env=env, node=node, action="pause_katib", args={"experiments": [f"{ns}/other"]}
    )
    assert res2.outcome == "failed" and "is not nodeguard's pause" in res2.message, res2.message
    code, out = await _act(
        "resume-katib",
        f"--node={node}",
        f"--experiment={ns}/other",
        kubeconfig=control_plane.kubeconfig_path,
    )
    assert code == 0 and "was not paused by nodeguard" in out, out
    names = {name_of(q) for q in cluster.core.list_namespaced_resource_quota(ns).items}
    assert names == {quota_name("exp"), quota_name("other")}


async def test_every_pauser_is_recorded_and_the_last_resolve_ends_the_pause(
    katib: Katib, cluster: Cluster, kube: KubeClient, control_plane: TestCluster
) -> None:
    # Two rules pause the same experiment: before, the second got "noop" and the first one's
    # resolve ended the pause for both.
    ns, node = cluster.namespace("katib-pausers"), cluster.node()
    katib.experiment(ns, "exp", parallel=1, max_trials=10)
    trials = started_trials(katib, ns, "exp", 1)
    env = env_for(kube, node)
    args = {"experiments": [f"{ns}/exp"]}
    await _pause(kube, node, f"{ns}/exp", rule="rule-a")
    (second,) = await run_action(
        env=env, node=node, action="pause_katib", args=args, rule="rule-b", source="local"
    )
    assert second.outcome == "done" and "recorded as a pauser too" in second.message
    assert second.details["pausers"] == [f"{node}/rule-a", f"{node}/rule-b"]
    kubeconfig = control_plane.kubeconfig_path
    code, out = await _act(
        "resume-katib", f"--node={node}", f"--experiment={ns}/exp", kubeconfig=kubeconfig
    )
    assert code == 3 and "--force" in out, out  # by hand, several pausers: refused

    (first,) = await run_action(
        env=env, node=node, action="resume_katib", rule="rule-a", source="local", kind="resolved"
    )
    assert first.outcome == "noop" and "stays paused for" in first.message, first.message
    assert [name_of(q) for q in cluster.core.list_namespaced_resource_quota(ns).items] == [
        quota_name("exp")
    ]
    refused = quota_refusals(katib, ns)
    katib.finish(ns, next(iter(trials)))
    await asyncio.to_thread(
        wait_until,
        "an 'exceeded quota' refusal",
        lambda: quota_refusals(katib, ns) > refused,
        timeout=30,
        detail=katib.log_tail,
    )
    assert set(katib.trials(ns, "exp")) == set(trials)

    await _pause(kube, node, f"{ns}/exp", rule="rule-a")  # held by both again
    code, out = await _act(
        "resume-katib", f"--node={node}", f"--experiment={ns}/exp", "--force", kubeconfig=kubeconfig
    )
    assert code == 0 and f"resumed Katib experiment {ns}/exp" in out, out
    assert cluster.core.list_namespaced_resource_quota(ns).items == []
    await asyncio.to_thread(
        wait_until,
        "a new trial",
        lambda: len(katib.running(ns, "exp")) == 1,
        timeout=30,
        detail=katib.log_tail,
    )
    (late,) = await run_action(
        env=env, node=node, action="resume_katib", rule="rule-b", source="local", kind="resolved"
    )
    assert late.outcome == "noop", late.message


class _Quotas:
    """Answers list_resource_quotas with the pause quota in the states given, one a read,
    the last one again and again (the quota controller's writes, as the API server serves
    them); the fake clock advances one second a read."""

    def __init__(self, *statuses: dict[str, Any]) -> None:
        self.statuses, self.reads, self.now = list(statuses), 0, 0.0

    async def list_resource_quotas(self, **_: Any) -> list[dict[str, Any]]:
        status = self.statuses[min(self.reads, len(self.statuses) - 1)]
        self.reads += 1
        self.now += 1.0
        labels = {"nodeguard.io/katib-pause": "true", "katib.kubeflow.org/experiment": "exp"}
        return [
            {
                "metadata": {"name": quota_name("exp"), "labels": labels},
                "spec": {"hard": {"count/trials.kubeflow.org": "0"}},
                "status": status,
            }
        ]


@pytest.mark.parametrize(
    ("statuses", "enforced", "counted", "reads"),
    [
        # Written and counted at the third read: done then.
        ([{}, {}, {"hard": {TRIALS: "0"}, "used": {TRIALS: "2"}}], True, True, 3),
        # status.hard written, Trials never counted (a quota made before the controller
        # discovered the CRD): enforced ("status unknown for quota"), said at the deadline.
        ([{"hard": {TRIALS: "0"}}], True, False, 5),
        # Nothing written (the controller down): not enforced, said at the deadline (5 s: the
        # fifth read).
        ([{}], False, False, 5),
    ],
)
async def test_the_wait_for_enforcement_ends_at_its_bound_on_a_fake_clock(
    statuses: list[dict[str, Any]], enforced: bool, counted: bool, reads: int
) -> None:
    api = _Quotas(*statuses)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    got = await enforcement(
        api,  # type: ignore[arg-type]
        namespace="ns",
        experiment="exp",
        wait=5.0,
        interval=1.0,
        sleep=sleep,
        clock=lambda: api.now,
    )
    assert (got.enforced, got.counted, api.reads) == (enforced, counted, reads)
    assert (got.why is None) == enforced
    assert slept == [1.0] * (reads - 1)


HELD_RULES = """\
apiVersion: nodeguard.io/v1alpha1
kind: RuleSet
spec:
  rules:
    - name: held
      scope: node
      when:
        - {signal: node_slab_unreclaimable_ratio, op: ">", value: 0.99}
      actions: [{action: pause_katib}]
      resolve: [{action: resume_katib}]
"""


def test_an_agent_killed_between_its_resolves_kicks_is_completed_by_the_next_agent(
    katib: Katib, cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    # The agent's own resolve: paused by rule `held` (which never fires on the fixture host),
    # the agent adopts the undo it owes at start and runs it as the rule is clear; SIGKILLed
    # while it kicks n2. Before, the next agent resumed the resolve and found nothing paused.
    ns, node = cluster.namespace("katib-agentkick"), cluster.node()
    names = ("a", "n1", "n2")
    for name in names:
        katib.experiment(ns, name, parallel=1, max_trials=5)
        started_trials(katib, ns, name, 1)
    kube = KubeClient.load(kubeconfig=control_plane.kubeconfig_path)
    try:
        asyncio.run(_pause(kube, node, f"{ns}/a", rule="held"))
    finally:
        kube.close()
    asyncio.run(_all_trials_end(katib, ns, names))
    rules = tmp_path / "rules.yaml"
    rules.write_text(HELD_RULES)
    args = agent_args(tmp_path, node=node, kubeconfig=proxied.kubeconfig, rules=rules)
    delete = proxied.hold("DELETE", rf"/namespaces/{ns}/resourcequotas/{quota_name('a')}")
    with running_agent(args=args, log_path=tmp_path / "agent-1.log") as base:
        delete.wait_hit(timeout=60)
        kick = proxied.hold("PATCH", rf"/namespaces/{ns}/experiments/n2(\?|$)")
        delete.release()
        kick.wait_hit()
        kill_9(base.pid)
    kick.drop()
    proxied.clear()
    assert cluster.core.list_namespaced_resource_quota(ns).items == []
    assert not katib.running(ns, "n2")
    with running_agent(args=args, log_path=tmp_path / "agent-2.log"):
        wait_until(
            "n2 to start a trial",
            lambda: len(katib.running(ns, "n2")) == 1,
            timeout=60,
            detail=katib.log_tail,
        )
    for name in names:
        wait_until(
            f"{name} to start a trial",
            functools.partial(katib.runs, ns, name, 1),
            timeout=30,
            detail=katib.log_tail,
        )


async def test_a_pause_after_a_resume_killed_before_its_delete_pauses_afresh(
    katib: Katib, cluster: Cluster, kube: KubeClient, proxied: Any
) -> None:
    # The resume marks the experiment as resuming (the quota's UID) before it deletes the
    # quota; killed in between, the next pauser must not join a pause on its way out (its
    # pausers list gone): it deletes that quota in the resume's place and pauses afresh.
    ns, node = cluster.namespace("katib-resuming"), cluster.node()
    katib.experiment(ns, "exp", parallel=1, max_trials=5)
    started_trials(katib, ns, "exp", 1)
    await _pause(kube, node, f"{ns}/exp", rule="r1")
    old_uid = given(cluster.core.read_namespaced_resource_quota(quota_name("exp"), ns).metadata).uid
    delete = proxied.hold("DELETE", rf"/namespaces/{ns}/resourcequotas/")
    proc = await _spawn(
        "resume-katib", f"--node={node}", f"--experiment={ns}/exp", kubeconfig=proxied.kubeconfig
    )
    await asyncio.to_thread(delete.wait_hit)
    os.kill(proc.pid, signal.SIGKILL)
    await proc.wait()
    delete.drop()
    proxied.clear()
    annotations = experiment(cluster, ns, "exp")["metadata"]["annotations"]
    assert annotations["nodeguard.io/resuming-quota"] == old_uid
    (res,) = await run_action(
        env=env_for(kube, node),
        node=node,
        action="pause_katib",
        args={"experiments": [f"{ns}/exp"]},
        rule="r2",
        source="local",
    )
    assert res.outcome == "done" and res.details["pausers"] == [f"{node}/r2"], res.message
    quota = cluster.core.read_namespaced_resource_quota(quota_name("exp"), ns)
    assert given(quota.metadata).uid != old_uid
    (r1,) = await run_action(
        env=env_for(kube, node),
        node=node,
        action="resume_katib",
        rule="r1",
        source="local",
        kind="resolved",
    )
    assert r1.outcome == "noop", r1.message
    assert cluster.core.list_namespaced_resource_quota(ns).items
