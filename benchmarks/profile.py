"""A loop to profile: snapshots (or renders) of one host tree for a while, under py-spy.

    .venv/bin/python benchmarks/hosts.py /tmp/host330 330
    .venv/bin/py-spy record -r 500 -o /tmp/snapshot.svg -- \\
        .venv/bin/python benchmarks/profile.py /tmp/host330 --seconds 15
    .venv/bin/py-spy record -r 500 -o /tmp/render.svg -- \\
        .venv/bin/python benchmarks/profile.py /tmp/host330 --seconds 15 --render

(py-spy and pyinstrument are not dependencies: ``.venv/bin/pip install py-spy``.)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SRC  # puts the tree under test on sys.path first


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("tree", type=Path)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--render", action="store_true", help="the OpenMetrics render instead")
    args = parser.parse_args()

    from prometheus_client import CollectorRegistry, generate_latest

    from nodeguard.exporter import SnapshotCollector
    from nodeguard.paths import HostPaths
    from nodeguard.sampler import COLLECTORS, Sampler, SamplerConfig

    tree = args.tree
    paths = HostPaths(procfs=tree / "proc", sysfs=tree / "sys", kmsg=tree / "kmsg")
    sampler = Sampler(
        config=SamplerConfig(
            paths=paths, node_name="profile", collectors=frozenset(COLLECTORS) - {"gpu"}
        )
    )
    sampler.sample_once()
    collector = SnapshotCollector(latest=lambda: sampler.latest)
    end, n, cpu = time.monotonic() + args.seconds, 0, time.process_time()
    while time.monotonic() < end:
        if args.render:
            registry = CollectorRegistry()
            registry.register(collector)
            generate_latest(registry)
        else:
            sampler.sample_once()
        n += 1
    per = (time.process_time() - cpu) / n * 1e3
    print(f"{n} {'renders' if args.render else 'snapshots'}, {per:.1f} ms of CPU each ({SRC})")


if __name__ == "__main__":
    main()
