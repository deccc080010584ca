"""A kubelet-shaped memory cgroup on the real kernel, for tests that watch real OOM kills.

Needs root and a writable memory controller: cgroup v1 (``/sys/fs/cgroup/memory``) or v2 (the
unified hierarchy with ``memory`` in ``cgroup.controllers``). Everything created is removed on
exit, also when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")

# Allocates STEP bytes every PAUSE seconds, touching every page, after "go" on stdin.
HOG = r"""
import sys, time
step, pause, limit = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
sys.stdin.readline()
chunks = []
while sum(len(c) for c in chunks) < limit:
    chunks.append(bytearray(b"\x01" * step))
    time.sleep(pause)
print("survived", flush=True)
sys.stdin.readline()  # holds what it has until killed: a reader sees the peak, not an exit
"""

# Reads the file at argv[1] in 1 MiB chunks, argv[2] seconds apart, over and over: a data
# loader's epochs. The first pass fills the inactive file list, the second activates it
# (mm/workingset.c, mm/swap.c folio_mark_accessed), so the working set (usage - inactive_file)
# climbs at 1 MiB per pause toward the limit, as an anon hog's would; the memory the kernel
# cannot reclaim stays the interpreter's own.
READER = r"""
import os, sys, time
path, pause = sys.argv[1], float(sys.argv[2])
sys.stdin.readline()
while True:
    fd = os.open(path, os.O_RDONLY)
    while os.read(fd, 1 << 20):
        time.sleep(pause)
    os.close(fd)
"""


@dataclass(frozen=True, slots=True)
class KubeletCgroup:
    version: int
    pod_uid: str
    container_id: str
    container_dir: Path


def writable_memory_controller() -> tuple[int, Path] | None:
    """``(version, root)`` of a memory controller this process can create cgroups in."""
    if os.geteuid() != 0:
        return None
    v1 = CGROUP_FS / "memory"
    if (v1 / "memory.limit_in_bytes").exists() and os.access(v1, os.W_OK):
        return 1, v1
    controllers = CGROUP_FS / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        return 2, CGROUP_FS
    return None


def _enable_memory_v2(path: Path) -> None:
    with contextlib.suppress(OSError):
        (path / "cgroup.subtree_control").write_text("+memory")


@contextlib.contextmanager
def kubelet_cgroup(
    *, limit_bytes: int, pod_uid: str | None = None, container_id: str | None = None
) -> Iterator[KubeletCgroup]:
    """Create ``kubepods/burstable/pod<uid>/<container id>`` with a memory limit on the container;
    remove what was created afterwards."""
    found = writable_memory_controller()
    if found is None:
        raise RuntimeError("needs root and a writable cgroup memory controller")
    version, root = found
    uid = pod_uid or str(uuid.uuid4())
    cid = container_id or secrets.token_hex(32)
    chain = [
        root / "kubepods",
        root / "kubepods/burstable",
        root / f"kubepods/burstable/pod{uid}",
        root / f"kubepods/burstable/pod{uid}/{cid}",
    ]
    created: list[Path] = []
    try:
        for d in chain:
            if version == 2:
                _enable_memory_v2(d.parent)
            if not d.exists():
                d.mkdir()
                created.append(d)
        limit_file = "memory.max" if version == 2 else "memory.limit_in_bytes"
        (chain[-1] / limit_file).write_text(str(limit_bytes))
        yield KubeletCgroup(version=version, pod_uid=uid, container_id=cid, container_dir=chain[-1])
    finally:
        remove_cgroups(created)


def cold_file(path: Path, mib: int) -> Path:
    """A file of ``mib`` MiB on disk, written out and dropped from the page cache
    (``POSIX_FADV_DONTNEED``), so its pages are charged to the cgroup that reads them first
    (Documentation/admin-guide/cgroup-v1/memory.rst, 2.3 "Shared Page Accounting")."""
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return path


@contextlib.contextmanager
def private_kubepods(tmp: Path, *, limit: int | None = None) -> Iterator[tuple[Path, Path]]:
    """A ``kubepods`` cgroup (node allocatable ``limit``, or none) under a private v1 root, and
    a sysfs tree whose ``fs/cgroup/memory`` is that root: ``(sysfs, kubepods)``. An agent or a
    reader given that sysfs sees these pods alone, not the machine's (other tests' cgroups).
    Needs root and the v1 memory controller; removed on exit."""
    root = CGROUP_FS / "memory" / f"nodeguard-test-{secrets.token_hex(4)}"
    kubepods = root / "kubepods"
    made: list[Path] = []
    try:
        for d in (root, kubepods):
            d.mkdir()
            made.append(d)
        if limit is not None:
            (kubepods / "memory.limit_in_bytes").write_text(str(limit))
        cgroupfs = tmp / "sys/fs/cgroup"
        cgroupfs.mkdir(parents=True)
        (cgroupfs / "memory").symlink_to(root)
        yield tmp / "sys", kubepods
    finally:
        remove_cgroups(made)


def pod_container(
    kubepods: Path,
    made: list[Path],
    *,
    pod_uid: str | None = None,
    container_id: str | None = None,
    limit_bytes: int | None = None,
) -> KubeletCgroup:
    """``kubepods/burstable/pod<uid>/<container id>`` (v1, the cgroupfs driver's names) with a
    memory limit on the container; what it creates is appended to ``made``, for
    :func:`remove_cgroups`."""
    uid, cid = pod_uid or str(uuid.uuid4()), container_id or secrets.token_hex(32)
    chain = [kubepods / "burstable", kubepods / f"burstable/pod{uid}"]
    chain.append(chain[-1] / cid)
    for d in chain:
        if not d.exists():
            d.mkdir()
            made.append(d)
    if limit_bytes is not None:
        (chain[-1] / "memory.limit_in_bytes").write_text(str(limit_bytes))
    return KubeletCgroup(version=1, pod_uid=uid, container_id=cid, container_dir=chain[-1])


def remove_cgroups(made: list[Path]) -> None:
    """Remove cgroups made in this order, children after their parents, deepest first."""
    for d in reversed(made):
        for _ in range(50):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)  # a killed task can take a moment to leave the cgroup


@contextlib.contextmanager
def process_in(cg: KubeletCgroup, argv: list[str]) -> Iterator[subprocess.Popen[str]]:
    """Start ``argv`` (a program that waits for a line on stdin before it allocates), move it
    into the cgroup, then tell it to go. Killed on exit if still running."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        (cg.container_dir / "cgroup.procs").write_text(str(proc.pid))
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@contextlib.contextmanager
def hog_in(
    cg: KubeletCgroup, *, step: int, pause: float, up_to: int
) -> Iterator[subprocess.Popen[str]]:
    """Start a memory hog in the cgroup that allocates ``step`` bytes every ``pause`` seconds
    up to ``up_to``, prints ``survived`` and holds it all until killed on exit (it does not
    exit by itself, so a slow reader on a loaded machine still sees the peak)."""
    with process_in(cg, [sys.executable, "-c", HOG, str(step), str(pause), str(up_to)]) as proc:
        yield proc


@contextlib.contextmanager
def memory_stall(*, workdir: Path, seconds: float) -> Iterator[subprocess.Popen[str]]:
    """Real memory pressure (PSI ``some``) for ``seconds``: a 48 MiB cgroup holding 36 MiB of
    anonymous memory reads a cold 200 MiB file through the rest, so every read reclaims, and
    reclaim is a memory stall (Documentation/accounting/psi.rst). The file is made in
    ``workdir``, written to disk and dropped from the page cache first."""
    big = workdir / "big"
    with open(big, "wb") as f:
        for _ in range(200):
            f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    code = (
        "input()\n"
        "import os, time\n"
        "b = bytearray(36 << 20); b[::4096] = b'x' * len(b[::4096])\n"
        f"end = time.time() + {seconds!r}\n"
        "while time.time() < end:\n"
        f"    fd = os.open({str(big)!r}, os.O_RDONLY)\n"
        "    while os.read(fd, 1 << 20): pass\n"
        "    os.close(fd)\n"
    )
    with (
        kubelet_cgroup(limit_bytes=48 << 20) as cg,
        process_in(cg, [sys.executable, "-c", code]) as proc,
    ):
        yield proc
