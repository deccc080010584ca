"""The Pod endpoints nodeguard calls: the list, the policy/v1 Eviction subresource and the
PodDisruptionBudgets the eviction handler weighs (API reference: core/v1 Pod, policy/v1
Eviction, PodDisruptionBudget)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes import client as k8s

from nodeguard.kube.calls import JSON, ApiCalls, dry_run_option
from nodeguard.kube.core import CoreV1

__all__ = ["Pods"]


class Pods:
    """Lists and evicts pods. ``fence`` is awaited right before a real eviction (it raises
    :class:`~nodeguard.kube.errors.Fenced` to stop it)."""

    def __init__(
        self,
        *,
        calls: ApiCalls,
        core: CoreV1,
        policy: k8s.PolicyV1Api,
        fence: Callable[[], Awaitable[None]],
    ) -> None:
        self._calls = calls
        self._core = core
        self._policy = policy
        self._fence = fence

    async def list_pods(
        self,
        *,
        node_name: str | None = None,
        namespace: str | None = None,
        label_selector: str | None = None,
    ) -> tuple[list[JSON], str]:
        """Pods (of one node via the ``spec.nodeName`` field selector, of one namespace, by
        label selector); returns ``(items, list resourceVersion)``."""
        kw: dict[str, Any] = {}
        if node_name:
            kw["field_selector"] = f"spec.nodeName={node_name}"
        if label_selector:
            kw["label_selector"] = label_selector
        if namespace:
            body = await self._calls.read(self._core.list_namespaced_pod, namespace, **kw)
        else:
            body = await self._calls.read(self._core.list_pod_for_all_namespaces, **kw)
        return body.get("items", []), str(body.get("metadata", {}).get("resourceVersion", ""))

    async def evict_pod(
        self, *, name: str, namespace: str, dry_run: bool, uid: str | None = None
    ) -> None:
        """POST the policy/v1 Eviction subresource (never DELETE). The API server refuses with
        429 (:class:`~nodeguard.kube.errors.BudgetExhausted`) when a PodDisruptionBudget does
        not allow the disruption, 500 (:class:`~nodeguard.kube.errors.MultipleBudgets`) when
        more than one selects the pod; in dry run it checks the same and deletes nothing. With
        ``uid``, ``deleteOptions.preconditions.uid``: a pod replaced under the same name is a
        :class:`~nodeguard.kube.errors.Conflict`, never evicted in the decided pod's place. A
        real eviction passes the fence first."""
        if not dry_run:
            await self._fence()
        options: JSON = {}
        if dry_run:
            options["dryRun"] = ["All"]
        if uid:
            options["preconditions"] = {"uid": uid}
        body: JSON = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if options:
            body["deleteOptions"] = options
        await self._calls.write(
            self._core.create_namespaced_pod_eviction,
            name,
            namespace,
            body,
            **dry_run_option(dry_run),
        )

    async def list_pod_disruption_budgets(self, *, namespace: str) -> list[JSON]:
        """GET /apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets: every budget of
        the namespace, as the eviction handler lists them (it matches selectors itself)."""
        body = await self._calls.read(self._policy.list_namespaced_pod_disruption_budget, namespace)
        items: list[JSON] = body.get("items", [])
        return items
