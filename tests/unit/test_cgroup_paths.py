"""Identifying pods and containers from kubelet-shaped cgroup paths, from the root of the
hierarchy and from inside a cgroup namespace.

The namespaced forms are what cgroup_namespaces(7) says a reader whose namespace is rooted at
its own container sees: the path from its root to the process's cgroup, ``..`` up to the common
ancestor, then down. The agent's container here is the shipped DaemonSet's, burstable:
``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<A>.slice/cri-containerd-<a>.scope``
(systemd) or ``/kubepods/burstable/pod<A>/<a>`` (cgroupfs), four levels down."""

from __future__ import annotations

import pytest

from nodeguard.sources.cgroup_paths import CgroupIdentity, identify_cgroup, parse_kubepods_path

CID = "a" * 64
UID = "2a2b2c2d-3e3f-4041-9293-949596979899"
UID_ = UID.replace("-", "_")


def _fields(ident: CgroupIdentity | None) -> tuple[str | None, str, str | None, str]:
    assert ident is not None
    return (ident.qos_class, ident.pod_uid, ident.container_id, ident.runtime)


@pytest.mark.parametrize(
    ("path", "qos", "uid", "cid", "runtime"),
    [
        (f"/kubepods/burstable/pod{UID}/{CID}", "burstable", UID, CID, ""),
        (f"/kubepods/pod{UID}/{CID}", "guaranteed", UID, CID, ""),
        (f"/kubepods/besteffort/pod{UID}/crio-{CID}", "besteffort", UID, CID, "cri-o"),
        (
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
            f"cri-containerd-{CID}.scope",
            "burstable",
            UID,
            CID,
            "containerd",
        ),
        (
            f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope",
            "guaranteed",
            UID,
            CID,
            "cri-o",
        ),
        (
            f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
            f"docker-{CID}.scope",
            "besteffort",
            UID,
            CID,
            "docker",
        ),
        (f"/docker/{'b' * 64}/kubepods/burstable/pod{UID}/{CID}", "burstable", UID, CID, ""),
        (
            f"/system.slice/docker-{'b' * 64}.scope/kubelet.slice/kubelet-kubepods.slice/"
            f"kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{UID_}.slice/"
            f"cri-containerd-{CID}.scope",
            "burstable",
            UID,
            CID,
            "containerd",
        ),
        (
            "/kubepods/burstable/pod6a1f3c0d9e8b7a6f5e4d3c2b1a098765/" + CID,
            "burstable",
            "6a1f3c0d9e8b7a6f5e4d3c2b1a098765",
            CID,
            "",
        ),
        (f"/kubepods/burstable/pod{UID}", "burstable", UID, None, ""),
        # crun under CRI-O on cgroup v2 puts the processes in a "container" child
        (
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
            f"crio-{CID}.scope/container",
            "burstable",
            UID,
            CID,
            "cri-o",
        ),
        # -- from the agent's cgroup namespace (systemd driver) --
        # another burstable pod: up to kubepods-burstable.slice, which is cut off
        (
            f"/../../kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope",
            "burstable",
            UID,
            CID,
            "containerd",
        ),
        # a guaranteed pod: up to kubepods.slice
        (
            f"/../../../kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope",
            "guaranteed",
            UID,
            CID,
            "containerd",
        ),
        # a besteffort pod: up to kubepods.slice, then down through its QoS slice
        (
            f"/../../../kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
            f"crio-{CID}.scope/container",
            "besteffort",
            UID,
            CID,
            "cri-o",
        ),
        # a static pod's slice carries the config hash
        (
            "/../../kubepods-burstable-pod6a1f3c0d9e8b7a6f5e4d3c2b1a098765.slice/"
            f"cri-containerd-{CID}.scope",
            "burstable",
            "6a1f3c0d9e8b7a6f5e4d3c2b1a098765",
            CID,
            "containerd",
        ),
        # an agent outside kubepods (a host service, a kind node's own cgroup): the root shows
        (
            f"/../../../kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope",
            "guaranteed",
            UID,
            CID,
            "docker",
        ),
        # kind: the kubelet's kubelet-kubepods-* names
        (
            f"/../../kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope",
            "besteffort",
            UID,
            CID,
            "containerd",
        ),
        # -- cgroupfs driver --
        # another burstable pod: "pod<uid>" says no QoS class, and its parent is cut off
        (f"/../../pod{UID}/{CID}", None, UID, CID, ""),
        (f"/../../pod{UID}/crio-{CID}", None, UID, CID, "cri-o"),
        # a besteffort pod: up to kubepods, down through besteffort
        (f"/../../../besteffort/pod{UID}/{CID}", "besteffort", UID, CID, ""),
        # a guaranteed pod: up to kubepods, which is cut off
        (f"/../../../pod{UID}/{CID}", None, UID, CID, ""),
        # the pod itself (a process in the pod cgroup, not in a container)
        (f"/../../pod{UID}", None, UID, None, ""),
    ],
)
def test_identity(path: str, qos: str | None, uid: str, cid: str | None, runtime: str) -> None:
    assert _fields(parse_kubepods_path(path)) == (qos, uid, cid, runtime)


@pytest.mark.parametrize(
    "path",
    [
        "/system.slice/containerd.service",
        "/",
        "/kubepods",
        "/kubepods/burstable",
        "/kubepods.slice/kubepods-burstable.slice",
        f"/user.slice/pod{UID}",
        # from a cgroup namespace: no pod directory shows
        "/../../../../init.scope",
        "/../../../../system.slice/containerd.service",
        f"/../cri-containerd-{CID}.scope",
        "/",
        # a pod-like name outside any namespace or kubepods root is not a pod
        f"/system.slice/pod{UID}/{CID}",
    ],
)
def test_not_a_pod(path: str) -> None:
    assert parse_kubepods_path(path) is None


def test_conmon_scope_is_not_a_container() -> None:
    ident = parse_kubepods_path(f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{CID}.scope")
    assert ident is not None and ident.container_id is None


def test_own_pod_from_the_walk() -> None:
    # A container of the agent's own pod shows only as "/../<container>": the walk knows its pod.
    walk = {CID: UID, "b" * 64: "other"}
    for path, runtime in (
        (f"/../cri-containerd-{CID}.scope", "containerd"),
        (f"/../crio-{CID}", "cri-o"),
        (f"/../{CID}", ""),
    ):
        assert _fields(identify_cgroup(path, containers=walk)) == (None, UID, CID, runtime)
    # not in the walk, not a container, or not namespaced: nothing
    assert identify_cgroup(f"/../cri-containerd-{'c' * 64}.scope", containers=walk) is None
    assert identify_cgroup("/../init.scope", containers=walk) is None
    assert identify_cgroup(f"/cri-containerd-{CID}.scope", containers=walk) is None
    assert identify_cgroup(f"/../cri-containerd-{CID}.scope") is None
    # a path that names its pod needs no walk
    ident = identify_cgroup(f"/kubepods/pod{UID}/{CID}", containers={})
    assert ident is not None and ident.pod_uid == UID
