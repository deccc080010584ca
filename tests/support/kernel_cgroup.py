"""Kubelet-shaped memory cgroups on the real kernel, for tests that watch real OOM kills.

Every cgroup a test makes is under a private root of its own (:func:`private_kubepods`:
``<memory hierarchy>/nodeguard-test-<hex>/kubepods``), which the code under test is pointed
at alone through a sysfs view: no test creates, reads or counts anything under the machine's
own ``kubepods`` (on a Kubernetes node, the kubelet's). Needs root and a writable memory
controller: cgroup v1 (``/sys/fs/cgroup/memory``) or v2 (the unified hierarchy with
``memory`` in ``cgroup.controllers``). Everything created is removed on exit, also when the
test fails. ``tests/unit/test_test_rules.py`` holds that no test writes under a kubepods path
of ``/sys/fs/cgroup`` but through this module.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.agent import wait_until

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


@dataclass(frozen=True, slots=True)
class PrivateKubepods:
    """A ``kubepods`` cgroup under a private root of the real memory hierarchy, and a sysfs
    view in which that root is the whole memory hierarchy.

    ``root`` (``<hierarchy>/nodeguard-test-<hex>``) and ``kubepods`` (``root/kubepods``) are
    real cgroups on the kernel's cgroupfs, made with the real files: a write to them (a limit,
    a v1 threshold through ``cgroup.event_control``) is the kernel's. ``sysfs`` mirrors
    ``/sys`` by symlinks except ``fs/cgroup``, whose memory hierarchy (v1 ``fs/cgroup/memory``,
    v2 ``fs/cgroup``) is a symlink to ``root``: a reader or an agent given
    ``HostPaths(sysfs=sysfs)`` / ``--path.sysfs`` sees these pods alone, never the kubelet's
    or another test's, and its ``fstatfs`` checks find the kernel's cgroup file system.
    """

    version: int
    hierarchy: Path
    root: Path
    kubepods: Path
    sysfs: Path

    def cgroup_id(self, path: Path) -> str:
        """``path``'s cgroup path from the hierarchy root, as ``/proc/<pid>/cgroup``, the
        kernel log and cAdvisor's ``id`` write it: ``/nodeguard-test-<hex>/kubepods/...``."""
        return "/" + str(path.relative_to(self.hierarchy))


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
    """``+memory`` in ``path``'s ``cgroup.subtree_control``: its children get the controller
    (Documentation/admin-guide/cgroup-v2.rst "Enabling and Disabling")."""
    control = path / "cgroup.subtree_control"
    if "memory" not in control.read_text().split():
        control.write_text("+memory")


def _limit_file(version: int) -> str:
    return "memory.max" if version == 2 else "memory.limit_in_bytes"


def _sysfs_view(view: Path, *, version: int, root: Path) -> Path:
    """``view/sys``: ``/sys`` by symlinks, with the memory hierarchy at ``root`` alone."""
    sysfs = view / "sys"
    (sysfs / "fs").mkdir(parents=True)
    for entry in Path("/sys").iterdir():
        if entry.name != "fs":
            (sysfs / entry.name).symlink_to(entry)
    for entry in Path("/sys/fs").iterdir():
        if entry.name != "cgroup":
            (sysfs / "fs" / entry.name).symlink_to(entry)
    if version == 2:
        (sysfs / "fs/cgroup").symlink_to(root)
    else:
        (sysfs / "fs/cgroup").mkdir()
        (sysfs / "fs/cgroup/memory").symlink_to(root)
    return sysfs


@contextlib.contextmanager
def private_kubepods(tmp: Path, *, limit: int | None = None) -> Iterator[PrivateKubepods]:
    """A ``kubepods`` cgroup (node allocatable ``limit``, or none) under a private root of its
    own, and a sysfs view of it under ``tmp`` (:class:`PrivateKubepods`). On exit every cgroup
    under the root, and the root, is removed, also when the test failed (the test's processes
    must be gone: :func:`process_in` kills its own). Needs root and a writable memory
    controller: cgroup v1, or v2 with ``memory`` in the unified root's
    ``cgroup.controllers`` (v2 is written to the kernel's documentation, not run on CI)."""
    found = writable_memory_controller()
    if found is None:
        raise RuntimeError("needs root and a writable cgroup memory controller")
    version, hierarchy = found
    root = hierarchy / f"nodeguard-test-{secrets.token_hex(4)}"
    kubepods = root / "kubepods"
    try:
        if version == 2:
            _enable_memory_v2(hierarchy)
        root.mkdir()
        if version == 2:
            _enable_memory_v2(root)
        kubepods.mkdir()
        if version == 2:
            _enable_memory_v2(kubepods)
        if limit is not None:
            (kubepods / _limit_file(version)).write_text(str(limit))
        sysfs = _sysfs_view(tmp / root.name, version=version, root=root)
        yield PrivateKubepods(
            version=version, hierarchy=hierarchy, root=root, kubepods=kubepods, sysfs=sysfs
        )
    finally:
        remove_cgroups(_tree(root))


def _tree(root: Path) -> list[Path]:
    """The cgroup directories at and under ``root``, parents before their children."""
    if not root.is_dir():
        return []
    out = [root]
    for parent, dirs, _ in os.walk(root):
        out += [Path(parent) / d for d in sorted(dirs)]
    return out


def pod_container(
    pods: PrivateKubepods,
    *,
    pod_uid: str | None = None,
    container_id: str | None = None,
    limit_bytes: int | None = None,
    made: list[Path] | None = None,
) -> KubeletCgroup:
    """``kubepods/burstable/pod<uid>/<container id>`` (the cgroupfs driver's names) in
    ``pods``, with a memory limit on the container; what it creates is appended to ``made``
    (for :func:`remove_cgroups`: a container the test removes before the end). The rest goes
    with the private root."""
    uid, cid = pod_uid or str(uuid.uuid4()), container_id or secrets.token_hex(32)
    chain = [pods.kubepods / "burstable", pods.kubepods / f"burstable/pod{uid}"]
    chain.append(chain[-1] / cid)
    for d in chain:
        if not d.exists():
            if pods.version == 2:
                _enable_memory_v2(d.parent)
            d.mkdir()
            if made is not None:
                made.append(d)
    if limit_bytes is not None:
        (chain[-1] / _limit_file(pods.version)).write_text(str(limit_bytes))
    return KubeletCgroup(
        version=pods.version, pod_uid=uid, container_id=cid, container_dir=chain[-1]
    )


@contextlib.contextmanager
def kubelet_cgroup(
    pods: PrivateKubepods,
    *,
    limit_bytes: int,
    pod_uid: str | None = None,
    container_id: str | None = None,
) -> Iterator[KubeletCgroup]:
    """:func:`pod_container` for the block: what it created is removed when the block ends
    (the kubelet removing a container's cgroup, and its pod's when it was the last)."""
    made: list[Path] = []
    try:
        yield pod_container(
            pods, pod_uid=pod_uid, container_id=container_id, limit_bytes=limit_bytes, made=made
        )
    finally:
        remove_cgroups(made)


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


def _removed(d: Path) -> bool:
    try:
        d.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False  # a killed task can take a moment to leave the cgroup
    return True


def remove_cgroups(made: list[Path]) -> None:
    """Remove cgroups made in this order, children after their parents, deepest first."""
    for d in reversed(made):
        wait_until(f"{d} removed", functools.partial(_removed, d), timeout=30)


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
        private_kubepods(workdir) as pods,
        kubelet_cgroup(pods, limit_bytes=48 << 20) as cg,
        process_in(cg, [sys.executable, "-c", code]) as proc,
    ):
        yield proc
