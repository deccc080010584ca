"""The one sampler: builds a :class:`~nodeguard.snapshot.NodeSnapshot` every interval.

Reading the host is blocking file I/O (hundreds of small cgroup files on a full node), so each
sample runs in a worker thread and the event loop (web server, later the rule engine) never waits
on it. The thread is the sampler's own, not asyncio's default executor, so that nothing else
queued there (a blocked call of another part) can hold a sample back. Samples are scheduled on a
fixed grid; a sample that overruns the interval makes the next one start at once rather than
piling up.

**Focus sampling.** Polling loses to the kernel when a container goes from 95 % of its limit to
the limit within one interval (at 5 s: 8 MiB/s toward 512 MiB takes 3.2 s). So between full
samples, the containers (and pods) whose working set is at least ``focus_share`` of their
effective limit, those a kernel notification named (:meth:`Sampler.wake`), and the node while
MemAvailable is below ``node_focus_share`` of usable memory, are sampled every ``focus_interval``: a
*focused* sample re-reads ``/proc/meminfo``, the node's PSI, the kubepods cgroup and only those
cgroups (each collector's :meth:`~nodeguard.collectors.base.Collector.refresh`), and carries the
rest from the last sample. It is a snapshot like any other (``focused`` lists what it re-read),
handed to the same listeners; the rules evaluate the node and the re-read targets on it.
``wake(None)`` asks for a full sample at once (a PSI trigger: the whole node is stalling), at
most one a second.
"""

from __future__ import annotations

import asyncio
import logging
import math
from asyncio import FIRST_COMPLETED
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from nodeguard.sampling.builder import (
    COLLECTOR_NAMES,
    ClusterView,
    SamplerConfig,
    SnapshotBuilder,
)
from nodeguard.snapshot import CgroupMemory, NodeSnapshot

__all__ = [
    "COLLECTOR_NAMES",
    "MIN_WAKE_GAP",
    "ClusterView",
    "Sampler",
    "SamplerConfig",
    "hot_keys",
    "node_hot",
]

log = logging.getLogger(__name__)

Listener = Callable[[NodeSnapshot], Awaitable[None]]


#: The least time between two full samples that a wake-up asks for (a PSI trigger fires at
#: most once per window, but several triggers may follow one another).
MIN_WAKE_GAP = 1.0


def hot_keys(snapshot: NodeSnapshot, *, share: float) -> frozenset[str]:
    """The pods (UID) and containers (``<pod uid>/<container id>``) whose working set is at
    least ``share`` of their effective limit; a hot container's pod comes with it (pod-scope
    rules read the pod cgroup)."""
    hot: set[str] = set()

    def near(mem: CgroupMemory) -> bool:
        return (mem.limit_ratio or 0.0) >= share

    for pod in snapshot.pods:
        if near(pod.memory):
            hot.add(pod.uid)
        for c in pod.containers:
            if near(c.memory):
                hot.add(f"{pod.uid}/{c.container_id}")
                hot.add(pod.uid)
    return frozenset(hot)


def node_hot(snapshot: NodeSnapshot, *, share: float) -> bool:
    """Whether MemAvailable is below ``share`` of the node's usable memory
    (:attr:`~nodeguard.snapshot.MemInfo.usable_bytes`, the whole of node_memory_available_ratio)."""
    m = snapshot.meminfo
    if m is None or not m.usable_bytes or m.available_bytes is None:
        return False
    return m.available_bytes < share * m.usable_bytes


class Sampler(SnapshotBuilder):
    """The sampler of ``nodeguard run``: snapshots (:class:`SnapshotBuilder`) on the schedule
    of the module docstring, each handed to the listeners.

    ``sample_once()`` is synchronous (for ``nodeguard snapshot`` and tests); ``run()`` is the
    asyncio loop of ``nodeguard run``, sampling in the sampler's own thread. Listeners are
    awaited with each new snapshot, in order; a failing listener is logged and never stops
    sampling.
    """

    def __init__(self, *, config: SamplerConfig, cluster: ClusterView | None = None) -> None:
        super().__init__(config=config, cluster=cluster)
        self._listeners: list[Listener] = []
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sampler")
        self._woken: set[str] = set()
        self._full_wanted = False
        self._wakeup: asyncio.Event | None = None
        #: Pods and containers focused now, and whether the node is.
        self.focus: frozenset[str] = frozenset()
        self.node_focused = False

    def wake(self, key: str | None) -> None:
        """Sample ``key`` (a pod UID or ``<pod uid>/<container id>``) at once, in a focused
        sample; ``None``: the whole node, in a full sample (at most one a second). Call in the
        event loop's thread; before :meth:`run`, nothing happens."""
        if key is None:
            self._full_wanted = True
        else:
            self._woken.add(key)
        if self._wakeup is not None:
            self._wakeup.set()

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(snapshot)`` after every sample of :meth:`run`."""
        self._listeners.append(listener)

    def _refocus(self, snapshot: NodeSnapshot) -> None:
        cfg = self.config
        self.focus = hot_keys(snapshot, share=cfg.focus_share)
        self.node_focused = node_hot(snapshot, share=cfg.node_focus_share)

    async def run(self, *, stop: asyncio.Event) -> None:
        """Sample every ``interval`` seconds until ``stop`` is set, and in between, focused
        samples every ``focus_interval`` while anything is hot, and at once when woken."""
        loop = asyncio.get_running_loop()
        self._wakeup = wakeup = asyncio.Event()
        cfg = self.config
        next_full = loop.time()
        last_full = -math.inf
        focusing = cfg.focus_interval > 0
        next_focus = math.inf
        while not stop.is_set():
            now = loop.time()
            woken, self._woken = frozenset(self._woken), set()
            full = now >= next_full or (self._full_wanted and now - last_full >= MIN_WAKE_GAP)
            if full:
                self._full_wanted = False
                snapshot = await loop.run_in_executor(self._thread, self.sample_once)
                last_full = now
                if now >= next_full:
                    next_full = max(next_full + cfg.interval, loop.time())
            else:
                keys = woken | (self.focus if focusing else frozenset())
                snapshot = await loop.run_in_executor(self._thread, self.sample_focused, keys)
            self._refocus(snapshot)
            hot = focusing and (self.focus or self.node_focused)
            next_focus = loop.time() + cfg.focus_interval if hot else math.inf
            for listener in self._listeners:
                try:
                    await listener(snapshot)
                except Exception:
                    log.exception("snapshot listener %r failed", listener)
            wait = min(next_full, next_focus) - loop.time()
            if self._full_wanted:
                wait = min(wait, last_full + MIN_WAKE_GAP - loop.time())
            if wait > 0 and not self._woken:
                wakeup.clear()
                stopped = asyncio.ensure_future(stop.wait())
                woke = asyncio.ensure_future(wakeup.wait())
                await asyncio.wait({stopped, woke}, timeout=wait, return_when=FIRST_COMPLETED)
                for task in (stopped, woke):
                    task.cancel()

    def close(self) -> None:
        """Close what the collectors hold (:meth:`SnapshotBuilder.close`, after a sample in
        flight), then the sampler's thread."""
        super().close()
        self._thread.shutdown(wait=False)
