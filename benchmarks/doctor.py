"""``nodeguard doctor`` on a cluster of 1,000 pods in 50 namespaces over 20 nodes, against the
test kube-apiserver (tests/support/controlplane: etcd and kube-apiserver on loopback, built once
and cached): the read (Nodes, Pods, ResourceQuotas, LimitRanges through
:func:`nodeguard.doctor.read.read_cluster`), the checks (:func:`~nodeguard.doctor.registry.
run_checks`) and the whole CLI run (``python -m nodeguard doctor --json``, a process of its own:
start, imports, read, checks, output), each a median of ``--repeats`` runs, with the CLI's peak
RSS (``ru_maxrss`` of its ``wait4``). Then the checks alone on the same cluster copied
``--scale`` times (nodes and pods), to show how they grow with the cluster.

    python benchmarks/doctor.py                 # about a minute: the scene is most of it
    python benchmarks/doctor.py --pods 200 --repeats 3

The scene: 20 nodes (5 with 8 ``nvidia.com/gpu``; every fourth reserves nothing), 50
namespaces of ``--pods``/50 pods each bound round-robin to the nodes; in every other namespace
every third pod has no memory limit. Each namespace then gets a ResourceQuota and a LimitRange
(created after the pods, so admission neither defaults nor refuses them: the checks see the
mix as created). Each namespace has two PyTorchJobs (training CRDs of tests/fixtures/training):
``train``, whose pods are the namespace's first four (owned and labelled as the
training-operator makes them; Kueue-queued in every other namespace), and ``queued``, queued
and without pods. Prints figures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kubernetes import client  # noqa: E402

import nodeguard.doctor  # noqa: E402  (registers every check)
from nodeguard.doctor.inputs import Cluster  # noqa: E402
from nodeguard.doctor.read import read_cluster  # noqa: E402
from nodeguard.doctor.registry import run_checks  # noqa: E402
from nodeguard.kube.client import KubeClient  # noqa: E402
from tests.support.controlplane.cluster import TestCluster  # noqa: E402
from tests.support.kube_helpers import Cluster as Admin  # noqa: E402

NODES, NAMESPACES, GPU_NODES = 20, 50, 5
#: The pods of each namespace's PyTorchJob ``train`` (one Master, the rest Workers).
JOB_PODS = 4


def _nodes(admin: Admin) -> list[str]:
    names = [f"bench-node-{i:02d}" for i in range(NODES)]
    for i, name in enumerate(names):
        admin.core.create_node(client.V1Node.model_validate({"metadata": {"name": name}}))
        capacity = {"memory": "256Gi", "cpu": "64", "pods": "110"}
        if i < GPU_NODES:
            capacity["nvidia.com/gpu"] = "8"
        allocatable = {**capacity, "memory": "256Gi" if i % 4 == 3 else "250Gi"}
        admin.core.patch_node_status(
            name, {"status": {"capacity": capacity, "allocatable": allocatable}}
        )
    return names


def _pod(*, name: str, node: str, limit: bool, job: dict[str, Any] | None = None) -> client.V1Pod:
    resources: dict[str, Any] = {"requests": {"memory": "1Gi", "cpu": "100m"}}
    if limit:
        resources["limits"] = {"memory": "2Gi"}
    meta: dict[str, Any] = {"name": name, "labels": {"app": name.rsplit("-", 1)[0]}}
    if job is not None:  # as the training-operator makes a job's pods
        job_meta = job["metadata"]
        meta["labels"]["training.kubeflow.org/job-name"] = job_meta["name"]
        meta["ownerReferences"] = [
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "name": job_meta["name"],
                "uid": job_meta["uid"],
                "controller": True,
            }
        ]
    return client.V1Pod.model_validate(
        {
            "metadata": meta,
            "spec": {
                "nodeName": node,
                "containers": [
                    {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": resources}
                ],
            },
        }
    )


def _pytorchjob(admin: Admin, ns: str, *, name: str, queued: bool) -> dict[str, Any]:
    """A PyTorchJob of one Master and three Workers (no PriorityClass); ``queued``: with a
    Kueue queue label."""
    template = {"spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}}
    body = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": name,
            "labels": {"kueue.x-k8s.io/queue-name": "team"} if queued else {},
        },
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": template},
                "Worker": {"replicas": JOB_PODS - 1, "template": template},
            }
        },
    }
    created = admin.custom.create_namespaced_custom_object(
        "kubeflow.org", "v1", ns, "pytorchjobs", body
    )
    assert isinstance(created, dict)
    return created


def _scene(admin: Admin, *, pods: int) -> None:
    nodes = _nodes(admin)
    admin.install_training_crds()
    per_ns = pods // NAMESPACES
    jobs: list[Callable[[], object]] = []
    for n in range(NAMESPACES):
        ns = f"bench-{n:02d}"
        admin.core.create_namespace(client.V1Namespace.model_validate({"metadata": {"name": ns}}))
        job = _pytorchjob(admin, ns, name="train", queued=n % 2 == 0)
        _pytorchjob(admin, ns, name="queued", queued=True)  # no pods yet: judged on templates
        for i in range(per_ns):
            k = n * per_ns + i
            body = _pod(
                name=f"w{n:02d}-{i:03d}",
                node=nodes[k % NODES],
                limit=n % 2 == 0 or i % 3 != 0,
                job=job if i < JOB_PODS else None,
            )
            jobs.append(functools.partial(admin.core.create_namespaced_pod, ns, body))
    # The API server takes creates in parallel; 8 at once keeps both cores busy, no more.
    with ThreadPoolExecutor(max_workers=8) as pool:
        for f in [pool.submit(j) for j in jobs]:
            f.result()
    for n in range(NAMESPACES):
        ns = f"bench-{n:02d}"
        admin.core.create_namespaced_resource_quota(
            ns,
            client.V1ResourceQuota.model_validate(
                {
                    "metadata": {"name": "mem"},
                    "spec": {"hard": {"requests.memory": "64Gi", "limits.memory": "128Gi"}},
                }
            ),
        )
        limits: list[dict[str, Any]] = [{"type": "Container", "max": {"memory": "64Gi"}}]
        if n % 2 == 0:
            limits[0].update(default={"memory": "2Gi"}, defaultRequest={"memory": "1Gi"})
        admin.core.create_namespaced_limit_range(
            ns,
            client.V1LimitRange.model_validate(
                {"metadata": {"name": "mem"}, "spec": {"limits": limits}}
            ),
        )


def _timed(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def _cli(kubeconfig: Path) -> tuple[float, int, int, int]:
    """One ``nodeguard doctor --json`` run: wall seconds, exit status, peak RSS in bytes, and
    the findings' count (the JSON's length)."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nodeguard", "doctor", f"--kubeconfig={kubeconfig}", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    return wall, proc.returncode, usage.ru_maxrss * 1024, len(json.loads(out)["findings"])


def _copied(cluster: Cluster, times: int) -> Cluster:
    """``cluster`` with its nodes and their pods copied ``times`` times, each copy on nodes of
    its own (``<node>-<k>``)."""
    nodes, pods = [], []
    for k in range(times):
        for n in cluster.nodes:
            node_meta = dataclasses.replace(n.meta, name=f"{n.name}-{k}")
            nodes.append(dataclasses.replace(n, meta=node_meta))
        for p in cluster.pods:
            meta = dataclasses.replace(
                p.meta, node_name=f"{p.meta.node_name}-{k}", name=f"{p.meta.name}-{k}"
            )
            pods.append(dataclasses.replace(p, meta=meta))
    return dataclasses.replace(cluster, nodes=tuple(nodes), pods=tuple(pods))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=1000, help="pods in all (default 1000)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure (default 5)")
    parser.add_argument(
        "--scale", type=int, default=10, help="copies of the cluster for the checks (default 10)"
    )
    args = parser.parse_args()
    with TestCluster() as cp:
        admin = Admin(cp.kubeconfig_path)
        started = time.perf_counter()
        _scene(admin, pods=args.pods)
        print(
            f"scene: {NODES} nodes, {NAMESPACES} namespaces, {args.pods} pods, "
            f"{NAMESPACES} quotas and LimitRanges, made in {time.perf_counter() - started:.1f} s"
        )
        kube = KubeClient.load(kubeconfig=cp.kubeconfig_path)

        def read() -> Cluster:
            return asyncio.run(read_cluster(kube))

        read_s, cluster = _timed(read, args.repeats)
        assert isinstance(cluster, Cluster)
        checks_s, findings = _timed(lambda: run_checks(cluster), args.repeats)
        assert isinstance(findings, list)
        kube.close()
        runs = [_cli(cp.kubeconfig_path) for _ in range(args.repeats)]
        admin.close()
    by_check: dict[str, int] = {}
    for f in findings:
        by_check[f.check] = by_check.get(f.check, 0) + 1
    counted = ", ".join(f"{k} {v}" for k, v in sorted(by_check.items()))
    print(f"findings: {len(findings)} ({counted})")
    print(f"median of {args.repeats}:")
    cli_ms = statistics.median(r[0] for r in runs) * 1000
    rss_mib = statistics.median(r[2] for r in runs) / 2**20
    rows = [
        ("read (every list, JSON to views)", f"{read_s * 1000:8.1f} ms"),
        (f"checks (all {len(nodeguard.doctor.registry.CHECKS)})", f"{checks_s * 1000:8.1f} ms"),
        ("CLI run, whole process", f"{cli_ms:8.1f} ms  (exit {runs[0][1]}, {runs[0][3]} findings)"),
        ("CLI peak RSS", f"{rss_mib:8.1f} MiB"),
    ]
    for times in (1, args.scale):
        big = _copied(cluster, times)
        seconds, _ = _timed(functools.partial(run_checks, big), args.repeats)
        rows.append(
            (f"checks on {len(big.nodes)} nodes, {len(big.pods)} pods", f"{seconds * 1000:8.1f} ms")
        )
    for label, value in rows:
        print(f"  {label:<38} {value}")


if __name__ == "__main__":
    main()
