"""The MIG devices of a GPU in MIG mode, one per occupied slot.

Slots ``0 .. nvmlDeviceGetMaxMigDeviceCount - 1``, each through
``nvmlDeviceGetMigDeviceHandleByIndex`` (NOT_FOUND: an empty slot); per MIG device its UUID,
``nvmlDeviceGetGpuInstanceId``, ``nvmlDeviceGetComputeInstanceId`` and memory.
"""

from __future__ import annotations

import pynvml

from nodeguard.snapshot import MigDevice
from nodeguard.sources.gpu_memory import MemoryInfo
from nodeguard.sources.gpu_processes import MigHandle
from nodeguard.sources.nvml_calls import call, code, raise_if_lost

__all__ = ["mig_devices"]


def mig_devices(handle: object, *, errors: list[str], memory: MemoryInfo) -> list[MigHandle]:
    """The MIG devices of the GPU ``handle``, in slot order; what NVML refuses is ``None`` in
    the device, with the reason in ``errors``. Raises
    :class:`~nodeguard.sources.nvml_calls.GpuLost`."""
    count = call(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle, errors=errors, what="mig devices")
    out: list[MigHandle] = []
    for slot in range(int(count or 0)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError as exc:
            raise_if_lost(exc)
            if code(exc) != pynvml.NVML_ERROR_NOT_FOUND:  # NOT_FOUND: an empty slot
                errors.append(f"mig device {slot}: {exc}")
            continue
        what = f"mig device {slot}"
        gi = call(
            pynvml.nvmlDeviceGetGpuInstanceId, mig, errors=errors, what=f"{what} gpu instance"
        )
        ci = call(
            pynvml.nvmlDeviceGetComputeInstanceId,
            mig,
            errors=errors,
            what=f"{what} compute instance",
        )
        device = MigDevice(
            index=slot,
            uuid=call(pynvml.nvmlDeviceGetUUID, mig, errors=errors, what=f"{what} uuid"),
            gpu_instance_id=None if gi is None else int(gi),
            compute_instance_id=None if ci is None else int(ci),
            memory=memory.read(mig, errors=errors, what=f"{what} memory"),
        )
        out.append(MigHandle(device=device, handle=mig))
    return out
