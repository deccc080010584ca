"""``kmsg``: OOM kills from the kernel log, ``/dev/kmsg`` (:mod:`nodeguard.sources.kmsg`: each
victim counted once, across restarts with a state directory; every supported kernel's format in
:mod:`nodeguard.sources.oom_events`)."""

from __future__ import annotations

from collections.abc import Iterator

from nodeguard.collectors.base import Collector, Parts, Settings, register
from nodeguard.collectors.families import Families, Family
from nodeguard.collectors.labels import NO_WORKLOAD, WORKLOAD_LABELS, node_counter
from nodeguard.snapshot import NodeSnapshot
from nodeguard.sources.kmsg import OomLogReader

__all__ = ["KmsgCollector"]


@register
class KmsgCollector(Collector):
    """``parts.oom``; ``nodeguard_node_oom_kills_total{constraint}`` and
    ``nodeguard_container_kernel_oom_kills_total``. The reader is made at the first sample
    (it reads the boot ID and the kept position)."""

    name = "kmsg"

    def __init__(self, *, settings: Settings) -> None:
        super().__init__(settings=settings)
        self.reader: OomLogReader | None = None

    def read(self, parts: Parts) -> None:
        if self.reader is None:
            self.reader = OomLogReader(paths=self.settings.paths)
        parts.oom = self.reader.read()

    def close(self) -> None:
        """Release the kernel log and keep its state."""
        if self.reader is not None:
            self.reader.close()

    @staticmethod
    def render(snapshot: NodeSnapshot, out: Families) -> Iterator[Family]:
        oom = snapshot.oom
        if oom is None:
            return
        kills = node_counter(
            out,
            "node_oom_kills",
            "OOM kills in the kernel log this boot, by constraint "
            "(CONSTRAINT_MEMCG: a cgroup limit; CONSTRAINT_NONE: the whole node)",
            ["constraint"],
        )
        for constraint, count in sorted(oom.by_constraint.items()):
            kills.add((*NO_WORKLOAD, constraint), count)
        yield kills
        victims = out.counter(
            "container_kernel_oom_kills",
            "OOM kills in the kernel log whose task_memcg is this container, all its "
            "container IDs (restarts) together; a series starts at the first kill (use the "
            "pod cgroup counter for increase() from 0)",
            WORKLOAD_LABELS,
        )
        # The victim's cgroup names the container ID that was killed, which the kubelet has
        # replaced within a second: its name comes from the pod's lastState (PodMeta.containers),
        # and each name's IDs are one series (kmsg drops a pod's IDs together, so it never
        # goes down).
        by_labels: dict[tuple[str, str, str], int] = {}
        for key, count in oom.by_container.items():
            uid, _, cid = key.partition("/")
            cl = snapshot.labels_for(uid, cid or None)
            labels = (cl.namespace, cl.pod, cl.container)
            by_labels[labels] = by_labels.get(labels, 0) + count
        for labels, count in sorted(by_labels.items()):
            victims.add(labels, count)
        yield victims
