"""NVML's life cycle: ``nvmlInit`` once, retried after a failure, and ``nvmlShutdown``.

An init failure that means no NVIDIA driver (LIBRARY_NOT_FOUND: no ``libnvidia-ml.so.1``;
DRIVER_NOT_LOADED) is :class:`~nodeguard.sources.NoDataError`; any other is
:class:`NvmlInitError`. Either is raised again, without calling NVML, until ``retry_seconds``
have passed: a driver container may come up after the agent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pynvml

from nodeguard.sources import NoDataError
from nodeguard.sources.nvml_calls import code

__all__ = ["NvmlInitError", "NvmlSession"]

# The reader's logger, as before it was split: the log's repeat limits and operators' filters
# key on the logger's name.
log = logging.getLogger("nodeguard.sources.gpu")

#: Init failures that mean "no NVIDIA driver here", which is no data, not an error.
_NO_DRIVER = frozenset({pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED})


class NvmlInitError(Exception):
    """``nvmlInit`` failed for a reason other than a missing driver."""


class NvmlSession:
    """NVML initialised or not; ``driver`` is ``nvmlSystemGetDriverVersion`` once initialised
    (``None`` where NVML refused it). ``clock``: monotonic seconds, for the retry (tests drive a
    fake one)."""

    def __init__(self, *, retry_seconds: float, clock: Callable[[], float]) -> None:
        self._retry = retry_seconds
        self._clock = clock
        self._initialised = False
        self._failure: tuple[type[Exception], str] | None = None
        self._retry_at = float("-inf")
        self.driver: str | None = None

    def open(self) -> None:
        """``nvmlInit`` unless NVML is initialised. Raises :class:`NoDataError` (no driver) or
        :class:`NvmlInitError`, the last failure's again until its retry is due."""
        if self._initialised:
            return
        now = self._clock()
        if self._failure is not None and now < self._retry_at:
            kind, message = self._failure
            raise kind(message)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            if code(exc) in _NO_DRIVER:
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
            self.driver = str(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError:
            self.driver = None
        log.info("NVML initialised, driver %s", self.driver or "unknown")

    def close(self) -> None:
        """``nvmlShutdown`` if NVML was initialised; safe to call more than once."""
        if not self._initialised:
            return
        self._initialised = False
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.warning("nvmlShutdown: %s", exc)
