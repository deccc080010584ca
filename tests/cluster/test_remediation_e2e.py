"""End to end on the real kernel and the real API server: a low-priority pod's process, in its
kubelet-shaped cgroup, ramps its memory toward the limit. The shipped default rule
(container-near-limit) must request the eviction before the kernel's OOM kill; in dry run the
same scenario reports the eviction and evicts nothing. The incident record holds the numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent import get, running_agent, wait_until
from tests.support.controlplane.cluster import TestCluster
from tests.support.kernel_cgroup import (
    KubeletCgroup,
    hog_in,
    pod_container,
    private_kubepods,
    writable_memory_controller,
)
from tests.support.kube_helpers import Cluster
from tests.support.remediation import incidents

MiB = 1 << 20
LIMIT = 64 * MiB
DEFAULT_RULES = Path(__file__).resolve().parents[2] / "rules" / "default.yaml"

pytestmark = pytest.mark.kernel


@pytest.fixture
def require_kernel() -> None:
    if writable_memory_controller() is None:
        pytest.skip("needs root and a writable cgroup memory controller (CI has both)")


def _scenario(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, *, dry_run: bool
) -> dict[str, Any]:
    ns, node = cluster.namespace("e2e"), cluster.node(memory="16Gi")
    pod = cluster.pod(
        namespace=ns,
        node=node,
        name="pandas-prep",
        request="16Mi",
        limit="64Mi",
        priority_class="nodeguard-test-low",
    )
    uid = pod["metadata"]["uid"]
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://")[1]
    out: dict[str, Any] = {"ns": ns}
    # A kubepods of its own (tests/support/kernel_cgroup.py): the agent reads these cgroups
    # alone, never the machine's kubepods (a kubelet's, or another test's).
    with private_kubepods(tmp_path) as pods:
        cg = pod_container(pods, pod_uid=uid, container_id=cid, limit_bytes=LIMIT)
        _run(
            cluster,
            control_plane,
            tmp_path,
            out,
            node=node,
            cg=cg,
            sysfs=pods.sysfs,
            dry_run=dry_run,
        )
    return out


def _run(
    cluster: Cluster,
    control_plane: TestCluster,
    tmp_path: Path,
    out: dict[str, Any],
    *,
    node: str,
    cg: KubeletCgroup,
    sysfs: Path,
    dry_run: bool,
) -> None:
    """The agent on the private kubepods at ``sysfs`` while the hog in ``cg`` grows; what it
    did goes into ``out``."""
    ns, uid, cid = out["ns"], cg.pod_uid, cg.container_id
    args = [
        f"--kubeconfig={control_plane.kubeconfig_path}",
        f"--rules={DEFAULT_RULES}",
        f"--node-name={node}",
        f"--path.sysfs={sysfs}",
        "--interval=100ms",
        f"--path.state={tmp_path / 'state'}",
        "--dry-run" if dry_run else "--no-dry-run",
    ]
    with running_agent(args=args, log_path=tmp_path / "agent.log") as base:
        wait_until(
            "the agent to list the pod",
            lambda: (json.loads(get(f"{base}/snapshot")[1]).get("pod_meta") or {}).get(uid),
            timeout=15,
        )
        # 5 MiB/s: the 95 % line is 3.2 MiB (0.64 s) below the limit.
        with hog_in(cg, step=1 * MiB, pause=0.2, up_to=4 * LIMIT) as hog:

            def acted() -> bool:
                """The eviction (or in dry run its record) seen, or the hog gone first."""
                found = incidents(base)
                live = cluster.pod_json(ns, "pandas-prep")
                if found and (dry_run or live is None or live["metadata"].get("deletionTimestamp")):
                    out["hog_alive_at_eviction"] = hog.poll() is None
                    return True
                out["hog_alive_at_eviction"] = False
                return hog.poll() is not None

            wait_until("the eviction or the OOM kill", acted, timeout=60, step=0.05)
            hog.wait(timeout=30)  # no kubelet kills it: the kernel's OOM killer will
        (summary,) = [i for i in incidents(base) if i["rule"] == "container-near-limit"]
        out["incident"] = json.loads(get(f"{base}/incidents/{summary['id']}")[1])
        out["pod"] = cluster.pod_json(ns, "pandas-prep")
        out["uid"], out["cid"] = uid, cid


def _check_incident(out: dict[str, Any], *, dry_run: bool) -> None:
    inc = out["incident"]
    assert inc["dry_run"] is dry_run
    assert inc["target"] == f"{out['uid']}/{out['cid']}"
    assert inc["values"]["container_unreclaimable_limit_ratio"] >= 0.95
    assert 0 <= inc["values"]["container_unreclaimable_seconds_to_limit"] <= 60
    top = next(c for c in inc["evidence"]["top_containers"] if c["container_id"] == out["cid"])
    assert top["namespace"] == out["ns"] and top["pod"] == "pandas-prep"
    assert top["container"] == "main"
    assert top["limit_bytes"] == LIMIT
    assert top["request_bytes"] == 16 * MiB
    assert 0.95 * LIMIT <= top["working_set_bytes"] <= LIMIT
    assert top["priority"] == 100
    mem = inc["evidence"]["memory"]
    assert mem["total_bytes"] == int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    assert 0 < mem["available_bytes"] <= mem["total_bytes"]
    (action,) = inc["actions"]
    assert (action["action"], action["outcome"], action["dry_run"]) == ("evict", "done", dry_run)
    assert action["details"]["evicted"][0]["pods"] == [f"{out['ns']}/pandas-prep"]


def test_default_rule_evicts_before_the_oom_kill(
    require_kernel: None, cluster: Cluster, control_plane: TestCluster, tmp_path: Path
) -> None:
    out = _scenario(cluster, control_plane, tmp_path, dry_run=False)
    assert out["hog_alive_at_eviction"], "the kernel OOM-killed the process first"
    assert out["pod"] is None or out["pod"]["metadata"].get("deletionTimestamp")
    assert cluster.events(out["ns"], name="pandas-prep", reason="NodeguardEvicted")
    _check_incident(out, dry_run=False)


def test_default_rule_in_dry_run_evicts_nothing(
    require_kernel: None, cluster: Cluster, control_plane: TestCluster, tmp_path: Path
) -> None:
    out = _scenario(cluster, control_plane, tmp_path, dry_run=True)
    assert out["hog_alive_at_eviction"]
    assert out["pod"] is not None and not out["pod"]["metadata"].get("deletionTimestamp")
    assert cluster.events(out["ns"], name="pandas-prep", reason="NodeguardWouldEvict")
    assert not cluster.events(out["ns"], name="pandas-prep", reason="NodeguardEvicted")
    _check_incident(out, dry_run=True)
