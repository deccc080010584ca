"""Kernel notifications on the real kernel: a v1 memory threshold's eventfd when a real hog
crosses it, a PSI trigger under real page-cache thrashing, and ``memory.events`` changes through
inotify (on files of a host tree: this machine's cgroup v2 has no memory controller)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeguard.sampling.notify.hub import NotificationHub, PsiSpec, Wakeup, Watched
from nodeguard.sampling.notify.psi import open_trigger
from nodeguard.sampling.notify.thresholds import register
from tests.support.agent import wait_until
from tests.support.kernel_cgroup import (
    kubelet_cgroup,
    memory_stall,
    private_kubepods,
    process_in,
    writable_memory_controller,
)

MiB = 1 << 20

CAP_SYS_RESOURCE = 24


def _privileged() -> bool:
    line = next(
        x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("CapEff")
    )
    return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)


@pytest.fixture
def v1() -> None:
    found = writable_memory_controller()
    if found is None or found[0] != 1:
        pytest.skip("needs root and a writable cgroup v1 memory controller (CI has both)")


@pytest.fixture
def hub() -> Iterator[NotificationHub]:
    h = NotificationHub(on_wakeup=lambda w: None, levels=(0.5, 0.75))
    yield h
    h.close()


def test_a_v1_threshold_wakes_when_a_hog_crosses_it(
    v1: None, hub: NotificationHub, tmp_path: Path
) -> None:
    with private_kubepods(tmp_path) as pods, kubelet_cgroup(pods, limit_bytes=64 * MiB) as cg:
        key = f"{cg.pod_uid}/{cg.container_id}"
        hub.sync([Watched(key=key, directory=str(cg.container_dir), version=1, limit=64 * MiB)])
        assert hub.statuses["threshold"].registered == 2 and hub.statuses["threshold"].available
        assert hub.poll(0) == []  # nothing crossed yet
        code = "input(); b = bytearray(40 << 20); b[::4096] = b'x' * len(b[::4096]); input()"
        with process_in(cg, [sys.executable, "-c", code]):
            # poll() blocks up to 0.5 s on the eventfd: the wait is the kernel's wakeup.
            got = wait_until("the threshold's wakeup", lambda: hub.poll(0.5), timeout=30, step=0)
            usage = int((cg.container_dir / "memory.usage_in_bytes").read_text())
            assert got == [Wakeup("threshold", key)]  # 32 MiB crossed; 48 MiB not
            assert 32 * MiB <= usage < 48 * MiB
        # The container goes: its thresholds are unregistered and their descriptors freed.
        before = len(os.listdir("/proc/self/fd"))
        hub.sync([])
        assert hub.statuses["threshold"].registered == 0
        assert len(os.listdir("/proc/self/fd")) == before - 4


def test_a_psi_trigger_fires_under_real_memory_pressure(v1: None, tmp_path: Path) -> None:
    trigger = open_trigger(
        key="node", path="/proc/pressure/memory", kind="some", stall=0.05, window=1.0
    )
    try:
        # Without CAP_SYS_RESOURCE the kernel takes only windows that are multiples of 2 s.
        assert (trigger.window, trigger.widened) == ((1.0, False) if _privileged() else (2.0, True))
        with memory_stall(workdir=tmp_path, seconds=60):
            h = NotificationHub(on_wakeup=lambda w: None)
            h.set_psi(
                [
                    PsiSpec(
                        key="node",
                        path="/proc/pressure/memory",
                        kind="some",
                        stall=0.05,
                        window=1.0,
                    )
                ]
            )
            try:
                got = wait_until(
                    "the PSI trigger's wakeup", lambda: h.poll(0.5), timeout=60, step=0
                )
                assert got == [Wakeup("psi", "node")]
                assert h.statuses["psi"].available and h.statuses["psi"].wakeups == 1
            finally:
                h.close()
    finally:
        trigger.close()


def test_memory_events_changes_wake_through_inotify(tmp_path: Path, hub: NotificationHub) -> None:
    pods = []
    for name in ("pod-a", "pod-b"):
        d = tmp_path / name
        d.mkdir()
        (d / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
        pods.append(Watched(key=name, directory=str(d), version=2, limit=None))
    hub.sync(pods)
    assert hub.statuses["events"].registered == 2
    (tmp_path / "pod-b" / "memory.events").write_text("low 0\nhigh 0\nmax 1\noom 0\noom_kill 0\n")
    assert hub.poll(1.0) == [Wakeup("events", "pod-b")]
    assert hub.poll(0) == []
    hub.sync(pods[:1])  # pod-b went
    assert hub.statuses["events"].registered == 1


def test_what_the_kernel_refuses_is_reported_not_raised(
    tmp_path: Path, hub: NotificationHub
) -> None:
    # A v2 directory has no cgroup.event_control: no thresholds there, no error raised.
    (tmp_path / "memory.usage_in_bytes").write_text("0\n")
    hub.sync([Watched(key="x", directory=str(tmp_path), version=1, limit=64 * MiB)])
    assert hub.statuses["threshold"].registered == 0
    assert "cgroup.event_control" in hub.statuses["threshold"].error
    hub.set_psi(
        [PsiSpec(key="gone", path=str(tmp_path / "nope"), kind="some", stall=0.1, window=2.0)]
    )
    assert not hub.statuses["psi"].available and "nope" in hub.statuses["psi"].error
    with pytest.raises(ValueError, match="window"):
        open_trigger(key="k", path="/proc/pressure/memory", kind="some", stall=0.1, window=20)


def test_nothing_is_written_to_a_file_that_is_not_the_kernels(tmp_path: Path) -> None:
    # A --path.procfs pointed at a copy of /proc, or a fixture tree: registering is a write,
    # and to a regular file it would succeed and change it.
    pressure = tmp_path / "memory"
    text = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    pressure.write_text(text)
    with pytest.raises(OSError, match="not a proc or cgroup2 file"):
        open_trigger(key="node", path=str(pressure), kind="some", stall=0.1, window=2.0)
    assert pressure.read_text() == text
    cgroup = tmp_path / "cg"
    cgroup.mkdir()
    (cgroup / "memory.usage_in_bytes").write_text("0\n")
    (cgroup / "cgroup.event_control").write_text("")
    with pytest.raises(OSError, match="not a cgroup file"):
        register(key="k", cgroup=str(cgroup), level=1 << 20)
    assert (cgroup / "cgroup.event_control").read_text() == ""
