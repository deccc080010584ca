"""Checks ``training-priority`` and ``training-gang`` on typed inputs: each finding against
its look-alike that must not trip it (a class above the preprocessing, preprocessing on
another node, a DaemonSet's pod, a PodGroup the operator named, Volcano's one-pod group, a
Kueue queue label, a one-pod job), and the fixes as YAML that parses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

import nodeguard.doctor  # noqa: F401  (registers every check)
from nodeguard.doctor.agent_inputs import RulesSource
from nodeguard.doctor.findings import Finding
from nodeguard.doctor.inputs import Cluster, PodView
from nodeguard.doctor.read_agents import rules_from_data
from nodeguard.doctor.read_katib import experiment_view
from nodeguard.doctor.read_training import experiment_job, job_view, priority_class_view
from nodeguard.doctor.registry import CHECKS
from nodeguard.doctor.training_inputs import TrainingInputs
from tests.support.doctor import (
    cluster,
    container,
    limit_range,
    node,
    pod,
    pod_template,
    priority_class,
    pytorchjob,
    training,
)

ROOT = Path(__file__).resolve().parents[2]


def found(check: str, c: Cluster) -> list[Finding]:
    return list(CHECKS[check].run(c))


def job_pods(name: str, *, n: int = 4, node_name: str = "gpu-1", **kw: Any) -> list[PodView]:
    """The pods the training-operator makes for PyTorchJob ``name``: owned by it, labelled."""
    return [
        pod(
            f"{name}-{i}",
            node=node_name,
            owner=("PyTorchJob", name),
            labels={"training.kubeflow.org/job-name": name},
            **kw,
        )
        for i in range(n)
    ]


def fix_docs(f: Finding) -> list[Any]:
    """The fix's manifest documents: it must be YAML a user can paste."""
    return [d for d in yaml.safe_load_all(f.fix) if d is not None]


GPU = node("gpu-1", gpus=8)
PREP = pod("pandas", node="gpu-1", namespace="etl", containers=[container(request="8Gi")])


# --- training-priority --------------------------------------------------------------------


def test_a_job_with_no_priority_class_beside_preprocessing_is_a_warning_with_a_class_to_add() -> (
    None
):
    c = cluster(
        nodes=(GPU,),
        pods=(*job_pods("bert"), PREP),
        training=training(pytorchjob("bert"), classes=[]),
    )
    (f,) = found("training-priority", c)
    assert (f.severity, f.title) == (
        "warning",
        "PyTorchJob ml/bert runs without a PriorityClass (priority 0)",
    )
    shown = {e.label: e.text for e in f.evidence}
    assert shown["judged on"] == "4 pods"
    assert shown["non-training pods at or above it"] == "1 pod; highest etl/pandas (priority 0)"
    pc, patch = fix_docs(f)
    assert (pc["kind"], pc["metadata"]["name"], pc["value"]) == ("PriorityClass", "training", 1000)
    specs = patch["spec"]["pytorchReplicaSpecs"]
    assert {r: s["template"]["spec"]["priorityClassName"] for r, s in specs.items()} == {
        "Master": "training",
        "Worker": "training",
    }


def test_training_above_the_preprocessing_on_its_nodes_is_no_finding() -> None:
    classes = [priority_class("training", 100_000)]
    pods = job_pods("bert", priority=100_000, priority_class="training")
    c = cluster(
        nodes=(GPU,),
        pods=(*pods, PREP),
        training=training(
            pytorchjob("bert", template=pod_template(priority_class="training")), classes=classes
        ),
    )
    assert found("training-priority", c) == []


def test_preprocessing_at_a_higher_priority_is_named_and_an_existing_class_above_it_chosen() -> (
    None
):
    classes = [
        priority_class("batch", 1000),
        priority_class("etl", 5000),
        priority_class("high", 10_000),
    ]
    pods = job_pods("bert", priority=1000, priority_class="batch")
    prep = pod("spark", node="gpu-1", namespace="etl", priority=5000, priority_class="etl")
    c = cluster(
        nodes=(GPU,), pods=(*pods, prep), training=training(pytorchjob("bert"), classes=classes)
    )
    (f,) = found("training-priority", c)
    assert (
        f.title
        == "PyTorchJob ml/bert runs at priority 1000, no higher than non-training pods on its nodes"
    )
    assert [str(o) for o in f.objects] == ["PyTorchJob ml/bert", "Pod etl/spark"]
    (patch,) = fix_docs(f)  # no new class: "high" (10000) is above 5000
    assert patch["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"] == {
        "priorityClassName": "high"
    }
    assert f.fix.startswith("# PriorityClass high (value 10000) is above every competitor; in ")


def test_preprocessing_on_another_node_or_a_daemonsets_pod_does_not_count() -> None:
    classes = [priority_class("batch", 1000)]
    pods = job_pods("bert", priority=1000, priority_class="batch")
    elsewhere = pod("spark", node="cpu-1", namespace="etl", priority=5000)
    daemon = pod("dcgm", node="gpu-1", namespace="gpu", priority=5000, owner=("DaemonSet", "dcgm"))
    system = pod("dns", node="gpu-1", namespace="kube-system", priority=2_000_000_000)
    c = cluster(
        nodes=(GPU, node("cpu-1")),
        pods=(*pods, elsewhere, daemon, system),
        training=training(pytorchjob("bert"), classes=classes),
    )
    assert found("training-priority", c) == []


def test_a_class_name_that_does_not_exist_is_an_error_and_unread_classes_judge_nothing() -> None:
    job = pytorchjob("bert", template=pod_template(priority_class="trainng"))
    c = cluster(nodes=(GPU,), training=training(job, classes=[priority_class("training", 1000)]))
    (f,) = found("training-priority", c)
    assert (f.severity, f.title) == (
        "error",
        "PyTorchJob ml/bert names a PriorityClass that does not exist: trainng",
    )
    assert [str(o) for o in f.objects] == ["PyTorchJob ml/bert", "PriorityClass trainng"]
    assert fix_docs(f)[0]["metadata"] == {"name": "trainng"}
    # PriorityClasses not read (forbidden): a named class cannot be judged.
    assert found("training-priority", cluster(nodes=(GPU,), training=training(job))) == []


def test_a_global_default_class_is_what_a_template_without_one_gets() -> None:
    classes = [priority_class("normal", 500, default=True)]
    prep = pod("spark", node="gpu-1", namespace="etl", priority=500, priority_class="normal")
    c = cluster(nodes=(GPU,), pods=(prep,), training=training(pytorchjob("bert"), classes=classes))
    (f,) = found("training-priority", c)
    assert (
        f.title
        == "PyTorchJob ml/bert runs at priority 500, no higher than non-training pods on its nodes"
    )
    assert {e.label: e.text for e in f.evidence}["judged on"] == "its templates"


def test_training_within_the_agents_evict_max_priority_is_a_warning() -> None:
    shipped = (ROOT / "rules/default.yaml").read_text()
    rules = rules_from_data(
        RulesSource(namespace="nodeguard", config_map="nodeguard-rules"), {"default.yaml": shipped}
    )
    assert rules.problems == ()
    classes = [priority_class("batch", 900)]
    pods = job_pods("bert", priority=900, priority_class="batch")
    c = cluster(
        nodes=(GPU,),
        pods=tuple(pods),
        training=training(pytorchjob("bert"), classes=classes),
        agent_rules=(rules,),
    )
    (f,) = found("training-priority", c)
    assert f.title == "PyTorchJob ml/bert runs at priority 900, no higher than nodeguard's evict"
    shown = {e.label: e.text for e in f.evidence}
    assert shown["nodeguard evict maxPriority"] == "999 (ConfigMap nodeguard/nodeguard-rules)"
    pc, _ = fix_docs(f)
    assert pc["value"] == 1000  # the next thousand above 999
    # At 1000 the default runbook's evict (maxPriority 999) no longer takes it.
    above = job_pods("bert", priority=1000, priority_class="batch")
    c2 = cluster(nodes=(GPU,), pods=tuple(above), training=c.training, agent_rules=(rules,))
    assert found("training-priority", c2) == []


def experiment(trial_spec: dict[str, Any], *, name: str = "hpo") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"parallelTrialCount": 2, "trialTemplate": {"trialSpec": trial_spec}},
    }


def test_an_experiments_trials_are_judged_on_its_trial_template_and_the_trial_jobs_skipped() -> (
    None
):
    exp = experiment_job(experiment_view(experiment(pytorchjob("t", workers=1))))
    assert exp is not None
    trial_job = job_view(
        pytorchjob("hpo-abc", owner="Trial"), kind="PyTorchJob", api_version="kubeflow.org/v1"
    )
    trial_pods = job_pods("hpo-abc", n=2)
    c = cluster(
        nodes=(GPU,),
        pods=tuple(trial_pods),
        training=TrainingInputs(jobs=(trial_job, exp), priority_classes=()),
    )
    (f,) = found("training-priority", c)
    assert f.title == "Experiment ml/hpo's trials run without a PriorityClass (priority 0)"
    _, patch = fix_docs(f)
    trial = patch["spec"]["trialTemplate"]["trialSpec"]
    assert trial["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"] == {
        "priorityClassName": "training"
    }


def test_training_pods_of_a_kind_not_read_are_judged_on_their_own_priority() -> None:
    pods = [
        pod(
            f"tj-{i}",
            node="gpu-1",
            owner=("TrainJob", "llm"),
            labels={"training.kubeflow.org/job-name": "llm"},
        )
        for i in range(2)
    ]
    finished = training(
        pytorchjob("done", status={"conditions": [{"type": "Succeeded", "status": "True"}]}),
        classes=[],
    )
    c = cluster(nodes=(GPU,), pods=tuple(pods), training=finished)
    (f,) = found("training-priority", c)
    assert f.title == "TrainJob ml/llm runs without a PriorityClass (priority 0)"
    assert found("training-gang", c) == []  # a queue label is on the job: pods cannot tell


# --- training-gang ------------------------------------------------------------------------


def test_a_multi_replica_job_on_the_default_scheduler_is_a_warning() -> None:
    c = cluster(nodes=(GPU,), pods=tuple(job_pods("bert")), training=training(pytorchjob("bert")))
    (f,) = found("training-gang", c)
    assert (f.severity, f.title) == (
        "warning",
        "PyTorchJob ml/bert starts 4 pods with no gang scheduling",
    )
    shown = {e.label: e.text for e in f.evidence}
    assert shown["pods at once"] == "4 (Master 1, Worker 3)"
    assert shown["schedulerName"] == "default-scheduler"
    (patch,) = fix_docs(f)
    assert patch == {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "<local-queue>"}}}
    assert "--gang-scheduler-name=volcano" in f.fix


def test_a_podgroup_a_queue_or_a_volcano_job_is_a_gang_and_one_pod_needs_none() -> None:
    # What the training-operator run with --gang-scheduler-name=volcano puts on its pods.
    operator = [
        pod(
            f"a-{i}",
            node="gpu-1",
            owner=("PyTorchJob", "a"),
            annotations={"scheduling.k8s.io/group-name": "a"},
            spec_extra={"schedulerName": "volcano"},
        )
        for i in range(4)
    ]
    coscheduled = pytorchjob(
        "b", template=pod_template(labels={"scheduling.x-k8s.io/pod-group": "b"})
    )
    queued = pytorchjob("c", labels={"kueue.x-k8s.io/queue-name": "team-a"})
    single = pytorchjob("d", workers=0)
    volcano = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "e", "namespace": "ml"},
        "spec": {
            "minAvailable": 4,
            "tasks": [{"name": "worker", "replicas": 4, "template": pod_template()}],
        },
    }
    c = cluster(
        nodes=(GPU,),
        pods=tuple(operator),
        training=training(pytorchjob("a"), coscheduled, queued, single, volcano),
    )
    assert found("training-gang", c) == []


def test_volcanos_one_pod_groups_and_an_unread_scheduling_policy_are_no_gang() -> None:
    # Volcano's PodGroup controller gives each pod that names no group one of minMember 1.
    pods = [
        pod(
            f"bert-{i}",
            node="gpu-1",
            owner=("PyTorchJob", "bert"),
            annotations={"scheduling.k8s.io/group-name": f"podgroup-uid-{i}"},
            spec_extra={"schedulerName": "volcano"},
        )
        for i in range(4)
    ]
    job = pytorchjob("bert", run_policy={"schedulingPolicy": {"minAvailable": 4}})
    (f,) = found("training-gang", cluster(nodes=(GPU,), pods=tuple(pods), training=training(job)))
    shown = {e.label: e.text for e in f.evidence}
    assert shown["schedulerName"] == "volcano"
    assert shown["runPolicy.schedulingPolicy"] == (
        "set, but only an operator run with --gang-scheduler-name reads it"
    )


def test_a_jobset_counts_replicas_times_parallelism_and_gets_a_podgroup_fix() -> None:
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "llm", "namespace": "ml"},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": 2,
                    "template": {"spec": {"parallelism": 2, "template": pod_template()}},
                }
            ]
        },
    }
    (f,) = found("training-gang", cluster(nodes=(GPU,), training=training(jobset)))
    assert f.title == "JobSet ml/llm starts 4 pods with no gang scheduling"
    assert "minMember 4" in f.fix and "--gang-scheduler-name" not in f.fix


def test_an_experiment_whose_trials_are_multi_replica_is_judged_once_and_a_batch_job_not() -> None:
    multi = experiment_job(experiment_view(experiment(pytorchjob("t", workers=2))))
    batch = experiment_job(
        experiment_view(
            experiment(
                {"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": pod_template()}},
                name="one",
            )
        )
    )
    assert multi is not None and batch is not None
    c = cluster(nodes=(GPU,), training=TrainingInputs(jobs=(multi, batch), priority_classes=()))
    (f,) = found("training-gang", c)
    assert f.title == "Experiment ml/hpo's trials (PyTorchJob) start 3 pods with no gang scheduling"
    (patch,) = fix_docs(f)
    assert patch["spec"]["trialTemplate"]["trialSpec"]["metadata"]["labels"] == {
        "kueue.x-k8s.io/queue-name": "<local-queue>"
    }


def test_a_finished_job_and_a_namespace_out_of_scope_are_not_judged() -> None:
    done = pytorchjob("done", status={"conditions": [{"type": "Succeeded", "status": "True"}]})
    other = pytorchjob("other", namespace="research")
    c = cluster(nodes=(GPU,), training=training(done, other), namespaces=frozenset({"ml"}))
    assert found("training-gang", c) == [] and found("training-priority", c) == []


def test_an_experiments_live_trial_pods_give_its_priority() -> None:
    """Katib's pod webhook labels each trial pod with its Experiment: those pods' priority
    (here a low class beside preprocessing at the same) is what the finding reports."""
    exp = experiment_job(
        experiment_view(
            experiment(
                {"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": pod_template()}}
            )
        )
    )
    assert exp is not None
    labels = {"katib.kubeflow.org/experiment": "hpo", "katib.kubeflow.org/trial": "hpo-1"}
    trial = [
        pod(f"hpo-1-{i}", node="gpu-1", labels=labels, priority=100, priority_class="batch")
        for i in range(2)
    ]
    prep = pod("spark", node="gpu-1", namespace="etl", priority=100, priority_class="batch")
    c = cluster(
        nodes=(GPU,),
        pods=(*trial, prep),
        training=TrainingInputs(jobs=(exp,), priority_classes=()),
    )
    (f,) = found("training-priority", c)
    assert f.title == (
        "Experiment ml/hpo's trials run at priority 100, no higher than non-training pods on "
        "its nodes"
    )
    assert {e.label: e.text for e in f.evidence}["judged on"] == "2 pods"
    # Without the Experiment read, the same pods are one workload by their trial label.
    alone = cluster(nodes=(GPU,), pods=(*trial, prep), training=TrainingInputs())
    (f2,) = found("training-priority", alone)
    assert f2.title.startswith("Trial ml/hpo-1 runs at priority 100")


# --- quota-limitrange: training templates above a LimitRange max --------------------------


def _sized(memory: str) -> dict[str, Any]:
    tpl = pod_template(priority_class="training")
    tpl["spec"]["containers"] = [
        container(request=memory, limit=memory),
        container("side", request="256Mi", limit="256Mi"),
    ]
    return tpl


def test_a_training_template_above_the_pod_max_is_refused_and_one_at_it_is_not() -> None:
    ranges = (
        limit_range(
            "caps",
            limits=[
                {"type": "Pod", "max": {"memory": "4Gi"}},
                {"type": "Container", "max": {"memory": "8Gi"}},
            ],
        ),
    )
    big = pytorchjob("big", template=_sized("4Gi"))  # 4Gi + 256Mi a pod: above the Pod max
    fits = pytorchjob("fits", template=_sized("3840Mi"))  # 3840Mi + 256Mi = 4Gi exactly
    done = pytorchjob(
        "done",
        template=_sized("16Gi"),
        status={"conditions": [{"type": "Failed", "status": "True"}]},
    )
    c = Cluster(
        nodes=(), pods=(), quotas=(), limit_ranges=ranges, training=training(big, fits, done)
    )
    (f,) = found("quota-limitrange", c)
    assert (f.severity, f.title) == (
        "error",
        "PyTorchJob ml/big: Master, Worker pods refused at admission (Pod max of LimitRange caps)",
    )
    assert {e.label: e.bytes for e in f.evidence if e.bytes} == {
        "after the LimitRange defaults": 4 * 2**30 + 256 * 2**20,
        "Pod max": 4 * 2**30,
    }
    assert [str(o) for o in f.objects] == ["PyTorchJob ml/big", "LimitRange ml/caps"]
    # A container above the Container max (8Gi) is refused for that first.
    huge = pytorchjob("huge", template=_sized("12Gi"))
    (f,) = found(
        "quota-limitrange",
        Cluster(nodes=(), pods=(), quotas=(), limit_ranges=ranges, training=training(huge)),
    )
    assert f.title.endswith("(Container max of LimitRange caps)")


def _bare(*requests: str | None) -> dict[str, Any]:
    """A template of containers with these requests (``None``: none) and no limits."""
    tpl = pod_template(priority_class="training")
    tpl["spec"]["containers"] = [container(f"c{i}", request=r) for i, r in enumerate(requests)]
    return tpl


def test_limit_range_defaults_are_applied_before_the_max_as_limitranger_does() -> None:
    def refused(limits: list[dict[str, Any]], tpl: dict[str, Any]) -> list[str]:
        ranges = (limit_range("lr", limits=limits),)
        job = pytorchjob("j", workers=1, template=tpl)
        c = Cluster(nodes=(), pods=(), quotas=(), limit_ranges=ranges, training=training(job))
        return [f.title.split("(", 1)[1] for f in found("quota-limitrange", c)]

    pod_max = {"type": "Pod", "max": {"memory": "4Gi"}}
    # No limit and no default under a Pod max: "No limit is specified".
    assert refused([pod_max], _bare("1Gi")) == ["Pod max of LimitRange lr)"]
    # Three containers given the 2Gi default: 6Gi against a 4Gi Pod max.
    default = {"type": "Container", "default": {"memory": "2Gi"}}
    assert refused([default, pod_max], _bare(None, None, None)) == ["Pod max of LimitRange lr)"]
    # The same under an 8Gi Pod max fits: the look-alike.
    roomy = {"type": "Pod", "max": {"memory": "8Gi"}}
    assert refused([default, roomy], _bare(None, None, None)) == []
    # An 8Gi request given a 2Gi default limit: the API server refuses request > limit.
    capped = {**default, "max": {"memory": "16Gi"}}
    assert refused([capped], _bare("8Gi")) == ["request above limit of LimitRange lr)"]


# --- what a new user's cluster showed (a fresh tester's findings) ---------------------------


def test_a_missing_class_is_an_error_even_once_some_of_its_pods_run() -> None:
    """Master names ``high``, Worker ``hihg``: the Master pod runs, every Worker pod is
    refused; the pods that exist are the admitted ones, so the templates decide."""
    job = pytorchjob("bert", template=pod_template(priority_class="high"))
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"] = pod_template(priority_class="hihg")
    master = job_pods("bert", n=1, priority=50_000, priority_class="high")
    classes = [priority_class("high", 50_000)]
    c = cluster(nodes=(GPU,), pods=tuple(master), training=training(job, classes=classes))
    (f,) = found("training-priority", c)
    assert f.title == "PyTorchJob ml/bert names a PriorityClass that does not exist: hihg"
    two = pytorchjob("mpi", template=pod_template(priority_class="missing-a"))
    two["spec"]["pytorchReplicaSpecs"]["Worker"]["template"] = pod_template(priority_class="b")
    (f,) = found(
        "training-priority", cluster(nodes=(GPU,), training=training(two, classes=classes))
    )
    assert f.title.endswith("names PriorityClasses that do not exist: b, missing-a")
    assert [d["metadata"]["name"] for d in fix_docs(f)] == ["b", "missing-a"]  # every one


def test_a_volcano_jobs_own_priority_class_is_its_pods() -> None:
    """Volcano's createJobPod gives a task's pods the Job's spec.priorityClassName."""

    def volcano(cls: str, *, min_available: int = 4) -> dict[str, Any]:
        return {
            "apiVersion": "batch.volcano.sh/v1alpha1",
            "kind": "Job",
            "metadata": {"name": "vj", "namespace": "ml"},
            "spec": {
                "minAvailable": min_available,
                "priorityClassName": cls,
                "tasks": [{"name": "w", "replicas": 4, "template": pod_template()}],
            },
        }

    classes = [priority_class("high", 50_000)]
    ok = cluster(nodes=(GPU,), pods=(PREP,), training=training(volcano("high"), classes=classes))
    assert found("training-priority", ok) == [] and found("training-gang", ok) == []
    bad = cluster(nodes=(GPU,), training=training(volcano("nosuch"), classes=classes))
    (f,) = found("training-priority", bad)
    assert f.title == "Job.batch.volcano.sh ml/vj names a PriorityClass that does not exist: nosuch"
    # minAvailable 1 of 4 pods is a gang of one.
    (g,) = found(
        "training-gang", cluster(nodes=(GPU,), training=training(volcano("high", min_available=1)))
    )
    assert g.title == "Job.batch.volcano.sh ml/vj gangs only 1 of its 4 pods"


def test_the_suggested_class_never_reuses_a_name_taken() -> None:
    """A PriorityClass's value cannot change: a fix that re-creates ``training`` at another
    value would be refused, so it is named for its value."""
    classes = [priority_class("training", 500)]
    pods = job_pods("bert", priority=500, priority_class="training")
    prep = pod("spark", node="gpu-1", namespace="etl", priority=500)
    c = cluster(
        nodes=(GPU,), pods=(*pods, prep), training=training(pytorchjob("bert"), classes=classes)
    )
    (f,) = found("training-priority", c)
    pc, _ = fix_docs(f)
    assert (pc["metadata"]["name"], pc["value"]) == ("training-1000", 1000)


def test_look_alikes_of_a_gang_are_not_one() -> None:
    # Kueue's label on the pods only: its pod integration admits each pod on its own.
    queued_pods = [
        pod(
            f"a-{i}",
            node="gpu-1",
            owner=("PyTorchJob", "a"),
            labels={"kueue.x-k8s.io/queue-name": "q", "training.kubeflow.org/job-name": "a"},
        )
        for i in range(4)
    ]
    c = cluster(nodes=(GPU,), pods=tuple(queued_pods), training=training(pytorchjob("a")))
    assert [f.title for f in found("training-gang", c)] == [
        "PyTorchJob ml/a starts 4 pods with no gang scheduling"
    ]
    # A group-name annotation on pods the default scheduler places: no scheduler reads it.
    annotated = [
        pod(
            f"b-{i}",
            node="gpu-1",
            owner=("PyTorchJob", "b"),
            annotations={"scheduling.k8s.io/group-name": "b"},
        )
        for i in range(4)
    ]
    c = cluster(nodes=(GPU,), pods=tuple(annotated), training=training(pytorchjob("b")))
    assert len(found("training-gang", c)) == 1


def test_katib_replicas_set_by_a_parameter_count_at_their_largest() -> None:
    trial = pytorchjob("t", workers=1)
    trial["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "${trialParameters.workers}"
    exp = experiment(trial)
    exp["spec"]["parameters"] = [
        {"name": "n", "parameterType": "categorical", "feasibleSpace": {"list": ["4", "8"]}}
    ]
    exp["spec"]["trialTemplate"]["trialParameters"] = [{"name": "workers", "reference": "n"}]
    job = experiment_job(experiment_view(exp))
    assert job is not None and job.replicas == 9  # one Master and 8 Workers
    finished = {**exp, "status": {"conditions": [{"type": "Succeeded", "status": "True"}]}}
    done = experiment_job(experiment_view(finished))
    assert done is not None and done.finished
    c = cluster(nodes=(GPU,), training=TrainingInputs(jobs=(done,), priority_classes=()))
    assert found("training-gang", c) == [] and found("training-priority", c) == []


def test_unread_priority_classes_judge_no_template_without_one() -> None:
    """Without the PriorityClasses a template naming none may still get a global default."""
    c = cluster(nodes=(GPU,), pods=(PREP,), training=training(pytorchjob("bert")))
    assert found("training-priority", c) == []


def test_malformed_jobs_are_read_as_far_as_they_are_well_formed() -> None:
    """A CRD with a loose schema lets a list or a string through where an object goes."""
    jobs = [
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "TFJob",
            "metadata": {"name": "a", "namespace": "ml"},
            "spec": {"tfReplicaSpecs": [1, 2]},
        },
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "b", "namespace": "ml"},
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "w",
                        "replicas": 2,
                        "template": {"spec": {"template": pod_template()}},
                    },
                    "string-entry",
                ]
            },
        },
        {
            "apiVersion": "batch.volcano.sh/v1alpha1",
            "kind": "Job",
            "metadata": {"name": "c", "namespace": "ml"},
            "spec": {"tasks": {"a": 1}},
        },
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "d", "namespace": "ml"},
            "spec": {
                "pytorchReplicaSpecs": {
                    "Worker": {"replicas": 2, "template": {"spec": {"containers": "x"}}}
                }
            },
        },
    ]
    c = cluster(nodes=(GPU,), training=training(*jobs, classes=[]))
    gang = sorted(f.title for f in found("training-gang", c))
    assert gang == [
        "JobSet ml/b starts 2 pods with no gang scheduling",
        "PyTorchJob ml/d starts 2 pods with no gang scheduling",
    ]


# --- a second fresh tester's findings -------------------------------------------------------


def _limits(tpl_spec: dict[str, Any], *limits: dict[str, Any]) -> list[tuple[str, str]]:
    """(severity, the title's reason) of each quota-limitrange finding for a one-Worker job
    of this pod spec under LimitRanges ``limits`` (one LimitRange each, named lr0, lr1...)."""
    ranges = tuple(limit_range(f"lr{i}", limits=[item]) for i, item in enumerate(limits))
    job = pytorchjob("j", workers=0, template={"spec": tpl_spec})
    c = Cluster(nodes=(), pods=(), quotas=(), limit_ranges=ranges, training=training(job))
    return [(f.severity, f.title.split("(", 1)[1]) for f in found("quota-limitrange", c)]


def test_pod_level_resources_and_sidecars_count_as_podlimits_counts_them() -> None:
    pod_max = {"type": "Pod", "max": {"memory": "4Gi"}}
    two = [container("a", request="1Gi", limit="3Gi"), container("b", request="1Gi", limit="3Gi")]
    # A pod-level 3Gi limit bounds the pod: admitted, though its containers sum to 6Gi.
    assert _limits({"containers": two, "resources": {"limits": {"memory": "3Gi"}}}, pod_max) == []
    # A pod-level 5Gi limit is above the max: refused.
    one = [container("a", request="1Gi", limit="3Gi")]
    assert _limits({"containers": one, "resources": {"limits": {"memory": "5Gi"}}}, pod_max) == [
        ("error", "Pod max of LimitRange lr0)")
    ]
    # A 2Gi sidecar runs beside a 3Gi container: 5Gi, refused; as a plain init container,
    # it runs before, so the pod needs 3Gi: admitted.
    side = container("side", request="2Gi", limit="2Gi", restart_policy="Always")
    assert _limits({"containers": one, "initContainers": [side]}, pod_max) == [
        ("error", "Pod max of LimitRange lr0)")
    ]
    plain = container("init", request="2Gi", limit="2Gi")
    assert _limits({"containers": one, "initContainers": [plain]}, pod_max) == []


def test_two_limit_ranges_with_defaults_may_apply_in_either_order() -> None:
    """LimitRanger takes the first default its lister gives, in no order to rely on: a
    template refused with one of the two defaults and admitted with the other is a warning."""
    bare = [container("a"), container("b")]
    small = {"type": "Container", "default": {"memory": "1Gi"}}
    big = {"type": "Container", "default": {"memory": "3Gi"}}
    pod_max = {"type": "Pod", "max": {"memory": "2Gi"}}
    assert _limits({"containers": bare}, small, big, pod_max) == [
        ("warning", "Pod max of LimitRange lr2, with one order of its LimitRanges' defaults)")
    ]
    assert _limits({"containers": bare}, big, pod_max) == [("error", "Pod max of LimitRange lr1)")]


def test_volcano_tasks_min_available_sum_is_the_gang() -> None:
    vj = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "vj", "namespace": "ml"},
        "spec": {
            "tasks": [{"name": "w", "replicas": 4, "minAvailable": 1, "template": pod_template()}]
        },
    }
    (g,) = found("training-gang", cluster(nodes=(GPU,), training=training(vj)))
    assert g.title == "Job.batch.volcano.sh ml/vj gangs only 1 of its 4 pods"


def test_the_fallback_class_name_is_never_taken_either() -> None:
    classes = [priority_class("training", 100), priority_class("training-6000", 7)]
    pods = job_pods("bert", priority=100, priority_class="training")
    prep = pod("spark", node="gpu-1", namespace="etl", priority=5000)
    c = cluster(
        nodes=(GPU,), pods=(*pods, prep), training=training(pytorchjob("bert"), classes=classes)
    )
    (f,) = found("training-priority", c)
    assert fix_docs(f)[0]["metadata"]["name"] == "training-6000-2"


def test_pods_of_a_job_that_is_gone_are_judged_alone() -> None:
    orphans = job_pods("ghost", n=2)  # owned by PyTorchJob ghost, which no longer exists
    c = cluster(
        nodes=(GPU,), pods=(*orphans, PREP), training=training(pytorchjob("bert"), classes=[])
    )
    titles = [f.title for f in found("training-priority", c)]
    assert "PyTorchJob ml/ghost runs without a PriorityClass (priority 0)" in titles


def test_a_trial_priority_class_bound_to_a_parameter_is_checked_at_every_value() -> None:
    template = pod_template()
    template["spec"]["priorityClassName"] = "${trialParameters.pc}"
    trial: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "spec": {"template": template},
    }
    exp = experiment(trial)
    exp["spec"]["parameters"] = [
        {
            "name": "cls",
            "parameterType": "categorical",
            "feasibleSpace": {"list": ["web5", "nope-cls"]},
        }
    ]
    exp["spec"]["trialTemplate"]["trialParameters"] = [{"name": "pc", "reference": "cls"}]
    job = experiment_job(experiment_view(exp))
    assert job is not None
    classes = (priority_class_view(priority_class("web5", 5000)),)
    c = cluster(nodes=(GPU,), training=TrainingInputs(jobs=(job,), priority_classes=classes))
    (f,) = found("training-priority", c)
    assert (
        f.title == "Experiment ml/hpo's trials name a PriorityClass that does not exist: nope-cls"
    )
