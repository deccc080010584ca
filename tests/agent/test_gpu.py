"""The GPU source through the real nvidia-ml-py bindings, against a stub ``libnvidia-ml.so``
built here with gcc (tests/support/gpu/nvml_stub.c), end to end: ``nodeguard snapshot --json`` and
``nodeguard run`` (``/metrics``, ``/snapshot``, ``/incidents``) in subprocesses, on a fixture
procfs whose ``/proc/<pid>/cgroup`` files put the stub's host PIDs in kubepods containers.

Each scenario is its own process: NVML is loaded once per process, as in the agent.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.make_hosts import CID, CID_PAUSE, UID_AGENT, UID_B, UID_BE, UID_G
from tests.support.agent import get, wait_until
from tests.support.gpu.fixtures import StubFactory
from tests.support.gpu.scenes import (
    H100,
    L40S,
    UUID0,
    UUID1,
    V2_HOST,
    agent,
    flags,
    metrics,
    procfs,
    snapshot_of,
)
from tests.support.gpu.stub import (
    DRIVER_NOT_LOADED,
    NOT_SUPPORTED,
    UNKNOWN,
    Scenario,
    StubEnv,
    collector,
    samples,
    snapshot_json,
    value,
)
from tests.support.hosts import HOSTS
from tests.support.promstack import promtool_check

GiB = 1 << 30
MiB = 1 << 20
V1_HOST = HOSTS / "v1-cgroupfs-docker"


def two_gpus() -> Scenario:
    """GPU 0 (H100): three processes of pod G (two in one container) and one of pod BE whose
    memory NVML does not give; GPU 1 (L40S, no MIG): pod B, containerd, and an exited PID."""
    return (
        Scenario()
        .gpu(0, UUID0, total=80 * GiB, reserved=512 * MiB, used=13 * GiB, name=H100)
        .gpu(1, UUID1, total=48 * GiB, reserved=512 * MiB, used=20 * GiB + 768 * MiB, mig=-1,
             name=L40S)
        .add(f"proc 0 -1 5151 {10 * GiB}")
        .add(f"proc 0 -1 6001 {2 * GiB}")
        .add(f"proc 0 -1 6002 {1 * GiB}")
        .add("proc 0 -1 6003 na")
        .add(f"proc 1 -1 4242 {20 * GiB}")
        .add(f"proc 1 -1 777 {256 * MiB}")
        .add(f"proc 1 -1 31337 {512 * MiB}")
    )  # fmt: skip


# -- two GPUs, processes of several pods: one agent run, several views of it --------------------
GPU_RULES = f"""
apiVersion: nodeguard.io/v1alpha1
kind: RuleSet
spec:
  rules:
    - name: gpu-memory-high
      scope: gpu
      when: [{{signal: gpu_memory_used_ratio, op: ">", value: 0.3}}]
      actions: [{{action: record}}]
    - name: pod-gpu-heavy
      scope: pod
      when: [{{signal: pod_gpu_memory_used_bytes, op: ">", value: {12 * GiB}}}]
      actions: [{{action: record}}]
"""


class MainRun:
    """What one ``nodeguard run`` of :func:`two_gpus` showed."""

    metrics: str
    snapshot: dict[str, Any]
    incidents: list[dict[str, Any]]
    calls: list[str]
    samples_seen: int


@pytest.fixture(scope="module")
def main_run(stub_libs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> MainRun:
    tmp = tmp_path_factory.mktemp("gpu-main")
    stub = StubEnv(
        library_dir=stub_libs["full"],
        scenario=two_gpus().write(tmp / "scenario"),
        log=tmp / "calls",
    )
    rules = tmp / "rules.yaml"
    rules.write_text(GPU_RULES)
    out = MainRun()
    args = [*flags(procfs(tmp)), f"--rules={rules}", "--node-name=node-a"]
    with agent(stub, args, tmp) as base:
        first = value(metrics(base), "nodeguard_snapshot_timestamp_seconds")
        wait_until(
            "three incidents",
            lambda: len(_firings(json.loads(get(f"{base}/incidents")[1]))) >= 3,
            timeout=30,
            step=0.05,
        )
        # Several samples and scrapes pass; NVML stays initialised once.
        time.sleep(0.6)
        out.metrics = metrics(base)
        last = value(out.metrics, "nodeguard_snapshot_timestamp_seconds")
        assert first is not None and last is not None
        out.samples_seen = round((last - first) / 0.1)
        out.snapshot = snapshot_of(base)
        # The fixture's kernel log has OOM kills: each is an incident too (kind oom_kill).
        listing = _firings(json.loads(get(f"{base}/incidents")[1]))
        out.incidents = [json.loads(get(f"{base}/incidents/{i['id']}")[1]) for i in listing]
        assert stub.calls() == ["init"]
    out.calls = stub.calls()
    return out


def test_device_memory_by_gpu(main_run: MainRun) -> None:
    body = main_run.metrics
    h100 = {"gpu": "0", "uuid": UUID0, "model": H100}
    l40s = {"gpu": "1", "uuid": UUID1, "model": L40S}
    assert value(body, "nodeguard_gpu_memory_total_bytes", **h100) == 80 * GiB
    assert value(body, "nodeguard_gpu_memory_used_bytes", **h100) == 13 * GiB
    assert value(body, "nodeguard_gpu_memory_reserved_bytes", **h100) == 512 * MiB
    assert value(body, "nodeguard_gpu_memory_free_bytes", **h100) == 80 * GiB - 512 * MiB - 13 * GiB
    assert value(body, "nodeguard_gpu_memory_total_bytes", **l40s) == 48 * GiB
    assert value(body, "nodeguard_gpu_memory_used_bytes", **l40s) == 20 * GiB + 768 * MiB
    assert value(body, "nodeguard_gpu_mig_enabled", **h100) == 0
    assert value(body, "nodeguard_gpu_mig_enabled", **l40s) is None  # no MIG on this GPU
    assert (
        value(body, "nodeguard_gpu_lost", **h100) == value(body, "nodeguard_gpu_lost", **l40s) == 0
    )
    assert value(body, "nodeguard_gpu_driver_info", driver_version="550.54.15") == 1
    assert value(body, "nodeguard_collector_success", collector="gpu") == 1
    assert value(body, "nodeguard_collector_available", collector="gpu") == 1
    assert samples(body, "nodeguard_gpu_mig_memory_total_bytes") == {}
    promtool_check(body)


def test_memory_by_container_never_by_pid(main_run: MainRun) -> None:
    body = main_run.metrics

    def ctr(uid: str, cid: str, gpu: str, uuid: str) -> dict[str, str]:
        return {"namespace": "", "pod": uid, "container": cid, "gpu": gpu, "uuid": uuid, "mig": ""}

    used = "nodeguard_gpu_container_memory_used_bytes"
    procs = "nodeguard_gpu_container_processes"
    # Two processes of one container on GPU 0 add up; the other container of the pod is apart.
    assert value(body, used, **ctr(UID_G, CID[1], "0", UUID0)) == 12 * GiB
    assert value(body, procs, **ctr(UID_G, CID[1], "0", UUID0)) == 2
    assert value(body, used, **ctr(UID_G, CID[2], "0", UUID0)) == 1 * GiB
    assert value(body, used, **ctr(UID_B, CID[3], "1", UUID1)) == 20 * GiB
    # Memory "not available": the container is on the GPU, its memory is absent, not 0.
    assert value(body, used, **ctr(UID_BE, CID[6], "0", UUID0)) is None
    assert value(body, procs, **ctr(UID_BE, CID[6], "0", UUID0)) == 1
    # containerd (not a pod) and the exited PID are no container's.
    assert len(samples(body, procs)) == 4
    assert len(samples(body, used)) == 3
    gpu_lines = [ln for ln in body.splitlines() if ln.startswith("nodeguard_gpu")]
    assert gpu_lines and not any("pid=" in ln for ln in gpu_lines)


def test_snapshot_json_keeps_every_process(main_run: MainRun) -> None:
    gpu = main_run.snapshot["gpu"]
    assert gpu["driver_version"] == "550.54.15"
    d0, d1 = gpu["devices"]
    assert (d0["index"], d0["uuid"], d0["name"], d0["mig_enabled"]) == (0, UUID0, H100, False)
    assert d0["memory"] == {
        "total_bytes": 80 * GiB,
        "used_bytes": 13 * GiB,
        "free_bytes": 80 * GiB - 512 * MiB - 13 * GiB,
        "reserved_bytes": 512 * MiB,
        "info_version": 2,
    }
    assert d1["mig_enabled"] is None and d1["errors"] == ["mig mode: Not Supported"]
    by_pid = {p["pid"]: p for d in (d0, d1) for p in d["processes"]}
    assert set(by_pid) == {5151, 6001, 6002, 6003, 4242, 777, 31337}
    assert by_pid[6003]["used_bytes"] is None  # NVML_VALUE_NOT_AVAILABLE
    assert (by_pid[6003]["pod_uid"], by_pid[6003]["container_id"]) == (UID_BE, CID[6])
    assert (by_pid[4242]["pod_uid"], by_pid[4242]["container_id"]) == (UID_B, CID[3])
    assert by_pid[777]["cgroup"] == "/system.slice/containerd.service"
    assert by_pid[777]["pod_uid"] is None
    assert by_pid[31337] == {
        "pid": 31337,
        "used_bytes": 512 * MiB,
        "mig_gpu_instance_id": None,
        "mig_compute_instance_id": None,
        "cgroup": None,
        "pod_uid": None,
        "container_id": None,
        "lists": ["compute"],
        "mps_server": False,
    }
    assert d0["processes_missing"] == d1["processes_missing"] == []


def _firings(listing: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rules' incidents of a ``/incidents`` list, without the kernel OOM kills'."""
    return [i for i in listing if i.get("kind") != "oom_kill"]


def test_nvml_is_initialised_once_and_shut_down_on_exit(main_run: MainRun) -> None:
    assert main_run.samples_seen >= 5
    assert main_run.calls == ["init", "shutdown"]


def test_gpu_rules_fire_and_incidents_carry_gpu_evidence(main_run: MainRun) -> None:
    fired = sorted((i["rule"], i["target"]) for i in main_run.incidents)
    # GPU 1 is 44 % in use (20.75 GiB + 0.5 GiB reserved of 48 GiB), GPU 0 17 %; pod G uses
    # 13 GiB, pod B 20 GiB; pod BE's memory is unknown and never fires.
    assert fired == [
        ("gpu-memory-high", UUID1),
        ("pod-gpu-heavy", UID_G),
        ("pod-gpu-heavy", UID_B),
    ]
    by_target = {i["target"]: i for i in main_run.incidents}
    assert by_target[UUID1]["scope"] == "gpu"
    assert by_target[UUID1]["values"]["gpu_memory_used_ratio"] == pytest.approx(
        (21 * GiB + 256 * MiB) / (48 * GiB)
    )
    assert by_target[UID_G]["values"]["pod_gpu_memory_used_bytes"] == 13 * GiB
    evidence = by_target[UUID1]["evidence"]["gpu"]
    d0, d1 = evidence["devices"]
    assert d1["memory"]["used_bytes"] == 20 * GiB + 768 * MiB
    assert [p["pid"] for p in d1["processes"]] == [4242, 31337, 777]  # by GPU memory
    assert d1["processes"][0]["pod"] == UID_B and d1["processes"][0]["container"] == CID[3]
    assert [p["pid"] for p in d0["processes"]][-1] == 6003  # memory unknown sorts last


def test_snapshot_command_reports_gpus(make_stub: StubFactory, tmp_path: Path) -> None:
    stub = make_stub(two_gpus())
    snap = snapshot_json(stub, flags(procfs(tmp_path)))
    assert collector(snap, "gpu")["available"] is True
    assert [d["memory"]["total_bytes"] for d in snap["gpu"]["devices"]] == [80 * GiB, 48 * GiB]
    assert stub.calls() == ["init", "shutdown"]
    report = subprocess.run(
        [sys.executable, "-m", "nodeguard", "snapshot", *flags(tmp_path / "proc")],
        env={**stub.env(), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "GPU memory (NVIDIA driver 550.54.15)" in report
    assert f"0: {UUID0}" in report and "Top GPU processes" in report
    assert "not available" in report and "(not in a pod)" in report


def test_nvml_is_not_loaded_at_import_nor_by_registering_the_exporter(
    make_stub: StubFactory, tmp_path: Path
) -> None:
    stub = make_stub(two_gpus())
    code = f"""
import pynvml
from prometheus_client import CollectorRegistry, generate_latest
import nodeguard.agent, nodeguard.cli
from nodeguard.exposition.exporter import snapshot_families
from nodeguard.exposition.handler import Exposition
from nodeguard.paths import HostPaths
from nodeguard.sampling.sampler import Sampler, SamplerConfig
sampler = Sampler(config=SamplerConfig(paths=HostPaths(procfs={str(tmp_path / "proc")!r}),
                                       node_name="n", collectors=frozenset({{"gpu"}})))
exposition = Exposition(latest=lambda: sampler.latest, families=snapshot_families)
exposition.render(accept="", names=(), own=())
assert pynvml.nvmlLib is None, "loaded before the first sample"
sampler.sample_once()
assert pynvml.nvmlLib is not None
sampler.close()
sampler.close()
"""
    procfs(tmp_path)
    subprocess.run([sys.executable, "-c", code], env=stub.env(), check=True, timeout=60)
    assert stub.calls() == ["init", "shutdown"]


def test_gpu_families_render_the_librarys_bytes(make_stub: StubFactory, tmp_path: Path) -> None:
    """The fast writer (nodeguard.exposition.render) gives prometheus_client's bytes over the GPU
    families too (MIG included), in OpenMetrics and in the text format."""
    stub = make_stub(mig_scenario())
    proc = procfs(tmp_path)
    code = f"""
from prometheus_client.exposition import choose_encoder
from nodeguard.exposition.exporter import snapshot_families
from nodeguard.exposition.handler import Exposition, plain_body
from nodeguard.paths import HostPaths
from nodeguard.sampling.sampler import Sampler, SamplerConfig
from pathlib import Path
host = Path({str(V2_HOST)!r})
paths = HostPaths(procfs=Path({str(proc)!r}), sysfs=host / "sys", kmsg=host / "kmsg")
sampler = Sampler(config=SamplerConfig(paths=paths, node_name="n"))
sampler.sample_once()
exposition = Exposition(latest=lambda: sampler.latest, families=snapshot_families)
for accept in ("application/openmetrics-text;version=1.0.0", "text/plain;version=0.0.4"):
    ours = exposition.render(accept=accept, names=(), own=())[0]
    families = snapshot_families(sampler.latest)
    lib = plain_body(families=families, own=(), encoder=choose_encoder(accept)[0])
    assert b"nodeguard_gpu_container_memory_used_bytes{{" in ours, ours
    assert b"nodeguard_gpu_mig_memory_used_bytes{{" in ours, ours
    assert ours == lib
sampler.close()
"""
    subprocess.run([sys.executable, "-c", code], env=stub.env(), check=True, timeout=60)


# -- MIG -------------------------------------------------------------------------------------------
def mig_scenario() -> Scenario:
    return (
        Scenario()
        .gpu(0, UUID0, total=80 * GiB, reserved=512 * MiB, used=12 * GiB, mig=1, name=H100)
        .gpu(1, UUID1, total=80 * GiB, reserved=512 * MiB, used=1 * GiB, mig=0, name=H100)
        .mig(0, 0, "MIG-aaaa0000-0000-4000-8000-000000000001", gi=1, ci=0, total=40 * GiB,
             used=8 * GiB)
        .mig(0, 3, "MIG-aaaa0000-0000-4000-8000-000000000002", gi=2, ci=0, total=20 * GiB,
             used=4 * GiB)
        .add(f"proc 0 0 5151 {6 * GiB}")
        .add(f"proc 0 0 6001 {2 * GiB}")
        .add(f"proc 0 3 4242 {4 * GiB}")
        .add(f"proc 1 -1 6002 {1 * GiB}")
    )  # fmt: skip


def test_mig_instances_and_their_processes(make_stub: StubFactory, tmp_path: Path) -> None:
    with agent(make_stub(mig_scenario()), flags(procfs(tmp_path)), tmp_path) as base:
        body, snap = metrics(base), snapshot_of(base)
    d0, d1 = snap["gpu"]["devices"]
    assert d0["mig_enabled"] is True and d1["mig_enabled"] is False
    assert [
        (m["index"], m["gpu_instance_id"], m["compute_instance_id"]) for m in d0["mig_devices"]
    ] == [
        (0, 1, 0),
        (3, 2, 0),
    ]
    assert d0["mig_devices"][1]["memory"]["total_bytes"] == 20 * GiB
    assert sorted((p["pid"], p["mig_gpu_instance_id"]) for p in d0["processes"]) == [
        (4242, 2),
        (5151, 1),
        (6001, 1),
    ]
    assert d1["processes"][0]["mig_gpu_instance_id"] is None

    dev0 = {"gpu": "0", "uuid": UUID0, "model": H100}
    assert value(body, "nodeguard_gpu_mig_enabled", **dev0) == 1
    assert value(body, "nodeguard_gpu_mig_enabled", gpu="1") == 0
    assert value(body, "nodeguard_gpu_mig_memory_total_bytes", **dev0, mig="1") == 40 * GiB
    assert value(body, "nodeguard_gpu_mig_memory_used_bytes", **dev0, mig="2") == 4 * GiB
    assert value(body, "nodeguard_gpu_memory_total_bytes", **dev0) == 80 * GiB
    used = "nodeguard_gpu_container_memory_used_bytes"
    assert value(body, used, pod=UID_G, container=CID[1], gpu="0", mig="1") == 8 * GiB
    assert value(body, used, pod=UID_B, container=CID[3], gpu="0", mig="2") == 4 * GiB
    assert value(body, used, pod=UID_G, container=CID[2], gpu="1", mig="") == 1 * GiB
    promtool_check(body)


# -- what a device or a driver cannot give ----------------------------------------------------
def test_memory_query_not_supported_on_one_device(make_stub: StubFactory, tmp_path: Path) -> None:
    scenario = (
        two_gpus().add(f"fail 1 mem {NOT_SUPPORTED}")  # both memory info v1 and v2
    )
    with agent(make_stub(scenario), flags(procfs(tmp_path)), tmp_path) as base:
        body, snap = metrics(base), snapshot_of(base)
    d0, d1 = snap["gpu"]["devices"]
    assert d0["memory"]["total_bytes"] == 80 * GiB
    assert d1["memory"] is None
    assert "memory: Not Supported" in d1["errors"]
    assert {p["pid"] for p in d1["processes"]} == {4242, 777, 31337}  # still listed
    totals = samples(body, "nodeguard_gpu_memory_total_bytes")
    assert [dict(k)["gpu"] for k in totals] == ["0"]  # absent for GPU 1, never 0
    assert value(body, "nodeguard_gpu_container_memory_used_bytes", pod=UID_B) == 20 * GiB
    assert value(body, "nodeguard_collector_success", collector="gpu") == 1


def test_driver_without_the_process_query(make_stub: StubFactory, tmp_path: Path) -> None:
    """nvmlDeviceGetComputeRunningProcesses_v3 and _v2 missing: pynvml raises
    FunctionNotFound; no per-process data, device data still exported."""
    stub = make_stub(two_gpus(), variant="no-procs")
    with agent(stub, flags(procfs(tmp_path)), tmp_path) as base:
        body, snap = metrics(base), snapshot_of(base)
    for dev in snap["gpu"]["devices"]:
        assert dev["processes"] is None
        assert dev["errors"][-1] == (
            "processes: nvmlDeviceGetComputeRunningProcesses_v3 / "
            "nvmlDeviceGetComputeRunningProcesses_v2 not in this driver"
        )
    assert value(body, "nodeguard_gpu_memory_used_bytes", gpu="0") == 13 * GiB
    assert samples(body, "nodeguard_gpu_container_processes") == {}
    assert value(body, "nodeguard_collector_success", collector="gpu") == 1


def test_driver_without_memory_info_v2(make_stub: StubFactory, tmp_path: Path) -> None:
    """v1 only: its used includes the reserved memory, and reserved is unknown."""
    stub = make_stub(two_gpus(), variant="no-memory-v2")
    with agent(stub, flags(procfs(tmp_path)), tmp_path) as base:
        body, snap = metrics(base), snapshot_of(base)
    assert snap["gpu"]["devices"][0]["memory"] == {
        "total_bytes": 80 * GiB,
        "used_bytes": 13 * GiB + 512 * MiB,
        "free_bytes": 80 * GiB - 512 * MiB - 13 * GiB,
        "reserved_bytes": None,
        "info_version": 1,
    }
    assert value(body, "nodeguard_gpu_memory_used_bytes", gpu="0") == 13 * GiB + 512 * MiB
    assert samples(body, "nodeguard_gpu_memory_reserved_bytes") == {}


# -- NVML unusable: the agent runs on ---------------------------------------------------------
def test_no_driver_is_no_data(make_stub: StubFactory, tmp_path: Path) -> None:
    stub = make_stub(Scenario(), variant="no-driver")
    snap = snapshot_json(stub, flags(procfs(tmp_path)))
    st = collector(snap, "gpu")
    assert (st["success"], st["available"]) == (True, False)
    assert "NVML Shared Library Not Found" in st["error"]
    assert snap["gpu"] is None
    assert snap["meminfo"]["total_bytes"] == 32 * GiB  # the rest of the sample is there


@pytest.mark.parametrize(
    ("rc", "success", "error"),
    [
        (UNKNOWN, False, "NvmlInitError: nvmlInit failed: Unknown Error"),
        (DRIVER_NOT_LOADED, True, "no NVIDIA driver (nvmlInit: Driver Not Loaded)"),
    ],
)
def test_init_failure(
    make_stub: StubFactory, tmp_path: Path, rc: int, success: bool, error: str
) -> None:
    stub = make_stub(two_gpus().add(f"init {rc}"))
    with agent(stub, flags(procfs(tmp_path)), tmp_path) as base:
        wait_until(
            "a first snapshot",
            lambda: (value(metrics(base), "nodeguard_snapshot_timestamp_seconds") or 0) > 0,
            timeout=30,
            step=0.05,
        )
        time.sleep(0.4)  # a few samples: init is not retried on each (only after a minute)
        body, snap = metrics(base), snapshot_of(base)
        assert get(f"{base}/readyz")[0] == 200
    st = collector(snap, "gpu")
    assert (st["success"], st["available"]) == (success, False)
    assert st["error"].startswith(error)
    assert value(body, "nodeguard_collector_success", collector="gpu") == (1 if success else 0)
    assert value(body, "nodeguard_collector_success", collector="meminfo") == 1
    assert samples(body, "nodeguard_gpu_memory_total_bytes") == {}
    assert stub.calls() == ["init"]  # tried once; nothing to shut down


def test_a_failed_init_is_tried_again_a_minute_later_on_the_readers_clock(
    make_stub: StubFactory, tmp_path: Path
) -> None:
    stub = make_stub(two_gpus().add(f"init {UNKNOWN}"))
    code = f"""
from nodeguard.paths import HostPaths
from nodeguard.sources.gpu import NvmlInitError, NvmlReader
now = [1000.0]
reader = NvmlReader(paths=HostPaths(procfs={str(procfs(tmp_path))!r}), clock=lambda: now[0])
for at in (0.0, 59.9, 60.0, 119.9):
    now[0] = 1000.0 + at
    try:
        reader.read()
    except NvmlInitError:
        print(at, flush=True)
"""
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=stub.env(),
        check=True,
        timeout=60,
        capture_output=True,
        text=True,
    )
    assert done.stdout.split() == ["0.0", "59.9", "60.0", "119.9"]  # each read fails...
    assert stub.calls() == ["init", "init"]  # ...but NVML is asked again only at +60 s


def test_gpu_lost_in_the_middle_of_a_run(make_stub: StubFactory, tmp_path: Path) -> None:
    flag = tmp_path / "gpu1-fell-off-the-bus"
    stub = make_stub(two_gpus().add(f"lost 1 {flag}"))
    with agent(stub, flags(procfs(tmp_path)), tmp_path) as base:
        assert value(metrics(base), "nodeguard_gpu_memory_total_bytes", gpu="1") == 48 * GiB
        flag.touch()
        wait_until(
            "GPU 1 lost",
            lambda: value(metrics(base), "nodeguard_gpu_lost", gpu="1") == 1,
            timeout=30,
            step=0.05,
        )
        body, snap = metrics(base), snapshot_of(base)
        assert get(f"{base}/readyz")[0] == 200
    # Still named by the UUID and model read before it was lost; its memory is absent.
    assert value(body, "nodeguard_gpu_lost", gpu="1", uuid=UUID1, model=L40S) == 1
    assert value(body, "nodeguard_gpu_memory_total_bytes", gpu="1") is None
    assert value(body, "nodeguard_gpu_container_memory_used_bytes", pod=UID_B) is None
    # GPU 0 goes on as before.
    assert value(body, "nodeguard_gpu_lost", gpu="0") == 0
    assert value(body, "nodeguard_gpu_memory_used_bytes", gpu="0") == 13 * GiB
    assert value(body, "nodeguard_gpu_container_memory_used_bytes", container=CID[1]) == 12 * GiB
    assert value(body, "nodeguard_collector_success", collector="gpu") == 1
    lost = snap["gpu"]["devices"][1]
    assert (lost["lost"], lost["uuid"], lost["memory"], lost["processes"]) == (
        True,
        UUID1,
        None,
        None,
    )
    assert stub.calls() == ["init", "shutdown"]


# -- PID -> container on other cgroup layouts ---------------------------------------------------
def test_pod_mapping_on_cgroup_v1_fixture_procfs(make_stub: StubFactory, tmp_path: Path) -> None:
    nested = f"{'e' * 64}"
    extra = {
        # kind / docker-nested: the kubelet's tree below a docker container of the host.
        7001: f"12:memory:/docker/{nested}/kubepods/besteffort/pod{UID_BE}/{CID[6]}\n",
        7002: "12:memory:/user.slice\n",
    }
    scenario = (
        Scenario()
        .gpu(0, UUID0, total=80 * GiB, reserved=0, used=7 * GiB, name=H100)
        .add(f"proc 0 -1 3003 {4 * GiB}")  # the fixture's pod B process (docker, cgroupfs)
        .add(f"proc 0 -1 7001 {2 * GiB}")
        .add(f"proc 0 -1 7002 {1 * GiB}")
    )
    proc = procfs(tmp_path, host=V1_HOST, extra=extra)
    snap = snapshot_json(make_stub(scenario), flags(proc, host=V1_HOST))
    by_pid = {p["pid"]: p for p in snap["gpu"]["devices"][0]["processes"]}
    assert (by_pid[3003]["pod_uid"], by_pid[3003]["container_id"]) == (UID_B, CID[3])
    assert by_pid[3003]["cgroup"] == f"/kubepods/burstable/pod{UID_B}/{CID[3]}"
    assert (by_pid[7001]["pod_uid"], by_pid[7001]["container_id"]) == (UID_BE, CID[6])
    assert (by_pid[7002]["cgroup"], by_pid[7002]["pod_uid"]) == ("/user.slice", None)


def test_pod_mapping_from_the_agents_cgroup_namespace(
    make_stub: StubFactory, tmp_path: Path
) -> None:
    # The shipped DaemonSet reads /proc from its own cgroup namespace (cgroup v2, containerd):
    # the host's PIDs that NVML gives have paths relative to the agent's container
    # (tests/fixtures/make_hosts.py v2_cgroupns). Each still names its pod and container, so
    # per-pod GPU memory and GPU-scoped evictions see them.
    host = HOSTS / "v2-cgroupns"
    scenario = (
        Scenario()
        .gpu(0, UUID0, total=80 * GiB, reserved=0, used=16 * GiB, name=H100)
        .add(f"proc 0 -1 4242 {8 * GiB}")  # pod B, same QoS class as the agent
        .add(f"proc 0 -1 5151 {6 * GiB}")  # pod G, guaranteed
        .add(f"proc 0 -1 888 {1 * GiB}")  # the agent's own pod's sandbox: "/../<container>"
        .add(f"proc 0 -1 777 {1 * GiB}")  # containerd, a host service
    )
    proc = procfs(tmp_path, host=host, extra={})
    snap = snapshot_json(make_stub(scenario), flags(proc, host=host))
    by_pid = {
        p["pid"]: (p["pod_uid"], p["container_id"]) for p in snap["gpu"]["devices"][0]["processes"]
    }
    assert by_pid == {
        4242: (UID_B, CID[3]),
        5151: (UID_G, CID[1]),
        888: (UID_AGENT, CID_PAUSE),
        777: (None, None),
    }
