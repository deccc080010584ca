"""GPU memory by device, MIG instance and process, through NVML (nvidia-ml-py's ``pynvml``).

NVML is loaded and initialised once (``nvmlInit``), on the first sample, never at import, and
shut down by :meth:`NvmlReader.close` when the agent exits. Per sample, for every device
(``nvmlDeviceGetCount_v2``, ``nvmlDeviceGetHandleByIndex_v2``): UUID, name, MIG mode, memory
(``nvmlDeviceGetMemoryInfo_v2``, falling back to v1), the MIG devices where MIG is on, and the
processes, on each MIG device when MIG is on. NVML keeps three process lists: compute
(``nvmlDeviceGetComputeRunningProcesses``), graphics (``...GraphicsRunningProcesses``) and MPS
compute (``...MPSComputeRunningProcesses``); each is read (``_v3``, else ``_v2`` on a driver
without it) and they are merged by PID (:class:`~nodeguard.snapshot.GpuProcess`):

- a PID in several lists is one process (nvidia-smi's ``C+G``, ``M+C``); its memory is the
  known one, the larger where both are known and differ;
- on a GPU shared through CUDA MPS (k8s-device-plugin ``sharing.mps``) the compute list has
  only the MPS server (``nvidia-cuda-mps-server``, in the device plugin's MPS control daemon
  pod) and the workloads are in the MPS list, each with its own ``usedGpuMemory`` (Volta MPS:
  each client has its own GPU address space) or "not available" on some drivers
  (dcgm-exporter#478, nvtop#93: tools that read the compute list alone show the server only).
  The server is marked ``mps_server`` and counts for no container.

NVML gives host PIDs: each is mapped through ``<procfs>/<pid>/cgroup`` to its container
(:func:`nodeguard.sources.processes.owner_of`, which reads the path in any form, cgroup
namespaces included).

What is missing stays missing:

- no ``libnvidia-ml.so.1``, or no driver loaded, or no GPU: :class:`NoDataError`, and init is
  tried again every ``retry_seconds`` (a driver container may come up after the agent);
- another init failure: an error of this collector alone, retried likewise;
- a query a device does not support (NOT_SUPPORTED): that value of that device is ``None``;
- a driver without either compute-list symbol (FUNCTION_NOT_FOUND): every device's
  ``processes`` is ``None``, device data is still read;
- a graphics list NOT_SUPPORTED is empty (a MIG instance has no graphics contexts); absent or
  failed, the device's ``processes_missing`` says ``graphics``;
- an MPS list NOT_SUPPORTED (pre-Volta GPUs), absent (an NVML older than the MPS list's
  ``_v2``: not in CUDA 11.2's ``nvml.h``, go-nvml#28) or failed is
  nothing lost where no MPS server runs on the device, and ``processes_missing`` says ``mps``
  where one does (its clients exist, unlisted): then no pod's GPU total is known;
- a GPU lost (GPU_IS_LOST): that device is reported ``lost``, the others as usual;
- a PID that has exited before its cgroup is read: kept, not mapped to a container.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pynvml

from nodeguard.paths import HostPaths
from nodeguard.snapshot import GpuDevice, GpuInfo, GpuMemory, GpuProcess, MigDevice
from nodeguard.sources import NoDataError
from nodeguard.sources.processes import ProcessOwner, owner_of, process_name

__all__ = ["NvmlInitError", "NvmlReader"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Init failures that mean "no NVIDIA driver here", which is no data, not an error.
_NO_DRIVER = frozenset({pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED})
#: ``gpuInstanceId`` / ``computeInstanceId`` of a process outside MIG.
_NA_UINT = int(pynvml.NVML_VALUE_NOT_AVAILABLE_uint.value)
#: NVML's three process lists and the binding's functions for each, newest first: pynvml
#: resolves each symbol when called and raises FUNCTION_NOT_FOUND where the driver lacks it
#: (``_v3`` on current drivers, ``_v2`` on older ones; pynvml reads both into the same
#: ``nvmlProcessInfo_v2_t`` layout: pid, usedGpuMemory, gpuInstanceId, computeInstanceId).
_LISTS: dict[str, tuple[str, ...]] = {
    kind: (f"nvmlDevice{fn}_v3", f"nvmlDevice{fn}_v2")
    for kind, fn in (
        ("compute", "GetComputeRunningProcesses"),
        ("graphics", "GetGraphicsRunningProcesses"),
        ("mps", "GetMPSComputeRunningProcesses"),
    )
}
_KINDS = tuple(_LISTS)
#: The MPS server's executable (CUDA MPS guide; k8s-device-plugin's MPS control daemon starts it).
_MPS_SERVER = "nvidia-cuda-mps-server"


class NvmlInitError(Exception):
    """``nvmlInit`` failed for a reason other than a missing driver."""


class _GpuLost(Exception):
    """A device answered GPU_IS_LOST."""


def _code(exc: pynvml.NVMLError) -> int:
    return int(exc.value)


class NvmlReader:
    """Reads the GPUs through NVML; ``read()`` returns :class:`GpuInfo`.

    Keeps NVML initialised between samples, the UUID and name of each device index (so a GPU
    lost later is still named), and which optional queries the driver lacks. A failed
    ``nvmlInit`` is tried again ``retry_seconds`` later on ``clock`` (monotonic seconds).
    """

    def __init__(
        self,
        *,
        paths: HostPaths,
        retry_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._paths = paths
        self._retry = retry_seconds
        self._clock = clock  # for the retry of a failed nvmlInit (tests drive a fake one)
        self._initialised = False
        self._failure: tuple[type[Exception], str] | None = None
        self._retry_at = float("-inf")
        self._driver: str | None = None
        self._memory_v2 = True
        self._version = dict.fromkeys(_KINDS, 0)  # per list: which of _LISTS[kind] to call
        self._names: dict[int, tuple[str | None, str | None]] = {}
        self._logged: set[str] = set()
        self._containers: Mapping[str, str] | None = None

    # -- life cycle ------------------------------------------------------------------------------
    def _init(self) -> None:
        if self._initialised:
            return
        now = self._clock()
        if self._failure is not None and now < self._retry_at:
            kind, message = self._failure
            raise kind(message)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            if _code(exc) in _NO_DRIVER:
                failure: tuple[type[Exception], str] = (
                    NoDataError,
                    f"no NVIDIA driver (nvmlInit: {exc})",
                )
            else:
                failure = (NvmlInitError, f"nvmlInit failed: {exc}")
            self._failure, self._retry_at = failure, now + self._retry
            raise failure[0](failure[1]) from exc
        self._initialised, self._failure = True, None
        try:
            self._driver = str(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError:
            self._driver = None
        log.info("NVML initialised, driver %s", self._driver or "unknown")

    def close(self) -> None:
        """``nvmlShutdown`` if NVML was initialised; safe to call more than once."""
        if not self._initialised:
            return
        self._initialised = False
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.warning("nvmlShutdown: %s", exc)

    # -- one sample ------------------------------------------------------------------------------
    def read(self, *, containers: Mapping[str, str] | None = None) -> GpuInfo:
        """Every device. ``containers`` (container ID -> pod UID, from the cgroup walk) names the
        pod of a process of the agent's own pod (:func:`~nodeguard.sources.processes.owner_of`).
        Raises :class:`NoDataError` without a driver or without a GPU, :class:`NvmlInitError` or
        ``RuntimeError`` when NVML cannot be used at all."""
        self._containers = containers
        self._init()
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            raise RuntimeError(f"nvmlDeviceGetCount: {exc}") from exc
        if count == 0:
            raise NoDataError("NVML sees no GPU")
        return GpuInfo(
            driver_version=self._driver, devices=tuple(self._device(i) for i in range(count))
        )

    def _once(self, key: str, level: int, message: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, message, *args)

    def _call(self, errors: list[str], what: str, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(*args)``; ``None`` with the reason in ``errors`` when NVML refuses."""
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            if _code(exc) == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost from exc
            errors.append(f"{what}: {exc}")
            return None

    def _device(self, index: int) -> GpuDevice:
        errors: list[str] = []
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as exc:
            if _code(exc) == pynvml.NVML_ERROR_GPU_IS_LOST:
                return self._lost(index)
            errors.append(f"handle: {exc}")
            return self._without_data(index, errors=tuple(errors))
        try:
            uuid = self._call(errors, "uuid", pynvml.nvmlDeviceGetUUID, handle)
            name = self._call(errors, "name", pynvml.nvmlDeviceGetName, handle)
            known = self._names.get(index, (None, None))
            self._names[index] = (uuid or known[0], name or known[1])
            memory = self._memory(handle, errors, "memory")
            mode = self._call(errors, "mig mode", pynvml.nvmlDeviceGetMigMode, handle)
            mig = None if mode is None else int(mode[0]) == pynvml.NVML_DEVICE_MIG_ENABLE
            migs = self._mig_devices(handle, errors) if mig else []
            if mig:
                processes, missing = self._mig_processes(migs, errors)
            else:
                processes, missing = self._processes_of(handle, errors, "processes", None)
        except _GpuLost:
            return self._lost(index)
        return GpuDevice(
            index=index,
            uuid=uuid,
            name=name,
            mig_enabled=mig,
            memory=memory,
            mig_devices=tuple(m for m, _ in migs),
            processes=processes,
            processes_missing=missing,
            errors=tuple(errors),
        )

    def _lost(self, index: int) -> GpuDevice:
        uuid = self._names.get(index, (None, None))[0]
        self._once(f"lost:{index}:{uuid}", logging.ERROR, "GPU %d (%s) is lost", index, uuid)
        return self._without_data(index, errors=("GPU is lost",), lost=True)

    def _without_data(
        self, index: int, *, errors: tuple[str, ...], lost: bool = False
    ) -> GpuDevice:
        """A device NVML gave nothing for this sample, named as it was last seen."""
        uuid, name = self._names.get(index, (None, None))
        return GpuDevice(
            index=index,
            uuid=uuid,
            name=name,
            mig_enabled=None,
            memory=None,
            mig_devices=(),
            processes=None,
            lost=lost,
            errors=errors,
        )

    def _memory(self, handle: Any, errors: list[str], what: str) -> GpuMemory | None:
        """Memory info v2, else v1 (where the driver lacks v2 or the device does not support
        it)."""
        if self._memory_v2:
            try:
                m = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
                return GpuMemory(
                    total_bytes=int(m.total),
                    used_bytes=int(m.used),
                    free_bytes=int(m.free),
                    reserved_bytes=int(m.reserved),
                    info_version=2,
                )
            except pynvml.NVMLError as exc:
                code = _code(exc)
                if code == pynvml.NVML_ERROR_GPU_IS_LOST:
                    raise _GpuLost from exc
                if code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    self._memory_v2 = False
                    log.warning("NVML has no nvmlDeviceGetMemoryInfo_v2: reserved memory unknown")
                elif code not in (
                    pynvml.NVML_ERROR_NOT_SUPPORTED,
                    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
                ):
                    errors.append(f"{what}: {exc}")
                    return None
        m1 = self._call(errors, what, pynvml.nvmlDeviceGetMemoryInfo, handle)
        if m1 is None:
            return None
        return GpuMemory(
            total_bytes=int(m1.total),
            used_bytes=int(m1.used),
            free_bytes=int(m1.free),
            reserved_bytes=None,
            info_version=1,
        )

    def _mig_devices(self, handle: Any, errors: list[str]) -> list[tuple[MigDevice, Any]]:
        count = self._call(errors, "mig devices", pynvml.nvmlDeviceGetMaxMigDeviceCount, handle)
        out: list[tuple[MigDevice, Any]] = []
        for slot in range(int(count or 0)):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except pynvml.NVMLError as exc:
                if _code(exc) == pynvml.NVML_ERROR_GPU_IS_LOST:
                    raise _GpuLost from exc
                if _code(exc) != pynvml.NVML_ERROR_NOT_FOUND:  # NOT_FOUND: an empty slot
                    errors.append(f"mig device {slot}: {exc}")
                continue
            what = f"mig device {slot}"
            gi = self._call(errors, f"{what} gpu instance", pynvml.nvmlDeviceGetGpuInstanceId, mig)
            ci = self._call(
                errors, f"{what} compute instance", pynvml.nvmlDeviceGetComputeInstanceId, mig
            )
            device = MigDevice(
                index=slot,
                uuid=self._call(errors, f"{what} uuid", pynvml.nvmlDeviceGetUUID, mig),
                gpu_instance_id=None if gi is None else int(gi),
                compute_instance_id=None if ci is None else int(ci),
                memory=self._memory(mig, errors, f"{what} memory"),
            )
            out.append((device, mig))
        return out

    def _mig_processes(
        self, migs: list[tuple[MigDevice, Any]], errors: list[str]
    ) -> tuple[tuple[GpuProcess, ...] | None, tuple[str, ...]]:
        """Each MIG device's lists (NVML: in MIG mode the GPU's own handle lists nothing
        without privileges; each MIG device handle lists its instance's processes)."""
        found: list[GpuProcess] = []
        missing: set[str] = set()
        for device, mig in migs:
            what = f"mig device {device.index} processes"
            procs, lacking = self._processes_of(mig, errors, what, device)
            if procs is None:
                return None, ()
            found.extend(procs)
            missing.update(lacking)
        return tuple(found), tuple(k for k in _KINDS if k in missing)

    def _list(self, kind: str, handle: Any, errors: list[str], what: str) -> list[Any] | str:
        """One of NVML's process lists: its entries, or why there are none: ``"absent"`` (the
        driver has neither the _v3 nor the _v2 symbol: FUNCTION_NOT_FOUND), ``"unsupported"``
        (NOT_SUPPORTED for this device), ``"failed"`` (another error, put in ``errors``)."""
        while self._version[kind] < len(_LISTS[kind]):
            name = _LISTS[kind][self._version[kind]]
            try:
                infos: list[Any] = getattr(pynvml, name)(handle)
            except pynvml.NVMLError as exc:
                code = _code(exc)
                if code == pynvml.NVML_ERROR_GPU_IS_LOST:
                    raise _GpuLost from exc
                if code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    self._version[kind] += 1  # an older driver: the older symbol, from now on
                    continue
                if code == pynvml.NVML_ERROR_NOT_SUPPORTED:
                    return "unsupported"
                errors.append(f"{what} ({kind}): {exc}")
                return "failed"
            return infos
        self._once(
            f"absent:{kind}",
            logging.WARNING,
            "NVML has none of %s (a driver older than this nvidia-ml-py expects): %s processes "
            "are not listed",
            ", ".join(_LISTS[kind]),
            kind,
        )
        return "absent"

    def _processes_of(
        self, handle: Any, errors: list[str], what: str, mig: MigDevice | None
    ) -> tuple[tuple[GpuProcess, ...] | None, tuple[str, ...]]:
        """The three lists of one handle merged by PID, and the lists where processes may be
        missing (:attr:`~nodeguard.snapshot.GpuDevice.processes_missing`). No compute list: no
        processes (``None``). A list NOT_SUPPORTED holds nothing on this device (graphics on a
        MIG instance: NVIDIA's MIG guide says graphics contexts are not supported there)."""
        listed = {kind: self._list(kind, handle, errors, what) for kind in _KINDS}
        compute = listed["compute"]
        if isinstance(compute, str):
            if compute != "failed":
                errors.append(
                    f"{what}: {' / '.join(_LISTS['compute'])} not in this driver"
                    if compute == "absent"
                    else f"{what}: Not Supported"
                )
            return None, ()
        merged: dict[int, _Entry] = {}
        for kind in _KINDS:
            infos = listed[kind]
            for info in infos if isinstance(infos, list) else ():
                entry = merged.setdefault(int(info.pid), _Entry(info=info))
                entry.kinds.append(kind)
                if info.usedGpuMemory is not None:
                    entry.used.append(int(info.usedGpuMemory))
        procs = tuple(self._process(pid, e, mig) for pid, e in merged.items())
        missing = []
        if listed["graphics"] in ("absent", "failed"):
            missing.append("graphics")
        # MPS clients reach the GPU only through a server (the control daemon starts one for
        # them, nvidia-cuda-mps-control(1)): without one on the device, none can be missing.
        if isinstance(listed["mps"], str) and any(p.mps_server for p in procs):
            missing.append("mps")
            errors.append(
                f"{what}: an MPS server runs, its clients cannot be listed ({listed['mps']})"
            )
        return procs, tuple(missing)

    def _process(self, pid: int, entry: _Entry, mig: MigDevice | None) -> GpuProcess:
        info = entry.info
        gi: int | None = int(info.gpuInstanceId)
        ci: int | None = int(info.computeInstanceId)
        if mig is not None:  # the MIG device that listed it says where it runs
            gi = mig.gpu_instance_id if gi == _NA_UINT else gi
            ci = mig.compute_instance_id if ci == _NA_UINT else ci
        try:
            owner = owner_of(paths=self._paths, pid=pid, containers=self._containers)
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


@dataclass
class _Entry:
    """One PID's entries across the lists of one handle: the first entry (its MIG instance
    IDs), the lists, and the amounts NVML knew (pynvml turns NVML_VALUE_NOT_AVAILABLE into
    ``None``)."""

    info: Any
    kinds: list[str] = field(default_factory=list)
    used: list[int] = field(default_factory=list)
