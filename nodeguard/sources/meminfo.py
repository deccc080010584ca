"""``/proc/meminfo``: every field, and the derived node memory breakdown.

Format (Documentation/filesystems/proc.rst, fs/proc/meminfo.c): ``Name:   value kB`` lines, except
the ``HugePages_*`` lines, which are page counts without a unit.

Usable memory (:attr:`~nodeguard.snapshot.MemInfo.usable_bytes`) is ``MemTotal`` less what is
counted in it but can never become ``MemAvailable``: the persistent hugetlb pool
(:func:`hugetlb_pool_bytes`) and ``HardwareCorrupted``. Left in, each for its reason:

- ``CmaTotal``: unused CMA pages serve movable allocations (page cache, anon) and count in
  ``MemFree``/``MemAvailable`` (``NR_FREE_PAGES`` holds ``NR_FREE_CMA_PAGES``); a driver's CMA
  allocation is memory in use, not a carve-out.
- ``Balloon`` (6.15+): virtio_balloon and the Xen/PowerPC balloons already take inflated pages
  out of ``MemTotal`` (``adjust_managed_page_count``), except with VIRTIO_BALLOON_F_DEFLATE_ON_OOM,
  where they come back before an OOM kill; subtracting them would count them twice.
- ``Unaccepted`` (TDX/SEV-SNP guests, 6.5+): accepted by the page allocator on demand and
  accounted as free pages meanwhile (mm/page_alloc.c ``__accept_page``).
- Surplus huge pages (``HugePages_Surp``): taken from the normal page pool on demand and given
  back once unused (Documentation/admin-guide/mm/hugetlbpage.rst): regular memory in use.
- ``Mlocked``/``Unevictable``, ``KernelStack``, ``PageTables``, ``Percpu``: memory in use, freed
  when its owner lets go. Boot-time reservations (``crashkernel=``, ``memmap=``) are not in
  ``MemTotal`` at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from nodeguard.paths import HostPaths
from nodeguard.snapshot import MemInfo
from nodeguard.sources import NoDataError
from nodeguard.sources.files import read_file
from nodeguard.sources.hugepages import HugePagePool, read_hugepage_pools

__all__ = ["derive_meminfo", "hugetlb_pool_bytes", "parse_meminfo", "read_meminfo"]


# MemAvailable reading 0 is believed unless MemFree exceeds this share of usable memory: the
# kernel's reserves (high watermarks + lowmem_reserve, mm/page_alloc.c) stay well below it.
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


def hugetlb_pool_bytes(
    fields: dict[str, int],
    counts: dict[str, int],
    pools: Sequence[HugePagePool] | None = None,
) -> int:
    """The persistent hugetlb pool of every huge page size, in bytes (0 when there is none).

    ``fields``/``counts`` are :func:`parse_meminfo`'s; ``pools`` is what sysfs says of each size
    (:func:`~nodeguard.sources.hugepages.read_hugepage_pools`; ``None``: not readable). By the
    kernel's own lines (mm/hugetlb.c ``hugetlb_report_meminfo``,
    Documentation/admin-guide/mm/hugetlbpage.rst):

    - Linux >= 4.16: ``Hugetlb:`` is ``sum(page size * nr_huge_pages)`` over every size, surplus
      pages included; the default size's surplus is ``HugePages_Surp * Hugepagesize``, the other
      sizes' come from sysfs (0 where it cannot be read: gigantic pages, 1 GiB on x86, cannot
      be overcommitted at all).
    - Before 4.16: ``(HugePages_Total - HugePages_Surp) * Hugepagesize`` is the default size only;
      the other sizes (a 1 GiB pool beside the default 2 MiB one) are only in sysfs.
    - No huge page lines at all (CONFIG_HUGETLB_PAGE off, or no huge page support on the CPU):
      the sysfs pools if any, else 0.
    """
    size = fields.get("Hugepagesize")
    total_pages = counts.get("HugePages_Total")
    surplus_pages = counts.get("HugePages_Surp", 0)
    others = [p for p in pools or () if p.size_bytes != size]
    hugetlb = fields.get("Hugetlb")
    if hugetlb is not None:
        default_surplus = surplus_pages * (size or 0)
        other_surplus = sum(p.surplus * p.size_bytes for p in others)
        return max(0, hugetlb - default_surplus - other_surplus)
    default = 0
    if size is not None and total_pages is not None:
        default = max(0, total_pages - surplus_pages) * size
    elif pools is not None:
        others = list(pools)  # no default-size lines: sysfs has every size
    return default + sum(p.persistent_bytes for p in others)


def derive_meminfo(
    fields: dict[str, int],
    counts: dict[str, int] | None = None,
    *,
    pools: Sequence[HugePagePool] | None = None,
) -> MemInfo:
    """The derived breakdown of :class:`~nodeguard.snapshot.MemInfo` from parsed fields (bytes),
    page counts and the sysfs huge page pools (``None``: not read).

    Raises :class:`NoDataError` when ``MemTotal`` is missing: without it nothing is meaningful.
    """
    total = fields.get("MemTotal")
    if total is None:
        raise NoDataError("meminfo has no MemTotal line")
    counts = counts or {}
    hugetlb = hugetlb_pool_bytes(fields, counts, pools)
    corrupted = fields.get("HardwareCorrupted")
    # A poisoned page of the hugetlb pool may be counted in both: never below 0.
    usable = max(0, total - hugetlb - (corrupted or 0))
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
    bogus_zero = available == 0 and free is not None and free > usable * _BOGUS_ZERO_FREE_SHARE
    if (available is None or bogus_zero) and free is not None:
        # Shmem sits in Cached but only swap can free it. The hugetlb pool is in none of these.
        reclaimable = (buffers or 0) + max(0, (cached or 0) - (shmem or 0))
        available = min(usable, free + reclaimable)
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
        page_counts=dict(counts),
        total_bytes=total,
        usable_bytes=usable,
        hugetlb_bytes=hugetlb,
        hardware_corrupted_bytes=corrupted,
        free_bytes=free,
        available_bytes=available,
        available_estimated=estimated,
        used_bytes=None if available is None else max(0, usable - available),
        buffers_bytes=buffers,
        cached_bytes=cached,
        page_cache_bytes=page_cache,
        shmem_bytes=shmem,
        slab_reclaimable_bytes=fields.get("SReclaimable"),
        slab_unreclaimable_bytes=fields.get("SUnreclaim"),
        swap_total_bytes=fields.get("SwapTotal"),
        swap_free_bytes=fields.get("SwapFree"),
    )


def _needs_sysfs(fields: dict[str, int], counts: dict[str, int]) -> bool:
    """Whether meminfo leaves a huge page size out: no ``Hugetlb:`` line (before 4.16), or one
    above the default size's pool (another size has pages, and so may have surplus pages).
    Otherwise sysfs would add nothing, and meminfo is re-read every focus interval."""
    hugetlb = fields.get("Hugetlb")
    default = counts.get("HugePages_Total", 0) * fields.get("Hugepagesize", 0)
    return hugetlb is None or hugetlb > default


def read_meminfo(*, paths: HostPaths) -> MemInfo:
    """Read and derive ``<procfs>/meminfo``, with the huge page pools of
    ``<sysfs>/kernel/mm/hugepages`` for the sizes that meminfo does not show.

    Raises ``FileNotFoundError`` when it is absent and ``ValueError`` when it has no
    ``MemTotal``: every Linux procfs has both, so either means a wrong ``--path.procfs`` (a
    failure to alert on), not a host without the data.
    """
    fields, counts = parse_meminfo(read_file(paths.proc("meminfo")))
    pools = read_hugepage_pools(paths=paths) if _needs_sysfs(fields, counts) else None
    try:
        return derive_meminfo(fields, counts, pools=pools)
    except NoDataError as exc:
        raise ValueError(f"{paths.proc('meminfo')}: {exc}") from exc
