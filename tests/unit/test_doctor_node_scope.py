"""The doctor's checks of scope ``node`` as the agent runs them: the node-scoped cluster, the
counts by check and severity (a 0 for every one a node check can report), the views kept from
the pod watch's JSON (:class:`~nodeguard.agent.posture.NodePosture`) and the gauge
``nodeguard_posture_findings`` rendered from them."""

from __future__ import annotations

import dataclasses
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

import nodeguard.doctor  # noqa: F401  (registers every check)
from nodeguard.agent.posture import NodePosture, PostureCollector
from nodeguard.doctor.node_scope import PostureKey, node_cluster, posture_counts
from nodeguard.doctor.registry import CHECKS, node_checks, run_checks
from nodeguard.kube.pod_store import PodStore
from tests.support.doctor import cluster, container, limit_range, node, pod, quota

#: What a node can be found with: every node check and each severity it declares.
NODE_KEYS = {
    PostureKey("unbounded-memory", "error"),
    PostureKey("overcommit", "warning"),
    PostureKey("overcommit", "error"),
    PostureKey("node-reserve", "warning"),
    PostureKey("node-reserve", "error"),
}


def test_the_node_checks_are_those_that_need_no_quota_and_no_other_node() -> None:
    assert [c.id for c in node_checks()] == ["node-reserve", "overcommit", "unbounded-memory"]
    assert CHECKS["quota-limitrange"].scope == "cluster"
    assert {PostureKey(c.id, s) for c in node_checks() for s in c.severities} == NODE_KEYS


def test_the_node_cluster_holds_the_node_and_its_pods_only() -> None:
    gpu = node("gpu-1", gpus=8)
    mine, theirs = pod("mine", node="gpu-1"), pod("theirs", node="gpu-2")
    unbound = pod("pending", node="")
    c = node_cluster(node=gpu, pods=[mine, theirs, unbound])
    assert c.nodes == (gpu,)
    assert [p.meta.name for p in c.pods] == ["mine"]
    assert c.quotas == () and c.limit_ranges == () and c.in_scope("any")


def test_a_node_check_finds_on_the_node_cluster_what_it_finds_for_that_node_in_the_cluster() -> (
    None
):
    # A cluster that trips every check, quotas and other nodes included: each node's findings
    # of the node checks are the same whether the whole cluster is read or the node alone.
    nodes = (
        node("gpu-1", memory="64Gi", allocatable="60Gi", gpus=8),
        node("packed", memory="8Gi", allocatable="7Gi"),
        node("bare", memory="32Gi"),
    )
    pods = (
        pod("prep", node="gpu-1", containers=[container(request="2Gi")]),
        pod("be", node="gpu-1", qos="BestEffort"),
        pod("big", node="packed", containers=[container(request="6Gi", limit="12Gi")]),
        pod("huge", node="packed", namespace="other", containers=[container(request="4Gi")]),
        pod("fine", node="bare", containers=[container(request="1Gi", limit="1Gi")]),
        pod("done", node="packed", phase="Succeeded", containers=[container(request="60Gi")]),
    )
    whole = cluster(
        nodes=nodes,
        pods=pods,
        quotas=(quota("q", hard={"limits.memory": "1Gi"}),),
        limit_ranges=(
            limit_range("lr", limits=[{"type": "Container", "default": {"memory": "2Gi"}}]),
        ),
    )
    ids = {c.id for c in node_checks()}
    everywhere = [f for f in run_checks(whole) if f.check in ids]
    assert {f.check for f in everywhere} == ids  # the scene trips each of them
    for n in nodes:
        on_node = [
            f for f in everywhere if any(o.kind == "Node" and o.name == n.name for o in f.objects)
        ]
        alone = [f for c in node_checks() for f in c.run(node_cluster(node=n, pods=pods))]
        assert sorted(alone, key=repr) == sorted(on_node, key=repr), n.name


def test_pods_on_from_the_index_is_the_plain_scan() -> None:
    # The fast path (pods indexed by node once) against the filter it replaced.
    phases = ("Running", "Succeeded", "Failed", "Pending")
    bound = [pod(f"p{i}", node=f"n{i % 3}", phase=phases[i % 4]) for i in range(24)]
    pods = (*bound, pod("unbound", node=""))
    c = cluster(nodes=(node("n0"), node("n1")), pods=pods)
    for name in ("n0", "n1", "n2", "", "absent"):
        plain = [p for p in pods if p.meta.node_name == name and not p.meta.finished]
        assert c.pods_on(name) == plain, name
    assert c.pods_on("n0")  # something to compare
    # A copy made with dataclasses.replace is indexed anew.
    moved = dataclasses.replace(c, pods=pods[:1])
    assert [p.meta.name for p in moved.pods_on("n0")] == ["p0"] and moved.pods_on("n1") == []


def test_counts_are_zero_for_every_node_check_and_severity_on_a_clean_node() -> None:
    clean = node("gpu-1", memory="64Gi", allocatable="60Gi", gpus=8)
    bounded = pod("p", node="gpu-1", containers=[container(request="1Gi", limit="2Gi")])
    counts = posture_counts(node_cluster(node=clean, pods=[bounded]))
    assert counts == dict.fromkeys(NODE_KEYS, 0)


def test_counts_are_the_findings_by_check_and_severity() -> None:
    gpu = node("gpu-1", memory="8Gi", gpus=1)  # nothing reserved: node-reserve error
    pods = [
        pod("a", node="gpu-1", containers=[container(request="1Gi")]),
        pod("b", node="gpu-1", qos="BestEffort"),
        pod("c", node="gpu-1", containers=[container(request="1Gi", limit="9Gi")]),
    ]
    counts = posture_counts(node_cluster(node=gpu, pods=pods))
    assert counts == {
        **dict.fromkeys(NODE_KEYS, 0),
        PostureKey("unbounded-memory", "error"): 2,
        PostureKey("overcommit", "warning"): 1,  # 9 GiB of limits on 8 GiB
        PostureKey("node-reserve", "error"): 1,
    }


def _pod_doc(name: str, *, limit: str | None, node_name: str = "gpu-1") -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"memory": "1Gi"}}
    if limit:
        resources["limits"] = {"memory": limit}
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
        },
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "main", "image": "pause", "resources": resources}],
        },
        "status": {"phase": "Running", "qosClass": "Burstable"},
    }


NODE_DOC = {
    "metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.present": "true"}},
    "status": {"capacity": {"memory": "64Gi"}, "allocatable": {"memory": "60Gi"}},
}


def _unbounded(posture: NodePosture) -> int | None:
    counts = posture.counts()
    return None if counts is None else counts[PostureKey("unbounded-memory", "error")]


def test_the_posture_follows_the_pod_store_and_is_no_data_until_pods_and_node_are_read() -> None:
    posture = NodePosture()
    store = PodStore(listener=posture)
    assert not posture.evaluate() and posture.counts() is None
    store.replace([_pod_doc("bounded", limit="2Gi"), _pod_doc("loose", limit=None)])
    assert not posture.evaluate() and posture.counts() is None  # the Node not read yet
    posture.node_read(NODE_DOC)
    assert posture.evaluate() and _unbounded(posture) == 1
    assert not posture.evaluate()  # nothing changed: not run again
    store.apply({"type": "ADDED", "object": _pod_doc("loose-2", limit=None)})
    store.apply({"type": "ADDED", "object": _pod_doc("elsewhere", limit=None, node_name="n2")})
    assert posture.evaluate() and _unbounded(posture) == 2
    store.apply({"type": "MODIFIED", "object": _pod_doc("loose-2", limit=None)})
    assert not posture.evaluate()  # the same pod again changes no view
    for name in ("loose", "loose-2"):
        store.apply({"type": "DELETED", "object": _pod_doc(name, limit=None)})
    assert posture.evaluate() and _unbounded(posture) == 0
    counts = posture.counts()
    assert counts is not None and set(counts) == NODE_KEYS
    # A relist is the node's pods exactly: one left out is gone from the views too.
    store.replace([_pod_doc("kept", limit=None)])
    assert posture.evaluate() and _unbounded(posture) == 1


def _exposition(posture: NodePosture) -> str:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(PostureCollector(posture=posture))
    return generate_latest(registry).decode()


def test_the_gauge_is_absent_before_the_first_evaluation_then_one_series_per_key() -> None:
    posture = NodePosture()
    assert "nodeguard_posture_findings" not in _exposition(posture)
    posture.pods_listed([_pod_doc("loose", limit=None)])
    posture.node_read(NODE_DOC)
    assert "nodeguard_posture_findings" not in _exposition(posture)  # not yet evaluated
    posture.evaluate()
    series = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in _exposition(posture).splitlines()
        if line.startswith("nodeguard_posture_findings{")
    }
    assert series == {
        'nodeguard_posture_findings{check="node-reserve",severity="error"}': 0.0,
        'nodeguard_posture_findings{check="node-reserve",severity="warning"}': 0.0,
        'nodeguard_posture_findings{check="overcommit",severity="error"}': 0.0,
        'nodeguard_posture_findings{check="overcommit",severity="warning"}': 0.0,
        'nodeguard_posture_findings{check="unbounded-memory",severity="error"}': 1.0,
    }
