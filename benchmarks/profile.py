"""A loop to profile: snapshots (or renders) of one host tree for a while, under py-spy, as the
agent takes them (cgroup files held open; memory moving between samples unless ``--static``;
the render in OpenMetrics through ``nodeguard.exposition.handler``).

    .venv/bin/python benchmarks/hosts.py /tmp/host330 330
    .venv/bin/py-spy record -r 500 -o /tmp/snapshot.svg -- \\
        .venv/bin/python benchmarks/profile.py /tmp/host330 --seconds 15
    .venv/bin/py-spy record -r 500 -o /tmp/render.svg -- \\
        .venv/bin/python benchmarks/profile.py /tmp/host330 --seconds 15 --render

(py-spy and pyinstrument are not dependencies: ``.venv/bin/pip install py-spy``.)
"""

from __future__ import annotations

import argparse
import random
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
    parser.add_argument(
        "--static", action="store_true", help="files unchanged between samples (no churn)"
    )
    args = parser.parse_args()

    from benchmarks.common import PROMETHEUS_HEADERS
    from benchmarks.hosts import Churn
    from nodeguard.exposition.exporter import snapshot_families
    from nodeguard.exposition.handler import Exposition
    from nodeguard.paths import HostPaths
    from nodeguard.sampling.sampler import COLLECTOR_NAMES, Sampler, SamplerConfig
    from nodeguard.sources.open_files import descriptor_budget

    tree = args.tree
    paths = HostPaths(procfs=tree / "proc", sysfs=tree / "sys", kmsg=tree / "kmsg")
    sampler = Sampler(  # as `nodeguard run` samples: cgroup files held open
        config=SamplerConfig(
            paths=paths,
            node_name="profile",
            collectors=frozenset(COLLECTOR_NAMES) - {"gpu"},
            max_open_files=descriptor_budget(raise_limit=True),
        )
    )
    sampler.sample_once()
    exposition = Exposition(latest=lambda: sampler.latest, families=snapshot_families)
    churn = None if args.static else Churn(tree, rng=random.Random(8))
    n, cpu = 0, 0.0
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        if churn is not None:
            churn.step()  # memory moves between samples (in the profile too: filter it out)
        if args.render:  # what Prometheus gets: OpenMetrics and gzip, of a new snapshot
            sampler.sample_once()
        c0 = time.thread_time()
        if args.render:
            exposition.render(
                accept=PROMETHEUS_HEADERS["Accept"], names=(), own=(), accept_encoding="gzip"
            )
        else:
            sampler.sample_once()
        cpu += time.thread_time() - c0
        n += 1
    sampler.close()
    per = cpu / n * 1e3
    print(f"{n} {'renders' if args.render else 'snapshots'}, {per:.1f} ms of CPU each ({SRC})")


if __name__ == "__main__":
    main()
