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
from nodeguard.sampler import Sampler, SamplerConfig
from nodeguard.snapshot import NodeSnapshot
from tests.fixtures.make_hosts import CID, VMSTAT_6X, proc_tree, v1_cgroup, v2_cgroup, write

GiB = 1 << 30
MiB = 1 << 20
DEFAULT_RULES = Path(__file__).resolve().parents[1] / "rules" / "default.yaml"
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
    direct reclaim; with none at its limit, all of the node's stall is outside (1.0)."""
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
    fired, snaps = _run(at_limit, kswapd_per_step=0, direct_per_step=100)
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
    fired, snaps = _run(below, kswapd_per_step=0, direct_per_step=100)
    assert _value(snaps[-1], snaps, "node_memory_stall_outside_limits_ratio") == 1.0
    assert fired.get("memory-pressure-high") == {"gpu-1"}
