"""Filesystem roots, as node_exporter takes them (``--path.procfs``, ``--path.sysfs``).

In a container the host's ``/proc`` is mounted elsewhere (``/host/proc``), and tests point the
same code at fixture trees, so no module opens an absolute host path of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["HostPaths"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HostPaths:
    """Where the host's files are.

    ``procfs`` and ``sysfs`` are the mount points of the host's proc and sys filesystems;
    ``kmsg`` the kernel log device (a regular file in fixture trees); ``state`` a directory the
    agent may write to keep counters across restarts (``None``: keep nothing).
    """

    procfs: Path = Path("/proc")
    sysfs: Path = Path("/sys")
    kmsg: Path = Path("/dev/kmsg")
    state: Path | None = None

    @property
    def cgroupfs(self) -> Path:
        """The cgroup mount root, ``<sysfs>/fs/cgroup``."""
        return self.sysfs / "fs" / "cgroup"

    def proc(self, *parts: str) -> Path:
        """A path under procfs, e.g. ``proc("pressure", "memory")``."""
        return self.procfs.joinpath(*parts)
