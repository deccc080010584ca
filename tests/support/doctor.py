"""Typed inputs for the ``nodeguard doctor`` checks, built from Node/Pod/ResourceQuota/
LimitRange JSON shaped as the API server returns it, through the doctor's own reader functions
(:mod:`nodeguard.doctor.read`), so the tests exercise nodeguard's request/limit arithmetic."""

from __future__ import annotations

from typing import Any

from nodeguard.doctor.agent_inputs import AgentRules
from nodeguard.doctor.inputs import Cluster, LimitRangeView, NodeView, PodView, QuotaView
from nodeguard.doctor.read import limit_range_view, node_view, pod_view, quota_view
from nodeguard.doctor.read_training import job_view, priority_class_view
from nodeguard.doctor.training_inputs import TrainingInputs

GiB = 2**30
MiB = 2**20


def node(
    name: str,
    *,
    memory: str = "64Gi",
    allocatable: str | None = None,
    gpus: int = 0,
    labels: dict[str, str] | None = None,
    hugepages: str | None = None,
) -> NodeView:
    capacity: dict[str, str] = {"memory": memory, "cpu": "16"}
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
    if hugepages:
        capacity["hugepages-1Gi"] = hugepages
    alloc = {**capacity, "memory": allocatable or memory}
    return node_view(
        {
            "metadata": {"name": name, "labels": labels or {}},
            "status": {"capacity": capacity, "allocatable": alloc},
        }
    )


def container(
    name: str = "main",
    *,
    request: str | None = None,
    limit: str | None = None,
    gpus: int = 0,
    restart_policy: str | None = None,
) -> dict[str, Any]:
    resources: dict[str, dict[str, str]] = {}
    if request:
        resources["requests"] = {"memory": request}
    if limit:
        resources["limits"] = {"memory": limit}
    if gpus:
        resources.setdefault("limits", {})["nvidia.com/gpu"] = str(gpus)
    doc: dict[str, Any] = {"name": name, "image": "pause", "resources": resources}
    if restart_policy:
        doc["restartPolicy"] = restart_policy
    return doc


def pod(
    name: str,
    *,
    node: str,
    namespace: str = "ml",
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    qos: str = "Burstable",
    phase: str = "Running",
    labels: dict[str, str] | None = None,
    owner: tuple[str, str] | None = None,
    pod_limit: str | None = None,
    spec_extra: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    priority: int | None = None,
    priority_class: str | None = None,
) -> PodView:
    spec: dict[str, Any] = {"nodeName": node, "containers": containers or [container()]}
    if priority is not None:  # as the Priority admission plugin resolves it
        spec["priority"] = priority
    if priority_class:
        spec["priorityClassName"] = priority_class
    spec.update(spec_extra or {})
    if init:
        spec["initContainers"] = init
    if pod_limit:
        spec["resources"] = {"limits": {"memory": pod_limit}}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    if owner:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    return pod_view({"metadata": meta, "spec": spec, "status": {"phase": phase, "qosClass": qos}})


def quota(
    name: str,
    *,
    namespace: str = "ml",
    hard: dict[str, str],
    scoped: bool = False,
    spec_extra: dict[str, Any] | None = None,
) -> QuotaView:
    spec: dict[str, Any] = {"hard": hard}
    if scoped:
        spec["scopes"] = ["NotBestEffort"]
    spec.update(spec_extra or {})
    return quota_view({"metadata": {"name": name, "namespace": namespace}, "spec": spec})


def limit_range(
    name: str, *, namespace: str = "ml", limits: list[dict[str, Any]]
) -> LimitRangeView:
    return limit_range_view(
        {"metadata": {"name": name, "namespace": namespace}, "spec": {"limits": limits}}
    )


def cluster(
    *,
    nodes: tuple[NodeView, ...] = (),
    pods: tuple[PodView, ...] = (),
    quotas: tuple[QuotaView, ...] = (),
    limit_ranges: tuple[LimitRangeView, ...] = (),
    namespaces: frozenset[str] = frozenset(),
    training: TrainingInputs | None = None,
    agent_rules: tuple[AgentRules, ...] = (),
) -> Cluster:
    return Cluster(
        nodes=nodes,
        pods=pods,
        quotas=quotas,
        limit_ranges=limit_ranges,
        namespaces=namespaces,
        training=training or TrainingInputs(),
        agent_rules=agent_rules,
    )


def pod_template(
    *,
    priority_class: str | None = None,
    scheduler: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod template as a training job's replica spec holds it."""
    spec: dict[str, Any] = {"containers": [container(request="1Gi", limit="1Gi")]}
    if priority_class:
        spec["priorityClassName"] = priority_class
    if scheduler:
        spec["schedulerName"] = scheduler
    meta: dict[str, Any] = {}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": spec}


def pytorchjob(
    name: str,
    *,
    namespace: str = "ml",
    workers: int = 3,
    template: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    run_policy: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
    owner: str | None = None,
) -> dict[str, Any]:
    """A PyTorchJob (kubeflow.org/v1) of one Master and ``workers`` Workers."""
    tpl = template or pod_template()
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": name, "controller": True}]
    spec: dict[str, Any] = {
        "pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": tpl},
            "Worker": {"replicas": workers, "template": tpl},
        }
    }
    if run_policy is not None:
        spec["runPolicy"] = run_policy
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": meta,
        "spec": spec,
        "status": status or {},
    }


def training(*jobs: dict[str, Any], classes: list[dict[str, Any]] | None = None) -> TrainingInputs:
    """Training inputs from job objects (each read as its ``kind``) and PriorityClasses
    (``None``: not read)."""
    return TrainingInputs(
        jobs=tuple(job_view(j, kind=j["kind"], api_version=j["apiVersion"]) for j in jobs),
        priority_classes=None
        if classes is None
        else tuple(priority_class_view(c) for c in classes),
    )


def priority_class(name: str, value: int, *, default: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": name}, "value": value, "globalDefault": default}
