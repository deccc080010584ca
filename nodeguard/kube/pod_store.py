"""The copies of a node's pods the watch keeps, and what is kept of each.

What is kept of a pod is bounded: nodeguard reads names and flags from annotations (a PodGroup,
``kubernetes.io/config.source``), never documents, so an annotation value over
:data:`MAX_ANNOTATION_CHARS` (``kubectl.kubernetes.io/last-applied-configuration`` holds the
whole manifest, up to the API server's 256 KiB for all annotations) is dropped from the copy:
a node with thousands of evicted pods would otherwise hold each one's manifest.

A :class:`PodListener` given to the store sees every pod JSON the store parses (the list's and
the watch's) and keeps what it needs of it: the store keeps :class:`PodMeta` only, and what a
listener keeps is its own (the agent's doctor views, :mod:`nodeguard.agent.posture`), so no
pod document is held for it.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from nodeguard.kube.calls import JSON
from nodeguard.kube.objects import pod_meta
from nodeguard.kube.watch_stream import Relist
from nodeguard.snapshot import PodMeta

__all__ = [
    "EARLIER_IDS_PER_CONTAINER",
    "MAX_ANNOTATION_CHARS",
    "PodListener",
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


class PodListener(Protocol):
    """What else is kept of the node's pods and of the Node, from the JSON the watch reads.
    Called from the watch's worker thread (pods) and from the loop (the node): an
    implementation guards its own state."""

    def pods_listed(self, items: Sequence[JSON]) -> None:
        """A pod list: exactly these pods (Pod JSON) are the node's now."""

    def pod_changed(self, pod: JSON) -> None:
        """A watch ADDED or MODIFIED event's Pod."""

    def pod_deleted(self, uid: str) -> None:
        """A watch DELETED event's pod, by ``metadata.uid``."""

    def node_read(self, node: JSON) -> None:
        """The Node, as just read."""


class PodStore:
    """The pods by ``metadata.uid``, from a list and then watch events; safe to read from the
    loop while the watch thread writes. ``listener`` sees each list and event after the store
    applied it."""

    def __init__(self, *, listener: PodListener | None = None) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, PodMeta] = {}
        self._listener = listener

    def by_cgroup_uid(self) -> Mapping[str, PodMeta]:
        """A copy of the pods by the UID their cgroups carry (:attr:`PodMeta.cgroup_uid`)."""
        with self._lock:
            return {m.cgroup_uid: m for m in self._pods.values()}

    def replace(self, items: Iterable[JSON]) -> int:
        """Keep exactly the pods of a list (Pod JSON); how many."""
        docs = list(items)
        fresh = {m.uid: m for m in (trimmed(pod_meta(p)) for p in docs)}
        with self._lock:
            self._pods = {u: with_earlier_ids(m, self._pods.get(u)) for u, m in fresh.items()}
        if self._listener is not None:
            self._listener.pods_listed(docs)
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
            if self._listener is not None:
                self._listener.pod_changed(obj)
        elif kind == "DELETED":
            uid = obj.get("metadata", {}).get("uid", "")
            with self._lock:
                self._pods.pop(uid, None)
            if self._listener is not None:
                self._listener.pod_deleted(uid)
        return str(rv) if rv else None
