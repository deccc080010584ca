"""cgroup v1's pod OOM kills counted as v2 counts them (hierarchically)."""

from __future__ import annotations

from dataclasses import replace

from nodeguard.snapshot import CgroupMemory, ContainerMemory

__all__ = ["PodKillTally"]


class PodKillTally:
    """cgroup v1's pod OOM kills counted as v2 counts them.

    v2's ``memory.events`` counts hierarchically: a pod's ``oom_kill`` includes its containers'.
    v1's ``memory.oom_control`` ``oom_kill`` counts only the kills of tasks in that very cgroup
    (mm/memcontrol.c memcg_memory_event() walks up only on the default hierarchy, and the kill
    is charged to the victim's cgroup, a container's, even when the pod's limit was hit), so a
    v1 pod's own counter stays 0. Here a v1 pod's count is its own, plus its containers' now,
    plus the last count of each of its containers that has gone since (a container OOM-killed
    is restarted in a new cgroup): a counter that only grows while the pod lives.
    """

    def __init__(self) -> None:
        self._last: dict[str, dict[str, int]] = {}  # pod uid -> container id -> last count
        self._gone: dict[str, int] = {}  # pod uid -> kills of its containers that have gone

    def fold(
        self,
        *,
        uid: str,
        memory: CgroupMemory,
        containers: tuple[ContainerMemory, ...],
        listed: frozenset[str] | None,
    ) -> CgroupMemory:
        """``memory`` with the pod's count; ``listed``: the container ids whose directories the
        read found (one that could not be read keeps its last count), ``None`` for a re-read of
        the same containers."""
        if memory.cgroup_version != 1 or memory.oom_kills is None:
            return memory
        now = dict(self._last.get(uid, {}))
        # A count the kernel did not give this time (a file skipped, a container going) keeps
        # the last one: unknown is not 0.
        now.update(
            (c.container_id, c.memory.oom_kills)
            for c in containers
            if c.memory.oom_kills is not None
        )
        if listed is not None:
            gone = [cid for cid in now if cid not in listed]
            self._gone[uid] = self._gone.get(uid, 0) + sum(now.pop(cid) for cid in gone)
        self._last[uid] = now
        total = memory.oom_kills + sum(now.values()) + self._gone.get(uid, 0)
        return memory if total == memory.oom_kills else replace(memory, oom_kills=total)

    def keep(self, uids: set[str]) -> None:
        """Forget the pods not in ``uids`` (gone)."""
        for uid in [u for u in self._last if u not in uids]:
            del self._last[uid]
            self._gone.pop(uid, None)
