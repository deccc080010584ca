"""``nodeguard doctor``'s ``overcommit`` check on typed inputs: a node's requests and limits
summed as ``kubectl describe node`` does, against allocatable."""

from __future__ import annotations

import nodeguard.doctor  # noqa: F401  (registers every check)
from nodeguard.doctor.findings import Finding
from nodeguard.doctor.inputs import Cluster
from nodeguard.doctor.registry import CHECKS
from tests.support.doctor import GiB, cluster, container, node, pod


def found(c: Cluster) -> list[Finding]:
    return list(CHECKS["overcommit"].run(c))


def test_limits_past_allocatable_warn_and_name_the_largest_three() -> None:
    n = node("gpu-1", memory="64Gi", allocatable="60Gi")
    pods = tuple(
        pod(f"p{i}", node="gpu-1", containers=[container(request="1Gi", limit=f"{10 + i}Gi")])
        for i in range(5)
    )  # limits 10..14 Gi: 60 Gi, plus one without a limit (not counted) = exactly 60 Gi
    assert found(cluster(nodes=(n,), pods=(*pods, pod("free", node="gpu-1")))) == []
    more = pod("big", node="gpu-1", containers=[container(request="1Gi", limit="20Gi")])
    (f,) = found(cluster(nodes=(n,), pods=(*pods, more)))
    assert f.severity == "warning"
    assert f.title == "memory limits of node gpu-1 at 133 % of allocatable"
    assert [o.name for o in f.objects] == ["gpu-1", "big", "p4", "p3"]
    facts = {x.label: x.bytes for x in f.evidence}
    assert facts["limits summed"] == 80 * GiB
    assert facts["allocatable"] == 60 * GiB
    assert facts["over by"] == 20 * GiB
    assert facts["ml/big limits"] == 20 * GiB


def test_requests_past_allocatable_are_an_error_and_sidecars_count_as_the_scheduler_counts() -> (
    None
):
    n = node("n1", memory="8Gi")
    # Init containers need max(init, sum): a 6Gi init beside 2Gi app containers requests 6Gi;
    # a 1Gi sidecar adds to both (KEP-753): 3Gi app + sidecar, 7Gi for the init step.
    p = pod(
        "p",
        node="n1",
        containers=[container(request="2Gi", limit="2Gi")],
        init=[
            container("proxy", request="1Gi", limit="1Gi", restart_policy="Always"),
            container("fetch", request="6Gi", limit="6Gi"),
        ],
    )
    q = pod("q", node="n1", containers=[container(request="1Gi", limit="1Gi")])
    assert found(cluster(nodes=(n,), pods=(p, q))) == []  # 7 + 1 = 8 Gi: exactly allocatable
    r = pod("r", node="n1", containers=[container(request="512Mi", limit="512Mi")])
    kinds = {f.title.split()[1]: f for f in found(cluster(nodes=(n,), pods=(p, q, r)))}
    assert kinds["requests"].severity == "error"
    assert {x.label: x.bytes for x in kinds["requests"].evidence}["requests summed"] == (
        8 * GiB + GiB // 2
    )
    assert kinds["limits"].severity == "warning"
    # The largest has no controller: deleting it would lose it, so no delete is offered.
    assert "delete pod" not in kinds["requests"].fix
    assert "ml/p, has no controller" in kinds["requests"].fix, kinds["requests"].fix


def test_finished_pods_and_other_nodes_hold_nothing() -> None:
    n = node("n1", memory="4Gi")
    done = pod(
        "done", node="n1", phase="Failed", containers=[container(request="8Gi", limit="8Gi")]
    )
    away = pod("away", node="n2", containers=[container(request="8Gi", limit="8Gi")])
    assert found(cluster(nodes=(n,), pods=(done, away))) == []
