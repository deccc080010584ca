"""The GPU source against a real NVIDIA driver, beside what ``nvidia-smi`` reports.

Run by ``scripts/gpu-check`` on a machine with a GPU (``pytest tests/agent/real_driver.py``); not
collected by the normal run (its name does not match ``test_*.py``), since CI has no GPU. The
stub-backed tests in tests/agent/test_gpu.py cover the cases a real driver cannot be made to show.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent import get, running_agent
from tests.support.gpu.stub import collector, samples

MiB = 1 << 20
#: Largest disagreement with nvidia-smi allowed, as a share of the GPU's total memory.
TOLERANCE = 0.01


def nvidia_smi(*args: str) -> list[list[str]]:
    """Rows of ``nvidia-smi ARGS --format=csv,noheader,nounits``."""
    try:
        out = subprocess.run(
            ["nvidia-smi", *args, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    except FileNotFoundError:
        pytest.fail("nvidia-smi not found: these checks need a machine with an NVIDIA driver")
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def snapshot() -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "nodeguard", "snapshot", "--json", "--no-collector.kmsg"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def test_every_gpu_nvidia_smi_sees_with_its_memory() -> None:
    rows = nvidia_smi("--query-gpu=index,uuid,name,memory.total,memory.used")
    snap = snapshot()
    st = collector(snap, "gpu")
    assert (st["success"], st["available"]) == (True, True), st["error"]
    devices = snap["gpu"]["devices"]
    assert [(d["index"], d["uuid"], d["name"]) for d in devices] == [
        (int(i), uuid, name) for i, uuid, name, _, _ in rows
    ]
    for dev, (_, _, _, total_mib, used_mib) in zip(devices, rows, strict=True):
        mem = dev["memory"]
        assert mem is not None, dev["errors"]
        total = mem["total_bytes"]
        assert abs(total - int(total_mib) * MiB) <= TOLERANCE * total
        assert abs(mem["used_bytes"] - int(used_mib) * MiB) <= TOLERANCE * total
        parts = mem["used_bytes"] + mem["free_bytes"] + (mem["reserved_bytes"] or 0)
        assert abs(parts - total) <= TOLERANCE * total


def test_processes_are_those_nvidia_smi_lists() -> None:
    """Compute processes by (PID, GPU UUID); they come and go, so a few tries."""
    ours: set[tuple[int, str]] = set()
    theirs: set[tuple[int, str]] = set()
    for _ in range(3):
        smi = nvidia_smi("--query-compute-apps=pid,gpu_uuid")
        devices = snapshot()["gpu"]["devices"]
        plain = {d["uuid"] for d in devices if not d["mig_enabled"]}  # MIG: per instance
        for d in devices:
            assert d["processes"] is not None, f"GPU {d['index']}: {d['errors']}"
            # A current driver has all three lists: none may be missing where nothing fails.
            assert d["processes_missing"] == [], f"GPU {d['index']}: {d['errors']}"
        ours = {  # nvidia-smi's compute apps: NVML's compute list (ours also has graphics, MPS)
            (p["pid"], d["uuid"])
            for d in devices
            if d["uuid"] in plain
            for p in d["processes"]
            if "compute" in p["lists"]
        }
        theirs = {(int(pid), uuid) for pid, uuid, *_ in smi if uuid in plain}
        if ours == theirs:
            return
        time.sleep(1)
    assert ours == theirs


def test_the_agent_exports_every_gpu(tmp_path: Path) -> None:
    count = len(nvidia_smi("--query-gpu=index"))
    args = ["--interval=1s", f"--path.state={tmp_path / 'state'}", "--no-collector.kmsg"]
    with running_agent(args=args, log_path=tmp_path / "agent.log") as base:
        body = get(f"{base}/metrics")[1]
    assert len(samples(body, "nodeguard_gpu_memory_total_bytes")) == count
    assert len(samples(body, "nodeguard_gpu_lost")) == count
    success = samples(body, "nodeguard_collector_success")
    assert success[frozenset({("collector", "gpu")})] == 1
