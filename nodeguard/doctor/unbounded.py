"""Check ``unbounded-memory``: pods with no memory limit on nodes with GPUs or training.

A pod's cgroup gets a memory limit only when every container's value, as ``PodLimits`` gives
it to its ``ContainerFn`` (an init container's with the sidecars started before it), has a
non-zero memory limit, or the pod-level ``spec.resources.limits`` names memory
(pkg/kubelet/cm/helpers_linux.go ``ResourceConfigForPod``; nodeguard's
:mod:`nodeguard.kube.resources` computes it: ``PodMeta.memory_limit_bytes`` is ``None`` then).
Such a pod, and each container without a limit of its own, can grow until the node runs out;
on a GPU node that is the training job's host memory (pinned buffers, data loaders) that the
kernel's OOM killer or the kubelet's eviction takes back. A BestEffort pod (no request and no
limit on any container, pkg/apis/core/v1/helper/qos ``GetPodQOS``) is also invisible to the
scheduler's memory fit (it requests nothing).

A node "has GPUs" when its ``status.capacity`` or ``allocatable`` names ``nvidia.com/gpu``
(the NVIDIA device plugin's extended resource) or it carries the GPU feature discovery label
``nvidia.com/gpu.present=true``; it "runs training" when a pod on it requests ``nvidia.com/gpu``
or is a training pod (:class:`~nodeguard.doctor.inputs.PodView`). Not a finding: a pod with a
limit on every container, or with a pod-level limit; finished pods; nodes without either.
"""

from __future__ import annotations

from collections.abc import Iterator

from nodeguard.doctor.findings import Fact, Finding, ObjectRef
from nodeguard.doctor.inputs import Cluster, NodeView, PodView
from nodeguard.doctor.registry import Check, register

__all__ = ["gpu_or_training"]


def gpu_or_training(node: NodeView, pods: list[PodView]) -> str | None:
    """Why ``node`` counts as a GPU or training node (the evidence's words); ``None`` if not."""
    if node.gpus:
        return f"{node.gpus} nvidia.com/gpu"
    if node.gpu_label:
        return "label nvidia.com/gpu.present=true"
    if any(p.gpus for p in pods):
        return "runs pods requesting nvidia.com/gpu"
    if any(p.training for p in pods):
        return "runs training pods"
    return None


def _findings(cluster: Cluster) -> Iterator[Finding]:
    for node in cluster.nodes:
        pods = cluster.pods_on(node.name)
        why = gpu_or_training(node, pods)
        if why is None:
            continue
        for pod in pods:
            if pod.meta.memory_limit_bytes is not None or not cluster.in_scope(pod.meta.namespace):
                continue
            yield _finding(node, pod, why)


def _finding(node: NodeView, pod: PodView, why: str) -> Finding:
    meta = pod.meta
    bare = [c for c in pod.containers if c.memory_limit_bytes is None]
    names = ", ".join(f"{c.name} ({c.kind})" for c in bare) or "-"
    best_effort = meta.qos_class == "besteffort"
    kind = (
        "BestEffort pod (no memory request or limit)"
        if best_effort
        else ("pod without a memory limit")
    )
    target = pod.workload
    fixes = [
        f"kubectl -n {meta.namespace} set resources {target} -c {c.name} "
        f"--limits=memory={_suggested(c.memory_request_bytes)}"
        for c in bare
    ]
    return Finding(
        check="unbounded-memory",
        severity="error",
        title=f"{kind} on GPU node {node.name}",
        objects=(
            ObjectRef(kind="Pod", namespace=meta.namespace, name=meta.name),
            ObjectRef(kind="Node", namespace="", name=node.name),
        ),
        evidence=(
            Fact(label="node", text=why),
            Fact(label="containers without a limit", text=names),
            Fact(label="pod memory request", bytes=meta.memory_request_bytes),
            Fact(label="node allocatable", bytes=node.meta.allocatable_memory_bytes),
        ),
        fix="\n".join(fixes) or f"set a memory limit on every container of {target}",
    )


def _suggested(request: int | None) -> str:
    """The request as a limit (Guaranteed-like) when there is one, else a placeholder."""
    if request:
        return f"{-(-request // 2**20)}Mi"
    return "<size>"


register(
    Check(
        id="unbounded-memory",
        title="pods without a memory limit on nodes with GPUs or training",
        run=_findings,
    )
)
