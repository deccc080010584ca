"""Calling NVML: the return code of a refusal, a GPU lost, a call whose refusal loses one value,
and messages logged once.

pynvml raises :class:`pynvml.NVMLError` with NVML's ``nvmlReturn_t`` (``nvml.h``) as its
``value``. GPU_IS_LOST from any query of a device means the whole device is gone for this
sample: :class:`GpuLost`, caught by the reader once per device. Any other refusal costs the
value asked for only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

__all__ = ["GpuLost", "LogOnce", "call", "code", "raise_if_lost"]

T = TypeVar("T")


class GpuLost(Exception):
    """A device answered GPU_IS_LOST (``NVML_ERROR_GPU_IS_LOST``)."""


def code(exc: pynvml.NVMLError) -> int:
    """The ``nvmlReturn_t`` of a refusal (``NVML_ERROR_*``)."""
    return int(exc.value)


def raise_if_lost(exc: pynvml.NVMLError) -> None:
    """Raises :class:`GpuLost` (chained from ``exc``) where ``exc`` is GPU_IS_LOST."""
    if code(exc) == pynvml.NVML_ERROR_GPU_IS_LOST:
        raise GpuLost from exc


def call(fn: Callable[..., T], *args: Any, errors: list[str], what: str) -> T | None:
    """``fn(*args)``; ``None``, with ``"<what>: <NVML's message>"`` appended to ``errors``, when
    NVML refuses. Raises :class:`GpuLost` on GPU_IS_LOST."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise_if_lost(exc)
        errors.append(f"{what}: {exc}")
        return None


class LogOnce:
    """Logs each key's message the first time only, so that a lasting condition (a GPU lost, a
    symbol the driver lacks) is not logged every sample."""

    def __init__(self, *, log: logging.Logger) -> None:
        self._log = log
        self._done: set[str] = set()

    def log(self, key: str, level: int, message: str, *args: object) -> None:
        """``level``, ``message`` and ``args`` as :meth:`logging.Logger.log`'s."""
        if key not in self._done:
            self._done.add(key)
            self._log.log(level, message, *args)
