"""One cgroup's parsed files, and the node's swap bounds, made into a :class:`CgroupMemory`.

Which key of ``memory.stat`` and ``memory.events`` means what, by version
(Documentation/admin-guide/cgroup-v2.rst "Memory Interface Files";
Documentation/admin-guide/cgroup-v1/memory.rst): the table of :mod:`nodeguard.sources.cgroups`.
The unreclaimable memory and swap room arithmetic is :mod:`nodeguard.sources.unreclaimable`.
"""

from __future__ import annotations

import os
from typing import Literal, NamedTuple

from nodeguard.snapshot import CgroupMemory, Pressure
from nodeguard.sources.cgroup_limits import UNLIMITED_FLOOR, min_limit, normalise_limit
from nodeguard.sources.unreclaimable import (
    anon_lru,
    refault_file_pages,
    swap_room,
    unreclaimable_v1,
    unreclaimable_v2,
)

__all__ = [
    "EMPTY",
    "NO_SWAP",
    "Key",
    "ParsedFiles",
    "Swap",
    "build_memory",
    "own_swap_room",
    "swappable",
]

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")  # memory.stat counts refaults in pages
EMPTY: dict[str, int] = {}

Stat = dict[str, int] | None


class ParsedFiles(NamedTuple):
    """What one cgroup's files said, parsed (``None``: absent or skipped). Equal files (and
    parent limit, MemTotal) build an equal CgroupMemory."""

    stat: Stat
    usage: int | None
    events: Stat  # v2 memory.events, v1 memory.oom_control
    failcnt: int | None  # v1 only
    pressure: Pressure | None  # v2 only
    own_limit: int | None
    swap_max: int | None = None  # v2, read only where the node has swap free
    swap_current: int | None = None
    high: int | None = None  # v2 memory.high, read only where memory.events high > 0


class Swap(NamedTuple):
    """What bounds a cgroup's swap room besides its own files: the node's SwapFree (``None``:
    unknown or none), ``vm.swappiness``, the room its pod cgroup leaves (``None``: no bound or
    not a container) and, for a pod or the kubepods cgroup, what its children let swap
    (:func:`~nodeguard.sources.unreclaimable.children_swap_bound`; ``None``: not counted)."""

    node_free: int | None
    swappiness: int | None
    parent_room: int | None
    children: int | None = None


NO_SWAP = Swap(node_free=None, swappiness=None, parent_room=None)

#: What a CgroupMemory is built from: its files, parent limit, MemTotal and swap bounds.
Key = tuple[ParsedFiles, int | None, int | None, Swap]


def own_swap_room(parts: ParsedFiles) -> int | None:
    """``memory.swap.max - memory.swap.current``; ``None`` for no bound (``max``, or files
    absent: swap accounting off, or the node has no swap free and they were not read)."""
    if parts.swap_max is None or parts.swap_max >= UNLIMITED_FLOOR or parts.swap_current is None:
        return None
    return max(0, parts.swap_max - parts.swap_current)


def _room(parts: ParsedFiles, swap: Swap) -> int:
    """The cgroup's swap room: every bound of :class:`Swap` and its own files."""
    return swap_room(
        rooms=(swap.node_free, swap.parent_room, own_swap_room(parts), swap.children),
        swappiness=swap.swappiness,
    )


def swappable(key: Key) -> int:
    """Bytes of a v2 cgroup's anon LRU that fit its swap room, from what built it."""
    parts, swap = key[0], key[3]
    return min(anon_lru(parts.stat or EMPTY), _room(parts, swap))


def build_memory(
    *,
    rel: str,
    version: Literal[1, 2],
    parts: ParsedFiles,
    parent_limit: int | None,
    mem_total: int | None,
    swap: Swap,
) -> CgroupMemory:
    """The cgroup at ``rel`` (relative to the hierarchy root) from what its files said;
    ``parent_limit``: the tightest limit above it (``None``: none)."""
    stat = parts.stat or EMPTY
    events = parts.events or EMPTY
    usage = parts.usage
    if version == 2:
        inactive = stat.get("inactive_file")
        anon, file_ = stat.get("anon"), stat.get("file")
        limit_hits, high = events.get("max"), events.get("high")
    else:
        inactive = stat.get("total_inactive_file", stat.get("inactive_file"))
        anon = stat.get("total_rss", stat.get("rss"))
        file_ = stat.get("total_cache", stat.get("cache"))
        limit_hits, high = parts.failcnt, None
    working_set = None
    if usage is not None and inactive is not None:
        working_set = max(0, usage - inactive)
    if version == 2:
        unreclaimable = unreclaimable_v2(usage=usage, stat=stat, swap=_room(parts, swap))
    else:
        unreclaimable = unreclaimable_v1(stat=stat)
    refaults = refault_file_pages(stat=stat, version=version)
    limit = normalise_limit(parts.own_limit, mem_total=mem_total)
    return CgroupMemory(
        path=rel,
        cgroup_version=version,
        usage_bytes=usage,
        working_set_bytes=working_set,
        anon_bytes=anon,
        file_bytes=file_,
        inactive_file_bytes=inactive,
        limit_bytes=limit,
        effective_limit_bytes=min_limit(limit, parent_limit),
        oom_kills=events.get("oom_kill"),
        limit_hits=limit_hits,
        high_events=high,
        high_bytes=normalise_limit(parts.high, mem_total=mem_total),
        pressure=parts.pressure,
        unreclaimable_bytes=unreclaimable,
        refault_file_bytes=None if refaults is None else refaults * _PAGE_SIZE,
    )
