"""``/proc/vmstat``'s reclaim counters in each kernel's form, the collector on the fixture
trees, and the direct-reclaim rate (:mod:`nodeguard.sources.vmstat`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nodeguard.rules.signals import RECLAIM_WINDOW, counter_rate
from nodeguard.sampling.sampler import Sampler, SamplerConfig
from nodeguard.snapshot import VmStat
from nodeguard.sources import NoDataError
from nodeguard.sources.vmstat import parse_vmstat
from tests.fixtures.make_hosts import VMSTAT_6X, VMSTAT_310, VMSTAT_415
from tests.support.hosts import HOSTS, exposition, fixture_snapshot


@pytest.mark.parametrize(
    ("text", "want"),
    [
        # 3.10 (RHEL 7) and every kernel before 4.8: scan and steal split by zone, one
        # allocstall; pgscan_direct_throttle (7) is not a zone.
        (
            VMSTAT_310,
            VmStat(
                pgscan_kswapd=5300,
                pgscan_direct=2100,
                pgsteal_kswapd=5050,
                pgsteal_direct=1580,
                allocstall=42,
                page_size_bytes=4096,
            ),
        ),
        # 4.15 (Ubuntu 18.04): node LRUs, one line each; allocstall by zone.
        (
            VMSTAT_415,
            VmStat(
                pgscan_kswapd=7000,
                pgscan_direct=1200,
                pgsteal_kswapd=6500,
                pgsteal_direct=1000,
                allocstall=33,
                page_size_bytes=4096,
            ),
        ),
        # 6.x: allocstall_device too; pgscan_khugepaged, pgscan_anon/_file are not read.
        (
            VMSTAT_6X,
            VmStat(
                pgscan_kswapd=8000,
                pgscan_direct=900,
                pgsteal_kswapd=5000,
                pgsteal_direct=700,
                allocstall=15,
                page_size_bytes=4096,
            ),
        ),
    ],
    ids=["3.10-zoned", "4.15", "6.x"],
)
def test_the_reclaim_counters_of_each_kernel_form(text: str, want: VmStat) -> None:
    assert parse_vmstat(text, page_size=4096) == want


def test_counters_a_kernel_does_not_print_are_absent_not_zero() -> None:
    # A kernel with only some of them (a trimmed config): the rest are None.
    got = parse_vmstat("nr_free_pages 10\npgscan_kswapd 5\nallocstall_normal 2\n", page_size=65536)
    assert got == VmStat(
        pgscan_kswapd=5,
        pgscan_direct=None,
        pgsteal_kswapd=None,
        pgsteal_direct=None,
        allocstall=2,
        page_size_bytes=65536,
    )
    # CONFIG_VM_EVENT_COUNTERS=n: the node counters only, no event at all: no data.
    with pytest.raises(NoDataError):
        parse_vmstat("nr_free_pages 10\nnr_inactive_file 3\n", page_size=4096)


@pytest.mark.parametrize(
    ("host", "direct_pages"),
    [("v1-rhel7-3.10", 2100), ("v1-ubuntu-4.15", 1200), ("v2-systemd-containerd", 900)],
)
def test_the_collector_on_the_fixture_hosts(host: str, direct_pages: int) -> None:
    snap = fixture_snapshot(host)
    assert snap.vmstat is not None and snap.vmstat.pgscan_direct == direct_pages
    status = snap.collector("vmstat")
    assert status is not None and status.success and status.available
    page = snap.vmstat.page_size_bytes
    series = [line for line in exposition(snap).splitlines() if "pgscan_bytes_total{" in line]
    direct = [line for line in series if 'reclaimer="direct"' in line]
    assert len(direct) == 1 and float(direct[0].split()[-1]) == direct_pages * page


def test_no_vmstat_file_is_no_data(tmp_path: Path) -> None:
    shutil.copytree(HOSTS / "v2-systemd-containerd", tmp_path / "h")
    (tmp_path / "h/proc/vmstat").unlink()
    from tests.support.hosts import host_paths

    paths = host_paths("v2-systemd-containerd")
    paths = type(paths)(procfs=tmp_path / "h/proc", sysfs=tmp_path / "h/sys", kmsg=paths.kmsg)
    sampler = Sampler(config=SamplerConfig(paths=paths, node_name="n"))
    try:
        snap = sampler.sample_once()
    finally:
        sampler.close()
    assert snap.vmstat is None
    status = snap.collector("vmstat")
    assert status is not None and status.success and not status.available
    assert "nodeguard_node_vmstat_" not in exposition(snap)


def test_counter_rate() -> None:
    # 1,000 bytes a second over the window; points older than the window do not count.
    points = [(0.0, 0), (100.0, 10**9), *((100.0 + 5 * i, 10**9 + 5000 * i) for i in range(7))]
    assert counter_rate(points, window=RECLAIM_WINDOW) == pytest.approx(1000.0)
    assert counter_rate([(100.0, 7), (105.0, 7)], window=RECLAIM_WINDOW) == 0.0
    # A reset (the counter below the one before) counts from 0.
    assert counter_rate([(0.0, 100), (5.0, 150), (10.0, 20)], window=30) == pytest.approx(7.0)
    assert counter_rate([(0.0, 100)], window=30) is None  # one point: no rate yet
    assert counter_rate([], window=30) is None
