"""Which nodes count as GPU or training nodes, shared by the checks that care
(``unbounded-memory``, ``nodeguard-agents``).

A node "has GPUs" when its ``status.capacity`` or ``allocatable`` names ``nvidia.com/gpu`` (the
NVIDIA device plugin's extended resource) or it carries the GPU feature discovery label
``nvidia.com/gpu.present=true``; it "runs training" when a pod on it requests
``nvidia.com/gpu`` or is a training pod (:class:`~nodeguard.doctor.inputs.PodView`).
"""

from __future__ import annotations

from nodeguard.doctor.inputs import NodeView, PodView

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
