"""Where the memory controller is mounted, its cgroup version, and the kubepods roots under it.

The kubepods roots can sit below a docker or kind prefix: they are found by a bounded walk from
the memory hierarchy root (Documentation/admin-guide/cgroup-v2.rst "Mounting";
Documentation/admin-guide/cgroup-v1/cgroups.rst).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nodeguard.sources import NoDataError
from nodeguard.sources.cgroup_paths import is_kubepods_root
from nodeguard.sources.files import read_optional
from nodeguard.sources.skipped import Skipped

__all__ = ["CgroupLayout", "detect_layout", "find_kubepods_roots", "subdirs"]

_MAX_ROOT_DEPTH = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class CgroupLayout:
    """Where the memory controller is mounted and which cgroup version it speaks."""

    version: Literal[1, 2]
    root: Path


def detect_layout(*, cgroupfs: Path) -> CgroupLayout:
    """Find the memory hierarchy under the cgroup mount.

    v1 (or hybrid) when ``<cgroupfs>/memory`` is a v1 memory controller; v2 when the unified
    hierarchy at ``<cgroupfs>`` (or ``<cgroupfs>/unified``) lists ``memory`` in
    ``cgroup.controllers``. Raises :class:`NoDataError` when neither exists.
    """
    v1 = cgroupfs / "memory"
    if (v1 / "memory.usage_in_bytes").exists() or (v1 / "memory.limit_in_bytes").exists():
        return CgroupLayout(version=1, root=v1)
    for candidate in (cgroupfs, cgroupfs / "unified"):
        controllers = read_optional(candidate / "cgroup.controllers")
        if controllers is not None and "memory" in controllers.split():
            return CgroupLayout(version=2, root=candidate)
    raise NoDataError(f"no cgroup memory controller under {cgroupfs}")


def subdirs(path: str | Path, skipped: Skipped) -> Iterator[os.DirEntry[str]]:
    """The subdirectories of ``path`` by name (a cgroup directory also holds some 40 files);
    none, counted in ``skipped``, when it cannot be listed."""
    try:
        with os.scandir(path) as it:
            entries = list(it)
    except (FileNotFoundError, NotADirectoryError):
        return  # removed while we walked: a pod or container that just ended
    except OSError as exc:
        skipped.add(path=os.fspath(path), exc=exc)
        return
    dirs = [e for e in entries if e.is_dir(follow_symlinks=False)]
    dirs.sort(key=lambda e: e.name)
    yield from dirs


def find_kubepods_roots(
    *, root: Path, skipped: Skipped, max_depth: int = _MAX_ROOT_DEPTH
) -> list[Path]:
    """Every kubepods root within ``max_depth`` levels of the hierarchy root, outermost first.
    The walk does not descend into a kubepods root, nor into one it has found; a directory
    that cannot be listed is counted in ``skipped``."""
    found: list[Path] = []
    level = [root]
    for _ in range(max_depth):
        nxt: list[Path] = []
        for directory in level:
            for entry in subdirs(directory, skipped):
                if is_kubepods_root(entry.name):
                    found.append(Path(entry.path))
                else:
                    nxt.append(Path(entry.path))
        level = nxt
    return found
