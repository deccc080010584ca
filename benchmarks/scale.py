"""Cost against the number of containers: in-process snapshot and render, ``/metrics`` of a real
``nodeguard run`` beside node_exporter, and CPU per sample of real processes.

- :func:`inprocess`: benchmarks/inprocess.py in a child process (nothing else in its interpreter);
  :func:`kernel_inprocess` the same over real cgroups on this machine's cgroupfs.
- :func:`scrapes`: one ``nodeguard run`` on the tree (default rules; ``--interval=1h``, so that
  after its first sample its CPU is the scrapes' alone) and the peer, scraped alternately with
  Prometheus's headers (OpenMetrics, gzip) over kept-alive connections; latency of each scrape,
  CPU per scrape from each process's utime + stime over the loop, RSS after it.
- :func:`sample_cpu`: one ``nodeguard run`` per tree, all at once, at the default 5 s interval
  with the default rules and no scrapes, memory moving in every cgroup between samples; CPU
  over the window divided by the samples taken, counted exactly (each sample opens the tree's
  ``proc/meminfo`` once; inotify counts the opens).
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    ROOT,
    Proc,
    Scraper,
    agent,
    cpu_seconds,
    env_with_src,
    median,
    p90,
    rss_bytes,
)
from benchmarks.hosts import Churn, HostTree
from benchmarks.soak import OpenCounter


def inprocess(tree: HostTree, *, repeats: int, src: Path | None = None) -> dict[str, Any]:
    return _inprocess([str(tree.root), f"--repeats={repeats}"], src=src)


def kernel_inprocess(containers: int, *, repeats: int) -> dict[str, Any]:
    """benchmarks/inprocess.py --kernel: snapshots of real cgroups on this machine's cgroupfs."""
    return _inprocess([f"--kernel={containers}", f"--repeats={repeats}"], src=None)


def kernel_files() -> dict[str, Any]:
    """benchmarks/kernel_files.py: one cgroup file's cost, and held files' kernel memory;
    ``{"error": ...}`` where it cannot run (not root, no writable memory controller)."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/kernel_files.py")],
        capture_output=True,
        text=True,
        env=env_with_src(),
        cwd="/",
        check=False,
    )
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def _inprocess(args: list[str], *, src: Path | None) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/inprocess.py"), *args],
        capture_output=True,
        text=True,
        env=env_with_src(src),
        cwd="/",
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"inprocess.py failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def _agent_args(tree: HostTree, state: Path, interval: str) -> list[str]:
    return [
        *tree.flags,
        f"--interval={interval}",
        f"--path.state={state}",
        f"--rules={ROOT / 'rules/default.yaml'}",
        "--no-collector.gpu",
    ]


def scrapes(
    tree: HostTree, *, peer: Proc, count: int, workdir: Path, src: Path | None = None
) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    args = _agent_args(tree, workdir / "state", "1h")
    with agent(args=args, log_path=workdir / "agent.log", src=src) as ng:
        ng_s, ne_s = Scraper(ng), Scraper(peer)
        for _ in range(3):  # warm both (connections, first-scrape allocations)
            ng_s.scrape()
            ne_s.scrape()
        ng_lat: list[float] = []
        ne_lat: list[float] = []
        cpu0 = (cpu_seconds(ng.pid), cpu_seconds(peer.pid))
        last_ng = last_ne = None
        for _ in range(count):
            last_ng = ng_s.scrape()
            ng_lat.append(last_ng.seconds)
            last_ne = ne_s.scrape()
            ne_lat.append(last_ne.seconds)
        cpu1 = (cpu_seconds(ng.pid), cpu_seconds(peer.pid))
        rss = (rss_bytes(ng.pid), rss_bytes(peer.pid))
        ng_s.close()
        ne_s.close()
    assert last_ng is not None and last_ne is not None
    return {
        "ng_ms": [median(ng_lat) * 1e3, p90(ng_lat) * 1e3],
        "ne_ms": [median(ne_lat) * 1e3, p90(ne_lat) * 1e3],
        "ng_cpu_ms": (cpu1[0] - cpu0[0]) / count * 1e3,
        "ne_cpu_ms": (cpu1[1] - cpu0[1]) / count * 1e3,
        "ng_rss": rss[0],
        "ne_rss": rss[1],
        "ng_wire": last_ng.wire_bytes,
        "ng_body": last_ng.body_bytes,
        "ne_wire": last_ne.wire_bytes,
        "ne_body": last_ne.body_bytes,
        "ng_type": last_ng.content_type,
        "ne_type": last_ne.content_type,
    }


def sample_cpu(
    trees: list[HostTree], *, seconds: float, workdir: Path
) -> dict[int, dict[str, float]]:
    with contextlib.ExitStack() as stack:
        running = []
        for tree in trees:
            wd = workdir / f"n{tree.containers}"
            wd.mkdir(parents=True, exist_ok=True)
            counter = OpenCounter(tree.root / "proc/meminfo")
            stack.callback(counter.close)
            ng = stack.enter_context(
                agent(args=_agent_args(tree, wd / "state", "5s"), log_path=wd / "agent.log")
            )
            running.append((tree, ng, counter))
        # Memory moves in every cgroup between samples (benchmarks.hosts.Churn), from a thread
        # of this runner: the agents' CPU is theirs alone.
        stop = threading.Event()
        movers = [Churn(tree.root, rng=random.Random(tree.containers)) for tree in trees]

        def move() -> None:
            while not stop.wait(2.5):
                for m in movers:
                    m.step()

        mover = threading.Thread(target=move, daemon=True)
        mover.start()
        stack.callback(mover.join)
        stack.callback(stop.set)
        time.sleep(6)  # past the first samples, the rule history filling
        start = [(cpu_seconds(ng.pid), counter.count()) for _, ng, counter in running]
        time.sleep(seconds)
        out: dict[int, dict[str, float]] = {}
        for (tree, ng, counter), (cpu0, n0) in zip(running, start, strict=True):
            samples = counter.count() - n0
            cpu = cpu_seconds(ng.pid) - cpu0
            out[tree.containers] = {
                "samples": samples,
                "cpu_ms_per_sample": cpu / samples * 1e3 if samples else float("nan"),
                "rss": rss_bytes(ng.pid),
            }
    return out


__all__ = ["inprocess", "kernel_files", "kernel_inprocess", "p90", "sample_cpu", "scrapes"]
