"""The committed fixture host trees (tests/fixtures/hosts, made by tests/fixtures/make_hosts.py) as
nodeguard reads them: their ``HostPaths`` and ``--path.*`` flags, one snapshot of each, its
``/metrics`` text; and a cgroup built by hand for snapshots made in a test."""

from __future__ import annotations

from pathlib import Path

from nodeguard.paths import HostPaths
from nodeguard.snapshot import CgroupMemory, NodeSnapshot

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"


def host_paths(name: str, *, state: Path | None = None) -> HostPaths:
    """HostPaths of a committed fixture host tree."""
    root = HOSTS / name
    return HostPaths(procfs=root / "proc", sysfs=root / "sys", kmsg=root / "kmsg", state=state)


def fixture_snapshot(name: str) -> NodeSnapshot:
    """One snapshot of a committed fixture host tree, every collector but gpu."""
    from nodeguard.sampling.sampler import COLLECTOR_NAMES, Sampler, SamplerConfig

    sampler = Sampler(
        config=SamplerConfig(
            paths=host_paths(name), node_name="n", collectors=frozenset(COLLECTOR_NAMES) - {"gpu"}
        )
    )
    try:
        return sampler.sample_once()
    finally:
        sampler.close()


def host_flags(name: str) -> list[str]:
    """The ``--path.*`` flags pointing ``nodeguard`` at a fixture host tree."""
    root = HOSTS / name
    return [
        f"--path.procfs={root / 'proc'}",
        f"--path.sysfs={root / 'sys'}",
        f"--path.kmsg={root / 'kmsg'}",
    ]


def cgroup_memory(path: str, *, used: int) -> CgroupMemory:
    """A v2 cgroup of ``used`` bytes, all anonymous, no limit, nothing counted: for snapshots
    built by hand."""
    return CgroupMemory(
        path=path,
        cgroup_version=2,
        usage_bytes=used,
        working_set_bytes=used,
        anon_bytes=used,
        file_bytes=0,
        inactive_file_bytes=0,
        limit_bytes=None,
        effective_limit_bytes=None,
        oom_kills=0,
        limit_hits=0,
        high_events=0,
        pressure=None,
    )


def exposition(snap: NodeSnapshot) -> str:
    """``/metrics`` of a snapshot, in the text format, as prometheus_client writes the
    exporter's families (the plain path, which the fast writer equals)."""
    from prometheus_client import generate_latest

    from nodeguard.exposition.exporter import snapshot_families
    from nodeguard.exposition.handler import plain_body

    body = plain_body(families=snapshot_families(snap), own=(), encoder=generate_latest)
    return body.decode()
