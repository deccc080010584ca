"""The processes of one handle (a GPU or a MIG device): NVML's three lists merged by PID, each
PID mapped to its container.

- a PID in several lists is one process (nvidia-smi's ``C+G``, ``M+C``); its memory is the
  known one, the larger where both are known and differ;
- the MPS server (``nvidia-cuda-mps-server``) is the one compute-only process of that name;
- NVML gives host PIDs: each is mapped through ``<procfs>/<pid>/cgroup``
  (:func:`nodeguard.sources.processes.owner_of`); one that exited before is kept, unmapped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pynvml

from nodeguard.paths import HostPaths
from nodeguard.snapshot import GpuProcess, MigDevice
from nodeguard.sources.gpu_process_lists import KINDS, LISTS, ProcessLists
from nodeguard.sources.processes import ProcessOwner, owner_of, process_name

__all__ = ["GpuProcesses", "Listed", "MigHandle"]

#: ``gpuInstanceId`` / ``computeInstanceId`` of a process outside MIG.
_NA_UINT = int(pynvml.NVML_VALUE_NOT_AVAILABLE_uint.value)
#: The MPS server's executable (CUDA MPS guide; k8s-device-plugin's MPS control daemon starts it).
_MPS_SERVER = "nvidia-cuda-mps-server"


class Listed(NamedTuple):
    """A handle's processes (``None``: not known, no compute list) and the lists where some may
    be missing (:attr:`~nodeguard.snapshot.GpuDevice.processes_missing`)."""

    processes: tuple[GpuProcess, ...] | None
    missing: tuple[str, ...]


class MigHandle(NamedTuple):
    """A MIG device as read, and its NVML handle."""

    device: MigDevice
    handle: Any


@dataclass
class _Entry:
    """One PID's entries across the lists of one handle: the first entry (its MIG instance
    IDs), the lists, and the amounts NVML knew (pynvml turns NVML_VALUE_NOT_AVAILABLE into
    ``None``)."""

    info: Any
    kinds: list[str] = field(default_factory=list)
    used: list[int] = field(default_factory=list)


class GpuProcesses:
    """Lists and merges the processes of a handle; ``containers`` (container ID -> pod UID,
    from the cgroup walk) names the pod of a process of the agent's own pod
    (:func:`~nodeguard.sources.processes.owner_of`)."""

    def __init__(self, *, paths: HostPaths, lists: ProcessLists) -> None:
        self._paths = paths
        self._lists = lists

    def of_mig_devices(
        self,
        migs: Sequence[MigHandle],
        *,
        errors: list[str],
        containers: Mapping[str, str] | None,
    ) -> Listed:
        """Each MIG device's lists (NVML: in MIG mode the GPU's own handle lists nothing
        without privileges; each MIG device handle lists its instance's processes)."""
        found: list[GpuProcess] = []
        missing: set[str] = set()
        for mig in migs:
            listed = self.of_handle(
                mig.handle,
                errors=errors,
                what=f"mig device {mig.device.index} processes",
                mig=mig.device,
                containers=containers,
            )
            if listed.processes is None:
                return Listed(None, ())
            found.extend(listed.processes)
            missing.update(listed.missing)
        return Listed(tuple(found), tuple(k for k in KINDS if k in missing))

    def of_handle(
        self,
        handle: Any,
        *,
        errors: list[str],
        what: str,
        mig: MigDevice | None,
        containers: Mapping[str, str] | None,
    ) -> Listed:
        """The three lists of one handle merged by PID. No compute list: no processes
        (``None``). A list NOT_SUPPORTED holds nothing on this device (graphics on a MIG
        instance: NVIDIA's MIG guide says graphics contexts are not supported there). Raises
        :class:`~nodeguard.sources.nvml_calls.GpuLost`."""
        listed = {kind: self._lists.read(kind, handle, errors=errors, what=what) for kind in KINDS}
        compute = listed["compute"]
        if isinstance(compute, str):
            if compute != "failed":
                errors.append(
                    f"{what}: {' / '.join(LISTS['compute'])} not in this driver"
                    if compute == "absent"
                    else f"{what}: Not Supported"
                )
            return Listed(None, ())
        merged: dict[int, _Entry] = {}
        for kind in KINDS:
            infos = listed[kind]
            for info in infos if isinstance(infos, list) else ():
                entry = merged.setdefault(int(info.pid), _Entry(info=info))
                entry.kinds.append(kind)
                if info.usedGpuMemory is not None:
                    entry.used.append(int(info.usedGpuMemory))
        procs = tuple(
            self._process(pid, e, mig=mig, containers=containers) for pid, e in merged.items()
        )
        missing = []
        if listed["graphics"] in ("absent", "failed"):
            missing.append("graphics")
        # MPS clients reach the GPU only through a server (the control daemon starts one for
        # them, nvidia-cuda-mps-control(1)): without one on the device, none can be missing.
        mps = listed["mps"]
        if isinstance(mps, str) and any(p.mps_server for p in procs):
            missing.append("mps")
            errors.append(f"{what}: an MPS server runs, its clients cannot be listed ({mps})")
        return Listed(procs, tuple(missing))

    def _process(
        self,
        pid: int,
        entry: _Entry,
        *,
        mig: MigDevice | None,
        containers: Mapping[str, str] | None,
    ) -> GpuProcess:
        info = entry.info
        gi: int | None = int(info.gpuInstanceId)
        ci: int | None = int(info.computeInstanceId)
        if mig is not None:  # the MIG device that listed it says where it runs
            gi = mig.gpu_instance_id if gi == _NA_UINT else gi
            ci = mig.compute_instance_id if ci == _NA_UINT else ci
        try:
            owner = owner_of(paths=self._paths, pid=pid, containers=containers)
        except OSError:  # exiting while read (ESRCH), or not ours to read
            owner = ProcessOwner(cgroup=None, pod_uid=None, container_id=None)
        # The server has a compute context of its own and is never in the MPS list (NVML:
        # "information about MPS server processes is not returned" there).
        server = entry.kinds == ["compute"] and (
            process_name(procfs=str(self._paths.procfs), pid=pid) == _MPS_SERVER
        )
        return GpuProcess(
            pid=pid,
            # One process, one amount: where lists disagree (read one after another while it
            # allocates) the larger, so a rule never misses memory the process held.
            used_bytes=max(entry.used) if entry.used else None,
            mig_gpu_instance_id=None if gi == _NA_UINT else gi,
            mig_compute_instance_id=None if ci == _NA_UINT else ci,
            cgroup=owner.cgroup,
            pod_uid=owner.pod_uid,
            container_id=owner.container_id,
            lists=tuple(entry.kinds),
            mps_server=server,
        )
