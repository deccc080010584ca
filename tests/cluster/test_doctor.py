"""``nodeguard doctor`` against the test kube-apiserver: a scene built to trip each check (and
the API server's own admission showing the quota/LimitRange contradictions are real: it refuses
the pods), a clean namespace and node that yield no finding, the exit statuses, the JSON, the
table, and the shipped read-only ClusterRole (docs/doctor-rbac.yaml) being enough."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.agent import wait_until
from tests.support.controlplane.cluster import TestCluster
from tests.support.deploy.manifests import service_account_token, token_kubeconfig
from tests.support.doctor_cluster import run_doctor as doctor
from tests.support.kube_helpers import Cluster, unique

REPO = Path(__file__).resolve().parents[2]
GiB = 2**30


@dataclass(frozen=True)
class Scene:
    gpu: str  # 8 GPUs, a reserve; an unbounded pod and a BestEffort one of ns "bad" on it
    packed: str  # limits past allocatable (a warning), requests within it
    bare: str  # allocatable == capacity
    clean: str  # a reserve, one bounded pod
    bad: str  # the unbounded pods' namespace
    over_quota: str  # LimitRange default above the quota's limits.memory
    no_default: str  # quota on limits.memory and no LimitRange default
    min_max: str  # Container min in one LimitRange above Pod max in another
    fine: str  # quota and a LimitRange default that fits it: clean


def _node(cluster: Cluster, *, memory: str, allocatable: str, gpus: int = 0) -> str:
    name = unique("doctor")
    cluster.core.create_node(client.V1Node.model_validate({"metadata": {"name": name}}))
    capacity = {"memory": memory, "cpu": "16", "pods": "110"}
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
    cluster.core.patch_node_status(
        name, {"status": {"capacity": capacity, "allocatable": {**capacity, "memory": allocatable}}}
    )
    return name


def _create(cluster: Cluster, namespace: str, kind: str, name: str, spec: dict[str, Any]) -> None:
    body = {"metadata": {"name": name}, "spec": spec}
    if kind == "ResourceQuota":
        cluster.core.create_namespaced_resource_quota(
            namespace, client.V1ResourceQuota.model_validate(body)
        )
    else:
        cluster.core.create_namespaced_limit_range(
            namespace, client.V1LimitRange.model_validate(body)
        )


def _refused(cluster: Cluster, namespace: str, resources: dict[str, Any]) -> str:
    """The API server's refusal of a one-container pod with ``resources``: its message."""
    pod = client.V1Pod.model_validate(
        {
            "metadata": {"name": unique("probe")},
            "spec": {"containers": [{"name": "main", "image": "pause", "resources": resources}]},
        }
    )
    with pytest.raises(ApiException) as caught:
        cluster.core.create_namespaced_pod(namespace, pod)
    assert caught.value.status == 403, caught.value.body
    return str(caught.value.body)


def _quota_counted(cluster: Cluster, namespace: str) -> bool:
    # ResourceQuota admission refuses every pod until the quota controller writes status.hard.
    quota = cluster.core.read_namespaced_resource_quota("compute", namespace)
    return bool(quota.status and quota.status.hard)


@pytest.fixture(scope="module")
def scene(cluster: Cluster) -> Scene:
    s = Scene(
        gpu=_node(cluster, memory="64Gi", allocatable="60Gi", gpus=8),
        packed=_node(cluster, memory="16Gi", allocatable="15Gi"),
        bare=_node(cluster, memory="32Gi", allocatable="32Gi"),
        clean=_node(cluster, memory="32Gi", allocatable="30Gi"),
        bad=cluster.namespace("doctor-bad"),
        over_quota=cluster.namespace("doctor-over"),
        no_default=cluster.namespace("doctor-nodef"),
        min_max=cluster.namespace("doctor-minmax"),
        fine=cluster.namespace("doctor-fine"),
    )
    cluster.pod(namespace=s.bad, node=s.gpu, name="prep", request="2Gi")
    cluster.pod(namespace=s.bad, node=s.gpu, name="scratch")  # BestEffort
    cluster.pod(namespace=s.bad, node=s.gpu, name="trainer", request="8Gi", limit="8Gi")
    for i, limit in enumerate(("8Gi", "6Gi", "4Gi")):  # 18 Gi of limits on 15 Gi
        cluster.pod(namespace=s.fine, node=s.packed, name=f"burst-{i}", request="1Gi", limit=limit)
    cluster.pod(namespace=s.fine, node=s.clean, name="web", request="1Gi", limit="2Gi")
    _create(cluster, s.over_quota, "ResourceQuota", "compute", {"hard": {"limits.memory": "8Gi"}})
    _create(
        cluster,
        s.over_quota,
        "LimitRange",
        "defaults",
        {"limits": [{"type": "Container", "default": {"memory": "16Gi"}}]},
    )
    _create(cluster, s.no_default, "ResourceQuota", "compute", {"hard": {"limits.memory": "8Gi"}})
    _create(
        cluster,
        s.min_max,
        "LimitRange",
        "floor",
        {"limits": [{"type": "Container", "min": {"memory": "2Gi"}}]},
    )
    _create(
        cluster,
        s.min_max,
        "LimitRange",
        "ceiling",
        {"limits": [{"type": "Pod", "max": {"memory": "1Gi"}}]},
    )
    _create(
        cluster,
        s.fine,
        "ResourceQuota",
        "compute",
        {"hard": {"limits.memory": "64Gi", "requests.memory": "32Gi"}},
    )
    _create(
        cluster,
        s.fine,
        "LimitRange",
        "defaults",
        {"limits": [{"type": "Container", "default": {"memory": "1Gi"}}]},
    )
    for ns in (s.over_quota, s.no_default, s.fine):
        wait_until("the quota counted", functools.partial(_quota_counted, cluster, ns), timeout=60)
    return s


def _scope(s: Scene, *, clean: bool) -> list[str]:
    if clean:
        return [f"--namespace={s.fine}", f"--node={s.clean}"]
    nodes = (s.gpu, s.packed, s.bare)
    namespaces = (s.bad, s.over_quota, s.no_default, s.min_max)
    return [*(f"--namespace={n}" for n in namespaces), *(f"--node={n}" for n in nodes)]


def test_the_admission_refusals_the_quota_checks_predict_are_real(
    cluster: Cluster, scene: Scene
) -> None:
    # A container without a limit gets the 16Gi default, over the 8Gi quota.
    assert "exceeded quota" in _refused(cluster, scene.over_quota, {})
    assert "must specify limits.memory" in _refused(cluster, scene.no_default, {})
    assert "maximum memory usage per Pod is 1Gi" in _refused(
        cluster, scene.min_max, {"requests": {"memory": "2Gi"}, "limits": {"memory": "2Gi"}}
    )


def test_a_clean_namespace_and_node_yield_no_finding(
    control_plane: TestCluster, scene: Scene
) -> None:
    rc, out, err = doctor(
        control_plane.kubeconfig_path, "--json", "--fail-on=warning", *_scope(scene, clean=True)
    )
    assert (rc, json.loads(out)) == (0, {"findings": [], "worst": None, "exit_status": 0}), err
    rc, out, _ = doctor(control_plane.kubeconfig_path, *_scope(scene, clean=True))
    assert (rc, out) == (0, "no findings\n")


def test_each_check_trips_on_the_scene_built_for_it(
    control_plane: TestCluster, scene: Scene
) -> None:
    rc, out, err = doctor(control_plane.kubeconfig_path, "--json", *_scope(scene, clean=False))
    report = json.loads(out)
    assert (rc, report["worst"], report["exit_status"]) == (1, "error", 1), err
    got = {
        (
            f["check"],
            f["severity"],
            tuple(f"{o['kind']} {o['namespace']}/{o['name']}" for o in f["objects"]),
        )
        for f in report["findings"]
    }
    s = scene
    assert got == {
        ("unbounded-memory", "error", (f"Pod {s.bad}/prep", f"Node /{s.gpu}")),
        ("unbounded-memory", "error", (f"Pod {s.bad}/scratch", f"Node /{s.gpu}")),
        (
            "overcommit",
            "warning",
            (
                f"Node /{s.packed}",
                f"Pod {s.fine}/burst-0",
                f"Pod {s.fine}/burst-1",
                f"Pod {s.fine}/burst-2",
            ),
        ),
        ("node-reserve", "error", (f"Node /{s.bare}",)),
        ("nodeguard-agents", "error", (f"Node /{s.gpu}",)),  # no agent on the GPU node
        (
            "quota-limitrange",
            "error",
            (f"LimitRange {s.over_quota}/defaults", f"ResourceQuota {s.over_quota}/compute"),
        ),
        ("quota-limitrange", "error", (f"ResourceQuota {s.no_default}/compute",)),
        (
            "quota-limitrange",
            "error",
            (f"LimitRange {s.min_max}/floor", f"LimitRange {s.min_max}/ceiling"),
        ),
    }
    over = next(f for f in report["findings"] if f["check"] == "overcommit")
    facts = {e["label"]: e.get("bytes") for e in over["evidence"]}
    assert (facts["limits summed"], facts["allocatable"]) == (18 * GiB, 15 * GiB)
    prep = next(f for f in report["findings"] if f["objects"][0]["name"] == "prep")
    assert prep["fix"].splitlines()[0] == (
        f"# pod {s.bad}/prep has no controller: set the limit in its manifest and re-create it"
    )
    assert "        memory: 2048Mi" in prep["fix"].splitlines()
    # The severities order the findings: every error before the warning.
    assert [f["severity"] for f in report["findings"]][-1] == "warning"


def test_fail_on_decides_the_exit_status_and_the_table_fits_80_columns(
    control_plane: TestCluster, scene: Scene
) -> None:
    packed = f"--node={scene.packed}"
    assert doctor(control_plane.kubeconfig_path, packed)[0] == 0  # a warning only
    rc, out, _ = doctor(control_plane.kubeconfig_path, packed, "--fail-on=warning")
    assert rc == 1
    lines = out.splitlines()
    assert lines[0] == "WARNING (1)"
    assert lines[1] == f"  overcommit: memory limits of node {scene.packed} at 120 % of allocatable"
    assert max(len(line) for line in lines) <= 80
    assert lines[-1] == "1 finding(s): 0 error, 1 warning, 0 info"
    assert doctor(control_plane.kubeconfig_path, "--node=doctor-no-such-node")[0] == 4
    # A misspelt namespace has no pods, quotas or LimitRanges: not "no findings", exit 4.
    rc, out, err = doctor(control_plane.kubeconfig_path, "--namespace=doctor-no-such-ns")
    assert (rc, out) == (4, "") and "doctor-no-such-ns" in err, err


def test_the_limit_range_fix_once_applied_admits_pods_and_clears_the_finding(
    cluster: Cluster, control_plane: TestCluster
) -> None:
    """A quota on both limits.memory and requests.memory with no LimitRange: one finding whose
    one LimitRange, applied as printed, makes the API server admit a pod that names no
    memory, and the doctor then finds nothing there."""
    ns = cluster.namespace("doctor-fixed")
    _create(
        cluster,
        ns,
        "ResourceQuota",
        "compute",
        {"hard": {"limits.memory": "8Gi", "requests.memory": "4Gi"}},
    )
    wait_until("the quota counted", functools.partial(_quota_counted, cluster, ns), timeout=60)
    assert "must specify limits.memory" in _refused(cluster, ns, {})
    rc, out, err = doctor(control_plane.kubeconfig_path, "--json", f"--namespace={ns}")
    (finding,) = json.loads(out)["findings"]
    assert (rc, finding["check"]) == (1, "quota-limitrange"), err
    manifest = finding["fix"].split("<<EOF\n", 1)[1].rsplit("EOF", 1)[0]
    doc = yaml.safe_load(manifest)
    _create(cluster, ns, "LimitRange", doc["metadata"]["name"], doc["spec"])
    pod = client.V1Pod.model_validate(
        {
            "metadata": {"name": "plain"},
            "spec": {"containers": [{"name": "main", "image": "pause"}]},
        }
    )
    created = cluster.core.create_namespaced_pod(ns, pod)
    resources = created.to_dict()["spec"]["containers"][0]["resources"]
    # No container here sets memory: the 1 GiB starting value, for both.
    assert (resources["limits"]["memory"], resources["requests"]["memory"]) == ("1Gi", "1Gi")
    rc, out, err = doctor(control_plane.kubeconfig_path, "--json", f"--namespace={ns}")
    assert (rc, json.loads(out)["findings"]) == (0, []), err


def test_the_shipped_cluster_role_is_enough_and_needed(
    cluster: Cluster, control_plane: TestCluster, scene: Scene, tmp_path: Path
) -> None:
    ns = cluster.namespace("doctor-ci")
    sa = "nodeguard-doctor"
    cluster.core.create_namespaced_service_account(
        ns, client.V1ServiceAccount.model_validate({"metadata": {"name": sa}})
    )
    token = service_account_token(cluster.api, name=sa, namespace=ns)
    kubeconfig = token_kubeconfig(
        tmp_path / "kubeconfig",
        server=control_plane.server_url,
        ca=control_plane.ca_cert_path,
        token=token,
    )
    rc, _, err = doctor(kubeconfig, *_scope(scene, clean=True))
    assert rc == 3 and "cannot read the cluster" in err  # no role bound: forbidden
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    # The first document; the optional roles after it are tests/cluster/test_doctor_configz.py's.
    role = next(yaml.safe_load_all((REPO / "docs/doctor-rbac.yaml").read_text()))
    try:
        rbac.create_cluster_role(client.V1ClusterRole.model_validate(role))
    except ApiException as exc:
        if exc.status != 409:
            raise
    binding = unique("nodeguard-doctor")
    rbac.create_cluster_role_binding(
        client.V1ClusterRoleBinding.model_validate(
            {
                "metadata": {"name": binding},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role["metadata"]["name"],
                },
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
            }
        )
    )
    try:
        admin = json.loads(
            doctor(control_plane.kubeconfig_path, "--json", *_scope(scene, clean=False))[1]
        )
        # Every namespace and node (list calls across the cluster), then the scoped calls.
        wait_until(
            "the binding in force", lambda: doctor(kubeconfig, "--json")[0] in (0, 1), timeout=30
        )
        rc, out, err = doctor(kubeconfig, "--json", *_scope(scene, clean=False))
        assert (rc, json.loads(out)) == (1, admin), err
    finally:
        rbac.delete_cluster_role_binding(binding)
