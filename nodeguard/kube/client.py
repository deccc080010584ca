"""The only module that calls the Kubernetes API (the official ``kubernetes`` client).

Every call runs in one of the client's own worker threads (the client is blocking), so the event
loop that samples and serves ``/metrics`` never waits on the API server
(:mod:`~nodeguard.kube.calls`, which says why not asyncio's default executor). Results come back
as plain JSON dicts, exactly as the API returns them (camelCase keys), without the client's
model classes; failures come back as :mod:`nodeguard.kube.errors` types chained from the
client's exception (:func:`translate_error`). Reads are retried with capped exponential backoff
on server errors (tenacity); writes are not retried here: whether a write may be repeated is the
caller's decision.

The client is made of what it does: where its configuration comes from
(:mod:`~nodeguard.kube.config`), one call off the loop (:mod:`~nodeguard.kube.calls`), and the
endpoints by API group: Nodes (:mod:`~nodeguard.kube.nodes`), Pods and their eviction
(:mod:`~nodeguard.kube.pods`), Leases (:mod:`~nodeguard.kube.leases`), ResourceQuotas and
LimitRanges (:mod:`~nodeguard.kube.quotas`) and custom objects
(:mod:`~nodeguard.kube.custom_objects`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from kubernetes import client as k8s

from nodeguard.kube.calls import JSON, KUBE_THREAD_PREFIX, REQUEST_TIMEOUT_SECONDS, ApiCalls
from nodeguard.kube.config import api_client, loaded_configuration, token_configuration
from nodeguard.kube.core import CoreV1
from nodeguard.kube.custom_objects import CustomObjects
from nodeguard.kube.leases import Leases
from nodeguard.kube.node_config import NodeConfig
from nodeguard.kube.nodes import Nodes
from nodeguard.kube.pods import Pods
from nodeguard.kube.quotas import ResourceQuotas
from nodeguard.kube.translate import translate_error

__all__ = [
    "JSON",
    "KUBE_THREAD_PREFIX",
    "REQUEST_TIMEOUT_SECONDS",
    "KubeClient",
    "translate_error",
]


class KubeClient:
    """Async facade over the official client for what nodeguard does to a cluster.

    Construct with :meth:`load` (in-cluster config, else a kubeconfig) or :meth:`with_token`.
    ``read_attempts`` bounds retries of reads on :class:`~nodeguard.kube.errors.ServerError`.
    Each endpoint is a method of its API group's object (``kube.evict_pod`` is
    :meth:`Pods.evict_pod <nodeguard.kube.pods.Pods.evict_pod>`), bound here under its own name,
    so that callers see one client.
    """

    def __init__(self, *, api_client: k8s.ApiClient, read_attempts: int = 4) -> None:
        self.api = api_client
        self.core = CoreV1(api_client)  # not the generated classes: nodeguard/kube/core.py
        self.coordination = k8s.CoordinationV1Api(api_client)
        self.policy = k8s.PolicyV1Api(api_client)
        self.custom = k8s.CustomObjectsApi(api_client)
        #: Awaited right before every destructive write (a real eviction, a Node patch); raises
        #: :class:`~nodeguard.kube.errors.Fenced` to stop it (the node actor's check).
        self.fence: Callable[[], Awaitable[None]] | None = None
        self._calls = ApiCalls(read_attempts=read_attempts)
        self.in_thread = self._calls.in_thread
        self.read = self._calls.read
        self.write = self._calls.write
        calls, core = self._calls, self.core
        nodes = Nodes(calls=calls, core=core, fence=self._pass_fence)
        self.get_node, self.list_nodes = nodes.get_node, nodes.list_nodes
        self.patch_node = nodes.patch_node
        pods = Pods(calls=calls, core=core, policy=self.policy, fence=self._pass_fence)
        self.list_pods, self.evict_pod = pods.list_pods, pods.evict_pod
        self.list_pod_disruption_budgets = pods.list_pod_disruption_budgets
        leases = Leases(calls=calls, coordination=self.coordination)
        self.get_lease, self.create_lease = leases.get_lease, leases.create_lease
        self.replace_lease = leases.replace_lease
        quotas = ResourceQuotas(calls=calls, core=core)
        self.list_resource_quotas = quotas.list_resource_quotas
        self.create_resource_quota = quotas.create_resource_quota
        self.delete_resource_quota = quotas.delete_resource_quota
        self.list_limit_ranges = quotas.list_limit_ranges
        custom = CustomObjects(calls=calls, custom=self.custom)
        self.get_custom, self.list_custom = custom.get_custom, custom.list_custom
        self.patch_custom = custom.patch_custom
        node_config = NodeConfig(calls=calls, core=core)
        self.get_namespace = node_config.get_namespace
        self.get_config_map = node_config.get_config_map
        self.get_kubelet_configz = node_config.get_kubelet_configz

    @classmethod
    def load(cls, *, kubeconfig: Path | None = None, context: str | None = None) -> KubeClient:
        """In-cluster config (the pod's ServiceAccount) when ``kubeconfig`` is ``None`` and
        ``KUBERNETES_SERVICE_HOST`` is set; otherwise the kubeconfig (``$KUBECONFIG`` or
        ``~/.kube/config`` when ``None``). Raises :class:`~nodeguard.kube.errors.KubeError`
        when neither works."""
        configuration = loaded_configuration(kubeconfig=kubeconfig, context=context)
        return cls(api_client=api_client(configuration))

    @classmethod
    def with_token(cls, *, server: str, token: str, ca_file: Path) -> KubeClient:
        """A client authenticated by a bearer token (a ServiceAccount's TokenRequest)."""
        configuration = token_configuration(server=server, token=token, ca_file=ca_file)
        return cls(api_client=api_client(configuration))

    def close(self) -> None:
        """Close the connection pool; calls still queued for a thread are dropped."""
        self._calls.close()
        self.api.close()

    async def _pass_fence(self) -> None:
        # Read at each write, not at construction: the node actor sets the fence later.
        if self.fence is not None:
            await self.fence()

    async def create_event(self, *, namespace: str, body: JSON) -> JSON:
        """POST a core/v1 Event."""
        return await self._calls.write(self.core.create_namespaced_event, namespace, body)
