"""PSI triggers: the kernel wakes a poller when tasks stalled on memory for more than a given time
within a window (kernel Documentation/accounting/psi.rst, "Monitoring for pressure thresholds").

A trigger is ``"<some|full> <stall us> <window us>"`` written to an open ``/proc/pressure/memory``
(or a cgroup v2 ``memory.pressure``); the file descriptor then reports ``POLLPRI`` at most once
per window while the stall exceeds the threshold, until it is closed. Two kernel details decide
what is accepted (``kernel/sched/psi.c``, ``psi_write`` and ``psi_trigger_create``):

- ``psi_write`` replaces the last byte written with a NUL, so the text is written with a
  trailing NUL (without it the window loses its last digit);
- windows must lie in [500 ms, 10 s]; a writer without ``CAP_SYS_RESOURCE`` (the agent in a
  container, unless granted it) may only use windows that are whole multiples of 2 s, else
  ``EINVAL``. :func:`open_trigger` then retries with the next multiple of 2 s, and says so.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
from dataclasses import dataclass
from typing import Literal

from nodeguard.sampling.notify.kernfs import (
    CGROUP2_SUPER_MAGIC,
    PROC_SUPER_MAGIC,
    require_kernel_file,
)

__all__ = ["PsiTrigger", "open_trigger"]

MIN_WINDOW, MAX_WINDOW, UNPRIVILEGED_STEP = 0.5, 10.0, 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PsiTrigger:
    """An open trigger: poll ``fd`` for ``POLLPRI``. ``stall`` is the share of ``window``
    (seconds) that fires it; ``widened``: the window asked for was refused and widened to a
    multiple of 2 s (the agent lacks ``CAP_SYS_RESOURCE``)."""

    key: str
    path: str
    kind: Literal["some", "full"]
    stall: float
    window: float
    fd: int
    widened: bool

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _write(path: str, kind: str, stall_us: int, window_us: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        require_kernel_file(fd, path=path, kinds=(PROC_SUPER_MAGIC, CGROUP2_SUPER_MAGIC))
        os.write(fd, f"{kind} {stall_us} {window_us}".encode() + b"\0")
    except OSError:
        os.close(fd)
        raise
    return fd


def open_trigger(
    *, key: str, path: str, kind: Literal["some", "full"], stall: float, window: float
) -> PsiTrigger:
    """A trigger firing when ``kind`` stall exceeds ``stall`` (a share, 0..1) of ``window``
    seconds. Raises ``ValueError`` for a share outside (0, 1] or a window outside [0.5, 10] s,
    ``OSError`` when the kernel has no PSI (``ENOENT``, ``EOPNOTSUPP``) or refuses it."""
    if not 0 < stall <= 1:
        raise ValueError(f"a stall share must be in (0, 1], not {stall}")
    if not MIN_WINDOW <= window <= MAX_WINDOW:
        raise ValueError(f"a PSI window must be {MIN_WINDOW}..{MAX_WINDOW} s, not {window}")
    widened = False
    try:
        fd = _write(path, kind, int(stall * window * 1e6), int(window * 1e6))
    except OSError as exc:
        step = math.ceil(window / UNPRIVILEGED_STEP) * UNPRIVILEGED_STEP
        if exc.errno != errno.EINVAL or step == window or step > MAX_WINDOW:
            raise
        window, widened = step, True
        fd = _write(path, kind, int(stall * window * 1e6), int(window * 1e6))
    return PsiTrigger(
        key=key, path=path, kind=kind, stall=stall, window=window, fd=fd, widened=widened
    )
