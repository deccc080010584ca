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
import dataclasses
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, TypeVar

from nodeguard.paths import HostPaths
from nodeguard.snapshot import CollectorStatus, NodeMeta, NodeSnapshot, PodMeta
from nodeguard.sources import cgroups, gpu, kmsg, meminfo, pressure, processes, run_source
from nodeguard.sources.skipped import Skipped

__all__ = ["COLLECTORS", "Sampler", "SamplerConfig"]

log = logging.getLogger(__name__)

#: Every collector, by the name that is also its ``--collector.<name>`` flag.
COLLECTORS: tuple[str, ...] = (
    meminfo.NAME,
    pressure.NAME,
    cgroups.NAME,
    kmsg.NAME,
    processes.NAME,
    gpu.NAME,
)

T = TypeVar("T")


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
    (a subset of :data:`COLLECTORS`); ``top_processes`` how many processes to keep;
    ``max_open_files`` how many cgroup files may stay open between samples (0: none;
    :mod:`nodeguard.sources.open_files`)."""

    paths: HostPaths
    node_name: str
    interval: float = 5.0
    collectors: frozenset[str] = frozenset(COLLECTORS)
    top_processes: int = 10
    max_open_files: int = 0


class Sampler:
    """Builds snapshots from the enabled sources; keeps the latest.

    ``sample_once()`` is synchronous (for ``nodeguard snapshot`` and tests); ``run()`` is the
    asyncio loop of ``nodeguard run``. With a ``cluster`` view, snapshots carry this node's pod
    metadata and the node's allocatable memory. Listeners are awaited with each new snapshot,
    in order;
    a failing listener is logged and never stops sampling.
    """

    def __init__(self, *, config: SamplerConfig, cluster: ClusterView | None = None) -> None:
        unknown = config.collectors - set(COLLECTORS)
        if unknown:
            raise ValueError(f"unknown collectors: {sorted(unknown)}")
        self.config = config
        self.cluster = cluster
        self.latest: NodeSnapshot | None = None
        # Entries each source left out (a bad file costs that entry only), by collector.
        self._skipped = {
            cgroups.NAME: Skipped(collector=cgroups.NAME),
            processes.NAME: Skipped(collector=processes.NAME),
        }
        self._cgroups = cgroups.CgroupSource(
            paths=config.paths,
            max_open_files=config.max_open_files,
            skipped=self._skipped[cgroups.NAME],
        )
        self._kmsg: kmsg.OomLogSource | None = None
        self._nvml: gpu.NvmlSource | None = None
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sampler")

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(snapshot)`` after every sample of :meth:`run`."""
        self._listeners.append(listener)

    def _collect(
        self, *, name: str, read: Callable[[], T], statuses: list[CollectorStatus]
    ) -> T | None:
        """Run one source if it is enabled, recording its status; its value or ``None``."""
        if name not in self.config.collectors:
            return None
        result = run_source(name=name, read=read)
        skipped = self._skipped.get(name)
        status = result.status
        if skipped is not None:
            status = dataclasses.replace(status, skipped=skipped.counts())
        statuses.append(status)
        return result.value

    def _oom_log(self) -> kmsg.OomLogSource:
        if self._kmsg is None:
            self._kmsg = kmsg.OomLogSource(paths=self.config.paths)
        return self._kmsg

    def _gpus(self) -> gpu.NvmlSource:
        if self._nvml is None:
            self._nvml = gpu.NvmlSource(paths=self.config.paths)
        return self._nvml

    def sample_once(self) -> NodeSnapshot:
        """Read every enabled source once and return the snapshot (also kept as ``latest``).
        Thread-safe against :meth:`close`, which waits for a sample in flight."""
        with self._lock:
            return self._sample()

    def _sample(self) -> NodeSnapshot:
        cfg = self.config
        paths = cfg.paths
        started = time.time()
        statuses: list[CollectorStatus] = []
        mem = self._collect(
            name=meminfo.NAME, read=lambda: meminfo.read_meminfo(paths=paths), statuses=statuses
        )
        psi = self._collect(
            name=pressure.NAME,
            read=lambda: pressure.read_node_pressure(paths=paths),
            statuses=statuses,
        )
        total = mem.total_bytes if mem else None
        cg = self._collect(
            name=cgroups.NAME, read=lambda: self._cgroups.read(mem_total=total), statuses=statuses
        )
        version, pods = cg if cg is not None else (None, ())
        # Where a process's cgroup path shows only its container (a cgroup namespace), the walk
        # knows the pod: container ID -> pod UID.
        containers = {c.container_id: p.uid for p in pods for c in p.containers}
        oom = self._collect(name=kmsg.NAME, read=lambda: self._oom_log().read(), statuses=statuses)
        procs = self._collect(
            name=processes.NAME,
            read=lambda: processes.read_top_processes(
                paths=paths,
                limit=cfg.top_processes,
                containers=containers,
                skipped=self._skipped[processes.NAME],
            ),
            statuses=statuses,
        )
        gpus = self._collect(
            name=gpu.NAME, read=lambda: self._gpus().read(containers=containers), statuses=statuses
        )

        snapshot = NodeSnapshot(
            timestamp=started,
            node_name=cfg.node_name,
            meminfo=mem,
            pressure=psi,
            pods=pods,
            oom=oom,
            processes=procs or (),
            collectors=tuple(statuses),
            cgroup_version=version,
            pod_meta=self.cluster.pods() if self.cluster and self.cluster.is_synced() else None,
            node_meta=self.cluster.node() if self.cluster else None,
            gpu=gpus,
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

    @property
    def open_cgroup_files(self) -> int:
        """Cgroup files the sampler holds open between samples now."""
        return self._cgroups.open_files

    def close(self) -> None:
        """Close the cgroup files held open; release the kernel log and keep its state; shut
        NVML down."""
        with self._lock:  # a sample in its worker thread finishes with what it holds first
            self._close()
        self._thread.shutdown(wait=False)

    def _close(self) -> None:
        self._cgroups.close()
        if self._kmsg is not None:
            self._kmsg.close()
        if self._nvml is not None:
            self._nvml.close()
