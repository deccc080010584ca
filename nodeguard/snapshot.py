"""The one structure every part reads: an immutable, timestamped sample of the node.

One sampler builds a :class:`NodeSnapshot` every interval. The exporter renders it, the rule
engine evaluates it and incident evidence copies it, so what was exported and what was acted on
never disagree. Every size is in bytes and every duration in seconds. A value the host could not
give (file absent, kernel feature off, counter unknown) is ``None``: absent, never 0.

All classes are frozen dataclasses; :func:`to_jsonable` turns a snapshot into plain JSON types.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "NODE_MEMORY_BREAKDOWN",
    "BreakdownPart",
    "CgroupMemory",
    "CollectorStatus",
    "ContainerMemory",
    "GpuContainerUsage",
    "GpuDevice",
    "GpuInfo",
    "GpuMemory",
    "GpuProcess",
    "MemInfo",
    "MigDevice",
    "NodeMeta",
    "NodeSnapshot",
    "OomKill",
    "OomLog",
    "OwnerRef",
    "PodMemory",
    "PodMemoryTotals",
    "PodMeta",
    "Pressure",
    "PressureLine",
    "ProcessRss",
    "VmStat",
    "WorkloadLabels",
    "memory_breakdown",
    "to_jsonable",
]

QosClass = Literal["guaranteed", "burstable", "besteffort"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectorStatus:
    """How one collector fared in one sample.

    ``success`` is False only for a real error. A collector whose data does not exist on this host
    (file absent, PSI off in the kernel, no kubepods hierarchy) has ``success=True`` and
    ``available=False``: that is "no data", not a failure (node_exporter's ErrNoData).
    ``skipped``: entries the collector left out since the agent started, by reason (a bad file
    costs that entry only: :mod:`nodeguard.sources.skipped`).
    """

    name: str
    success: bool
    available: bool
    duration_seconds: float
    error: str | None = None
    skipped: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakdownPart:
    """One line of the node memory breakdown: the :class:`MemInfo` field (also the metric
    ``nodeguard_node_memory_<field>`` and the incident record's key), its label in tables, and
    what it is (the metric's HELP)."""

    field: str
    label: str
    help: str


#: The node memory breakdown, the one list that ``/metrics``, ``nodeguard snapshot`` and the
#: incident records show (Documentation/filesystems/proc.rst, "meminfo").
NODE_MEMORY_BREAKDOWN: tuple[BreakdownPart, ...] = (
    BreakdownPart(field="total_bytes", label="total", help="MemTotal"),
    BreakdownPart(
        field="usable_bytes",
        label="usable (total - hugetlb pool - corrupted)",
        help="MemTotal minus the persistent hugetlb pool and HardwareCorrupted: the most that "
        "can ever be available",
    ),
    BreakdownPart(
        field="hugetlb_bytes",
        label="hugetlb pool (persistent)",
        help="persistent huge pages of every size, surplus pages left out",
    ),
    BreakdownPart(
        field="used_bytes",
        label="used (usable - available)",
        help="usable minus available: regular memory in use",
    ),
    BreakdownPart(
        field="available_bytes",
        label="available",
        help="MemAvailable, or its estimate (see _estimated)",
    ),
    BreakdownPart(field="free_bytes", label="free", help="MemFree"),
    BreakdownPart(
        field="page_cache_bytes",
        label="page cache (file LRU)",
        help="page cache: Active(file) + Inactive(file)",
    ),
    BreakdownPart(field="buffers_bytes", label="buffers", help="Buffers"),
    BreakdownPart(
        field="shmem_bytes",
        label="shmem (tmpfs)",
        help="Shmem (tmpfs, shared memory: not freed by reclaim)",
    ),
    BreakdownPart(
        field="slab_reclaimable_bytes",
        label="slab reclaimable",
        help="SReclaimable: slab the kernel can reclaim",
    ),
    BreakdownPart(
        field="slab_unreclaimable_bytes",
        label="slab unreclaimable",
        help="SUnreclaim: slab the kernel cannot reclaim",
    ),
)


def memory_breakdown(mem: MemInfo) -> dict[str, int | None]:
    """The breakdown's values in bytes, by field, in :data:`NODE_MEMORY_BREAKDOWN` order."""
    return {part.field: getattr(mem, part.field) for part in NODE_MEMORY_BREAKDOWN}


@dataclass(frozen=True, slots=True, kw_only=True)
class MemInfo:
    """``/proc/meminfo`` and what is derived from it (Documentation/filesystems/proc.rst).

    ``fields`` maps every ``kB`` field to bytes; ``page_counts`` every unit-less field (the
    ``HugePages_*`` lines, which count pages). Derived values are ``None`` when an input is
    absent.

    - ``available_bytes``: ``MemAvailable``; where that line is absent (kernels < 3.14), or reads 0
      while ``MemFree`` is above 1/16 of usable memory (impossible for a correct kernel, whose
      reserves are smaller: a real 0 near an OOM is kept), an estimate
      ``MemFree + Buffers + Cached - Shmem`` capped at usable memory, and ``available_estimated``
      is True.
    - ``hugetlb_bytes``: the persistent hugetlb pool, every page size, in bytes: pages the kernel
      took out of the buddy allocator for huge pages (Documentation/admin-guide/mm/hugetlbpage.rst:
      "cannot be used for other purposes"), counted in ``MemTotal`` but never in ``MemFree`` or
      ``MemAvailable``. Surplus pages are left out: they come from the normal page pool on demand
      and go back to it when unused, so while in use they are regular memory in use. See
      :func:`nodeguard.sources.meminfo.hugetlb_pool_bytes` for the sources (the ``Hugetlb:`` line
      since Linux 4.16, ``HugePages_*`` and sysfs before). 0 on a host with no huge pages.
    - ``hardware_corrupted_bytes``: ``HardwareCorrupted`` (pages poisoned by memory failure, which
      the kernel never uses again, mm/memory-failure.c); ``None`` without CONFIG_MEMORY_FAILURE.
    - ``usable_bytes``: ``MemTotal - hugetlb_bytes - HardwareCorrupted`` (at least 0): the memory
      that can ever become available, the whole that every share of "the node's memory" is taken
      of (signals, ``free: N%``, alerts, dashboards), as the kubelet takes pre-allocated huge pages
      out of allocatable (pkg/kubelet/nodestatus/setters.go) and, since kubernetes PR#138127,
      out of ``memory.available``.
    - ``used_bytes``: ``usable - available``: regular memory in use. procps-ng free(1) computes
      ``MemTotal - MemAvailable``, which counts the hugetlb pool as used; here it is its own line.
    - ``page_cache_bytes``: ``Active(file) + Inactive(file)``, the file LRU pages that the kernel
      itself counts as page cache in si_mem_available() (mm/show_mem.c); it excludes Shmem,
      which only swap can free. Falls back to ``Cached + Buffers - Shmem``.
    - ``slab_reclaimable_bytes`` / ``slab_unreclaimable_bytes``: ``SReclaimable`` / ``SUnreclaim``.
    """

    fields: Mapping[str, int]
    page_counts: Mapping[str, int]
    total_bytes: int | None
    usable_bytes: int | None
    hugetlb_bytes: int | None
    hardware_corrupted_bytes: int | None
    free_bytes: int | None
    available_bytes: int | None
    available_estimated: bool
    used_bytes: int | None
    buffers_bytes: int | None
    cached_bytes: int | None
    page_cache_bytes: int | None
    shmem_bytes: int | None
    slab_reclaimable_bytes: int | None
    slab_unreclaimable_bytes: int | None
    swap_total_bytes: int | None
    swap_free_bytes: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PressureLine:
    """One line of a PSI file (Documentation/accounting/psi.rst).

    ``avg10``/``avg60``/``avg300`` are ratios 0..1 (the kernel prints percent), ``total_seconds``
    is the cumulative stall time (the kernel prints microseconds).
    """

    avg10: float
    avg60: float
    avg300: float
    total_seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Pressure:
    """Memory pressure: ``some`` (at least one task stalled) and ``full`` (all non-idle tasks
    stalled). ``full`` is ``None`` where the kernel does not print it."""

    some: PressureLine | None
    full: PressureLine | None


@dataclass(frozen=True, slots=True, kw_only=True)
class VmStat:
    """The node's reclaim counters from ``/proc/vmstat`` (mm/vmstat.c ``vmstat_text``), in
    pages since boot; each is ``None`` where the kernel does not print it.

    - ``pgscan_kswapd`` / ``pgscan_direct``: pages scanned by kswapd / by allocating tasks
      reclaiming themselves (direct reclaim); ``pgsteal_*``: pages of those reclaimed.
      Only *global* reclaim counts here: reclaim inside a cgroup at its own ``memory.max`` /
      ``memory.high`` (v1 ``memory.limit_in_bytes``) is counted in that cgroup's stats, not in
      these (mm/vmscan.c ``shrink_inactive_list``: ``if (!cgroup_reclaim(sc))
      __count_vm_events(...)``; ``global_reclaim(sc)`` before 5.x).
    - ``allocstall``: times an allocation entered direct reclaim.
    - Kernels before 4.8 count per zone (``pgscan_direct_normal``, ``pgscan_direct_dma32``,
      ...), and later ones count ``allocstall`` per zone (``allocstall_normal``, ...): the
      zones are summed. ``pgscan_direct_throttle`` (throttled direct reclaimers) is not a
      zone and not summed.
    - ``page_size_bytes``: the host's page size (``sysconf(_SC_PAGE_SIZE)``), to turn pages
      into bytes.
    """

    pgscan_kswapd: int | None
    pgscan_direct: int | None
    pgsteal_kswapd: int | None
    pgsteal_direct: int | None
    allocstall: int | None
    page_size_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CgroupMemory:
    """Memory accounting of one cgroup, v1 or v2 (Documentation/admin-guide/cgroup-v2.rst,
    Documentation/admin-guide/cgroup-v1/memory.rst).

    - ``usage_bytes``: v2 ``memory.current``; v1 ``memory.usage_in_bytes``.
    - ``working_set_bytes``: cAdvisor's working set, ``usage - inactive_file`` clamped at 0 (v1
      uses ``total_inactive_file``, the hierarchical count).
    - ``anon_bytes`` / ``file_bytes``: v2 ``anon`` / ``file``; v1 ``total_rss`` / ``total_cache``.
    - ``limit_bytes``: this cgroup's own limit, ``None`` for none (v2 ``max``; v1 sentinels such
      as 9223372036854771712; anything >= MemTotal).
    - ``effective_limit_bytes``: the smallest real limit on the path from the hierarchy root.
    - ``oom_kills``: v2 ``memory.events`` ``oom_kill`` (hierarchical); v1
      ``memory.oom_control`` ``oom_kill`` (kernel >= 4.13), this cgroup's own, and for a pod
      summed with its containers', also those gone, as v2 counts
      (:class:`~nodeguard.sources.cgroups.CgroupReader`). ``None`` where the kernel does not
      give the line: unknown, not 0.
    - ``limit_hits``: v1 ``memory.failcnt``; v2 ``memory.events`` ``max`` (times usage was about
      to exceed the limit).
    - ``high_events``: v2 ``memory.events`` ``high`` (times reclaim was forced by memory.high).
    - ``high_bytes``: v2 ``memory.high``, the throttling bound (the kubelet writes it below
      ``memory.max`` under MemoryQoS, KEP-2570); read only where ``high_events`` is above 0 (a
      cgroup never over it is never throttled there), ``None`` for ``max``, v1, or not read.
    - ``pressure``: the cgroup's ``memory.pressure`` (v2 only).
    - ``unreclaimable_bytes``: what the kernel cannot reclaim from the cgroup without killing
      (:func:`~nodeguard.sources.unreclaimable.unreclaimable_v2` /
      :func:`~nodeguard.sources.unreclaimable.unreclaimable_v1`): the working set still counts
      active page cache, which reclaim frees before the OOM killer runs
      (Documentation/admin-guide/cgroup-v2.rst, ``memory.max``); this does not. ``None`` where
      ``memory.stat`` lacks the LRU lines it is made from.
    - ``refault_file_bytes``: page cache read back soon after reclaim dropped it, since the
      cgroup was made, in bytes (``memory.stat`` ``workingset_refault_file``, before 5.9
      ``workingset_refault``, v1 ``total_workingset_refault_file``; pages times the page size):
      reclaim evicting what the workload still reads. ``None`` where the kernel does not say.
    """

    path: str
    cgroup_version: Literal[1, 2]
    usage_bytes: int | None
    working_set_bytes: int | None
    anon_bytes: int | None
    file_bytes: int | None
    inactive_file_bytes: int | None
    limit_bytes: int | None
    effective_limit_bytes: int | None
    oom_kills: int | None
    limit_hits: int | None
    high_events: int | None
    pressure: Pressure | None
    unreclaimable_bytes: int | None = None
    refault_file_bytes: int | None = None
    high_bytes: int | None = None

    @property
    def limit_ratio(self) -> float | None:
        """Working set over the effective limit (the kubelet's share of the limit, cAdvisor's
        parity); ``None`` when either is unknown or there is no limit."""
        ws, limit = self.working_set_bytes, self.effective_limit_bytes
        return None if ws is None or not limit else ws / limit

    @property
    def unreclaimable_ratio(self) -> float | None:
        """Unreclaimable memory over the effective limit (the default rules' share: the kernel
        OOM-kills when this reaches 1); ``None`` when either is unknown or there is no limit."""
        un, limit = self.unreclaimable_bytes, self.effective_limit_bytes
        return None if un is None or not limit else un / limit


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerMemory:
    """A container cgroup under kubepods. ``runtime`` is read from the cgroup name prefix
    (``cri-containerd-``, ``crio-``, ``docker-``), ``""`` where the name is a bare ID."""

    container_id: str
    runtime: str
    memory: CgroupMemory


@dataclass(frozen=True, slots=True, kw_only=True)
class PodMemory:
    """A pod cgroup (``pod<uid>``) under kubepods with its containers.

    ``uid`` is the pod UID with dashes (systemd slices write ``_``); a static pod's UID is the
    kubelet's 32-hex config hash, kept as is. ``memory`` is the pod cgroup itself, which counts
    all its containers and the sandbox.
    """

    uid: str
    qos_class: QosClass
    memory: CgroupMemory
    containers: tuple[ContainerMemory, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class OomKill:
    """One victim of an OOM kill, from the kernel log (``/dev/kmsg``; the formats of every
    supported kernel are listed in :mod:`nodeguard.sources.oom_events`).

    - ``sequence``: the kmsg record number of the kill record (unique per boot); ``time``: the
      wall-clock estimate in Unix seconds.
    - ``constraint``: the kernel's (``CONSTRAINT_MEMCG`` for a cgroup limit, ``CONSTRAINT_NONE``
      for the whole node), from the ``oom-kill:`` line or, where the kernel prints none, from the
      ``Memory cgroup out of memory`` / ``Out of memory`` prefix; ``None`` when neither is there.
    - ``task_memcg``: the memory cgroup the victim is counted in: the log's ``task_memcg`` (or,
      before 4.19, the cgroup of ``Task in <cgroup> killed``); for the other victims of a
      ``memory.oom.group`` kill, that group's cgroup. ``pod_uid``/``container_id`` are parsed
      from it where it is a kubepods pod or container.
    - ``oom_memcg``: the cgroup whose limit was reached (``None`` for a node OOM or where the log
      does not say); ``oom_group``: the cgroup whose ``memory.oom.group`` made the kernel kill
      all of it (``None`` for a single kill).
    - ``anon_rss_bytes`` etc.: the victim's RSS at the kill, from the kill record (kB x 1024).
    """

    sequence: int
    time: float
    pid: int
    process: str
    constraint: str | None
    task_memcg: str | None
    anon_rss_bytes: int | None
    file_rss_bytes: int | None
    shmem_rss_bytes: int | None
    pod_uid: str | None
    container_id: str | None
    oom_memcg: str | None = None
    oom_group: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OomLog:
    """OOM kills seen in the kernel log in this boot, each victim counted once per OOM event,
    also across agent restarts (the last record read is kept in the state directory).

    ``total`` counts every victim; ``by_constraint`` splits it by constraint (the known
    constraints start at 0, so the first kill of a boot is an increase; ``unknown`` where the
    log gives none); ``by_container`` counts victims by ``"<pod uid>/<container id>"``
    (``"<pod uid>/"`` for a victim known only by its pod; kept 24 h after the pod's last
    kill); ``repeats_by_container`` counts, by the same keys, kill records of a victim the event
    had already killed (the kernel kills the first victim of a ``memory.oom.group`` kill again
    and counts that in ``memory.events`` ``oom_kill`` too, so victims plus repeats equal the
    cgroup's counter); ``recent`` holds the newest victims (bounded), for evidence.
    """

    total: int
    by_constraint: Mapping[str, int]
    by_container: Mapping[str, int]
    recent: tuple[OomKill, ...]
    repeats_by_container: Mapping[str, int] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessRss:
    """One of the top processes by resident set size (psutil ``memory_info().rss``, from
    ``/proc/<pid>/statm``), with its memory cgroup mapped to a container where it is one."""

    pid: int
    name: str
    rss_bytes: int
    cgroup: str | None
    pod_uid: str | None
    container_id: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuMemory:
    """Framebuffer memory of a GPU or a MIG device, in bytes.

    ``info_version=2``: ``nvmlDeviceGetMemoryInfo_v2`` (``nvmlMemory_v2_t``), where
    ``total = reserved + used + free`` and ``reserved`` is what the driver and firmware keep.
    ``info_version=1``: ``nvmlDeviceGetMemoryInfo`` (``nvmlMemory_t``), used where the driver
    lacks v2 or does not support it for the device; its ``used`` includes the reserved memory
    and ``reserved_bytes`` is ``None``. Either way ``total - free`` is what no workload can have.
    """

    total_bytes: int
    used_bytes: int
    free_bytes: int
    reserved_bytes: int | None
    info_version: Literal[1, 2]


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuProcess:
    """A process that holds a context on a GPU, from any of NVML's three lists (merged by PID,
    :mod:`nodeguard.sources.gpu`).

    - ``pid``: the host PID (NVML reports PIDs of the host's PID namespace).
    - ``used_bytes``: ``usedGpuMemory``; ``None`` when NVML answers
      ``NVML_VALUE_NOT_AVAILABLE`` in every list that has the PID (the process is kept, its
      memory unknown).
    - ``mig_gpu_instance_id`` / ``mig_compute_instance_id``: the MIG instance it runs in
      (``nvmlDeviceGetGpuInstanceId`` / ``nvmlDeviceGetComputeInstanceId`` of the MIG device
      that listed it), ``None`` outside MIG.
    - ``cgroup``, ``pod_uid``, ``container_id``: from ``<procfs>/<pid>/cgroup`` as for
      :class:`ProcessRss`; ``None`` when the process has exited or is not in a kubepods cgroup.
    - ``lists``: the NVML lists that have it, of ``compute``
      (``nvmlDeviceGetComputeRunningProcesses``), ``graphics``
      (``nvmlDeviceGetGraphicsRunningProcesses``) and ``mps``
      (``nvmlDeviceGetMPSComputeRunningProcesses``: a client of a CUDA MPS server).
    - ``mps_server``: the process is an MPS server (``nvidia-cuda-mps-server``, by its name in
      ``/proc/<pid>/stat`` and ``cmdline``). Its memory is its clients' context (before Volta
      all of theirs: NVIDIA's MPS guide, "Volta MPS"), so it counts for no container
      (:meth:`NodeSnapshot.gpu_containers`), and its pod (the device plugin's MPS daemon) is
      not the GPU's user.
    """

    pid: int
    used_bytes: int | None
    mig_gpu_instance_id: int | None
    mig_compute_instance_id: int | None
    cgroup: str | None
    pod_uid: str | None
    container_id: str | None
    lists: tuple[str, ...] = ("compute",)
    mps_server: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class MigDevice:
    """A MIG device of a GPU in MIG mode (``nvmlDeviceGetMigDeviceHandleByIndex``): ``index``
    is that handle index, ``uuid`` its ``MIG-...`` UUID, ``gpu_instance_id`` /
    ``compute_instance_id`` its instance IDs (the ``GI``/``CI`` of nvidia-smi); ``memory`` is
    ``None`` where the memory query is not supported."""

    index: int
    uuid: str | None
    gpu_instance_id: int | None
    compute_instance_id: int | None
    memory: GpuMemory | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuDevice:
    """One physical GPU as NVML sees it.

    - ``index``: the NVML index (``nvmlDeviceGetHandleByIndex_v2``, PCI bus order).
    - ``uuid``: ``nvmlDeviceGetUUID`` (``GPU-...``); ``name``: ``nvmlDeviceGetName``.
    - ``mig_enabled``: the current mode of ``nvmlDeviceGetMigMode``; ``None`` where the GPU
      has no MIG (NOT_SUPPORTED).
    - ``memory``: ``None`` where the memory query is not supported or failed (see ``errors``).
    - ``mig_devices``: the MIG devices, when MIG is on.
    - ``processes``: every process of NVML's compute, graphics and MPS lists, each PID once
      (from each MIG device when MIG is on); ``None`` when the compute list is unavailable (a
      driver without the query the binding calls, or an error), which is not the same as no
      process.
    - ``processes_missing``: the other lists that could not be read where processes may hide:
      ``graphics`` (the driver lacks the query, or it failed), ``mps`` (an MPS server runs on
      the device but its clients cannot be listed: a driver or a pre-Volta GPU without the MPS
      query). Empty when ``processes`` is all there is.
    - ``lost``: NVML answered GPU_IS_LOST (fallen off the bus); nothing else is known, and
      ``uuid``/``name`` are those of an earlier sample where there was one.
    - ``errors``: what could not be read and why (``"memory: Not Supported"``).
    """

    index: int
    uuid: str | None
    name: str | None
    mig_enabled: bool | None
    memory: GpuMemory | None
    mig_devices: tuple[MigDevice, ...]
    processes: tuple[GpuProcess, ...] | None
    processes_missing: tuple[str, ...] = ()
    lost: bool = False
    errors: tuple[str, ...] = ()

    @property
    def processes_complete(self) -> bool:
        """Every process on the device is in ``processes``: a pod absent from it has no memory
        here (rather than an unknown amount)."""
        return self.processes is not None and not self.processes_missing

    @property
    def key(self) -> str:
        """A stable name: the UUID, else ``gpu<index>``."""
        return self.uuid or f"gpu{self.index}"


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuInfo:
    """The node's GPUs through NVML: ``driver_version`` (``nvmlSystemGetDriverVersion``) and
    every device by index."""

    driver_version: str | None
    devices: tuple[GpuDevice, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuContainerUsage:
    """GPU memory of one container on one GPU (or one MIG instance of it): the sum over its
    processes. ``used_bytes`` is ``None`` when any of those processes' memory is unknown.
    ``container_id`` is ``None`` for a process in the pod cgroup itself."""

    pod_uid: str
    container_id: str | None
    gpu_index: int
    gpu_uuid: str | None
    mig_gpu_instance_id: int | None
    processes: int
    used_bytes: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnerRef:
    """One ``metadata.ownerReferences`` entry: ``kind``, ``name``, and whether it is the
    controller."""

    kind: str
    name: str
    controller: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class PodMeta:
    """What the API says about a pod of this node (from the pod list with field selector
    ``spec.nodeName``); the cgroup side is :class:`PodMemory`, joined by :attr:`cgroup_uid`.

    - ``priority``: ``spec.priority`` (set by the Priority admission plugin from the
      PriorityClass), ``priority_class``: ``spec.priorityClassName``.
    - ``qos_class``: ``status.qosClass`` lower-cased.
    - ``memory_request_bytes`` / ``memory_limit_bytes``: the pod's values as the scheduler and
      the kubelet compute them (component-helpers ``PodRequests`` / ``PodLimits``: sidecars,
      pod-level resources, overhead, in-place resize; :mod:`nodeguard.kube.resources`);
      the limit is ``None`` when the pod cgroup gets none (a container without one).
    - ``containers``: container ID (runtime prefix stripped) -> container name, from
      ``status.containerStatuses``, init and ephemeral ones included: each one's
      ``containerID`` and ``lastState.terminated.containerID`` (the container it replaced,
      an OOM-killed one), and from the watch the IDs the pod's earlier statuses named
      (:func:`nodeguard.kube.watch.with_earlier_ids`), oldest first.
    - ``container_requests``: container name -> its memory request in bytes (app, sidecar and
      init containers that have one; an app container's or sidecar's as resized in place).
    - ``mirror``: a static pod's mirror (annotation ``kubernetes.io/config.mirror``);
      ``daemonset``: controlled by a DaemonSet; ``terminating``: ``metadata.deletionTimestamp``.
    - ``config_hash``: a mirror pod's ``kubernetes.io/config.hash`` annotation, the UID the
      kubelet gave the static pod (pkg/kubelet/config/common.go ``applyDefaults``), which its
      cgroup carries; ``None`` for other pods.
    - ``ready``: the ``Ready`` condition is ``True`` (pkg/api/pod ``IsPodReady``, what the
      eviction API and the disruption controller call healthy).
    """

    uid: str
    name: str
    namespace: str
    node_name: str
    phase: str
    priority: int
    priority_class: str
    qos_class: str
    memory_request_bytes: int
    memory_limit_bytes: int | None
    owners: tuple[OwnerRef, ...]
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    containers: Mapping[str, str]
    container_requests: Mapping[str, int]
    mirror: bool
    daemonset: bool
    terminating: bool
    config_hash: str | None = None
    ready: bool = False

    @property
    def finished(self) -> bool:
        """Phase ``Succeeded`` or ``Failed``: its containers are gone and never restart
        (pkg/apis/core ``PodSucceeded``/``PodFailed`` are terminal). Such a pod holds no memory
        and no resources, is never a victim and never blocks its gang (kubectl drain skips
        it too: kubernetes#26080)."""
        return self.phase in ("Succeeded", "Failed")

    @property
    def cgroup_uid(self) -> str:
        """The UID in the pod's cgroup name (``pod<uid>``): the kubelet's config hash for a
        static pod, ``uid`` for any other."""
        return self.config_hash or self.uid


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeMeta:
    """This node as the API sees it: ``status.allocatable`` and ``status.capacity`` memory
    (bytes), the pre-allocated huge pages of ``status.capacity`` (``hugepages-<size>``, all
    sizes summed, bytes; 0 when none), and whether it is unschedulable."""

    name: str
    allocatable_memory_bytes: int | None
    capacity_memory_bytes: int | None
    unschedulable: bool
    capacity_hugepages_bytes: int = 0

    @property
    def usable_memory_bytes(self) -> int | None:
        """``capacity.memory`` (MemTotal, from cAdvisor's MachineInfo) minus the huge pages of
        ``capacity``, at least 0, as the kubelet takes them out of allocatable memory
        (pkg/kubelet/nodestatus/setters.go ``MachineInfo``); ``None`` without a capacity."""
        if self.capacity_memory_bytes is None:
            return None
        return max(0, self.capacity_memory_bytes - self.capacity_hugepages_bytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class PodMemoryTotals:
    """The memory requests and limits of this node's pods that hold resources (phase neither
    ``Succeeded`` nor ``Failed``), in bytes: ``requests`` summed, ``limits`` summed over the
    pods that have one, and ``pods_without_limit``."""

    requests_bytes: int
    limits_bytes: int
    pods_without_limit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadLabels:
    """The ``namespace``, ``pod`` and ``container`` label values of one workload series."""

    namespace: str
    pod: str
    container: str


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSnapshot:
    """One sample of the node. ``timestamp`` is Unix seconds at the start of the sample.

    Collectors that are off or had no data leave their part ``None`` (or empty);
    ``collectors`` says which ran and how each fared (:mod:`nodeguard.collectors`). ``pod_meta``
    (the UID a pod's cgroup carries -> :class:`PodMeta`; :attr:`PodMeta.cgroup_uid`: a static
    pod's config hash) and ``node_meta`` come from the Kubernetes API and are ``None`` without a
    cluster. ``gpu`` is ``None`` without an NVIDIA driver or GPU. ``cgroup_files_open``: the
    cgroup files the cgroups collector holds open after the sample
    (:mod:`nodeguard.sources.open_files`). ``extra``: the parts of collectors that no other part
    of nodeguard reads, by collector name (what they render from).

    ``kubepods``: the ``kubepods`` cgroup itself, on which the kubelet enforces node allocatable
    (``--enforce-node-allocatable=pods``: its limit is capacity minus kube-reserved and
    system-reserved); ``None`` where there is none. ``cgroup_root``: the absolute path of the
    memory hierarchy the pods' ``CgroupMemory.path`` are relative to. ``vmstat``: the node's
    global reclaim counters (:class:`VmStat`), ``None`` where ``/proc/vmstat`` is absent.

    ``focused``: ``None`` for a full sample. A focused sample (:mod:`nodeguard.sampling.sampler`)
    re-reads ``/proc/meminfo``, PSI and only the pod and container cgroups whose keys it lists
    (a pod's UID, ``<pod uid>/<container id>``); everything else is the last sample's, carried.
    """

    timestamp: float
    node_name: str
    meminfo: MemInfo | None
    pressure: Pressure | None
    pods: tuple[PodMemory, ...]
    oom: OomLog | None
    processes: tuple[ProcessRss, ...]
    collectors: tuple[CollectorStatus, ...]
    cgroup_version: int | None = None
    pod_meta: Mapping[str, PodMeta] | None = None
    node_meta: NodeMeta | None = None
    gpu: GpuInfo | None = None
    cgroup_files_open: int | None = None
    kubepods: CgroupMemory | None = None
    cgroup_root: str | None = None
    vmstat: VmStat | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    focused: tuple[str, ...] | None = None

    def is_current(self, key: str) -> bool:
        """Whether the pod or container ``key`` was read in this sample (every one in a full
        sample; in a focused one, those it lists)."""
        return self.focused is None or key in self.focused

    def containers(self) -> list[tuple[PodMemory, ContainerMemory]]:
        """Every container with its pod, in pod order."""
        return [(pod, c) for pod in self.pods for c in pod.containers]

    def labels_for(self, pod_uid: str, container_id: str | None) -> WorkloadLabels:
        """Workload labels of a pod (``container_id=None``) or container: names from the pod
        list where known; otherwise the pod UID and container ID stand in, namespace empty. A
        container ID the pod's statuses do not list yet keeps its ID as its name."""
        meta = self.pod_meta.get(pod_uid) if self.pod_meta else None
        if meta is None:
            return WorkloadLabels(namespace="", pod=pod_uid, container=container_id or "")
        name = meta.containers.get(container_id, container_id) if container_id else ""
        return WorkloadLabels(namespace=meta.namespace, pod=meta.name, container=name)

    def gpu_containers(self) -> list[GpuContainerUsage]:
        """GPU memory per container and GPU (and MIG instance), from the processes NVML listed
        that live in a kubepods cgroup, MPS servers left out (:class:`GpuProcess`); in device
        order, then by pod UID and container ID."""
        out: list[GpuContainerUsage] = []
        for dev in self.gpu.devices if self.gpu else ():
            groups: dict[tuple[str, str | None, int | None], list[GpuProcess]] = {}
            for proc in dev.processes or ():
                # An MPS server's memory is its clients' (GpuProcess): counted in theirs.
                if proc.pod_uid is not None and not proc.mps_server:
                    key = (proc.pod_uid, proc.container_id, proc.mig_gpu_instance_id)
                    groups.setdefault(key, []).append(proc)
            for (uid, cid, gi), procs in sorted(groups.items(), key=lambda kv: _group_order(kv[0])):
                sizes = [p.used_bytes for p in procs]
                out.append(
                    GpuContainerUsage(
                        pod_uid=uid,
                        container_id=cid,
                        gpu_index=dev.index,
                        gpu_uuid=dev.uuid,
                        mig_gpu_instance_id=gi,
                        processes=len(procs),
                        used_bytes=None
                        if None in sizes
                        else sum(s for s in sizes if s is not None),
                    )
                )
        return out

    def pod_memory_totals(self) -> PodMemoryTotals | None:
        """Requests and limits of the pods that hold resources on the node (for overcommit
        against allocatable); ``None`` without the pod list."""
        if self.pod_meta is None:
            return None
        live = [m for m in self.pod_meta.values() if not m.finished]
        return PodMemoryTotals(
            requests_bytes=sum(m.memory_request_bytes for m in live),
            limits_bytes=sum(m.memory_limit_bytes or 0 for m in live),
            pods_without_limit=sum(1 for m in live if m.memory_limit_bytes is None),
        )

    def collector(self, name: str) -> CollectorStatus | None:
        """The status of the named collector, ``None`` if it did not run."""
        return next((c for c in self.collectors if c.name == name), None)


def _group_order(key: tuple[str, str | None, int | None]) -> tuple[str, str, int]:
    uid, cid, gi = key
    return (uid, cid or "", -1 if gi is None else gi)


def to_jsonable(snapshot: NodeSnapshot) -> dict[str, Any]:
    """The snapshot as plain JSON types (dicts, lists, numbers in bytes and seconds, null)."""
    data: dict[str, Any] = dataclasses.asdict(snapshot)
    return data
