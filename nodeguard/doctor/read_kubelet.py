"""Reading each kubelet's running configuration for ``node-reserve``:
``GET /api/v1/nodes/{node}/proxy/configz`` (:meth:`nodeguard.kube.client.KubeClient.
get_kubelet_configz`), the kubelet's answer ``{"kubeletconfig": {...}}`` (kubernetes
pkg/kubelet/server/server.go registers ``/configz`` with pkg/util/configz, which writes every
registered configuration under its name; cmd/kubelet/app/server.go ``initConfigz`` registers
the KubeletConfiguration as ``kubeletconfig``, in its v1beta1 JSON form:
``evictionHard``, ``systemReserved``, ``kubeReserved``, maps of resource name to a quantity,
staging/src/k8s.io/kubelet/config/v1beta1/types.go).

Proxying needs ``get`` on ``nodes/proxy``, which also reaches the kubelet's exec and logs, so
it is an optional ClusterRole of its own (docs/doctor-rbac.yaml). Refused (403), the other
nodes are not tried; a kubelet the API server cannot reach (502/503, or a node without an
address) is that node's answer. Either way the check assumes the defaults it assumes from the
node's status, and one note says so, naming how many nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nodeguard.doctor.agent_inputs import KubeletConfigView
from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import Forbidden, KubeError
from nodeguard.kube.resources import memory_bytes

__all__ = ["kubelet_config_view", "read_kubelet_configs"]

JSON = dict[str, Any]


def kubelet_config_view(node: str, configz: JSON) -> KubeletConfigView | None:
    """A :class:`KubeletConfigView` from a ``configz`` answer; ``None`` when it holds no
    ``kubeletconfig`` object."""
    config = configz.get("kubeletconfig")
    if not isinstance(config, dict):
        return None
    eviction = config.get("evictionHard") or {}
    threshold = eviction.get("memory.available")
    return KubeletConfigView(
        node=node,
        eviction_memory_available=str(threshold) if threshold is not None else None,
        system_reserved_bytes=memory_bytes(config.get("systemReserved")),
        kube_reserved_bytes=memory_bytes(config.get("kubeReserved")),
    )


async def read_kubelet_configs(
    kube: KubeClient, nodes: Sequence[str]
) -> tuple[tuple[KubeletConfigView, ...], tuple[str, ...]]:
    """Each node's :class:`KubeletConfigView` that could be read, and the notes."""
    views: list[KubeletConfigView] = []
    unreachable: list[str] = []
    for i, node in enumerate(nodes):
        try:
            answer = await kube.get_kubelet_configz(node=node)
        except Forbidden:
            return tuple(views), (
                f"the kubelets' configz was not read for {len(nodes) - i} node(s) (get "
                "nodes/proxy forbidden; optional: nodeguard-doctor-kubelet-config in "
                "docs/doctor-rbac.yaml): node-reserve assumed the kubelet's default hard "
                "eviction threshold memory.available<100Mi",
            )
        except KubeError:
            unreachable.append(node)
            continue
        view = kubelet_config_view(node, answer)
        if view is None:
            unreachable.append(node)
        else:
            views.append(view)
    notes: tuple[str, ...] = ()
    if unreachable:
        shown = ", ".join(unreachable[:3]) + (" ..." if len(unreachable) > 3 else "")
        notes = (
            f"the kubelets' configz could not be read for {len(unreachable)} node(s) "
            f"({shown}: the API server could not reach the kubelet): node-reserve assumed "
            "the kubelet's default hard eviction threshold memory.available<100Mi there",
        )
    return tuple(views), notes
