"""What the incident page draws: the record's ``timeline`` as the data of two charts.

x is seconds from the incident (the kill, or the firing): negative before it, 0 at it.

- **Node memory** (:func:`memory_stack`): each point's usable memory split into parts that add
  up to it exactly, stacked.
- **Containers**: the working set of every container the points carry (the largest and the
  victim's, :mod:`nodeguard.remediation.timeline`), one line each named by its ``name``; the
  victim's limit (a kill's; a container firing's target's) as a dashed line; and each event as a
  vertical line of its own, named in the legend: the ``OOM kill`` at 0, the firings linked to
  it before it, or for a firing ``<rule> fired`` at 0 and its ``OOM kill`` after it.

:func:`chart_specs` gives them as plain data (JSON-ready, values in the chart's unit), which the
page's script (``static/incident-page.js``) turns into Chart.js charts.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from nodeguard.units import format_bytes

__all__ = ["MEMORY_PARTS", "OOM_KILL", "chart_specs", "memory_stack", "when"]

#: The label of the kill's vertical line.
OOM_KILL = "OOM kill"


class Part(NamedTuple):
    """One layer of the node memory chart: its legend label and colour."""

    label: str
    color: str


#: The node memory chart's layers, bottom to top (:func:`memory_stack`).
MEMORY_PARTS = (
    Part("workloads (anon & other)", "#d62728"),
    Part("slab unreclaimable", "#9467bd"),
    Part("shmem (tmpfs)", "#e377c2"),
    Part("slab reclaimable", "#bcbd22"),
    Part("page cache", "#1f77b4"),
    Part("free (rest of available)", "#2ca02c"),
)
_LINES = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")
_VICTIM, _LIMIT, _FIRED = "#d62728", "#7f0000", "#555555"
GiB, MiB = 1 << 30, 1 << 20


def memory_stack(memory: Mapping[str, Any]) -> dict[str, int] | None:
    """One timeline point's ``memory`` (bytes) as the layers of :data:`MEMORY_PARTS` (label ->
    bytes), which add up to ``usable_bytes`` exactly; ``None`` without usable or available.

    Derived from :class:`~nodeguard.snapshot.MemInfo`'s breakdown: usable = used + available
    (``used = usable - MemAvailable``). Within used: ``SUnreclaim`` and ``Shmem``, which no
    reclaim frees and MemAvailable never counts, and the rest as "workloads (anon & other)".
    Within available: the page cache (file LRU) and ``SReclaimable``, then the rest
    ("free"). Approximate, where the kernel's own split is not in /proc/meminfo: MemAvailable
    (mm/show_mem.c ``si_mem_available``) holds back part of the page cache and of the
    reclaimable slab (the smaller of half of each and the low watermark) and the free pages
    below the watermarks; those are in used, so in "workloads", with kernel stacks, page
    tables, vmalloc and drivers' pages; so page cache and slab reclaimable are each capped at
    what is left of available, SUnreclaim and Shmem at what is left of used, and the stack
    never exceeds usable."""
    usable, available = memory.get("usable_bytes"), memory.get("available_bytes")
    if usable is None or available is None:
        return None
    avail = min(max(int(available), 0), int(usable))
    used = int(usable) - avail
    unreclaimable = min(int(memory.get("slab_unreclaimable_bytes") or 0), used)
    shmem = min(int(memory.get("shmem_bytes") or 0), used - unreclaimable)
    cache = min(int(memory.get("page_cache_bytes") or 0), avail)
    reclaimable = min(int(memory.get("slab_reclaimable_bytes") or 0), avail - cache)
    values = (
        used - unreclaimable - shmem,
        unreclaimable,
        shmem,
        reclaimable,
        cache,
        avail - cache - reclaimable,
    )
    return {part.label: v for part, v in zip(MEMORY_PARTS, values, strict=True)}


def when(record: Mapping[str, Any]) -> str:
    """The record's time in UTC to the millisecond: ``2026-12-07 14:59:40.826 UTC``."""
    at = dt.datetime.fromtimestamp(float(record.get("time") or 0), tz=dt.UTC)
    return at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _unit(largest: float) -> tuple[str, int]:
    """The unit a chart's axis is in: GiB from 4 GiB up, else MiB."""
    return ("GiB", GiB) if largest >= 4 * GiB else ("MiB", MiB)


def _dataset(label: str, color: str, points: list[list[float]], **more: Any) -> dict[str, Any]:
    return {"label": label, "color": color, "points": points, **more}


def _memory_chart(record: Mapping[str, Any], points: list[dict[str, Any]]) -> dict[str, Any]:
    stacks = [(p["time"] - record["time"], memory_stack(p.get("memory") or {})) for p in points]
    largest = max((sum(s.values()) for _, s in stacks if s), default=0)
    unit, scale = _unit(largest)
    datasets = [
        _dataset(
            part.label,
            part.color,
            [[round(x, 3), round(s[part.label] / scale, 4)] for x, s in stacks if s],
            fill=True,
        )
        for part in MEMORY_PARTS
    ]
    return {
        "canvas": "memory-chart",
        "title": "Node memory (usable, stacked)",
        "unit": unit,
        "stacked": True,
        "datasets": datasets,
    }


def _limit(record: Mapping[str, Any], points: list[dict[str, Any]]) -> tuple[str, int | None]:
    """The victim's key and limit: a kill's, as the sample before it had it; else (a firing
    on a container, or a kill whose record lacks it) the latest the points give its key."""
    key = str(record.get("target") or "")
    victim = record.get("victim") or {}
    if record.get("kind") == "oom_kill" and victim.get("limit_bytes"):
        return key, int(victim["limit_bytes"])
    limits = [
        c.get("limit_bytes")
        for p in points
        for c in p.get("containers") or []
        if c.get("key") == key
    ]
    return key, next((int(x) for x in reversed(limits) if x), None)


def _events(record: Mapping[str, Any]) -> list[tuple[float, str, str]]:
    """``(x, label, colour)`` of each event drawn as a vertical line."""
    if record.get("kind") == "oom_kill":
        events = [(0.0, OOM_KILL, _VICTIM)]
        for link in record.get("linked") or []:
            ahead = float(link.get("seconds_before_kill") or 0)
            events.append((-ahead, f"{link.get('rule')} fired ({ahead:.1f} s before)", _FIRED))
        return events
    events = [(0.0, f"{record.get('rule')} fired", _FIRED)]
    later = record.get("killed_later")
    if later:
        events.append((float(later.get("seconds_after") or 0), OOM_KILL, _VICTIM))
    return events


def _container_chart(record: Mapping[str, Any], points: list[dict[str, Any]]) -> dict[str, Any]:
    key, limit = _limit(record, points)
    lines: dict[str, tuple[str, list[tuple[float, int]]]] = {}
    for p in points:
        for c in p.get("containers") or []:
            name, seen = lines.setdefault(c["key"], (c.get("name") or c["key"], []))
            seen.append((p["time"] - record["time"], c["working_set_bytes"]))
    events = _events(record)
    xs = [x for _, seen in lines.values() for x, _ in seen] + [x for x, _, _ in events]
    largest = max([ws for _, seen in lines.values() for _, ws in seen] + [limit or 0])
    unit, scale = _unit(largest)
    datasets = []
    for i, (k, (name, seen)) in enumerate(lines.items()):
        color = _VICTIM if k == key else _LINES[i % len(_LINES)]
        line = [[round(x, 3), round(ws / scale, 4)] for x, ws in seen]
        datasets.append(_dataset(name, color, line, victim=k == key))
    if limit:
        at = round(limit / scale, 4)
        who = "victim's" if record.get("kind") == "oom_kill" else "target's"
        datasets.append(
            _dataset(
                f"{who} limit {format_bytes(limit)}",
                _LIMIT,
                [[round(min(xs), 3), at], [round(max(xs), 3), at]],
                dash=True,
            )
        )
    top = round(largest * 1.05 / scale, 4)
    for x, label, color in events:
        datasets.append(_dataset(label, color, [[x, 0], [x, top]], marker=True))
    return {
        "canvas": "containers-chart",
        "title": "Containers' working sets",
        "unit": unit,
        "stacked": False,
        "datasets": datasets,
    }


def chart_specs(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The two charts of ``record``'s timeline (module docstring), or none without points.
    Each: ``canvas`` (its element's id), ``title``, ``unit`` (of y: ``MiB`` or ``GiB``),
    ``stacked``, ``x_title``, ``x_min`` and ``x_max`` (whole seconds, the same for both) and
    ``datasets`` (``label``, ``color``, ``points`` as ``[seconds, value]``, and where they
    apply ``fill`` (a layer), ``victim`` (its working set), ``dash`` (the limit) or ``marker``
    (an event's vertical line))."""
    points = [p for p in record.get("timeline") or [] if "time" in p]
    if not points:
        return []
    what = "the OOM kill" if record.get("kind") == "oom_kill" else "the firing"
    charts = [_memory_chart(record, points), _container_chart(record, points)]
    # One x range for both, in whole seconds, with room after the last line (a kill at 0 is
    # not drawn on the edge).
    xs = [x for c in charts for d in c["datasets"] for x, _ in d["points"]]
    low, high = min(xs), max(xs)
    x_range = {"x_min": math.floor(low), "x_max": math.ceil(high + max(0.1, (high - low) / 50))}
    x_title = f"seconds from {what} ({when(record)})"
    return [{**c, "x_title": x_title, **x_range} for c in charts]
