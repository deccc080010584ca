"""A real agent remediating on the test control plane: the slab-high rule files it is given
(the v2 fixture host's unreclaimable slab is 31 % of RAM, so they hold), its arguments, the
pods it may evict, the Alertmanager deliveries it is sent, and what it did (pods evicted, a
series of its ``/metrics``). Shared by the restart, Lease and Katib tests of tests/cluster/."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.support.agent import get
from tests.support.hosts import HOSTS, host_flags
from tests.support.kube_helpers import Cluster

SLAB_RULES = """\
apiVersion: nodeguard.io/v1alpha1
kind: RuleSet
spec:
  rules:
    - name: slab-high
      scope: node
      when:
        - {{signal: node_slab_unreclaimable_ratio, op: ">", value: 0.3}}
      cooldown: {cooldown}
      maxFirings: {{count: 1, window: 1h}}
      actions: {actions}
      resolve: [{{action: uncordon}}]
"""


def slab_rules(tmp_path: Path, *, actions: str, cooldown: str = "5m") -> Path:
    """``tmp_path/rules.yaml``: :data:`SLAB_RULES` with ``actions`` (a YAML flow list) and
    ``cooldown``."""
    path = tmp_path / "rules.yaml"
    path.write_text(SLAB_RULES.format(actions=actions, cooldown=cooldown))
    return path


def agent_args(
    tmp_path: Path, *, node: str, kubeconfig: Path, rules: Path, extra: tuple[str, ...] = ()
) -> list[str]:
    """``nodeguard run`` flags of a real agent on the v2 fixture host acting (not dry run) on
    ``node`` of the control plane at ``kubeconfig``, with ``rules``, its state in
    ``tmp_path/state``; ``extra`` flags last."""
    return [
        *host_flags("v2-systemd-containerd"),
        f"--kubeconfig={kubeconfig}",
        f"--rules={rules}",
        f"--node-name={node}",
        "--interval=100ms",
        "--no-dry-run",
        f"--path.state={tmp_path / 'state'}",
        "--cordon.lease-namespace=default",
        *extra,
    ]


def is_gone(cluster: Cluster, ns: str, name: str) -> bool:
    """Whether pod ``ns/name`` is deleted or being deleted."""
    pod = cluster.pod_json(ns, name)
    return pod is None or bool(pod["metadata"].get("deletionTimestamp"))


def evicted_pods(cluster: Cluster, ns: str, names: list[str]) -> list[str]:
    """Those of ``names`` (pods of ``ns``) that are gone or going."""
    return [n for n in names if is_gone(cluster, ns, n)]


def metric_value(base: str, name: str, **labels: str) -> float:
    """The value of series ``name{labels}`` on the agent's ``/metrics`` at ``base``; 0 when
    absent."""
    for line in get(f"{base}/metrics")[1].splitlines():
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] == name and all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return 0.0


def low_priority_pods(cluster: Cluster, ns: str, node: str, n: int) -> list[str]:
    """``n`` pods ``batch-<i>`` of 1 GiB request in ``ns`` on ``node`` at the lowest test priority;
    their names."""
    names = [f"batch-{i}" for i in range(n)]
    for name in names:
        cluster.pod(
            namespace=ns, node=node, name=name, request="1Gi", priority_class="nodeguard-test-low"
        )
    return names


def katib_gang(cluster: Cluster, ns: str, here: str, there: str) -> list[str]:
    """A Katib trial of two pods (``t1-master`` on ``here``, ``t1-worker`` on ``there``) and a
    higher-priority ``bystander`` on ``here``; their names."""
    trial = {"katib.kubeflow.org/experiment": "e", "katib.kubeflow.org/trial": "e-t1"}
    cluster.pod(
        namespace=ns,
        node=here,
        name="t1-master",
        request="1Gi",
        labels=trial,
        priority_class="nodeguard-test-low",
    )
    cluster.pod(
        namespace=ns,
        node=there,
        name="t1-worker",
        request="1Gi",
        labels=trial,
        priority_class="nodeguard-test-low",
    )
    cluster.pod(
        namespace=ns,
        node=here,
        name="bystander",
        request="1Gi",
        priority_class="nodeguard-test-mid",
    )
    return ["t1-master", "t1-worker", "bystander"]


ALERT_RULES = """\
apiVersion: nodeguard.io/v1alpha1
kind: RuleSet
spec:
  alerts:
    - name: am-node-memory-low
      alertname: NodeguardNodeMemoryLow
      actions: [{action: evict, args: {free: "0"}}]
"""


def alert_delivery(node: str, starts: str) -> bytes:
    """An Alertmanager (version 4) body: ``NodeguardNodeMemoryLow`` firing on ``node`` since
    ``starts`` (RFC 3339)."""
    return json.dumps(
        {
            "version": "4",
            "status": "firing",
            "alerts": [
                {
                    "status": "firing",
                    "labels": {"alertname": "NodeguardNodeMemoryLow", "node": node},
                    "annotations": {},
                    "startsAt": starts,
                    "endsAt": "0001-01-01T00:00:00Z",
                    "fingerprint": "f00d",
                }
            ],
        }
    ).encode()


async def post_delivery(url: str, body: bytes, token: str) -> int:
    """POST ``body`` to ``url`` with the bearer ``token``; the HTTP status."""
    import aiohttp

    async with (
        aiohttp.ClientSession() as s,
        s.post(url, data=body, headers={"Authorization": f"Bearer {token}"}) as resp,
    ):
        return resp.status


# -- a runbook resumed before the pod list arrives -----------------------------------------------
MiB = 1 << 20


SLAB_HIGH = "SUnreclaim:     10485760 kB"  # the fixture's: 31 % of MemTotal, slab-high holds


SLAB_LOW = "SUnreclaim:      1048576 kB"  # 3 %


def pod_cgroup(host: Path, pod: dict[str, Any], *, working_set: int, limit: int | None) -> None:
    """The cgroup v2 tree the kubelet (systemd driver) and containerd make for ``pod`` (a
    Burstable pod: ``kubepods-burstable-pod<uid, - as _>.slice/cri-containerd-<id>.scope``),
    all of it anonymous memory (working set = memory.current - inactive_file, cAdvisor's)."""
    uid = pod["metadata"]["uid"].replace("-", "_")
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    burstable = host / "sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice"
    pod_dir = burstable / f"kubepods-burstable-pod{uid}.slice"
    for d in (pod_dir, pod_dir / f"cri-containerd-{cid}.scope"):
        d.mkdir(parents=True)
        (d / "memory.current").write_text(f"{working_set}\n")
        (d / "memory.max").write_text(f"{limit if limit else 'max'}\n")
        (d / "memory.stat").write_text(
            f"anon {working_set}\nfile 0\nactive_file 0\ninactive_file 0\nshmem 0\n"
        )
        (d / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")


def starved_host(tmp_path: Path, cluster: Cluster, ns: str, node: str) -> Path:
    """A copy of the v2 fixture host whose slab is low (slab-high does not hold yet), with the
    cgroups of two pods of ``node``: ``hog`` at 1.8 GiB of its 2 GiB limit (1 GiB requested),
    ``idle`` at 100 MiB of its 1 GiB request. Ranked like the kubelet's (usage above request
    first), only ``hog`` frees the 1 GiB asked."""
    host = tmp_path / "host"
    shutil.copytree(HOSTS / "v2-systemd-containerd", host, symlinks=True)
    meminfo = host / "proc" / "meminfo"
    meminfo.write_text(meminfo.read_text().replace(SLAB_HIGH, SLAB_LOW))
    for name, used, limit in (("hog", 1843 * MiB, "2Gi"), ("idle", 100 * MiB, None)):
        pod = cluster.pod(
            namespace=ns,
            node=node,
            name=name,
            request="1Gi",
            limit=limit,
            priority_class="nodeguard-test-low",
        )
        pod_cgroup(host, pod, working_set=used, limit=2 << 30 if limit else None)
    return host


def host_args(host: Path, tmp_path: Path, *, node: str, kubeconfig: Path) -> list[str]:
    """``nodeguard run`` flags of a real agent on ``host`` (a copy of a fixture host, as
    :func:`starved_host` makes) cordoning and evicting 1 GiB on ``node`` when slab-high holds."""
    rules = slab_rules(tmp_path, actions='[{action: cordon}, {action: evict, args: {free: "1Gi"}}]')
    return [
        f"--path.procfs={host / 'proc'}",
        f"--path.sysfs={host / 'sys'}",
        f"--path.kmsg={host / 'kmsg'}",
        f"--kubeconfig={kubeconfig}",
        f"--rules={rules}",
        f"--node-name={node}",
        "--interval=100ms",
        "--no-dry-run",
        f"--path.state={tmp_path / 'state'}",
        "--cordon.lease-namespace=default",
    ]


def pod_list_request(node: str) -> str:
    """The pod watch's LIST of ``node``'s pods (not its watch, not a namespace's list)."""
    return rf"^/api/v1/pods\?(?!.*watch=)(?=.*fieldSelector=spec\.nodeName%3D{node}\b)"


EVICT_ONE = '[{action: evict, args: {free: "0"}}]'


LEASE_SECONDS = 2  # --actor.lease-duration: seconds


def actor_args(tmp_path: Path, name: str, *, node: str, kubeconfig: Path, rules: Path) -> list[str]:
    """:func:`agent_args` for agent ``name`` of several on one node: a state directory of its own
    and a Lease of :data:`LEASE_SECONDS`."""
    args = agent_args(tmp_path, node=node, kubeconfig=kubeconfig, rules=rules)
    state = f"--path.state={tmp_path / 'state'}"
    return [
        *(a if a != state else f"--path.state={tmp_path / name}" for a in args),
        f"--actor.lease-duration={LEASE_SECONDS}",
    ]


def incidents(base: str) -> list[dict[str, Any]]:
    """The agent's ``/incidents`` list at ``base``: the firings' (a fixture's kernel log has
    OOM kills, each an incident of kind ``oom_kill`` too, left out here)."""
    items: list[dict[str, Any]] = json.loads(get(f"{base}/incidents")[1])
    return [i for i in items if i.get("kind") != "oom_kill"]


def evicted_events(cluster: Cluster, ns: str, names: list[str]) -> int:
    """``NodeguardEvicted`` Events on the pods ``names`` of ``ns``."""
    return sum(len(cluster.events(ns, name=n, reason="NodeguardEvicted")) for n in names)


def actor_state(base: str, state: str) -> float:
    """``nodeguard_actor{state}`` of the agent at ``base``: 1 when it is in that state."""
    return metric_value(base, "nodeguard_actor", state=state)
