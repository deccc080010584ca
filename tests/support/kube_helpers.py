"""Building realistic nodes and pods on the test control plane (no kubelet: pods are bound with
``spec.nodeName`` and their status is patched through the status subresource)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from nodeguard.kube.client import KubeClient
from nodeguard.kube.watch import PodWatcher
from tests.fixtures.make_hosts import CID, UID_STATIC
from tests.support.agent import wait_until

# Katib's CRDs and an example experiment, vendored (tests/fixtures/katib/README.md).
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "katib"
# Training-job CRDs, vendored (tests/fixtures/training/README.md).
TRAINING_FIXTURES = FIXTURES.parent / "training"

T = TypeVar("T")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def given(value: T | None) -> T:
    """``value``, which the API server has set (the typed client marks every field optional:
    ``metadata`` and ``spec`` of a read object, ``status`` once a controller wrote it);
    AssertionError when it is absent."""
    assert value is not None, "a field the API server sets is absent"
    return value


def custom_json(doc: object) -> dict[str, Any]:
    """A custom object as CustomObjectsApi returns it (typed ``object``: its JSON, a dict)."""
    assert isinstance(doc, dict), doc
    return doc


class Described(Protocol):
    """Any object of the typed client with ``metadata`` (V1Node, V1Pod, V1Lease, ...)."""

    @property
    def metadata(self) -> client.V1ObjectMeta | None: ...


def name_of(obj: Described) -> str:
    """``metadata.name`` of an object read from the API server."""
    return given(given(obj.metadata).name)


def labels_of(obj: Described) -> dict[str, str]:
    """``metadata.labels``; {} where the object has none (the API server omits an empty map)."""
    return given(obj.metadata).labels or {}


def annotations_of(obj: Described) -> dict[str, str]:
    """``metadata.annotations``; {} where the object has none."""
    return given(obj.metadata).annotations or {}


def cordoned(node: client.V1Node) -> bool:
    """``spec.unschedulable`` is true (absent means schedulable, core/v1 NodeSpec)."""
    return bool(node.spec and node.spec.unschedulable)


def taints_of(node: client.V1Node) -> list[client.V1Taint]:
    """``spec.taints``; [] where the node has none."""
    return (node.spec.taints if node.spec else None) or []


class Cluster:
    """Admin-side helpers over the official client, for arranging test scenes."""

    def __init__(self, kubeconfig: Path) -> None:
        # kubernetes.config carries no annotations (the generated client does).
        self.api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig)
        )
        self.core = client.CoreV1Api(self.api)
        self.policy = client.PolicyV1Api(self.api)
        self.scheduling = client.SchedulingV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.ext = client.ApiextensionsV1Api(self.api)

    def close(self) -> None:
        """Close the client's connection pool."""
        self.api.close()  # type: ignore[no-untyped-call]  # ApiClient.close: no annotations

    def namespace(self, prefix: str = "ns") -> str:
        name = unique(prefix)
        self.core.create_namespace(client.V1Namespace.model_validate({"metadata": {"name": name}}))
        return name

    def node(self, name: str | None = None, *, memory: str = "64Gi") -> str:
        name = name or unique("node")
        self.core.create_node(
            client.V1Node.model_validate(
                {"metadata": {"name": name, "labels": {"nodeguard-test": "1"}}}
            )
        )
        self.core.patch_node_status(
            name,
            {
                "status": {
                    "capacity": {"memory": memory, "cpu": "16", "pods": "110"},
                    "allocatable": {"memory": memory, "cpu": "16", "pods": "110"},
                }
            },
        )
        return name

    def priority_class(self, name: str, value: int) -> None:
        try:
            self.scheduling.create_priority_class(
                client.V1PriorityClass.model_validate(
                    {"metadata": {"name": name}, "value": value, "globalDefault": False}
                )
            )
        except ApiException as exc:
            if exc.status != 409:
                raise

    def pod(
        self,
        *,
        namespace: str,
        node: str,
        name: str | None = None,
        request: str | None = None,
        limit: str | None = None,
        priority_class: str | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        owner: tuple[str, str] | None = None,
    ) -> dict[str, Any]:
        """Create a running pod bound to ``node``; its JSON as created (with uid)."""
        name = name or unique("pod")
        resources: dict[str, Any] = {}
        if request:
            resources["requests"] = {"memory": request}
        if limit:
            resources["limits"] = {"memory": limit}
        if request and request == limit:  # Guaranteed QoS needs CPU requests == limits too
            resources["requests"]["cpu"] = resources["limits"]["cpu"] = "1"
        meta: dict[str, Any] = {
            "name": name,
            "labels": labels or {},
            "annotations": annotations or {},
        }
        if owner:
            meta["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1" if owner[0] != "Job" else "batch/v1",
                    "kind": owner[0],
                    "name": owner[1],
                    "uid": str(uuid.uuid4()),
                    "controller": True,
                }
            ]
        spec: dict[str, Any] = {
            "nodeName": node,
            "containers": [
                {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": resources}
            ],
        }
        if priority_class:
            spec["priorityClassName"] = priority_class
        self.core.create_namespaced_pod(
            namespace, client.V1Pod.model_validate({"metadata": meta, "spec": spec})
        )
        cid = uuid.uuid4().hex + uuid.uuid4().hex
        self.core.patch_namespaced_pod_status(
            name,
            namespace,
            {
                "status": {
                    "phase": "Running",
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "containerStatuses": [
                        {
                            "name": "main",
                            "containerID": f"containerd://{cid}",
                            "image": "pause",
                            "imageID": "",
                            "ready": True,
                            "restartCount": 0,
                            "state": {"running": {}},
                        }
                    ],
                }
            },
        )
        return self.as_json(self.core.read_namespaced_pod(name, namespace))

    def as_json(self, obj: object) -> dict[str, Any]:
        """An object of the typed client as the API server's JSON (camelCase keys)."""
        # ApiClient.sanitize_for_serialization carries no annotations.
        doc: dict[str, Any] = self.api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
        return doc

    def blocking_pdb(self, namespace: str, *, name: str, labels: dict[str, str]) -> None:
        """A PodDisruptionBudget (minAvailable 1) over ``labels`` whose status allows no
        disruption, as the disruption controller (not run here) would write it for one healthy
        pod: the eviction API then answers 429 (policy/v1 PodDisruptionBudgetStatus)."""
        self.policy.create_namespaced_pod_disruption_budget(
            namespace,
            client.V1PodDisruptionBudget.model_validate(
                {
                    "metadata": {"name": name},
                    "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}},
                }
            ),
        )
        pdb = self.policy.read_namespaced_pod_disruption_budget(name, namespace)
        gen = given(pdb.metadata).generation
        self.policy.patch_namespaced_pod_disruption_budget_status(
            name,
            namespace,
            {
                "status": {
                    "observedGeneration": gen,
                    "disruptionsAllowed": 0,
                    "currentHealthy": 1,
                    "desiredHealthy": 1,
                    "expectedPods": 1,
                }
            },
        )

    def finish_pod(self, namespace: str, name: str, *, phase: str = "Succeeded") -> None:
        """Mark a pod finished as the kubelet does when its containers end for good: phase
        ``Succeeded`` or ``Failed``, ``Ready`` False, containers terminated."""
        code = 0 if phase == "Succeeded" else 1
        self.core.patch_namespaced_pod_status(
            name,
            namespace,
            {
                "status": {
                    "phase": phase,
                    "conditions": [{"type": "Ready", "status": "False"}],
                    "containerStatuses": [
                        {
                            "name": "main",
                            "image": "pause",
                            "imageID": "",
                            "ready": False,
                            "restartCount": 0,
                            "state": {"terminated": {"exitCode": code}},
                        }
                    ],
                }
            },
        )

    def budget(
        self,
        namespace: str,
        *,
        name: str,
        labels: dict[str, str],
        min_available: int,
        healthy: int,
        policy: str | None = None,
    ) -> dict[str, Any]:
        """A PodDisruptionBudget (integer ``minAvailable``, which the disruption controller
        computes without looking for the pods' controllers) over ``labels``; returns its JSON
        once kube-controller-manager's disruption controller has written a status for this
        generation with ``healthy`` pods counted."""
        spec: dict[str, Any] = {"minAvailable": min_available, "selector": {"matchLabels": labels}}
        if policy:
            spec["unhealthyPodEvictionPolicy"] = policy
        self.policy.create_namespaced_pod_disruption_budget(
            namespace,
            client.V1PodDisruptionBudget.model_validate({"metadata": {"name": name}, "spec": spec}),
        )
        return self.synced_budget(namespace, name=name, healthy=healthy)

    def synced_budget(self, namespace: str, *, name: str, healthy: int) -> dict[str, Any]:
        """The budget once its status is the controller's for its generation, ``healthy``
        pods counted (a hang guard of 120 s: the disruption controller of a loaded 2-core
        machine has been seen to take over 30 s)."""
        last: dict[str, Any] = {}

        def synced() -> dict[str, Any] | None:
            pdb = self.as_json(self.policy.read_namespaced_pod_disruption_budget(name, namespace))
            last["status"] = status = pdb.get("status") or {}
            generation = status.get("observedGeneration") == pdb["metadata"]["generation"]
            return pdb if generation and status.get("currentHealthy", 0) == healthy else None

        return wait_until(
            f"the disruption controller to sync {name}",
            synced,
            timeout=120,
            detail=lambda: last.get("status"),
        )

    def pod_json(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.as_json(self.core.read_namespaced_pod(name, namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def events(self, namespace: str, *, name: str, reason: str) -> list[Any]:
        return [
            e
            for e in self.core.list_namespaced_event(namespace).items
            if e.involved_object.name == name and e.reason == reason
        ]

    def install_katib_crds(self) -> None:
        """Katib's Experiment, Trial and Suggestion CRDs; returns once all three are served."""
        self.install_crds(
            [FIXTURES / f"crd-{name}.yaml" for name in ("experiment", "trial", "suggestion")],
            served=[
                ("kubeflow.org", "v1beta1", p) for p in ("experiments", "trials", "suggestions")
            ],
        )

    def install_training_crds(self) -> None:
        """The training-job CRDs of tests/fixtures/training (training-operator, JobSet, Volcano,
        Kueue's LocalQueue); returns once each is served."""
        self.install_crds(
            sorted(TRAINING_FIXTURES.glob("crd-*.yaml")),
            served=[
                ("kubeflow.org", "v1", "pytorchjobs"),
                ("kubeflow.org", "v1", "tfjobs"),
                ("kubeflow.org", "v1", "mpijobs"),
                ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
                ("batch.volcano.sh", "v1alpha1", "jobs"),
                ("kueue.x-k8s.io", "v1beta2", "localqueues"),
            ],
        )

    def install_crds(self, files: list[Path], *, served: list[tuple[str, str, str]]) -> None:
        """Create the CRDs of ``files`` (one that exists is kept) and wait until each
        ``(group, version, plural)`` of ``served`` is served."""
        for path in files:
            for doc in yaml.safe_load_all(path.read_text()):
                try:
                    self.ext.create_custom_resource_definition(doc)
                except ApiException as exc:
                    if exc.status != 409:
                        raise

        def is_served(group: str, version: str, plural: str) -> bool:
            try:
                self.custom.list_cluster_custom_object(group, version, plural)
            except ApiException as exc:  # a new CRD takes a moment to be served
                if exc.status != 404:
                    raise
                return False
            return True

        for group, version, plural in served:
            wait_until(
                f"{plural}.{group} served",
                functools.partial(is_served, group, version, plural),
                timeout=60,
            )

    def katib_experiment(self, namespace: str) -> dict[str, Any]:
        doc = yaml.safe_load((FIXTURES / "example-random.yaml").read_text())
        doc["metadata"]["namespace"] = namespace

        def created() -> dict[str, Any] | None:
            try:
                return custom_json(
                    self.custom.create_namespaced_custom_object(
                        "kubeflow.org", "v1beta1", namespace, "experiments", doc
                    )
                )
            except ApiException as exc:  # the CRD takes a moment to be served
                if exc.status != 404:
                    raise
                return None

        return wait_until("the Experiment CRD served", created, timeout=60)


def katib_trial(
    cluster: Cluster,
    *,
    namespace: str,
    experiment: dict[str, Any],
    name: str,
    parameters: dict[str, str],
) -> dict[str, Any]:
    """A Trial as Katib's Experiment controller makes one (``createTrial`` in
    pkg/controller.v1beta1/experiment: the experiment's label, its controller ownerReference,
    the suggestion's parameterAssignments), marked Running."""
    body = {
        "apiVersion": "kubeflow.org/v1beta1",
        "kind": "Trial",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"katib.kubeflow.org/experiment": experiment["metadata"]["name"]},
            "ownerReferences": [
                {
                    "apiVersion": "kubeflow.org/v1beta1",
                    "kind": "Experiment",
                    "name": experiment["metadata"]["name"],
                    "uid": experiment["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "parameterAssignments": [{"name": k, "value": v} for k, v in parameters.items()],
            "primaryContainerName": "training-container",
            "runSpec": {"apiVersion": "batch/v1", "kind": "Job"},
        },
    }
    return custom_json(
        cluster.custom.create_namespaced_custom_object(
            "kubeflow.org", "v1beta1", namespace, "trials", body
        )
    )


@contextlib.asynccontextmanager
async def synced_watcher(*, kubeconfig: Path, node: str) -> AsyncIterator[PodWatcher]:
    """A :class:`PodWatcher` of ``node`` running until the block ends, after its first list."""
    kube = KubeClient.load(kubeconfig=kubeconfig)
    watcher = PodWatcher(kube=kube, node_name=node)
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop=stop))
    try:
        await asyncio.wait_for(watcher.synced.wait(), 15)
        yield watcher
    finally:
        stop.set()
        await asyncio.wait_for(task, 40)
        kube.close()


def mirror_pod(cluster: Cluster, *, namespace: str, node: str) -> dict[str, object]:
    """The mirror Pod of the static pod kube-apiserver on ``node``, as the kubelet creates it,
    with the container ID its status reports."""
    name = f"kube-apiserver-{node}"
    cluster.core.create_namespaced_pod(
        namespace,
        client.V1Pod.model_validate(
            {
                "metadata": {
                    "name": name,
                    "annotations": {
                        "kubernetes.io/config.hash": UID_STATIC,
                        "kubernetes.io/config.mirror": UID_STATIC,
                        "kubernetes.io/config.source": "file",
                        "kubernetes.io/config.seen": "2026-11-30T06:00:00.000000000Z",
                    },
                },
                "spec": {
                    "nodeName": node,
                    "priorityClassName": "system-node-critical",
                    "containers": [
                        {
                            "name": "kube-apiserver",
                            "image": "registry.k8s.io/kube-apiserver:v1.35.0",
                            "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}},
                        }
                    ],
                },
            }
        ),
    )
    cluster.core.patch_namespaced_pod_status(
        name,
        namespace,
        {
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "kube-apiserver",
                        "containerID": f"containerd://{CID[5]}",
                        "image": "registry.k8s.io/kube-apiserver:v1.35.0",
                        "imageID": "",
                        "ready": True,
                        "restartCount": 0,
                        "state": {"running": {}},
                    }
                ],
            }
        },
    )
    pod = cluster.pod_json(namespace, name)
    assert pod is not None
    return pod
