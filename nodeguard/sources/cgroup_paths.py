"""What a kubepods cgroup path says: QoS class, pod UID, container ID and runtime.

The kubelet lays pods out under a ``kubepods`` cgroup (pkg/kubelet/cm/cgroup_manager_linux.go):

- cgroupfs driver: ``kubepods/[burstable|besteffort/]pod<uid>/<container>``
- systemd driver: ``kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
  <container>.scope``, where systemd escapes ``-`` in the UID as ``_``.

Guaranteed pods sit directly under the root. Container cgroups are named by the runtime:
containerd ``cri-containerd-<id>.scope`` (systemd) or ``<id>`` (cgroupfs), CRI-O ``crio-<id>.scope``
or ``crio-<id>``, docker ``docker-<id>.scope`` or ``<id>``. CRI-O's ``crio-conmon-<id>.scope`` is
the monitor, not a container. A kubelet running inside a container (kind, docker-nested) puts the
whole tree under another prefix, such as ``/docker/<id>/kubepods`` or
``/system.slice/docker-<id>.scope/kubelet.slice/kubelet-kubepods.slice``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nodeguard.snapshot import QosClass

__all__ = [
    "CgroupIdentity",
    "is_kubepods_root",
    "parse_container_dir",
    "parse_kubepods_path",
    "parse_pod_dir",
    "parse_qos_dir",
]

_ROOT_RE = re.compile(r"^(?:.*-)?kubepods(?:\.slice)?$")
_QOS_RE = re.compile(r"^(?:.*-)?(?:kubepods-)?(?P<qos>burstable|besteffort)(?:\.slice)?$")
_UUID = r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
_POD_RE = re.compile(rf"^(?:.*-)?pod(?P<uid>{_UUID}|[0-9a-fA-F]{{32}})(?:\.slice)?$")
_CONTAINER_RE = re.compile(
    r"^(?:(?P<prefix>cri-containerd|crio|docker)-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$"
)
_RUNTIMES = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker"}


@dataclass(frozen=True, slots=True, kw_only=True)
class CgroupIdentity:
    """What a cgroup path inside kubepods names; ``container_id`` is ``None`` for a pod cgroup."""

    qos_class: QosClass
    pod_uid: str
    container_id: str | None
    runtime: str


def is_kubepods_root(name: str) -> bool:
    """Whether a directory name is the kubepods root (``kubepods``, ``kubepods.slice``,
    ``kubelet-kubepods.slice``)."""
    return bool(_ROOT_RE.match(name))


def parse_qos_dir(name: str) -> QosClass | None:
    """The QoS class a directory under the kubepods root stands for, ``None`` if none."""
    m = _QOS_RE.match(name)
    if not m:
        return None
    qos: QosClass = "burstable" if m.group("qos") == "burstable" else "besteffort"
    return qos


def parse_pod_dir(name: str) -> str | None:
    """The pod UID in a ``pod<uid>`` directory name, dashes restored; ``None`` if not a pod.

    A 32-hex UID without dashes is a static (mirror) pod's config hash and is kept as is.
    """
    m = _POD_RE.match(name)
    if not m:
        return None
    return m.group("uid").replace("_", "-").lower()


def parse_container_dir(name: str) -> tuple[str, str] | None:
    """``(container_id, runtime)`` of a container directory name; ``None`` for anything else
    (CRI-O's conmon scope, systemd helper cgroups). ``runtime`` is ``""`` for a bare ID."""
    m = _CONTAINER_RE.match(name)
    if not m:
        return None
    prefix = m.group("prefix")
    return m.group("id"), _RUNTIMES.get(prefix, "") if prefix else ""


def parse_kubepods_path(path: str) -> CgroupIdentity | None:
    """Identify a full cgroup path (as in ``/proc/<pid>/cgroup`` or the kernel's ``task_memcg``)
    that lies inside a kubepods hierarchy at pod level or below; ``None`` otherwise."""
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        if is_kubepods_root(part):
            rest = parts[i + 1 :]
            break
    else:
        return None
    qos: QosClass = "guaranteed"
    if rest and (q := parse_qos_dir(rest[0])) is not None:
        qos = q
        rest = rest[1:]
    if not rest or (uid := parse_pod_dir(rest[0])) is None:
        return None
    container = parse_container_dir(rest[1]) if len(rest) > 1 else None
    return CgroupIdentity(
        qos_class=qos,
        pod_uid=uid,
        container_id=container[0] if container else None,
        runtime=container[1] if container else "",
    )
