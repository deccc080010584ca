"""A node's pod list as the watch serves it, without an API server: PodMeta parsed from Pod JSON
by the real parser (:func:`nodeguard.kube.objects.pod_meta`), for the sampler's ``cluster``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from nodeguard.kube.objects import pod_meta
from nodeguard.snapshot import NodeMeta, PodMeta

Runtime = Literal["containerd", "cri-o", "docker"]


@dataclass
class PodList:
    """The pod list as the watch serves it: PodMeta parsed from Pod JSON by the real parser."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)

    def is_synced(self) -> bool:
        return True

    def pods(self) -> Mapping[str, PodMeta]:
        return {uid: pod_meta(p) for uid, p in self.objects.items()}

    def node(self) -> NodeMeta | None:
        return None

    def set(self, *, uid: str, name: str, statuses: list[dict[str, Any]]) -> None:
        self.objects[uid] = {
            "metadata": {"uid": uid, "name": name, "namespace": "ml"},
            "spec": {"nodeName": "n", "containers": [{"name": s["name"]} for s in statuses]},
            "status": {"phase": "Running", "containerStatuses": statuses},
        }


def status(
    name: str, cid: str, *, runtime: Runtime = "containerd", last: str | None = None
) -> dict[str, Any]:
    """A containerStatuses entry as the kubelet writes it: ``<runtime>://<id>``, and after a
    restart ``lastState.terminated`` with the replaced container's ID and reason."""
    out: dict[str, Any] = {
        "name": name,
        "containerID": f"{runtime}://{cid}",
        "restartCount": 0,
        "state": {"running": {}},
    }
    if last is not None:
        out["restartCount"] = 1
        out["lastState"] = {
            "terminated": {
                "containerID": f"{runtime}://{last}",
                "exitCode": 137,
                "reason": "OOMKilled",
            }
        }
    return out
