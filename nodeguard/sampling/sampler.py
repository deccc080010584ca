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
import dataclasses
import logging
import math
import threading
import time
from asyncio import FIRST_COMPLETED
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from nodeguard.collectors.base import Collector, Parts, ordered, run, run_refresh
from nodeguard.paths import HostPaths
from nodeguard.snapshot import CgroupMemory, CollectorStatus, NodeMeta, NodeSnapshot, PodMeta

__all__ = ["COLLECTOR_NAMES", "MIN_WAKE_GAP", "Sampler", "SamplerConfig", "hot_keys", "node_hot"]

log = logging.getLogger(__name__)

#: Every collector's name, in the order they read (also their ``--collector.<name>`` flags).
COLLECTOR_NAMES: tuple[str, ...] = tuple(c.name for c in ordered())


class ClusterView(Protocol):
    """What the sampler needs from the Kubernetes layer (the pod watcher), without importing
    it: this node's pods by UID and the node, once the first list has completed."""

    def is_synced(self) -> bool: ...

    def pods(self) -> Mapping[str, PodMeta]: ...

    def node(self) -> NodeMeta | None: ...


Listener = Callable[[NodeSnapshot], Awaitable[None]]


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplerConfig:
    """What to sample and how often. ``interval`` is seconds; ``collectors`` the enabled names
    (``None``: every registered collector); ``top_processes`` how many processes to keep;
    ``max_open_files`` how many cgroup files may stay open between samples (0: none;
    :mod:`nodeguard.sources.open_files`). Focus sampling (module docstring): every
    ``focus_interval`` seconds (0: off, as by default here; ``nodeguard run`` turns it on) for
    cgroups at ``focus_share`` (0..1) of their limit or more and the node below
    ``node_focus_share`` of usable memory available."""

    paths: HostPaths
    node_name: str
    interval: float = 5.0
    collectors: frozenset[str] | None = None
    top_processes: int = 10
    max_open_files: int = 0
    focus_interval: float = 0.0
    focus_share: float = 0.8
    node_focus_share: float = 0.1


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


class Sampler:
    """Builds snapshots from the enabled collectors, in :func:`~nodeguard.collectors.base.ordered`
    order; keeps the latest.

    ``sample_once()`` is synchronous (for ``nodeguard snapshot`` and tests); ``run()`` is the
    asyncio loop of ``nodeguard run``. With a ``cluster`` view, snapshots carry this node's pod
    metadata and the node's allocatable memory. Listeners are awaited with each new snapshot,
    in order; a failing listener is logged and never stops sampling.
    """

    def __init__(self, *, config: SamplerConfig, cluster: ClusterView | None = None) -> None:
        registered = ordered()
        names = {cls.name for cls in registered}
        enabled = names if config.collectors is None else set(config.collectors)
        unknown = enabled - names
        if unknown:
            raise ValueError(f"unknown collectors: {sorted(unknown)}")
        self.config = config
        self.cluster = cluster
        self.latest: NodeSnapshot | None = None
        self.collectors: list[Collector] = [
            cls(settings=config) for cls in registered if cls.name in enabled
        ]
        self._listeners: list[Listener] = []
        self._statuses: list[Callable[[], Iterable[CollectorStatus]]] = []
        self._lock = threading.Lock()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sampler")
        self._woken: set[str] = set()
        self._full_wanted = False
        self._wakeup: asyncio.Event | None = None
        #: Samples taken: full and focused (``nodeguard_sampler_samples_total``).
        self.samples = Counter[str]()
        #: Pods and containers focused now, and whether the node is.
        self.focus: frozenset[str] = frozenset()
        self.node_focused = False

    def add_statuses(self, source: Callable[[], Iterable[CollectorStatus]]) -> None:
        """Statuses to add to every snapshot's ``collectors`` (the kernel notifications say
        how they fare as ``nodeguard_collector_*{collector="notify_..."}``)."""
        self._statuses.append(source)

    def refresh_statuses(self) -> None:
        """Put the added statuses as they are now into :attr:`latest`: the notifications
        register on a snapshot after it is taken, so that its statuses are one sample old.
        Skipped while a sample is in flight (it takes them as they are)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            base = self.latest
            if base is None:
                return
            collectors = self._with_current_statuses(base)
            if collectors != base.collectors:
                self.latest = dataclasses.replace(base, collectors=collectors)
        finally:
            self._lock.release()

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

    def sample_once(self) -> NodeSnapshot:
        """Run every enabled collector once and return the snapshot (also kept as ``latest``).
        Thread-safe against :meth:`close`, which waits for a sample in flight."""
        with self._lock:
            return self._sample()

    def _sample(self) -> NodeSnapshot:
        started = time.time()
        parts = Parts()
        statuses = tuple(run(collector, parts) for collector in self.collectors)
        snapshot = NodeSnapshot(
            timestamp=started,
            node_name=self.config.node_name,
            collectors=(*statuses, *self._extra_statuses()),
            **self._cluster_parts(),
            **parts.fields(),
        )
        self.latest = snapshot
        self.samples["full"] += 1
        return snapshot

    def _extra_statuses(self) -> list[CollectorStatus]:
        out: list[CollectorStatus] = []
        for source in self._statuses:
            out.extend(source())
        return out

    def _with_current_statuses(self, base: NodeSnapshot) -> tuple[CollectorStatus, ...]:
        """``base``'s statuses with the added ones as they are now."""
        extra = self._extra_statuses()
        names = {s.name for s in extra}
        return (*(s for s in base.collectors if s.name not in names), *extra)

    def _cluster_parts(self) -> dict[str, Any]:
        cluster = self.cluster
        return {
            "pod_meta": cluster.pods() if cluster and cluster.is_synced() else None,
            "node_meta": cluster.node() if cluster else None,
        }

    def sample_focused(self, keys: frozenset[str]) -> NodeSnapshot:
        """A focused sample (module docstring) of ``keys`` on top of :attr:`latest` (a full
        sample when there is none yet); kept as ``latest``."""
        with self._lock:
            base = self.latest
            if base is None:
                return self._sample()
            started = time.time()
            parts = Parts.of(base)
            done: set[str] = set()
            for collector in self.collectors:
                done |= run_refresh(collector, parts, keys)
            snapshot = dataclasses.replace(
                base,
                timestamp=started,
                collectors=self._with_current_statuses(base),
                focused=tuple(sorted(done)),
                **self._cluster_parts(),
                **parts.fields(),
            )
            self.latest = snapshot
            self.samples["focused"] += 1
            return snapshot

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
        """Close what the collectors hold (cgroup files, the kernel log, whose state is kept;
        NVML)."""
        with self._lock:  # a sample in its worker thread finishes with what it holds first
            for collector in self.collectors:
                collector.close()
        self._thread.shutdown(wait=False)
