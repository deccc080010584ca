"""The DaemonSet's container laid out on disk as the kubelet lays it out (volumes at their mount
paths, arguments expanded), and small HTTP helpers for talking to the agent it runs. Used by the
manifest tests and by the image test, which runs the same arguments inside the built image."""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.support.deploy.manifests import Obj, container, expand, find, write_projected

__all__ = ["Container", "HostPathMissing", "http", "lay_out", "metric"]


def http(url: str, *, data: bytes | None = None, token: str | None = None) -> tuple[int, str]:
    """GET (or POST ``data`` as JSON): the status and body; 0 when nothing answers."""
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
    except OSError:
        return 0, ""


class HostPathMissing(AssertionError):
    """The kubelet would not start the pod: a hostPath of type ``Directory``, ``File`` or
    ``CharDevice`` whose path the node lacks (Kubernetes API ``HostPathVolumeSource.type``: "a
    directory must exist at the given path"; the kubelet checks it before it mounts, and the pod
    stays in ContainerCreating with a FailedMount event)."""


@dataclass
class Container:
    """The DaemonSet's container laid out under ``root`` (the container's ``/``)."""

    root: Path
    args: list[str]
    env: dict[str, str]
    read_only: list[Path]
    #: The arguments as the container gets them ($(VAR) expanded, paths as in the container).
    written: list[str]
    #: Mount path in the container -> (its directory under ``root``, read-only).
    mounts: dict[str, tuple[Path, bool]]


def lay_out(
    objs: list[Obj],
    root: Path,
    *,
    host: Path,
    node: str,
    secrets: dict[str, dict[str, str]] | None = None,
) -> Container:
    """Every volume of the pod at its mount path under ``root`` as the kubelet provides it:
    hostPaths from the host tree ``host`` (its proc, sys and kmsg; :class:`HostPathMissing`
    where the kubelet would refuse one the tree lacks, as on a kernel without PSI), ConfigMaps
    and Secrets with the atomic writer's ``..data`` links, emptyDirs empty. The container's
    arguments with ``$(VAR)`` expanded and every absolute path moved under ``root``; a path
    outside every mount fails the test (it would not exist in the container)."""
    secrets = secrets or {}
    ds = find(objs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    c = container(objs)
    stand_ins = {
        "/proc": host / "proc",
        "/proc/pressure": host / "proc" / "pressure",
        "/sys": host / "sys",
        "/sys/fs/cgroup": host / "sys" / "fs" / "cgroup",
        "/dev/kmsg": host / "kmsg",
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    read_only = []
    for m in c["volumeMounts"]:
        v, target = volumes[m["name"]], root / m["mountPath"].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if "hostPath" in v:
            path, kind = v["hostPath"]["path"], v["hostPath"].get("type")
            if path in stand_ins:
                src = stand_ins[path]
                if not src.exists() and kind != "DirectoryOrCreate":
                    raise HostPathMissing(f"hostPath {path} (type {kind}): not on this node")
                assert (kind == "CharDevice") == src.is_file(), (path, kind)
                if src.is_dir():  # a mount over a part of another: the same files
                    shutil.copytree(src, target, dirs_exist_ok=True)
                else:
                    shutil.copy(src, target)
            else:
                assert kind == "DirectoryOrCreate", f"hostPath {path}: no stand-in on the test host"
                target.mkdir()
        elif "configMap" in v:
            write_projected(target, find(objs, "ConfigMap", v["configMap"]["name"])["data"])
        elif "secret" in v:
            # The Secret the user creates (the alert-driven component's webhook token).
            data = secrets[v["secret"]["secretName"]]
            write_projected(target, dict(data))
        elif "emptyDir" in v:
            target.mkdir()
        else:
            raise AssertionError(f"volume {m['name']}: unknown kind {v}")
        if m.get("readOnly"):
            read_only.append(target)
    fields = {"spec.nodeName": node, "metadata.namespace": ds["metadata"]["namespace"]}
    env = {
        e["name"]: e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        for e in c["env"]
    }
    mounts = sorted((m["mountPath"] for m in c["volumeMounts"]), key=len, reverse=True)
    args = []
    for written in c["args"]:
        arg = expand(written, env)
        flag, eq, value = arg.partition("=")
        if eq and value.startswith("/"):
            assert any(value == m or value.startswith(m + "/") for m in mounts), (
                f"{flag}={value}: outside every volume mount"
            )
            arg = f"{flag}={root}{value}"
        args.append(arg)
    return Container(
        root=root,
        args=args,
        env=env,
        read_only=read_only,
        written=[expand(a, env) for a in c["args"]],
        mounts={
            m["mountPath"]: (root / m["mountPath"].lstrip("/"), bool(m.get("readOnly")))
            for m in c["volumeMounts"]
        },
    )


def metric(text: str, name: str, **labels: str) -> list[float]:
    """Values of the samples of ``name`` carrying ``labels``."""
    out = []
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            out.append(float(value))
    return out
