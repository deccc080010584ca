"""The copies of a node's pods the watch keeps, and what is kept of each.

What is kept of a pod is bounded: nodeguard reads names and flags from annotations (a PodGroup,
``kubernetes.io/config.source``), never documents, so an annotation value over
:data:`MAX_ANNOTATION_CHARS` (``kubectl.kubernetes.io/last-applied-configuration`` holds the
whole manifest, up to the API server's 256 KiB for all annotations) is dropped from the copy:
a node with thousands of evicted pods would otherwise hold each one's manifest.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Mapping

from nodeguard.kube.calls import JSON
from nodeguard.kube.objects import pod_meta
from nodeguard.kube.watch_stream import Relist
from nodeguard.snapshot import PodMeta

__all__ = [
    "EARLIER_IDS_PER_CONTAINER",
    "MAX_ANNOTATION_CHARS",
    "PodStore",
    "trimmed",
    "with_earlier_ids",
]

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


class PodStore:
    """The pods by ``metadata.uid``, from a list and then watch events; safe to read from the
    loop while the watch thread writes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, PodMeta] = {}

    def by_cgroup_uid(self) -> Mapping[str, PodMeta]:
        """A copy of the pods by the UID their cgroups carry (:attr:`PodMeta.cgroup_uid`)."""
        with self._lock:
            return {m.cgroup_uid: m for m in self._pods.values()}

    def replace(self, items: Iterable[JSON]) -> int:
        """Keep exactly the pods of a list (Pod JSON); how many."""
        fresh = {m.uid: m for m in (trimmed(pod_meta(p)) for p in items)}
        with self._lock:
            self._pods = {u: with_earlier_ids(m, self._pods.get(u)) for u, m in fresh.items()}
        return len(fresh)

    def apply(self, event: JSON) -> str | None:
        """Apply one watch event (``type``: ADDED, MODIFIED, DELETED, BOOKMARK or ERROR, and its
        ``object``); the new resourceVersion. An ERROR event raises :class:`Relist`."""
        kind = event.get("type")
        obj: JSON = event.get("object") or {}
        if kind == "ERROR":
            raise Relist(f"watch ERROR: {obj.get('code')} {obj.get('message')}")
        rv = obj.get("metadata", {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED"):
            meta = trimmed(pod_meta(obj))
            with self._lock:
                self._pods[meta.uid] = with_earlier_ids(meta, self._pods.get(meta.uid))
        elif kind == "DELETED":
            with self._lock:
                self._pods.pop(obj.get("metadata", {}).get("uid", ""), None)
        return str(rv) if rv else None
