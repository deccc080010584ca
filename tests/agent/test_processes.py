"""Top processes by RSS through psutil on a fixture procfs, mapped to containers, whatever
the form of their ``/proc/<pid>/cgroup`` (absolute, or relative to the agent's cgroup
namespace: tests/fixtures/make_hosts.py writes each as cgroup_namespaces(7) says)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from nodeguard.sources.cgroups import CgroupReader
from nodeguard.sources.processes import parse_proc_cgroup, read_top_processes
from tests.fixtures.make_hosts import (
    CID,
    CID_PAUSE,
    UID_AGENT,
    UID_B,
    UID_BE,
    UID_G,
    UID_STATIC,
)
from tests.support.hosts import host_flags, host_paths

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


def _walk(host: str) -> dict[str, str]:
    """Container ID -> pod UID, from the host's cgroup walk (as the sampler passes it)."""
    _, pods = CgroupReader(paths=host_paths(host)).read(mem_total=None)
    return {c.container_id: p.uid for p in pods for c in p.containers}


def test_top_processes_from_the_agents_cgroup_namespace() -> None:
    # v2-cgroupns: every /proc/<pid>/cgroup relative to the agent's container (make_hosts.py).
    top = read_top_processes(
        paths=host_paths("v2-cgroupns"), limit=10, containers=_walk("v2-cgroupns")
    )
    owners = {p.pid: (p.pod_uid, p.container_id) for p in top}
    assert owners == {
        4242: (UID_B, CID[3]),  # another burstable pod
        6003: (UID_BE, CID[6]),  # besteffort
        5151: (UID_G, CID[1]),  # guaranteed
        4343: (UID_STATIC, CID[5]),  # the static pod, by its config hash
        777: (None, None),  # containerd, a host service
        999: (None, None),  # the agent itself, at its namespace's root
        1: (None, None),
        888: (UID_AGENT, CID_PAUSE),  # its own pod's sandbox: the pod from the walk
    }
    assert next(p.cgroup for p in top if p.pid == 1) == "/../../../../init.scope"


@pytest.mark.parametrize(
    ("host", "pid", "owner"),
    [
        ("v2-cgroupfs-crio", 8080, (UID_B, CID[8])),  # cgroupfs, QoS cut off
        ("v2-cgroupfs-crio", 888, (UID_AGENT, CID_PAUSE)),
        ("v2-cgroupfs-crio", 1, (None, None)),
        ("v2-kind-nested", 6006, (UID_BE, CID[6])),  # kind's kubelet-kubepods-* names
        ("v2-kind-nested", 1500, (None, None)),  # the kind node's own systemd
        ("v1-systemd-crio", 7070, (UID_B, CID[7])),  # v1: the memory line, absolute
        ("v1-systemd-crio", 7071, (UID_B, None)),  # conmon: in the pod, no container
        ("v1-docker-nested", 3333, (UID_B, CID[3])),
    ],
)
def test_process_owner_on_every_layout(host: str, pid: int, owner: tuple[str | None, ...]) -> None:
    top = read_top_processes(paths=host_paths(host), limit=10, containers=_walk(host))
    assert next((p.pod_uid, p.container_id) for p in top if p.pid == pid) == owner


def test_without_the_walk_the_own_pod_stays_unknown() -> None:
    top = read_top_processes(paths=host_paths("v2-cgroupns"), limit=10)
    assert next((p.pod_uid, p.container_id) for p in top if p.pid == 888) == (None, None)
    assert next(p.pod_uid for p in top if p.pid == 4242) == UID_B


def test_snapshot_command_names_every_pod_from_a_cgroup_namespace() -> None:
    # The sampler hands the cgroup walk to the process source: the agent's own pod is named too.
    proc = subprocess.run(
        [sys.executable, "-m", "nodeguard", "snapshot", "--json", *host_flags("v2-cgroupns")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    snap = json.loads(proc.stdout)
    owners = {p["pid"]: (p["pod_uid"], p["container_id"]) for p in snap["processes"]}
    assert owners[4242] == (UID_B, CID[3])
    assert owners[888] == (UID_AGENT, CID_PAUSE)
    assert owners[999] == (None, None)
