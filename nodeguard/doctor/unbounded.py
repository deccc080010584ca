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
from nodeguard.doctor.gpu_nodes import gpu_or_training
from nodeguard.doctor.inputs import Cluster, ContainerView, NodeView, PodView
from nodeguard.doctor.registry import Check, register

#: gpu_or_training lives in nodeguard.doctor.gpu_nodes (shared by the checks); kept here too.
__all__ = ["gpu_or_training"]


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
        fix=_template_fix(pod, bare),
    )


def _template_fix(pod: PodView, bare: list[ContainerView]) -> str:
    """Where the limit goes, as a manifest fragment: a pod's resources cannot be edited in
    place (the API server refuses pod updates but the image, the resize subresource cannot
    change a pod's QoS class), and a Job's template is immutable, so the limit is set in the
    template that makes the pod (its Deployment for a ReplicaSet's pod; for a Job's, the
    CronJob or Experiment trialTemplate that makes the Job, or a re-created Job), and takes
    effect on the pods made next."""
    owner = pod.controller
    if owner is None:
        where = (
            f"# pod {pod.meta.namespace}/{pod.meta.name} has no controller: set the limit in "
            "its manifest and re-create it"
        )
    elif owner.startswith("ReplicaSet "):
        where = (
            f"# in the pod template of the Deployment that owns {owner} (or of the ReplicaSet "
            "itself when it has no Deployment); new pods get it"
        )
    elif owner.startswith("Job "):
        where = (
            f"# {owner}'s template cannot change: set it in what makes the Job (its CronJob, a "
            "Katib Experiment's trialTemplate) or re-create the Job with it"
        )
    else:
        where = f"# in the pod template of {owner} (or what creates it); new pods get it"
    lines = [where]
    # Init containers and sidecars (restartable init containers) are under initContainers: a
    # limit written under containers would name a container the pod does not have.
    for section, kinds in (("initContainers", ("init", "sidecar")), ("containers", ("container",))):
        chosen = [c for c in bare if c.kind in kinds]
        if chosen:
            lines.append(f"{section}:")
        for c in chosen:
            lines += [
                f"  - name: {c.name}",
                "    resources:",
                "      limits:",
                f"        memory: {_suggested(c.memory_request_bytes)}",
            ]
    return "\n".join(lines)


def _suggested(request: int | None) -> str:
    """The request as a limit (Guaranteed-like) when there is one, else a size to choose (in
    a YAML comment, so a pasted fragment is still valid YAML)."""
    if request:
        return f"{-(-request // 2**20)}Mi"
    return "1Gi  # choose: its peak working set and some room"


register(
    Check(
        id="unbounded-memory",
        title="pods without a memory limit on nodes with GPUs or training",
        run=_findings,
        scope="node",
        severities=("error",),
    )
)
