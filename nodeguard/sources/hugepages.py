"""``<sysfs>/kernel/mm/hugepages``: the hugetlb pool of every huge page size.

Documentation/admin-guide/mm/hugetlbpage.rst: one directory ``hugepages-<size>kB`` per size the
running kernel supports, each with the files of ``/proc/sys/vm`` for that size. Two of them are
read, both page counts (mm/hugetlb.c ``nr_hugepages_show_common`` and ``surplus_hugepages_show``):

- ``nr_hugepages``: ``h->nr_huge_pages``, every page of the pool, surplus pages included;
- ``surplus_hugepages``: ``h->surplus_huge_pages``, the pages above the persistent pool that
  overcommit (``nr_overcommit_hugepages``) took from the normal page pool; they go back to it
  once unused.

``/proc/meminfo`` shows only the default size's counts (``HugePages_*``), and the ``Hugetlb:``
line that sums every size came only with Linux 4.16 (commit "mm: show total hugetlb memory
consumption in /proc/meminfo"); before it, and for the other sizes' surplus, these files are
the only source.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from nodeguard.paths import HostPaths
from nodeguard.sources.files import read_optional

__all__ = ["HugePagePool", "parse_pool_dir_name", "read_hugepage_pools"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HugePagePool:
    """One huge page size's pool: ``size_bytes`` (the page size), ``pages`` (``nr_hugepages``,
    surplus included) and ``surplus`` (``surplus_hugepages``), both page counts."""

    size_bytes: int
    pages: int
    surplus: int

    @property
    def persistent_bytes(self) -> int:
        """The persistent pool in bytes: ``(pages - surplus) * size_bytes``, at least 0."""
        return max(0, self.pages - self.surplus) * self.size_bytes


def parse_pool_dir_name(name: str) -> int | None:
    """The page size in bytes of a ``hugepages-<size>kB`` directory name (``hugepages-2048kB``
    is 2 MiB), or ``None`` for any other name."""
    prefix, suffix = "hugepages-", "kB"
    if not (name.startswith(prefix) and name.endswith(suffix)):
        return None
    digits = name[len(prefix) : -len(suffix)]
    if not digits.isdigit() or int(digits) == 0:
        return None
    return int(digits) * 1024


def _count(path: str) -> int | None:
    try:
        text = read_optional(path)
        if text is None:
            return None
        value = int(text.strip())
    except (OSError, ValueError):
        # Unreadable is unknown, not 0; it must not fail the meminfo collector it feeds.
        return None
    return value if value >= 0 else None


def read_hugepage_pools(*, paths: HostPaths) -> tuple[HugePagePool, ...] | None:
    """Every size's pool under ``<sysfs>/kernel/mm/hugepages``, by size (smallest first).

    ``None`` when that directory is absent or unreadable (a kernel without CONFIG_HUGETLBFS, or a
    sysfs not mounted at ``--path.sysfs``): then nothing is known of the sizes that
    ``/proc/meminfo`` does not show. A size whose ``nr_hugepages`` cannot be read is left out; a
    missing ``surplus_hugepages`` counts as 0 surplus pages.
    """
    root = paths.sysfs / "kernel" / "mm" / "hugepages"
    try:
        names = os.listdir(root)
    except OSError:
        return None
    pools = []
    for name in names:
        size = parse_pool_dir_name(name)
        if size is None:
            continue
        pages = _count(str(root / name / "nr_hugepages"))
        if pages is None:
            continue
        surplus = _count(str(root / name / "surplus_hugepages")) or 0
        pools.append(HugePagePool(size_bytes=size, pages=pages, surplus=min(surplus, pages)))
    return tuple(sorted(pools, key=lambda p: p.size_bytes))
