"""What a kubepods cgroup path says: QoS class, pod UID, container ID and runtime.

The kubelet lays pods out under a ``kubepods`` cgroup (pkg/kubelet/cm/cgroup_manager_linux.go,
``CgroupName.ToCgroupfs`` and ``ToSystemd``; pkg/kubelet/cm/pod_container_manager_linux.go):

- cgroupfs driver: ``kubepods/[burstable|besteffort/]pod<uid>/<container>``
- systemd driver: ``kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
  <container>.scope``, where ``-`` in the UID is written ``_`` (``escapeSystemdCgroupName``).

Guaranteed pods sit directly under the root. Container cgroups are named by the runtime:
containerd ``cri-containerd-<id>.scope`` (systemd) or ``<id>`` (cgroupfs), CRI-O ``crio-<id>.scope``
or ``crio-<id>``, docker ``docker-<id>.scope`` or ``<id>``; crun under CRI-O on cgroup v2 puts the
processes one level lower, in ``crio-<id>.scope/container``. CRI-O's ``crio-conmon-<id>.scope`` is
the monitor, not a container. A kubelet running inside a container (kind, docker-nested) puts the
whole tree under another prefix, such as ``/docker/<id>/kubepods`` or
``/system.slice/docker-<id>.scope/kubelet.slice/kubelet-kubepods.slice``. A static pod's
directory carries the UID the kubelet gave it, the config hash (32 hex digits, unless the manifest
set a UID; pkg/kubelet/config/common.go ``applyDefaults``), not its mirror Pod's UID.

Paths come in two forms. The kernel log and the cgroup filesystem give them from the root of the
hierarchy. ``/proc/<pid>/cgroup`` gives them relative to the cgroup namespace of the process that
reads it (cgroup_namespaces(7)): on cgroup v2, containerd and CRI-O give every unprivileged
container a namespace rooted at its own cgroup, so the agent (the shipped DaemonSet is such a
container) reads another pod's process as
``/../../kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope``, with as many ``..`` as
its own cgroup is deep below the common ancestor and that ancestor's part of the path cut off,
and a process of its own pod as ``/../<container>``. :func:`parse_kubepods_path` reads both
forms; :func:`identify_cgroup` also names the pod of a path that shows only the container, from
the containers the cgroup walk found.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from nodeguard.snapshot import QosClass

__all__ = [
    "CgroupIdentity",
    "identify_cgroup",
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
    """What a cgroup path inside kubepods names; ``container_id`` is ``None`` for a pod cgroup,
    ``qos_class`` is ``None`` where a cgroup namespace cut off the part of the path that says
    it (a cgroupfs ``pod<uid>`` directory whose parent is not shown)."""

    qos_class: QosClass | None
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
    """Identify a cgroup path (``/proc/<pid>/cgroup``, the kernel's ``task_memcg``, a directory
    of the walk) that lies inside a kubepods hierarchy at pod level or below: from the root of
    the hierarchy, or relative to a cgroup namespace (leading ``..``, see the module docstring).
    ``None`` for anything else, and for a namespaced path that shows no pod directory."""
    parts = [p for p in path.split("/") if p]
    namespaced = bool(parts) and parts[0] == ".."
    while parts and parts[0] == "..":
        parts = parts[1:]
    for i, part in enumerate(parts):
        if is_kubepods_root(part):
            return _identity(parts[i + 1 :], qos="guaranteed")
    if not namespaced:
        return None
    # The kubepods root was cut off: the pod directory is the first that names a pod.
    for i, part in enumerate(parts):
        if parse_pod_dir(part) is not None:
            qos = _qos_of_pod_dir(part) or (parse_qos_dir(parts[i - 1]) if i else None)
            return _identity(parts[i:], qos=qos)
    return None


def identify_cgroup(
    path: str, *, containers: Mapping[str, str] | None = None
) -> CgroupIdentity | None:
    """:func:`parse_kubepods_path`, and for a namespaced path that shows only a container
    directory (``/../cri-containerd-<id>.scope``: a container of the reader's own pod) the pod
    that ``containers`` (container ID -> pod UID, from the cgroup walk) puts it in. ``None``
    when the path names no pod container that can be found."""
    ident = parse_kubepods_path(path)
    if ident is not None or not containers:
        return ident
    parts = [p for p in path.split("/") if p]
    if not parts or parts[0] != "..":
        return None
    for part in parts:
        if part == "..":
            continue
        parsed = parse_container_dir(part)
        if parsed is None or parsed[0] not in containers:
            return None
        return CgroupIdentity(
            qos_class=None, pod_uid=containers[parsed[0]], container_id=parsed[0], runtime=parsed[1]
        )
    return None


def _qos_of_pod_dir(name: str) -> QosClass | None:
    """The QoS class a systemd pod slice's name carries (``kubepods-besteffort-pod<uid>.slice``:
    besteffort; ``kubepods-pod<uid>.slice``: guaranteed); ``None`` for a cgroupfs ``pod<uid>``."""
    prefix = name.rsplit("pod", 1)[0] if "pod" in name else ""
    if not prefix:
        return None
    if prefix.endswith("-burstable-"):
        return "burstable"
    if prefix.endswith("-besteffort-"):
        return "besteffort"
    if prefix.endswith("kubepods-"):
        return "guaranteed"
    return None


def _identity(rest: list[str], *, qos: QosClass | None) -> CgroupIdentity | None:
    """The identity of the path below the kubepods root (``rest``: QoS directory, pod
    directory, container directory, deeper ones ignored); ``qos`` when no QoS directory."""
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
