"""``nodeguard doctor``'s ``unbounded-memory`` check on typed inputs: pods without a memory
limit on GPU or training nodes, and the look-alikes that must not trip it."""

from __future__ import annotations

import yaml

import nodeguard.doctor  # noqa: F401  (registers every check)
from nodeguard.doctor.findings import Finding
from nodeguard.doctor.inputs import Cluster
from nodeguard.doctor.registry import CHECKS
from tests.support.doctor import GiB, cluster, container, node, pod


def found(c: Cluster) -> list[Finding]:
    return list(CHECKS["unbounded-memory"].run(c))


def test_a_pod_without_a_limit_on_a_gpu_node_is_an_error_naming_its_containers() -> None:
    gpu = node("gpu-1", gpus=8)
    p = pod(
        "prep",
        node="gpu-1",
        containers=[container(request="2Gi", limit="4Gi"), container("loader", request="1Gi")],
        owner=("ReplicaSet", "prep-5d9"),
    )
    (f,) = found(cluster(nodes=(gpu,), pods=(p,)))
    assert f.severity == "error"
    assert [str(o) for o in f.objects] == ["Pod ml/prep", "Node gpu-1"]
    facts = {x.label: x for x in f.evidence}
    assert facts["node"].text == "8 nvidia.com/gpu"
    assert facts["containers without a limit"].text == "loader (container)"
    assert facts["pod memory request"].bytes == 3 * GiB
    assert facts["node allocatable"].bytes == 64 * GiB
    # A pod's resources cannot be changed in place: the fix is the template that makes it.
    assert f.fix.splitlines() == [
        "# in the pod template of the Deployment that owns ReplicaSet prep-5d9 (or of the "
        "ReplicaSet itself when it has no Deployment); new pods get it",
        "containers:",
        "  - name: loader",
        "    resources:",
        "      limits:",
        "        memory: 1024Mi",
    ]
    assert "kubectl" not in f.fix


def test_best_effort_pods_and_unbounded_init_and_sidecar_containers_are_named() -> None:
    gpu = node("gpu-1", labels={"nvidia.com/gpu.present": "true"})
    be = pod("be", node="gpu-1", qos="BestEffort")
    init = pod(
        "with-init",
        node="gpu-1",
        containers=[container(request="1Gi", limit="1Gi")],
        init=[container("fetch"), container("proxy", restart_policy="Always")],
    )
    by_pod = {f.objects[0].name: f for f in found(cluster(nodes=(gpu,), pods=(be, init)))}
    assert by_pod["be"].title == ("BestEffort pod (no memory request or limit) on GPU node gpu-1")
    assert by_pod["be"].evidence[0].text == "label nvidia.com/gpu.present=true"
    unbounded = {x.label: x.text for x in by_pod["with-init"].evidence}
    assert unbounded["containers without a limit"] == "fetch (init), proxy (sidecar)"
    # Their limits go under initContainers, where the pod has them (under containers they
    # would name containers it does not have), each fragment valid YAML.
    fix = by_pod["with-init"].fix
    assert "initContainers:" in fix and "\ncontainers:" not in fix
    spec = yaml.safe_load(fix)
    assert [c["name"] for c in spec["initContainers"]] == ["fetch", "proxy"]
    assert yaml.safe_load(by_pod["be"].fix)["containers"][0]["resources"]["limits"]["memory"]


def test_a_node_running_training_counts_though_it_shows_no_gpu() -> None:
    plain = node("cpu-1")
    trial = pod(
        "trial",
        node="cpu-1",
        labels={"katib.kubeflow.org/trial": "t1"},
        containers=[container(request="1Gi", limit="1Gi")],
    )
    other = pod("other", node="cpu-1")
    (f,) = found(cluster(nodes=(plain,), pods=(trial, other)))
    assert (f.objects[0].name, f.evidence[0].text) == ("other", "runs training pods")


def test_look_alikes_that_must_not_trip() -> None:
    gpu = node("gpu-1", gpus=1)
    limited = pod("limited", node="gpu-1", containers=[container(request="1Gi", limit="2Gi")])
    # A pod-level limit bounds the pod cgroup although its container names none.
    pod_level = pod("pod-level", node="gpu-1", containers=[container()], pod_limit="4Gi")
    finished = pod("done", node="gpu-1", phase="Succeeded")
    elsewhere = pod("cpu-pod", node="cpu-1")  # a node with no GPU and no training
    other_ns = pod("other-ns", node="gpu-1", namespace="team-b")
    c = cluster(
        nodes=(gpu, node("cpu-1")),
        pods=(limited, pod_level, finished, elsewhere, other_ns),
        namespaces=frozenset({"ml"}),
    )
    assert found(c) == []


def test_a_jobs_pod_is_fixed_where_the_job_is_made() -> None:
    """A Job's template is immutable: the fix names what makes the Job, or re-creating it."""
    gpu = node("gpu-1", labels={"nvidia.com/gpu.present": "true"})
    p = pod("nightly-x", node="gpu-1", containers=[container()], owner=("Job", "nightly-2900"))
    (f,) = found(cluster(nodes=(gpu,), pods=(p,)))
    assert f.fix.splitlines()[0].startswith("# Job nightly-2900's template cannot change")
