"""A real small filesystem that fills up: a tmpfs of a few pages, mounted for one test.

tmpfs (Documentation/filesystems/tmpfs.rst, ``size=``) refuses pages past its size with
``ENOSPC``; ``write(2)`` then writes what still fits and returns that count, the next call
failing, exactly as a full ext4 or XFS does. Needs root (``mount(2)``, ``CAP_SYS_ADMIN``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


def can_mount() -> bool:
    """Whether this process may mount a tmpfs (root, outside a user namespace without it)."""
    return os.geteuid() == 0


@contextlib.contextmanager
def small_tmpfs(directory: Path, *, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted on ``directory`` (created) until the block ends."""
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(directory)],
        check=True,
    )
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def fill(directory: Path, *, leave: int = 0) -> Path:
    """Fill the filesystem of ``directory`` with a file (returned) until ``write(2)`` fails,
    then give back ``leave`` bytes (whole pages) of it."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        chunk = b"\0" * PAGE
        with contextlib.suppress(OSError):
            while os.write(fd, chunk) > 0:
                pass
        size = os.fstat(fd).st_size
        os.ftruncate(fd, max(0, (size // PAGE) * PAGE - leave))
    finally:
        os.close(fd)
    return filler


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged write could still take (statvfs(3) ``f_bavail``)."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize
