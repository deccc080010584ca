"""The coordination.k8s.io/v1 Lease endpoints nodeguard calls (API reference: Lease): the
per-node Lease the node actor holds."""

from __future__ import annotations

from kubernetes import client as k8s

from nodeguard.kube.calls import JSON, ApiCalls

__all__ = ["Leases"]


class Leases:
    """Gets, creates and replaces Leases; never retries a write (the caller decides)."""

    def __init__(self, *, calls: ApiCalls, coordination: k8s.CoordinationV1Api) -> None:
        self._calls = calls
        self._api = coordination

    async def get_lease(self, *, name: str, namespace: str) -> JSON:
        """GET a coordination.k8s.io/v1 Lease."""
        return await self._calls.read(self._api.read_namespaced_lease, name, namespace)

    async def create_lease(self, *, namespace: str, body: JSON) -> JSON:
        """POST a Lease; :class:`~nodeguard.kube.errors.Conflict` when it exists."""
        return await self._calls.write(self._api.create_namespaced_lease, namespace, body)

    async def replace_lease(self, *, name: str, namespace: str, body: JSON) -> JSON:
        """PUT a Lease; the body's resourceVersion makes a concurrent update a Conflict."""
        return await self._calls.write(self._api.replace_namespaced_lease, name, namespace, body)
