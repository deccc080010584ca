"""``evict``'s ``free: N%`` is a share of the node's usable memory (MemTotal less the hugetlb
pool), on this node (the snapshot's meminfo) and on another (its ``status.capacity``: memory
less ``hugepages-<size>``, as the kubelet computes allocatable), against the test control
plane. A node that is 90 % huge pages: 320 GiB MemTotal, 288 GiB of 1 GiB pages, 32 GiB usable;
5 % of it is 1.6 GiB, where 5 % of MemTotal (16 GiB) is half its regular memory."""

from __future__ import annotations

from nodeguard.actions.limits import EvictionBackoff, EvictionLimiter
from nodeguard.kube.client import KubeClient
from nodeguard.kube.objects import pod_meta
from nodeguard.snapshot import NodeSnapshot, PodMemory
from nodeguard.sources.meminfo import derive_meminfo, parse_meminfo
from tests.support.acting import env_for, run_action
from tests.support.hosts import cgroup_memory
from tests.support.hugepages import HUGE_NODE, meminfo_text
from tests.support.kube_helpers import Cluster

GiB = 1 << 30
MiB = 1 << 20
USABLE = 32 * GiB
LOW = "nodeguard-test-low"


def huge_pages_node(cluster: Cluster) -> str:
    """A Node whose status says what the kubelet reports for :data:`HUGE_NODE`."""
    node = cluster.node(memory="320Gi")
    cluster.core.patch_node_status(
        node,
        {
            "status": {
                "capacity": {"memory": "320Gi", "hugepages-1Gi": "288Gi", "hugepages-2Mi": "0"},
                "allocatable": {"memory": "31Gi", "hugepages-1Gi": "288Gi", "hugepages-2Mi": "0"},
            }
        },
    )
    return node


def three_pods(cluster: Cluster, node: str) -> str:
    ns = cluster.namespace("hugetlb")
    for name in ("batch-1", "batch-2", "batch-3"):
        cluster.pod(namespace=ns, node=node, name=name, request="512Mi", priority_class=LOW)
    return ns


async def test_free_5_percent_of_this_nodes_usable_memory(
    cluster: Cluster, kube: KubeClient
) -> None:
    node = huge_pages_node(cluster)
    ns = three_pods(cluster, node)
    items, _ = await kube.list_pods(node_name=node)
    metas = {m.uid: m for m in (pod_meta(p) for p in items)}
    mem = derive_meminfo(*parse_meminfo(meminfo_text(HUGE_NODE, MemAvailable=1 * MiB)))
    assert mem.usable_bytes == USABLE
    snap = NodeSnapshot(
        timestamp=0.0,
        node_name=node,
        meminfo=mem,
        pressure=None,
        pods=tuple(
            PodMemory(
                uid=uid,
                qos_class="burstable",
                memory=cgroup_memory(f"/{uid}", used=GiB),
                containers=(),
            )
            for uid in metas
        ),
        oom=None,
        processes=(),
        collectors=(),
        pod_meta=metas,
    )
    env = env_for(kube, node, limiter=EvictionLimiter(), backoff=EvictionBackoff())
    (res,) = await run_action(
        env=env,
        node=node,
        action="evict",
        args={"free": "5%"},
        dry_run=True,
        rule="node-memory-low",
        source="local",
        snapshot=snap,
    )
    assert res.details["target_bytes"] == int(USABLE * 0.05)
    # 1 GiB + 1 GiB >= 1.6 GiB: two pods, not all three (5 % of MemTotal, 16 GiB, would take
    # every pod and still be short).
    assert len(res.details["evicted"]) == 2, res.message
    assert all(p.startswith(f"{ns}/batch-") for u in res.details["evicted"] for p in u["pods"])


async def test_free_5_percent_of_another_nodes_usable_memory(
    cluster: Cluster, kube: KubeClient
) -> None:
    node = huge_pages_node(cluster)
    three_pods(cluster, node)
    items, _ = await kube.list_pods(node_name=node)
    env = env_for(
        kube,
        node,
        usage={p["metadata"]["uid"]: GiB for p in items},
        limiter=EvictionLimiter(),
        backoff=EvictionBackoff(),
    )
    # An Alertmanager alert about a node this agent has no snapshot of: its capacity says it.
    (res,) = await run_action(
        env=env, node=node, action="evict", args={"free": "5%"}, dry_run=True, source="alertmanager"
    )
    assert res.details["target_bytes"] == int(USABLE * 0.05)
    assert len(res.details["evicted"]) == 2, res.message
