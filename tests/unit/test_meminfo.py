"""/proc/meminfo parsing and the derived breakdown, on strings and fixture trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeguard.sources import NoDataError
from nodeguard.sources.meminfo import derive_meminfo, parse_meminfo, read_meminfo
from tests.support.hosts import host_paths

GiB = 1 << 30
MiB = 1 << 20

SAMPLE = """MemTotal:       16384000 kB
MemFree:         1024000 kB
MemAvailable:    4096000 kB
Buffers:          102400 kB
Cached:          2048000 kB
Shmem:            204800 kB
Active(file):    1000000 kB
Inactive(file):   900000 kB
SReclaimable:     300000 kB
SUnreclaim:      5000000 kB
HugePages_Total:      16
HugePages_Free:        4
Hugepagesize:       2048 kB

"""


def test_kb_lines_are_bytes_and_hugepages_are_counts() -> None:
    fields, counts = parse_meminfo(SAMPLE)
    assert fields["MemTotal"] == 16384000 * 1024
    assert fields["Hugepagesize"] == 2048 * 1024
    assert counts == {"HugePages_Total": 16, "HugePages_Free": 4}
    assert "HugePages_Total" not in fields


def test_blank_and_malformed_lines_are_skipped() -> None:
    text = "MemTotal: 100 kB\n\n   \nGarbage line\nMemFree: abc kB\nWeird: 1 MB\nA: 1 kB extra\n"
    fields, counts = parse_meminfo(text)
    assert fields == {"MemTotal": 102400}
    assert counts == {}


def test_derived_values() -> None:
    mem = derive_meminfo(*parse_meminfo(SAMPLE))
    assert mem.total_bytes == 16384000 * 1024
    assert mem.available_bytes == 4096000 * 1024
    assert not mem.available_estimated
    # 16 default-size (2 MiB) huge pages, no Hugetlb: line (before 4.16): a 32 MiB pool.
    assert mem.hugetlb_bytes == 32 * MiB
    assert mem.usable_bytes == 16384000 * 1024 - 32 * MiB
    assert mem.used_bytes == (16384000 - 4096000) * 1024 - 32 * MiB
    assert mem.page_cache_bytes == (1000000 + 900000) * 1024
    assert mem.slab_reclaimable_bytes == 300000 * 1024
    assert mem.slab_unreclaimable_bytes == 5000000 * 1024


def test_available_estimated_when_absent() -> None:
    text = "MemTotal: 1000 kB\nMemFree: 300 kB\nBuffers: 100 kB\nCached: 200 kB\n"
    mem = derive_meminfo(*parse_meminfo(text))
    assert mem.available_estimated
    assert mem.available_bytes == 600 * 1024
    assert mem.used_bytes == 400 * 1024


def test_available_estimate_capped_at_total() -> None:
    text = "MemTotal: 1000 kB\nMemFree: 900 kB\nBuffers: 100 kB\nCached: 200 kB\n"
    mem = derive_meminfo(*parse_meminfo(text))
    assert mem.available_bytes == 1000 * 1024
    assert mem.used_bytes == 0


def test_available_zero_while_free_is_not_is_estimated() -> None:
    text = "MemTotal: 1000 kB\nMemFree: 300 kB\nMemAvailable: 0 kB\nCached: 100 kB\n"
    mem = derive_meminfo(*parse_meminfo(text))
    assert mem.available_estimated
    assert mem.available_bytes == 400 * 1024


def test_available_zero_near_oom_is_believed() -> None:
    # Near an OOM the kernel clamps MemAvailable at 0 while MemFree holds the watermark
    # reserves and Cached is mostly tmpfs: the 0 is the truth, not a reason to estimate.
    text = (
        "MemTotal: 16000000 kB\nMemFree: 200000 kB\nMemAvailable: 0 kB\n"
        "Buffers: 1000 kB\nCached: 5000000 kB\nShmem: 4900000 kB\n"
    )
    mem = derive_meminfo(*parse_meminfo(text))
    assert not mem.available_estimated
    assert mem.available_bytes == 0
    assert mem.used_bytes == 16000000 * 1024


def test_estimate_leaves_out_shmem() -> None:
    text = "MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 10 kB\nCached: 500 kB\nShmem: 400 kB\n"
    mem = derive_meminfo(*parse_meminfo(text))
    assert mem.available_estimated
    assert mem.available_bytes == (100 + 10 + 100) * 1024


def test_available_zero_with_zero_free_is_believed() -> None:
    text = "MemTotal: 1000 kB\nMemFree: 0 kB\nMemAvailable: 0 kB\n"
    mem = derive_meminfo(*parse_meminfo(text))
    assert not mem.available_estimated
    assert mem.available_bytes == 0


def test_page_cache_falls_back_without_file_lru() -> None:
    text = "MemTotal: 1000 kB\nCached: 300 kB\nBuffers: 50 kB\nShmem: 100 kB\n"
    mem = derive_meminfo(*parse_meminfo(text))
    assert mem.page_cache_bytes == 250 * 1024
    assert mem.available_bytes is None
    assert mem.used_bytes is None


def test_missing_memtotal_is_no_data() -> None:
    with pytest.raises(NoDataError):
        derive_meminfo(*parse_meminfo("MemFree: 1 kB\n"))


def test_fixture_with_trailing_blank_line_and_hugepages() -> None:
    mem = read_meminfo(paths=host_paths("v2-systemd-containerd"))
    assert mem.total_bytes == 32 * GiB
    assert mem.available_bytes == 6 * GiB
    # Used is usable - available: the 16 MiB pool (8 x 2 MiB) is its own line.
    assert mem.hugetlb_bytes == 16 * MiB
    assert mem.usable_bytes == 32 * GiB - 16 * MiB
    assert mem.used_bytes == 26 * GiB - 16 * MiB
    assert mem.page_cache_bytes == 2560 * MiB
    assert mem.slab_unreclaimable_bytes == 10 * GiB
    assert mem.page_counts["HugePages_Total"] == 8
    assert mem.fields["Hugetlb"] == 16384 * 1024


def test_fixture_without_memavailable() -> None:
    mem = read_meminfo(paths=host_paths("v1-cgroupfs-docker"))
    assert mem.available_estimated
    assert mem.available_bytes == 2 * GiB + 256 * MiB + 3 * GiB - 512 * MiB  # Shmem out
    assert "MemAvailable" not in mem.fields


def test_missing_file_is_a_failure_not_no_data(tmp_path: Path) -> None:
    # Every Linux procfs has meminfo: its absence is a wrong --path.procfs, to alert on.
    from nodeguard.collectors.base import Parts, run
    from nodeguard.collectors.meminfo import MeminfoCollector
    from nodeguard.paths import HostPaths
    from nodeguard.sampling.sampler import SamplerConfig

    config = SamplerConfig(paths=HostPaths(procfs=tmp_path), node_name="n")
    parts = Parts()
    status = run(MeminfoCollector(settings=config), parts)
    assert parts.meminfo is None
    assert not status.success
    assert "FileNotFoundError" in (status.error or "")
    (tmp_path / "meminfo").write_text("MemFree: 1 kB\n")
    with pytest.raises(ValueError, match="no MemTotal"):
        read_meminfo(paths=HostPaths(procfs=tmp_path))
