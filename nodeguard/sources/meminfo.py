"""``/proc/meminfo``: every field, and the derived node memory breakdown.

Format (Documentation/filesystems/proc.rst, fs/proc/meminfo.c): ``Name:   value kB`` lines, except
the ``HugePages_*`` lines, which are page counts without a unit.
"""

from __future__ import annotations

from nodeguard.paths import HostPaths
from nodeguard.snapshot import MemInfo
from nodeguard.sources import NoDataError
from nodeguard.sources.files import read_text

__all__ = ["derive_meminfo", "parse_meminfo", "read_meminfo"]

NAME = "meminfo"


def parse_meminfo(text: str) -> tuple[dict[str, int], dict[str, int]]:
    """Parse meminfo text into ``(bytes_fields, count_fields)``: ``kB`` lines in bytes (x1024),
    and unit-less lines (the ``HugePages_*`` page counts) as bare numbers. Blank and malformed
    lines are skipped, never guessed at."""
    fields: dict[str, int] = {}
    counts: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if not sep or not name.strip():
            continue
        parts = rest.split()
        if not parts or len(parts) > 2:
            continue
        try:
            value = int(parts[0])
        except ValueError:
            continue
        if len(parts) == 1:
            counts[name.strip()] = value
        elif parts[1] == "kB":
            fields[name.strip()] = value * 1024
    return fields, counts


def derive_meminfo(fields: dict[str, int], counts: dict[str, int] | None = None) -> MemInfo:
    """The derived breakdown of :class:`~nodeguard.snapshot.MemInfo` from parsed fields (bytes)
    and page counts.

    Raises :class:`NoDataError` when ``MemTotal`` is missing: without it nothing is meaningful.
    """
    total = fields.get("MemTotal")
    if total is None:
        raise NoDataError("meminfo has no MemTotal line")
    free = fields.get("MemFree")
    buffers = fields.get("Buffers")
    cached = fields.get("Cached")
    shmem = fields.get("Shmem")

    available = fields.get("MemAvailable")
    estimated = False
    # MemAvailable is absent before Linux 3.14, and some virtualised kernels print 0; either
    # way the classic estimate (free + buffers + page cache) is better than claiming no memory.
    if (available is None or (available == 0 and free)) and free is not None:
        available = min(total, free + (buffers or 0) + (cached or 0))
        estimated = True

    active_file = fields.get("Active(file)")
    inactive_file = fields.get("Inactive(file)")
    if active_file is not None and inactive_file is not None:
        page_cache: int | None = active_file + inactive_file
    elif cached is not None:
        page_cache = max(0, cached + (buffers or 0) - (shmem or 0))
    else:
        page_cache = None

    return MemInfo(
        fields=dict(fields),
        page_counts=dict(counts or {}),
        total_bytes=total,
        free_bytes=free,
        available_bytes=available,
        available_estimated=estimated,
        used_bytes=None if available is None else max(0, total - available),
        buffers_bytes=buffers,
        cached_bytes=cached,
        page_cache_bytes=page_cache,
        shmem_bytes=shmem,
        slab_reclaimable_bytes=fields.get("SReclaimable"),
        slab_unreclaimable_bytes=fields.get("SUnreclaim"),
        swap_total_bytes=fields.get("SwapTotal"),
        swap_free_bytes=fields.get("SwapFree"),
    )


def read_meminfo(*, paths: HostPaths) -> MemInfo:
    """Read and derive ``<procfs>/meminfo``. Raises :class:`NoDataError` when it is absent."""
    fields, counts = parse_meminfo(read_text(paths.proc("meminfo")))
    return derive_meminfo(fields, counts)
