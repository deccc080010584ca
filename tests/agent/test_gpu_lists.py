"""Every process that holds GPU memory: NVML's compute, graphics and MPS compute lists
(``nvmlDevice{Compute,Graphics,MPSCompute}RunningProcesses_v3``, else ``_v2``), merged by PID,
through the real nvidia-ml-py bindings against the stub (tests/support/gpu/nvml_stub.c).

The forms, each a test:

- a GPU shared through CUDA MPS (k8s-device-plugin ``sharing.mps``): the compute list has only
  the MPS server (``nvidia-cuda-mps-server``) of the device plugin's MPS control daemon pod, the
  workloads are in the MPS list (dcgm-exporter#478, nvtop#93: read the compute list alone, the
  pods show 0 and the server's pod looks like the GPU's user);
- a graphics-only process (a Vulkan/OpenGL pod), a PID in both compute and graphics (nvidia-smi's
  ``C+G``) or in compute and MPS (``M+C``), counted once;
- a driver without the MPS list (go-nvml#28: not in CUDA 11.2's ``nvml.h``): compute and
  graphics still read; where an MPS server runs its clients are unknown, so no pod's total is 0;
- ``usedGpuMemory`` ``NVML_VALUE_NOT_AVAILABLE`` for an MPS client: the pod is absent, not 0;
- MIG: each MIG device's lists, graphics NOT_SUPPORTED there (no graphics contexts on MIG);
- a driver with the lists' ``_v2`` only, and one with neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nodeguard.actions.ranking import EvictFilter, gpu_eviction_plan
from nodeguard.rules.signals import SIGNALS, History, targets
from nodeguard.snapshot import (
    GpuDevice,
    GpuInfo,
    GpuMemory,
    GpuProcess,
    MigDevice,
    NodeSnapshot,
    PodMemory,
    PodMeta,
)
from tests.fixtures.make_hosts import CID, UID_B, UID_BE, UID_G
from tests.support.gpu.fixtures import StubFactory
from tests.support.gpu.scenes import (
    H100,
    L40S,
    UUID0,
    UUID1,
    agent,
    flags,
    metrics,
    procfs,
    snapshot_of,
)
from tests.support.gpu.stub import NOT_SUPPORTED, Scenario, StubEnv, samples, snapshot_json, value
from tests.support.hosts import cgroup_memory

GiB = 1 << 30
MiB = 1 << 20
#: The device plugin's MPS control daemon pod (a DaemonSet's) and its container.
UID_DP = "4d4e4f50-5152-4354-b5b6-b7b8b9babbbc"
CID_DP = "d" * 64
_G = f"/kubepods.slice/kubepods-pod{UID_G.replace('-', '_')}.slice"
_BE = (
    "/kubepods.slice/kubepods-besteffort.slice/"
    f"kubepods-besteffort-pod{UID_BE.replace('-', '_')}.slice"
)
_DP = (
    "/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{UID_DP.replace('-', '_')}.slice"
)
SERVER = 8001  # nvidia-cuda-mps-server
LOOKALIKE = 8002  # a workload whose comm is the server's cut to 15 characters


def _proc(
    cgroup: str, comm: str = "python3", cmdline: str = "python3\0train.py\0"
) -> dict[str, str]:
    return {"cgroup": f"0::{cgroup}\n", "stat": f"{{pid}} ({comm}) S 1", "cmdline": cmdline}


#: Host PIDs beside the fixture's (4242: pod B's CID[3], 5151: pod G's CID[1]).
PIDS = {
    6001: _proc(f"{_G}/cri-containerd-{CID[2]}.scope"),
    6003: _proc(f"{_BE}/cri-containerd-{CID[6]}.scope"),
    SERVER: _proc(
        f"{_DP}/cri-containerd-{CID_DP}.scope",
        comm="nvidia-cuda-mps",  # TASK_COMM_LEN: the kernel cuts comm at 15 characters
        cmdline="nvidia-cuda-mps-server\0",
    ),
    LOOKALIKE: _proc(
        f"{_G}/cri-containerd-{CID[2]}.scope",
        comm="nvidia-cuda-mps",
        cmdline="/opt/bench/nvidia-cuda-mps-soak\0--minutes=5\0",
    ),
}


def host(root: Path) -> Path:
    """The v2 fixture host's procfs with :data:`PIDS`."""
    proc = procfs(root, extra={})
    for pid, files in PIDS.items():
        (proc / str(pid)).mkdir()
        for name, text in files.items():
            (proc / str(pid) / name).write_text(text.replace("{pid}", str(pid)))
    return proc


def mps_gpu(scenario: Scenario, gpu: int = 0) -> Scenario:
    """GPU ``gpu`` shared through MPS: the server in the compute list holding its two clients'
    memory (14 GiB), the clients in the MPS list, pod G's 10 GiB also in the compute list
    (``M+C``), pod BE's 4 GiB in the MPS list alone."""
    return (
        scenario.proc(gpu, SERVER, 14 * GiB)
        .proc(gpu, 6001, 10 * GiB)
        .proc(gpu, 6001, 10 * GiB, list="mps")
        .proc(gpu, 6003, 4 * GiB, list="mps")
    )


def two_gpus() -> Scenario:
    """GPU 0 (H100) shared through MPS (:func:`mps_gpu`); GPU 1 (L40S) not: pod B's graphics
    process alone, pod G's process in both compute and graphics (compute's amount not
    available, graphics' 2 GiB)."""
    base = (
        Scenario()
        .gpu(0, UUID0, total=80 * GiB, reserved=512 * MiB, used=14 * GiB, name=H100)
        .gpu(1, UUID1, total=48 * GiB, reserved=512 * MiB, used=5 * GiB, mig=-1, name=L40S)
        .proc(1, 4242, 3 * GiB, list="graphics")
        .proc(1, 5151, None)
        .proc(1, 5151, 2 * GiB, list="graphics")
    )
    return mps_gpu(base)


# -- the snapshot back in this process, to ask the signals and the planner ------------------------
def gpu_info(snap: dict[str, Any]) -> GpuInfo:
    """The ``gpu`` part of ``nodeguard snapshot --json`` as the agent's dataclasses."""

    def mem(m: dict[str, Any] | None) -> GpuMemory | None:
        return None if m is None else GpuMemory(**m)

    devices = []
    for d in snap["gpu"]["devices"]:
        procs = None
        if d["processes"] is not None:
            procs = tuple(GpuProcess(**{**p, "lists": tuple(p["lists"])}) for p in d["processes"])
        migs = tuple(MigDevice(**{**m, "memory": mem(m["memory"])}) for m in d["mig_devices"])
        devices.append(
            GpuDevice(
                **{
                    **d,
                    "memory": mem(d["memory"]),
                    "mig_devices": migs,
                    "processes": procs,
                    "processes_missing": tuple(d["processes_missing"]),
                    "errors": tuple(d["errors"]),
                }
            )
        )
    return GpuInfo(driver_version=snap["gpu"]["driver_version"], devices=tuple(devices))


def pod(uid: str, name: str, cid: str, *, priority: int = 0, daemonset: bool = False) -> PodMeta:
    return PodMeta(
        uid=uid,
        name=name,
        namespace="ml",
        node_name="node-a",
        phase="Running",
        priority=priority,
        priority_class="",
        qos_class="burstable",
        memory_request_bytes=GiB,
        memory_limit_bytes=None,
        owners=(),
        labels={},
        annotations={},
        containers={cid: "main"},
        container_requests={},
        mirror=False,
        daemonset=daemonset,
        terminating=False,
    )


PODS = {
    UID_G: pod(UID_G, "train-g", CID[2], priority=100),
    UID_BE: pod(UID_BE, "notebook-be", CID[6]),
    UID_B: pod(UID_B, "render-b", CID[3]),
    UID_DP: pod(UID_DP, "nvidia-device-plugin-mps-control-daemon", CID_DP, daemonset=True),
}


def node(info: GpuInfo) -> NodeSnapshot:
    return NodeSnapshot(
        timestamp=100.0,
        node_name="node-a",
        meminfo=None,
        pressure=None,
        pods=tuple(
            PodMemory(
                uid=u, qos_class="burstable", memory=cgroup_memory(f"/{u}", used=GiB), containers=()
            )
            for u in PODS
        ),
        oom=None,
        processes=(),
        collectors=(),
        pod_meta=PODS,
        gpu=info,
    )


def pod_gpu(snap: NodeSnapshot) -> dict[str, float | None]:
    """``pod_gpu_memory_used_bytes`` of every pod."""
    s = SIGNALS["pod_gpu_memory_used_bytes"]
    return {t.key: s.fn(snap, History(), t) for t in targets(snap, "pod")}


def read(stub: StubEnv, tmp: Path) -> tuple[dict[str, Any], NodeSnapshot]:
    snap = snapshot_json(stub, flags(host(tmp)))
    return snap, node(gpu_info(snap))


def used(body: str, uid: str, gpu: str = "0", mig: str = "") -> float | None:
    return value(body, "nodeguard_gpu_container_memory_used_bytes", pod=uid, gpu=gpu, mig=mig)


def count(body: str, uid: str, gpu: str = "0", mig: str = "") -> float | None:
    return value(body, "nodeguard_gpu_container_processes", pod=uid, gpu=gpu, mig=mig)


# -- MPS ------------------------------------------------------------------------------------------
def test_mps_clients_report_their_memory_and_the_server_counts_for_no_pod(
    make_stub: StubFactory, tmp_path: Path
) -> None:
    stub = make_stub(two_gpus())
    with agent(stub, flags(host(tmp_path)), tmp_path) as base:
        body, snap = metrics(base), snapshot_of(base)
    # The clients, from the MPS list: pod G's also in the compute list, counted once.
    assert used(body, UID_G) == 10 * GiB and count(body, UID_G) == 1
    assert used(body, UID_BE) == 4 * GiB and count(body, UID_BE) == 1
    # The server's 14 GiB are its clients': no series for the device plugin's pod.
    assert used(body, UID_DP) is None and count(body, UID_DP) is None
    # The device's own memory is NVML's, the server's share in it as before.
    assert value(body, "nodeguard_gpu_memory_used_bytes", gpu="0") == 14 * GiB
    by_pid = {p["pid"]: p for p in snap["gpu"]["devices"][0]["processes"]}
    assert set(by_pid) == {SERVER, 6001, 6003}
    assert (by_pid[SERVER]["mps_server"], by_pid[SERVER]["lists"]) == (True, ["compute"])
    assert by_pid[SERVER]["pod_uid"] == UID_DP and by_pid[SERVER]["used_bytes"] == 14 * GiB
    assert (by_pid[6001]["mps_server"], by_pid[6001]["lists"]) == (False, ["compute", "mps"])
    assert by_pid[6003]["lists"] == ["mps"]
    assert snap["gpu"]["devices"][0]["processes_missing"] == []


def test_the_gpu_eviction_plan_picks_an_mps_client_not_the_device_plugin(
    make_stub: StubFactory, tmp_path: Path
) -> None:
    _, snap = read(make_stub(two_gpus()), tmp_path)
    # Pod G: 10 GiB on GPU 0 and 2 GiB on GPU 1.
    assert pod_gpu(snap) == {UID_G: 12 * GiB, UID_BE: 4 * GiB, UID_B: 3 * GiB, UID_DP: 0}
    plan, usage = gpu_eviction_plan(snapshot=snap, device=snap.gpu.devices[0], flt=EvictFilter())  # type: ignore[union-attr]
    assert usage == {UID_G: 10 * GiB, UID_BE: 4 * GiB}
    # Lowest priority first: pod BE (0) before pod G (100); the device plugin's pod is not on
    # the GPU's list at all (neither ranked nor excluded as a DaemonSet's).
    assert [[p.uid for p in u.pods] for u, _ in plan.ranked] == [[UID_BE], [UID_G]]
    assert "4.0 GiB of GPU memory on GPU 0" in plan.ranked[0][1]
    assert [e.pod.uid for e in plan.excluded] == []


def test_mps_client_memory_not_available_is_absent_not_zero(
    make_stub: StubFactory, tmp_path: Path
) -> None:
    """Some drivers give an MPS client's usedGpuMemory as NVML_VALUE_NOT_AVAILABLE."""
    scenario = (
        Scenario()
        .gpu(0, UUID0, total=80 * GiB, reserved=0, used=6 * GiB, name=H100)
        .proc(0, SERVER, 6 * GiB)
        .proc(0, 6001, 6 * GiB, list="mps")
        .proc(0, 6003, None, list="mps")
    )
    stub = make_stub(scenario)
    with agent(stub, flags(host(tmp_path)), tmp_path) as base:
        body = metrics(base)
    assert used(body, UID_BE) is None and count(body, UID_BE) == 1  # on the GPU, memory unknown
    assert used(body, UID_G) == 6 * GiB
    _, snap = read(stub, tmp_path / "again")
    gpu = pod_gpu(snap)
    assert gpu[UID_BE] is None and gpu[UID_G] == 6 * GiB and gpu[UID_B] == 0
    plan, _ = gpu_eviction_plan(snapshot=snap, device=snap.gpu.devices[0], flt=EvictFilter())  # type: ignore[union-attr]
    assert [[p.uid for p in u.pods] for u, _ in plan.ranked] == [[UID_BE], [UID_G]]
    assert plan.ranked[0][1].startswith("GPU memory on GPU 0 (") and "unknown" in plan.ranked[0][1]


def test_a_workload_named_like_the_server_is_not_one(
    make_stub: StubFactory, tmp_path: Path
) -> None:
    """Look-alike: comm ``nvidia-cuda-mps`` (cut at 15), command line another program: its
    memory is its pod's."""
    scenario = (
        Scenario()
        .gpu(0, UUID0, total=80 * GiB, reserved=0, used=5 * GiB, name=H100)
        .proc(0, LOOKALIKE, 5 * GiB)
    )
    snap_json, snap = read(make_stub(scenario), tmp_path)
    (p,) = snap_json["gpu"]["devices"][0]["processes"]
    assert p["mps_server"] is False
    assert pod_gpu(snap)[UID_G] == 5 * GiB


# -- graphics, and one PID in several lists -------------------------------------------------------
def test_graphics_processes_and_a_pid_in_two_lists_counted_once(
    make_stub: StubFactory, tmp_path: Path
) -> None:
    stub = make_stub(two_gpus())
    with agent(stub, flags(host(tmp_path)), tmp_path) as base:
        body, snap = metrics(base), snapshot_of(base)
    # Pod B's graphics-only process (a render pod).
    assert used(body, UID_B, gpu="1") == 3 * GiB and count(body, UID_B, gpu="1") == 1
    # Pod G's process in compute (not available) and graphics (2 GiB): one process, the amount
    # that is known.
    assert used(body, UID_G, gpu="1") == 2 * GiB and count(body, UID_G, gpu="1") == 1
    by_pid = {p["pid"]: p for p in snap["gpu"]["devices"][1]["processes"]}
    assert by_pid[5151]["lists"] == ["compute", "graphics"]
    assert by_pid[4242]["lists"] == ["graphics"]


def test_a_pid_whose_lists_disagree_counts_the_larger(
    make_stub: StubFactory, tmp_path: Path
) -> None:
    """Read one after another while it allocates, the lists can give one process two amounts;
    it is counted once, with the larger."""
    scenario = (
        Scenario()
        .gpu(0, UUID0, total=80 * GiB, reserved=0, used=3 * GiB, name=H100)
        .proc(0, 6001, 2 * GiB, list="graphics")
        .proc(0, 6001, 3 * GiB)
    )
    snap_json, snap = read(make_stub(scenario), tmp_path)
    (p,) = snap_json["gpu"]["devices"][0]["processes"]
    assert (p["used_bytes"], p["lists"]) == (3 * GiB, ["compute", "graphics"])
    assert pod_gpu(snap)[UID_G] == 3 * GiB


# -- drivers and devices without a list -----------------------------------------------------------
def test_a_driver_without_the_mps_list(make_stub: StubFactory, tmp_path: Path) -> None:
    """No nvmlDeviceGetMPSComputeRunningProcesses_v3/_v2 (FUNCTION_NOT_FOUND): compute and
    graphics are still read. GPU 0 runs an MPS server: its clients are somewhere unlisted, so
    no pod's GPU total is known (never 0), and the server's memory is still no pod's."""
    stub = make_stub(two_gpus(), variant="no-mps")
    with agent(stub, flags(host(tmp_path)), tmp_path) as base:
        body, snap = metrics(base), snapshot_of(base)
    d0, d1 = snap["gpu"]["devices"]
    assert {p["pid"] for p in d0["processes"]} == {SERVER, 6001}  # 6001's compute entry
    assert d0["processes_missing"] == ["mps"]
    assert "processes: an MPS server runs, its clients cannot be listed (absent)" in d0["errors"]
    assert d1["processes_missing"] == []  # no server on GPU 1: nothing can hide there
    assert used(body, UID_B, gpu="1") == 3 * GiB  # graphics still read
    assert used(body, UID_G) == 10 * GiB  # seen in the compute list
    assert used(body, UID_BE) is None and count(body, UID_BE) is None
    assert count(body, UID_DP) is None
    _, node_snap = read(stub, tmp_path / "again")
    assert set(pod_gpu(node_snap).values()) == {None}


def test_a_driver_without_the_mps_list_where_no_server_runs(
    make_stub: StubFactory, tmp_path: Path
) -> None:
    """Look-alike: the same driver on a GPU without MPS loses nothing; a pod on no GPU has 0."""
    scenario = (
        Scenario()
        .gpu(0, UUID0, total=80 * GiB, reserved=0, used=7 * GiB, name=H100)
        .proc(0, 6001, 4 * GiB)
        .proc(0, 4242, 3 * GiB, list="graphics")
    )
    snap_json, snap = read(make_stub(scenario, variant="no-mps"), tmp_path)
    assert snap_json["gpu"]["devices"][0]["processes_missing"] == []
    assert pod_gpu(snap) == {UID_G: 4 * GiB, UID_B: 3 * GiB, UID_BE: 0, UID_DP: 0}


def test_a_graphics_list_that_fails(make_stub: StubFactory, tmp_path: Path) -> None:
    """The graphics query failing (not NOT_SUPPORTED): graphics processes may hide there, so no
    pod's total is known; the compute list's containers are still exported."""
    scenario = two_gpus().add("fail 1 graphics_procs 999")
    snap_json, snap = read(make_stub(scenario), tmp_path)
    d1 = snap_json["gpu"]["devices"][1]
    assert d1["processes_missing"] == ["graphics"]
    assert "processes (graphics): Unknown Error" in d1["errors"]
    assert [p["pid"] for p in d1["processes"]] == [5151]
    assert set(pod_gpu(snap).values()) == {None}


def test_lists_not_supported_on_a_device_lose_nothing(
    make_stub: StubFactory, tmp_path: Path
) -> None:
    """NOT_SUPPORTED graphics (the device has no graphics contexts) and NOT_SUPPORTED MPS with
    no server: the compute list is all there is."""
    scenario = (
        Scenario()
        .gpu(0, UUID0, total=80 * GiB, reserved=0, used=4 * GiB, name=H100)
        .proc(0, 6001, 4 * GiB)
        .add(f"fail 0 graphics_procs {NOT_SUPPORTED}")
        .add(f"fail 0 mps_procs {NOT_SUPPORTED}")
    )
    snap_json, snap = read(make_stub(scenario), tmp_path)
    dev = snap_json["gpu"]["devices"][0]
    assert (dev["processes_missing"], dev["errors"]) == ([], [])
    assert pod_gpu(snap)[UID_G] == 4 * GiB and pod_gpu(snap)[UID_B] == 0


def test_a_pre_volta_mps_gpu(make_stub: StubFactory, tmp_path: Path) -> None:
    """Before Volta the MPS list is NOT_SUPPORTED and the clients live in the server's context:
    the server's memory is theirs, none of it is known per pod."""
    scenario = (
        Scenario()
        .gpu(0, UUID0, total=16 * GiB, reserved=0, used=9 * GiB, name="Tesla P100-PCIE-16GB")
        .proc(0, SERVER, 9 * GiB)
        .add(f"fail 0 mps_procs {NOT_SUPPORTED}")
    )
    snap_json, snap = read(make_stub(scenario), tmp_path)
    assert snap_json["gpu"]["devices"][0]["processes_missing"] == ["mps"]
    assert set(pod_gpu(snap).values()) == {None}
    plan, usage = gpu_eviction_plan(snapshot=snap, device=snap.gpu.devices[0], flt=EvictFilter())  # type: ignore[union-attr]
    assert (plan.ranked, usage) == ((), {})  # never the device plugin's pod


def test_a_driver_with_the_lists_v2_only(make_stub: StubFactory, tmp_path: Path) -> None:
    """No _v3 symbols (FUNCTION_NOT_FOUND): each list's _v2, the same struct."""
    stub = make_stub(two_gpus(), variant="no-procs-v3")
    with agent(stub, flags(host(tmp_path)), tmp_path) as base:
        body = metrics(base)
    assert used(body, UID_G) == 10 * GiB and used(body, UID_BE) == 4 * GiB
    assert used(body, UID_B, gpu="1") == 3 * GiB
    assert count(body, UID_DP) is None


def test_a_driver_without_any_process_list(make_stub: StubFactory, tmp_path: Path) -> None:
    snap_json, snap = read(make_stub(two_gpus(), variant="no-procs"), tmp_path)
    for dev in snap_json["gpu"]["devices"]:
        assert dev["processes"] is None
        assert dev["errors"][-1] == (
            "processes: nvmlDeviceGetComputeRunningProcesses_v3 / "
            "nvmlDeviceGetComputeRunningProcesses_v2 not in this driver"
        )
    assert set(pod_gpu(snap).values()) == {None}


# -- MIG ------------------------------------------------------------------------------------------
def test_mig_instances_list_their_own_mps_and_compute_processes(
    make_stub: StubFactory, tmp_path: Path
) -> None:
    """MPS inside a MIG instance: the instance's handle lists its server and clients; graphics
    is NOT_SUPPORTED on a MIG device (the stub, as MIG has no graphics contexts), which hides
    nothing."""
    scenario = (
        Scenario()
        .gpu(0, UUID0, total=80 * GiB, reserved=512 * MiB, used=12 * GiB, mig=1, name=H100)
        .mig(0, 0, "MIG-aaaa0000-0000-4000-8000-000000000001", gi=1, ci=0, total=40 * GiB,
             used=8 * GiB)
        .mig(0, 3, "MIG-aaaa0000-0000-4000-8000-000000000002", gi=2, ci=0, total=20 * GiB,
             used=4 * GiB)
        .proc(0, SERVER, 8 * GiB, slot=0)
        .proc(0, 6001, 5 * GiB, slot=0, list="mps")
        .proc(0, 6003, 3 * GiB, slot=0, list="mps")
        .proc(0, 4242, 4 * GiB, slot=3)
    )  # fmt: skip
    stub = make_stub(scenario)
    with agent(stub, flags(host(tmp_path)), tmp_path) as base:
        body, snap = metrics(base), snapshot_of(base)
    assert used(body, UID_G, mig="1") == 5 * GiB
    assert used(body, UID_BE, mig="1") == 3 * GiB
    assert used(body, UID_B, mig="2") == 4 * GiB
    assert count(body, UID_DP, mig="1") is None
    dev = snap["gpu"]["devices"][0]
    assert (dev["processes_missing"], dev["errors"]) == ([], [])
    by_pid = {p["pid"]: p for p in dev["processes"]}
    assert (by_pid[6003]["mig_gpu_instance_id"], by_pid[6003]["lists"]) == (1, ["mps"])
    assert by_pid[SERVER]["mps_server"] is True
    assert len(samples(body, "nodeguard_gpu_container_processes")) == 3


def test_the_fixture_host_still_reads(make_stub: StubFactory, tmp_path: Path) -> None:
    """The plain compute list of a non-shared GPU, as before: nothing missing, nothing marked."""
    scenario = (
        Scenario()
        .gpu(0, UUID0, total=80 * GiB, reserved=0, used=10 * GiB, name=H100)
        .proc(0, 5151, 10 * GiB)
    )
    snap_json, _ = read(make_stub(scenario), tmp_path)
    (p,) = snap_json["gpu"]["devices"][0]["processes"]
    assert (p["lists"], p["mps_server"], p["used_bytes"]) == (["compute"], False, 10 * GiB)
