"""Node memory pressure that one pod's own limit explains, and pressure that is the node's
(issue 21, point 3 and the node part of point 1).

``/proc/pressure/memory`` sums every task's stalls, also those of a task reclaiming inside its
own cgroup's limit (Documentation/accounting/psi.rst): one container thrashing at its own
``memory.max`` drives node ``full`` up on a node with 70 % free. Global reclaim is what the
node's own counters in ``/proc/vmstat`` count, and only that (mm/vmscan.c: ``pgscan_*`` and
``pgsteal_*`` are counted ``if (!cgroup_reclaim(sc))``). Each case is a host tree in the
kernel's real file forms (the fixture writers of tests/fixtures/make_hosts.py), sampled by
the real sampler and judged by the shipped runbook (rules/default.yaml) on the real engine,
a sample every 5 s of snapshot time for two minutes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from nodeguard.paths import HostPaths
from nodeguard.rules.engine import RuleEngine
from nodeguard.rules.load import load_rules
from nodeguard.rules.signals import SIGNALS, targets
from nodeguard.sampling.sampler import Sampler, SamplerConfig
from nodeguard.snapshot import NodeSnapshot
from tests.fixtures.make_hosts import CID, VMSTAT_6X, proc_tree, v1_cgroup, v2_cgroup, write

GiB = 1 << 30
MiB = 1 << 20
DEFAULT_RULES = Path(__file__).resolve().parents[2] / "rules" / "default.yaml"
STEP = 5.0
STEPS = 25  # two minutes: past the rules' `for` (1m node, 30s container)


def _meminfo(*, available: int) -> str:
    total = 32 * GiB
    kb = {
        "MemTotal": total,
        "MemFree": available - 2 * GiB,
        "MemAvailable": available,
        "Buffers": 64 * MiB,
        "Cached": 2 * GiB,
        "Active(file)": 1 * GiB,
        "Inactive(file)": 1 * GiB,
        "Shmem": 16 * MiB,
        "SReclaimable": 256 * MiB,
        "SUnreclaim": 128 * MiB,
    }
    return "".join(f"{k}:{v // 1024:>16} kB\n" for k, v in kb.items())


def _psi(some: float, full: float) -> str:
    return (
        f"some avg10={some:.2f} avg60={some:.2f} avg300={some:.2f} total=123456789\n"
        f"full avg10={full:.2f} avg60={full:.2f} avg300={full:.2f} total=23456789\n"
    )


def _vmstat(*, kswapd: int, direct: int) -> str:
    """The 6.x form with the scan and steal counters set (pages)."""
    out = VMSTAT_6X
    for name, value in (
        ("pgscan_kswapd", kswapd),
        ("pgscan_direct", direct),
        ("pgsteal_kswapd", kswapd // 2),
        ("pgsteal_direct", direct // 2),
    ):
        head, _, rest = out.partition(f"\n{name} ")
        out = f"{head}\n{name} {value}\n{rest.split(chr(10), 1)[1]}"
    return out


@dataclasses.dataclass
class Container:
    """One container of its own pod: usage, limit (``None``: none), its PSI (percent)."""

    current: int
    limit: int | None
    full: float
    some: float


def _host(
    root: Path,
    *,
    available: int,
    node_psi: tuple[float, float],
    containers: list[Container],
    version: int = 2,
) -> HostPaths:
    proc = root / "proc"
    proc_tree(proc, procs=[(1, "systemd", 12 * MiB, "0::/init.scope\n")])
    write(proc / "meminfo", _meminfo(available=available))
    write(proc / "pressure" / "memory", _psi(*node_psi))
    cg = root / "sys/fs/cgroup"
    if version == 2:
        write(cg / "cgroup.controllers", "cpuset cpu io memory pids\n")
        write(cg / "memory.stat", "anon 0\nfile 0\n")
        write(cg / "memory.pressure", _psi(*node_psi))
        kp = cg / "kubepods.slice" / "kubepods-burstable.slice"
        v2_cgroup(cg / "kubepods.slice", current=sum(c.current for c in containers), max_=30 * GiB)
        v2_cgroup(kp, current=sum(c.current for c in containers))
        for i, c in enumerate(containers, start=1):
            uid = f"0000000{i}-0000-4000-8000-000000000000"
            pod = kp / f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
            limit: int | str = "max" if c.limit is None else c.limit
            v2_cgroup(pod, current=c.current, max_=limit, anon=c.current)
            write(pod / "memory.pressure", _psi(c.some, c.full))
            ctr = pod / f"cri-containerd-{CID[i]}.scope"
            v2_cgroup(ctr, current=c.current, max_=limit, anon=c.current)
            write(ctr / "memory.pressure", _psi(c.some, c.full))
    else:
        mem = cg / "memory"
        v1_cgroup(mem, usage=sum(c.current for c in containers))
        v1_cgroup(mem / "kubepods", usage=sum(c.current for c in containers))
        v1_cgroup(mem / "kubepods/burstable", usage=sum(c.current for c in containers))
        for i, c in enumerate(containers, start=1):
            pod = mem / f"kubepods/burstable/pod0000000{i}-0000-4000-8000-000000000000"
            lim = {} if c.limit is None else {"limit": c.limit}
            v1_cgroup(pod, usage=c.current, rss=c.current, **lim)
            v1_cgroup(pod / CID[i], usage=c.current, rss=c.current, failcnt=40, **lim)
    return HostPaths(procfs=proc, sysfs=root / "sys", kmsg=root / "kmsg")


def _run(
    paths: HostPaths, *, kswapd_per_step: int, direct_per_step: int
) -> tuple[dict[str, set[str]], list[NodeSnapshot]]:
    """Sample the host every STEP seconds of snapshot time, the reclaim counters rising by
    the given pages a step, through the default runbook; the rules that fired, by the keys of
    their targets, and the snapshots."""
    engine = RuleEngine(rules=load_rules([DEFAULT_RULES]).rules)
    sampler = Sampler(config=SamplerConfig(paths=paths, node_name="gpu-1"))
    fired: dict[str, set[str]] = {}
    snaps = []
    try:
        for i in range(STEPS):
            write(
                paths.proc("vmstat"),
                _vmstat(kswapd=10_000 + i * kswapd_per_step, direct=500 + i * direct_per_step),
            )
            snap = dataclasses.replace(sampler.sample_once(), timestamp=1_000_000.0 + i * STEP)
            snaps.append(snap)
            for f in engine.evaluate(snap, global_dry_run=True):
                if f.kind == "firing":
                    fired.setdefault(f.rule, set()).add(f.target)
    finally:
        sampler.close()
    return fired, snaps


def _value(engine_snap: NodeSnapshot, history_snaps: list[NodeSnapshot], name: str) -> float | None:
    from nodeguard.rules.signals import History

    history = History()
    for s in history_snaps:
        history.observe(s)
    sig = SIGNALS[name]
    return sig.fn(engine_snap, history, targets(engine_snap, sig.scope)[0])


def test_one_container_thrashing_at_its_own_limit_is_no_node_pressure(tmp_path: Path) -> None:
    """Node PSI full 30 %, all of it one v2 container's at its own 2 GiB limit (its full 30 %),
    70 % of the node free, no direct reclaim: the node rule does not act (today's rule cordons
    and evicts other pods); the container rule records, for that container only."""
    paths = _host(
        tmp_path,
        available=int(32 * GiB * 0.7),
        node_psi=(35.0, 30.0),
        containers=[
            Container(current=2 * GiB, limit=2 * GiB, full=30.0, some=35.0),
            Container(current=1 * GiB, limit=4 * GiB, full=0.0, some=0.2),
            Container(current=3 * GiB, limit=None, full=0.1, some=0.5),
        ],
    )
    fired, snaps = _run(paths, kswapd_per_step=0, direct_per_step=0)
    assert "memory-pressure-high" not in fired
    assert fired == {
        "container-thrashing-at-limit": {f"00000001-0000-4000-8000-000000000000/{CID[1]}"}
    }
    last = snaps[-1]
    assert _value(last, snaps, "node_psi_full_avg10") == pytest.approx(0.30)
    # What is outside: the largest stall of a container not at its limit, 0.1 % of 30 %.
    assert _value(last, snaps, "node_memory_stall_outside_limits_ratio") == pytest.approx(
        0.001 / 0.30
    )
    assert _value(last, snaps, "node_direct_reclaim_bytes_per_second") == 0.0


def test_real_node_pressure_many_cgroups_and_direct_reclaim_acts(tmp_path: Path) -> None:
    """Node PSI full 30 %, six containers none at its limit each stalling 20 %, direct reclaim
    scanning 1,000 pages every 5 s: node pressure, and the node rule acts."""
    paths = _host(
        tmp_path,
        available=int(32 * GiB * 0.08),
        node_psi=(45.0, 30.0),
        containers=[Container(current=4 * GiB, limit=8 * GiB, full=20.0, some=30.0)] * 6,
    )
    fired, snaps = _run(paths, kswapd_per_step=5_000, direct_per_step=1_000)
    assert fired.get("memory-pressure-high") == {"gpu-1"}
    assert "container-thrashing-at-limit" not in fired
    last = snaps[-1]
    # (30 % - 0 explained) / 30 %: nothing explains it.
    assert _value(last, snaps, "node_memory_stall_outside_limits_ratio") == 1.0
    assert _value(last, snaps, "node_direct_reclaim_bytes_per_second") == pytest.approx(
        1_000 * 4096 / STEP
    )


@pytest.mark.parametrize(
    ("what", "node_psi"),
    [
        # kswapd drops page cache in the background: tasks stall some, never all at once.
        ("some, no full", (20.0, 0.0)),
        # Refaults of page cache stall everyone (full 15 %), but kswapd alone keeps the node's
        # free memory above its watermarks: no allocation had to reclaim for itself.
        ("full from refaults, kswapd keeps up", (25.0, 15.0)),
    ],
)
def test_page_cache_reclaim_by_kswapd_alone_is_not_node_pressure(
    tmp_path: Path, what: str, node_psi: tuple[float, float]
) -> None:
    """The look-alike: page cache the kernel reclaims (kswapd scanning 50,000 pages every 5 s,
    no direct reclaim), containers stalling but none at its limit: no node action."""
    paths = _host(
        tmp_path,
        available=int(32 * GiB * 0.30),
        node_psi=node_psi,
        containers=[Container(current=4 * GiB, limit=None, full=node_psi[1], some=5.0)] * 4,
    )
    fired, snaps = _run(paths, kswapd_per_step=50_000, direct_per_step=0)
    assert fired == {}, what
    assert _value(snaps[-1], snaps, "node_direct_reclaim_bytes_per_second") == 0.0


def test_v1_a_container_at_its_limit_leaves_the_node_stall_unexplained_so_no_action(
    tmp_path: Path,
) -> None:
    """cgroup v1 has no per-cgroup PSI: with a container at its own limit (memory.failcnt
    counting) the share outside limits is unknown and the node does not act on it, even with
    direct reclaim (1,000 pages every 5 s: above the rule's 256 KiB/s floor); with none at its
    limit, all of the node's stall is outside (1.0)."""
    at_limit = _host(
        tmp_path / "a",
        available=int(32 * GiB * 0.7),
        node_psi=(35.0, 30.0),
        containers=[
            Container(current=2 * GiB, limit=2 * GiB, full=0, some=0),
            Container(current=1 * GiB, limit=4 * GiB, full=0, some=0),
        ],
        version=1,
    )
    fired, snaps = _run(at_limit, kswapd_per_step=0, direct_per_step=1_000)
    assert snaps[-1].cgroup_version == 1
    assert _value(snaps[-1], snaps, "node_memory_stall_outside_limits_ratio") is None
    assert _value(snaps[-1], snaps, "container_psi_full_avg10") is None
    assert "memory-pressure-high" not in fired
    assert "container-thrashing-at-limit" not in fired  # no v1 PSI: v2 only, as documented
    below = _host(
        tmp_path / "b",
        available=int(32 * GiB * 0.08),
        node_psi=(35.0, 30.0),
        containers=[Container(current=1 * GiB, limit=4 * GiB, full=0, some=0)],
        version=1,
    )
    fired, snaps = _run(below, kswapd_per_step=0, direct_per_step=1_000)
    assert _value(snaps[-1], snaps, "node_memory_stall_outside_limits_ratio") == 1.0
    assert fired.get("memory-pressure-high") == {"gpu-1"}


# -- "at its own limit" needs the limit to be the cause (issue 21 review) ----------------------
_CACHE_FULL_V2 = (  # 4 GiB: 3.5 GiB of page cache, 0.5 GiB of anon (a data loader)
    "anon 536870912\nfile 3758096384\nkernel 1048576\nshmem 0\n"
    "active_anon 536870912\ninactive_anon 0\nactive_file 1879048192\n"
    "inactive_file 1879048192\nunevictable 0\n"
)


def test_node_reclaim_with_page_cache_full_limits_still_acts(tmp_path: Path) -> None:
    """Six containers at their 4 GiB limit by usage, 3.5 GiB of it page cache (a data loader
    re-reading its dataset: cgroup-v2.rst "memory.max", the cache fills the limit and reclaim
    takes it back), the node short (8 % available), direct reclaim in /proc/vmstat (global
    reclaim only: mm/vmscan.c ``if (!cgroup_reclaim(sc))``) and the six stalling in it: the
    stall is the node's, not explained by their limits (before: share 0.0, no action)."""
    paths = _host(
        tmp_path,
        available=int(32 * GiB * 0.08),  # 8 %: node-memory-low (5 %) does not fire
        node_psi=(45.0, 30.0),
        containers=[Container(current=4 * GiB, limit=4 * GiB, full=30.0, some=40.0)] * 6,
    )
    cg = paths.sysfs / "fs/cgroup"
    for d in [*cg.rglob("cri-containerd-*.scope"), *cg.rglob("kubepods-burstable-pod*.slice")]:
        write(d / "memory.stat", _CACHE_FULL_V2)
    fired, snaps = _run(paths, kswapd_per_step=50_000, direct_per_step=20_000)
    last = snaps[-1]
    assert _value(last, snaps, "container_usage_limit_ratio") == 1.0
    # memory.current less the file LRU: 0.5 of 4 GiB.
    assert _value(last, snaps, "container_unreclaimable_limit_ratio") == 0.125
    # Nothing at its own limit explains any of it: 30 % of 30 % outside.
    assert _value(last, snaps, "node_memory_stall_outside_limits_ratio") == 1.0
    assert fired.get("memory-pressure-high") == {"gpu-1"}


def test_v1_page_cache_full_limits_leave_the_node_stall_known(tmp_path: Path) -> None:
    """cgroup v1, the same data loaders (usage at the limit, 3.5 of 4 GiB page cache, v1's
    unreclaimable the anon and unevictable lists): not at their own limit, so the share is
    known (1.0, v1 has no per-cgroup PSI) and the node acts on its own direct reclaim. Before,
    any such container made the share ``None``: the rule was off on v1 nodes with data
    loaders."""
    paths = _host(
        tmp_path,
        available=int(32 * GiB * 0.08),
        node_psi=(45.0, 30.0),
        containers=[Container(current=4 * GiB, limit=4 * GiB, full=0, some=0)] * 3,
        version=1,
    )
    mem = paths.sysfs / "fs/cgroup/memory/kubepods/burstable"
    for pod in mem.glob("pod*"):
        for d in (pod, *[c for c in pod.iterdir() if c.is_dir()]):
            v1_cgroup(
                d,
                usage=4 * GiB,
                limit=4 * GiB,
                rss=GiB // 2,
                cache=3 * GiB + GiB // 2,
                inactive_file=GiB,
                failcnt=40,
            )
    fired, snaps = _run(paths, kswapd_per_step=50_000, direct_per_step=20_000)
    assert snaps[-1].cgroup_version == 1
    assert _value(snaps[-1], snaps, "container_unreclaimable_limit_ratio") == 0.125
    assert _value(snaps[-1], snaps, "node_memory_stall_outside_limits_ratio") == 1.0
    assert fired.get("memory-pressure-high") == {"gpu-1"}


def _throttle(paths: HostPaths, *, high: int, stat: str | None = None) -> None:
    """Pod 1 and its container throttled at ``memory.high`` (MemoryQoS): the bound written,
    ``memory.events`` ``high`` counting."""
    cg = paths.sysfs / "fs/cgroup"
    throttled = next(cg.rglob("kubepods-burstable-pod00000001*.slice"))
    for d in (throttled, next(throttled.glob("cri-containerd-*.scope"))):
        write(d / "memory.high", f"{high}\n")
        write(d / "memory.events", "low 0\nhigh 981234\nmax 0\noom 0\noom_kill 0\n")
        if stat is not None:
            write(d / "memory.stat", stat)


def test_container_throttled_at_memory_high_is_not_node_pressure(tmp_path: Path) -> None:
    """Kubernetes MemoryQoS (and any memory.high): the kubelet writes memory.high below
    memory.max (request + memoryThrottlingFactor 0.9 x (limit - request), KEP-2570); a task
    over memory.high is throttled and reclaims in its own cgroup (mm/memcontrol.c
    ``mem_cgroup_handle_over_high()``, a PSI memstall). Node PSI full 30 %, all of it that
    container's, at 75 % of its memory.max but at its 3 GiB memory.high, 70 % of the node free,
    a trickle of direct reclaim (50 pages every 5 s): the stall is the container's (before:
    share 1.0, the node cordoned and other pods evicted, freeing nothing for it)."""
    paths = _host(
        tmp_path,
        available=int(32 * GiB * 0.7),
        node_psi=(35.0, 30.0),
        containers=[
            Container(current=3 * GiB, limit=4 * GiB, full=30.0, some=35.0),
            Container(current=1 * GiB, limit=4 * GiB, full=0.0, some=0.2),
        ],
    )
    _throttle(paths, high=3 * GiB)
    fired, snaps = _run(paths, kswapd_per_step=0, direct_per_step=50)
    (pod,) = [p for p in snaps[-1].pods if p.uid.startswith("00000001")]
    assert pod.memory.high_bytes == 3 * GiB and pod.containers[0].memory.high_bytes == 3 * GiB
    # What is outside: the other container's 0 % of 30 %.
    assert _value(snaps[-1], snaps, "node_memory_stall_outside_limits_ratio") == 0.0
    assert "memory-pressure-high" not in fired


def test_a_trickle_of_direct_reclaim_is_not_node_pressure(tmp_path: Path) -> None:
    """The direct-reclaim floor (256 KiB/s, rules/default.yaml): node PSI full 30 % outside
    any limit but direct reclaim at 50 pages every 5 s (40 KiB/s: high-order allocations,
    khugepaged on kernels before 6.2) does not act; 1,000 pages every 5 s (800 KiB/s,
    test_real_node_pressure_many_cgroups_and_direct_reclaim_acts) does."""
    paths = _host(
        tmp_path,
        available=int(32 * GiB * 0.7),
        node_psi=(35.0, 30.0),
        containers=[Container(current=1 * GiB, limit=4 * GiB, full=30.0, some=35.0)] * 2,
    )
    fired, snaps = _run(paths, kswapd_per_step=0, direct_per_step=50)
    assert _value(snaps[-1], snaps, "node_memory_stall_outside_limits_ratio") == 1.0
    assert _value(snaps[-1], snaps, "node_direct_reclaim_bytes_per_second") == pytest.approx(
        50 * 4096 / STEP
    )
    assert "memory-pressure-high" not in fired


def test_over_memory_high_by_page_cache_is_not_at_its_own_limit(tmp_path: Path) -> None:
    """The look-alike on the memory.high side: a container at its 3 GiB memory.high whose
    memory is mostly page cache (reclaim at memory.high drops it; the throttling sleep is only
    for what reclaim could not take back, mm/memcontrol.c ``calculate_high_delay()``) is not
    at its own limit: its stall, with node direct reclaim, is the node's."""
    paths = _host(
        tmp_path,
        available=int(32 * GiB * 0.08),
        node_psi=(45.0, 30.0),
        containers=[
            Container(current=3 * GiB, limit=4 * GiB, full=30.0, some=35.0),
            Container(current=1 * GiB, limit=4 * GiB, full=0.0, some=0.2),
        ],
    )
    cache = (
        "anon 268435456\nfile 2952790016\nkernel 1048576\nshmem 0\n"
        "active_anon 268435456\ninactive_anon 0\nactive_file 1476395008\n"
        "inactive_file 1476395008\nunevictable 0\n"
    )
    _throttle(paths, high=3 * GiB, stat=cache)
    fired, snaps = _run(paths, kswapd_per_step=50_000, direct_per_step=20_000)
    assert _value(snaps[-1], snaps, "node_memory_stall_outside_limits_ratio") == 1.0
    assert fired.get("memory-pressure-high") == {"gpu-1"}
