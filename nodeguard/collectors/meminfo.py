"""``meminfo``: every field of ``/proc/meminfo`` and the node memory breakdown derived from it
(:mod:`nodeguard.sources.meminfo`)."""

from __future__ import annotations

from collections.abc import Iterator

from nodeguard.collectors.base import Collector, Parts, register
from nodeguard.collectors.families import Families, Family
from nodeguard.collectors.labels import NO_WORKLOAD, node_gauge
from nodeguard.snapshot import NODE_MEMORY_BREAKDOWN, NodeSnapshot
from nodeguard.sources.meminfo import read_meminfo

__all__ = ["MeminfoCollector"]


@register
class MeminfoCollector(Collector):
    """``parts.meminfo``; ``nodeguard_node_meminfo_{bytes,pages}{field}`` and
    ``nodeguard_node_memory_*``."""

    name = "meminfo"
    refresh_whole = True

    def read(self, parts: Parts) -> None:
        parts.meminfo = read_meminfo(paths=self.settings.paths)

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
        for part in NODE_MEMORY_BREAKDOWN:
            amount = getattr(mem, part.field)
            if amount is not None:
                derived = node_gauge(out, f"node_memory_{part.field}", f"node memory: {part.help}")
                derived.add(NO_WORKLOAD, amount)
                yield derived
        est = node_gauge(
            out,
            "node_memory_available_estimated",
            "1 if available is estimated (MemAvailable absent or 0)",
        )
        est.add(NO_WORKLOAD, 1 if mem.available_estimated else 0)
        yield est
