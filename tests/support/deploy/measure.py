"""Measure ``nodeguard run``'s memory and CPU, to size the DaemonSet's requests and limits.

Two runs, each scraped like Prometheus and probed like the kubelet (``/metrics`` every 15 s,
``/readyz`` every 5 s, ``/healthz`` every 10 s):

- ``fixture``: the committed host tree ``tests/fixtures/hosts/v2-systemd-containerd``, no cluster;
- ``node``: this machine's real ``/proc`` and ``/sys`` with ``--pods`` kubelet-shaped memory
  cgroups on the real kernel (cgroup v1 or v2), each holding ``--procs-per-pod`` sleeping
  processes, and as many pods on a node of the test control plane, listed and watched by the
  agent (so container series carry pod names and the rules see every pod).

Prints RSS (steady mean and peak, VmHWM) and CPU (mean over the run and the busiest 15 s), as
JSON. Needs root and a writable memory controller for ``node`` (``--skip-node`` leaves it out)::

    .venv/bin/python -m tests.support.deploy.measure --duration 300
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support.agent import wait_until
from tests.support.controlplane.cluster import terminate

REPO = Path(__file__).resolve().parents[3]
FIXTURE = REPO / "tests" / "fixtures" / "hosts" / "v2-systemd-containerd"
_TCK = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TCK  # utime, stime


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _get(url: str) -> int:
    return _fetch(url)[0]


def _fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return int(resp.status), resp.read().decode()
    except OSError:
        return 0, ""


def _series(text: str) -> dict[str, Any]:
    """What the last scrape held: container series (named or not) and failing collectors."""
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    containers = [
        line for line in lines if line.startswith("nodeguard_container_memory_working_set_bytes{")
    ]
    return {
        "container_series": len(containers),
        "named_container_series": sum('namespace=""' not in line for line in containers),
        "failing_collectors": [
            line.split('"')[1]
            for line in lines
            if line.startswith("nodeguard_collector_success{") and line.endswith(" 0.0")
        ],
    }


def observe(cmd: list[str], *, duration: float, env: dict[str, str]) -> dict[str, Any]:
    """Run ``cmd`` (``nodeguard run ... --listen-address=127.0.0.1:PORT``) for ``duration``
    seconds after it is ready; its RSS and CPU."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [*cmd, f"--listen-address=127.0.0.1:{port}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"agent exited: {proc.stderr.read() if proc.stderr else ''}")
            return _get(f"{base}/readyz") == 200

        wait_until("the agent ready", ready, timeout=60, step=0.2)
        start_cpu, start = _cpu_seconds(proc.pid), time.monotonic()
        rss: list[int] = []
        windows: list[tuple[float, float]] = [(start, start_cpu)]
        scrapes = 0
        tick = 0
        last = ""
        # not a wait: the measurement itself, for ``duration`` seconds
        while time.monotonic() - start < duration:
            time.sleep(1)
            tick += 1
            rss.append(_status_kib(proc.pid, "VmRSS"))
            if tick % 5 == 0:
                _get(f"{base}/readyz")
            if tick % 10 == 0:
                _get(f"{base}/healthz")
            if tick % 15 == 0:
                status, last = _fetch(f"{base}/metrics")
                scrapes += status == 200
                windows.append((time.monotonic(), _cpu_seconds(proc.pid)))
        end_cpu, end = _cpu_seconds(proc.pid), time.monotonic()
        peaks = [(c2 - c1) / (t2 - t1) for (t1, c1), (t2, c2) in itertools.pairwise(windows)]
        steady = rss[len(rss) // 5 :] or rss  # after the first fifth: warm caches, imports done
        return {
            "seconds": round(end - start),
            "scrapes": scrapes,
            "rss_mib_mean": round(sum(steady) / len(steady) / 1024, 1),
            "rss_mib_max": round(max(rss) / 1024, 1),
            "vmhwm_mib": round(_status_kib(proc.pid, "VmHWM") / 1024, 1),
            "cpu_cores_mean": round((end_cpu - start_cpu) / (end - start), 4),
            "cpu_cores_max_15s": round(max(peaks), 4) if peaks else None,
            **_series(last),
        }
    finally:
        terminate(proc, timeout=15)


def _agent(*flags: str) -> list[str]:
    return [sys.executable, "-m", "nodeguard", "run", *flags, "--log.level=warning"]


def measure_fixture(duration: float, tmp: Path) -> dict[str, Any]:
    root = tmp / "fixture"
    shutil.copytree(FIXTURE, root)
    cmd = _agent(
        f"--path.procfs={root / 'proc'}",
        f"--path.sysfs={root / 'sys'}",
        f"--path.kmsg={root / 'kmsg'}",
        f"--path.state={tmp / 'state-fixture'}",
        f"--rules={REPO / 'rules' / 'default.yaml'}",
        "--interval=5s",
    )
    env = {**os.environ, "NODE_NAME": "fixture-node"}
    return observe(cmd, duration=duration, env=env)


@contextlib.contextmanager
def _sleepers(cgroup_dir: Path, count: int) -> Iterator[None]:
    procs = [subprocess.Popen(["sleep", "infinity"]) for _ in range(count)]
    try:
        for p in procs:
            (cgroup_dir / "cgroup.procs").write_text(str(p.pid))
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def measure_node(duration: float, tmp: Path, *, pods: int, procs_per_pod: int) -> dict[str, Any]:
    from tests.support.controlplane.cluster import TestCluster
    from tests.support.kernel_cgroup import kubelet_cgroup, private_kubepods
    from tests.support.kube_helpers import Cluster

    with TestCluster() as cp, contextlib.ExitStack() as stack:
        cluster = Cluster(cp.kubeconfig_path)
        stack.callback(cluster.api.close)
        ns, node = cluster.namespace("measure"), cluster.node(memory="1024Gi")
        # A kubepods of its own: the agent reads these pods alone, never the machine's.
        kubepods = stack.enter_context(private_kubepods(tmp))
        for i in range(pods):
            pod = cluster.pod(namespace=ns, node=node, name=f"worker-{i}", request="1Gi")
            cid = pod["status"]["containerStatuses"][0]["containerID"].split("://")[1]
            cg = stack.enter_context(
                kubelet_cgroup(
                    kubepods, limit_bytes=8 << 30, pod_uid=pod["metadata"]["uid"], container_id=cid
                )
            )
            stack.enter_context(_sleepers(cg.container_dir, procs_per_pod))
        cmd = _agent(
            "--path.procfs=/proc",
            f"--path.sysfs={kubepods.sysfs}",
            "--path.kmsg=/dev/kmsg",
            f"--path.state={tmp / 'state-node'}",
            f"--rules={REPO / 'rules' / 'default.yaml'}",
            f"--kubeconfig={cp.kubeconfig_path}",
            "--interval=5s",
        )
        env = {**os.environ, "NODE_NAME": node}
        result = observe(cmd, duration=duration, env=env)
        result["pods"] = pods
        result["processes"] = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit())
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--pods", type=int, default=110, help="pods on the node (kubelet max)")
    parser.add_argument("--procs-per-pod", type=int, default=10)
    parser.add_argument("--skip-node", action="store_true")
    parser.add_argument("--skip-fixture", action="store_true")
    args = parser.parse_args()
    out: dict[str, Any] = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="nodeguard-measure-") as tmp:
        if not args.skip_fixture:
            out["fixture"] = measure_fixture(args.duration, Path(tmp))
            print(json.dumps(out["fixture"]), file=sys.stderr, flush=True)
        if not args.skip_node:
            out["node"] = measure_node(
                args.duration, Path(tmp), pods=args.pods, procs_per_pod=args.procs_per_pod
            )
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
