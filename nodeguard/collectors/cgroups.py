"""``cgroups``: every pod and container memory cgroup of the kubepods hierarchy, v1 or v2
(:mod:`nodeguard.sources.cgroups`: the files, the layouts, the held files), and the pods'
identities and requests from the pod list where the snapshot has it.

Working set is cAdvisor's (usage - inactive_file, clamped at 0); unreclaimable memory leaves page
cache out (:mod:`nodeguard.sources.unreclaimable`); the limit is the smallest real limit up the
tree, absent when none. Counters are the kernel's: OOM kills and limit hits from
``memory.events`` (v2, hierarchical) or ``memory.oom_control`` / ``memory.failcnt`` (v1, this
cgroup's own).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator

from nodeguard.collectors.base import Collector, Parts, Settings, register
from nodeguard.collectors.families import Families, Family
from nodeguard.collectors.labels import NO_WORKLOAD, WORKLOAD_LABELS, add_stall, node_gauge
from nodeguard.snapshot import CgroupMemory, NodeSnapshot
from nodeguard.sources.cgroups import CgroupReader

__all__ = ["CgroupsCollector"]


# The int fields of a CgroupMemory, in the order of _MemoryFamilies._ints.
_INT_FIELDS = operator.attrgetter(
    "usage_bytes",
    "working_set_bytes",
    "anon_bytes",
    "file_bytes",
    "effective_limit_bytes",
    "oom_kills",
    "limit_hits",
    "high_events",
    "unreclaimable_bytes",
    "refault_file_bytes",
)


class _MemoryFamilies:
    """The memory families of one level (``pod`` or ``container``), filled per cgroup."""

    def __init__(self, out: Families, *, level: str) -> None:
        lv, labels = level, WORKLOAD_LABELS
        self.usage = out.gauge(f"{lv}_memory_usage_bytes", f"{lv} cgroup memory usage", labels)
        self.working_set = out.gauge(
            f"{lv}_memory_working_set_bytes",
            f"{lv} working set: usage minus inactive_file, clamped at 0 (cAdvisor's)",
            labels,
        )
        self.anon = out.gauge(f"{lv}_memory_anon_bytes", f"{lv} anonymous memory (v1 rss)", labels)
        self.file = out.gauge(
            f"{lv}_memory_file_bytes",
            f"{lv} file-backed memory incl. shmem/tmpfs (v2 file, v1 total_cache)",
            labels,
        )
        self.limit = out.gauge(
            f"{lv}_memory_limit_bytes",
            f"{lv} effective memory limit: the smallest real limit up the cgroup tree; "
            "absent when none",
            labels,
        )
        self.oom = out.counter(
            f"{lv}_memory_oom_kills",
            f"{lv} OOM kills by the cgroup counter (v2 memory.events, hierarchical; v1 "
            "memory.oom_control, "
            + (
                "the pod's own and its containers' summed, also those gone"
                if lv == "pod"
                else "this cgroup's own only"
            )
            + "); absent when the kernel does not count",
            labels,
        )
        self.hits = out.counter(
            f"{lv}_memory_limit_hits",
            f"{lv} times usage hit the limit (v2 memory.events max, hierarchical; v1 "
            "memory.failcnt, this cgroup's own only)",
            labels,
        )
        self.high = out.counter(
            f"{lv}_memory_high_events",
            f"{lv} times memory.high throttled reclaim (v2 memory.events high)",
            labels,
        )
        self.unreclaimable = out.gauge(
            f"{lv}_memory_unreclaimable_bytes",
            f"{lv} memory the kernel cannot reclaim without killing: anon, shmem/tmpfs, "
            "unevictable, kernel memory but reclaimable slab (v2 only), less what fits in swap; "
            "page cache left out (what the default rules compare with the limit)",
            labels,
        )
        self.refaults = out.counter(
            f"{lv}_memory_refault_file_bytes",
            f"{lv} page cache read back after reclaim dropped it (memory.stat "
            "workingset_refault_file, pages times the page size); absent where the kernel "
            "does not count",
            labels,
        )
        self.stall = out.counter(
            f"{lv}_memory_pressure_stall_seconds",
            f"{lv} memory PSI total stall time (v2 memory.pressure)",
            [*labels, "kind"],
        )
        # in the order of _INT_FIELDS
        self._ints = (
            self.usage,
            self.working_set,
            self.anon,
            self.file,
            self.limit,
            self.oom,
            self.hits,
            self.high,
            self.unreclaimable,
            self.refaults,
        )

    def add(self, values: tuple[str, ...], mem: CgroupMemory) -> None:
        # The hot loop of a render (every cgroup, 9 families): the values are ints (never a
        # float zero, see Family.add), so their samples are appended directly.
        for family, value in zip(self._ints, _INT_FIELDS(mem), strict=True):
            if value is not None:
                family.keys.append(values)
                family.values.append(value)
        if mem.pressure is not None:
            add_stall(self.stall, values, mem.pressure)

    def all(self) -> tuple[Family, ...]:
        return (*self._ints, self.stall)


class _KubepodsFamilies:
    """The ``kubepods`` cgroup: what all pods together use against node allocatable."""

    def __init__(self, out: Families) -> None:
        self.usage = node_gauge(
            out, "node_kubepods_memory_usage_bytes", "memory usage of the kubepods cgroup"
        )
        self.working_set = node_gauge(
            out,
            "node_kubepods_memory_working_set_bytes",
            "working set of all pods together: kubepods usage minus inactive_file",
        )
        self.unreclaimable = node_gauge(
            out,
            "node_kubepods_memory_unreclaimable_bytes",
            "memory of all pods together that the kernel cannot reclaim without killing "
            "(kubepods: anon, shmem/tmpfs, unevictable, kernel memory but reclaimable slab on "
            "v2); page cache left out",
        )
        self.limit = node_gauge(
            out,
            "node_kubepods_memory_limit_bytes",
            "limit of the kubepods cgroup: node allocatable as the kubelet enforces it "
            "(capacity minus kube-reserved and system-reserved); absent when none",
        )

    def add(self, mem: CgroupMemory) -> None:
        for family, value in (
            (self.usage, mem.usage_bytes),
            (self.working_set, mem.working_set_bytes),
            (self.unreclaimable, mem.unreclaimable_bytes),
            (self.limit, mem.effective_limit_bytes),
        ):
            if value is not None:
                family.add(NO_WORKLOAD, value)

    def all(self) -> tuple[Family, ...]:
        return (self.usage, self.working_set, self.unreclaimable, self.limit)


@register
class CgroupsCollector(Collector):
    """``parts.pods``, ``.kubepods``, ``.cgroup_version``, ``.cgroup_root`` and
    ``.cgroup_files_open``; the ``nodeguard_{pod,container}_memory_*`` families,
    ``nodeguard_node_kubepods_memory_*``, ``nodeguard_pod_info``,
    ``nodeguard_pod_memory_request_bytes`` and ``nodeguard_cgroup_files_open``. A focused
    sample re-reads the pods and containers it asks for and the kubepods cgroup."""

    name = "cgroups"
    after = ("meminfo",)  # MemTotal: a limit at or above it is no limit

    def __init__(self, *, settings: Settings) -> None:
        super().__init__(settings=settings)
        self.reader = CgroupReader(
            paths=settings.paths, max_open_files=settings.max_open_files, skipped=self.skipped
        )

    def read(self, parts: Parts) -> None:
        total = parts.meminfo.total_bytes if parts.meminfo else None
        swap = parts.meminfo.swap_free_bytes if parts.meminfo else None
        parts.cgroup_version, parts.pods = self.reader.read(mem_total=total, swap_free=swap)
        parts.kubepods = self.reader.kubepods
        parts.cgroup_root = self.reader.root
        parts.cgroup_files_open = self.reader.open_files

    def refresh(self, parts: Parts, *, keys: frozenset[str]) -> frozenset[str]:
        total = parts.meminfo.total_bytes if parts.meminfo else None
        swap = parts.meminfo.swap_free_bytes if parts.meminfo else None
        parts.pods, done = self.reader.refresh(
            parts.pods, keys=keys, mem_total=total, swap_free=swap
        )
        parts.kubepods = self.reader.refresh_kubepods(mem_total=total, swap_free=swap)
        return done

    def close(self) -> None:
        self.reader.close()

    @staticmethod
    def render(snapshot: NodeSnapshot, out: Families) -> Iterator[Family]:
        labels = WORKLOAD_LABELS
        pod_families = _MemoryFamilies(out, level="pod")  # container empty: the pod as a whole
        container_families = _MemoryFamilies(out, level="container")
        pod_info = out.gauge(
            "pod_info",
            "pods with a memory cgroup on this node; priority from the pod list where known; "
            "a Katib trial's pods name its experiment and trial (their katib.kubeflow.org labels)",
            [*labels, "uid", "qos_class", "priority_class", "katib_experiment", "katib_trial"],
        )
        requests = out.gauge(
            "pod_memory_request_bytes",
            "pod memory request as the scheduler counts it (from the pod list)",
            labels,
        )
        for pod in snapshot.pods:
            pl = snapshot.labels_for(pod.uid, None)
            pod_values = (pl.namespace, pl.pod, "")
            meta = snapshot.pod_meta.get(pod.uid) if snapshot.pod_meta else None
            priority_class = meta.priority_class if meta else ""
            katib = meta.labels if meta else {}
            pod_info.add(
                (
                    *pod_values,
                    pod.uid,
                    pod.qos_class,
                    priority_class,
                    katib.get("katib.kubeflow.org/experiment", ""),
                    katib.get("katib.kubeflow.org/trial", ""),
                ),
                1,
            )
            if meta is not None:
                requests.add(pod_values, meta.memory_request_bytes)
            pod_families.add(pod_values, pod.memory)
            for c in pod.containers:
                cl = snapshot.labels_for(pod.uid, c.container_id)
                container_families.add((cl.namespace, cl.pod, cl.container), c.memory)
        yield pod_info
        yield requests
        yield from pod_families.all()
        yield from container_families.all()
        if snapshot.kubepods is not None:
            kubepods = _KubepodsFamilies(out)
            kubepods.add(snapshot.kubepods)
            yield from kubepods.all()
        if snapshot.cgroup_files_open is not None:
            held = out.gauge(
                "cgroup_files_open",
                "cgroup files held open between samples and re-read with pread "
                "(--collector.cgroups.keep-open)",
            )
            held.add((), snapshot.cgroup_files_open)
            yield held
