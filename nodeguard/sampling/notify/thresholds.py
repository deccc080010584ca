"""cgroup v1 memory thresholds: the kernel signals an eventfd when a cgroup's usage crosses a
level (kernel Documentation/admin-guide/cgroup-v1/memory.rst, "9. Memory thresholds").

Registration: open ``memory.usage_in_bytes``, make an eventfd, write ``"<event_fd> <usage_fd>
<threshold>"`` to ``cgroup.event_control``. The eventfd is signalled when usage crosses the
threshold in either direction; closing the eventfd unregisters it. Usage here is the v1
``memory.usage_in_bytes`` (page cache included), at or above the working set nodeguard's rules
look at, so a threshold on usage wakes the sampler no later than the working set crosses the same
level: the sample that follows decides on the working set, as always.

cgroup v2 has no thresholds: there, :mod:`nodeguard.sampling.notify.events` and PSI triggers
wake the sampler, and focus sampling does the rest.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from nodeguard.sampling.notify.kernfs import CGROUP_SUPER_MAGIC, require_kernel_file

__all__ = ["Threshold", "register"]

_FLAGS = os.O_RDONLY | os.O_CLOEXEC


@dataclass(frozen=True, slots=True, kw_only=True)
class Threshold:
    """One registered threshold: ``key`` (what it watches, e.g. a container key), the cgroup
    directory, the level in bytes, and the two descriptors it holds (``event_fd`` is the one to
    poll for readability)."""

    key: str
    cgroup: str
    level: int
    event_fd: int
    usage_fd: int

    def consume(self) -> int:
        """Read the eventfd's count (crossings since the last read); 0 when none."""
        try:
            return os.eventfd_read(self.event_fd)
        except BlockingIOError:
            return 0

    def close(self) -> None:
        """Unregister (closing the eventfd removes the kernel's event) and free both fds."""
        for fd in (self.event_fd, self.usage_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def register(*, key: str, cgroup: str, level: int) -> Threshold:
    """Register a threshold of ``level`` bytes on the v1 memory cgroup directory ``cgroup``.
    Raises ``OSError``: ``FileNotFoundError`` when the cgroup has no ``cgroup.event_control``
    (not cgroup v1, or gone), ``PermissionError`` without write access to it, ``EINVAL`` from
    a kernel that refuses the registration."""
    usage_fd = os.open(os.path.join(cgroup, "memory.usage_in_bytes"), _FLAGS)
    try:
        event_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    except OSError:
        os.close(usage_fd)
        raise
    try:
        path = os.path.join(cgroup, "cgroup.event_control")
        control = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            require_kernel_file(control, path=path, kinds=(CGROUP_SUPER_MAGIC,))
            os.write(control, f"{event_fd} {usage_fd} {level}".encode())
        finally:
            os.close(control)
    except OSError:
        os.close(event_fd)
        os.close(usage_fd)
        raise
    return Threshold(key=key, cgroup=cgroup, level=level, event_fd=event_fd, usage_fd=usage_fd)
