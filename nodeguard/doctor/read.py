"""Reading the cluster once for the checks: Nodes, Pods, ResourceQuotas and LimitRanges through
:class:`~nodeguard.kube.client.KubeClient` (list and get only: the RBAC of
``docs/doctor-rbac.yaml``), turned into :mod:`nodeguard.doctor.inputs` by pure functions of
the JSON the API returns, with nodeguard's own parsers (:func:`nodeguard.kube.objects.pod_meta`,
:func:`~nodeguard.kube.objects.node_meta`, :func:`nodeguard.kube.resources.pod_memory`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nodeguard.doctor.inputs import (
    Cluster,
    ContainerKind,
    ContainerView,
    LimitItem,
    LimitRangeView,
    NodeView,
    PodView,
    QuotaView,
)
from nodeguard.doctor.katib_inputs import KatibInputs
from nodeguard.doctor.quota_scopes import pod_scope, scope_requirements
from nodeguard.doctor.read_agents import AgentFlags, read_agents
from nodeguard.doctor.read_katib import read_katib
from nodeguard.doctor.read_kubelet import read_kubelet_configs
from nodeguard.doctor.read_training import read_training
from nodeguard.doctor.training_inputs import TrainingInputs
from nodeguard.kube.client import KubeClient
from nodeguard.kube.objects import node_meta, parse_bytes, pod_meta
from nodeguard.kube.resources import memory_bytes, pod_memory

__all__ = ["limit_range_view", "node_view", "pod_view", "quota_view", "read_cluster"]

JSON = dict[str, Any]
GPU = "nvidia.com/gpu"
GPU_LABEL = "nvidia.com/gpu.present"
#: Controllers whose pods are training (Kubeflow training-operator v1 and trainer v2, JobSet).
TRAINING_OWNERS = frozenset(
    {"TFJob", "PyTorchJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob", "TrainJob", "JobSet"}
)
#: Labels that the training controllers put on their pods.
TRAINING_LABELS = (
    "training.kubeflow.org/job-name",
    "katib.kubeflow.org/trial",
    "jobset.sigs.k8s.io/jobset-name",
    "volcano.sh/job-name",
)


def _count(resources: JSON | None, name: str) -> int:
    value = (resources or {}).get(name)
    try:
        return int(parse_bytes(str(value))) if value is not None else 0
    except ValueError:
        return 0


def pod_view(pod: JSON) -> PodView:
    """A :class:`PodView` from a Pod object."""
    spec = pod.get("spec") or {}
    containers: list[ContainerView] = []
    gpus = 0
    for key in ("initContainers", "containers"):
        for c in spec.get(key) or []:
            resources = c.get("resources") or {}
            kind: ContainerKind = "container"
            if key == "initContainers":
                kind = "sidecar" if c.get("restartPolicy") == "Always" else "init"
            containers.append(
                ContainerView(
                    name=c.get("name", ""),
                    kind=kind,
                    memory_request_bytes=memory_bytes(resources.get("requests")),
                    memory_limit_bytes=memory_bytes(resources.get("limits")),
                )
            )
            gpus += _count(resources.get("limits"), GPU) or _count(resources.get("requests"), GPU)
    meta = pod_meta(pod)
    return PodView(
        meta=meta,
        limits_sum=pod_memory(pod).limits_sum,
        containers=tuple(containers),
        gpus=gpus,
        training=any(o.kind in TRAINING_OWNERS for o in meta.owners)
        or any(label in meta.labels for label in TRAINING_LABELS),
        scope=pod_scope(pod, best_effort=meta.qos_class == "besteffort"),
        scheduler_name=str(spec.get("schedulerName") or "default-scheduler"),
    )


def node_view(node: JSON) -> NodeView:
    """A :class:`NodeView` from a Node object."""
    status = node.get("status") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    return NodeView(
        meta=node_meta(node),
        gpus=max(_count(status.get("capacity"), GPU), _count(status.get("allocatable"), GPU)),
        gpu_label=labels.get(GPU_LABEL) == "true",
    )


def quota_view(quota: JSON) -> QuotaView:
    """A :class:`QuotaView` from a ResourceQuota object."""
    meta, spec = quota.get("metadata") or {}, quota.get("spec") or {}
    hard = spec.get("hard") or {}
    requests = [
        v
        for k in ("requests.memory", "memory")
        if (v := memory_bytes({"memory": hard.get(k)})) is not None
    ]
    return QuotaView(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        hard_requests_memory=min(requests) if requests else None,
        hard_limits_memory=memory_bytes({"memory": hard.get("limits.memory")}),
        scoped=bool(spec.get("scopes") or spec.get("scopeSelector")),
        scopes=scope_requirements(spec),
    )


def limit_range_view(limit_range: JSON) -> LimitRangeView:
    """A :class:`LimitRangeView` from a LimitRange object."""
    meta = limit_range.get("metadata") or {}
    return LimitRangeView(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        items=tuple(
            LimitItem(
                type=item.get("type", ""),
                min=memory_bytes(item.get("min")),
                max=memory_bytes(item.get("max")),
                default=memory_bytes(item.get("default")),
                default_request=memory_bytes(item.get("defaultRequest")),
            )
            for item in (limit_range.get("spec") or {}).get("limits") or []
        ),
    )


async def read_cluster(
    kube: KubeClient,
    *,
    namespaces: Sequence[str] = (),
    nodes: Sequence[str] = (),
    agent_flags: AgentFlags | None = None,
    kubelet_configz: bool = True,
) -> Cluster:
    """Read what the checks need, scoped as :class:`~nodeguard.doctor.inputs.Cluster` says.
    ``agent_flags`` parses a nodeguard agent's arguments (``None``: agents are found but their
    flags and rules not read); ``kubelet_configz`` reads each node's kubelet configuration
    (:mod:`~nodeguard.doctor.read_kubelet`). A ``--node`` or ``--namespace`` that does not
    exist raises :class:`~nodeguard.kube.errors.NotFound` (a misspelt namespace would
    otherwise read as an empty, clean one); API failures raise :mod:`nodeguard.kube.errors`
    types (a refused ConfigMap or configz read is a note instead)."""
    for ns in namespaces:
        await kube.get_namespace(name=ns)
    if nodes:
        node_docs = [await kube.get_node(name=n) for n in nodes]
        pod_docs = [p for n in nodes for p in (await kube.list_pods(node_name=n))[0]]
    else:
        node_docs = await kube.list_nodes()
        pod_docs = (await kube.list_pods())[0]
    if namespaces:
        if not nodes:  # the nodes those namespaces' pods run on
            used = {
                (p.get("spec") or {}).get("nodeName")
                for p in pod_docs
                if (p.get("metadata") or {}).get("namespace") in namespaces
            }
            node_docs = [n for n in node_docs if n.get("metadata", {}).get("name") in used]
        quotas = [q for ns in namespaces for q in await kube.list_resource_quotas(namespace=ns)]
        ranges = [r for ns in namespaces for r in await kube.list_limit_ranges(namespace=ns)]
    else:
        quotas = await kube.list_resource_quotas()
        ranges = await kube.list_limit_ranges()
        if nodes:  # the namespaces of those nodes' pods
            namespaces = sorted({(p.get("metadata") or {}).get("namespace", "") for p in pod_docs})
            quotas = [q for q in quotas if q.get("metadata", {}).get("namespace") in namespaces]
            ranges = [r for r in ranges if r.get("metadata", {}).get("namespace") in namespaces]
    agents, agent_rules, agent_notes = await read_agents(
        kube, pod_docs, flags=agent_flags or _no_flags
    )
    names = [str((n.get("metadata") or {}).get("name", "")) for n in node_docs]
    configs, config_notes = await read_kubelet_configs(kube, names) if kubelet_configz else ((), ())
    if nodes and not namespaces:
        # --node alone, on nodes that run no pod: no namespace is in scope (an empty list
        # would read every namespace's Experiments and jobs).
        katib, training = KatibInputs(), TrainingInputs()
        katib_notes: tuple[str, ...] = ()
        training_notes: tuple[str, ...] = ()
    else:
        katib, katib_notes = await read_katib(kube, namespaces=namespaces, nodes=node_docs)
        training, training_notes = await read_training(
            kube, namespaces=namespaces, experiments=katib.experiments
        )
    return Cluster(
        nodes=tuple(node_view(n) for n in node_docs),
        pods=tuple(pod_view(p) for p in pod_docs),
        quotas=tuple(quota_view(q) for q in quotas),
        limit_ranges=tuple(limit_range_view(r) for r in ranges),
        namespaces=frozenset(namespaces),
        agents=agents,
        agent_rules=agent_rules,
        kubelet_configs=configs,
        katib=katib,
        training=training,
        notes=(*agent_notes, *config_notes, *katib_notes, *training_notes),
    )


def _no_flags(_args: Sequence[str]) -> None:
    return None
