"""Keeps the pods of this node (and the node itself) in memory, from a list-then-watch.

The pod list uses the field selector ``spec.nodeName=<node>``; the watch resumes from the list's
resourceVersion. On 410 Gone (the resourceVersion expired) and on any watch ERROR event the
watcher lists again (the API concepts doc, "Efficient detection of changes"); on a connection
failure it waits with capped exponential backoff and lists again. The node (allocatable memory)
is read again with every list and every ``node_refresh`` seconds.

What is kept of a pod is bounded: nodeguard reads names and flags from annotations (a PodGroup,
``kubernetes.io/config.source``), never documents, so an annotation value over
:data:`MAX_ANNOTATION_CHARS` (``kubectl.kubernetes.io/last-applied-configuration`` holds the
whole manifest, up to the API server's 256 KiB for all annotations) is dropped from the copy:
a node with thousands of evicted pods would otherwise hold each one's manifest.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from nodeguard.kube.client import JSON, KubeClient, translate_error
from nodeguard.kube.errors import KubeError
from nodeguard.kube.objects import node_meta, pod_meta
from nodeguard.snapshot import NodeMeta, PodMeta

__all__ = [
    "EARLIER_IDS_PER_CONTAINER",
    "MAX_ANNOTATION_CHARS",
    "PodWatcher",
    "trimmed",
    "with_earlier_ids",
]

log = logging.getLogger(__name__)

#: The longest annotation value kept of a pod (a Kubernetes name is at most 253 characters).
MAX_ANNOTATION_CHARS = 1024
#: Earlier container IDs kept per container name of a pod, beside those its status lists: a
#: container restarted twice within the OOM window is named by neither ``containerID`` nor
#: ``lastState`` for its first ID (CrashLoopBackOff's delay starts at 10 s).
EARLIER_IDS_PER_CONTAINER = 8


def trimmed(meta: PodMeta) -> PodMeta:
    """``meta`` without its annotations longer than :data:`MAX_ANNOTATION_CHARS`."""
    if all(len(v) <= MAX_ANNOTATION_CHARS for v in meta.annotations.values()):
        return meta
    kept = {k: v for k, v in meta.annotations.items() if len(v) <= MAX_ANNOTATION_CHARS}
    return dataclasses.replace(meta, annotations=kept)


def with_earlier_ids(meta: PodMeta, earlier: PodMeta | None) -> PodMeta:
    """``meta`` whose ``containers`` also names the IDs ``earlier`` (the same pod, UID equal, as
    last seen) named and ``meta``'s status no longer lists: the status keeps a container's
    current and last ID only (``containerID``, ``lastState.terminated.containerID``), and a
    kernel-log kill of an older one must still be named. At most
    :data:`EARLIER_IDS_PER_CONTAINER` earlier IDs a container name, the newest."""
    if earlier is None or earlier.uid != meta.uid:
        return meta
    gone: dict[str, list[str]] = {}
    for cid, name in earlier.containers.items():  # oldest first: insertion order
        if cid not in meta.containers:
            gone.setdefault(name, []).append(cid)
    if not gone:
        return meta
    ids = {cid: name for name, cids in gone.items() for cid in cids[-EARLIER_IDS_PER_CONTAINER:]}
    ids.update(meta.containers)
    return dataclasses.replace(meta, containers=ids)


class _Relist(Exception):
    """The watch cannot resume; list again."""


class PodWatcher:
    """The pods of one node, kept current; read with :meth:`pods` and :meth:`node`.

    ``run(stop=...)`` is the asyncio task. ``synced`` is set after the first successful list.
    """

    def __init__(
        self,
        *,
        kube: KubeClient,
        node_name: str,
        watch_timeout: int = 60,
        node_refresh: float = 60.0,
        max_backoff: float = 30.0,
    ) -> None:
        self._kube = kube
        self._node_name = node_name
        self._watch_timeout = watch_timeout
        self._node_refresh = node_refresh
        self._max_backoff = max_backoff
        self._lock = threading.Lock()
        self._pods: dict[str, PodMeta] = {}
        self._node: NodeMeta | None = None
        self._node_read_at = float("-inf")
        self.synced = asyncio.Event()
        self.relists = 0
        self._resp: Any = None  # the open watch response, shut down to stop the thread

    def pods(self) -> Mapping[str, PodMeta]:
        """A copy of the pods by the UID their cgroups carry (:attr:`PodMeta.cgroup_uid`: the
        config hash of a static pod's mirror, ``metadata.uid`` of any other), which is how the
        snapshot joins them to the cgroups; empty before the first list."""
        with self._lock:
            return {m.cgroup_uid: m for m in self._pods.values()}

    def is_synced(self) -> bool:
        """Whether the first pod list has completed."""
        return self.synced.is_set()

    def node(self) -> NodeMeta | None:
        """The node as last read, ``None`` before the first read."""
        return self._node

    async def _refresh_node(self) -> None:
        try:
            self._node = node_meta(await self._kube.get_node(name=self._node_name))
            self._node_read_at = time.monotonic()
        except KubeError as exc:
            log.warning("cannot read node %s: %s", self._node_name, exc)

    async def list_once(self) -> None:
        """List the node's pods and read the node once, without watching (``nodeguard
        snapshot``); afterwards :meth:`is_synced`. Raises :class:`KubeError` when the pods
        cannot be listed."""
        await self._list()

    async def _list(self) -> str:
        items, rv = await self._kube.list_pods(node_name=self._node_name)
        fresh = {m.uid: m for m in (trimmed(pod_meta(p)) for p in items)}
        with self._lock:
            self._pods = {u: with_earlier_ids(m, self._pods.get(u)) for u, m in fresh.items()}
        self.relists += 1
        await self._refresh_node()
        self.synced.set()
        log.info("listed %d pods on node %s at resourceVersion %s", len(fresh), self._node_name, rv)
        return rv

    def _apply(self, event: JSON) -> str | None:
        """Apply one watch event; the new resourceVersion, or raise :class:`_Relist`."""
        kind = event.get("type")
        obj: JSON = event.get("object") or {}
        if kind == "ERROR":
            raise _Relist(f"watch ERROR: {obj.get('code')} {obj.get('message')}")
        rv = obj.get("metadata", {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED"):
            meta = trimmed(pod_meta(obj))
            with self._lock:
                self._pods[meta.uid] = with_earlier_ids(meta, self._pods.get(meta.uid))
        elif kind == "DELETED":
            with self._lock:
                self._pods.pop(obj.get("metadata", {}).get("uid", ""), None)
        return str(rv) if rv else None

    def _watch_blocking(self, rv: str, stop: threading.Event) -> str:
        """Stream watch events from ``rv`` until the server ends the watch; the last
        resourceVersion seen. Raises :class:`_Relist` or a :class:`KubeError`."""
        try:
            resp: Any = self._kube.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self._node_name}",
                resource_version=rv,
                watch=True,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout,
                _preload_content=False,
                _request_timeout=(5.0, self._watch_timeout + 30.0),
            )
        except Exception as exc:
            err = translate_error(exc)
            if err.status == 410:
                raise _Relist("410 Gone") from exc
            raise err from exc
        self._resp = resp
        if stop.is_set():
            resp.release_conn()
            return rv
        try:
            buffer = b""
            for chunk in resp.stream(65536):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        rv = self._apply(json.loads(line)) or rv
                if stop.is_set():
                    break
        except _Relist:
            raise
        except Exception as exc:
            if stop.is_set():
                return rv  # shut down by run() on stop
            raise translate_error(exc) from exc
        finally:
            self._resp = None
            if stop.is_set():
                resp.close()  # a shut-down socket must not go back to the pool
            else:
                resp.release_conn()
        return rv

    def _unblock(self, stop_thread: threading.Event) -> None:
        """Stop the watch thread now rather than at the watch's server-side timeout."""
        stop_thread.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown()

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
                        self._kube.in_thread(self._watch_blocking, rv, stop_thread)
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
                except _Relist as exc:
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
                self._unblock(stop_thread)
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(watch), timeout=5)
