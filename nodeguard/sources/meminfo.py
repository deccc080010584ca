"""``/proc/meminfo``: every field, and the derived node memory breakdown.

Format (Documentation/filesystems/proc.rst, fs/proc/meminfo.c): ``Name:   value kB`` lines, except
the ``HugePages_*`` lines, which are page counts without a unit.
"""

from __future__ import annotations

from nodeguard.paths import HostPaths
from nodeguard.snapshot import MemInfo
from nodeguard.sources import NoDataError
from nodeguard.sources.files import read_file

__all__ = ["derive_meminfo", "parse_meminfo", "read_meminfo"]


# MemAvailable reading 0 is believed unless MemFree exceeds this share of MemTotal: the kernel's
# reserves (high watermarks + lowmem_reserve, mm/page_alloc.c) stay well below it.
_BOGUS_ZERO_FREE_SHARE = 1 / 16


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
        if value < 0:
            continue  # the kernel prints these unsigned: a negative one is not a size
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
    # MemAvailable is absent before Linux 3.14. A 0 is true near an OOM (si_mem_available()
    # clamps at 0 while MemFree still holds the watermark reserves, a few percent of RAM at
    # most) but bogus while MemFree is large (some virtualised kernels print 0): only then is
    # the estimate better than the kernel's word.
    bogus_zero = available == 0 and free is not None and free > total * _BOGUS_ZERO_FREE_SHARE
    if (available is None or bogus_zero) and free is not None:
        # Shmem sits in Cached but only swap can free it.
        reclaimable = (buffers or 0) + max(0, (cached or 0) - (shmem or 0))
        available = min(total, free + reclaimable)
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
    """Read and derive ``<procfs>/meminfo``.

    Raises ``FileNotFoundError`` when it is absent and ``ValueError`` when it has no
    ``MemTotal``: every Linux procfs has both, so either means a wrong ``--path.procfs`` (a
    failure to alert on), not a host without the data.
    """
    fields, counts = parse_meminfo(read_file(paths.proc("meminfo")))
    try:
        return derive_meminfo(fields, counts)
    except NoDataError as exc:
        raise ValueError(f"{paths.proc('meminfo')}: {exc}") from exc
