"""Which file system a descriptor is on: notifications are registered only with the kernel's
own files.

Registering a PSI trigger or a v1 threshold is a *write*: to a regular file (a mis-set
``--path.procfs``, a fixture tree, a copy of ``/proc``) it would succeed and change the file.
So the descriptor's file system is checked first with ``fstatfs(2)`` against the magic numbers
of ``include/uapi/linux/magic.h``: ``PROC_SUPER_MAGIC`` (``/proc/pressure/memory``),
``CGROUP_SUPER_MAGIC`` (v1 ``cgroup.event_control``) and ``CGROUP2_SUPER_MAGIC`` (v2
``memory.pressure``). ``f_type`` is the first member of ``struct statfs`` (a ``long``) on every
Linux ABI, so it is read from there; the libc call is made through ctypes.
"""

from __future__ import annotations

import ctypes
import errno
import os

__all__ = ["CGROUP2_SUPER_MAGIC", "CGROUP_SUPER_MAGIC", "PROC_SUPER_MAGIC", "require_kernel_file"]

PROC_SUPER_MAGIC = 0x9FA0
CGROUP_SUPER_MAGIC = 0x27E0EB
CGROUP2_SUPER_MAGIC = 0x63677270
_NAMES = {PROC_SUPER_MAGIC: "proc", CGROUP_SUPER_MAGIC: "cgroup", CGROUP2_SUPER_MAGIC: "cgroup2"}

_libc = ctypes.CDLL(None, use_errno=True)
_STATFS_SIZE = 256  # larger than struct statfs on every ABI (120 bytes on x86_64)


def fs_type(fd: int) -> int:
    """The ``f_type`` of the file system ``fd`` is on. Raises ``OSError`` from ``fstatfs``."""
    buf = ctypes.create_string_buffer(_STATFS_SIZE)
    if _libc.fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def require_kernel_file(fd: int, *, path: str, kinds: tuple[int, ...]) -> None:
    """Raise ``OSError(EMEDIUMTYPE)`` unless ``fd`` (opened from ``path``) is on one of the file
    systems ``kinds`` (the magic numbers above)."""
    found = fs_type(fd)
    if found not in kinds:
        wanted = " or ".join(_NAMES[k] for k in kinds)
        raise OSError(
            errno.EMEDIUMTYPE,
            f"not a {wanted} file (file system 0x{found:x}): nothing written",
            path,
        )
