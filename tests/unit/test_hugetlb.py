"""Usable memory: MemTotal less what can never become MemAvailable (the persistent hugetlb pool
of every page size, HardwareCorrupted), in every meminfo form the kernel writes, and the node
rules on a node whose RAM is mostly huge pages.

The right values come from mm/hugetlb.c ``hugetlb_report_meminfo`` (``Hugetlb:`` is the sum over
every size of size x nr_huge_pages, surplus included, since Linux 4.16; ``HugePages_*`` are the
default size's), ``nr_hugepages_show_common`` / ``surplus_hugepages`` in sysfs, and
Documentation/admin-guide/mm/hugetlbpage.rst (surplus pages go back to the normal page pool).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from nodeguard.kube.objects import hugepages_bytes, node_meta
from nodeguard.paths import HostPaths
from nodeguard.rules.engine import RuleEngine
from nodeguard.rules.load import load_rules
from nodeguard.rules.signals import SIGNALS, History, targets
from nodeguard.sampling.sampler import Sampler, SamplerConfig, node_hot
from nodeguard.snapshot import MemInfo, NodeSnapshot
from nodeguard.sources.hugepages import parse_pool_dir_name, read_hugepage_pools
from nodeguard.sources.meminfo import derive_meminfo, parse_meminfo, read_meminfo
from tests.support.hosts import HOSTS
from tests.support.hugepages import HUGE_NODE, hugepages, meminfo_text

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
ROOT = Path(__file__).resolve().parents[2]


def mem(text: str) -> MemInfo:
    return derive_meminfo(*parse_meminfo(text))


def sysfs_pools(root: Path, pools: dict[int, tuple[int, int]]) -> Path:
    """``<root>/kernel/mm/hugepages/hugepages-<kB>kB/{nr,surplus}_hugepages`` for each size (kB)
    -> (nr_hugepages, surplus_hugepages); returns ``root``."""
    for size_kb, (nr, surplus) in pools.items():
        d = root / "kernel" / "mm" / "hugepages" / f"hugepages-{size_kb}kB"
        d.mkdir(parents=True)
        (d / "nr_hugepages").write_text(f"{nr}\n")
        (d / "surplus_hugepages").write_text(f"{surplus}\n")
        (d / "free_hugepages").write_text(f"{nr}\n")
    return root


def pool_host(tmp_path: Path, *, meminfo: str, pools: dict[int, tuple[int, int]]) -> HostPaths:
    """``<tmp_path>/proc/meminfo`` of ``meminfo`` and the sysfs ``pools`` of
    :func:`sysfs_pools` under ``<tmp_path>/sys``."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text(meminfo)
    return HostPaths(procfs=proc, sysfs=sysfs_pools(tmp_path / "sys", pools))


# -- the meminfo forms -----------------------------------------------------------------------
def test_no_huge_pages_at_all_usable_is_total() -> None:
    # CONFIG_HUGETLB_PAGE off: no huge page line at all.
    m = mem(meminfo_text(MemTotal=16 * MiB, MemFree=4 * MiB, MemAvailable=8 * MiB))
    assert m.hugetlb_bytes == 0
    assert m.hardware_corrupted_bytes is None
    assert m.usable_bytes == m.total_bytes == 16 * GiB
    assert m.used_bytes == 8 * GiB
    # A kernel with the lines and an empty pool: the same.
    empty = meminfo_text(
        MemTotal=16 * MiB,
        MemAvailable=8 * MiB,
        **hugepages(total=0, free=0, hugetlb_kb=0),
    )
    assert mem(empty).usable_bytes == 16 * GiB


def test_linux_4_16_hugetlb_line_sums_a_1gi_and_a_2mi_pool() -> None:
    # default_hugepagesz=2M hugepages=1024 hugepagesz=1G hugepages=8: HugePages_* are the 2 MiB
    # pool only (2 GiB); Hugetlb: is both, 2 GiB + 8 GiB.
    m = mem(
        meminfo_text(
            MemTotal=256 * MiB,
            MemFree=100 * MiB,
            MemAvailable=120 * MiB,
            **hugepages(total=1024, free=1024, hugetlb_kb=10 * MiB),
        )
    )
    assert m.hugetlb_bytes == 10 * GiB
    assert m.usable_bytes == 246 * GiB
    assert m.used_bytes == (246 - 120) * GiB


def test_surplus_pages_are_regular_memory_in_use_not_the_pool() -> None:
    # nr_hugepages=512, nr_overcommit_hugepages>0 and 100 surplus pages in use: Hugetlb: and
    # HugePages_Total count them (mm/hugetlb.c), but they came from the normal page pool and go
    # back to it once unused (hugetlbpage.rst): only the 512 persistent pages are carved out.
    m = mem(
        meminfo_text(
            MemTotal=64 * MiB,
            MemAvailable=20 * MiB,
            **hugepages(total=612, free=0, surp=100, hugetlb_kb=612 * 2048),
        )
    )
    assert m.hugetlb_bytes == 1 * GiB
    assert m.usable_bytes == 63 * GiB


def test_before_4_16_only_the_default_size_lines() -> None:
    # Ubuntu 18.04 (4.15), RHEL 7 (3.10): no Hugetlb: line; the pool is HugePages_Total minus
    # HugePages_Surp, times Hugepagesize.
    text = meminfo_text(
        MemTotal=64 * MiB,
        MemAvailable=20 * MiB,
        **hugepages(total=520, free=8, surp=8),
    )
    assert "Hugetlb" not in parse_meminfo(text)[0]
    m = mem(text)
    assert m.hugetlb_bytes == 512 * 2 * MiB
    assert m.usable_bytes == 63 * GiB


def test_before_4_16_the_other_sizes_come_from_sysfs(tmp_path: Path) -> None:
    # 4.15 with hugepagesz=1G hugepages=16 beside 512 default 2 MiB pages: meminfo shows only the
    # 2 MiB pool; /sys/kernel/mm/hugepages has both (the default size read from meminfo).
    text = meminfo_text(MemTotal=64 * MiB, MemAvailable=20 * MiB, **hugepages(total=512, free=512))
    paths = pool_host(tmp_path, meminfo=text, pools={2048: (512, 0), 1048576: (16, 0)})
    m = read_meminfo(paths=paths)
    assert m.hugetlb_bytes == 1 * GiB + 16 * GiB
    assert m.usable_bytes == 64 * GiB - 17 * GiB
    # Without a readable sysfs only the default size is known.
    m = read_meminfo(paths=HostPaths(procfs=paths.procfs, sysfs=tmp_path / "nowhere"))
    assert m.hugetlb_bytes == 1 * GiB


def test_4_16_another_sizes_surplus_comes_from_sysfs(tmp_path: Path) -> None:
    # default_hugepagesz=1G (4 pages) and 2 MiB pages overcommitted: 256 persistent + 256
    # surplus. Hugetlb: counts all 4 GiB + 1 GiB; meminfo's HugePages_Surp is the 1 GiB size's
    # (0); the 2 MiB size's 256 surplus pages are only in sysfs.
    pool = hugepages(total=4, free=0, size_kb=1048576, hugetlb_kb=5 * MiB)
    text = meminfo_text(MemTotal=64 * MiB, MemAvailable=20 * MiB, **pool)
    paths = pool_host(tmp_path, meminfo=text, pools={2048: (512, 256), 1048576: (4, 0)})
    m = read_meminfo(paths=paths)
    assert m.hugetlb_bytes == 4 * GiB + 256 * 2 * MiB
    assert m.usable_bytes == 64 * GiB - 4 * GiB - 512 * MiB


def test_hardware_corrupted_pages_never_come_back() -> None:
    # CONFIG_MEMORY_FAILURE: pages poisoned by an uncorrectable memory error stay in MemTotal
    # (totalram) and are never used again (mm/memory-failure.c).
    m = mem(
        meminfo_text(
            MemTotal=32 * MiB,
            MemAvailable=16 * MiB,
            HardwareCorrupted=8 * KiB,
            **hugepages(total=0, free=0, hugetlb_kb=0),
        )
    )
    assert m.hardware_corrupted_bytes == 8 * MiB
    assert m.usable_bytes == 32 * GiB - 8 * MiB


def test_estimated_available_is_capped_at_usable() -> None:
    # No MemAvailable (before 3.14): MemFree + Buffers + Cached - Shmem, which never holds a
    # huge page, at most usable.
    m = mem(
        meminfo_text(
            MemTotal=16 * MiB,
            MemFree=3 * MiB,
            Buffers=0,
            Cached=2 * MiB,
            **hugepages(total=6, free=6, size_kb=1048576),
        )
    )
    assert m.available_estimated and m.available_bytes == 5 * GiB
    assert m.usable_bytes == 10 * GiB
    big = meminfo_text(MemTotal=16 * MiB, MemFree=15 * MiB, Cached=4 * MiB, Hugetlb=4 * MiB)
    assert mem(big).available_bytes == 12 * GiB


def test_sysfs_pool_directories() -> None:
    assert parse_pool_dir_name("hugepages-2048kB") == 2 * MiB
    assert parse_pool_dir_name("hugepages-1048576kB") == GiB
    assert parse_pool_dir_name("hugepages-64kB") == 64 * KiB  # arm64 contiguous PTE pages
    for other in ("hugepages", "hugepages-kB", "hugepages-0kB", "hugepages-2MB", "demote"):
        assert parse_pool_dir_name(other) is None


def test_unreadable_sysfs_sizes_are_left_out(tmp_path: Path) -> None:
    sys = sysfs_pools(tmp_path, {2048: (10, 2)})
    bad = tmp_path / "kernel" / "mm" / "hugepages" / "hugepages-1048576kB"
    bad.mkdir()
    (bad / "nr_hugepages").write_text("not a number\n")
    pools = read_hugepage_pools(paths=HostPaths(sysfs=sys))
    assert pools is not None
    assert [(p.size_bytes, p.pages, p.surplus) for p in pools] == [(2 * MiB, 10, 2)]
    assert pools[0].persistent_bytes == 16 * MiB
    assert read_hugepage_pools(paths=HostPaths(sysfs=tmp_path / "absent")) is None


def test_another_nodes_usable_memory_from_its_capacity() -> None:
    # The kubelet reports MemTotal as capacity.memory and each pool as hugepages-<size>, and
    # takes them out of allocatable (pkg/kubelet/nodestatus/setters.go).
    node = {
        "metadata": {"name": "kubevirt-1"},
        "status": {
            "capacity": {"memory": "320Gi", "hugepages-1Gi": "256Gi", "hugepages-2Mi": "32Gi"},
            "allocatable": {"memory": "31Gi", "hugepages-1Gi": "256Gi", "hugepages-2Mi": "32Gi"},
        },
    }
    meta = node_meta(node)
    assert meta.capacity_hugepages_bytes == 288 * GiB
    assert meta.usable_memory_bytes == 32 * GiB
    assert hugepages_bytes({"memory": "1Gi", "cpu": "4"}) == 0
    assert node_meta({"status": {"capacity": {"memory": "64Gi"}}}).usable_memory_bytes == 64 * GiB
    assert node_meta({"status": {}}).usable_memory_bytes is None


def huge_node_host(tmp_path: Path, *, available_gib: int) -> HostPaths:
    """The v2-systemd-containerd fixture host with the meminfo of :data:`HUGE_NODE` (320 GiB,
    288 GiB of it 1 GiB huge pages) and ``available_gib`` GiB MemAvailable."""
    root = tmp_path / "host"
    shutil.copytree(HOSTS / "v2-systemd-containerd", root)
    (root / "proc" / "meminfo").write_text(
        meminfo_text(HUGE_NODE, MemAvailable=available_gib * MiB)
    )
    sysfs_pools(root / "sys", {2048: (0, 0), 1048576: (288, 0)})
    return HostPaths(procfs=root / "proc", sysfs=root / "sys", kmsg=root / "kmsg")


def sample(paths: HostPaths) -> NodeSnapshot:
    sampler = Sampler(config=SamplerConfig(paths=paths, node_name="kubevirt-1"))
    try:
        return sampler.sample_once()
    finally:
        sampler.close()


def node_memory_low() -> RuleEngine:
    rules = load_rules([ROOT / "rules" / "default.yaml"]).rules
    return RuleEngine(rules=[r for r in rules if r.name == "node-memory-low"])


def fired_after_a_minute(snap: NodeSnapshot) -> list[str]:
    engine = node_memory_low()
    fired = []
    for t in (0.0, 30.0, 61.0):
        at = dataclasses.replace(snap, timestamp=snap.timestamp + t)
        fired += [f.rule for f in engine.evaluate(at, global_dry_run=True)]
    return fired


def ratio(snap: NodeSnapshot, name: str) -> float | None:
    sig = SIGNALS[name]
    history = History()
    history.observe(snap)
    (target,) = targets(snap, sig.scope)
    return sig.fn(snap, history, target)


def test_an_idle_node_of_huge_pages_is_not_low(tmp_path: Path) -> None:
    # 14 GiB available: 4.4 % of MemTotal, 43.75 % of the 32 GiB that can ever be available.
    snap = sample(huge_node_host(tmp_path, available_gib=14))
    assert snap.meminfo is not None
    assert snap.meminfo.hugetlb_bytes == 288 * GiB
    assert snap.meminfo.usable_bytes == 32 * GiB
    assert ratio(snap, "node_memory_available_ratio") == pytest.approx(14 / 32)
    assert ratio(snap, "node_slab_unreclaimable_ratio") == pytest.approx(1 / 32)
    assert ratio(snap, "node_page_cache_ratio") == pytest.approx(2 / 32)
    assert fired_after_a_minute(snap) == []
    assert not node_hot(snap, share=0.10)  # and the sampler does not focus on it


def test_a_node_of_huge_pages_low_on_regular_memory_still_fires(tmp_path: Path) -> None:
    # The look-alike: the same node with 1 GiB available, 3.125 % of its usable memory.
    snap = sample(huge_node_host(tmp_path, available_gib=1))
    assert ratio(snap, "node_memory_available_ratio") == pytest.approx(1 / 32)
    assert fired_after_a_minute(snap) == ["node-memory-low"]
    assert node_hot(snap, share=0.10)
