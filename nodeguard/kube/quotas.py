"""The core/v1 ResourceQuota and LimitRange endpoints nodeguard calls (API reference:
ResourceQuota, LimitRange): the Katib pause, a quota of zero pods in an experiment's namespace,
and ``nodeguard doctor``, which reads both."""

from __future__ import annotations

from nodeguard.kube.calls import JSON, ApiCalls, dry_run_option
from nodeguard.kube.core import CoreV1

__all__ = ["ResourceQuotas"]


class ResourceQuotas:
    """Lists, creates and deletes ResourceQuotas; lists LimitRanges."""

    def __init__(self, *, calls: ApiCalls, core: CoreV1) -> None:
        self._calls = calls
        self._core = core

    async def list_resource_quotas(
        self, *, label_selector: str | None = None, namespace: str | None = None
    ) -> list[JSON]:
        """ResourceQuotas of one namespace (or every namespace), by label selector (default:
        all)."""
        kw = {"label_selector": label_selector} if label_selector else {}
        if namespace is None:
            body = await self._calls.read(self._core.list_resource_quota_for_all_namespaces, **kw)
        else:
            body = await self._calls.read(
                self._core.list_namespaced_resource_quota, namespace, **kw
            )
        items: list[JSON] = body.get("items", [])
        return items

    async def list_limit_ranges(self, *, namespace: str | None = None) -> list[JSON]:
        """LimitRanges of one namespace (or every namespace)."""
        if namespace is None:
            body = await self._calls.read(self._core.list_limit_range_for_all_namespaces)
        else:
            body = await self._calls.read(self._core.list_namespaced_limit_range, namespace)
        items: list[JSON] = body.get("items", [])
        return items

    async def create_resource_quota(self, *, namespace: str, body: JSON, dry_run: bool) -> JSON:
        """POST a ResourceQuota; :class:`~nodeguard.kube.errors.Conflict` when one of that name
        exists."""
        return await self._calls.write(
            self._core.create_namespaced_resource_quota,
            namespace,
            body,
            **dry_run_option(dry_run),
        )

    async def delete_resource_quota(
        self, *, name: str, namespace: str, uid: str, dry_run: bool
    ) -> None:
        """DELETE a ResourceQuota, only the one with ``uid`` (a precondition: one made again
        under the name by someone else is a :class:`~nodeguard.kube.errors.Conflict`)."""
        body: JSON = {"preconditions": {"uid": uid}}
        if dry_run:
            body["dryRun"] = ["All"]
        await self._calls.write(
            self._core.delete_namespaced_resource_quota,
            name,
            namespace,
            body,
            **dry_run_option(dry_run),
        )
