"""The kernel's own high-water mark of a cgroup's memory: what a sampler can miss between two
samples (a trial's allocation spike lasting less than the interval) the kernel does not.

- cgroup v2: ``memory.peak``, "the max memory usage recorded for the cgroup and its
  descendants since the creation of the cgroup" (Documentation/admin-guide/cgroup-v2.rst);
  since Linux 5.19 (commit 8e20d4b33266, "mm/memcg: add memory.peak in cgroup root"), absent
  before it.
- cgroup v1: ``memory.max_usage_in_bytes``, "max memory usage recorded"
  (Documentation/admin-guide/cgroup-v1/memory.rst, 5.1): usage counts page cache as v2's
  ``memory.current`` does, and it is reset by a write, which nothing of the kubelet's does.

Both are usage, not working set: they count page cache the kernel could have reclaimed, so
they bound the working set's peak from above. Read only for the few cgroups whose peak is
wanted (Katib trials' pods, :mod:`nodeguard.remediation.trial_memory`), not every sample of
every cgroup.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from nodeguard.sources.cgroup_limits import parse_int
from nodeguard.sources.files import FileTooLargeError, read_optional

__all__ = ["PEAK_FILES", "kernel_peak_bytes"]

#: The peak file by cgroup version.
PEAK_FILES: dict[int, str] = {2: "memory.peak", 1: "memory.max_usage_in_bytes"}


def kernel_peak_bytes(*, cgroup_dir: Path, version: Literal[1, 2]) -> int | None:
    """The cgroup's peak usage in bytes (module docstring); ``None`` where the kernel has no
    such file (v2 before 5.19), the cgroup is gone, or the file does not hold one number of 0
    or more: no data, never 0."""
    try:
        text = read_optional(cgroup_dir / PEAK_FILES[version])
    except (OSError, UnicodeDecodeError, FileTooLargeError):
        return None
    if text is None:
        return None
    try:
        return parse_int(text)
    except ValueError:
        return None
