"""A device's or MIG device's memory: ``nvmlDeviceGetMemoryInfo_v2``, else v1.

v2 (``nvmlMemory_v2_t``) has ``reserved`` (what the driver and firmware set aside) and leaves it
out of ``used``; v1 (``nvmlMemory_t``) counts it in ``used`` and has no ``reserved``.
"""

from __future__ import annotations

import logging
from typing import Any

import pynvml

from nodeguard.snapshot import GpuMemory
from nodeguard.sources.nvml_calls import call, code, raise_if_lost

__all__ = ["MemoryInfo"]

# The reader's logger, as before it was split (the log's repeat limits key on its name).
log = logging.getLogger("nodeguard.sources.gpu")


class MemoryInfo:
    """Reads memory info, v2 where the driver has it; a driver without the v2 symbol
    (FUNCTION_NOT_FOUND) is asked v1 only from then on."""

    def __init__(self) -> None:
        self._v2 = True

    def read(self, handle: Any, *, errors: list[str], what: str) -> GpuMemory | None:
        """Bytes, v2 else v1 (where the driver lacks v2 or the device does not support it:
        NOT_SUPPORTED, ARGUMENT_VERSION_MISMATCH); ``None`` with the reason in ``errors`` when
        NVML refuses. Raises :class:`~nodeguard.sources.nvml_calls.GpuLost`."""
        if self._v2:
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
                raise_if_lost(exc)
                if code(exc) == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    self._v2 = False
                    log.warning("NVML has no nvmlDeviceGetMemoryInfo_v2: reserved memory unknown")
                elif code(exc) not in (
                    pynvml.NVML_ERROR_NOT_SUPPORTED,
                    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
                ):
                    errors.append(f"{what}: {exc}")
                    return None
        m1 = call(pynvml.nvmlDeviceGetMemoryInfo, handle, errors=errors, what=what)
        if m1 is None:
            return None
        return GpuMemory(
            total_bytes=int(m1.total),
            used_bytes=int(m1.used),
            free_bytes=int(m1.free),
            reserved_bytes=None,
            info_version=1,
        )
