"""A focused re-read: only some pods and containers of the last full read, between full reads.

Keys: a pod's UID (its pod cgroup) or ``<pod uid>/<container id>`` (that container and its pod).
"""

from __future__ import annotations

from dataclasses import dataclass

from nodeguard.snapshot import CgroupMemory, ContainerMemory, PodMemory
from nodeguard.sources.cgroup_layout import CgroupLayout
from nodeguard.sources.cgroup_records import CgroupRecords
from nodeguard.sources.pod_kills import PodKillTally

__all__ = ["PodRefresh"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PodRefresh:
    """Re-reads cgroups of ``layout`` that ``records`` holds from the last full read; v1 pods'
    OOM kills folded by ``kills``."""

    layout: CgroupLayout
    records: CgroupRecords
    kills: PodKillTally

    def pods(
        self, pods: tuple[PodMemory, ...], *, keys: frozenset[str], mem_total: int | None
    ) -> tuple[tuple[PodMemory, ...], frozenset[str]]:
        """The pods of ``pods`` whose keys are in ``keys`` read again, the others as they were;
        and the keys re-read (see :meth:`nodeguard.sources.cgroups.CgroupReader.refresh`)."""
        root = str(self.layout.root)
        out: list[PodMemory] = []
        done: set[str] = set()
        for pod in pods:
            wanted = {
                c.container_id for c in pod.containers if f"{pod.uid}/{c.container_id}" in keys
            }
            if pod.uid not in keys and not wanted:
                out.append(pod)
                continue
            # Its containers first: their swap bounds bound the pod's own.
            containers = tuple(
                ContainerMemory(
                    container_id=c.container_id,
                    runtime=c.runtime,
                    memory=self._refreshed(
                        root + c.memory.path,
                        f"{pod.uid}/{c.container_id}",
                        c.memory,
                        mem_total,
                        done,
                    ),
                )
                if c.container_id in wanted
                else c
                for c in pod.containers
            )
            memory = self._refreshed(
                root + pod.memory.path,
                pod.uid,
                pod.memory,
                mem_total,
                done,
                children=tuple(root + c.memory.path for c in containers),
            )
            memory = self.kills.fold(uid=pod.uid, memory=memory, containers=containers, listed=None)
            out.append(
                PodMemory(
                    uid=pod.uid, qos_class=pod.qos_class, memory=memory, containers=containers
                )
            )
        return tuple(out), frozenset(done)

    def _refreshed(
        self,
        path: str,
        key: str,
        last: CgroupMemory,
        total: int | None,
        done: set[str],
        *,
        children: tuple[str, ...] | None = None,
    ) -> CgroupMemory:
        """The cgroup at ``path`` read again (its key added to ``done``), or ``last`` when it
        cannot be: not in the last full read, or gone since. ``children``: a pod's container
        cgroups (see :meth:`CgroupRecords.read`)."""
        built = self.records.built.get(path)
        if built is None:
            return last
        memory = self.records.reread(
            layout=self.layout,
            path=path,
            ino=built[2],
            parent_limit=built[0][1],
            total=total,
            parent_room=built[0][3].parent_room,
            children=children,
        )
        if memory is None:
            return last
        done.add(key)
        return memory
