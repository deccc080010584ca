"""``nodeguard snapshot --json`` on host trees whose kernel log comes from different kernels:
the pod, container, constraint and counts of every OOM kill, checked against each cgroup's own
``oom_kill`` counter where the kernel keeps one.

The trees are built by tests/fixtures/make_hosts.py (``v2_oom_group``, ``v1_rhel7_310``,
``v1_ubuntu_415``), whose docstrings say what each event is; the rules the counts follow are in
nodeguard/sources/oom_events.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from nodeguard.sampling.sampler import Sampler, SamplerConfig
from tests.fixtures.make_hosts import CID, UID_B, UID_BE, UID_G
from tests.support.hosts import exposition, host_flags, host_paths


def snapshot(host: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "nodeguard", "snapshot", "--json", *host_flags(host)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def cgroup_counters(snap: dict[str, Any]) -> dict[str, int | None]:
    """``<pod uid>/<container id>`` -> the container cgroup's oom_kill counter."""
    return {
        f"{pod['uid']}/{c['container_id']}": c["memory"]["oom_kills"]
        for pod in snap["pods"]
        for c in pod["containers"]
    }


def test_v2_oom_group_kills_whole_containers() -> None:
    snap = snapshot("v2-oom-group")
    oom = snap["oom"]
    b3, b4 = f"{UID_B}/{CID[3]}", f"{UID_B}/{CID[4]}"
    be6, g1 = f"{UID_BE}/{CID[6]}", f"{UID_G}/{CID[1]}"
    # Victims, each once: 3 in B/CID[3], 1 in B/CID[4], 1 in BE/CID[6], 2 in G/CID[1], and the
    # node OOM's cron job.
    assert oom["by_container"] == {b3: 3, b4: 1, be6: 1, g1: 2}
    assert oom["repeats_by_container"] == {b3: 1, b4: 1, be6: 1, g1: 1}
    assert oom["total"] == 8
    assert oom["by_constraint"] == {
        "CONSTRAINT_NONE": 3,
        "CONSTRAINT_CPUSET": 0,
        "CONSTRAINT_MEMORY_POLICY": 0,
        "CONSTRAINT_MEMCG": 5,
    }
    # The kernel counts every kill record in memory.events oom_kill, the repeat included.
    counters = cgroup_counters(snap)
    for key in (b3, b4, be6, g1):
        assert oom["by_container"][key] + oom["repeats_by_container"][key] == counters[key], key
    assert [(k["pid"], k["process"], k["container_id"]) for k in oom["recent"]] == [
        (4100, "python3", CID[3]),
        (4101, "pt_data_worker", CID[3]),
        (4102, "pt_data_worker", CID[3]),
        (4200, "java", CID[4]),
        (4300, "python3", CID[6]),
        (333, "backup", None),
        (5151, "pt_main_thread", CID[1]),
        (5152, "pt_main_thread", CID[1]),
    ]
    workers = [k for k in oom["recent"] if k["process"] == "pt_data_worker"]
    assert {k["oom_group"] for k in workers} == {k["task_memcg"] for k in workers}
    assert workers[0]["task_memcg"].endswith(f"cri-containerd-{CID[3]}.scope")
    assert [k["constraint"] for k in oom["recent"] if k["pod_uid"] == UID_G] == [
        "CONSTRAINT_NONE",
        "CONSTRAINT_NONE",
    ]


def test_rhel7_310_log_is_the_only_per_container_count() -> None:
    snap = snapshot("v1-rhel7-3.10")
    oom = snap["oom"]
    assert oom["by_container"] == {f"{UID_B}/{CID[3]}": 1, f"{UID_B}/{CID[4]}": 1}
    assert oom["repeats_by_container"] == {}
    assert oom["by_constraint"]["CONSTRAINT_MEMCG"] == 2
    assert oom["by_constraint"]["CONSTRAINT_NONE"] == 1
    assert [(k["pid"], k["process"], k["pod_uid"], k["oom_memcg"]) for k in oom["recent"]] == [
        (3010, "jstack", UID_B, f"/kubepods/burstable/pod{UID_B}/{CID[3]}"),
        (3100, "python", UID_B, f"/kubepods/burstable/pod{UID_B}"),
        (2188, "mysqld", None, None),
    ]
    # 3.10's memory.oom_control has no oom_kill line: the cgroups cannot say.
    assert set(cgroup_counters(snap).values()) == {None}


def test_ubuntu_415_log_agrees_with_the_cgroup_counter() -> None:
    snap = snapshot("v1-ubuntu-4.15")
    oom = snap["oom"]
    b7 = f"{UID_B}/{CID[7]}"
    assert oom["by_container"] == {b7: 2}
    assert cgroup_counters(snap)[b7] == 2
    assert [(k["pid"], k["constraint"], k["container_id"]) for k in oom["recent"]] == [
        (7001, "CONSTRAINT_MEMCG", CID[7]),
        (7002, "CONSTRAINT_MEMCG", CID[7]),  # its "Task in" line came in four records
        (7100, "CONSTRAINT_NONE", None),  # a node OOM before 4.19 names no cgroup
    ]
    # ... which the besteffort container's own counter does count.
    assert cgroup_counters(snap)[f"{UID_BE}/{CID[6]}"] == 1


@pytest.mark.parametrize("host", ["v2-oom-group", "v1-rhel7-3.10", "v1-ubuntu-4.15"])
def test_metrics_count_victims(host: str) -> None:
    # The exporter's per-container counter is the victims' count, labelled by the container.
    snap = Sampler(config=SamplerConfig(paths=host_paths(host), node_name="n")).sample_once()
    body = exposition(snap)
    assert snap.oom is not None
    for key, n in snap.oom.by_container.items():
        uid, _, cid = key.partition("/")
        line = f'pod="{uid}"' if not cid else f'container="{cid}"'
        found = [
            ln
            for ln in body.splitlines()
            if ln.startswith("nodeguard_container_kernel_oom_kills_total{") and line in ln
        ]
        assert len(found) == 1 and found[0].endswith(f" {float(n)}"), (key, found)
