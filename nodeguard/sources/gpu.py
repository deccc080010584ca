"""GPU memory by device, MIG instance and process, through NVML (nvidia-ml-py's ``pynvml``).

NVML is loaded and initialised once (``nvmlInit``), on the first sample, never at import, and
shut down by :meth:`NvmlReader.close` when the agent exits. Per sample, for every device
(``nvmlDeviceGetCount_v2``, ``nvmlDeviceGetHandleByIndex_v2``): UUID, name, MIG mode, memory
(``nvmlDeviceGetMemoryInfo_v2``, falling back to v1), the MIG devices where MIG is on, and the
compute processes (``nvmlDeviceGetComputeRunningProcesses_v3``; on each MIG device when MIG is
on). NVML gives host PIDs: each is mapped through ``<procfs>/<pid>/cgroup`` to its container
(:func:`nodeguard.sources.processes.owner_of`, which reads the path in any form, cgroup
namespaces included).

What is missing stays missing:

- no ``libnvidia-ml.so.1``, or no driver loaded, or no GPU: :class:`NoDataError`, and init is
  tried again every ``retry_seconds`` (a driver container may come up after the agent);
- another init failure: an error of this collector alone, retried likewise;
- a query a device does not support (NOT_SUPPORTED): that value of that device is ``None``;
- a driver without the process query the binding calls (FUNCTION_NOT_FOUND): every device's
  ``processes`` is ``None``, device data is still read;
- a GPU lost (GPU_IS_LOST): that device is reported ``lost``, the others as usual;
- a PID that has exited before its cgroup is read: kept, not mapped to a container.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import pynvml

from nodeguard.paths import HostPaths
from nodeguard.snapshot import GpuDevice, GpuInfo, GpuMemory, GpuProcess, MigDevice
from nodeguard.sources import NoDataError
from nodeguard.sources.processes import ProcessOwner, owner_of

__all__ = ["NvmlInitError", "NvmlReader"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Init failures that mean "no NVIDIA driver here", which is no data, not an error.
_NO_DRIVER = frozenset({pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED})
#: ``gpuInstanceId`` / ``computeInstanceId`` of a process outside MIG.
_NA_UINT = int(pynvml.NVML_VALUE_NOT_AVAILABLE_uint.value)


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
        self._processes = True
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
                processes = self._mig_processes(migs, errors)
            else:
                processes = self._processes_of(handle, errors, "processes", None)
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
    ) -> tuple[GpuProcess, ...] | None:
        found: list[GpuProcess] = []
        for device, mig in migs:
            procs = self._processes_of(mig, errors, f"mig device {device.index} processes", device)
            if procs is None:
                return None
            found.extend(procs)
        return tuple(found)

    def _processes_of(
        self, handle: Any, errors: list[str], what: str, mig: MigDevice | None
    ) -> tuple[GpuProcess, ...] | None:
        if self._processes:
            try:
                infos = pynvml.nvmlDeviceGetComputeRunningProcesses_v3(handle)
            except pynvml.NVMLError as exc:
                code = _code(exc)
                if code == pynvml.NVML_ERROR_GPU_IS_LOST:
                    raise _GpuLost from exc
                if code != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    errors.append(f"{what}: {exc}")
                    return None
                self._processes = False
                log.warning(
                    "NVML has no nvmlDeviceGetComputeRunningProcesses_v3 (a driver older than "
                    "this nvidia-ml-py expects): per-process GPU memory unavailable"
                )
            else:
                return tuple(self._process(info, mig) for info in infos)
        errors.append(f"{what}: nvmlDeviceGetComputeRunningProcesses_v3 not in this driver")
        return None

    def _process(self, info: Any, mig: MigDevice | None) -> GpuProcess:
        pid = int(info.pid)
        used = info.usedGpuMemory  # pynvml turns NVML_VALUE_NOT_AVAILABLE into None
        gi: int | None = int(info.gpuInstanceId)
        ci: int | None = int(info.computeInstanceId)
        if mig is not None:  # the MIG device that listed it says where it runs
            gi = mig.gpu_instance_id if gi == _NA_UINT else gi
            ci = mig.compute_instance_id if ci == _NA_UINT else ci
        try:
            owner = owner_of(paths=self._paths, pid=pid, containers=self._containers)
        except OSError:  # exiting while read (ESRCH), or not ours to read
            owner = ProcessOwner(cgroup=None, pod_uid=None, container_id=None)
        return GpuProcess(
            pid=pid,
            used_bytes=None if used is None else int(used),
            mig_gpu_instance_id=None if gi == _NA_UINT else gi,
            mig_compute_instance_id=None if ci == _NA_UINT else ci,
            cgroup=owner.cgroup,
            pod_uid=owner.pod_uid,
            container_id=owner.container_id,
        )
