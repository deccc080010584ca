"""Review of issue 21, point 3: "at its own limit" judged by usage, page cache included.

``nodeguard.stall.at_own_limit`` calls a cgroup at its limit when ``memory.current`` (v1
``usage_in_bytes``) is at 98 % of its limit. A container whose limit is full of clean page
cache (the data loader re-reading its dataset of point 1; on any v2 or v1 node, a container
doing file I/O sits at its limit: cgroup-v2.rst, "memory.max", the cache fills the limit and
reclaim takes it back) is "at its limit" all the time. When the node itself runs short (direct
reclaim in /proc/vmstat, which counts global reclaim only: mm/vmscan.c ``if
(!cgroup_reclaim(sc))``), such containers stall in *global* reclaim like every other task, and
their stall is taken as explained by their limits: memory-pressure-high, whose README row says
it does not act on "one container thrashing at its own limit", does not act on six containers
stalling in node reclaim either.
"""

from __future__ import annotations

from pathlib import Path

from tests.fixtures.make_hosts import write
from tests.test_node_pressure import Container, GiB, _host, _run, _value


def test_review21_node_reclaim_with_page_cache_full_limits_still_acts(tmp_path: Path) -> None:
    paths = _host(
        tmp_path,
        available=int(32 * GiB * 0.08),  # 8 %: node-memory-low (5 %) does not fire
        node_psi=(45.0, 30.0),
        containers=[Container(current=4 * GiB, limit=4 * GiB, full=30.0, some=40.0)] * 6,
    )
    # Each container's 4 GiB is 3.5 GiB of page cache and 0.5 GiB of anon: at its limit by
    # usage, its unreclaimable memory at 12.5 % of it.
    cg = paths.sysfs / "fs/cgroup"
    for d in [*cg.rglob("cri-containerd-*.scope"), *cg.rglob("kubepods-burstable-pod*.slice")]:
        write(
            d / "memory.stat",
            "anon 536870912\nfile 3758096384\nkernel 1048576\nshmem 0\n"
            "active_anon 536870912\ninactive_anon 0\nactive_file 1879048192\n"
            "inactive_file 1879048192\nunevictable 0\n",
        )
    fired, snaps = _run(paths, kswapd_per_step=50_000, direct_per_step=20_000)
    last = snaps[-1]
    reclaim = _value(last, snaps, "node_direct_reclaim_bytes_per_second")
    assert reclaim is not None and reclaim > 0
    unreclaimable = _value(last, snaps, "container_unreclaimable_limit_ratio")
    assert unreclaimable is not None and unreclaimable < 0.2
    # Node reclaim, six containers stalling in it: the stall is the node's. Today 0.0.
    share = _value(last, snaps, "node_memory_stall_outside_limits_ratio")
    assert share is not None and share > 0.10
    assert fired.get("memory-pressure-high") == {"gpu-1"}


def test_review21_container_throttled_at_memory_high_is_not_node_pressure(tmp_path: Path) -> None:
    """Kubernetes MemoryQoS (and any memory.high): the kubelet writes memory.high below
    memory.max (request + memoryThrottlingFactor 0.9 x (limit - request), KEP-2570); a task
    over memory.high is throttled and reclaims in its own cgroup (mm/memcontrol.c
    mem_cgroup_handle_over_high(), a PSI memstall). Node PSI full 30 %, all of it that
    container's, at 75 % of its memory.max, 70 % of the node free; a trickle of direct reclaim
    (50 pages every 5 s: high-order allocations on a fragmented node, or khugepaged, which
    kernels before 6.2 count as pgscan_direct). stall.py's own docstring names memory.high
    throttling as a stall of that cgroup's, yet the share "outside" reads 1.0 and the node is
    cordoned and other pods evicted, which frees nothing for it."""
    paths = _host(
        tmp_path,
        available=int(32 * GiB * 0.7),
        node_psi=(35.0, 30.0),
        containers=[
            Container(current=3 * GiB, limit=4 * GiB, full=30.0, some=35.0),
            Container(current=1 * GiB, limit=4 * GiB, full=0.0, some=0.2),
        ],
    )
    cg = paths.sysfs / "fs/cgroup"
    throttled = next(cg.rglob("kubepods-burstable-pod00000001*.slice"))
    for d in (throttled, next(throttled.glob("cri-containerd-*.scope"))):
        write(d / "memory.high", f"{3 * GiB}\n")
        write(d / "memory.events", "low 0\nhigh 981234\nmax 0\noom 0\noom_kill 0\n")
    fired, snaps = _run(paths, kswapd_per_step=0, direct_per_step=50)
    share = _value(snaps[-1], snaps, "node_memory_stall_outside_limits_ratio")
    assert share is not None and share < 0.10  # today 1.0 (0.001 of outside / 0.30 expected)
    assert "memory-pressure-high" not in fired
