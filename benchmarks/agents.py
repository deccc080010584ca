"""The API server's cost of N agents, measured with simulated agents against the test
kube-apiserver (tests/support/controlplane: etcd and kube-apiserver on loopback).

Each simulated agent is the agent's own cluster code in this process, with a client of its own
(its own connection pool and threads, as each agent has): the pod watch of its node
(:class:`~nodeguard.kube.watch.PodWatcher`: a LIST and WATCH with ``spec.nodeName=<node>``, and
its Node read every 60 s) and its node's Lease (:class:`~nodeguard.remediation.actor.
NodeActor`: renewed every third of its 30 s). Nothing else of an agent talks to the API server
at steady state (samples read the kernel; the delivery claims and Katib reads come with alerts
and actions). Then a cluster-wide incident: every agent cordons its own node at once
(:func:`~nodeguard.actions.cordon.cordon`, the cordon budget a tenth of the nodes:
``--cordon.budget-percent=10``), as every agent's rule would when every node is pressured.

Figures per phase: the API server's and etcd's CPU (their processes' user + system time over
the phase, in cores), the API server's RSS, requests per second by verb and resource and the
409 conflicts (the API server's own ``apiserver_request_total``), and for the incident how long
until every agent had its answer, and the outcomes.

    python benchmarks/agents.py --agents 50,100,200        # about 5 minutes
    python benchmarks/agents.py --agents 20 --steady 20    # a quick look

The agents share this process's two cores with the API server, so the incident's wall time is
an upper bound; the API server's CPU and its requests are what it really did. Prints figures;
asserts nothing about time.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kubernetes import client  # noqa: E402

from nodeguard.actions.cordon import CordonConfig, cordon  # noqa: E402
from nodeguard.kube.client import KubeClient  # noqa: E402
from nodeguard.kube.watch import PodWatcher  # noqa: E402
from nodeguard.remediation.actor import NodeActor  # noqa: E402
from tests.support.controlplane.cluster import TestCluster  # noqa: E402
from tests.support.kube_helpers import Cluster as Admin  # noqa: E402

PODS_PER_NODE = 5
LEASE_NS = "nodeguard"
_CLK = os.sysconf("SC_CLK_TCK")
_REQ = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+]+)$")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _requests(admin: Admin) -> collections.Counter[tuple[str, str, str]]:
    """``apiserver_request_total`` by (verb, resource, code)."""
    request = admin.api.param_serialize(
        method="GET", resource_path="/metrics", auth_settings=["BearerToken"]
    )
    response = admin.api.call_api(*request)
    response.read()  # type: ignore[no-untyped-call]
    text = bytes(response.data or b"").decode()
    out: collections.Counter[tuple[str, str, str]] = collections.Counter()
    for line in text.splitlines():
        m = _REQ.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"]))
        out[(labels.get("verb", ""), labels.get("resource", ""), labels.get("code", ""))] += int(
            float(m["value"])
        )
    return out


@dataclass
class Phase:
    """What the API server did over one phase."""

    seconds: float
    apiserver_cpu: float
    etcd_cpu: float
    rss_mib: float
    requests: collections.Counter[tuple[str, str, str]] = field(default_factory=collections.Counter)

    def rate(self, verb: str | None = None, resource: str | None = None) -> float:
        n = sum(
            v
            for (vb, res, _), v in self.requests.items()
            if (verb is None or vb == verb) and (resource is None or res == resource)
        )
        return n / self.seconds

    def conflicts(self) -> int:
        return sum(v for (_, _, code), v in self.requests.items() if code == "409")


class Meter:
    """CPU, RSS and requests of the API server (and etcd's CPU) from :meth:`start` on."""

    def __init__(self, cp: TestCluster, admin: Admin) -> None:
        self._pids = (cp.apiserver_pid, cp.etcd_pid)
        self._admin = admin

    def start(self) -> None:
        self._t = time.monotonic()
        self._cpu = [_cpu_seconds(p) for p in self._pids]
        self._req = _requests(self._admin)

    def stop(self) -> Phase:
        seconds = time.monotonic() - self._t
        cpu = [_cpu_seconds(p) - c for p, c in zip(self._pids, self._cpu, strict=True)]
        done = _requests(self._admin)
        done.subtract(self._req)
        return Phase(
            seconds=seconds,
            apiserver_cpu=cpu[0] / seconds,
            etcd_cpu=cpu[1] / seconds,
            rss_mib=_rss_mib(self._pids[0]),
            requests=+done,
        )


def _scene(admin: Admin, *, nodes: int, offset: int) -> list[str]:
    names = []
    ns = "bench-agents"
    if offset == 0:
        admin.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        admin.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=LEASE_NS)))
    for i in range(offset, offset + nodes):
        node = admin.node(f"sim-node-{i:04d}", memory="64Gi")
        names.append(node)
        for j in range(PODS_PER_NODE):
            admin.pod(namespace=ns, node=node, name=f"p-{i:04d}-{j}", request="1Gi", limit="2Gi")
    return names


@dataclass
class Agent:
    node: str
    kube: KubeClient
    watcher: PodWatcher
    actor: NodeActor


async def _steady(agents: list[Agent], *, seconds: float, meter: Meter) -> Phase:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(a.watcher.run(stop=stop)) for a in agents]
    tasks += [asyncio.create_task(a.actor.run(stop=stop)) for a in agents]
    await asyncio.wait_for(asyncio.gather(*(a.watcher.synced.wait() for a in agents)), timeout=300)
    await asyncio.sleep(5)  # the first Lease writes done: steady state from here
    meter.start()
    await asyncio.sleep(seconds)
    phase = meter.stop()
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return phase


async def _incident(agents: list[Agent], *, meter: Meter) -> tuple[Phase, collections.Counter[str]]:
    config = CordonConfig(budget_percent=10, lease_namespace=LEASE_NS, lock_timeout=60.0)
    meter.start()
    results = await asyncio.gather(
        *(
            cordon(
                kube=a.kube,
                node=a.node,
                rule="node-memory-low",
                reason="bench",
                identity=f"{a.node}/bench",
                dry_run=False,
                config=config,
            )
            for a in agents
        )
    )
    phase = meter.stop()
    return phase, collections.Counter(r.outcome for r in results)


def _uncordon(admin: Admin, nodes: list[str]) -> None:
    """Every node uncordoned and the budget Lease gone: the next round is an incident of a
    cluster of its own size, its first holder counting its Nodes."""
    client.CoordinationV1Api(admin.api).delete_namespaced_lease(CordonConfig().lease_name, LEASE_NS)
    for n in nodes:
        admin.core.patch_node(
            n,
            {
                "metadata": {"labels": {"nodeguard.io/cordoned": None}},
                "spec": {"unschedulable": None},
            },
        )


def _row(label: str, p: Phase) -> str:
    by: collections.Counter[str] = collections.Counter()
    for (verb, resource, _), v in p.requests.items():
        by[f"{verb} {resource}"] += v
    top = ", ".join(f"{k} {v / p.seconds:.2f}" for k, v in by.most_common(6))
    return (
        f"  {label:<30} apiserver {p.apiserver_cpu * 100:5.1f} % of a core "
        f"({p.apiserver_cpu * p.seconds:.2f} CPU s), etcd {p.etcd_cpu * 100:4.1f} % "
        f"({p.etcd_cpu * p.seconds:.2f} s), RSS {p.rss_mib:4.0f} MiB, {p.rate():6.1f} req/s "
        f"({sum(p.requests.values())} requests), "
        f"409s {p.conflicts()}\n  {'':<30} by verb and resource, per second: {top}"
    )


async def _run(cp: TestCluster, admin: Admin, counts: list[int], steady: float) -> None:
    made: list[str] = []
    meter = Meter(cp, admin)
    for n in counts:
        made += _scene(admin, nodes=n - len(made), offset=len(made))
        nodes = made[:n]
        agents = []
        for node in nodes:
            kube = KubeClient.load(kubeconfig=cp.kubeconfig_path)
            agents.append(
                Agent(
                    node=node,
                    kube=kube,
                    watcher=PodWatcher(kube=kube, node_name=node),
                    actor=NodeActor(
                        kube=kube,
                        node=node,
                        namespace=LEASE_NS,
                        identity=f"{node}/bench",
                        duration=30,
                        dry_run=False,
                        state_id="bench",
                        mirror=dict,
                    ),
                )
            )
        print(f"{n} agents ({n} nodes, {n * PODS_PER_NODE} pods):", flush=True)
        steady_phase = await _steady(agents, seconds=steady, meter=meter)
        print(_row(f"steady, {steady:.0f} s", steady_phase), flush=True)
        started = time.monotonic()
        incident, outcomes = await _incident(agents, meter=meter)
        took = time.monotonic() - started
        print(_row(f"incident, {took:.1f} s to every answer", incident), flush=True)
        print(f"  {'':<30} outcomes {dict(outcomes)}", flush=True)
        print(
            f"  {'':<30} steady, per agent: {steady_phase.rate() / n:.3f} req/s, "
            f"{steady_phase.apiserver_cpu / n * 1000:.2f} ms of API server CPU a second",
            flush=True,
        )
        for a in agents:
            a.kube.close()
        _uncordon(admin, nodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", default="50,100,200", help="agent counts (default 50,100,200)")
    parser.add_argument("--steady", type=float, default=60.0, help="steady phase seconds")
    args = parser.parse_args()
    counts = [int(x) for x in args.agents.split(",")]
    with TestCluster() as cp:
        admin = Admin(cp.kubeconfig_path)
        try:
            asyncio.run(_run(cp, admin, counts, args.steady))
        finally:
            admin.close()


if __name__ == "__main__":
    main()
