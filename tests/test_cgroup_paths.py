"""Identifying pods and containers from kubelet-shaped cgroup paths."""

from __future__ import annotations

import pytest

from nodeguard.sources.cgroup_paths import parse_kubepods_path

CID = "a" * 64
UID = "2a2b2c2d-3e3f-4041-9293-949596979899"
UID_ = UID.replace("-", "_")


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
    ],
)
def test_identity(path: str, qos: str, uid: str, cid: str | None, runtime: str) -> None:
    ident = parse_kubepods_path(path)
    assert ident is not None
    assert (ident.qos_class, ident.pod_uid, ident.container_id, ident.runtime) == (
        qos,
        uid,
        cid,
        runtime,
    )


@pytest.mark.parametrize(
    "path",
    [
        "/system.slice/containerd.service",
        "/",
        "/kubepods",
        "/kubepods/burstable",
        "/kubepods.slice/kubepods-burstable.slice",
        f"/user.slice/pod{UID}",
    ],
)
def test_not_a_pod(path: str) -> None:
    assert parse_kubepods_path(path) is None


def test_conmon_scope_is_not_a_container() -> None:
    ident = parse_kubepods_path(f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{CID}.scope")
    assert ident is not None and ident.container_id is None
