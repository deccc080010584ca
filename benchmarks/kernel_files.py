"""What one cgroup file costs on this machine's cgroupfs, and what holding it open costs.

- per file kind (the five nodeguard reads on cgroup v1, or on v2): microseconds to open, read
  and close it, against a ``pread`` at offset 0 of the file held open, in a loop in this
  process (the kernel's cost and Python's call, no parsing);
- the kernel memory of held files: a child process moved into a memory cgroup of its own opens
  and reads 2,200 cgroup files (330 containers' worth) and keeps them open; the cgroup's
  ``memory.usage_in_bytes`` (v1) or ``memory.current`` (v2) before and after, and after closing.

Needs root and a writable memory controller (tests/support/kernel_cgroup.py); everything made is
removed.

    python benchmarks/kernel_files.py        -> one JSON object on stdout
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.kernel_cgroup import remove_cgroups, writable_memory_controller

FILES = {
    1: (
        "memory.stat",
        "memory.usage_in_bytes",
        "memory.oom_control",
        "memory.failcnt",
        "memory.limit_in_bytes",
    ),
    2: ("memory.stat", "memory.current", "memory.events", "memory.pressure", "memory.max"),
}

# The child: opens and reads every path on stdin, waits, closes them, waits.
HOLDER = r"""
import os, sys
paths = sys.stdin.readline().split()
fds = []
for p in paths:
    fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
    os.pread(fd, 65536, 0)
    fds.append(fd)
print("held", flush=True)
sys.stdin.readline()
for fd in fds:
    os.close(fd)
print("closed", flush=True)
sys.stdin.readline()
"""


def _per_file(d: Path, names: tuple[str, ...], loops: int) -> dict[str, dict[str, float]]:
    out = {}
    for name in names:
        path = str(d / name)
        t0 = time.perf_counter()
        for _ in range(loops):
            fd = os.open(path, os.O_RDONLY)
            os.read(fd, 65536)
            os.close(fd)
        t1 = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        for _ in range(loops):
            os.pread(fd, 65536, 0)
        t2 = time.perf_counter()
        os.close(fd)
        out[name] = {
            "open_read_close_us": (t1 - t0) / loops * 1e6,
            "pread_us": (t2 - t1) / loops * 1e6,
        }
    return out


def measure(*, held: int = 2200, loops: int = 5000) -> dict[str, Any]:
    found = writable_memory_controller()
    if found is None:
        raise RuntimeError("needs root and a writable cgroup memory controller")
    version, root = found
    names = FILES[version]
    usage_file = "memory.current" if version == 2 else "memory.usage_in_bytes"
    base = root / f"nodeguard-files-{secrets.token_hex(4)}"
    made = [base]
    base.mkdir()
    try:
        if version == 2:
            (base / "cgroup.subtree_control").write_text("+memory")
        holder, targets = base / "holder", base / "targets"
        for d in (holder, targets):
            d.mkdir()
            made.append(d)
        if version == 2:
            (targets / "cgroup.subtree_control").write_text("+memory")
        cgroups = []
        for i in range(-(-held // len(names))):
            d = targets / f"c{i}"
            d.mkdir()
            made.append(d)
            cgroups.append(d)
        per_file = _per_file(cgroups[0], names, loops)
        paths = [str(d / n) for d in cgroups for n in names][:held]
        for p in paths:  # once first, so dentries and inodes are not what is measured
            fd = os.open(p, os.O_RDONLY)
            os.pread(fd, 65536, 0)
            os.close(fd)
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdin is not None and proc.stdout is not None
        try:
            (holder / "cgroup.procs").write_text(str(proc.pid))
            time.sleep(0.2)
            before = int((holder / usage_file).read_text())
            proc.stdin.write(" ".join(paths) + "\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "held"
            during = int((holder / usage_file).read_text())
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "closed"
            after = int((holder / usage_file).read_text())
            proc.stdin.write("\n")
            proc.stdin.flush()
        finally:
            proc.wait(timeout=30)
    finally:
        remove_cgroups(made)
    return {
        "cgroup_version": version,
        "loops": loops,
        "per_file": per_file,
        "held_files": len(paths),
        "held_bytes": during - before,
        "held_bytes_per_file": (during - before) / len(paths),
        "after_close_bytes": after - before,
    }


def main() -> None:
    json.dump(measure(), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
