"""nodeguard and cAdvisor (the benchmarks' peer: the kubelet's library, built from Go modules by
this test on first use and cached) agree on the same real cgroups: usage, working set, anon,
file, limit, limit hits and OOM kills of live containers, on the real kernel
(benchmarks/agreement.py says what each side reads).

Three kubelet-shaped containers hold still by the time both are read: one holding anonymous
memory and page cache, one whose page cache hit its limit many times (reclaimed, not killed),
and one whose process the kernel OOM-killed (the cgroup stays, as a restarting container's
does)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.agreement import Check, compare
from benchmarks.cadvisor_peer import cadvisor
from nodeguard.exposition.exporter import snapshot_families
from nodeguard.exposition.handler import plain_body
from nodeguard.paths import HostPaths
from nodeguard.sampling.sampler import Sampler, SamplerConfig
from tests.support.agent import get, wait_until
from tests.support.kernel_cgroup import (
    KubeletCgroup,
    PrivateKubepods,
    hog_in,
    kubelet_cgroup,
    private_kubepods,
    process_in,
    writable_memory_controller,
)

MiB = 1 << 20

# Holds ANON bytes of anonymous memory and FILE bytes of page cache (a file written in PATH,
# read back through the cache), then says so and sleeps.
HOLD = r"""
import sys, time
anon, size, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
sys.stdin.readline()
held = bytearray(b"\x01" * anon)
with open(path, "wb") as f:
    for _ in range(size // (1 << 20)):
        f.write(b"\x02" * (1 << 20))
print("ready", flush=True)
time.sleep(3600)
"""


@contextlib.contextmanager
def _holding(cg: KubeletCgroup, *, anon: int, file: int, path: Path) -> Iterator[None]:
    argv = [sys.executable, "-c", HOLD, str(anon), str(file), str(path)]
    with process_in(cg, argv) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        yield


def _nodeguard_body(pods: PrivateKubepods) -> str:
    sampler = Sampler(
        config=SamplerConfig(
            paths=HostPaths(procfs=Path("/proc"), sysfs=pods.sysfs, kmsg=Path("/dev/kmsg")),
            node_name="n",
            collectors=frozenset({"meminfo", "cgroups", "kmsg"}),
        )
    )
    try:
        snap = sampler.sample_once()
    finally:
        sampler.close()
    from prometheus_client import generate_latest

    return plain_body(families=snapshot_families(snap), own=(), encoder=generate_latest).decode()


def test_nodeguard_and_cadvisor_agree_on_live_containers(tmp_path: Path) -> None:
    found = writable_memory_controller()
    if found is None:
        pytest.skip("needs root and a writable cgroup memory controller (CI has both)")
    version, _ = found
    with contextlib.ExitStack() as stack:
        # A kubepods of this test's own: both sides read these cgroups alone.
        pods = stack.enter_context(private_kubepods(tmp_path))
        steady = stack.enter_context(kubelet_cgroup(pods, limit_bytes=256 * MiB))
        reclaimed = stack.enter_context(kubelet_cgroup(pods, limit_bytes=32 * MiB))
        killed = stack.enter_context(kubelet_cgroup(pods, limit_bytes=48 * MiB))
        stack.enter_context(_holding(steady, anon=24 * MiB, file=8 * MiB, path=tmp_path / "a"))
        stack.enter_context(_holding(reclaimed, anon=0, file=96 * MiB, path=tmp_path / "b"))
        with hog_in(killed, step=1 * MiB, pause=0.01, up_to=4 * 48 * MiB) as hog:
            hog.wait(timeout=30)
            assert hog.returncode == -9, "the kernel should have OOM-killed the hog"
        containers = {
            pods.cgroup_id(cg.container_dir): (cg.pod_uid, cg.container_id)
            for cg in (steady, reclaimed, killed)
        }
        peer = stack.enter_context(
            cadvisor(
                cgroup_roots=[pods.cgroup_id(pods.kubepods)], log_path=tmp_path / "cadvisor.log"
            )
        )
        last: list[Check] = []

        def agreeing() -> list[Check] | None:
            status, cadvisor_body = get(f"{peer}/metrics", timeout=30)
            assert status == 200
            last[:] = compare(
                nodeguard=_nodeguard_body(pods),
                cadvisor=cadvisor_body,
                containers=containers,
                version=version,
            )
            return last if all(c.agrees for c in last) else None

        # cAdvisor reports its last housekeeping (10-15 s apart): wait for one that saw
        # the containers standing still, as nodeguard sees them now.
        try:
            checks = wait_until("cAdvisor to agree", agreeing, timeout=120, step=2)
        except AssertionError:
            pytest.fail(f"disagree: {[c for c in last if not c.agrees]}")
    by = {(c.cgroup, c.what): c.nodeguard for c in checks}
    steady_cg, reclaimed_cg, killed_cg = containers
    assert by[(steady_cg, "anon")] >= 24 * MiB  # type: ignore[operator]
    assert by[(steady_cg, "file")] >= 8 * MiB  # type: ignore[operator]
    assert by[(reclaimed_cg, "limit hits")] > 0  # type: ignore[operator]
    assert by[(reclaimed_cg, "OOM kills")] == 0
    assert by[(killed_cg, "OOM kills")] == 1
    assert by[(killed_cg, "limit")] == 48 * MiB
