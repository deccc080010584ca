"""``nodeguard doctor``'s ``node-reserve`` check on typed inputs: allocatable against capacity."""

from __future__ import annotations

import nodeguard.doctor  # noqa: F401  (registers every check)
from nodeguard.doctor.findings import Finding
from nodeguard.doctor.inputs import Cluster
from nodeguard.doctor.node_reserve import kube_reserved_mib
from nodeguard.doctor.registry import CHECKS
from tests.support.doctor import GiB, MiB, cluster, node


def found(c: Cluster) -> list[Finding]:
    return list(CHECKS["node-reserve"].run(c))


def test_allocatable_equal_to_capacity_is_an_error() -> None:
    (f,) = found(cluster(nodes=(node("n1", memory="1Ti"),)))
    assert f.severity == "error"
    assert f.title == "node n1 reserves no memory: allocatable equals capacity"
    facts = {x.label: x.bytes for x in f.evidence}
    assert facts == {
        "capacity": 1024 * GiB,
        "huge pages": 0,
        "allocatable": 1024 * GiB,
        "reserved": 0,
    }
    # GKE's table on 1 TiB: 1 + 0.8 + 0.8 + 112 * 0.06 + 896 * 0.02 = 27.24 GiB.
    assert "kubeReserved:\n  memory: 27893Mi" in f.fix
    assert "memory.available: 10485Mi" in f.fix  # 1 % of capacity
    # One evictionHard threshold set drops the kubelet's other defaults: the disk ones kept.
    # The kubelet's five Linux defaults (pkg/kubelet/eviction/defaults_linux.go).
    for default in (
        "nodefs.available: 10%",
        "imagefs.available: 15%",
        "nodefs.inodesFree: 5%",
        "imagefs.inodesFree: 5%",
    ):
        assert default in f.fix


def test_only_the_default_eviction_threshold_warns_and_huge_pages_are_not_a_reserve() -> None:
    # 64 GiB with 8 GiB of huge pages: the kubelet subtracts those from allocatable too.
    (f,) = found(cluster(nodes=(node("n1", memory="64Gi", allocatable="56Gi", hugepages="8Gi"),)))
    assert f.severity == "error"
    (w,) = found(cluster(nodes=(node("n1", memory="64Gi", allocatable=f"{64 * 1024 - 100}Mi"),)))
    assert w.severity == "warning"
    assert {x.label: x.bytes for x in w.evidence}["reserved"] == 100 * MiB


def test_a_node_with_a_real_reserve_is_fine() -> None:
    assert found(cluster(nodes=(node("n1", memory="64Gi", allocatable="60Gi"),))) == []


def test_kube_reserved_follows_the_documented_table() -> None:
    assert kube_reserved_mib(4 * GiB) == 1024
    assert kube_reserved_mib(16 * GiB) == 2662  # (4 * 25 % + 4 * 20 % + 8 * 10 %) GiB
