"""The remediation state's clock: seconds that run with the boot clock, continued across
restarts.

The rule of :mod:`nodeguard.statefile`'s module docstring ("The state's clock"): the clock
runs with ``CLOCK_BOOTTIME`` (clock_gettime(2)), started at the wall clock when there is no
file; a file written on the same boot (same boot ID, random(4):
``/proc/sys/kernel/random/boot_id``) is continued by the boot time that passed, one written
before a reboot by the wall time that passed, never less than 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["StateClock", "boottime", "read_boot_id"]

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boottime() -> float:
    """Seconds since boot, suspend included (``CLOCK_BOOTTIME``)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def read_boot_id() -> str | None:
    """This kernel's boot ID (random(4)); ``None`` where it cannot be read."""
    try:
        return _BOOT_ID.read_text().strip() or None
    except OSError:
        return None


class StateClock:
    """The state's clock. ``wall``: the wall clock (Unix seconds); ``uptime``: seconds since
    boot; ``boot``: this boot's ID (``None``: unknown, then a file is continued by the wall
    clock)."""

    def __init__(
        self, *, wall: Callable[[], float], uptime: Callable[[], float], boot: str | None
    ) -> None:
        self.wall, self._uptime, self.boot = wall, uptime, boot
        # The state clock: _base at _up0, then running with the boot clock.
        self._base, self._up0 = wall(), uptime()

    def now(self) -> float:
        """The state's clock (seconds): about Unix time, but never stepped with the wall
        clock."""
        return self._base + (self._uptime() - self._up0)

    def stamp(self) -> dict[str, Any]:
        """What a write stores to be continued from: ``{"wall", "boot", "uptime"}``."""
        return {"wall": self.wall(), "boot": self.boot, "uptime": self._uptime()}

    def resume(self, *, saved_at: float, stamp: Any) -> None:
        """Continue the clock of a file saved at ``saved_at`` (its state clock) with
        ``stamp`` (its :meth:`stamp`, or anything else for a file without one)."""
        self._base = saved_at + self._since(stamp, wall=saved_at)

    def _since(self, stamp: Any, *, wall: float) -> float:
        """Seconds since the loaded file was written: by the boot clock on the same boot, else
        by the wall clock (``wall``: its wall time, for a file without ``stamp``), never < 0."""
        if isinstance(stamp, dict):
            up, boot = stamp.get("uptime"), stamp.get("boot")
            if isinstance(up, int | float) and boot is not None and boot == self.boot:
                return max(0.0, self._up0 - float(up))
            if isinstance(stamp.get("wall"), int | float):
                wall = float(stamp["wall"])
        return max(0.0, self.wall() - wall)
