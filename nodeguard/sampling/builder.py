"""One sample: every enabled collector read once (a full sample), or a focused sample that
re-reads only what is named and carries the rest (:mod:`nodeguard.sampling.sampler` says when
each is taken).

:class:`SnapshotBuilder` holds the enabled collectors (in
:func:`~nodeguard.collectors.base.ordered` order), the latest snapshot, and the statuses added
to every snapshot (the kernel notifications'). A sample holds its lock, so :meth:`close` waits
for one in flight.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from nodeguard.collectors.base import Collector, Parts, ordered, run, run_refresh
from nodeguard.paths import HostPaths
from nodeguard.snapshot import CollectorStatus, NodeMeta, NodeSnapshot, PodMeta

__all__ = ["COLLECTOR_NAMES", "ClusterView", "SamplerConfig", "SnapshotBuilder"]

#: Every collector's name, in the order they read (also their ``--collector.<name>`` flags).
COLLECTOR_NAMES: tuple[str, ...] = tuple(c.name for c in ordered())


class ClusterView(Protocol):
    """What the sampler needs from the Kubernetes layer (the pod watcher), without importing
    it: this node's pods by UID and the node, once the first list has completed."""

    def is_synced(self) -> bool: ...

    def pods(self) -> Mapping[str, PodMeta]: ...

    def node(self) -> NodeMeta | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplerConfig:
    """What to sample and how often. ``interval`` is seconds; ``collectors`` the enabled names
    (``None``: every registered collector); ``top_processes`` how many processes to keep;
    ``max_open_files`` how many cgroup files may stay open between samples (0: none;
    :mod:`nodeguard.sources.open_files`). Focus sampling (:mod:`nodeguard.sampling.sampler`):
    every ``focus_interval`` seconds (0: off, as by default here; ``nodeguard run`` turns it on)
    for cgroups at ``focus_share`` (0..1) of their limit or more and the node below
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


class SnapshotBuilder:
    """Builds snapshots from the enabled collectors, in :func:`~nodeguard.collectors.base.ordered`
    order; keeps the latest. With a ``cluster`` view, snapshots carry this node's pod metadata
    and the node's allocatable memory. ``ValueError`` for an unknown collector name."""

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
        self._statuses: list[Callable[[], Iterable[CollectorStatus]]] = []
        self._lock = threading.Lock()
        #: Samples taken: full and focused (``nodeguard_sampler_samples_total``).
        self.samples = Counter[str]()

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
        """A focused sample (:mod:`nodeguard.sampling.sampler`) of ``keys`` on top of
        :attr:`latest` (a full sample when there is none yet); kept as ``latest``."""
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

    def close(self) -> None:
        """Close what the collectors hold (cgroup files, the kernel log, whose state is kept;
        NVML)."""
        with self._lock:  # a sample in its worker thread finishes with what it holds first
            for collector in self.collectors:
                collector.close()
