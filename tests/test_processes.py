"""Top processes by RSS through psutil on a fixture procfs, mapped to containers."""

from __future__ import annotations

from nodeguard.sources.processes import parse_proc_cgroup, read_top_processes
from tests.conftest import host_paths
from tests.fixtures.make_hosts import CID, UID_B, UID_G

GiB = 1 << 30
MiB = 1 << 20


def test_parse_proc_cgroup() -> None:
    v1 = "12:memory:/kubepods/x\n1:name=systemd:/y\n0::/z\n"
    assert parse_proc_cgroup(v1) == "/kubepods/x"
    assert parse_proc_cgroup("4:cpu,memory:/a\n") == "/a"
    assert parse_proc_cgroup("0::/init.scope\n") == "/init.scope"
    assert parse_proc_cgroup("garbage\n") is None


def test_top_processes_v2() -> None:
    top = read_top_processes(paths=host_paths("v2-systemd-containerd"), limit=3)
    assert [(p.pid, p.name, p.rss_bytes) for p in top] == [
        (4242, "python3", 9 * GiB),
        (5151, "pt_main_thread", 3 * GiB),
        (777, "containerd", 80 * MiB),
    ]
    assert (top[0].pod_uid, top[0].container_id) == (UID_B, CID[3])
    assert (top[1].pod_uid, top[1].container_id) == (UID_G, CID[1])
    assert top[2].container_id is None and top[2].cgroup == "/system.slice/containerd.service"


def test_top_processes_v1_memory_line() -> None:
    top = read_top_processes(paths=host_paths("v1-cgroupfs-docker"), limit=10)
    assert top[0].pid == 3003 and top[0].container_id == CID[3]
    assert top[0].cgroup == f"/kubepods/burstable/pod{UID_B}/{CID[3]}"
