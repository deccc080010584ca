"""Renders the latest :class:`~nodeguard.snapshot.NodeSnapshot` as Prometheus metrics.

A custom collector (prometheus_client "Custom Collectors"): every scrape yields fresh metric
families built from the snapshot the sampler last made, so a scrape never reads the host and
never disagrees with what the rule engine saw. ``describe()`` returns nothing, so registering
the collector does not run it.

Names follow Prometheus conventions: ``nodeguard_`` prefix, base units (bytes, seconds, ratios
0..1), ``_total`` for counters. Workload series carry ``namespace``, ``pod`` and ``container``;
until pod metadata is known (no cluster), ``pod`` holds the pod UID, ``container`` the container
ID and ``namespace`` is empty. Absent data is absent, never exported as 0.

Target labels. Scraped with ``honor_labels: true``, a series gets every label of its target
that it does not have itself (Prometheus scrape/scrape.go ``mutateSampleLabels``: a target label
is added where the series lacks the name; a label whose value is empty is then no label). A
ServiceMonitor gives the agent's target ``namespace``, ``pod``, ``container`` (the agent's own
pod), ``service``, ``endpoint``, ``job`` and ``instance`` (prometheus-operator
pkg/prometheus/promcfg.go). So every series about the node, a GPU or a whole pod carries the
workload labels it has no value for, empty (:data:`WORKLOAD_LABELS`), as the kubelet's cAdvisor
endpoint does (pkg/kubelet/server/server.go ``containerPrometheusLabelsFunc``: "we arrange to
supply blank strings for missing labels"); stored, they have none of them. ``service``,
``endpoint``, ``job`` and ``instance`` name the scrape and apply to every series: they are left to
the target, as cAdvisor leaves them. The agent's own series (build info, collectors, rules,
actions) are the agent pod's, and keep its target labels too.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nodeguard import __version__
from nodeguard.snapshot import CgroupMemory, GpuMemory, NodeSnapshot, Pressure

__all__ = ["WORKLOAD_LABELS", "OpenFilesCollector", "SnapshotCollector"]

_P = "nodeguard_"
_STALE_NOTE = " (from the latest snapshot)"
#: The labels that name a workload, on every series about the node, its pods and its GPUs;
#: empty where they do not apply (see the module docstring).
WORKLOAD_LABELS = ("namespace", "pod", "container")
_NO_WORKLOAD = ("", "", "")


def _gauge(name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(_P + name, doc + _STALE_NOTE, labels=list(labels))


def _counter(name: str, doc: str, labels: Iterable[str] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(_P + name, doc + _STALE_NOTE, labels=list(labels))


def _node_gauge(name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    """A gauge about the node: the workload labels first, filled with :data:`_NO_WORKLOAD`."""
    return _gauge(name, doc, [*WORKLOAD_LABELS, *labels])


def _node_counter(name: str, doc: str, labels: Iterable[str] = ()) -> CounterMetricFamily:
    return _counter(name, doc, [*WORKLOAD_LABELS, *labels])


class _Families:
    """Metric families that share a label set, filled per cgroup (pod or container level)."""

    def __init__(self, *, level: str, labels: list[str]) -> None:
        self.labels = labels
        lv = level
        self.usage = _gauge(f"{lv}_memory_usage_bytes", f"{lv} cgroup memory usage", labels)
        self.working_set = _gauge(
            f"{lv}_memory_working_set_bytes",
            f"{lv} working set: usage minus inactive_file, clamped at 0 (cAdvisor's)",
            labels,
        )
        self.anon = _gauge(f"{lv}_memory_anon_bytes", f"{lv} anonymous memory (v1 rss)", labels)
        self.file = _gauge(
            f"{lv}_memory_file_bytes",
            f"{lv} file-backed memory incl. shmem/tmpfs (v2 file, v1 total_cache)",
            labels,
        )
        self.limit = _gauge(
            f"{lv}_memory_limit_bytes",
            f"{lv} effective memory limit: the smallest real limit up the cgroup tree; "
            "absent when none",
            labels,
        )
        self.oom = _counter(
            f"{lv}_memory_oom_kills",
            f"{lv} OOM kills by the cgroup counter (v2 memory.events, hierarchical; v1 "
            "memory.oom_control, this cgroup's own only); absent when the kernel does not count",
            labels,
        )
        self.hits = _counter(
            f"{lv}_memory_limit_hits",
            f"{lv} times usage hit the limit (v2 memory.events max, hierarchical; v1 "
            "memory.failcnt, this cgroup's own only)",
            labels,
        )
        self.high = _counter(
            f"{lv}_memory_high_events",
            f"{lv} times memory.high throttled reclaim (v2 memory.events high)",
            labels,
        )
        self.stall = _counter(
            f"{lv}_memory_pressure_stall_seconds",
            f"{lv} memory PSI total stall time (v2 memory.pressure)",
            [*labels, "kind"],
        )

    def add(self, *, values: list[str], mem: CgroupMemory) -> None:
        pairs = (
            (self.usage, mem.usage_bytes),
            (self.working_set, mem.working_set_bytes),
            (self.anon, mem.anon_bytes),
            (self.file, mem.file_bytes),
            (self.limit, mem.effective_limit_bytes),
            (self.oom, mem.oom_kills),
            (self.hits, mem.limit_hits),
            (self.high, mem.high_events),
        )
        for family, value in pairs:
            if value is not None:
                family.add_metric(values, value)
        _add_stall(self.stall, values, mem.pressure)

    def all(self) -> list[Metric]:
        return [
            self.usage,
            self.working_set,
            self.anon,
            self.file,
            self.limit,
            self.oom,
            self.hits,
            self.high,
            self.stall,
        ]


def _add_stall(family: CounterMetricFamily, values: list[str], pressure: Pressure | None) -> None:
    if pressure is None:
        return
    for kind, line in (("some", pressure.some), ("full", pressure.full)):
        if line is not None:
            family.add_metric([*values, kind], line.total_seconds)


_GPU_MEMORY_DOCS = (
    ("total", "GPU framebuffer memory, total (NVML memory info)"),
    (
        "used",
        "GPU memory allocated (NVML memory info v2 used, reserved excluded; a driver with v1 only "
        "counts reserved in used and has no reserved series)",
    ),
    ("free", "GPU memory free (NVML memory info)"),
    ("reserved", "GPU memory the driver and firmware reserve (NVML memory info v2)"),
)


class _GpuMemoryFamilies:
    """``nodeguard_<prefix>_memory_{total,used,free,reserved}_bytes`` over one label set."""

    def __init__(self, *, prefix: str, what: str, labels: list[str]) -> None:
        self.families = {
            kind: _gauge(f"{prefix}_memory_{kind}_bytes", f"{what}: {doc}", labels)
            for kind, doc in _GPU_MEMORY_DOCS
        }

    def add(self, values: list[str], mem: GpuMemory | None) -> None:
        if mem is None:
            return
        for kind, amount in (
            ("total", mem.total_bytes),
            ("used", mem.used_bytes),
            ("free", mem.free_bytes),
            ("reserved", mem.reserved_bytes),
        ):
            if amount is not None:
                self.families[kind].add_metric(values, amount)


class SnapshotCollector(Collector):
    """A prometheus_client collector over a callable that returns the latest snapshot.

    ``latest()`` returning ``None`` (before the first sample) yields only build info. Workload
    labels come from the snapshot itself (:meth:`NodeSnapshot.labels_for`), so a series is
    named as the pod list stood when the sample was taken.
    """

    def __init__(self, *, latest: Callable[[], NodeSnapshot | None]) -> None:
        self._latest = latest

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            _P + "build_info", "nodeguard version and Python", labels=["version", "python_version"]
        )
        info.add_metric([__version__, platform.python_version()], 1)
        yield info
        snap = self._latest()
        if snap is None:
            return
        yield from self._self_metrics(snap)
        yield from self._node(snap)
        yield from self._workloads(snap)
        yield from self._overcommit(snap)
        yield from self._gpus(snap)

    def _overcommit(self, snap: NodeSnapshot) -> Iterator[Metric]:
        """Requests and limits of this node's pods summed, against allocatable."""
        if snap.node_meta is not None and snap.node_meta.allocatable_memory_bytes is not None:
            alloc = _node_gauge(
                "node_memory_allocatable_bytes", "node status.allocatable memory (from the API)"
            )
            alloc.add_metric([*_NO_WORKLOAD], snap.node_meta.allocatable_memory_bytes)
            yield alloc
        totals = snap.pod_memory_totals()
        if totals is None:
            return
        req = _node_gauge(
            "node_memory_requests_bytes",
            "sum of the memory requests of this node's running pods, as the scheduler counts "
            "them (PodRequests)",
        )
        req.add_metric([*_NO_WORKLOAD], totals.requests_bytes)
        lim = _node_gauge(
            "node_memory_limits_bytes",
            "sum of the memory limits of this node's running pods that have one (PodLimits)",
        )
        lim.add_metric([*_NO_WORKLOAD], totals.limits_bytes)
        unlimited = _node_gauge(
            "node_pods_without_memory_limit",
            "running pods of this node without a memory limit (unbounded)",
        )
        unlimited.add_metric([*_NO_WORKLOAD], totals.pods_without_limit)
        yield from (req, lim, unlimited)

    def _self_metrics(self, snap: NodeSnapshot) -> Iterator[Metric]:
        ts = _gauge("snapshot_timestamp_seconds", "Unix time the snapshot was taken")
        ts.add_metric([], snap.timestamp)
        yield ts
        success = _gauge("collector_success", "1 if the collector ran without error", ["collector"])
        available = _gauge(
            "collector_available",
            "1 if the collector found its data on this host (0: absent, e.g. PSI off)",
            ["collector"],
        )
        duration = _gauge("collector_duration_seconds", "time the collector took", ["collector"])
        errors = _counter(
            "collector_errors",
            "entries a collector left out since the agent started, by reason (unreadable, "
            "not_text, too_large, malformed): a bad file costs that entry only; absent until one",
            ["collector", "reason"],
        )
        for st in snap.collectors:
            success.add_metric([st.name], 1 if st.success else 0)
            available.add_metric([st.name], 1 if st.available else 0)
            duration.add_metric([st.name], st.duration_seconds)
            for reason, n in sorted(st.skipped.items()):
                errors.add_metric([st.name, reason], n)
        yield from (success, available, duration)
        if errors.samples:
            yield errors

    def _node(self, snap: NodeSnapshot) -> Iterator[Metric]:
        mem = snap.meminfo
        if mem is not None:
            raw = _node_gauge("node_meminfo_bytes", "every kB field of /proc/meminfo", ["field"])
            for name, value in mem.fields.items():
                raw.add_metric([*_NO_WORKLOAD, name], value)
            pages = _node_gauge("node_meminfo_pages", "unit-less /proc/meminfo fields", ["field"])
            for name, value in mem.page_counts.items():
                pages.add_metric([*_NO_WORKLOAD, name], value)
            yield from (raw, pages)
            derived = (
                ("total_bytes", "MemTotal", mem.total_bytes),
                ("free_bytes", "MemFree", mem.free_bytes),
                (
                    "available_bytes",
                    "MemAvailable, or its estimate (see _estimated)",
                    mem.available_bytes,
                ),
                (
                    "used_bytes",
                    "MemTotal minus available, as free(1) computes used",
                    mem.used_bytes,
                ),
                (
                    "page_cache_bytes",
                    "page cache: Active(file) + Inactive(file)",
                    mem.page_cache_bytes,
                ),
                ("buffers_bytes", "Buffers", mem.buffers_bytes),
                (
                    "shmem_bytes",
                    "Shmem (tmpfs, shared memory: not freed by reclaim)",
                    mem.shmem_bytes,
                ),
                (
                    "slab_reclaimable_bytes",
                    "SReclaimable: slab the kernel can reclaim",
                    mem.slab_reclaimable_bytes,
                ),
                (
                    "slab_unreclaimable_bytes",
                    "SUnreclaim: slab the kernel cannot reclaim",
                    mem.slab_unreclaimable_bytes,
                ),
            )
            for suffix, doc, amount in derived:
                if amount is not None:
                    g = _node_gauge(f"node_memory_{suffix}", f"node memory: {doc}")
                    g.add_metric([*_NO_WORKLOAD], amount)
                    yield g
            est = _node_gauge(
                "node_memory_available_estimated",
                "1 if available is estimated (MemAvailable absent or 0)",
            )
            est.add_metric([*_NO_WORKLOAD], 1 if mem.available_estimated else 0)
            yield est
        if snap.pressure is not None:
            stall = _node_counter(
                "node_memory_pressure_stall_seconds",
                "node memory PSI total stall time (/proc/pressure/memory)",
                ["kind"],
            )
            ratio = _node_gauge(
                "node_memory_pressure_ratio",
                "node memory PSI running average share of time stalled",
                ["kind", "window"],
            )
            _add_stall(stall, [*_NO_WORKLOAD], snap.pressure)
            for kind, line in (("some", snap.pressure.some), ("full", snap.pressure.full)):
                if line is None:
                    continue
                for window, share in (
                    ("10s", line.avg10),
                    ("60s", line.avg60),
                    ("300s", line.avg300),
                ):
                    ratio.add_metric([*_NO_WORKLOAD, kind, window], share)
            yield from (stall, ratio)
        if snap.oom is not None:
            kills = _node_counter(
                "node_oom_kills",
                "OOM kills in the kernel log this boot, by constraint "
                "(CONSTRAINT_MEMCG: a cgroup limit; CONSTRAINT_NONE: the whole node)",
                ["constraint"],
            )
            for constraint, count in sorted(snap.oom.by_constraint.items()):
                kills.add_metric([*_NO_WORKLOAD, constraint], count)
            yield kills

    def _workloads(self, snap: NodeSnapshot) -> Iterator[Metric]:
        names = list(WORKLOAD_LABELS)
        pod_f = _Families(level="pod", labels=names)  # container empty: the pod as a whole
        ctr_f = _Families(level="container", labels=names)
        pod_info = _gauge(
            "pod_info",
            "pods with a memory cgroup on this node; priority from the pod list where known",
            [*names, "uid", "qos_class", "priority_class"],
        )
        requests = _gauge(
            "pod_memory_request_bytes",
            "pod memory request as the scheduler counts it (from the pod list)",
            names,
        )
        for pod in snap.pods:
            pl = snap.labels_for(pod.uid, None)
            meta = snap.pod_meta.get(pod.uid) if snap.pod_meta else None
            pod_values = [pl.namespace, pl.pod, ""]
            pod_info.add_metric(
                [*pod_values, pod.uid, pod.qos_class, meta.priority_class if meta else ""], 1
            )
            if meta is not None:
                requests.add_metric(pod_values, meta.memory_request_bytes)
            pod_f.add(values=pod_values, mem=pod.memory)
            for c in pod.containers:
                cl = snap.labels_for(pod.uid, c.container_id)
                ctr_f.add(values=[cl.namespace, cl.pod, cl.container], mem=c.memory)
        yield pod_info
        yield requests
        yield from pod_f.all()
        yield from ctr_f.all()
        if snap.oom is not None:
            klog = _counter(
                "container_kernel_oom_kills",
                "OOM kills in the kernel log whose task_memcg is this container; a series "
                "starts at the first kill (use the cgroup counter for increase() from 0)",
                names,
            )
            for ckey, count in sorted(snap.oom.by_container.items()):
                uid, _, cid = ckey.partition("/")
                cl = snap.labels_for(uid, cid or None)
                klog.add_metric([cl.namespace, cl.pod, cl.container], count)
            yield klog

    def _gpus(self, snap: NodeSnapshot) -> Iterator[Metric]:
        """Per GPU, per MIG instance and per container (never per PID), from NVML."""
        if snap.gpu is None:
            return
        dev_labels = [*WORKLOAD_LABELS, "gpu", "uuid", "model"]
        driver = _node_gauge("gpu_driver_info", "NVIDIA driver version (NVML)", ["driver_version"])
        driver.add_metric([*_NO_WORKLOAD, snap.gpu.driver_version or ""], 1)
        memory = _GpuMemoryFamilies(prefix="gpu", what="per GPU", labels=dev_labels)
        mig_memory = _GpuMemoryFamilies(
            prefix="gpu_mig",
            what="per MIG instance (mig: GPU instance ID)",
            labels=[*dev_labels, "mig"],
        )
        mig_on = _gauge(
            "gpu_mig_enabled", "1 if MIG mode is on (absent where the GPU has no MIG)", dev_labels
        )
        lost = _gauge(
            "gpu_lost", "1 if NVML reports the GPU lost (fallen off the bus), else 0", dev_labels
        )
        for dev in snap.gpu.devices:
            values = [*_NO_WORKLOAD, str(dev.index), dev.uuid or "", dev.name or ""]
            memory.add(values, dev.memory)
            lost.add_metric(values, 1 if dev.lost else 0)
            if dev.mig_enabled is not None:
                mig_on.add_metric(values, 1 if dev.mig_enabled else 0)
            for mig in dev.mig_devices:
                if mig.gpu_instance_id is not None:
                    mig_memory.add([*values, str(mig.gpu_instance_id)], mig.memory)
        names = ["namespace", "pod", "container", "gpu", "uuid", "mig"]
        used = _gauge(
            "gpu_container_memory_used_bytes",
            "GPU memory used by a container's processes on a GPU (mig: GPU instance ID, empty "
            "outside MIG); absent when a process's memory is not available",
            names,
        )
        procs = _gauge(
            "gpu_container_processes",
            "compute processes of a container on a GPU (NVML, mapped by host PID to its cgroup)",
            names,
        )
        for usage in snap.gpu_containers():
            cl = snap.labels_for(usage.pod_uid, usage.container_id)
            gi = usage.mig_gpu_instance_id
            values = [
                cl.namespace,
                cl.pod,
                cl.container,
                str(usage.gpu_index),
                usage.gpu_uuid or "",
                "" if gi is None else str(gi),
            ]
            procs.add_metric(values, usage.processes)
            if usage.used_bytes is not None:
                used.add_metric(values, usage.used_bytes)
        yield driver
        yield from memory.families.values()
        yield from mig_memory.families.values()
        yield from (mig_on, lost, used, procs)


class OpenFilesCollector(Collector):
    """``nodeguard_cgroup_files_open``: the cgroup files the sampler holds open between samples
    (:mod:`nodeguard.sources.open_files`), from ``count()``; what an operator sees in
    ``ls /proc/<pid>/fd``, explained."""

    def __init__(self, *, count: Callable[[], int]) -> None:
        self._count = count

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        held = GaugeMetricFamily(
            _P + "cgroup_files_open",
            "cgroup files held open between samples and re-read with pread "
            "(--collector.cgroups.keep-open)",
        )
        held.add_metric([], self._count())
        yield held
