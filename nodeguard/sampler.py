"""The one sampler: builds a :class:`~nodeguard.snapshot.NodeSnapshot` every interval.

Reading the host is blocking file I/O (hundreds of small cgroup files on a full node), so each
sample runs in a worker thread and the event loop (web server, later the rule engine) never waits
on it. The thread is the sampler's own, not asyncio's default executor, so that nothing else
queued there (a blocked call of another part) can hold a sample back. Samples are scheduled on a
fixed grid; a sample that overruns the interval makes the next one start at once rather than
piling up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from nodeguard.collectors.base import Collector, Parts, ordered, run
from nodeguard.paths import HostPaths
from nodeguard.snapshot import NodeMeta, NodeSnapshot, PodMeta

__all__ = ["COLLECTORS", "Sampler", "SamplerConfig"]

log = logging.getLogger(__name__)

#: Every collector's name, in the order they read (also their ``--collector.<name>`` flags).
COLLECTORS: tuple[str, ...] = tuple(c.name for c in ordered())


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
    :mod:`nodeguard.sources.open_files`)."""

    paths: HostPaths
    node_name: str
    interval: float = 5.0
    collectors: frozenset[str] | None = None
    top_processes: int = 10
    max_open_files: int = 0


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
        self._lock = threading.Lock()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sampler")

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
        cluster = self.cluster
        snapshot = NodeSnapshot(
            timestamp=started,
            node_name=self.config.node_name,
            collectors=statuses,
            pod_meta=cluster.pods() if cluster and cluster.is_synced() else None,
            node_meta=cluster.node() if cluster else None,
            **parts.fields(),
        )
        self.latest = snapshot
        return snapshot

    async def run(self, *, stop: asyncio.Event) -> None:
        """Sample every ``interval`` seconds until ``stop`` is set."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not stop.is_set():
            snapshot = await loop.run_in_executor(self._thread, self.sample_once)
            for listener in self._listeners:
                try:
                    await listener(snapshot)
                except Exception:
                    log.exception("snapshot listener %r failed", listener)
            next_at = max(next_at + self.config.interval, loop.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=next_at - loop.time())

    def close(self) -> None:
        """Close what the collectors hold (cgroup files, the kernel log, whose state is kept;
        NVML)."""
        with self._lock:  # a sample in its worker thread finishes with what it holds first
            for collector in self.collectors:
                collector.close()
        self._thread.shutdown(wait=False)
