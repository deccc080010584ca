"""The node's memory in the minutes before now: a bounded, in-memory history of samples that
every incident record carries (an OOM kill's, a firing's), so the record shows how the node
got there, not only where it ended.

A point is small and plain (JSON-ready): the time, the node's memory breakdown (bytes:
usable, available, used, page cache, slab reclaimable and unreclaimable, shmem), memory PSI
``some``/``full`` ``avg10`` (0..1), and some containers: the :data:`TOP` largest by working set
and every one at or above :data:`NEAR_LIMIT` of its limit (the next cgroup OOM is among them:
the kernel kills a cgroup at its limit, the node's OOM killer picks from the largest), each
with its working set, unreclaimable memory and limit. Every container of every sample would
be 300 times more: a 330-container node sampled every 5 s is 40,000 entries in 10 minutes.

The history is bounded twice: by age (:attr:`Timeline.seconds`, 10 minutes by default) and by
size (:attr:`Timeline.max_bytes`, the points' JSON, 1 MiB by default; the oldest go first), and
a point is kept at most every :attr:`Timeline.spacing` seconds (focused samples come every few
hundred milliseconds while a container nears its limit; one a quarter second is enough to see
the growth). ``nodeguard_timeline_points`` and ``nodeguard_timeline_bytes`` show its size.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nodeguard.snapshot import NodeSnapshot, memory_breakdown

__all__ = [
    "NEAR_LIMIT",
    "RECORD_BYTES",
    "RECORD_POINTS",
    "TOP",
    "Timeline",
    "TimelineCollector",
    "point_of",
]

#: The most points, and about the most bytes of them, an incident record carries
#: (:meth:`Timeline.window`): a record stays small whatever the history holds.
RECORD_POINTS = 120
RECORD_BYTES = 128 << 10
#: The largest containers by working set kept in each point.
TOP = 5
#: A container at or above this share of its limit is kept in each point whatever its size.
NEAR_LIMIT = 0.8
_MEMORY_KEYS = (
    "usable_bytes",
    "available_bytes",
    "used_bytes",
    "page_cache_bytes",
    "slab_reclaimable_bytes",
    "slab_unreclaimable_bytes",
    "shmem_bytes",
)


def point_of(snapshot: NodeSnapshot) -> dict[str, Any]:
    """One point of the history from a snapshot (module docstring)."""
    memory = memory_breakdown(snapshot.meminfo) if snapshot.meminfo else {}
    psi = snapshot.pressure
    sized: list[tuple[int, int | None, dict[str, Any]]] = []
    for pod, c in snapshot.containers():
        ws, limit = c.memory.working_set_bytes, c.memory.effective_limit_bytes
        if ws is None:
            continue
        labels = snapshot.labels_for(pod.uid, c.container_id)
        entry = {
            "key": f"{pod.uid}/{c.container_id}",
            "name": "/".join(x for x in (labels.namespace, labels.pod, labels.container) if x),
            "working_set_bytes": ws,
            "unreclaimable_bytes": c.memory.unreclaimable_bytes,
            "limit_bytes": limit,
        }
        sized.append((ws, limit, entry))
    sized.sort(key=lambda x: x[0], reverse=True)
    kept = [e for _, _, e in sized[:TOP]] + [
        e for ws, limit, e in sized[TOP:] if limit and ws >= NEAR_LIMIT * limit
    ]
    return {
        "time": snapshot.timestamp,
        "memory": {k: memory.get(k) for k in _MEMORY_KEYS},
        "psi_some_avg10": psi.some.avg10 if psi and psi.some else None,
        "psi_full_avg10": psi.full.avg10 if psi and psi.full else None,
        "containers": kept,
    }


class Timeline:
    """The bounded history (module docstring). :meth:`push` each snapshot; :meth:`window`
    gives the points up to a time."""

    def __init__(
        self, *, seconds: float = 600.0, max_bytes: int = 1 << 20, spacing: float = 0.25
    ) -> None:
        self.seconds, self.max_bytes, self.spacing = seconds, max_bytes, spacing
        self._points: deque[tuple[dict[str, Any], int]] = deque()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._points)

    def push(self, snapshot: NodeSnapshot) -> None:
        """Add a point for ``snapshot`` (skipped when the last point is less than
        :attr:`spacing` older), then drop what is too old or over the size."""
        last = self._points[-1][0]["time"] if self._points else None
        if last is not None and snapshot.timestamp - last < self.spacing:
            return
        point = point_of(snapshot)
        size = len(json.dumps(point, separators=(",", ":")))
        self._points.append((point, size))
        self.bytes += size
        horizon = snapshot.timestamp - self.seconds
        while self._points and (
            self._points[0][0]["time"] < horizon or self.bytes > self.max_bytes
        ):
            _, dropped = self._points.popleft()
            self.bytes -= dropped

    def window(
        self,
        *,
        until: float,
        most: int = RECORD_POINTS,
        keys: frozenset[str] = frozenset(),
        budget: int = RECORD_BYTES,
    ) -> list[dict[str, Any]]:
        """The points at or before ``until`` (Unix seconds), oldest first, for a record: each
        point's containers cut to the :data:`TOP` largest and those of ``keys`` (the
        victim's), and at most ``most`` points and about ``budget`` bytes of JSON: the newest
        half as they are (the last seconds before an OOM kill are the growth that matters),
        the older ones thinned evenly to the other half."""
        points = [_cut(p, keys) for p, _ in self._points if p["time"] <= until]
        sizes = [len(json.dumps(p, separators=(",", ":"))) for p in points]
        average = max(1, sum(sizes) // len(sizes)) if sizes else 1
        most = max(2, min(most, budget // average))
        if len(points) <= most:
            return points
        recent, older = most // 2, points[: len(points) - most // 2]
        step = len(older) / (most - recent)
        thinned = [older[int(i * step)] for i in range(most - recent)]
        return thinned + points[len(points) - recent :]


def _cut(point: dict[str, Any], keys: frozenset[str]) -> dict[str, Any]:
    """``point`` with its containers cut to the largest :data:`TOP` and those of ``keys``."""
    containers = point["containers"]
    kept = containers[:TOP] + [c for c in containers[TOP:] if c["key"] in keys]
    return {**point, "containers": kept}


class TimelineCollector(Collector):
    """``nodeguard_timeline_points`` and ``nodeguard_timeline_bytes``: the history's size."""

    def __init__(self, *, timeline: Timeline) -> None:
        self._timeline = timeline

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        points = GaugeMetricFamily(
            "nodeguard_timeline_points",
            "points in the memory history that incident records carry (bounded by age and size)",
        )
        points.add_metric([], len(self._timeline))
        size = GaugeMetricFamily(
            "nodeguard_timeline_bytes",
            "size of the memory history's points as JSON, in bytes (bounded)",
        )
        size.add_metric([], self._timeline.bytes)
        yield from (points, size)
