"""``meminfo``: every field of ``/proc/meminfo`` and the node memory breakdown derived from it
(:mod:`nodeguard.sources.meminfo`)."""

from __future__ import annotations

from collections.abc import Iterator

from nodeguard.collectors.base import Collector, Parts, register
from nodeguard.collectors.labels import NO_WORKLOAD, node_gauge
from nodeguard.families import Families, Family
from nodeguard.snapshot import NodeSnapshot
from nodeguard.sources.meminfo import read_meminfo

__all__ = ["MeminfoCollector"]

# (family suffix, HELP, the MemInfo field)
_DERIVED = (
    ("total_bytes", "MemTotal", "total_bytes"),
    ("free_bytes", "MemFree", "free_bytes"),
    ("available_bytes", "MemAvailable, or its estimate (see _estimated)", "available_bytes"),
    ("used_bytes", "MemTotal minus available, as free(1) computes used", "used_bytes"),
    ("page_cache_bytes", "page cache: Active(file) + Inactive(file)", "page_cache_bytes"),
    ("buffers_bytes", "Buffers", "buffers_bytes"),
    ("shmem_bytes", "Shmem (tmpfs, shared memory: not freed by reclaim)", "shmem_bytes"),
    (
        "slab_reclaimable_bytes",
        "SReclaimable: slab the kernel can reclaim",
        "slab_reclaimable_bytes",
    ),
    (
        "slab_unreclaimable_bytes",
        "SUnreclaim: slab the kernel cannot reclaim",
        "slab_unreclaimable_bytes",
    ),
)


@register
class MeminfoCollector(Collector):
    """``parts.meminfo``; ``nodeguard_node_meminfo_{bytes,pages}{field}`` and
    ``nodeguard_node_memory_*``."""

    name = "meminfo"

    def read(self, parts: Parts) -> None:
        parts.meminfo = read_meminfo(paths=self.settings.paths)

    def refresh(self, parts: Parts, *, keys: frozenset[str]) -> frozenset[str]:
        self.read(parts)  # one small file: every focused sample has the node's memory now
        return frozenset()

    @staticmethod
    def render(snapshot: NodeSnapshot, out: Families) -> Iterator[Family]:
        mem = snapshot.meminfo
        if mem is None:
            return
        raw = node_gauge(out, "node_meminfo_bytes", "every kB field of /proc/meminfo", ["field"])
        for name, value in mem.fields.items():
            raw.add((*NO_WORKLOAD, name), value)
        pages = node_gauge(out, "node_meminfo_pages", "unit-less /proc/meminfo fields", ["field"])
        for name, value in mem.page_counts.items():
            pages.add((*NO_WORKLOAD, name), value)
        yield from (raw, pages)
        for suffix, doc, attr in _DERIVED:
            amount = getattr(mem, attr)
            if amount is not None:
                derived = node_gauge(out, f"node_memory_{suffix}", f"node memory: {doc}")
                derived.add(NO_WORKLOAD, amount)
                yield derived
        est = node_gauge(
            out,
            "node_memory_available_estimated",
            "1 if available is estimated (MemAvailable absent or 0)",
        )
        est.add(NO_WORKLOAD, 1 if mem.available_estimated else 0)
        yield est
