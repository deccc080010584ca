"""What the checks read: the cluster's nodes, pods, ResourceQuotas and LimitRanges as plain,
frozen types, read once (:mod:`nodeguard.doctor.read`) and never fetched again by a check.

Memory amounts are bytes; ``None`` is "not set" (a LimitRange without a ``max.memory``, a
quota without ``limits.memory``), never 0. A pod's request and limits are nodeguard's one
computation of them (:mod:`nodeguard.kube.resources`: component-helpers ``PodRequests`` /
``PodLimits``), carried in its :class:`~nodeguard.snapshot.PodMeta`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from nodeguard.doctor.agent_inputs import AgentRules, AgentView, KubeletConfigView
from nodeguard.doctor.katib_inputs import KatibInputs
from nodeguard.doctor.quota_scopes import PodScope, ScopeRequirement
from nodeguard.doctor.training_inputs import TrainingInputs
from nodeguard.snapshot import NodeMeta, PodMeta

__all__ = [
    "Cluster",
    "ContainerView",
    "LimitItem",
    "LimitRangeView",
    "NodeView",
    "PodView",
    "QuotaView",
]

ContainerKind = Literal["container", "init", "sidecar"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerView:
    """One container of a pod's spec: ``kind`` is ``init`` for a plain init container,
    ``sidecar`` for a restartable one (``restartPolicy: Always``), ``container`` otherwise;
    its own ``resources.requests.memory`` / ``limits.memory`` in bytes (``None``: not set)."""

    name: str
    kind: ContainerKind
    memory_request_bytes: int | None
    memory_limit_bytes: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PodView:
    """A pod: its :class:`PodMeta` (request, limit, QoS, phase), ``limits_sum`` (``PodLimits``
    whether or not the pod cgroup is bounded, as ``kubectl describe node`` sums it), its
    containers, the ``nvidia.com/gpu`` it requests (summed over its containers' limits, the
    device plugin's extended resource) and whether it is a training pod (its owner is a
    Kubeflow training job or it carries a Katib trial, training-operator, JobSet or Volcano
    job label). ``scope`` is what a scoped ResourceQuota looks at
    (:mod:`~nodeguard.doctor.quota_scopes`)."""

    meta: PodMeta
    limits_sum: int
    containers: tuple[ContainerView, ...]
    gpus: int
    training: bool
    scope: PodScope | None = None
    #: ``spec.schedulerName`` (the API server defaults it to ``default-scheduler``).
    scheduler_name: str = "default-scheduler"

    @property
    def controller(self) -> str | None:
        """``Kind name`` of its controlling owner (``ReplicaSet web-5d9``), ``None`` for a pod
        no controller recreates (deleted, it is gone for good)."""
        owner = next((o for o in self.meta.owners if o.controller), None)
        return f"{owner.kind} {owner.name}" if owner else None

    @property
    def workload(self) -> str:
        """``kind/name`` of its controller (``replicaset/web-5d9``), else ``pod/<name>``."""
        owner = next((o for o in self.meta.owners if o.controller), None)
        return f"{owner.kind.lower()}/{owner.name}" if owner else f"pod/{self.meta.name}"


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeView:
    """A node: its :class:`NodeMeta` (allocatable and capacity memory, huge pages), the
    ``nvidia.com/gpu`` of its capacity (0 when none) and whether it carries the GPU feature
    discovery label ``nvidia.com/gpu.present=true``."""

    meta: NodeMeta
    gpus: int
    gpu_label: bool

    @property
    def name(self) -> str:
        return self.meta.name


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaView:
    """A ResourceQuota: its ``spec.hard`` memory in bytes (``requests.memory``, or ``memory``
    which means the same, the smaller when both; ``limits.memory``) and whether it is scoped
    (``spec.scopes`` or ``spec.scopeSelector``: it then applies to some pods only), and
    those scopes (:func:`~nodeguard.doctor.quota_scopes.quota_matches` decides a pod)."""

    namespace: str
    name: str
    hard_requests_memory: int | None
    hard_limits_memory: int | None
    scoped: bool
    scopes: tuple[ScopeRequirement, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitItem:
    """One ``spec.limits[]`` entry of a LimitRange, its memory in bytes (as stored: the API
    server has already filled ``default`` from ``max`` and ``defaultRequest`` from ``default``
    or ``min``, pkg/apis/core/v1/defaults.go ``SetDefaults_LimitRangeItem``)."""

    type: str
    min: int | None
    max: int | None
    default: int | None
    default_request: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitRangeView:
    """A LimitRange and its entries."""

    namespace: str
    name: str
    items: tuple[LimitItem, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """Everything the checks read. ``nodes`` are those in scope (``--node``, else every node,
    or with ``--namespace`` alone those running a pod of those namespaces); ``pods`` are every
    pod of those nodes (a node's sums need them all) and, with ``--namespace``, the pods of
    those namespaces not yet on a node; ``namespaces`` is the ``--namespace`` scope, or with
    ``--node`` alone the namespaces of those nodes' pods (empty: all). ``quotas`` and
    ``limit_ranges`` are those of the namespaces in scope."""

    nodes: tuple[NodeView, ...]
    pods: tuple[PodView, ...]
    quotas: tuple[QuotaView, ...]
    limit_ranges: tuple[LimitRangeView, ...]
    namespaces: frozenset[str] = frozenset()
    #: The nodeguard agents' pods, the rules of their ConfigMaps, the kubelets' configz by
    #: node, and what could not be read (:mod:`~nodeguard.doctor.agent_inputs`).
    agents: tuple[AgentView, ...] = ()
    agent_rules: tuple[AgentRules, ...] = ()
    kubelet_configs: tuple[KubeletConfigView, ...] = ()
    #: The Katib Experiments of the namespaces in scope and the nodes' labels.
    katib: KatibInputs = field(default_factory=KatibInputs)
    #: The training jobs of the namespaces in scope and the PriorityClasses.
    training: TrainingInputs = field(default_factory=TrainingInputs)
    notes: tuple[str, ...] = ()
    # The pods holding resources by node, indexed once: each node check asks for every node's
    # pods, and a scan of every pod per node made the checks quadratic (docs/benchmarks.md,
    # "nodeguard doctor": 200 nodes and 10,000 pods).
    _on_node: Mapping[str, tuple[PodView, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        on_node: dict[str, list[PodView]] = {}
        for p in self.pods:
            if not p.meta.finished:
                on_node.setdefault(p.meta.node_name, []).append(p)
        object.__setattr__(self, "_on_node", {n: tuple(ps) for n, ps in on_node.items()})

    def in_scope(self, namespace: str) -> bool:
        """Whether a namespace is one the run was asked about."""
        return not self.namespaces or namespace in self.namespaces

    def kubelet_config(self, node: str) -> KubeletConfigView | None:
        """``node``'s kubelet configuration, ``None`` when it was not read."""
        return next((k for k in self.kubelet_configs if k.node == node), None)

    def pods_on(self, node: str) -> list[PodView]:
        """The pods bound to ``node`` that hold resources (neither Succeeded nor Failed), in
        the order of ``pods``."""
        return list(self._on_node.get(node, ()))
