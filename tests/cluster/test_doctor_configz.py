"""``node-reserve`` with the kubelets' ``configz`` through the real kube-apiserver's node proxy:
refused with the shipped read-only ClusterRole (one note, the status-based findings), read
with the optional ``nodeguard-doctor-kubelet-config`` from a stand-in kubelet the API server
really proxies to (its TLS unverified, as the API server does without
``--kubelet-certificate-authority``)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.controlplane.cluster import TestCluster
from tests.support.doctor_cluster import (
    doctor_account,
    doctor_node,
    proxy_address,
    run_doctor,
    stand_in_kubelet,
)
from tests.support.kube_helpers import Cluster

GiB = 2**30
#: The kubelet's answer (pkg/util/configz: {"kubeletconfig": KubeletConfiguration v1beta1}).
CONFIGZ = {
    "kubeletconfig": {
        "kind": "KubeletConfiguration",
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "10%"},
        "kubeReserved": {"memory": "11Gi"},
    }
}


def _notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("nodeguard doctor: note: ")]


def test_refused_the_check_assumes_the_default_and_says_so_once(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path
) -> None:
    bare = doctor_node(cluster, memory="32Gi", allocatable="32Gi")
    big = doctor_node(cluster, memory="1Ti", allocatable=f"{1024 - 12}Gi")
    kubeconfig = doctor_account(
        cluster, control_plane, tmp_path / "kubeconfig", cluster_roles=["nodeguard-doctor"]
    )
    rc, out, err = run_doctor(kubeconfig, "--json", f"--node={bare}", f"--node={big}")
    assert rc == 1, err
    report = json.loads(out)
    # From the status alone: the node with nothing reserved; the 1 TiB node looks fine.
    assert [(f["check"], f["objects"][0]["name"]) for f in report["findings"]] == [
        ("node-reserve", bare)
    ]
    (note,) = _notes(err)
    assert note == (
        "nodeguard doctor: note: the kubelets' configz was not read for 2 node(s) (get "
        "nodes/proxy forbidden; optional: nodeguard-doctor-kubelet-config in "
        "docs/doctor-rbac.yaml): node-reserve assumed the kubelet's default hard eviction "
        "threshold memory.available<100Mi"
    )


def test_a_kubelet_the_api_server_cannot_reach_is_one_note_too(
    cluster: Cluster, control_plane: TestCluster
) -> None:
    # No status.addresses: the API server has nowhere to proxy to.
    nodes = [doctor_node(cluster, memory="64Gi", allocatable="60Gi") for _ in range(2)]
    rc, out, err = run_doctor(
        control_plane.kubeconfig_path, "--json", *(f"--node={n}" for n in nodes)
    )
    assert (rc, json.loads(out)["findings"]) == (0, []), err
    (note,) = _notes(err)
    assert "could not be read for 2 node(s)" in note
    assert "the API server could not reach the kubelet" in note


def test_with_nodes_proxy_the_real_eviction_threshold_is_read_through_the_api_server(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path
) -> None:
    with (
        proxy_address() as ip,
        stand_in_kubelet(tmp_path, ip=ip, configz=CONFIGZ) as (
            port,
            asked,
        ),
    ):
        big = doctor_node(
            cluster, memory="1Ti", allocatable=f"{1024 - 12}Gi", gpus=8, kubelet=(ip, port)
        )
        kubeconfig = doctor_account(
            cluster,
            control_plane,
            tmp_path / "kubeconfig",
            cluster_roles=["nodeguard-doctor", "nodeguard-doctor-kubelet-config"],
        )
        rc, out, err = run_doctor(kubeconfig, "--json", "--fail-on=warning", f"--node={big}")
    assert "/configz" in asked  # the API server really asked the stand-in
    report = json.loads(out)
    reserve = [f for f in report["findings"] if f["check"] == "node-reserve"]
    assert [(f["severity"], f["title"]) for f in reserve] == [
        ("warning", f"node {big}: hard eviction at memory.available<100Mi, under 1 % of the node")
    ], err
    facts = {e["label"]: e.get("bytes", e.get("text")) for e in reserve[0]["evidence"]}
    assert (facts["kubeReserved"], facts["evictionHard memory.available"]) == (11 * GiB, "100Mi")
    assert rc == 1
    assert not [n for n in _notes(err) if "configz" in n]
