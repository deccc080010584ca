"""``node-reserve`` with the kubelet's running configuration (``configz``): the eviction
threshold told from the reserves."""

from __future__ import annotations

from typing import Any

import nodeguard.doctor  # noqa: F401  (registers every check)
from nodeguard.doctor.findings import Finding
from nodeguard.doctor.inputs import Cluster, NodeView
from nodeguard.doctor.node_reserve import eviction_bytes
from nodeguard.doctor.read_kubelet import kubelet_config_view
from nodeguard.doctor.registry import CHECKS
from tests.support.doctor import GiB, MiB, node

TiB = 1024 * GiB


def configz(**config: Any) -> dict[str, Any]:
    """A configz answer shaped as the kubelet writes it (pkg/util/configz: the registered name,
    then the KubeletConfiguration's v1beta1 JSON)."""
    return {
        "kubeletconfig": {
            "kind": "KubeletConfiguration",
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            **config,
        }
    }


def found(n: NodeView, answer: dict[str, Any] | None) -> list[Finding]:
    views = () if answer is None else (kubelet_config_view(n.name, answer),)
    c = Cluster(
        nodes=(n,),
        pods=(),
        quotas=(),
        limit_ranges=(),
        kubelet_configs=tuple(v for v in views if v),
    )
    return list(CHECKS["node-reserve"].run(c))


def test_the_configz_fields_are_read_in_bytes() -> None:
    view = kubelet_config_view(
        "n1",
        configz(
            evictionHard={"memory.available": "5%", "nodefs.available": "10%"},
            systemReserved={"memory": "1Gi", "cpu": "500m"},
        ),
    )
    assert view is not None
    assert (
        view.eviction_memory_available,
        view.system_reserved_bytes,
        view.kube_reserved_bytes,
    ) == ("5%", GiB, None)
    assert kubelet_config_view("n1", {"other": {}}) is None
    assert (eviction_bytes("100Mi", capacity=TiB), eviction_bytes("5%", capacity=100 * GiB)) == (
        100 * MiB,
        5 * GiB,
    )
    assert eviction_bytes("lots", capacity=TiB) is None


def test_the_default_threshold_on_a_terabyte_node_is_a_warning_even_with_reserves() -> None:
    big = node("big", memory="1Ti", allocatable=f"{1024 - 12}Gi", gpus=8)
    answer = configz(evictionHard={"memory.available": "100Mi"}, kubeReserved={"memory": "11Gi"})
    (f,) = found(big, answer)
    assert (f.severity, f.title) == (
        "warning",
        "node big: hard eviction at memory.available<100Mi, under 1 % of the node",
    )
    assert ("source", None, "the kubelet's configz") in [
        (x.label, x.bytes, x.text) for x in f.evidence
    ]
    # From its status alone (12 GiB reserved) the same node is fine: only configz shows it.
    assert found(big, None) == []
    # At 1 % it is fine; a percentage is of capacity.
    assert (
        found(
            big, configz(evictionHard={"memory.available": "1%"}, kubeReserved={"memory": "11Gi"})
        )
        == []
    )


def test_no_memory_threshold_and_no_reserves_are_warnings() -> None:
    n = node("n1", memory="64Gi", allocatable="63Gi")
    (f,) = found(
        n, configz(evictionHard={"nodefs.available": "10%"}, systemReserved={"memory": "1Gi"})
    )
    assert f.title == "node n1: no hard memory eviction threshold"
    (f,) = found(n, configz(evictionHard={"memory.available": "1Gi"}))
    assert f.title == "node n1: nothing in systemReserved or kubeReserved"
    assert (
        found(
            n, configz(evictionHard={"memory.available": "1Gi"}, systemReserved={"memory": "1Gi"})
        )
        == []
    )


def test_allocatable_equal_to_capacity_stays_an_error_whatever_configz_says() -> None:
    n = node("bare", memory="32Gi", allocatable="32Gi")
    (f,) = found(n, configz(evictionHard={"memory.available": "1Gi"}))
    assert (f.severity, f.title) == (
        "error",
        "node bare reserves no memory: allocatable equals capacity",
    )
