"""In-process cost of one snapshot and one render, over a host tree; run as a child process by
benchmarks/run.py so that nothing else in the runner shares its interpreter.

- snapshot: ``Sampler.sample_once()`` with every collector but gpu (this machine has none), after
  one warm-up sample (which also finds the kubepods roots); wall time (``perf_counter``) and CPU
  time of the thread (``thread_time``), each the median and p90 of ``--repeats`` samples; and the
  median duration of each collector as the snapshot records it.
- render: the snapshot's part of ``/metrics`` as the agent writes it, each time of a new
  snapshot (memory moved, a sample taken: not timed), in the format Prometheus asks for
  (OpenMetrics 1.0.0, plain and gzipped) and in the classic text format; the same snapshot's
  again (an HA pair's second scrape); and prometheus_client's writer over the same families
  (the oracle, what the agent wrote before the fast writer). CPU time of the thread; body
  sizes, series.

    python benchmarks/inprocess.py TREE [--repeats 30] -> one JSON object on stdout
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import median, p90
from benchmarks.hosts import Churn


def _timed(
    fn: Callable[[], Any], repeats: int, *, before: Callable[[], Any] | None = None
) -> tuple[list[float], list[float], Any]:
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        if before is not None:
            before()  # not timed
        w0, c0 = time.perf_counter(), time.thread_time()
        result = fn()
        cpus.append(time.thread_time() - c0)
        walls.append(time.perf_counter() - w0)
    return walls, cpus, result


def measure(tree: Path, *, repeats: int) -> dict[str, Any]:
    import nodeguard
    from nodeguard.paths import HostPaths
    from nodeguard.sampling.sampler import COLLECTOR_NAMES, Sampler, SamplerConfig

    paths = HostPaths(procfs=tree / "proc", sysfs=tree / "sys", kmsg=tree / "kmsg", state=None)
    config: dict[str, Any] = {}
    if "max_open_files" in SamplerConfig.__dataclass_fields__:  # as `nodeguard run` sets it
        from nodeguard.sources.open_files import descriptor_budget

        config["max_open_files"] = descriptor_budget(raise_limit=True)
    sampler = Sampler(
        config=SamplerConfig(
            paths=paths,
            node_name="bench",
            collectors=frozenset(COLLECTOR_NAMES) - {"gpu"},
            **config,
        )
    )
    sampler.sample_once()
    gc.collect()
    _, static_cpus, _ = _timed(sampler.sample_once, repeats)
    churn = Churn(tree, rng=random.Random(8))
    walls, cpus, snap = _timed(sampler.sample_once, repeats, before=churn.step)
    per: dict[str, list[float]] = {}
    for _ in range(3):  # collector durations of a few more samples
        churn.step()
        for st in sampler.sample_once().collectors:
            per.setdefault(st.name, []).append(st.duration_seconds)
    open_files = getattr(snap, "cgroup_files_open", None) or getattr(
        sampler, "open_cgroup_files", 0
    )
    render = _render(sampler, repeats, churn)
    sampler.close()
    return {
        "nodeguard": f"{nodeguard.__version__} {Path(nodeguard.__file__).parent}",
        "pods": len(snap.pods),
        "containers": sum(len(p.containers) for p in snap.pods),
        "snapshot_wall_ms": [median(walls) * 1e3, p90(walls) * 1e3],
        "snapshot_cpu_ms": [median(cpus) * 1e3, p90(cpus) * 1e3],
        "snapshot_static_cpu_ms": [median(static_cpus) * 1e3, p90(static_cpus) * 1e3],
        "open_files": open_files,
        "collectors_ms": {k: median(v) * 1e3 for k, v in per.items()},
        **render,
    }


def _render(sampler: Any, repeats: int, churn: Churn) -> dict[str, Any]:
    """The snapshot's part of ``/metrics`` as the agent writes it, from a new snapshot each time
    (memory moved and a sample taken before each, not timed): ``nodeguard.exposition.handler``'s
    ``Exposition`` where the tree has it, else the tree's ``render`` over its
    ``SnapshotCollector`` (the code before this page's third round)."""
    import nodeguard
    from benchmarks.common import PROMETHEUS_HEADERS

    # Only the tree under test's own modules: an editable install of the working tree in .venv
    # supplies modules a --before tree lacks, and would measure the new writer as the old one.
    here = Path(nodeguard.__file__).parent
    om = PROMETHEUS_HEADERS["Accept"]

    def fresh() -> None:
        churn.step()
        sampler.sample_once()

    out: dict[str, Any] = {}
    if (here / "collectors").is_dir():
        from prometheus_client.exposition import choose_encoder

        from nodeguard.exposition.exporter import snapshot_families
        from nodeguard.exposition.handler import Exposition, plain_body

        ex = Exposition(latest=lambda: sampler.latest, families=snapshot_families)
        cases: dict[str, Callable[[], bytes]] = {
            "om": lambda: ex.render(accept=om, names=(), own=())[0],
            "om_gzip": lambda: ex.render(accept=om, names=(), own=(), accept_encoding="gzip")[0],
            "text": lambda: ex.render(accept="", names=(), own=())[0],
            "plain_om": lambda: plain_body(
                families=snapshot_families(sampler.latest), own=(), encoder=choose_encoder(om)[0]
            ),
        }
        out["writer"] = "nodeguard.render"
    else:
        # Names only a --before tree has: looked up by name, as this tree has neither.
        collector_class: Any = importlib.import_module("nodeguard.exporter").SnapshotCollector
        render: Any = importlib.import_module("nodeguard.exposition").render
        collector = collector_class(latest=lambda: sampler.latest)
        cases = {
            "om": lambda: render(accept=om, names=(), parts=(collector,))[0],
            "om_gzip": lambda: render(
                accept=om, names=(), parts=(collector,), accept_encoding="gzip"
            )[0],
            "text": lambda: render(accept="", names=(), parts=(collector,))[0],
        }
        out["writer"] = "prometheus_client"
    for label, fn in cases.items():
        fn()
        gc.collect()
        _, cpus, body = _timed(fn, repeats, before=fresh)
        out[f"render_{label}_cpu_ms"] = [median(cpus) * 1e3, p90(cpus) * 1e3]
        out[f"body_{label}_bytes"] = len(body)
        if label == "text":
            out["series"] = sum(1 for ln in body.splitlines() if ln and not ln.startswith(b"#"))
    if "plain_om" in cases:
        # The same snapshot again (an HA pair's second scrape), and the oracle: the bytes the
        # fast writer wrote are prometheus_client's, in both formats.
        _, cpus, _ = _timed(cases["om_gzip"], repeats)
        out["render_again_cpu_ms"] = [median(cpus) * 1e3, p90(cpus) * 1e3]
        families = snapshot_families(sampler.latest)
        out["identical"] = all(
            ex.render(accept=accept, names=(), own=())[0]
            == plain_body(families=families, own=(), encoder=choose_encoder(accept)[0])
            for accept in (om, "")
        )
    return out


def measure_kernel(containers: int, *, repeats: int) -> dict[str, Any]:
    """Snapshots of ``containers`` real (empty) cgroups on this machine's cgroupfs
    (``benchmarks.hosts.kernel_host``), with the real ``/proc`` and ``/dev/kmsg``: the agent's
    way (cgroup files held open, re-read with pread) and with every file opened, read and
    closed, alternating in this one process; then the agent's way again with memory moving in
    every cgroup between two samples (``benchmarks.kernel_churn``, a round every 0.2 s, a
    sample every 0.25 s); CPU of the thread, median and p90."""
    from benchmarks.hosts import kernel_host
    from benchmarks.kernel_churn import containers_under, kernel_churn
    from nodeguard.paths import HostPaths
    from nodeguard.sampling.sampler import COLLECTOR_NAMES, Sampler, SamplerConfig
    from nodeguard.sources.open_files import descriptor_budget

    paths = HostPaths(procfs=Path("/proc"), sysfs=Path("/sys"), kmsg=Path("/dev/kmsg"))
    budget = descriptor_budget(raise_limit=True)
    with kernel_host(containers=containers) as root:
        samplers = {
            name: Sampler(
                config=SamplerConfig(
                    paths=paths,
                    node_name="bench",
                    collectors=frozenset(COLLECTOR_NAMES) - {"gpu"},
                    max_open_files=n,
                )
            )
            for name, n in (("held", budget), ("plain", 0))
        }
        found = {}
        for name, sampler in samplers.items():
            snap = sampler.sample_once()
            found[name] = sum(len(p.containers) for p in snap.pods)
        gc.collect()
        cpus: dict[str, list[float]] = {"held": [], "plain": []}
        cgroups: dict[str, list[float]] = {"held": [], "plain": []}
        for _ in range(repeats):
            for name, sampler in samplers.items():
                c0 = time.thread_time()
                snap = sampler.sample_once()
                cpus[name].append(time.thread_time() - c0)
                st = snap.collector("cgroups")
                cgroups[name].append(st.duration_seconds if st else 0.0)
        held = samplers["held"]
        held_open = getattr(held.latest, "cgroup_files_open", None) or getattr(
            held, "open_cgroup_files", 0
        )
        moving: list[float] = []
        with kernel_churn(root, cgroups=containers_under(root), period=0.2):
            for _ in range(repeats):
                time.sleep(0.25)  # a round of the churn in between
                c0 = time.thread_time()
                held.sample_once()
                moving.append(time.thread_time() - c0)
        cpus["held_moving"] = moving
        for sampler in samplers.values():
            sampler.close()
    return {
        "root": str(root),
        "containers": found,
        "open_files": held_open,
        **{f"{k}_cpu_ms": [median(v) * 1e3, p90(v) * 1e3] for k, v in cpus.items()},
        **{f"{k}_cgroups_ms": median(v) * 1e3 for k, v in cgroups.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("tree", type=Path, nargs="?")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument(
        "--kernel", type=int, metavar="N", help="N real cgroups on this machine instead of a tree"
    )
    args = parser.parse_args()
    if args.kernel:
        result = measure_kernel(args.kernel, repeats=args.repeats)
    else:
        result = measure(args.tree, repeats=args.repeats)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
