"""``nodeguard doctor``'s ``katib-fit`` check on typed inputs: Experiments read by the doctor's
reader (:func:`nodeguard.doctor.read_katib.experiment_view`), their trial templates resolved
over the feasible space as Katib substitutes ``${trialParameters.X}``."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import nodeguard.doctor  # noqa: F401  (registers every check)
from nodeguard.doctor.findings import Finding
from nodeguard.doctor.inputs import Cluster
from nodeguard.doctor.katib_fit import parameter_values, trial_pods
from nodeguard.doctor.katib_inputs import KatibInputs, ParameterView
from nodeguard.doctor.read_katib import experiment_view, node_labels
from nodeguard.doctor.registry import CHECKS
from tests.support.doctor import GiB, MiB, cluster, limit_range, node, quota


def experiment(
    *,
    memory: list[str],
    parallel: int | None = 4,
    limit: str | None = "${trialParameters.memory}",
    replicas: int | None = None,
    selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"memory": "${trialParameters.memory}"}}
    if limit:
        resources["limits"] = {"memory": limit}
    pod: dict[str, Any] = {
        "containers": [{"name": "train", "image": "t", "resources": resources}],
        "restartPolicy": "Never",
    }
    if selector:
        pod["nodeSelector"] = selector
    if replicas is None:
        trial = {"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": {"spec": pod}}}
    else:
        trial = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "spec": {
                "pytorchReplicaSpecs": {
                    "Master": {"replicas": 1, "template": {"spec": pod}},
                    "Worker": {"replicas": replicas, "template": {"spec": copy.deepcopy(pod)}},
                }
            },
        }
    spec: dict[str, Any] = {
        "parameters": [
            {"name": "mem", "parameterType": "categorical", "feasibleSpace": {"list": memory}},
            {
                "name": "lr",
                "parameterType": "double",
                "feasibleSpace": {"min": "0.01", "max": "0.1"},
            },
        ],
        "trialTemplate": {
            "trialParameters": [
                {"name": "memory", "reference": "mem"},
                {"name": "learningRate", "reference": "lr"},
            ],
            "trialSpec": trial,
        },
    }
    if parallel is not None:
        spec["parallelTrialCount"] = parallel
    return {"metadata": {"name": "sweep", "namespace": "ml"}, "spec": spec}


def found(
    c: Cluster, *docs: dict[str, Any], labels: dict[str, dict[str, str]] | None = None
) -> list[Finding]:
    katib = KatibInputs(
        experiments=tuple(experiment_view(d) for d in docs),
        node_labels=tuple(
            node_labels({"metadata": {"name": name, "labels": value}})
            for name, value in (labels or {}).items()
        ),
    )
    return list(CHECKS["katib-fit"].run(dataclasses.replace(c, katib=katib)))


def test_feasible_spaces_give_every_list_value_and_the_range_grid_or_its_ends() -> None:
    assert parameter_values(ParameterView(name="m", type="categorical", values=("2Gi", "8Gi"))) == [
        "2Gi",
        "8Gi",
    ]
    assert parameter_values(ParameterView(name="b", type="int", min="16", max="64", step="16")) == [
        "16",
        "32",
        "48",
        "64",
    ]
    # 1..1000 by 1 is past the grid: its ends.
    assert parameter_values(ParameterView(name="b", type="int", min="1", max="1000")) == [
        "1",
        "1000",
    ]
    assert parameter_values(ParameterView(name="lr", type="double", min="0.01", max="0.1")) == [
        "0.01",
        "0.1",
    ]
    assert parameter_values(ParameterView(name="x", type="int")) == []


def test_parallel_trials_past_the_quota_name_the_largest_value_and_the_count_that_fits() -> None:
    q = quota("compute", hard={"requests.memory": "64Gi"})
    (f,) = found(cluster(quotas=(q,)), experiment(memory=["2Gi", "8Gi", "32Gi"]))
    assert (f.severity, f.title) == (
        "error",
        "Katib experiment ml/sweep: 4 parallel trials need more memory requests than quota "
        "compute admits",
    )
    facts = {x.label: x.bytes if x.bytes is not None else x.text for x in f.evidence}
    assert facts == {
        "parallelTrialCount": "4",
        "largest trial request": 32 * GiB,
        "at": "mem=32Gi",
        "quota hard requests.memory": 64 * GiB,
        "trials that fit": "2",
    }
    assert f.fix.splitlines()[-1] == (
        'kubectl -n ml patch experiment sweep --type=merge -p \'{"spec":{"parallelTrialCount":2}}\''
    )
    # Two of 32 Gi fit 64 Gi exactly: no finding; nor without a quota.
    assert found(cluster(quotas=(q,)), experiment(memory=["2Gi", "32Gi"], parallel=2)) == []
    assert found(cluster(), experiment(memory=["2Gi", "8Gi", "32Gi"])) == []


def test_the_default_parallel_count_and_replicas_of_a_pytorchjob_count() -> None:
    # Unset: Katib's default of 3 trials; each trial a master and 3 workers of 8 Gi: 32 Gi.
    q = quota("compute", hard={"requests.memory": "64Gi"})
    doc = experiment(memory=["8Gi"], parallel=None, replicas=3)
    assert experiment_view(doc).parallel_trial_count == 3
    (f,) = found(cluster(quotas=(q,)), doc)
    facts = {x.label: x.bytes if x.bytes is not None else x.text for x in f.evidence}
    assert (facts["largest trial request"], facts["trials that fit"]) == (32 * GiB, "2")


def test_one_trial_past_the_quota_raises_the_quota() -> None:
    q = quota("compute", hard={"requests.memory": "16Gi", "limits.memory": "64Gi"})
    (f,) = found(cluster(quotas=(q,)), experiment(memory=["32Gi"], parallel=1))
    assert f.fix.splitlines()[-1] == (
        "kubectl -n ml patch resourcequota compute --type=merge "
        '-p \'{"spec":{"hard":{"requests.memory":"32768Mi"}}}\''
    )


def test_a_trial_pod_larger_than_every_node_it_may_run_on() -> None:
    nodes = (node("gpu-1", memory="64Gi", gpus=8), node("cpu-1", memory="512Gi"))
    doc = experiment(memory=["16Gi", "128Gi"], parallel=1)
    # Without a nodeSelector the 512 GiB node takes it: no finding.
    assert found(cluster(nodes=nodes), doc) == []
    gpu_only = experiment(memory=["16Gi", "128Gi"], parallel=1, selector={"pool": "gpu"})
    labelled = {"gpu-1": {"pool": "gpu"}}
    (f,) = found(cluster(nodes=nodes), gpu_only, labels=labelled)
    assert f.title == (
        "Katib experiment ml/sweep: a trial pod requests more memory than any node it may run "
        "on has"
    )
    facts = {x.label: x.bytes if x.bytes is not None else x.text for x in f.evidence}
    assert facts == {
        "pod request": 128 * GiB,
        "at": "mem=128Gi",
        "nodes": "1 (pool=gpu)",
        "largest allocatable": 64 * GiB,
    }
    # Asked about one namespace, only some nodes are read: not judged.
    scoped = cluster(nodes=nodes, namespaces=frozenset({"ml"}))
    assert found(scoped, gpu_only, labels=labelled) == []


def test_parallel_trials_past_the_nodes_summed_are_a_warning() -> None:
    nodes = (node("n1", memory="64Gi"), node("n2", memory="64Gi"))
    (f,) = found(cluster(nodes=nodes), experiment(memory=["48Gi"], parallel=4))
    assert (f.severity, f.title) == (
        "warning",
        "Katib experiment ml/sweep: 4 parallel trials need more memory than its nodes have",
    )
    assert 'parallelTrialCount":2' in f.fix


def test_limits_below_the_request_and_no_limit() -> None:
    (f,) = found(cluster(), experiment(memory=["2Gi", "8Gi"], limit="4Gi"))
    assert (f.severity, [x.text for x in f.evidence]) == ("error", ["train at mem=8Gi"])
    (f,) = found(cluster(), experiment(memory=["2Gi"], limit=None))
    assert (f.severity, f.title, f.evidence[0].text) == (
        "warning",
        "Katib experiment ml/sweep: trial containers without a memory limit",
        "train",
    )
    # The limit follows the request's parameter, as written in the template.
    assert f.fix.splitlines()[-1] == '      memory: "${trialParameters.memory}"  # its request'


def test_trial_pods_are_counted_as_the_controllers_run_them() -> None:
    (p,) = trial_pods(
        {
            "spec": {
                "parallelism": 2,
                "template": {
                    "spec": {
                        "containers": [{"name": "a", "resources": {"requests": {"memory": "1Gi"}}}]
                    }
                },
            }
        }
    )
    assert (p.count, p.request, p.limit, p.unlimited) == (2, GiB, None, ("a",))
    assert MiB * 1024 == GiB


def test_trial_pods_above_the_limit_range_max_are_refused() -> None:
    ceiling = limit_range("ceiling", limits=[{"type": "Container", "max": {"memory": "16Gi"}}])
    (f,) = found(cluster(limit_ranges=(ceiling,)), experiment(memory=["8Gi", "32Gi"], parallel=1))
    assert (f.severity, [str(o) for o in f.objects]) == (
        "error",
        ["Experiment ml/sweep", "LimitRange ml/ceiling"],
    )
    facts = {x.label: x.bytes if x.bytes is not None else x.text for x in f.evidence}
    assert facts == {
        "after the LimitRange defaults": 32 * GiB,
        "at": "mem=32Gi",
        "Container max memory (ceiling)": 16 * GiB,
    }
    pod_cap = limit_range("pods", limits=[{"type": "Pod", "max": {"memory": "32Gi"}}])
    assert found(cluster(limit_ranges=(pod_cap,)), experiment(memory=["32Gi"], parallel=1)) == []


def test_limit_range_defaults_count_before_the_max() -> None:
    """A trial container with no limit under a Pod max: LimitRanger refuses it ("No limit
    is specified"); with a Container default of 8Gi it is admitted under a 16Gi Pod max."""
    pod_cap = limit_range("pods", limits=[{"type": "Pod", "max": {"memory": "16Gi"}}])
    exp = experiment(memory=["4Gi"], parallel=1, limit=None)
    (f,) = [x for x in found(cluster(limit_ranges=(pod_cap,)), exp) if x.severity == "error"]
    assert f.title.endswith("trial pods refused at admission (Pod max of LimitRange pods)")
    assert {x.label: x.text for x in f.evidence}["after the LimitRange defaults"] == "no limit"
    default = limit_range("a-default", limits=[{"type": "Container", "default": {"memory": "8Gi"}}])
    errors = [
        x for x in found(cluster(limit_ranges=(default, pod_cap)), exp) if x.severity == "error"
    ]
    assert errors == []
