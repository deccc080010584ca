"""Unreclaimable memory on cgroup v2 fixture trees, each a form the kernel writes: page cache
(active and inactive), reclaimable slab, kernel memory, shmem, swap (none, the kubelet's NoSwap,
LimitedSwap, unlimited, vm.swappiness 0, the node's SwapFree), the refault lines of 4.16-5.8 and
5.9+, and the kubepods cgroup against node allocatable. The right values come from
cgroup-v2.rst ("memory.stat", "memory.swap.max") and mm/vmscan.c get_scan_count()."""

from __future__ import annotations

import math
from pathlib import Path

from nodeguard.rules.signals import SIGNALS, History, counter_rate, targets
from nodeguard.snapshot import CgroupMemory
from tests.support.memory_host import (
    LIMIT,
    GiB,
    MiB,
    memory_host,
    memory_snapshot,
    memory_stat,
    read_host,
)


def test_page_cache_active_and_inactive_is_reclaimable(tmp_path: Path) -> None:
    # A data loader re-reading its dataset: 900 MiB of cache, 600 of it active (read twice),
    # beside 60 MiB of anon: the working set counts the active 600.
    stat = memory_stat(
        anon=60 * MiB,
        file=900 * MiB,
        active_anon=60 * MiB,
        active_file=600 * MiB,
        inactive_file=300 * MiB,
    )
    paths, _, _ = memory_host(tmp_path, container=stat, current=960 * MiB)
    mem, kubepods = read_host(paths)
    assert mem.working_set_bytes == 660 * MiB
    assert mem.unreclaimable_bytes == 60 * MiB
    assert mem.unreclaimable_ratio == 60 * MiB / LIMIT
    # The same numbers for all pods together against node allocatable.
    assert kubepods.unreclaimable_bytes == 60 * MiB
    assert kubepods.effective_limit_bytes == 30 * GiB


def test_shmem_and_kernel_memory_count_reclaimable_slab_does_not(tmp_path: Path) -> None:
    # 200 MiB written to a memory-backed emptyDir (shmem: on the anon LRU, in `file` too),
    # 100 MiB of anon, 64 MiB of dentries (reclaimable slab), 40 MiB of socket buffers and
    # page tables, 100 MiB of page cache.
    stat = memory_stat(
        anon=100 * MiB,
        file=300 * MiB,
        shmem=200 * MiB,
        kernel=104 * MiB,
        sock=30 * MiB,
        pagetables=10 * MiB,
        inactive_anon=200 * MiB,
        active_anon=100 * MiB,
        active_file=60 * MiB,
        inactive_file=40 * MiB,
        slab_reclaimable=64 * MiB,
    )
    current = 100 * MiB + 300 * MiB + 104 * MiB
    paths, _, _ = memory_host(tmp_path, container=stat, current=current)
    mem, _ = read_host(paths)
    assert mem.unreclaimable_bytes == 100 * MiB + 200 * MiB + 40 * MiB


def _anon_hog(tmp: Path, **kw: object) -> CgroupMemory:
    stat = memory_stat(anon=800 * MiB, active_anon=800 * MiB, file=100 * MiB, active_file=100 * MiB)
    swap_free = kw.pop("swap_free", None)
    paths, _, _ = memory_host(tmp, container=stat, current=900 * MiB, **kw)  # type: ignore[arg-type]
    return read_host(paths, swap_free=swap_free)[0]  # type: ignore[arg-type]


def test_without_swap_all_anon_counts(tmp_path: Path) -> None:
    # No swap on the node (SwapFree 0; unknown is taken the same): the files are not read.
    assert _anon_hog(tmp_path / "a", swap_free=0, swap=(0, 0)).unreclaimable_bytes == 800 * MiB
    assert _anon_hog(tmp_path / "b").unreclaimable_bytes == 800 * MiB


def test_swap_room_bounds_what_anon_leaves_out(tmp_path: Path) -> None:
    # The kubelet's NoSwap: memory.swap.max 0 on the container.
    assert (
        _anon_hog(tmp_path / "a", swap_free=8 * GiB, swap=(0, 0)).unreclaimable_bytes == 800 * MiB
    )
    # LimitedSwap: 512 MiB of swap, 412 used: 100 MiB of anon can still go.
    limited = _anon_hog(tmp_path / "b", swap_free=8 * GiB, swap=(512 * MiB, 412 * MiB))
    assert limited.unreclaimable_bytes == 700 * MiB
    # Unlimited in the cgroup: the node's SwapFree bounds it.
    assert (
        _anon_hog(tmp_path / "c", swap_free=300 * MiB, swap=("max", 0)).unreclaimable_bytes
        == 500 * MiB
    )
    # Swap accounting off (no memory.swap.* files): the node's SwapFree alone.
    assert _anon_hog(tmp_path / "d", swap_free=8 * GiB).unreclaimable_bytes == 0
    # The pod's room bounds its containers'.
    pod_bound = _anon_hog(
        tmp_path / "e", swap_free=8 * GiB, swap=("max", 0), pod_swap=(64 * MiB, 0)
    )
    assert pod_bound.unreclaimable_bytes == 736 * MiB
    # vm.swappiness 0: a cgroup's limit reclaim scans the file lists only.
    assert (
        _anon_hog(
            tmp_path / "f", swap_free=8 * GiB, swap=("max", 0), swappiness=0
        ).unreclaimable_bytes
        == 800 * MiB
    )


def test_refaults_of_either_kernel_line(tmp_path: Path) -> None:
    page = 4096
    new = memory_stat(active_file=MiB, inactive_file=MiB, workingset_refault_file=1000)
    paths, _, _ = memory_host(tmp_path / "a", container=new, current=2 * MiB)
    assert read_host(paths)[0].refault_file_bytes == 1000 * page
    old = new.replace("workingset_refault_file", "workingset_refault") + "x 0\n"
    old = old.replace("workingset_refault_anon 0\n", "")
    paths, _, _ = memory_host(tmp_path / "b", container=old, current=2 * MiB)
    assert read_host(paths)[0].refault_file_bytes == 1000 * page
    assert counter_rate([(0.0, 0), (2.0, 8 * MiB)], window=10) == 4 * MiB
    assert counter_rate([(0.0, 8 * MiB), (2.0, 0)], window=10) == 0  # a reset counts from 0
    assert counter_rate([(0.0, 0)], window=10) is None


def test_no_lru_lines_no_value(tmp_path: Path) -> None:
    paths, _, _ = memory_host(tmp_path, container="anon 5\nfile 0\n", current=5)
    mem, _ = read_host(paths)
    assert mem.unreclaimable_bytes is None
    assert mem.unreclaimable_ratio is None


def test_growth_of_cache_is_not_growth_toward_the_kill(tmp_path: Path) -> None:
    # One container's page cache grows 20 MiB/s toward the limit, its anon stays; the time to
    # the limit of the working set is short, of unreclaimable memory infinite.
    history = History()
    snaps = []
    for i in range(12):
        cache = 700 * MiB + i * 20 * MiB
        stat = memory_stat(anon=50 * MiB, active_anon=50 * MiB, file=cache, active_file=cache)
        paths, uid, cid = memory_host(tmp_path / str(i), container=stat, current=cache + 50 * MiB)
        mem = read_host(paths)[0]
        snap = memory_snapshot(float(i), mem, uid, cid)
        history.observe(snap)
        snaps.append(snap)
    (target,) = targets(snaps[-1], "container")

    def value(name: str) -> float | None:
        return SIGNALS[name].fn(snaps[-1], history, target)

    assert value("container_working_set_limit_ratio") == (920 * MiB + 50 * MiB) / LIMIT
    ws_eta = value("container_seconds_to_limit")
    assert ws_eta is not None and ws_eta < 60
    assert value("container_unreclaimable_limit_ratio") == 50 * MiB / LIMIT
    assert value("container_unreclaimable_seconds_to_limit") == math.inf
    assert value("node_allocatable_unreclaimable_ratio") == 50 * MiB / LIMIT
