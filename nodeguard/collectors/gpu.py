"""``gpu``: every NVIDIA GPU's framebuffer memory, its MIG instances', and each container's
on each GPU, through NVML (:mod:`nodeguard.sources.gpu`; docs/gpu.md). Per GPU, per MIG instance
and per container, never per PID. NVML is initialised at the first sample, never at import or
when the collector is made."""

from __future__ import annotations

from collections.abc import Iterator

from nodeguard.collectors.base import Collector, Parts, Settings, register
from nodeguard.collectors.families import Families, Family
from nodeguard.collectors.labels import NO_WORKLOAD, WORKLOAD_LABELS, container_pods, node_gauge
from nodeguard.snapshot import GpuMemory, NodeSnapshot
from nodeguard.sources.gpu import NvmlReader

__all__ = ["GpuCollector"]

_MEMORY_DOCS = (
    ("total", "GPU framebuffer memory, total (NVML memory info)"),
    (
        "used",
        "GPU memory allocated (NVML memory info v2 used, reserved excluded; a driver with v1 only "
        "counts reserved in used and has no reserved series)",
    ),
    ("free", "GPU memory free (NVML memory info)"),
    ("reserved", "GPU memory the driver and firmware reserve (NVML memory info v2)"),
)


class _MemoryFamilies:
    """``nodeguard_<prefix>_memory_{total,used,free,reserved}_bytes`` over one label set."""

    def __init__(self, out: Families, *, prefix: str, what: str, labels: list[str]) -> None:
        self.families = {
            kind: out.gauge(f"{prefix}_memory_{kind}_bytes", f"{what}: {doc}", labels)
            for kind, doc in _MEMORY_DOCS
        }

    def add(self, values: tuple[str, ...], mem: GpuMemory | None) -> None:
        if mem is None:
            return
        for kind, amount in (
            ("total", mem.total_bytes),
            ("used", mem.used_bytes),
            ("free", mem.free_bytes),
            ("reserved", mem.reserved_bytes),
        ):
            if amount is not None:
                self.families[kind].add(values, amount)


@register
class GpuCollector(Collector):
    """``parts.gpu``; the ``nodeguard_gpu_*`` families."""

    name = "gpu"
    after = ("cgroups",)  # GPU processes are mapped by host PID to their container

    def __init__(self, *, settings: Settings) -> None:
        super().__init__(settings=settings)
        self.reader = NvmlReader(paths=settings.paths)

    def read(self, parts: Parts) -> None:
        parts.gpu = self.reader.read(containers=container_pods(parts.pods))

    def close(self) -> None:
        """Shut NVML down."""
        self.reader.close()

    @staticmethod
    def render(snapshot: NodeSnapshot, out: Families) -> Iterator[Family]:
        gpu = snapshot.gpu
        if gpu is None:
            return
        dev_labels = [*WORKLOAD_LABELS, "gpu", "uuid", "model"]
        driver = node_gauge(
            out, "gpu_driver_info", "NVIDIA driver version (NVML)", ["driver_version"]
        )
        driver.add((*NO_WORKLOAD, gpu.driver_version or ""), 1)
        memory = _MemoryFamilies(out, prefix="gpu", what="per GPU", labels=dev_labels)
        mig_memory = _MemoryFamilies(
            out,
            prefix="gpu_mig",
            what="per MIG instance (mig: GPU instance ID)",
            labels=[*dev_labels, "mig"],
        )
        mig_on = out.gauge(
            "gpu_mig_enabled", "1 if MIG mode is on (absent where the GPU has no MIG)", dev_labels
        )
        lost = out.gauge(
            "gpu_lost", "1 if NVML reports the GPU lost (fallen off the bus), else 0", dev_labels
        )
        for dev in gpu.devices:
            values = (*NO_WORKLOAD, str(dev.index), dev.uuid or "", dev.name or "")
            memory.add(values, dev.memory)
            lost.add(values, 1 if dev.lost else 0)
            if dev.mig_enabled is not None:
                mig_on.add(values, 1 if dev.mig_enabled else 0)
            for mig in dev.mig_devices:
                if mig.gpu_instance_id is not None:
                    mig_memory.add((*values, str(mig.gpu_instance_id)), mig.memory)
        names = ["namespace", "pod", "container", "gpu", "uuid", "mig"]
        used = out.gauge(
            "gpu_container_memory_used_bytes",
            "GPU memory used by a container's processes on a GPU (mig: GPU instance ID, empty "
            "outside MIG); absent when a process's memory is not available",
            names,
        )
        procs = out.gauge(
            "gpu_container_processes",
            "processes of a container on a GPU (NVML's compute, graphics and MPS lists, each PID "
            "once, mapped by host PID to its cgroup; MPS servers count for no container)",
            names,
        )
        for usage in snapshot.gpu_containers():
            cl = snapshot.labels_for(usage.pod_uid, usage.container_id)
            gi = usage.mig_gpu_instance_id
            values = (
                cl.namespace,
                cl.pod,
                cl.container,
                str(usage.gpu_index),
                usage.gpu_uuid or "",
                "" if gi is None else str(gi),
            )
            procs.add(values, usage.processes)
            if usage.used_bytes is not None:
                used.add(values, usage.used_bytes)
        yield driver
        yield from memory.families.values()
        yield from mig_memory.families.values()
        yield from (mig_on, lost, used, procs)
