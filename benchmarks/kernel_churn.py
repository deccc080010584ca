"""Memory moving in every real cgroup of a benchmark host (``benchmarks.hosts.kernel_host``), as
``benchmarks.hosts.Churn`` moves it in a synthetic tree: what an exporter reads changes between
two of its samples in every pod and container cgroup.

One child process (so that its memory is charged to the cgroups, not to the runner's) keeps a
file on tmpfs per container cgroup. Every ``--period`` seconds it joins each container cgroup in
turn (``cgroup.procs``) and grows or shrinks that cgroup's file by 4-64 KiB around 256 KiB:
pages it writes are charged to the cgroup it is in (tmpfs pages are shmem: v1 ``total_cache`` and
``total_shmem``, v2 ``file`` and ``shmem``), pages it truncates are uncharged from the cgroup
that holds them. So every container's and every pod's usage, working set and ``memory.stat``
change each period. On exit the files are removed and the process leaves for the root cgroup.

    python benchmarks/kernel_churn.py ROOT [CGROUP ...] [--period 2.5]     # until SIGTERM
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.controlplane.cluster import terminate  # noqa: E402

__all__ = ["containers_under", "kernel_churn"]

KiB = 1 << 10
_BASE = 256 * KiB
_CHUNK = b"\x03" * (64 * KiB)


def containers_under(root: Path) -> list[Path]:
    """Container cgroups under ``root/kubepods``: a pod's children."""
    found: list[Path] = []
    for dirpath, dirnames, _ in os.walk(root / "kubepods"):
        if Path(dirpath).name.startswith("pod"):
            found.extend(Path(dirpath) / d for d in sorted(dirnames))
            dirnames.clear()
    return found


def _resize(fd: int, size: int, target: int) -> None:
    if target < size:
        os.ftruncate(fd, target)
        return
    while size < target:
        n = min(len(_CHUNK), target - size)
        os.pwrite(fd, _CHUNK[:n], size)
        size += n


def run(root: Path, *, cgroups: list[Path], period: float) -> None:
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    rng = random.Random(8)
    me = str(os.getpid())
    workdir = Path(tempfile.mkdtemp(prefix="nodeguard-churn-", dir="/dev/shm"))
    files = {
        cg: os.open(workdir / str(i), os.O_RDWR | os.O_CREAT, 0o600) for i, cg in enumerate(cgroups)
    }
    sizes = dict.fromkeys(cgroups, 0)
    print(f"moving memory in {len(cgroups)} cgroups every {period:g}s", flush=True)
    try:
        while not stop:
            started = time.monotonic()
            for cg in cgroups:
                try:
                    (cg / "cgroup.procs").write_text(me)
                except OSError:
                    continue  # removed under us
                target = _BASE + rng.choice((-1, 1)) * rng.randint(4, 64) * KiB
                _resize(files[cg], sizes[cg], target)
                sizes[cg] = target
            time.sleep(max(0.0, period - (time.monotonic() - started)))
    finally:
        (root / "cgroup.procs").write_text(me)
        for fd in files.values():
            os.close(fd)
        for path in workdir.iterdir():
            path.unlink()
        workdir.rmdir()


@contextlib.contextmanager
def kernel_churn(root: Path, *, cgroups: list[Path], period: float = 2.5) -> Iterator[None]:
    """:func:`run` over ``cgroups`` in a child process for the duration of the block."""
    proc = subprocess.Popen(
        [sys.executable, __file__, f"--period={period}", str(root), *map(str, cgroups)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        if not proc.stdout.readline().startswith("moving memory"):  # started, files opened
            raise RuntimeError(f"benchmarks/kernel_churn.py did not start (exit {proc.wait()})")
        yield
    finally:
        terminate(proc, timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("root", type=Path, help="the memory hierarchy root holding kubepods/")
    parser.add_argument("cgroups", type=Path, nargs="*", help="default: every container cgroup")
    parser.add_argument("--period", type=float, default=2.5)
    args = parser.parse_args()
    run(args.root, cgroups=args.cgroups or containers_under(args.root), period=args.period)


if __name__ == "__main__":
    main()
