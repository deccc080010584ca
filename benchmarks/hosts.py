"""Synthetic host trees at node scale: N containers over N/3 pods, for the benchmarks.

A tree is what ``nodeguard run --path.procfs/--path.sysfs/--path.kmsg`` reads, written with the
helpers of ``tests/fixtures/make_hosts.py`` (``meminfo``, ``proc_tree``, ``v2_cgroup``,
``kmsg``): ``proc/`` (meminfo, memory PSI, one process per container plus a few system ones),
``sys/fs/cgroup/`` (cgroup v2, systemd driver, containerd: ``kubepods.slice`` with guaranteed,
burstable and besteffort pods) and ``kmsg``.

Two things make it cost what a real node costs rather than what the small fixtures cost:

- every cgroup's ``memory.stat`` has the ~60 keys a 6.x kernel prints (the fixtures print 9),
  so parsing it costs what it costs on a node;
- every cgroup directory holds the ~45 interface files of a real v2 cgroup with the cpu, io,
  memory and pids controllers on (empty where nodeguard does not read them), so listing a
  directory for its children costs what it costs on cgroupfs.

What it cannot give is the kernel's own time to produce ``memory.stat`` on cgroupfs (kernfs
computes it on read); docs/benchmarks.md says so.

    python benchmarks/hosts.py /tmp/host330 330
"""

from __future__ import annotations

import contextlib
import random
import re
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fixtures.make_hosts import (  # noqa: E402
    GiB,
    MiB,
    kmsg,
    oom_records,
    proc_tree,
    v2_cgroup,
    write,
)

__all__ = ["HostTree", "make_host", "rename_pods"]

# Files of a v2 cgroup (cpu, io, memory, pids on) that nodeguard does not read: present so that a
# directory listing sees what it sees on a node.
_OTHER_FILES = [
    "cgroup.controllers",
    "cgroup.events",
    "cgroup.freeze",
    "cgroup.kill",
    "cgroup.max.depth",
    "cgroup.max.descendants",
    "cgroup.pressure",
    "cgroup.procs",
    "cgroup.stat",
    "cgroup.subtree_control",
    "cgroup.threads",
    "cgroup.type",
    "cpu.idle",
    "cpu.max",
    "cpu.max.burst",
    "cpu.pressure",
    "cpu.stat",
    "cpu.uclamp.max",
    "cpu.uclamp.min",
    "cpu.weight",
    "cpu.weight.nice",
    "io.max",
    "io.pressure",
    "io.prio.class",
    "io.stat",
    "io.weight",
    "memory.low",
    "memory.min",
    "memory.numa_stat",
    "memory.oom.group",
    "memory.peak",
    "memory.reclaim",
    "memory.swap.current",
    "memory.swap.events",
    "memory.swap.high",
    "memory.swap.max",
    "memory.swap.peak",
    "memory.zswap.current",
    "memory.zswap.max",
    "pids.current",
    "pids.events",
    "pids.max",
    "pids.peak",
]

# memory.stat of a 6.x kernel, in its order; the values that matter are filled in.
_STAT_KEYS = [
    "anon",
    "file",
    "kernel",
    "kernel_stack",
    "pagetables",
    "sec_pagetables",
    "percpu",
    "sock",
    "vmalloc",
    "shmem",
    "zswap",
    "zswapped",
    "file_mapped",
    "file_dirty",
    "file_writeback",
    "swapcached",
    "anon_thp",
    "file_thp",
    "shmem_thp",
    "inactive_anon",
    "active_anon",
    "inactive_file",
    "active_file",
    "unevictable",
    "slab_reclaimable",
    "slab_unreclaimable",
    "slab",
    "workingset_refault_anon",
    "workingset_refault_file",
    "workingset_activate_anon",
    "workingset_activate_file",
    "workingset_restore_anon",
    "workingset_restore_file",
    "workingset_nodereclaim",
    "pgdemote_kswapd",
    "pgdemote_direct",
    "pgdemote_khugepaged",
    "pgscan",
    "pgsteal",
    "pgscan_kswapd",
    "pgscan_direct",
    "pgscan_khugepaged",
    "pgsteal_kswapd",
    "pgsteal_direct",
    "pgsteal_khugepaged",
    "pgfault",
    "pgmajfault",
    "pgrefill",
    "pgactivate",
    "pgdeactivate",
    "pglazyfree",
    "pglazyfreed",
    "zswpin",
    "zswpout",
    "zswpwb",
    "thp_fault_alloc",
    "thp_collapse_alloc",
    "thp_swpout",
    "thp_swpout_fallback",
]

NODE_MEMORY = 1024 * GiB  # a GPU node: 1 TiB of RAM


def _memory_stat(*, anon: int, file: int, inactive_file: int, rng: random.Random) -> str:
    known = {
        "anon": anon,
        "file": file,
        "inactive_file": inactive_file,
        "active_file": file - inactive_file,
        "active_anon": anon,
        "inactive_anon": 0,
        "shmem": 0,
    }
    return "".join(f"{k} {known.get(k, rng.randrange(0, 1 << 24))}\n" for k in _STAT_KEYS)


def _cgroup(
    d: Path,
    *,
    current: int,
    max_: int | str,
    anon: int,
    file: int,
    inactive: int,
    rng: random.Random,
) -> None:
    v2_cgroup(
        d,
        current=current,
        max_=max_,
        inactive_file=inactive,
        anon=anon,
        file=file,
        max_events=rng.randrange(0, 3),
    )
    write(d / "memory.stat", _memory_stat(anon=anon, file=file, inactive_file=inactive, rng=rng))
    for name in _OTHER_FILES:
        (d / name).write_bytes(b"")


@dataclass(frozen=True, slots=True)
class HostTree:
    """A written tree: its root, the ``--path.*`` flags pointing at it, pods and containers."""

    root: Path
    pods: int
    containers: int

    @property
    def flags(self) -> list[str]:
        return [
            f"--path.procfs={self.root / 'proc'}",
            f"--path.sysfs={self.root / 'sys'}",
            f"--path.kmsg={self.root / 'kmsg'}",
        ]


def _qos(i: int) -> str:
    return ("guaranteed", "burstable", "burstable", "besteffort")[i % 4]


def make_host(root: Path, *, containers: int, seed: int = 8) -> HostTree:
    """Write a host with ``containers`` containers over ``round(containers / 3)`` pods
    (a full node: 330 over 110). Deterministic for a seed."""
    rng = random.Random(seed)
    pods = max(1, round(containers / 3))
    cg = root / "sys/fs/cgroup"
    write(cg / "cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n")
    write(cg / "memory.stat", "anon 0\nfile 0\n")
    kp = cg / "kubepods.slice"
    _cgroup(
        kp,
        current=400 * GiB,
        max_=1000 * GiB,
        anon=350 * GiB,
        file=50 * GiB,
        inactive=10 * GiB,
        rng=rng,
    )
    for qos in ("burstable", "besteffort"):
        _cgroup(
            kp / f"kubepods-{qos}.slice",
            current=100 * GiB,
            max_="max",
            anon=90 * GiB,
            file=10 * GiB,
            inactive=2 * GiB,
            rng=rng,
        )
    procs: list[tuple[int, str, int, str]] = [
        (1, "systemd", 12 * MiB, "0::/init.scope\n"),
        (700, "containerd", 80 * MiB, "0::/system.slice/containerd.service\n"),
        (710, "kubelet", 150 * MiB, "0::/system.slice/kubelet.service\n"),
    ]
    pid = 1000
    placed = 0
    first_memcg = ""
    for p in range(pods):
        n = containers // pods + (1 if p < containers % pods else 0)
        uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        qos = _qos(p)
        slug = uid.replace("-", "_")
        if qos == "guaranteed":
            pod_dir = kp / f"kubepods-pod{slug}.slice"
            rel = f"/kubepods.slice/kubepods-pod{slug}.slice"
        else:
            pod_dir = kp / f"kubepods-{qos}.slice" / f"kubepods-{qos}-pod{slug}.slice"
            rel = f"/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{slug}.slice"
        sizes = [rng.randrange(64, 8192) * MiB for _ in range(n)]
        limit: int | str = "max" if qos == "besteffort" else sum(sizes) * 2
        total = sum(sizes)
        _cgroup(
            pod_dir,
            current=total,
            max_=limit,
            anon=total * 3 // 4,
            file=total // 4,
            inactive=total // 16,
            rng=rng,
        )
        for size in sizes:
            cid = f"{rng.getrandbits(256):064x}"
            c_limit: int | str = size * 2 if qos != "besteffort" and rng.random() < 0.8 else "max"
            _cgroup(
                pod_dir / f"cri-containerd-{cid}.scope",
                current=size,
                max_=c_limit,
                anon=size * 3 // 4,
                file=size // 4,
                inactive=size // 16,
                rng=rng,
            )
            memcg = f"{rel}/cri-containerd-{cid}.scope"
            first_memcg = first_memcg or memcg
            procs.append((pid, "python3", size * 3 // 4, f"0::{memcg}\n"))
            pid += 1
            placed += 1
    proc_tree(
        root / "proc", procs=procs, psi=True, available=True, trailing_blank=False, hugepages=False
    )
    # The fixture's 32 GiB node scaled to 1 TiB (the same shares), so container limits count as
    # real limits (a limit >= MemTotal is none).
    meminfo = root / "proc/meminfo"
    meminfo.write_text(
        re.sub(
            r"(\d+) kB",
            lambda m: f"{int(m.group(1)) * (NODE_MEMORY // (32 * GiB))} kB",
            meminfo.read_text(),
        )
    )
    records: list[str | tuple[str, str]] = ["Linux version 6.1.0 (builder@host)"]
    records += oom_records(
        memcg=first_memcg,
        pid=4100,
        comm="python3",
        anon_kb=2_000_000,
        constraint="CONSTRAINT_MEMCG",
    )
    write(root / "kmsg", kmsg(records))
    return HostTree(root=root, pods=pods, containers=placed)


def rename_pods(tree: HostTree, *, count: int, rng: random.Random) -> int:
    """Pod churn: give ``count`` pods (and their containers) new UIDs and IDs, as if they were
    deleted and new ones scheduled. Returns how many were renamed."""
    kp = tree.root / "sys/fs/cgroup/kubepods.slice"
    pod_dirs = sorted(d for d in kp.rglob("*pod*.slice") if d.is_dir())
    renamed = 0
    for d in rng.sample(pod_dirs, min(count, len(pod_dirs))):
        for c in [c for c in d.iterdir() if c.is_dir()]:
            c.rename(d / f"cri-containerd-{rng.getrandbits(256):064x}.scope")
        prefix = d.name.split("pod", 1)[0]
        new = str(uuid.UUID(int=rng.getrandbits(128), version=4)).replace("-", "_")
        d.rename(d.parent / f"{prefix}pod{new}.slice")
        renamed += 1
    return renamed


class Churn:
    """Memory that moves between samples, as on a busy node, written in place (same inodes).

    Each :meth:`step`, every pod and container cgroup's ``memory.current`` and the ``anon``,
    ``file``, ``inactive_file`` and ``active_file`` lines of its ``memory.stat`` change (the
    worst case: every workload allocating or freeing within one interval), and one cgroup in
    ten gets a new ``memory.pressure`` (a stall); ``memory.events`` and ``memory.max`` stay, as
    they do on a node between OOM events and resizes. Without it a static tree would let an
    agent that re-uses what it parsed when a file reads the same look cheaper than a node."""

    def __init__(self, root: Path, *, rng: random.Random) -> None:
        self._kubepods = root / "sys/fs/cgroup/kubepods.slice"
        self._rng = rng
        self._n = 0
        self.relist()

    def relist(self) -> None:
        """Find the cgroups again (after :func:`rename_pods`), with the values each started
        from: its memory moves within 5 % of those, and never past its limit."""
        self._dirs: list[tuple[Path, int, int, int | None]] = []
        for d in sorted(self._kubepods.rglob("*")):
            if not (d.is_dir() and (d / "memory.current").exists()):
                continue
            stat = dict(ln.split(" ", 1) for ln in (d / "memory.stat").read_text().splitlines())
            limit = (d / "memory.max").read_text().strip()
            self._dirs.append(
                (d, int(stat["anon"]), int(stat["file"]), int(limit) if limit.isdigit() else None)
            )

    def step(self) -> int:
        """Change the files; returns how many cgroups changed."""
        self._n += 1
        n, rng = self._n, self._rng
        for i, (d, anon0, file0, limit) in enumerate(self._dirs):
            anon = int(anon0 * rng.uniform(0.95, 1.05)) & ~4095
            file = int(file0 * rng.uniform(0.95, 1.05)) & ~4095
            if limit is not None and anon + file > limit:
                file = max(0, limit - anon) & ~4095
                anon = min(anon, limit) & ~4095
            inactive = file // 2 & ~4095
            (d / "memory.current").write_text(f"{anon + file}\n")
            stat = d / "memory.stat"
            known = {
                "anon": anon,
                "file": file,
                "inactive_file": inactive,
                "active_file": file - inactive,
            }
            lines = stat.read_text().splitlines()
            stat.write_text(
                "".join(
                    f"{k} {known[k]}\n" if k in known else f"{k} {v}\n"
                    for k, v in (ln.split(" ", 1) for ln in lines)
                )
            )
            if (i + n) % 10 == 0:
                total = 1_000_000 * n + i
                (d / "memory.pressure").write_text(
                    f"some avg10=1.00 avg60=0.50 avg300=0.10 total={total}\n"
                    f"full avg10=0.50 avg60=0.20 avg300=0.05 total={total // 2}\n"
                )
        return len(self._dirs)


@contextlib.contextmanager
def kernel_host(*, containers: int, seed: int = 8) -> Iterator[Path]:
    """``containers`` containers over ``containers // 3`` pods as real cgroups in this machine's
    memory controller (kubelet's cgroupfs layout: ``kubepods/[burstable|besteffort/]pod<uid>/
    <id>``, a limit on every guaranteed container), so that reading them costs what the
    kernel's cgroupfs costs (kernfs computes ``memory.stat`` on every read). Yields the
    hierarchy root; removes everything on exit. Needs root and a writable memory controller
    (tests/support/kernel_cgroup.py); the cgroups are empty, so their files read the same each
    time."""
    from tests.support.kernel_cgroup import remove_cgroups, writable_memory_controller

    found = writable_memory_controller()
    if found is None:
        raise RuntimeError("needs root and a writable cgroup memory controller")
    version, root = found
    rng = random.Random(seed)
    limit_file = "memory.max" if version == 2 else "memory.limit_in_bytes"
    made: list[Path] = []

    def mkdir(d: Path) -> None:
        if version == 2:
            with contextlib.suppress(OSError):
                (d.parent / "cgroup.subtree_control").write_text("+memory")
        if not d.exists():
            d.mkdir()
            made.append(d)

    try:
        kp = root / "kubepods"
        mkdir(kp)
        for qos in ("burstable", "besteffort"):
            mkdir(kp / qos)
        placed, p = 0, 0
        while placed < containers:
            qos = _qos(p)
            p += 1
            parent = kp if qos == "guaranteed" else kp / qos
            pod = parent / f"pod{uuid.UUID(int=rng.getrandbits(128), version=4)}"
            mkdir(pod)
            for _ in range(min(3, containers - placed)):
                placed += 1
                c = pod / f"{rng.getrandbits(256):064x}"
                mkdir(c)
                if qos == "guaranteed":
                    (c / limit_file).write_text(str(rng.choice((8, 16, 64)) << 30))
        yield root
    finally:
        remove_cgroups(made)


def main() -> None:
    root, n = Path(sys.argv[1]), int(sys.argv[2])
    tree = make_host(root, containers=n)
    print(f"wrote {tree.root}: {tree.pods} pods, {tree.containers} containers")


if __name__ == "__main__":
    main()
