"""On the real kernel: page cache is not an OOM on its way. Containers at the same 64 MiB limit:
one re-reads a 60 MiB dataset (its page cache fills the limit and turns active, so the working
set reaches 98 % and grows there like a leak), one allocates anonymous memory at the same rate,
one writes to tmpfs (shmem, on the anon lists). The default rule container-near-limit must act
on the anon hog before the kernel kills it and never on the reader; the same for the kubepods
cgroup against node allocatable, in a private hierarchy."""

from __future__ import annotations

import secrets
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodeguard.paths import HostPaths
from nodeguard.snapshot import CgroupMemory
from nodeguard.sources.cgroups import CgroupReader
from tests.support.agent import running_agent, wait_until
from tests.support.kernel_cgroup import (
    READER,
    KubeletCgroup,
    PrivateKubepods,
    cold_file,
    hog_in,
    kubelet_cgroup,
    pod_container,
    private_kubepods,
    process_in,
    writable_memory_controller,
)
from tests.support.remediation import incidents

MiB = 1 << 20
LIMIT = 64 * MiB
DEFAULT_RULES = Path(__file__).resolve().parents[2] / "rules" / "default.yaml"


# Allocates MiB chunks of anonymous memory, every page touched, then holds them.
HOLD = r"""
import sys, time
size = int(sys.argv[1])
sys.stdin.readline()
chunks = [bytearray(b"\x01" * (1 << 20)) for _ in range(size)]
print("allocated", flush=True)
time.sleep(60)
"""
# Writes MiB chunks to a tmpfs file, then waits.
TMPFS = r"""
import sys, time
path, size = sys.argv[1], int(sys.argv[2])
sys.stdin.readline()
with open(path, "wb") as f:
    for _ in range(size):
        f.write(b"\x01" * (1 << 20))
        f.flush()
print("written", flush=True)
time.sleep(60)
"""


@pytest.fixture
def require_kernel() -> None:
    found = writable_memory_controller()
    if found is None or found[0] != 1:
        pytest.skip("needs root and a writable cgroup v1 memory controller (CI has both)")


@pytest.fixture
def pods(require_kernel: None, tmp_path: Path) -> Iterator[PrivateKubepods]:
    """A kubepods of this test's own: the reader or the agent sees these cgroups alone."""
    with private_kubepods(tmp_path) as made:
        yield made


def _container(reader: CgroupReader, cg: KubeletCgroup) -> CgroupMemory | None:
    _, pods = reader.read(mem_total=None)
    for pod in pods:
        for c in pod.containers:
            if c.container_id == cg.container_id:
                return c.memory
    return None


def _if(m: CgroupMemory | None, holds: Callable[[CgroupMemory], bool]) -> CgroupMemory | None:
    """``m`` when it was read and ``holds``."""
    return m if m is not None and holds(m) else None


def test_page_cache_tmpfs_and_anon_on_the_kernel(pods: PrivateKubepods, tmp_path: Path) -> None:
    data = cold_file(tmp_path / "dataset", 60)
    big = cold_file(tmp_path / "bigger", 128)  # twice the limit: every pass is refaulted
    shm = Path("/dev/shm") / f"nodeguard-test-{secrets.token_hex(4)}"
    reader = CgroupReader(paths=HostPaths(sysfs=pods.sysfs))
    try:
        with (
            kubelet_cgroup(pods, limit_bytes=LIMIT) as cache_cg,
            kubelet_cgroup(pods, limit_bytes=LIMIT) as thrash_cg,
            kubelet_cgroup(pods, limit_bytes=LIMIT) as shm_cg,
            kubelet_cgroup(pods, limit_bytes=LIMIT) as anon_cg,
            process_in(cache_cg, [sys.executable, "-c", READER, str(data), "0.02"]),
            process_in(thrash_cg, [sys.executable, "-c", READER, str(big), "0.02"]),
            process_in(shm_cg, [sys.executable, "-c", TMPFS, str(shm), "40"]) as writer,
            process_in(anon_cg, [sys.executable, "-c", HOLD, "48"]) as holder,
        ):
            # The look-alike is real: the reader's working set at 95 % of its limit or more.
            cache = wait_until(
                "the reader's cache to fill its limit",
                lambda: _if(_container(reader, cache_cg), lambda m: (m.limit_ratio or 0) >= 0.95),
                timeout=60,
            )
            assert cache.file_bytes is not None and cache.file_bytes >= 56 * MiB
            assert cache.unreclaimable_bytes is not None
            assert cache.unreclaimable_bytes <= 8 * MiB  # the interpreter's own anon
            assert writer.stdout is not None and writer.stdout.readline() == "written\n"
            tmpfs = _container(reader, shm_cg)
            assert tmpfs is not None and tmpfs.unreclaimable_bytes is not None
            assert 40 * MiB <= tmpfs.unreclaimable_bytes <= 48 * MiB
            assert holder.stdout is not None and holder.stdout.readline() == "allocated\n"
            anon = _container(reader, anon_cg)
            assert anon is not None and anon.unreclaimable_bytes is not None
            assert anon.usage_bytes is not None
            assert 48 * MiB <= anon.unreclaimable_bytes <= anon.usage_bytes
            # Reading twice the limit over and over: reclaim drops what the next pass reads
            # back; the kernel counts the refaults (6.18's v1 memory.stat has the line).
            first = _container(reader, thrash_cg)
            assert first is not None and first.refault_file_bytes is not None
            floor = first.refault_file_bytes + 32 * MiB
            again = wait_until(
                "refaults",
                lambda: _if(
                    _container(reader, thrash_cg), lambda m: (m.refault_file_bytes or 0) >= floor
                ),
                timeout=60,
            )
            assert again.unreclaimable_bytes is not None and again.unreclaimable_bytes <= 8 * MiB
            assert anon.refault_file_bytes == 0
    finally:
        shm.unlink(missing_ok=True)


def _firings(base: str, rule: str) -> list[str]:
    return [i["target"] for i in incidents(base) if i["rule"] == rule]


def test_default_rule_acts_on_anon_not_on_page_cache(pods: PrivateKubepods, tmp_path: Path) -> None:
    # The real agent with the shipped rules, dry run, no cluster (the eviction is refused;
    # the firing and its incident are what count). Both grow at ~50 MiB/s toward 64 MiB.
    data = cold_file(tmp_path / "dataset", 60)
    args = [
        f"--rules={DEFAULT_RULES}",
        f"--path.sysfs={pods.sysfs}",
        "--interval=100ms",
        f"--path.state={tmp_path / 'state'}",
        "--no-collector.processes",
        "--dry-run",
    ]
    with (
        kubelet_cgroup(pods, limit_bytes=LIMIT) as cache_cg,
        kubelet_cgroup(pods, limit_bytes=LIMIT) as anon_cg,
        running_agent(args=args, log_path=tmp_path / "agent.log") as base,
    ):
        cache_key = f"{cache_cg.pod_uid}/{cache_cg.container_id}"
        anon_key = f"{anon_cg.pod_uid}/{anon_cg.container_id}"
        reader = CgroupReader(paths=HostPaths(sysfs=pods.sysfs))
        with process_in(cache_cg, [sys.executable, "-c", READER, str(data), "0.02"]):
            wait_until(
                "the reader's cache to fill its limit",
                lambda: _if(_container(reader, cache_cg), lambda m: (m.limit_ratio or 0) >= 0.95),
                timeout=60,
            )
            time.sleep(3)  # time for samples to see it at the limit, and growth to be fitted
            with hog_in(anon_cg, step=MiB, pause=0.2, up_to=4 * LIMIT) as hog:
                fired = wait_until(
                    "a firing",
                    lambda: anon_key in _firings(base, "container-near-limit"),
                    timeout=60,
                )
                alive = hog.poll() is None
                assert hog.wait(timeout=40) == -9  # the kernel kills it: nothing evicts
        assert fired and alive, "the kernel OOM-killed the hog first"
        assert cache_key not in _firings(base, "container-near-limit")


def test_kubepods_against_allocatable(require_kernel: None, tmp_path: Path) -> None:
    data = cold_file(tmp_path / "dataset", 120)
    allocatable = 128 * MiB
    with private_kubepods(tmp_path, limit=allocatable) as node:
        loader, hog = pod_container(node), pod_container(node)
        reader = CgroupReader(paths=HostPaths(sysfs=node.sysfs))

        def kubepods() -> CgroupMemory | None:
            reader.read(mem_total=None)
            return reader.kubepods

        with process_in(loader, [sys.executable, "-c", READER, str(data), "0.02"]):
            full = wait_until(
                "the pods' cache to fill allocatable",
                lambda: _if(kubepods(), lambda m: (m.limit_ratio or 0) >= 0.95),
                timeout=60,
            )
            assert full.effective_limit_bytes == allocatable
            assert full.unreclaimable_ratio is not None and full.unreclaimable_ratio < 0.1
            with hog_in(hog, step=MiB, pause=0.01, up_to=110 * MiB):
                # Anon pushes the cache out; the share that kills rises with it.
                near = wait_until(
                    "the pods' anon near allocatable",
                    lambda: _if(kubepods(), lambda m: (m.unreclaimable_ratio or 0) >= 0.85),
                    timeout=60,
                )
                assert near.unreclaimable_bytes is not None
                assert near.unreclaimable_bytes <= (near.usage_bytes or 0)
