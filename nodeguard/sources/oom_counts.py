"""The OOM kills counted this boot: in all, by constraint (``CONSTRAINT_MEMCG``,
``CONSTRAINT_NONE``, ...: the kernel's ``oom_constraint_text``, mm/oom_kill.c), by container,
and the latest few, as :class:`~nodeguard.snapshot.OomLog` reports them."""

from __future__ import annotations

import logging
from collections import deque

from nodeguard.snapshot import OomKill, OomLog
from nodeguard.sources.oom_events import CONSTRAINTS, ParsedKill

__all__ = ["ContainerCount", "OomCounts"]

# The reader's logger, as before it was split: the log's repeat limits and operators' filters
# key on the logger's name.
log = logging.getLogger("nodeguard.sources.kmsg")

_RECENT_MAX = 256


class ContainerCount:
    """A container's victims and repeated kills, and when it was last counted (Unix time, for
    pruning; never a boot-time estimate)."""

    __slots__ = ("last", "repeats", "victims")

    def __init__(self, *, victims: int = 0, repeats: int = 0, last: float = 0.0) -> None:
        self.victims, self.repeats, self.last = victims, repeats, last


class OomCounts:
    """``total`` victims; ``by_constraint``: victims by constraint; ``by_container``: by
    ``"<pod uid>/<container id>"``; ``recent``: the latest 256 kills."""

    def __init__(self) -> None:
        self.total = 0
        self.by_constraint: dict[str, int] = dict.fromkeys(CONSTRAINTS, 0)
        self.by_container: dict[str, ContainerCount] = {}
        self.recent: deque[OomKill] = deque(maxlen=_RECENT_MAX)

    def count(self, parsed: ParsedKill, *, now: float, started: float) -> None:
        """Count one kill at Unix time ``now``: a victim, or a repeated kill of one
        (``memory.oom.group``: counted for its container only). Logged as a warning, or as
        information when it happened before ``started`` (the agent's start, Unix time) less a
        minute: the ring buffer's backlog is not news."""
        kill = parsed.kill
        count = None
        if kill.pod_uid:
            ckey = f"{kill.pod_uid}/{kill.container_id or ''}"
            count = self.by_container.setdefault(ckey, ContainerCount())
            count.last = now
        if parsed.repeat:
            if count is not None:
                count.repeats += 1
            log.info("kernel OOM kill of pid %d again (memory.oom.group)", kill.pid)
            return
        self.total += 1
        key = kill.constraint or "unknown"
        self.by_constraint[key] = self.by_constraint.get(key, 0) + 1
        self.recent.append(kill)
        if count is not None:
            count.victims += 1
        level = logging.WARNING if kill.time >= started - 60 else logging.INFO
        log.log(
            level,
            "kernel OOM kill%s: pid=%d process=%s cgroup=%s%s anon_rss_bytes=%s",
            "" if level == logging.WARNING else " (earlier this boot)",
            kill.pid,
            kill.process,
            kill.task_memcg,
            # memory.oom.group's cgroup only where the kernel killed a group (v2, 4.19+).
            f" group={kill.oom_group}" if kill.oom_group else "",
            kill.anon_rss_bytes,
        )

    def prune(self, *, cutoff: float) -> bool:
        """Drop the counts of the pods whose last kill was counted before ``cutoff``, all of a
        pod's containers at once: the exposition sums a container's IDs under its name (a
        container restarted after a kill has a new ID), and a sum that loses one ID while
        another stays would go down, which Prometheus takes for a counter reset."""
        last: dict[str, float] = {}
        for ckey, c in self.by_container.items():
            uid = ckey.partition("/")[0]
            last[uid] = max(last.get(uid, c.last), c.last)
        gone = [k for k in self.by_container if last[k.partition("/")[0]] < cutoff]
        for ckey in gone:
            del self.by_container[ckey]
        return bool(gone)

    def oom_log(self) -> OomLog:
        """The counts now, as a snapshot's ``oom`` (containers without any left out)."""
        return OomLog(
            total=self.total,
            by_constraint=dict(self.by_constraint),
            by_container={k: c.victims for k, c in self.by_container.items() if c.victims},
            recent=tuple(self.recent),
            repeats_by_container={k: c.repeats for k, c in self.by_container.items() if c.repeats},
        )
