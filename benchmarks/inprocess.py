"""In-process cost of one snapshot and one render, over a host tree; run as a child process by
benchmarks/run.py so that nothing else in the runner shares its interpreter.

- snapshot: ``Sampler.sample_once()`` with every collector but gpu (this machine has none), after
  one warm-up sample (which also finds the kubepods roots); wall time (``perf_counter``) and CPU
  time of the thread (``thread_time``), each the median and p90 of ``--repeats`` samples; and the
  median duration of each collector as the snapshot records it.
- render: the snapshot's families through prometheus_client, in the format Prometheus asks for
  (OpenMetrics 1.0.0) and in the classic text format, CPU time of the thread; body sizes, series.

    python benchmarks/inprocess.py TREE [--repeats 30] -> one JSON object on stdout
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import median, p90


def _timed(fn: Callable[[], Any], repeats: int) -> tuple[list[float], list[float], Any]:
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.thread_time()
        result = fn()
        cpus.append(time.thread_time() - c0)
        walls.append(time.perf_counter() - w0)
    return walls, cpus, result


def measure(tree: Path, *, repeats: int) -> dict[str, Any]:
    import nodeguard
    from nodeguard.paths import HostPaths
    from nodeguard.sampler import COLLECTORS, Sampler, SamplerConfig

    paths = HostPaths(procfs=tree / "proc", sysfs=tree / "sys", kmsg=tree / "kmsg", state=None)
    sampler = Sampler(
        config=SamplerConfig(
            paths=paths, node_name="bench", collectors=frozenset(COLLECTORS) - {"gpu"}
        )
    )
    sampler.sample_once()
    gc.collect()
    walls, cpus, snap = _timed(sampler.sample_once, repeats)
    per: dict[str, list[float]] = {}
    for _ in range(3):  # collector durations of a few more samples
        for st in sampler.sample_once().collectors:
            per.setdefault(st.name, []).append(st.duration_seconds)
    render = _render(sampler, repeats)
    sampler.close()
    return {
        "nodeguard": f"{nodeguard.__version__} {Path(nodeguard.__file__).parent}",
        "pods": len(snap.pods),
        "containers": sum(len(p.containers) for p in snap.pods),
        "snapshot_wall_ms": [median(walls) * 1e3, p90(walls) * 1e3],
        "snapshot_cpu_ms": [median(cpus) * 1e3, p90(cpus) * 1e3],
        "collectors_ms": {k: median(v) * 1e3 for k, v in per.items()},
        **render,
    }


def _render(sampler: Any, repeats: int) -> dict[str, Any]:
    """The snapshot's part of ``/metrics`` as the agent writes it: nodeguard's own writer where
    the exporter has one (its per-snapshot cache emptied each time), else prometheus_client."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import choose_encoder

    from benchmarks.common import PROMETHEUS_HEADERS
    from nodeguard.exporter import SnapshotCollector

    collector = SnapshotCollector(latest=lambda: sampler.latest)
    registry = CollectorRegistry()
    registry.register(collector)
    own = hasattr(collector, "exposition")
    out: dict[str, Any] = {"writer": "nodeguard" if own else "prometheus_client"}
    for label, accept in (("om", PROMETHEUS_HEADERS["Accept"]), ("text", "")):
        encoder, _ = choose_encoder(accept)
        if own:

            def fn(om: bool = label == "om") -> bytes:
                collector._rendered.clear()
                body: bytes = collector.exposition(openmetrics=om)
                return body
        else:

            def fn(enc: Any = encoder) -> bytes:
                body: bytes = enc(registry)
                return body

        fn()
        gc.collect()
        _, cpus, body = _timed(fn, repeats)
        out[f"render_{label}_cpu_ms"] = [median(cpus) * 1e3, p90(cpus) * 1e3]
        out[f"body_{label}_bytes"] = len(body)
        if label == "text":
            out["series"] = sum(1 for ln in body.splitlines() if ln and not ln.startswith(b"#"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("tree", type=Path)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    json.dump(measure(args.tree, repeats=args.repeats), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
