"""What ``nodeguard doctor`` reads beside the object lists: a Namespace (that a ``--namespace``
exists), a ConfigMap (the agent's rules) and a kubelet's running configuration (``configz``)
through the API server's node proxy.

``GET /api/v1/nodes/{node}/proxy/configz`` needs ``get`` on ``nodes/proxy`` (RBAC); the API
server forwards it to the kubelet's ``/configz`` (kubernetes pkg/kubelet/server/server.go
``InstallDebuggingHandlers``/``getConfigz``; pkg/util/configz), which answers
``{"kubeletconfig": <KubeletConfiguration, v1beta1 JSON field names>}``.
"""

from __future__ import annotations

from nodeguard.kube.calls import JSON, ApiCalls
from nodeguard.kube.core import CoreV1

__all__ = ["NodeConfig"]


class NodeConfig:
    """Reads a Namespace, a ConfigMap and a node's kubelet configuration."""

    def __init__(self, *, calls: ApiCalls, core: CoreV1) -> None:
        self._calls = calls
        self._core = core

    async def get_namespace(self, *, name: str) -> JSON:
        """One Namespace; :class:`~nodeguard.kube.errors.NotFound` when there is none (a
        list of a namespace's objects answers an empty list either way)."""
        return await self._calls.read(self._core.read_namespace, name)

    async def get_config_map(self, *, name: str, namespace: str) -> JSON:
        """One ConfigMap; :class:`~nodeguard.kube.errors.NotFound` when absent,
        :class:`~nodeguard.kube.errors.Forbidden` without ``get configmaps`` there."""
        return await self._calls.read(self._core.read_namespaced_config_map, name, namespace)

    async def get_kubelet_configz(self, *, node: str) -> JSON:
        """The kubelet's ``configz`` answer of ``node`` (``{"kubeletconfig": {...}}``), one
        attempt: an unreachable kubelet (the API server answers 502/503, a
        :class:`~nodeguard.kube.errors.ServerError`) is an answer for the doctor, not a
        failure to retry; :class:`~nodeguard.kube.errors.Forbidden` without ``get
        nodes/proxy``."""
        return await self._calls.write(self._core.connect_get_node_proxy_configz, node)
