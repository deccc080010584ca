"""What an ``evict`` would evict, by the scope of the rule that fired: the ranked plan
(:mod:`nodeguard.actions.ranking`), the target in bytes and what each pod's eviction frees.

- ``gpu``: the pods using the device, from the snapshot; ``free`` a share of the GPU's memory.
- ``pod`` / ``container``: the pod's own unit alone; ``free`` a share of the node's usable
  memory (default: the whole unit).
- ``node``: every candidate of the node; ``free`` defaults to ``5%`` of its usable memory.

A pod's usage is its unreclaimable memory (the working set where memory.stat lacks what that is
made of), from the snapshot when it is this node's, else from the caller's usage mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from nodeguard.actions.args import MemoryAmount, parse_amount
from nodeguard.actions.ranking import (
    EvictFilter,
    EvictionPlan,
    gpu_eviction_plan,
    plan_eviction,
    usage_measure,
)
from nodeguard.kube.client import KubeClient
from nodeguard.kube.objects import node_meta, pod_meta
from nodeguard.snapshot import NodeSnapshot, PodMeta

if TYPE_CHECKING:
    from nodeguard.actions.context import Call

__all__ = ["DEFAULT_NODE_FREE", "Victims", "victims"]

#: A node rule's ``free`` when it names none: 5 % of the node's usable memory.
DEFAULT_NODE_FREE = "5%"


class Victims(NamedTuple):
    """The plan, the target in bytes (``None``: it cannot be known; 0: the first unit alone)
    and the pods' usage by UID in bytes (what their eviction frees)."""

    plan: EvictionPlan
    target: int | None
    usage: dict[str, int]


class _NodePods(NamedTuple):
    """The node's pods by UID, their usage in bytes, the words for it, and the node's usable
    memory in bytes (``None``: unknown here)."""

    pods: dict[str, PodMeta]
    usage: dict[str, int]
    measure: str
    mem_total: int | None


_NONE = Victims(plan=EvictionPlan(ranked=()), target=None, usage={})


def _freed_by(unreclaimable: int | None, working_set: int | None) -> int | None:
    return unreclaimable if unreclaimable is not None else working_set


def _gpu_scope(
    snap: NodeSnapshot | None, target: str, free: MemoryAmount | None, flt: EvictFilter
) -> Victims:
    """The pods using GPU ``target`` of the snapshot; nothing where the snapshot lacks it."""
    if snap is None or snap.gpu is None or snap.pod_meta is None:
        return _NONE
    device = next((d for d in snap.gpu.devices if d.key == target), None)
    if device is None:
        return _NONE
    plan, usage = gpu_eviction_plan(snapshot=snap, device=device, flt=flt)
    if free is None:
        return Victims(plan=plan, target=0, usage=usage)
    total = device.memory.total_bytes if device.memory is not None else None
    return Victims(plan=plan, target=free.of(total), usage=usage)


async def _node_pods(call: Call, kube: KubeClient, snap: NodeSnapshot | None) -> _NodePods:
    """The node's pods: the snapshot's where it is this node's, else the API's (and the
    caller's usage mapping). Raises :class:`~nodeguard.kube.errors.KubeError`."""
    if snap is not None and snap.pod_meta is not None:
        # What evicting a pod frees is its unreclaimable memory: its page cache, counted in
        # the working set, the kernel would reclaim anyway (nodeguard.sources.unreclaimable).
        # The working set stands in where memory.stat lacks the lines it is made from.
        usage = {
            p.uid: u
            for p in snap.pods
            if (u := _freed_by(p.memory.unreclaimable_bytes, p.memory.working_set_bytes))
            is not None
        }
        exact = sum(1 for p in snap.pods if p.memory.unreclaimable_bytes is not None)
        # Usable, not MemTotal: 5 % of a node that is 90 % huge pages is more than its regular
        # memory, and no eviction frees a huge page of the pool.
        return _NodePods(
            pods=dict(snap.pod_meta),
            usage=usage,
            measure=usage_measure(unreclaimable=exact, working_set=len(usage) - exact),
            mem_total=snap.meminfo.usable_bytes if snap.meminfo else None,
        )
    items, _ = await kube.list_pods(node_name=call.firing.node)
    return _NodePods(
        pods={m.uid: m for m in (pod_meta(p) for p in items)},
        usage=dict(call.env.usage),
        measure=call.env.usage_measure,
        mem_total=None,
    )


def _pod_scope(call: Call, plan: EvictionPlan, pods: Mapping[str, PodMeta]) -> EvictionPlan:
    """The unit of the firing's pod alone; ``not_found`` says why where it is not a candidate."""
    firing = call.firing
    uid = firing.pod_uid or next(
        (m.uid for m in pods.values() if (m.namespace, m.name) == firing.pod_ref), None
    )
    mine = tuple((u, w) for u, w in plan.ranked if any(p.uid == uid for p in u.pods))
    return EvictionPlan(
        ranked=mine,
        excluded=plan.excluded,
        measure=plan.measure,
        not_found=""
        if mine
        else next(
            (e.reason for e in plan.excluded if e.pod.uid == uid),
            "not in this node's pod list",
        ),
    )


async def _node_target(
    call: Call, kube: KubeClient, free: MemoryAmount | None, mem_total: int | None
) -> int | None:
    """A node rule's target in bytes: ``free`` (default 5 %) of the node's usable memory."""
    free = free or parse_amount(DEFAULT_NODE_FREE)
    if free.fraction is not None and mem_total is None:
        # Another node's usable memory: the kubelet reports MemTotal as status.capacity.memory
        # (pkg/kubelet/nodestatus MachineInfo, from cAdvisor's MemoryCapacity) and each size's
        # pre-allocated huge pages as capacity hugepages-<size>, which it takes out of
        # allocatable memory there too. HardwareCorrupted is not in the API.
        node = await kube.get_node(name=call.firing.node)
        mem_total = node_meta(node).usable_memory_bytes
    return free.of(mem_total)


async def victims(call: Call, *, free: MemoryAmount | None, flt: EvictFilter) -> Victims:
    """What the firing of ``call`` would evict, by its scope (see the module); ``free``: the
    rule's ``free`` (``None``: the scope's default), ``flt``: which pods may be evicted. Raises
    :class:`~nodeguard.kube.errors.KubeError` when the pods or the node cannot be read."""
    firing, kube = call.firing, call.api()
    snap = firing.snapshot if firing.snapshot and firing.snapshot.node_name == firing.node else None
    if firing.scope == "gpu":
        return _gpu_scope(snap, firing.target, free, flt)
    node = await _node_pods(call, kube, snap)
    plan = plan_eviction(pods=node.pods, usage=node.usage, flt=flt, measure=node.measure)
    if firing.scope in ("pod", "container"):
        plan = _pod_scope(call, plan, node.pods)
        return Victims(
            plan=plan, target=0 if free is None else free.of(node.mem_total), usage=node.usage
        )
    return Victims(
        plan=plan, target=await _node_target(call, kube, free, node.mem_total), usage=node.usage
    )
