"""The custom-objects endpoints nodeguard calls (``/apis/{group}/{version}/...``): Katib's
Experiments, Trials and Suggestions."""

from __future__ import annotations

from kubernetes import client as k8s

from nodeguard.kube.calls import JSON, MERGE_PATCH, ApiCalls, dry_run_option

__all__ = ["CustomObjects"]


class CustomObjects:
    """Gets, lists and patches namespaced custom objects."""

    def __init__(self, *, calls: ApiCalls, custom: k8s.CustomObjectsApi) -> None:
        self._calls = calls
        self._api = custom

    async def get_custom(
        self, *, group: str, version: str, plural: str, namespace: str, name: str
    ) -> JSON:
        """GET a namespaced custom object."""
        return await self._calls.read(
            self._api.get_namespaced_custom_object, group, version, namespace, plural, name
        )

    async def list_custom(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        namespace: str | None = None,
        label_selector: str | None = None,
    ) -> list[JSON]:
        """Custom objects of one namespace (or every namespace), by label selector."""
        kw = {"label_selector": label_selector} if label_selector else {}
        if namespace is None:
            body = await self._calls.read(
                self._api.list_cluster_custom_object, group, version, plural, **kw
            )
        else:
            body = await self._calls.read(
                self._api.list_namespaced_custom_object, group, version, namespace, plural, **kw
            )
        items: list[JSON] = body.get("items", [])
        return items

    async def patch_custom(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        namespace: str,
        name: str,
        patch: JSON,
        dry_run: bool,
    ) -> JSON:
        """JSON merge patch of a namespaced custom object."""
        return await self._calls.write(
            self._api.patch_namespaced_custom_object,
            group,
            version,
            namespace,
            plural,
            name,
            patch,
            _content_type=MERGE_PATCH,
            **dry_run_option(dry_run),
        )
