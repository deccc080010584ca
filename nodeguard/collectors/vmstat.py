"""``vmstat``: the node's global reclaim counters, ``/proc/vmstat``
(:mod:`nodeguard.sources.vmstat`): node evidence that reclaim is failing, which a cgroup
reclaiming at its own limit does not produce."""

from __future__ import annotations

from collections.abc import Iterator

from nodeguard.collectors.base import Collector, Parts, register
from nodeguard.collectors.families import Families, Family
from nodeguard.collectors.labels import NO_WORKLOAD, node_counter
from nodeguard.snapshot import NodeSnapshot
from nodeguard.sources.vmstat import read_vmstat

__all__ = ["VmstatCollector"]


@register
class VmstatCollector(Collector):
    """``parts.vmstat``; ``nodeguard_node_vmstat_{pgscan,pgsteal}_bytes_total{reclaimer}`` and
    ``nodeguard_node_vmstat_allocstall_total``. One small node-wide file: a focused sample
    re-reads it, so the direct-reclaim rate is current whenever PSI is."""

    name = "vmstat"
    refresh_whole = True

    def read(self, parts: Parts) -> None:
        parts.vmstat = read_vmstat(paths=self.settings.paths)

    @staticmethod
    def render(snapshot: NodeSnapshot, out: Families) -> Iterator[Family]:
        vm = snapshot.vmstat
        if vm is None:
            return
        page = vm.page_size_bytes
        for what, kswapd, direct, help in (
            ("pgscan", vm.pgscan_kswapd, vm.pgscan_direct, "scanned"),
            ("pgsteal", vm.pgsteal_kswapd, vm.pgsteal_direct, "reclaimed"),
        ):
            family = node_counter(
                out,
                f"node_vmstat_{what}_bytes",
                f"memory {help} by global reclaim (/proc/vmstat {what}_*, pages x page size; "
                "reclaim at a cgroup's own limit is not counted), by reclaimer",
                ["reclaimer"],
            )
            for reclaimer, pages in (("kswapd", kswapd), ("direct", direct)):
                if pages is not None:
                    family.add((*NO_WORKLOAD, reclaimer), pages * page)
            yield family
        if vm.allocstall is not None:
            stalls = node_counter(
                out,
                "node_vmstat_allocstall",
                "allocations that entered direct reclaim (/proc/vmstat allocstall, zones summed)",
            )
            stalls.add(NO_WORKLOAD, vm.allocstall)
            yield stalls
