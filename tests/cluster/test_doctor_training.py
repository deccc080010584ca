"""``nodeguard doctor``'s ``training-priority`` and ``training-gang`` against the test
kube-apiserver with the training CRDs of tests/fixtures/training: a PyTorchJob of four pods at
priority 0 beside preprocessing, on the default scheduler; a TFJob naming a PriorityClass that
does not exist (the API server's Priority admission refuses such a pod, shown here); the fixes
applied as printed (the PriorityClass created, the job's templates patched, pods made again as
the training-operator makes them, the Kueue label) clear both; and a namespace of well-formed
jobs (Kueue-queued PyTorchJob, Volcano Job, JobSet with a PodGroup label) yields none. The shipped
read-only ClusterRole reads the same findings as an admin.

No training controller runs here: the doctor only reads, and the pods are made as the
training-operator v1.9 makes them (controller owner the job, label
``training.kubeflow.org/job-name``; pkg/controller.v1/common/pod.go)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.agent import wait_until
from tests.support.controlplane.cluster import TestCluster
from tests.support.doctor_cluster import doctor_account, run_doctor, shipped_roles
from tests.support.kube_helpers import Cluster, custom_json, given, unique

IMAGE = "registry.k8s.io/pause:3.10"


def _template(**spec: Any) -> dict[str, Any]:
    resources = {"requests": {"memory": "1Gi"}, "limits": {"memory": "1Gi"}}
    return {
        "spec": {"containers": [{"name": "main", "image": IMAGE, "resources": resources}], **spec}
    }


def _pytorchjob(
    name: str, *, workers: int = 3, labels: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": _template(**spec)},
                "Worker": {"replicas": workers, "template": _template(**spec)},
            }
        },
    }


def _operator_pods(cluster: Cluster, ns: str, job: dict[str, Any], *, node: str) -> list[str]:
    """The job's pods as the training-operator makes them from its templates: the job their
    controller owner, its job-name label, the template's pod spec; bound to ``node``. The
    Priority admission plugin resolves each one's priorityClassName."""
    names = []
    meta = job["metadata"]
    for role, rs in job["spec"]["pytorchReplicaSpecs"].items():
        for i in range(rs["replicas"]):
            name = f"{meta['name']}-{role.lower()}-{i}"
            spec = copy.deepcopy(rs["template"]["spec"])
            spec["nodeName"] = node
            body = {
                "metadata": {
                    "name": name,
                    "labels": {
                        "training.kubeflow.org/job-name": meta["name"],
                        "training.kubeflow.org/replica-type": role.lower(),
                    },
                    "ownerReferences": [
                        {
                            "apiVersion": "kubeflow.org/v1",
                            "kind": "PyTorchJob",
                            "name": meta["name"],
                            "uid": meta["uid"],
                            "controller": True,
                        }
                    ],
                },
                "spec": spec,
            }
            cluster.core.create_namespaced_pod(ns, client.V1Pod.model_validate(body))
            names.append(name)
    return names


def _create(cluster: Cluster, ns: str, doc: dict[str, Any]) -> dict[str, Any]:
    group, version = doc["apiVersion"].split("/")
    plural = {"PyTorchJob": "pytorchjobs", "TFJob": "tfjobs", "JobSet": "jobsets", "Job": "jobs"}[
        doc["kind"]
    ]
    return custom_json(
        cluster.custom.create_namespaced_custom_object(group, version, ns, plural, doc)
    )


def _gpu_node(cluster: Cluster) -> str:
    name = unique("doctor-train")
    cluster.core.create_node(client.V1Node.model_validate({"metadata": {"name": name}}))
    capacity = {"memory": "256Gi", "cpu": "32", "pods": "110", "nvidia.com/gpu": "8"}
    cluster.core.patch_node_status(
        name, {"status": {"capacity": capacity, "allocatable": {**capacity, "memory": "250Gi"}}}
    )
    return name


@pytest.fixture(scope="module")
def training_crds(cluster: Cluster) -> Cluster:
    cluster.install_training_crds()
    return cluster


def _report(kubeconfig: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    rc, out, err = run_doctor(kubeconfig, "--json", *args)
    return rc, json.loads(out) if out else {}, err


def _training(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["check"].startswith("training-")]


def test_training_at_priority_zero_without_a_gang_and_the_fixes_applied(
    training_crds: Cluster, control_plane: TestCluster
) -> None:
    cluster = training_crds
    node = _gpu_node(cluster)
    ns, etl = cluster.namespace("doctor-train"), cluster.namespace("doctor-etl")
    job = _create(cluster, ns, _pytorchjob("bert"))
    pods = _operator_pods(cluster, ns, job, node=node)
    cluster.pod(namespace=etl, node=node, name="pandas", request="8Gi", limit="8Gi")
    kubeconfig = control_plane.kubeconfig_path

    _, report, err = _report(kubeconfig, f"--namespace={ns}")
    found = {(f["check"], f["severity"], f["title"]): f for f in _training(report)}
    assert set(found) == {
        (
            "training-priority",
            "warning",
            f"PyTorchJob {ns}/bert runs without a PriorityClass (priority 0)",
        ),
        ("training-gang", "warning", f"PyTorchJob {ns}/bert starts 4 pods with no gang scheduling"),
    }, err
    priority = found[
        "training-priority",
        "warning",
        f"PyTorchJob {ns}/bert runs without a PriorityClass (priority 0)",
    ]
    facts = {e["label"]: e.get("text") for e in priority["evidence"]}
    assert facts["judged on"] == "4 pods"
    assert facts["non-training pods at or above it"] == f"1 pod; highest {etl}/pandas (priority 0)"

    # The fix as printed: its PriorityClass, if new, and the templates' priorityClassName.
    docs = [d for d in yaml.safe_load_all(priority["fix"]) if d]
    *classes, patch = docs
    for pc in classes:
        try:
            cluster.scheduling.create_priority_class(client.V1PriorityClass.model_validate(pc))
        except ApiException as exc:
            if exc.status != 409:
                raise
    name = patch["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["priorityClassName"]
    value = given(cluster.scheduling.read_priority_class(name).value)
    assert value > 999  # above the shipped runbook's evict maxPriority, and the pandas pod's 0
    patched = custom_json(
        cluster.custom.patch_namespaced_custom_object(
            "kubeflow.org", "v1", ns, "pytorchjobs", "bert", patch
        )
    )
    # Running pods keep their priority: the operator's next pods carry the class.
    for p in pods:
        cluster.core.delete_namespaced_pod(p, ns, grace_period_seconds=0)
    wait_until(
        "the old pods gone", lambda: cluster.core.list_namespaced_pod(ns).items == [], timeout=60
    )
    _operator_pods(cluster, ns, patched, node=node)
    priorities = {given(p.spec).priority for p in cluster.core.list_namespaced_pod(ns).items}
    assert priorities == {value}  # the Priority admission plugin resolved the class

    _, report, err = _report(kubeconfig, f"--namespace={ns}")
    assert [f["check"] for f in _training(report)] == ["training-gang"], err
    gang = _training(report)[0]
    (label_patch,) = [d for d in yaml.safe_load_all(gang["fix"]) if d]
    label_patch["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "team-a"
    cluster.custom.patch_namespaced_custom_object(
        "kubeflow.org", "v1", ns, "pytorchjobs", "bert", label_patch
    )
    _rc, report, err = _report(kubeconfig, f"--namespace={ns}")
    assert _training(report) == [], err


def test_a_priority_class_that_does_not_exist_is_an_error_the_api_server_confirms(
    training_crds: Cluster, control_plane: TestCluster
) -> None:
    cluster = training_crds
    ns = cluster.namespace("doctor-typo")
    tfjob = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "resnet"},
        "spec": {
            "tfReplicaSpecs": {
                "Worker": {"replicas": 1, "template": _template(priorityClassName="trainng")}
            }
        },
    }
    _create(cluster, ns, tfjob)
    rc, report, err = _report(control_plane.kubeconfig_path, f"--namespace={ns}")
    (finding,) = _training(report)
    assert (rc, finding["severity"], finding["title"]) == (
        1,
        "error",
        f"TFJob {ns}/resnet names a PriorityClass that does not exist: trainng",
    ), err
    # What the operator's pod would meet: the Priority admission plugin refuses it.
    body = {"metadata": {"name": "probe"}, **_template(priorityClassName="trainng")}
    with pytest.raises(ApiException) as refused:
        cluster.core.create_namespaced_pod(ns, client.V1Pod.model_validate(body))
    assert refused.value.status == 403 and "no PriorityClass with name trainng" in str(
        refused.value.body
    )


def test_well_formed_training_yields_no_finding_with_the_shipped_role(
    training_crds: Cluster, control_plane: TestCluster, tmp_path: Path
) -> None:
    cluster = training_crds
    ns = cluster.namespace("doctor-train-ok")
    high: dict[str, Any] = {"priorityClassName": "nodeguard-test-high"}
    _create(
        cluster, ns, _pytorchjob("queued", labels={"kueue.x-k8s.io/queue-name": "team-a"}, **high)
    )
    _create(
        cluster,
        ns,
        {
            "apiVersion": "batch.volcano.sh/v1alpha1",
            "kind": "Job",
            "metadata": {"name": "vc"},
            "spec": {
                "minAvailable": 2,
                "schedulerName": "volcano",
                "queue": "default",
                "tasks": [{"name": "worker", "replicas": 2, "template": _template(**high)}],
            },
        },
    )
    grouped = _template(**high)
    grouped["metadata"] = {"labels": {"scheduling.x-k8s.io/pod-group": "llm"}}
    _create(
        cluster,
        ns,
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "llm"},
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "workers",
                        "replicas": 2,
                        "template": {"spec": {"parallelism": 2, "template": grouped}},
                    }
                ]
            },
        },
    )
    _create(cluster, ns, _pytorchjob("solo", workers=0, **high))  # one pod: no gang needed
    args = ("--fail-on=warning", f"--namespace={ns}")
    rc, report, err = _report(control_plane.kubeconfig_path, *args)
    assert (rc, report["findings"]) == (0, []), err
    # The look-alike that must trip: the same JobSet without its PodGroup label.
    bare = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "bare"},
        "spec": {
            "replicatedJobs": [
                {"name": "w", "replicas": 2, "template": {"spec": {"template": _template(**high)}}}
            ]
        },
    }
    _create(cluster, ns, bare)
    admin = _report(control_plane.kubeconfig_path, *args)
    assert [f["title"] for f in admin[1]["findings"]] == [
        f"JobSet {ns}/bare starts 2 pods with no gang scheduling"
    ], admin[2]
    # The shipped read-only role reads the same: every job kind and the PriorityClasses.
    kubeconfig = doctor_account(
        cluster, control_plane, tmp_path / "kubeconfig", cluster_roles=["nodeguard-doctor"]
    )
    rc, report, err = _report(kubeconfig, *args)
    assert (rc, report) == (admin[0], admin[1]), err
    # (Other tests' agents may leave a note about their rules ConfigMap: not this role's.)
    assert "training jobs were not read" not in err, err
    assert "PriorityClasses were not read" not in err, err


def test_a_template_above_the_limit_range_pod_max_is_what_limitranger_refuses(
    training_crds: Cluster, control_plane: TestCluster
) -> None:
    cluster = training_crds
    ns = cluster.namespace("doctor-train-max")
    cluster.core.create_namespaced_limit_range(
        ns,
        client.V1LimitRange.model_validate(
            {
                "metadata": {"name": "caps"},
                "spec": {"limits": [{"type": "Pod", "max": {"memory": "2Gi"}}]},
            }
        ),
    )
    big = _pytorchjob("big", workers=1, priorityClassName="nodeguard-test-high")
    for rs in big["spec"]["pytorchReplicaSpecs"].values():
        rs["template"]["spec"]["containers"][0]["resources"] = {
            "requests": {"memory": "4Gi"},
            "limits": {"memory": "4Gi"},
        }
    big["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    _create(cluster, ns, big)
    rc, report, err = _report(control_plane.kubeconfig_path, f"--namespace={ns}")
    (finding,) = report["findings"]
    assert (rc, finding["check"], finding["severity"], finding["title"]) == (
        1,
        "quota-limitrange",
        "error",
        f"PyTorchJob {ns}/big: Master, Worker pods refused at admission (Pod max of LimitRange "
        "caps)",
    ), err
    # The pod the operator would make from that template: LimitRanger refuses it.
    body = {
        "metadata": {"name": "probe"},
        **big["spec"]["pytorchReplicaSpecs"]["Worker"]["template"],
    }
    with pytest.raises(ApiException) as refused:
        cluster.core.create_namespaced_pod(ns, client.V1Pod.model_validate(body))
    assert refused.value.status == 403
    assert "maximum memory usage per Pod is 2Gi" in str(refused.value.body)


def test_without_the_training_rules_the_doctor_says_so_and_judges_the_pods_alone(
    training_crds: Cluster, control_plane: TestCluster, tmp_path: Path
) -> None:
    """An older copy of the shipped role (no training jobs, no PriorityClasses): a note for
    each on stderr, and the job's pods judged on their own priority (no gang finding: the
    queue label is on the job, which was not read)."""
    cluster = training_crds
    node = _gpu_node(cluster)
    ns = cluster.namespace("doctor-train-old-role")
    job = _create(cluster, ns, _pytorchjob("bert", workers=1))
    _operator_pods(cluster, ns, job, node=node)
    role = copy.deepcopy(shipped_roles()["nodeguard-doctor"])
    role["metadata"]["name"] = unique("nodeguard-doctor-old")
    role["rules"] = [
        r
        for r in role["rules"]
        if not ({"priorityclasses", "pytorchjobs", "jobsets"} & set(r["resources"]))
        and r["apiGroups"] != ["batch.volcano.sh"]
    ]
    name = role["metadata"]["name"]
    kubeconfig = doctor_account(
        cluster, control_plane, tmp_path / "kubeconfig", cluster_roles=[name], other_roles=[role]
    )
    _, report, err = _report(kubeconfig, f"--namespace={ns}")
    assert "training jobs were not read (list pytorchjobs.kubeflow.org" in err, err
    assert "PriorityClasses were not read" in err, err
    assert [(f["check"], f["title"]) for f in _training(report)] == [
        ("training-priority", f"PyTorchJob {ns}/bert runs without a PriorityClass (priority 0)")
    ], err
    assert {e["label"]: e.get("text") for e in _training(report)[0]["evidence"]}["judged on"] == (
        "2 pods"
    )
