"""``processes``: the top processes by RSS, each with its container, for incident evidence and
``nodeguard snapshot`` (:mod:`nodeguard.sources.processes`). Not exported: a series per process
would follow PIDs."""

from __future__ import annotations

from collections.abc import Iterator

from nodeguard.collectors.base import Collector, Parts, register
from nodeguard.collectors.families import Families, Family
from nodeguard.collectors.labels import container_pods
from nodeguard.snapshot import NodeSnapshot
from nodeguard.sources.processes import read_top_processes

__all__ = ["ProcessesCollector"]


@register
class ProcessesCollector(Collector):
    """``parts.processes``; no families."""

    name = "processes"
    after = ("cgroups",)  # a process seen inside a cgroup namespace names only its container

    def read(self, parts: Parts) -> None:
        parts.processes = read_top_processes(
            paths=self.settings.paths,
            limit=self.settings.top_processes,
            containers=container_pods(parts.pods),
            skipped=self.skipped,
        )

    @staticmethod
    def render(snapshot: NodeSnapshot, out: Families) -> Iterator[Family]:
        return iter(())
