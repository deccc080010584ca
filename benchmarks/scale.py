"""Cost against the number of containers: in-process snapshot and render, ``/metrics`` of a real
``nodeguard run`` beside node_exporter, and CPU per sample of real processes.

- :func:`inprocess`: benchmarks/inprocess.py in a child process (nothing else in its interpreter);
  :func:`kernel_inprocess` the same over real cgroups on this machine's cgroupfs.
- :func:`scrapes`: ``nodeguard run`` on the tree (default rules, a sample every second, memory
  moving every second) and the peer in one loop of scrapes (benchmarks/scrape_loop.py): each
  scrape's latency and the CPU the process spent on it, an agent's first scrape of a snapshot
  and an HA pair's second, RSS after the loop.
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, Proc, agent, cpu_seconds, env_with_src, rss_bytes
from benchmarks.hosts import Churn, HostTree
from benchmarks.scrape_loop import Target, scrape_loop
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


@contextlib.contextmanager
def moving(trees: list[HostTree], *, every: float) -> Iterator[None]:
    """Memory moves in every cgroup of ``trees`` every ``every`` seconds
    (:class:`benchmarks.hosts.Churn`), from a thread of this runner, for the block."""
    stop = threading.Event()
    movers = [Churn(tree.root, rng=random.Random(tree.containers)) for tree in trees]

    def move() -> None:
        while not stop.wait(every):
            for m in movers:
                m.step()

    mover = threading.Thread(target=move, daemon=True)
    mover.start()
    try:
        yield
    finally:
        stop.set()
        mover.join()


def scrapes(
    tree: HostTree,
    *,
    peer: Proc,
    rounds: int,
    workdir: Path,
    before: Path | None = None,
) -> dict[str, Any]:
    """``/metrics`` of agents on the tree (sampling every second, memory moving every second)
    beside the peer, in one loop (benchmarks/scrape_loop.py): each agent's first scrape of a
    snapshot and an HA pair's second; ``before``: the code before, as a third target."""
    workdir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        targets = []
        for name, src in (("nodeguard", None), ("before", before)):
            if name == "before" and src is None:
                continue
            wd = workdir / name
            ng = stack.enter_context(
                agent(
                    args=_agent_args(tree, wd / "state", "1s"),
                    log_path=wd.with_suffix(".log"),
                    src=src,
                )
            )
            targets.append(Target(name, ng, ng.pid, pair=True))
        targets.append(Target("node_exporter", peer, peer.pid))
        stack.enter_context(moving([tree], every=1.0))
        return scrape_loop(targets, rounds=rounds, period=1.25)


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
        # Memory moves in every cgroup between samples, from a thread of this runner: the
        # agents' CPU is theirs alone.
        stack.enter_context(moving(trees, every=2.5))
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


__all__ = ["inprocess", "kernel_files", "kernel_inprocess", "moving", "sample_cpu", "scrapes"]
