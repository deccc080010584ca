"""Static pods named with the cluster connected, against the real kube-apiserver.

A static pod's cgroup carries the UID the kubelet gave it, its config hash
(pkg/kubelet/config/common.go ``applyDefaults``: a 128-bit FNV hash of the manifest, 32 hex
digits, also written to the ``kubernetes.io/config.hash`` annotation); the mirror Pod the kubelet
creates for it in the API has a UID of its own and carries the hash in
``kubernetes.io/config.hash`` and ``kubernetes.io/config.mirror``
(pkg/kubelet/pod/mirror_client.go ``CreateMirrorPod``). The fixture host v2-cgroupns has such a
pod: ``kubepods-burstable-pod<UID_STATIC>.slice`` with container CID[5], and its process 4343.
Here the mirror Pod is created as the kubelet would, the agent's sampler joins on the hash.
"""

from __future__ import annotations

from pathlib import Path

from nodeguard.actions.ranking import EvictFilter, never_evicted, plan_eviction
from nodeguard.kube.objects import pod_meta
from nodeguard.sampling.sampler import Sampler, SamplerConfig
from tests.fixtures.make_hosts import CID, UID_STATIC
from tests.support.controlplane.cluster import TestCluster
from tests.support.hosts import exposition, host_paths
from tests.support.kube_helpers import Cluster, mirror_pod, synced_watcher


def test_mirror_pod_is_joined_on_its_config_hash(cluster: Cluster) -> None:
    pod = mirror_pod(cluster, namespace=cluster.namespace("static"), node=cluster.node())
    meta = pod_meta(pod)
    assert meta.uid != UID_STATIC  # the API server gave the mirror a UID of its own
    assert (meta.mirror, meta.config_hash, meta.cgroup_uid) == (True, UID_STATIC, UID_STATIC)
    assert never_evicted(meta) is not None


def test_ordinary_pods_keep_their_uid(cluster: Cluster) -> None:
    # An annotation someone copied onto an ordinary pod is not a static pod's hash.
    ns, node = cluster.namespace("plain"), cluster.node()
    pod = cluster.pod(namespace=ns, node=node, annotations={"kubernetes.io/config.hash": "0" * 32})
    meta = pod_meta(pod)
    assert (meta.mirror, meta.config_hash, meta.cgroup_uid) == (False, None, meta.uid)


async def test_static_pod_named_in_series_and_evidence(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path
) -> None:
    ns, node = cluster.namespace("static"), cluster.node()
    mirror_pod(cluster, namespace=ns, node=node)
    async with synced_watcher(kubeconfig=control_plane.kubeconfig_path, node=node) as watcher:
        sampler = Sampler(
            config=SamplerConfig(
                paths=host_paths("v2-cgroupns"),
                node_name=node,
                collectors=frozenset({"meminfo", "cgroups", "processes"}),
            ),
            cluster=watcher,
        )
        snap = sampler.sample_once()
        labels = snap.labels_for(UID_STATIC, CID[5])
        assert (labels.namespace, labels.pod, labels.container) == (
            ns,
            f"kube-apiserver-{node}",
            "kube-apiserver",
        )
        # The top process of the static pod is the same pod's.
        proc = next(p for p in snap.processes if p.pid == 4343)
        assert proc.pod_uid == UID_STATIC
        assert snap.labels_for(proc.pod_uid, proc.container_id).pod == f"kube-apiserver-{node}"

        body = exposition(snap)
        assert (
            f'nodeguard_container_memory_working_set_bytes{{container="kube-apiserver",'
            f'namespace="{ns}",pod="kube-apiserver-{node}"}} 2.68435456e+08'
        ) in body
        assert (
            f'nodeguard_pod_memory_request_bytes{{container="",namespace="{ns}",'
            f'pod="kube-apiserver-{node}"}} 2.68435456e+08'
        ) in body
        # Named, and still never evicted.
        assert snap.pod_meta is not None
        usage = {p.uid: p.memory.working_set_bytes or 0 for p in snap.pods}
        plan = plan_eviction(pods=snap.pod_meta, usage=usage, flt=EvictFilter())
        assert [e.pod.name for e in plan.excluded] == [f"kube-apiserver-{node}"]
        assert "static pod" in plan.excluded[0].reason
        assert not plan.ranked
