"""On the real kernel (cgroup v1 on CI): a process thrashing at its own limit, its page
cache reclaimed inside its cgroup on every read, is no node pressure. Its cgroup hits the limit
over and over (``memory.failcnt``), while ``/proc/vmstat`` ``pgscan_direct`` stays where it was
(reclaim at a cgroup's limit is cgroup reclaim, which mm/vmscan.c does not count there), and
the shipped ``memory-pressure-high`` rule never fires on the node: with its anon near the limit
it is "at its own limit" (nodeguard.stall: usage and unreclaimable memory at it), and with a
quarter of the limit left to page cache, which is not, the missing direct reclaim holds the
rule."""

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
from nodeguard.sampling.sampler import Sampler, SamplerConfig
from nodeguard.snapshot import CgroupMemory, NodeSnapshot
from nodeguard.sources.vmstat import read_vmstat
from nodeguard.stall import at_own_limit
from tests.support.kernel_cgroup import (
    kubelet_cgroup,
    private_kubepods,
    process_in,
    writable_memory_controller,
)

MiB = 1 << 20
DEFAULT_RULES = Path(__file__).resolve().parents[2] / "rules" / "default.yaml"


@pytest.fixture
def require_kernel() -> None:
    if writable_memory_controller() is None:
        pytest.skip("needs root and a writable cgroup memory controller (CI has both)")


def _thrasher(big: Path, anon_mib: int) -> str:
    """``anon_mib`` of anonymous memory held (the interpreter adds 3 to 4 MiB), then a 200 MiB
    file read over and over through the rest of its limit: every read reclaims page cache
    inside the cgroup."""
    return (
        "input()\n"
        "import os\n"
        f"b = bytearray({anon_mib} << 20); b[::4096] = b'x' * len(b[::4096])\n"
        "while True:\n"
        f"    fd = os.open({str(big)!r}, os.O_RDONLY)\n"
        "    while os.read(fd, 1 << 20): pass\n"
        "    os.close(fd)\n"
    )


def _memory(snap: NodeSnapshot, cid: str) -> CgroupMemory | None:
    return next((c.memory for _, c in snap.containers() if c.container_id == cid), None)


# Unreclaimable memory (v1: the anon lists) of about 60 of 64 MiB (0.93, at its own limit)
# and of about 38 of 48 MiB (0.79: a fifth of its limit page cache, not at it by
# nodeguard.stall); each thrashes through the page cache its limit leaves it.
@pytest.mark.parametrize(("limit_mib", "anon_mib", "at_limit"), [(64, 56, True), (48, 36, False)])
def test_a_hog_thrashing_at_its_own_limit_does_not_trip_the_node_rule(
    require_kernel: None, tmp_path: Path, limit_mib: int, anon_mib: int, at_limit: bool
) -> None:
    big = tmp_path / "big"
    with open(big, "wb") as f:
        for _ in range(200):
            f.write(b"\x5a" * MiB)
        f.flush()
        os.fsync(f.fileno())
        # Out of the page cache, so that the hog's reads charge the pages to its own cgroup.
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    engine = RuleEngine(rules=load_rules([DEFAULT_RULES]).rules)
    fired: list[str] = []
    seen: list[CgroupMemory] = []
    # A kubepods of this test's own: the sampler reads this container alone.
    with private_kubepods(tmp_path) as pods:
        host = HostPaths(sysfs=pods.sysfs)
        before = read_vmstat(paths=host)
        sampler = Sampler(
            config=SamplerConfig(
                paths=host,
                node_name="n",
                collectors=frozenset({"meminfo", "pressure", "cgroups", "vmstat"}),
            )
        )
        try:
            with (
                kubelet_cgroup(pods, limit_bytes=limit_mib * MiB) as cg,
                process_in(cg, [sys.executable, "-c", _thrasher(big, anon_mib)]),
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
    # It hit its limit again and again, at it by unreclaimable memory too or not.
    assert any(at_own_limit(m) for m in seen) is at_limit
    assert all(
        m.usage_bytes is not None and m.usage_bytes >= 0.9 * limit_mib * MiB for m in seen[-4:]
    )
    hits = [m.limit_hits for m in seen if m.limit_hits is not None]
    assert hits and hits[-1] > hits[0]
    # None of it was global reclaim: the node's direct reclaim did not move.
    assert before.pgscan_direct is not None
    assert after.pgscan_direct == before.pgscan_direct
    assert "memory-pressure-high" not in fired
