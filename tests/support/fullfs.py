"""Real filesystems that misbehave: a tmpfs of a few pages that fills up, and an ext4 on a loop
device whose writes the kernel throttles (a slow disk), mounted for one test.

tmpfs (Documentation/filesystems/tmpfs.rst, ``size=``) refuses pages past its size with
``ENOSPC``; ``write(2)`` then writes what still fits and returns that count, the next call
failing, exactly as a full ext4 or XFS does. Needs root (``mount(2)``, ``CAP_SYS_ADMIN``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
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


BLKIO = Path("/sys/fs/cgroup/blkio")


def can_slow_a_disk() -> bool:
    """Root, loop devices and the cgroup v1 blkio controller's throttling (this CI's kernel)."""
    return (
        can_mount()
        and Path("/dev/loop-control").exists()
        and (BLKIO / "blkio.throttle.write_bps_device").exists()
    )


@contextlib.contextmanager
def slow_disk(workdir: Path, *, write_bps: int, size: int = 64 << 20) -> Iterator[SlowDisk]:
    """An ext4 filesystem on a loop device whose writes, from the processes of the returned
    blkio cgroup, are throttled to ``write_bps`` bytes a second by the kernel
    (Documentation/admin-guide/cgroup-v1/blkio-controller.rst, ``blkio.throttle.
    write_bps_device``): an ``fsync(2)`` there waits for the throttled writes, as on a disk
    that slow. Mounted at ``workdir/mnt`` until the block ends."""
    image, mnt = workdir / "disk.img", workdir / "mnt"
    mnt.mkdir(parents=True, exist_ok=True)
    with image.open("wb") as f:
        f.truncate(size)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    loop = subprocess.run(
        ["losetup", "--find", "--show", str(image)], check=True, capture_output=True, text=True
    ).stdout.strip()
    cgroup = BLKIO / f"nodeguard-slow-{os.getpid()}-{Path(loop).name}"
    try:
        subprocess.run(["mount", loop, str(mnt)], check=True)
        try:
            cgroup.mkdir()
            dev = (Path("/sys/block") / Path(loop).name / "dev").read_text().strip()
            (cgroup / "blkio.throttle.write_bps_device").write_text(f"{dev} {write_bps}")
            yield SlowDisk(mount=mnt, cgroup=cgroup)
        finally:
            subprocess.run(["umount", "-l", str(mnt)], check=False)
            with contextlib.suppress(OSError):
                cgroup.rmdir()
    finally:
        subprocess.run(["losetup", "-d", loop], check=False)


@dataclass(frozen=True, slots=True)
class SlowDisk:
    """The mounted filesystem, and the blkio cgroup whose writes to it are throttled (a
    process joins by writing its PID to ``cgroup/cgroup.procs``)."""

    mount: Path
    cgroup: Path
