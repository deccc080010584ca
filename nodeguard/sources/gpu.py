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

The reader is made of what it calls: NVML's life cycle (:mod:`~nodeguard.sources.nvml_session`),
a call and its refusal (:mod:`~nodeguard.sources.nvml_calls`), memory info
(:mod:`~nodeguard.sources.gpu_memory`), the MIG devices (:mod:`~nodeguard.sources.mig_devices`),
the three process lists (:mod:`~nodeguard.sources.gpu_process_lists`) and their merge by PID
(:mod:`~nodeguard.sources.gpu_processes`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

import pynvml

from nodeguard.paths import HostPaths
from nodeguard.snapshot import GpuDevice, GpuInfo
from nodeguard.sources import NoDataError
from nodeguard.sources.gpu_memory import MemoryInfo
from nodeguard.sources.gpu_process_lists import ProcessLists
from nodeguard.sources.gpu_processes import GpuProcesses, Listed
from nodeguard.sources.mig_devices import mig_devices
from nodeguard.sources.nvml_calls import GpuLost, LogOnce, call, code
from nodeguard.sources.nvml_session import NvmlInitError, NvmlSession

__all__ = ["NvmlInitError", "NvmlReader"]

log = logging.getLogger(__name__)


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
        # clock: for the retry of a failed nvmlInit (tests drive a fake one)
        self._session = NvmlSession(retry_seconds=retry_seconds, clock=clock)
        self._once = LogOnce(log=log)
        self._memory = MemoryInfo()
        self._processes = GpuProcesses(paths=paths, lists=ProcessLists(once=self._once))
        self._names: dict[int, tuple[str | None, str | None]] = {}

    def close(self) -> None:
        """``nvmlShutdown`` if NVML was initialised; safe to call more than once."""
        self._session.close()

    def read(self, *, containers: Mapping[str, str] | None = None) -> GpuInfo:
        """Every device. ``containers`` (container ID -> pod UID, from the cgroup walk) names the
        pod of a process of the agent's own pod (:func:`~nodeguard.sources.processes.owner_of`).
        Raises :class:`NoDataError` without a driver or without a GPU, :class:`NvmlInitError` or
        ``RuntimeError`` when NVML cannot be used at all."""
        self._session.open()
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            raise RuntimeError(f"nvmlDeviceGetCount: {exc}") from exc
        if count == 0:
            raise NoDataError("NVML sees no GPU")
        return GpuInfo(
            driver_version=self._session.driver,
            devices=tuple(self._device(i, containers=containers) for i in range(count)),
        )

    def _device(self, index: int, *, containers: Mapping[str, str] | None) -> GpuDevice:
        errors: list[str] = []
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as exc:
            if code(exc) == pynvml.NVML_ERROR_GPU_IS_LOST:
                return self._lost(index)
            errors.append(f"handle: {exc}")
            return self._without_data(index, errors=tuple(errors))
        try:
            uuid = call(pynvml.nvmlDeviceGetUUID, handle, errors=errors, what="uuid")
            name = call(pynvml.nvmlDeviceGetName, handle, errors=errors, what="name")
            known = self._names.get(index, (None, None))
            self._names[index] = (uuid or known[0], name or known[1])
            memory = self._memory.read(handle, errors=errors, what="memory")
            mode = call(pynvml.nvmlDeviceGetMigMode, handle, errors=errors, what="mig mode")
            mig = None if mode is None else int(mode[0]) == pynvml.NVML_DEVICE_MIG_ENABLE
            migs = mig_devices(handle, errors=errors, memory=self._memory) if mig else []
            listed: Listed
            if mig:
                listed = self._processes.of_mig_devices(migs, errors=errors, containers=containers)
            else:
                listed = self._processes.of_handle(
                    handle, errors=errors, what="processes", mig=None, containers=containers
                )
        except GpuLost:
            return self._lost(index)
        return GpuDevice(
            index=index,
            uuid=uuid,
            name=name,
            mig_enabled=mig,
            memory=memory,
            mig_devices=tuple(m.device for m in migs),
            processes=listed.processes,
            processes_missing=listed.missing,
            errors=tuple(errors),
        )

    def _lost(self, index: int) -> GpuDevice:
        uuid = self._names.get(index, (None, None))[0]
        self._once.log(f"lost:{index}:{uuid}", logging.ERROR, "GPU %d (%s) is lost", index, uuid)
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
