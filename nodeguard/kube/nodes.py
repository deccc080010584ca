"""The core/v1 Node endpoints nodeguard calls (API reference: Node)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from nodeguard.kube.calls import JSON, MERGE_PATCH, ApiCalls, dry_run_option
from nodeguard.kube.core import CoreV1

__all__ = ["Nodes"]


class Nodes:
    """Reads and patches Nodes. ``fence`` is awaited right before a real patch (it raises
    :class:`~nodeguard.kube.errors.Fenced` to stop it)."""

    def __init__(
        self, *, calls: ApiCalls, core: CoreV1, fence: Callable[[], Awaitable[None]]
    ) -> None:
        self._calls = calls
        self._core = core
        self._fence = fence

    async def get_node(self, *, name: str) -> JSON:
        """GET /api/v1/nodes/{name}."""
        return await self._calls.read(self._core.read_node, name)

    async def list_nodes(self, *, label_selector: str | None = None) -> list[JSON]:
        """GET /api/v1/nodes, optionally by label selector."""
        kw = {"label_selector": label_selector} if label_selector else {}
        items: list[JSON] = (await self._calls.read(self._core.list_node, **kw)).get("items", [])
        return items

    async def patch_node(self, *, name: str, patch: JSON, dry_run: bool) -> JSON:
        """JSON merge patch of a Node (RFC 7386); include ``metadata.resourceVersion`` in the
        patch for optimistic concurrency (then a concurrent change gives
        :class:`~nodeguard.kube.errors.Conflict`). A real patch passes the fence first."""
        if not dry_run:
            await self._fence()
        return await self._calls.write(
            self._core.patch_node, name, patch, _content_type=MERGE_PATCH, **dry_run_option(dry_run)
        )
