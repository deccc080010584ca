"""The walk of one kubepods root: its QoS directories, the pod cgroups in them and each pod's
container cgroups (the kubelet's layout: :mod:`nodeguard.sources.cgroup_paths`).

A pod is read after its containers: their swap bounds bound its own
(:func:`~nodeguard.sources.unreclaimable.children_swap_bound`), and they need its effective
limit and swap room, which its files give.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from nodeguard.snapshot import ContainerMemory, PodMemory, QosClass
from nodeguard.sources.cgroup_layout import CgroupLayout, subdirs
from nodeguard.sources.cgroup_limits import min_limit, normalise_limit
from nodeguard.sources.cgroup_memory import own_swap_room
from nodeguard.sources.cgroup_paths import parse_container_dir, parse_pod_dir, parse_qos_dir
from nodeguard.sources.cgroup_records import CgroupRecords
from nodeguard.sources.pod_kills import PodKillTally
from nodeguard.sources.skipped import DuplicateError, Skipped

__all__ = ["PodWalk", "one_per_pod"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PodWalk:
    """Reads the pods under kubepods roots of ``layout`` into ``records``; v1 pods' OOM kills
    folded by ``kills``."""

    layout: CgroupLayout
    records: CgroupRecords
    kills: PodKillTally

    def root(self, *, root: Path, limit: int | None, total: int | None) -> list[PodMemory]:
        """Every pod under the kubepods root ``root``; ``limit``: the tightest limit down to
        it, ``total``: MemTotal (``None``: unknown)."""
        files = self.records.files
        pods: list[PodMemory] = []
        for entry in subdirs(root, files.skipped):
            qos = parse_qos_dir(entry.name)
            if qos is not None:
                own = files.limit(entry.path, version=self.layout.version, ino=entry.inode())
                qos_limit = min_limit(limit, normalise_limit(own, mem_total=total))
                for pod_entry in subdirs(entry.path, files.skipped):
                    pod = self._pod(entry=pod_entry, qos=qos, limit=qos_limit, total=total)
                    if pod is not None:
                        pods.append(pod)
                continue
            pod = self._pod(entry=entry, qos="guaranteed", limit=limit, total=total)
            if pod is not None:
                pods.append(pod)
        return pods

    def _pod(
        self, *, entry: os.DirEntry[str], qos: QosClass, limit: int | None, total: int | None
    ) -> PodMemory | None:
        uid = parse_pod_dir(entry.name)
        if uid is None:
            return None
        layout, records = self.layout, self.records
        path, ino = entry.path, entry.inode()
        parts = records.parts(path, layout.version, ino)
        if parts.usage is None and not os.path.isdir(path):
            return None  # removed between listing and reading
        # The pod is built after its containers (their swap bounds bound its own); they need
        # its effective limit and swap room, which its files give.
        pod_limit = min_limit(normalise_limit(parts.own_limit, mem_total=total), limit)
        pod_room = own_swap_room(parts)
        containers: list[ContainerMemory] = []
        listed: set[str] = set()
        read: list[str] = []
        for child in subdirs(path, records.files.skipped):
            parsed = parse_container_dir(child.name)
            if parsed is None:
                continue
            listed.add(parsed[0])
            cmem = records.read(
                layout=layout,
                path=child.path,
                ino=child.inode(),
                parent_limit=pod_limit,
                total=total,
                parent_room=pod_room,
            )
            if cmem is not None:
                read.append(child.path)
                containers.append(
                    ContainerMemory(container_id=parsed[0], runtime=parsed[1], memory=cmem)
                )
        memory = records.record(
            layout=layout,
            path=path,
            ino=ino,
            parts=parts,
            parent_limit=limit,
            total=total,
            swap=records.node_swap._replace(children=records.children_swap(layout, parts, read)),
        )
        memory = self.kills.fold(
            uid=uid, memory=memory, containers=tuple(containers), listed=frozenset(listed)
        )
        return PodMemory(uid=uid, qos_class=qos, memory=memory, containers=tuple(containers))


def _liveness(pod: PodMemory) -> tuple[int, int]:
    return len(pod.containers), pod.memory.usage_bytes or 0


def one_per_pod(pods: list[PodMemory], *, skipped: Skipped) -> list[PodMemory]:
    """One cgroup per pod UID. Two kubepods roots can hold one pod: a kubelet run in a
    container (kind, a kubelet-in-docker node) writes its tree under the container's cgroup
    (``/docker/<id>/kubepods``) while the host's view or a leftover tree shows a
    ``/kubepods`` beside it; exporting both doubles every series of the pod. The one kept
    has the most container cgroups, then the higher usage (a leftover directory of an old
    kubelet is empty), then comes first (outermost root); the others are counted as
    ``duplicate`` in ``nodeguard_collector_errors_total`` (``skipped``) and logged once each."""
    best: dict[str, PodMemory] = {}
    for pod in pods:
        kept = best.get(pod.uid)
        if kept is None:
            best[pod.uid] = pod
            continue
        dropped = pod
        if _liveness(pod) > _liveness(kept):
            dropped, kept = kept, pod
            best[kept.uid] = kept
        skipped.add(
            path=dropped.memory.path,
            exc=DuplicateError(f"pod {kept.uid} also at {kept.memory.path}, which is kept"),
        )
    return [p for p in pods if best[p.uid] is p]
