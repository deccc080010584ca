"""Pod memory requests and limits as Kubernetes computes them, on Pods stored by the real
kube-apiserver (v1.35: its defaulting of requests from limits and of pod-level requests, and
its RuntimeClass admission, shape what is stored).

The expected values are worked out by hand from k8s.io/component-helpers/resource helpers.go
(``PodRequests``, ``PodLimits``, ``AggregateContainerRequests``/``Limits``) and
pkg/kubelet/cm/helpers_linux.go ``ResourceConfigForPod`` (whether the pod cgroup gets a limit),
as summarised in nodeguard/kube/resources.py; each case says how.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from nodeguard.actions.ranking import EvictFilter, plan_eviction
from nodeguard.kube.objects import pod_meta
from nodeguard.kube.resources import pod_memory
from nodeguard.rules.signals import SIGNALS, History, Target
from nodeguard.snapshot import NodeMeta, NodeSnapshot, PodMeta
from tests.support.kube_helpers import Cluster, unique

MiB = 1 << 20
GiB = 1 << 30
PAUSE = "registry.k8s.io/pause:3.10"


def ctr(
    name: str, *, req: str | None = None, lim: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A container with memory requests/limits (and CPU equal to them where both are set)."""
    resources: dict[str, Any] = {}
    if req:
        resources["requests"] = {"memory": req}
    if lim:
        resources["limits"] = {"memory": lim}
    return {"name": name, "image": PAUSE, "resources": resources, **extra}


def sidecar(name: str, **kw: Any) -> dict[str, Any]:
    """A restartable init container (native sidecar, KEP-753)."""
    return ctr(name, restartPolicy="Always", **kw)


@pytest.fixture(scope="module")
def scene(cluster: Cluster) -> tuple[str, str]:
    return cluster.namespace("resources"), cluster.node(memory="64Gi")


def stored(
    cluster: Cluster, scene: tuple[str, str], spec: dict[str, Any], *, status: Any = None
) -> dict[str, Any]:
    """Create a pod on the scene's node with ``spec`` (and ``status`` through the status
    subresource); the Pod as the API server stored it."""
    ns, node = scene
    name = unique("pod")
    cluster.core.create_namespaced_pod(
        ns,
        client.V1Pod.model_validate(
            {"metadata": {"name": name}, "spec": {"nodeName": node, **spec}}
        ),
    )
    if status is not None:
        cluster.core.patch_namespaced_pod_status(name, ns, {"status": status})
    pod = cluster.pod_json(ns, name)
    assert pod is not None
    return pod


def test_a_sidecar_adds_to_the_app_containers(cluster: Cluster, scene: tuple[str, str]) -> None:
    # 2Gi app + 1Gi sidecar: the sidecar runs beside the app, so 3Gi (the old max(app, init)
    # rule counted 2Gi). Requests are defaulted from the limits by the API server.
    pod = stored(
        cluster,
        scene,
        {"initContainers": [sidecar("proxy", lim="1Gi")], "containers": [ctr("app", lim="2Gi")]},
    )
    meta = pod_meta(pod)
    assert (meta.memory_request_bytes, meta.memory_limit_bytes) == (3 * GiB, 3 * GiB)
    assert meta.container_requests == {"proxy": 1 * GiB, "app": 2 * GiB}


def test_sidecars_stack_under_later_init_containers(
    cluster: Cluster, scene: tuple[str, str]
) -> None:
    # Init containers in order: sidecar a (1Gi), init b (4Gi), sidecar c (512Mi), init d (4Gi);
    # app 2Gi. InitContainerUse: a 1, b 4+1 = 5, c 1+0.5 = 1.5, d 4+1.5 = 5.5; app + sidecars
    # = 2+1+0.5 = 3.5. The pod needs max(3.5, 5.5) = 5.5Gi (the largest init alone is 4Gi).
    spec = {
        "initContainers": [
            sidecar("a", lim="1Gi"),
            ctr("b", lim="4Gi"),
            sidecar("c", lim="512Mi"),
            ctr("d", lim="4Gi"),
        ],
        "containers": [ctr("app", lim="2Gi")],
    }
    meta = pod_meta(stored(cluster, scene, spec))
    assert meta.memory_request_bytes == 5 * GiB + 512 * MiB
    assert meta.memory_limit_bytes == 5 * GiB + 512 * MiB


def test_a_plain_init_container_sees_the_sidecars_limits(
    cluster: Cluster, scene: tuple[str, str]
) -> None:
    # A sidecar with a 1Gi limit, then an init container with none, app 2Gi. The kubelet's
    # ContainerFn sees the init container with the sidecar's 1Gi, not zero: the pod cgroup is
    # bounded, at max(2+1, 1) = 3Gi. Requests: sidecar 1Gi + app 2Gi (defaulted from limits).
    spec = {
        "initContainers": [sidecar("proxy", lim="1Gi"), ctr("migrate")],
        "containers": [ctr("app", lim="2Gi")],
    }
    meta = pod_meta(stored(cluster, scene, spec))
    assert (meta.memory_request_bytes, meta.memory_limit_bytes) == (3 * GiB, 3 * GiB)


def test_an_init_container_larger_than_the_apps(cluster: Cluster, scene: tuple[str, str]) -> None:
    # No sidecar: max(sum of apps 1+1, init 4) = 4Gi for both.
    spec = {
        "initContainers": [ctr("load", req="4Gi", lim="4Gi")],
        "containers": [ctr("a", req="1Gi", lim="1Gi"), ctr("b", req="1Gi", lim="1Gi")],
    }
    meta = pod_meta(stored(cluster, scene, spec))
    assert (meta.memory_request_bytes, meta.memory_limit_bytes) == (4 * GiB, 4 * GiB)


def test_one_container_without_a_limit_leaves_the_pod_unbounded(
    cluster: Cluster, scene: tuple[str, str]
) -> None:
    # ResourceConfigForPod gives the pod cgroup no memory limit: None. Request 1Gi (a's,
    # defaulted from its limit) + 256Mi.
    spec = {"containers": [ctr("a", lim="1Gi"), ctr("b", req="256Mi")]}
    pod = stored(cluster, scene, spec)
    meta = pod_meta(pod)
    assert (meta.memory_request_bytes, meta.memory_limit_bytes) == (1 * GiB + 256 * MiB, None)
    # kubectl describe node still adds a's 1Gi to the node's limits (PodLimits; nodeguard doctor).
    assert pod_memory(pod).limits_sum == 1 * GiB


def test_pod_level_resources_replace_the_containers(
    cluster: Cluster, scene: tuple[str, str]
) -> None:
    # spec.resources (PodLevelResources, on by default since 1.34): 8Gi for the pod, none on its
    # containers. A Guaranteed pod that requests 8Gi, not 0.
    spec = {
        "resources": {
            "requests": {"cpu": "2", "memory": "8Gi"},
            "limits": {"cpu": "2", "memory": "8Gi"},
        },
        "containers": [ctr("trainer"), ctr("logger")],
    }
    pod = stored(cluster, scene, spec)
    assert pod["status"]["qosClass"] == "Guaranteed"
    meta = pod_meta(pod)
    assert (meta.memory_request_bytes, meta.memory_limit_bytes) == (8 * GiB, 8 * GiB)


def test_pod_level_limit_with_container_requests(cluster: Cluster, scene: tuple[str, str]) -> None:
    # A pod-level limit only: the API server defaults the pod-level request to the containers'
    # aggregate (defaultPodRequests), 1 + 2 = 3Gi; the limit is the pod's 6Gi, although no
    # container has one.
    spec = {
        "resources": {"limits": {"cpu": "1", "memory": "6Gi"}},
        "containers": [ctr("a", req="1Gi"), ctr("b", req="2Gi")],
    }
    pod = stored(cluster, scene, spec)
    assert pod["spec"]["resources"]["requests"]["memory"] == "3Gi"
    meta = pod_meta(pod)
    assert (meta.memory_request_bytes, meta.memory_limit_bytes) == (3 * GiB, 6 * GiB)


@pytest.fixture(scope="module")
def runtime_class(cluster: Cluster) -> str:
    """A RuntimeClass whose pods carry 256Mi of overhead (the RuntimeClass admission plugin
    copies it into spec.overhead)."""
    from kubernetes import client

    name = unique("sandboxed")
    try:
        client.NodeV1Api(cluster.api).create_runtime_class(
            client.V1RuntimeClass.model_validate(
                {
                    "metadata": {"name": name},
                    "handler": "kata",
                    "overhead": {"podFixed": {"memory": "256Mi", "cpu": "250m"}},
                }
            )
        )
    except ApiException as exc:  # pragma: no cover - a failure to arrange the scene
        pytest.fail(f"cannot create a RuntimeClass: {exc}")
    return name


def test_overhead_adds_to_the_request_and_a_set_limit(
    cluster: Cluster, scene: tuple[str, str], runtime_class: str
) -> None:
    bounded = stored(
        cluster,
        scene,
        {"runtimeClassName": runtime_class, "containers": [ctr("a", req="1Gi", lim="2Gi")]},
    )
    assert bounded["spec"]["overhead"]["memory"] == "256Mi"
    meta = pod_meta(bounded)
    assert (meta.memory_request_bytes, meta.memory_limit_bytes) == (
        1 * GiB + 256 * MiB,
        2 * GiB + 256 * MiB,
    )
    # No limit: the overhead adds to the request only (PodLimits adds it to a set limit).
    unbounded = stored(
        cluster, scene, {"runtimeClassName": runtime_class, "containers": [ctr("a", req="512Mi")]}
    )
    meta = pod_meta(unbounded)
    assert (meta.memory_request_bytes, meta.memory_limit_bytes) == (768 * MiB, None)
    # Nothing names a limit: PodLimits is empty, the overhead is not added to it.
    assert (pod_memory(bounded).limits_sum, pod_memory(unbounded).limits_sum) == (
        2 * GiB + 256 * MiB,
        0,
    )


def _resized(name: str, *, req: str, lim: str) -> dict[str, Any]:
    """A container status whose applied resources (what the kubelet set) differ from spec."""
    return {
        "name": name,
        "image": PAUSE,
        "imageID": "",
        "ready": True,
        "restartCount": 0,
        "state": {"running": {}},
        "resources": {"requests": {"memory": req}, "limits": {"memory": lim}},
    }


def test_in_place_resize_counts_the_larger_of_spec_and_applied(
    cluster: Cluster, scene: tuple[str, str]
) -> None:
    # InPlacePodVerticalScaling (GA in 1.35): the scheduler takes per container the larger of
    # spec (1Gi/2Gi, being resized down) and what the kubelet still applies (1536Mi/3Gi).
    spec = {"containers": [ctr("app", req="1Gi", lim="2Gi")]}
    applied = {"containerStatuses": [_resized("app", req="1536Mi", lim="3Gi")]}
    meta = pod_meta(stored(cluster, scene, spec, status=applied))
    assert (meta.memory_request_bytes, meta.memory_limit_bytes) == (1536 * MiB, 3 * GiB)
    assert meta.container_requests == {"app": 1536 * MiB}
    # A resize the node cannot do (PodResizePending: Infeasible): the spec is left out, what is
    # applied counts even where it is smaller.
    infeasible = {
        "containerStatuses": [_resized("app", req="512Mi", lim="1Gi")],
        "conditions": [{"type": "PodResizePending", "status": "True", "reason": "Infeasible"}],
    }
    meta = pod_meta(stored(cluster, scene, spec, status=infeasible))
    assert (meta.memory_request_bytes, meta.memory_limit_bytes) == (512 * MiB, 1 * GiB)


def test_ranking_overcommit_and_exports_use_the_same_values(
    cluster: Cluster, scene: tuple[str, str]
) -> None:
    # A Guaranteed pod with 8Gi of pod-level resources using 6Gi is within its request; a pod
    # of a 2Gi app and a 1Gi sidecar using 4Gi is 1Gi above its 3Gi: the kubelet's order
    # evicts the second first (working set above request first).
    guaranteed = pod_meta(
        stored(
            cluster,
            scene,
            {
                "resources": {"limits": {"cpu": "2", "memory": "8Gi"}},
                "containers": [ctr("trainer")],
            },
        )
    )
    with_sidecar = pod_meta(
        stored(
            cluster,
            scene,
            {
                "initContainers": [sidecar("proxy", req="1Gi")],
                "containers": [ctr("app", req="2Gi")],
            },
        )
    )
    pods: dict[str, PodMeta] = {p.uid: p for p in (guaranteed, with_sidecar)}
    usage = {guaranteed.uid: 6 * GiB, with_sidecar.uid: 4 * GiB}
    plan = plan_eviction(pods=pods, usage=usage, flt=EvictFilter())
    assert [u.pods[0].uid for u, _ in plan.ranked] == [with_sidecar.uid, guaranteed.uid]
    assert [u.request_bytes for u, _ in plan.ranked] == [3 * GiB, 8 * GiB]

    # The node's sums (one function for the exporter and the overcommit signals): 11Gi of
    # requests, 8Gi of limits, one pod unbounded, against 64Gi allocatable.
    snap = NodeSnapshot(
        timestamp=0.0,
        node_name=scene[1],
        meminfo=None,
        pressure=None,
        pods=(),
        oom=None,
        processes=(),
        collectors=(),
        pod_meta=pods,
        node_meta=NodeMeta(
            name=scene[1],
            allocatable_memory_bytes=64 * GiB,
            capacity_memory_bytes=64 * GiB,
            unschedulable=False,
        ),
    )
    totals = snap.pod_memory_totals()
    assert totals is not None
    assert (totals.requests_bytes, totals.limits_bytes, totals.pods_without_limit) == (
        11 * GiB,
        8 * GiB,
        1,
    )
    node = Target(scope="node", key=scene[1])
    requests = SIGNALS["node_memory_requests_allocatable_ratio"].fn(snap, History(), node)
    limits = SIGNALS["node_memory_limits_allocatable_ratio"].fn(snap, History(), node)
    assert (requests, limits) == (11 / 64, 8 / 64)
