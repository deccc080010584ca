"""``pressure``: the node's memory PSI, ``/proc/pressure/memory``
(:mod:`nodeguard.sources.pressure`)."""

from __future__ import annotations

from collections.abc import Iterator

from nodeguard.collectors.base import Collector, Parts, register
from nodeguard.collectors.families import Families, Family
from nodeguard.collectors.labels import NO_WORKLOAD, add_stall, node_counter, node_gauge
from nodeguard.snapshot import NodeSnapshot
from nodeguard.sources.pressure import read_node_pressure
from nodeguard.stall import stall_outside_limits

__all__ = ["PressureCollector"]


@register
class PressureCollector(Collector):
    """``parts.pressure``; ``nodeguard_node_memory_pressure_{stall_seconds_total,ratio}`` and
    ``nodeguard_node_memory_stall_outside_limits_ratio`` (:mod:`nodeguard.stall`, from the
    snapshot's node and cgroup PSI: what the ``memory-pressure-high`` rule reads)."""

    name = "pressure"
    refresh_whole = True

    def read(self, parts: Parts) -> None:
        parts.pressure = read_node_pressure(paths=self.settings.paths)

    @staticmethod
    def render(snapshot: NodeSnapshot, out: Families) -> Iterator[Family]:
        psi = snapshot.pressure
        if psi is None:
            return
        stall = node_counter(
            out,
            "node_memory_pressure_stall_seconds",
            "node memory PSI total stall time (/proc/pressure/memory)",
            ["kind"],
        )
        ratio = node_gauge(
            out,
            "node_memory_pressure_ratio",
            "node memory PSI running average share of time stalled",
            ["kind", "window"],
        )
        add_stall(stall, NO_WORKLOAD, psi)
        for kind, line in (("some", psi.some), ("full", psi.full)):
            if line is None:
                continue
            for window, share in (("10s", line.avg10), ("60s", line.avg60), ("300s", line.avg300)):
                ratio.add((*NO_WORKLOAD, kind, window), share)
        yield from (stall, ratio)
        outside = stall_outside_limits(snapshot)
        if outside is not None:
            outside_family = node_gauge(
                out,
                "node_memory_stall_outside_limits_ratio",
                "share of node memory PSI full avg10 not explained by cgroups stalling at "
                "their own limit (absent where that cannot be told: v1 with a cgroup at its limit)",
            )
            outside_family.add(NO_WORKLOAD, outside)
            yield outside_family
