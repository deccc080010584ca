"""``/proc/vmstat``: the node's global reclaim counters (mm/vmstat.c ``vmstat_text``).

Format: ``name value`` lines, one counter each, values in pages or events since boot. The
reclaim counters have three forms across kernels, all read here:

- 4.8 and later (node-based LRUs, mm/vmscan.c): ``pgscan_kswapd``, ``pgscan_direct``,
  ``pgsteal_kswapd``, ``pgsteal_direct`` once each; ``allocstall`` split by zone
  (``allocstall_dma``, ``allocstall_dma32``, ``allocstall_normal``, ``allocstall_movable``,
  ``allocstall_device`` on 6.x) in later 4.x and every 5.x and 6.x kernel.
- Before 4.8 (zone LRUs: 3.10 of RHEL 7, 4.4 of Ubuntu 16.04): each of the four split by zone
  (``pgscan_direct_dma32``, ``pgscan_direct_normal``, ``pgscan_direct_movable``, ...) and one
  ``allocstall``.
- ``CONFIG_VM_EVENT_COUNTERS=n``: no event counter at all: no data.

A zoned counter is the sum of its zones; ``pgscan_direct_throttle`` is a counter of its own
(direct reclaimers throttled), not a zone. ``pgscan_anon``/``pgscan_file`` (5.8+) count cgroup
reclaim too and are not read.
"""

from __future__ import annotations

import os

from nodeguard.paths import HostPaths
from nodeguard.snapshot import VmStat
from nodeguard.sources import NoDataError
from nodeguard.sources.files import parse_flat_keyed, read_text

__all__ = ["parse_vmstat", "read_vmstat"]

#: The counters read, each in its one-line form or split by zone.
_COUNTERS = ("pgscan_kswapd", "pgscan_direct", "pgsteal_kswapd", "pgsteal_direct", "allocstall")
#: Zone suffixes as vmstat_text prints them (include/linux/mmzone.h ``enum zone_type``;
#: ``TEXT_FOR_HIGHMEM`` writes ``_high``).
_ZONES = ("dma", "dma32", "normal", "high", "movable", "device")
_KEYS = frozenset(
    name for counter in _COUNTERS for name in (counter, *(f"{counter}_{z}" for z in _ZONES))
)


def _counter(values: dict[str, int], name: str) -> int | None:
    if name in values:
        return values[name]
    zoned = [values[f"{name}_{z}"] for z in _ZONES if f"{name}_{z}" in values]
    return sum(zoned) if zoned else None


def parse_vmstat(text: str, *, page_size: int) -> VmStat:
    """The reclaim counters of a vmstat text (module docstring: the forms), pages and counts
    as the kernel prints them. Raises :class:`NoDataError` when the text holds none of them (a
    kernel without VM event counters)."""
    values = parse_flat_keyed(text, _KEYS)
    counters = {name: _counter(values, name) for name in _COUNTERS}
    if all(v is None for v in counters.values()):
        raise NoDataError("vmstat has no reclaim counters (CONFIG_VM_EVENT_COUNTERS off?)")
    return VmStat(
        pgscan_kswapd=counters["pgscan_kswapd"],
        pgscan_direct=counters["pgscan_direct"],
        pgsteal_kswapd=counters["pgsteal_kswapd"],
        pgsteal_direct=counters["pgsteal_direct"],
        allocstall=counters["allocstall"],
        page_size_bytes=page_size,
    )


def read_vmstat(*, paths: HostPaths) -> VmStat:
    """``<procfs>/vmstat``, with this host's page size (the agent runs on the host's kernel).
    Raises :class:`NoDataError` when the file is absent or holds no reclaim counter."""
    text = read_text(paths.proc("vmstat"))
    return parse_vmstat(text, page_size=os.sysconf("SC_PAGE_SIZE"))
