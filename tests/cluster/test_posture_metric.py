"""The real agent exports its node's ``nodeguard doctor`` findings: against the test
kube-apiserver, an unbounded pod bound to the agent's GPU node makes
``nodeguard_posture_findings{check="unbounded-memory",severity="error"}`` 1 on ``/metrics``,
and deleting it makes it 0 again (a series at 0, not one gone); a pod of another node is not
counted; every node check and severity has its series from the first evaluation."""

from __future__ import annotations

import re
from pathlib import Path

from kubernetes import client

from tests.support.agent import get, running_agent, wait_until
from tests.support.controlplane.cluster import TestCluster
from tests.support.hosts import host_flags
from tests.support.kube_helpers import Cluster, unique

SERIES = re.compile(
    r'^nodeguard_posture_findings\{check="([^"]+)",severity="([^"]+)"\} (\S+)$', re.M
)


def _findings(base: str) -> dict[tuple[str, str], float]:
    """Every ``nodeguard_posture_findings`` series on the agent's ``/metrics``."""
    body = get(f"{base}/metrics")[1]
    return {(c, s): float(v) for c, s, v in SERIES.findall(body)}


def _gpu_node(cluster: Cluster) -> str:
    """A node with the GPU feature discovery label and a kubelet reserve (so that only the
    pods decide the findings)."""
    name = unique("posture")
    cluster.core.create_node(
        client.V1Node.model_validate(
            {"metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}}}
        )
    )
    cluster.core.patch_node_status(
        name,
        {
            "status": {
                "capacity": {"memory": "64Gi", "cpu": "16", "pods": "110"},
                "allocatable": {"memory": "60Gi", "cpu": "16", "pods": "110"},
            }
        },
    )
    return name


def test_an_unbounded_pod_on_the_agents_gpu_node_is_one_finding_until_it_is_gone(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path
) -> None:
    ns, node = cluster.namespace("posture"), _gpu_node(cluster)
    other = _gpu_node(cluster)
    cluster.pod(namespace=ns, node=node, name="bounded", request="1Gi", limit="2Gi")
    cluster.pod(namespace=ns, node=other, name="elsewhere", request="1Gi")  # not this node's
    args = [
        *host_flags("v2-systemd-containerd"),
        f"--kubeconfig={control_plane.kubeconfig_path}",
        f"--node-name={node}",
        f"--path.state={tmp_path / 'state'}",
        "--interval=1s",
        "--posture.interval=1s",
    ]
    key = ("unbounded-memory", "error")
    with running_agent(args=args, log_path=tmp_path / "agent.log") as base:
        first = wait_until("the first evaluation", lambda: _findings(base), timeout=30)
        assert first == {
            ("node-reserve", "error"): 0,
            ("node-reserve", "warning"): 0,
            ("overcommit", "error"): 0,
            ("overcommit", "warning"): 0,
            ("unbounded-memory", "error"): 0,
        }
        cluster.pod(namespace=ns, node=node, name="prep", request="2Gi")  # no limit
        wait_until(
            "the unbounded pod counted",
            lambda: _findings(base).get(key) == 1,
            timeout=30,
            detail=lambda: _findings(base),
        )
        cluster.core.delete_namespaced_pod("prep", ns, grace_period_seconds=0)
        wait_until(
            "the finding gone, its series at 0",
            lambda: _findings(base).get(key) == 0,
            timeout=30,
            detail=lambda: _findings(base),
        )
        assert _findings(base) == first
