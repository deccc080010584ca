"""On the real kernel (cgroup v1 on CI): a process thrashing at its own 48 MiB limit, its page
cache reclaimed inside its cgroup on every read, is no node pressure. Its cgroup hits the limit
over and over (``memory.failcnt``), while ``/proc/vmstat`` ``pgscan_direct`` stays where it was
(reclaim at a cgroup's limit is cgroup reclaim, which mm/vmscan.c does not count there), and
the shipped ``memory-pressure-high`` rule never fires on the node."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

import pytest

from nodeguard.paths import HostPaths
from nodeguard.rules.engine import RuleEngine
from nodeguard.rules.load import load_rules
from nodeguard.sampler import Sampler, SamplerConfig
from nodeguard.snapshot import CgroupMemory, NodeSnapshot
from nodeguard.sources.vmstat import read_vmstat
from nodeguard.stall import at_own_limit
from tests.kernel_cgroup import kubelet_cgroup, process_in, writable_memory_controller

MiB = 1 << 20
DEFAULT_RULES = Path(__file__).resolve().parents[1] / "rules" / "default.yaml"

pytestmark = pytest.mark.kernel


@pytest.fixture
def require_kernel() -> None:
    if writable_memory_controller() is None:
        pytest.skip("needs root and a writable cgroup memory controller (CI has both)")


def _thrasher(big: Path) -> str:
    """36 MiB of anonymous memory held, then a 200 MiB file read over and over through the
    rest of a 48 MiB limit: every read reclaims page cache inside the cgroup."""
    return (
        "input()\n"
        "import os\n"
        "b = bytearray(36 << 20); b[::4096] = b'x' * len(b[::4096])\n"
        "while True:\n"
        f"    fd = os.open({str(big)!r}, os.O_RDONLY)\n"
        "    while os.read(fd, 1 << 20): pass\n"
        "    os.close(fd)\n"
    )


def _memory(snap: NodeSnapshot, cid: str) -> CgroupMemory | None:
    return next((c.memory for _, c in snap.containers() if c.container_id == cid), None)


def test_a_hog_thrashing_at_its_own_limit_does_not_trip_the_node_rule(
    require_kernel: None, tmp_path: Path
) -> None:
    big = tmp_path / "big"
    with open(big, "wb") as f:
        for _ in range(200):
            f.write(b"\x5a" * MiB)
        f.flush()
        os.fsync(f.fileno())
        # Out of the page cache, so that the hog's reads charge the pages to its own cgroup.
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    host = HostPaths()
    engine = RuleEngine(rules=load_rules([DEFAULT_RULES]).rules)
    sampler = Sampler(
        config=SamplerConfig(
            paths=host,
            node_name="n",
            collectors=frozenset({"meminfo", "pressure", "cgroups", "vmstat"}),
        )
    )
    before = read_vmstat(paths=host)
    fired: list[str] = []
    seen: list[CgroupMemory] = []
    try:
        with (
            kubelet_cgroup(limit_bytes=48 * MiB) as cg,
            process_in(cg, [sys.executable, "-c", _thrasher(big)]),
        ):
            # A minute and a quarter of snapshot time (the node rule's `for` is 1m), a real
            # sample every 0.4 s.
            for i in range(16):
                time.sleep(0.4)
                snap = dataclasses.replace(sampler.sample_once(), timestamp=1e6 + 5.0 * i)
                mem = _memory(snap, cg.container_id)
                if mem is not None:
                    seen.append(mem)
                fired += [f.rule for f in engine.evaluate(snap, global_dry_run=True)]
    finally:
        sampler.close()
    after = read_vmstat(paths=host)
    assert len(seen) == 16
    # It was at its own limit, hitting it again and again.
    assert any(at_own_limit(m) for m in seen)
    hits = [m.limit_hits for m in seen if m.limit_hits is not None]
    assert hits and hits[-1] > hits[0]
    # None of it was global reclaim: the node's direct reclaim did not move.
    assert before.pgscan_direct is not None
    assert after.pgscan_direct == before.pgscan_direct
    assert "memory-pressure-high" not in fired
