"""NVML's three process lists of one handle, each from the newest symbol the driver has.

Compute (``nvmlDeviceGetComputeRunningProcesses``), graphics (``...GraphicsRunningProcesses``)
and MPS compute (``...MPSComputeRunningProcesses``), each ``_v3``, else ``_v2`` on a driver
without it: pynvml resolves each symbol when called and raises FUNCTION_NOT_FOUND where the
driver lacks it, and reads both into the same ``nvmlProcessInfo_v2_t`` layout (pid,
usedGpuMemory, gpuInstanceId, computeInstanceId).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import pynvml

from nodeguard.sources.nvml_calls import LogOnce, code, raise_if_lost

__all__ = ["KINDS", "LISTS", "Lacking", "ProcessLists"]

#: Each list's binding functions, newest first.
LISTS: dict[str, tuple[str, ...]] = {
    kind: (f"nvmlDevice{fn}_v3", f"nvmlDevice{fn}_v2")
    for kind, fn in (
        ("compute", "GetComputeRunningProcesses"),
        ("graphics", "GetGraphicsRunningProcesses"),
        ("mps", "GetMPSComputeRunningProcesses"),
    )
}
KINDS = tuple(LISTS)

#: Why a list has no entries: ``"absent"`` (the driver has neither symbol: FUNCTION_NOT_FOUND),
#: ``"unsupported"`` (NOT_SUPPORTED for this device), ``"failed"`` (another error).
Lacking = Literal["absent", "unsupported", "failed"]


class ProcessLists:
    """Reads one list of a handle; remembers, per list, which symbol the driver has."""

    def __init__(self, *, once: LogOnce) -> None:
        self._once = once
        self._version = dict.fromkeys(KINDS, 0)  # per list: which of LISTS[kind] to call

    def read(self, kind: str, handle: Any, *, errors: list[str], what: str) -> list[Any] | Lacking:
        """The entries of list ``kind`` (one of :data:`KINDS`), or why there are none; a failure
        other than FUNCTION_NOT_FOUND and NOT_SUPPORTED is put in ``errors``. Raises
        :class:`~nodeguard.sources.nvml_calls.GpuLost`."""
        while self._version[kind] < len(LISTS[kind]):
            name = LISTS[kind][self._version[kind]]
            try:
                infos: list[Any] = getattr(pynvml, name)(handle)
            except pynvml.NVMLError as exc:
                raise_if_lost(exc)
                if code(exc) == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    self._version[kind] += 1  # an older driver: the older symbol, from now on
                    continue
                if code(exc) == pynvml.NVML_ERROR_NOT_SUPPORTED:
                    return "unsupported"
                errors.append(f"{what} ({kind}): {exc}")
                return "failed"
            return infos
        self._once.log(
            f"absent:{kind}",
            logging.WARNING,
            "NVML has none of %s (a driver older than this nvidia-ml-py expects): %s processes "
            "are not listed",
            ", ".join(LISTS[kind]),
            kind,
        )
        return "absent"
