"""GPU signals, the ``gpu`` scope in rules and the engine, and a GPU rule's eviction against the
real kube-apiserver: on snapshots built here (the NVML side is tested in test_gpu.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from nodeguard.firing import Firing
from nodeguard.kube.client import KubeClient
from nodeguard.kube.objects import pod_meta
from nodeguard.remediation.incidents import evidence
from nodeguard.rules.engine import RuleEngine
from nodeguard.rules.load import load_rules
from nodeguard.rules.schema import Rule
from nodeguard.rules.signals import SIGNALS, History, targets
from nodeguard.snapshot import (
    GpuDevice,
    GpuInfo,
    GpuMemory,
    GpuProcess,
    NodeSnapshot,
    PodMemory,
    PodMeta,
)
from tests.support.acting import env_for, run_action
from tests.support.controlplane.cluster import TestCluster
from tests.support.hosts import cgroup_memory
from tests.support.kube_helpers import Cluster

GiB = 1 << 30
MiB = 1 << 20
UUID0, UUID1 = "GPU-aaaa", "GPU-bbbb"


def proc(pid: int, used: int | None, uid: str | None, cid: str | None = "c") -> GpuProcess:
    return GpuProcess(
        pid=pid,
        used_bytes=used,
        mig_gpu_instance_id=None,
        mig_compute_instance_id=None,
        cgroup=None,
        pod_uid=uid,
        container_id=cid if uid else None,
    )


def device(index: int, uuid: str, memory: GpuMemory | None, *procs: GpuProcess) -> GpuDevice:
    return GpuDevice(
        index=index,
        uuid=uuid,
        name="NVIDIA H100 80GB HBM3",
        mig_enabled=False,
        memory=memory,
        mig_devices=(),
        processes=procs,
    )


def snapshot(
    devices: tuple[GpuDevice, ...] | None,
    *,
    pods: tuple[str, ...] = (),
    meta: dict[str, PodMeta] | None = None,
    node: str = "node-a",
    t: float = 100.0,
) -> NodeSnapshot:
    return NodeSnapshot(
        timestamp=t,
        node_name=node,
        meminfo=None,
        pressure=None,
        pods=tuple(
            PodMemory(
                uid=u, qos_class="burstable", memory=cgroup_memory(f"/{u}", used=GiB), containers=()
            )
            for u in pods
        ),
        oom=None,
        processes=(),
        collectors=(),
        pod_meta=meta,
        gpu=None if devices is None else GpuInfo(driver_version="550.54.15", devices=devices),
    )


V2 = GpuMemory(
    total_bytes=80 * GiB,
    used_bytes=60 * GiB,
    free_bytes=19 * GiB + 512 * MiB,
    reserved_bytes=512 * MiB,
    info_version=2,
)
V1 = GpuMemory(  # the same GPU as a v1-only driver reports it
    total_bytes=80 * GiB,
    used_bytes=60 * GiB + 512 * MiB,
    free_bytes=19 * GiB + 512 * MiB,
    reserved_bytes=None,
    info_version=1,
)


def sig(snap: NodeSnapshot, name: str, key: str) -> float | None:
    s = SIGNALS[name]
    target = next(t for t in targets(snap, s.scope) if t.key == key)
    return s.fn(snap, History(), target)


def test_gpu_targets_and_signals() -> None:
    snap = snapshot(
        (
            device(0, UUID0, V2, proc(1, 10 * GiB, "pa"), proc(2, 5 * GiB, "pa", "d")),
            device(1, UUID1, V1, proc(3, 20 * GiB, "pb"), proc(4, None, "pc")),
        ),
        pods=("pa", "pb", "pc", "pd"),
    )
    assert [t.key for t in targets(snap, "gpu")] == [UUID0, UUID1]
    in_use = (60 * GiB + 512 * MiB) / (80 * GiB)
    assert sig(snap, "gpu_memory_used_ratio", UUID0) == pytest.approx(in_use)
    assert sig(snap, "gpu_memory_used_ratio", UUID1) == pytest.approx(in_use)  # v1 agrees
    assert sig(snap, "gpu_memory_free_bytes", UUID1) == 19 * GiB + 512 * MiB
    assert sig(snap, "pod_gpu_memory_used_bytes", "pa") == 15 * GiB  # two containers
    assert sig(snap, "pod_gpu_memory_used_bytes", "pb") == 20 * GiB
    assert sig(snap, "pod_gpu_memory_used_bytes", "pc") is None  # memory not available
    assert sig(snap, "pod_gpu_memory_used_bytes", "pd") == 0  # known: on no GPU

    lost = GpuDevice(
        index=1,
        uuid=UUID1,
        name=None,
        mig_enabled=None,
        memory=None,
        mig_devices=(),
        processes=None,
        lost=True,
    )
    partial = snapshot((device(0, UUID0, V2, proc(1, GiB, "pa")), lost), pods=("pa", "pd"))
    assert sig(partial, "gpu_memory_used_ratio", UUID1) is None
    assert sig(partial, "pod_gpu_memory_used_bytes", "pd") is None  # GPU 1 could hold it
    nogpu = snapshot(None, pods=("pa",))
    assert targets(nogpu, "gpu") == []
    assert sig(nogpu, "pod_gpu_memory_used_bytes", "pa") is None


def rule(**over: Any) -> Rule:
    data: dict[str, Any] = {
        "name": "gpu-full",
        "scope": "gpu",
        "when": [{"signal": "gpu_memory_used_ratio", "op": ">", "value": 0.9}],
        "for": "30s",
        "actions": [{"action": "record"}],
    }
    data.update(over)
    return Rule.model_validate(data)


def test_a_gpu_rule_fires_per_device() -> None:
    full = GpuMemory(
        total_bytes=80 * GiB, used_bytes=78 * GiB, free_bytes=GiB, reserved_bytes=GiB,
        info_version=2,
    )  # fmt: skip
    engine = RuleEngine(rules=[rule()])

    def at(t: float) -> list[Firing]:
        snap = snapshot((device(0, UUID0, V2), device(1, UUID1, full)), t=t)
        return engine.evaluate(snap, global_dry_run=True)

    assert at(0) == []
    fired = at(30)
    assert [(f.rule, f.scope, f.target) for f in fired] == [("gpu-full", "gpu", UUID1)]
    assert fired[0].values["gpu_memory_used_ratio"] == pytest.approx(79 / 80)


def test_gpu_scope_takes_only_gpu_signals() -> None:
    with pytest.raises(ValidationError, match="is a pod signal, but the rule's scope is gpu"):
        rule(when=[{"signal": "pod_gpu_memory_used_bytes", "op": ">", "value": 1}])


def test_the_documented_gpu_rules_load(tmp_path: Path) -> None:
    doc = (Path(__file__).parents[2] / "docs" / "gpu.md").read_text()
    (block,) = re.findall(r"```yaml\n(.*?)```", doc, re.S)
    (tmp_path / "gpu.yaml").write_text(block)
    rules = load_rules([tmp_path / "gpu.yaml"]).rules
    assert [(r.name, r.scope) for r in rules] == [
        ("gpu-memory-full", "gpu"),
        ("pod-gpu-hog", "pod"),
    ]


def test_incident_evidence_names_containers_on_each_gpu() -> None:
    snap = snapshot((device(0, UUID0, V2, proc(7, 3 * GiB, "pa"), proc(8, None, None)),))
    gpu = evidence(snap)["gpu"]
    assert gpu["driver_version"] == "550.54.15"
    (dev,) = gpu["devices"]
    assert dev["memory"]["reserved_bytes"] == 512 * MiB
    assert [(p["pid"], p["pod"], p["container"]) for p in dev["processes"]] == [
        (7, "pa", "c"),
        (8, None, None),
    ]
    assert evidence(snapshot(None))["gpu"] is None


async def test_a_gpu_rule_evicts_only_pods_on_that_gpu(
    cluster: Cluster, control_plane: TestCluster
) -> None:
    ns, node = cluster.namespace("gpu"), cluster.node()

    def pod(name: str, priority: str) -> PodMeta:
        created = cluster.pod(
            namespace=ns, node=node, name=name, request="1Gi", priority_class=priority
        )
        return pod_meta(created)

    small, big, mid, other = (
        pod("small-low", "nodeguard-test-low"),
        pod("big-low", "nodeguard-test-low"),
        pod("mid", "nodeguard-test-mid"),
        pod("other-gpu", "nodeguard-test-low"),
    )

    def on(meta: PodMeta, pid: int, used: int) -> GpuProcess:
        return proc(pid, used, meta.uid, next(iter(meta.containers)))

    snap = snapshot(
        (
            device(
                0, UUID0, V2, on(small, 1, 10 * GiB), on(big, 2, 20 * GiB), on(mid, 3, 30 * GiB)
            ),
            device(1, UUID1, V2, on(other, 4, 40 * GiB)),
        ),
        meta={m.uid: m for m in (small, big, mid, other)},
        node=node,
    )
    kube = KubeClient.load(kubeconfig=control_plane.kubeconfig_path)
    try:
        env = env_for(kube, node)

        async def evict(free: str | None, dry: bool) -> Any:
            (result,) = await run_action(
                env=env,
                node=node,
                action="evict",
                args={"free": free} if free else {},
                dry_run=dry,
                rule="gpu-full",
                source="local",
                scope="gpu",
                target=UUID0,
                snapshot=snap,
            )
            return result

        # 25 GiB of GPU 0: the low-priority pods, the larger first; never the pod on GPU 1,
        # never the mid-priority pod while the low ones suffice.
        plan = await evict("25Gi", True)
        assert plan.outcome == "done", plan.message
        assert [u["pods"] for u in plan.details["evicted"]] == [
            [f"{ns}/big-low"],
            [f"{ns}/small-low"],
        ]
        assert plan.details["freed_bytes"] == 30 * GiB
        assert f"20.0 GiB of GPU memory on GPU 0 ({UUID0})" in plan.details["evicted"][0]["why"]
        # A percent is of that GPU's memory: 30 % of 80 GiB = 24 GiB, the same two pods.
        assert (await evict("30%", True)).details["freed_bytes"] == 30 * GiB
        # Without `free`: the first unit alone, for real.
        done = await evict(None, False)
        assert [u["pods"] for u in done.details["evicted"]] == [[f"{ns}/big-low"]]
        gone = cluster.pod_json(ns, "big-low")
        assert gone is None or gone["metadata"].get("deletionTimestamp")
        for name in ("small-low", "mid", "other-gpu"):
            alive = cluster.pod_json(ns, name)
            assert alive is not None and not alive["metadata"].get("deletionTimestamp"), name
    finally:
        kube.close()
