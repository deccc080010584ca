"""Check ``node-reserve``: nodes whose kubelet keeps (almost) nothing back from the pods.

The kubelet reports ``status.allocatable.memory`` = ``capacity.memory`` - pre-allocated huge
pages - (``systemReserved`` + ``kubeReserved`` + the hard eviction threshold)
(pkg/kubelet/cm/node_container_manager_linux.go ``GetNodeAllocatableReservation``,
pkg/kubelet/nodestatus/setters.go ``MachineInfo``). The default hard threshold is
``memory.available<100Mi`` (pkg/kubelet/eviction/defaults_linux.go) and nothing else is reserved
by default, so from the node's status alone:

- reserved = 0 (allocatable equal to capacity less huge pages): an **error**: not even an
  eviction threshold; when pods fill the node the kernel's OOM killer, not the kubelet, chooses
  the victim, and the kubelet and the container runtime compete with them for memory;
- reserved ≤ 100 MiB: a **warning**: at most the default eviction threshold, no
  ``systemReserved`` or ``kubeReserved``, a tiny fraction of a large GPU node.

The fix is a KubeletConfiguration fragment: ``kubeReserved`` by the table GKE documents
(:func:`kube_reserved_mib`), 1 GiB ``systemReserved``, and a hard eviction threshold of 1 % of
the node's memory (at least the default 100 MiB): starting values to size, not measurements.

Where the kubelet's running configuration was read (``configz`` through the API server's node
proxy, :mod:`~nodeguard.doctor.read_kubelet`), the eviction threshold is told from the reserves:

- no ``memory.available`` in ``evictionHard`` (setting one threshold drops the defaults): a
  **warning**: the kubelet never evicts for memory;
- a hard threshold below 1 % of the node's memory (the default ``100Mi`` on a 1 TiB node; a
  percentage is of ``capacity.memory``, pkg/kubelet/eviction/helpers.go
  ``GetThresholdQuantity``): a **warning**: the kubelet evicts when the node is all but full;
- neither ``systemReserved`` nor ``kubeReserved`` memory: a **warning** (as above).

Without it (the RBAC refused, the kubelet unreachable: the reader's note says so once) the
default threshold is assumed, as above. A node without capacity or allocatable memory is
skipped.
"""

from __future__ import annotations

from collections.abc import Iterator

from nodeguard.doctor.agent_inputs import KubeletConfigView
from nodeguard.doctor.findings import Fact, Finding, ObjectRef
from nodeguard.doctor.inputs import Cluster, NodeView
from nodeguard.doctor.registry import Check, register
from nodeguard.kube.objects import parse_bytes

__all__ = ["eviction_bytes"]

DEFAULT_EVICTION_BYTES = 100 * 2**20

FIX = """\
# in /var/lib/kubelet/config.yaml (the KubeletConfiguration),
# then restart the kubelet. One evictionHard entry drops the
# other defaults (kubelet reference, "Eviction thresholds"):
# the disk ones are written out to keep them.
systemReserved:
  memory: 1Gi
kubeReserved:
  memory: {kube}Mi
evictionHard:
  memory.available: {eviction}Mi
  nodefs.available: 10%
  imagefs.available: 15%
  nodefs.inodesFree: 5%
  imagefs.inodesFree: 5%"""


def eviction_bytes(threshold: str, *, capacity: int) -> int | None:
    """An ``evictionHard`` ``memory.available`` value in bytes: a quantity, or a percentage of
    ``capacity``; ``None`` when it is neither."""
    text = threshold.strip()
    try:
        if text.endswith("%"):
            return int(float(text[:-1]) / 100 * capacity)
        return int(parse_bytes(text))
    except ValueError:
        return None


def _configured(node: NodeView, config: KubeletConfigView) -> Iterator[Finding]:
    """The findings of a node whose kubelet configuration was read."""
    usable, allocatable = node.meta.usable_memory_bytes, node.meta.allocatable_memory_bytes
    capacity = node.meta.capacity_memory_bytes
    if usable is None or allocatable is None or capacity is None:
        return
    if usable - allocatable <= 0:
        yield from _from_status(node)
        return
    threshold = config.eviction_memory_available
    hard = eviction_bytes(threshold, capacity=capacity) if threshold else None
    problems = []
    if threshold is None:
        problems.append("no hard memory eviction threshold")
    elif hard is not None and hard < usable // 100:
        problems.append(f"hard eviction at memory.available<{threshold}, under 1 % of the node")
    if not config.system_reserved_bytes and not config.kube_reserved_bytes:
        problems.append("nothing in systemReserved or kubeReserved")
    if not problems:
        return
    yield Finding(
        check="node-reserve",
        severity="warning",
        title=f"node {node.name}: " + "; ".join(problems),
        objects=(ObjectRef(kind="Node", namespace="", name=node.name),),
        evidence=(
            Fact(label="capacity", bytes=capacity),
            Fact(label="allocatable", bytes=allocatable),
            Fact(label="evictionHard memory.available", text=threshold or "not set"),
            Fact(label="systemReserved", bytes=config.system_reserved_bytes),
            Fact(label="kubeReserved", bytes=config.kube_reserved_bytes),
            Fact(label="source", text="the kubelet's configz"),
        ),
        fix=FIX.format(kube=kube_reserved_mib(usable), eviction=max(100, usable // 100 // 2**20)),
    )


def _findings(cluster: Cluster) -> Iterator[Finding]:
    for node in cluster.nodes:
        config = cluster.kubelet_config(node.name)
        if config is not None:
            yield from _configured(node, config)
        else:
            yield from _from_status(node)


def _from_status(node: NodeView) -> Iterator[Finding]:
    """The findings of a node from its status alone (the default eviction threshold)."""
    usable, allocatable = node.meta.usable_memory_bytes, node.meta.allocatable_memory_bytes
    if usable is None or allocatable is None:
        return
    reserved = usable - allocatable
    if reserved > DEFAULT_EVICTION_BYTES:
        return
    nothing = reserved <= 0
    yield Finding(
        check="node-reserve",
        severity="error" if nothing else "warning",
        title=(
            f"node {node.name} reserves no memory: allocatable equals capacity"
            if nothing
            else f"node {node.name} reserves only the default eviction threshold"
        ),
        objects=(ObjectRef(kind="Node", namespace="", name=node.name),),
        evidence=(
            Fact(label="capacity", bytes=node.meta.capacity_memory_bytes),
            Fact(label="huge pages", bytes=node.meta.capacity_hugepages_bytes),
            Fact(label="allocatable", bytes=allocatable),
            Fact(label="reserved", bytes=max(0, reserved)),
        ),
        fix=FIX.format(kube=kube_reserved_mib(usable), eviction=max(100, usable // 100 // 2**20)),
    )


def kube_reserved_mib(capacity: int) -> int:
    """A ``kubeReserved`` memory for a node of ``capacity`` bytes, in MiB, by the table GKE
    documents for its nodes ("Node allocatable", cloud.google.com/kubernetes-engine/docs/
    concepts/plan-node-sizes): 25 % of the first 4 GiB, 20 % of the next 4, 10 % of the next 8,
    6 % of the next 112 and 2 % of the rest."""
    gib, left, total = 2**30, capacity, 0.0
    for size, share in ((4 * gib, 0.25), (4 * gib, 0.20), (8 * gib, 0.10), (112 * gib, 0.06)):
        part = min(left, size)
        total += part * share
        left -= part
    total += max(0, left) * 0.02
    return int(total // 2**20)


register(
    Check(
        id="node-reserve",
        title="nodes that reserve no memory for the system (node status)",
        run=_findings,
        scope="node",
        severities=("warning", "error"),
    )
)
