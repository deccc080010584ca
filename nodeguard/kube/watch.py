"""Keeps the pods of this node (and the node itself) in memory, from a list-then-watch.

The pod list uses the field selector ``spec.nodeName=<node>``; the watch resumes from the list's
resourceVersion. On 410 Gone (the resourceVersion expired) and on any watch ERROR event the
watcher lists again (the API concepts doc, "Efficient detection of changes"); on a connection
failure it waits with capped exponential backoff and lists again. The node (allocatable memory)
is read again with every list and every ``node_refresh`` seconds.

What is kept of a pod is bounded (:mod:`~nodeguard.kube.pod_store`: an annotation value over
:data:`MAX_ANNOTATION_CHARS` is dropped from the copy); one watch is streamed in a worker thread
(:mod:`~nodeguard.kube.watch_stream`). A :class:`~nodeguard.kube.pod_store.PodListener` sees
every pod list, watch event and Node read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Mapping

from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import KubeError
from nodeguard.kube.objects import node_meta
from nodeguard.kube.pod_store import (
    EARLIER_IDS_PER_CONTAINER,
    MAX_ANNOTATION_CHARS,
    PodListener,
    PodStore,
    trimmed,
    with_earlier_ids,
)
from nodeguard.kube.watch_stream import PodWatchStream, Relist
from nodeguard.snapshot import NodeMeta, PodMeta

__all__ = [
    "EARLIER_IDS_PER_CONTAINER",
    "MAX_ANNOTATION_CHARS",
    "PodWatcher",
    "trimmed",
    "with_earlier_ids",
]

log = logging.getLogger(__name__)


class PodWatcher:
    """The pods of one node, kept current; read with :meth:`pods` and :meth:`node`.

    ``run(stop=...)`` is the asyncio task. ``synced`` is set after the first successful list.
    ``listener`` (optional) sees every pod list and event after the store and every Node read.
    """

    def __init__(
        self,
        *,
        kube: KubeClient,
        node_name: str,
        watch_timeout: int = 60,
        node_refresh: float = 60.0,
        max_backoff: float = 30.0,
        listener: PodListener | None = None,
    ) -> None:
        self._kube = kube
        self._node_name = node_name
        self._node_refresh = node_refresh
        self._max_backoff = max_backoff
        self._store = PodStore(listener=listener)
        self._listener = listener
        self._stream = PodWatchStream(
            kube=kube, node_name=node_name, watch_timeout=watch_timeout, apply=self._store.apply
        )
        self._node: NodeMeta | None = None
        self._node_read_at = float("-inf")
        self.synced = asyncio.Event()
        self.relists = 0

    def pods(self) -> Mapping[str, PodMeta]:
        """A copy of the pods by the UID their cgroups carry (:attr:`PodMeta.cgroup_uid`: the
        config hash of a static pod's mirror, ``metadata.uid`` of any other), which is how the
        snapshot joins them to the cgroups; empty before the first list."""
        return self._store.by_cgroup_uid()

    def is_synced(self) -> bool:
        """Whether the first pod list has completed."""
        return self.synced.is_set()

    def node(self) -> NodeMeta | None:
        """The node as last read, ``None`` before the first read."""
        return self._node

    async def _refresh_node(self) -> None:
        try:
            doc = await self._kube.get_node(name=self._node_name)
            self._node = node_meta(doc)
            self._node_read_at = time.monotonic()
            if self._listener is not None:
                self._listener.node_read(doc)
        except KubeError as exc:
            log.warning("cannot read node %s: %s", self._node_name, exc)

    async def list_once(self) -> None:
        """List the node's pods and read the node once, without watching (``nodeguard
        snapshot``); afterwards :meth:`is_synced`. Raises :class:`KubeError` when the pods
        cannot be listed."""
        await self._list()

    async def _list(self) -> str:
        items, rv = await self._kube.list_pods(node_name=self._node_name)
        count = self._store.replace(items)
        self.relists += 1
        await self._refresh_node()
        self.synced.set()
        log.info("listed %d pods on node %s at resourceVersion %s", count, self._node_name, rv)
        return rv

    async def run(self, *, stop: asyncio.Event) -> None:
        """List, then watch, until ``stop`` is set (or the task is cancelled); never raises
        otherwise. Relists and failures back off (capped exponential), so a flapping API server
        is not hammered."""
        stop_thread = threading.Event()
        backoff = 1.0
        rv: str | None = None
        watch: asyncio.Task[str] | None = None
        try:
            while not stop.is_set():
                try:
                    if rv is None:
                        rv = await self._list()
                    if time.monotonic() - self._node_read_at > self._node_refresh:
                        await self._refresh_node()
                    watch = asyncio.create_task(
                        self._kube.in_thread(self._stream.watch, rv, stop_thread)
                    )
                    stopper = asyncio.create_task(stop.wait())
                    done, _ = await asyncio.wait({watch, stopper}, return_when="FIRST_COMPLETED")
                    stopper.cancel()
                    if watch not in done:
                        break
                    rv = watch.result()
                    watch = None
                    backoff = 1.0
                    continue
                except Relist as exc:
                    log.info("pod watch on %s: %s; listing again", self._node_name, exc)
                except KubeError as exc:
                    log.warning(
                        "pod watch on %s failed (%s); retrying in %.0fs",
                        self._node_name,
                        exc,
                        backoff,
                    )
                rv, watch = None, None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=backoff)
                backoff = min(backoff * 2, self._max_backoff)
        finally:
            if watch is not None and not watch.done():
                self._stream.unblock(stop_thread)
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(watch), timeout=5)
