"""Shared test helpers: the committed fixture host trees and a running agent."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeguard.kube.client import KubeClient
from nodeguard.kube.watch import PodWatcher
from nodeguard.paths import HostPaths
from nodeguard.snapshot import CgroupMemory, NodeSnapshot
from nodeguard.statefile import StateFile
from tests.controlplane.cluster import TestCluster
from tests.controlplane.fixtures import control_plane  # noqa: F401  (a session fixture)
from tests.deploy.fixtures import applier, kustomize_bin, manifests  # noqa: F401  (fixtures)
from tests.gpu.fixtures import make_stub, stub_libs  # noqa: F401  (fixtures)
from tests.katib import Katib, running_katib
from tests.kube_helpers import Cluster

HOSTS = Path(__file__).parent / "fixtures" / "hosts"


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


@pytest.fixture(scope="session")
def cluster(control_plane: TestCluster) -> Iterator[Cluster]:  # noqa: F811
    """The test control plane with nodeguard's test PriorityClasses and Katib's CRDs."""
    c = Cluster(control_plane.kubeconfig_path)
    c.priority_class("nodeguard-test-low", 100)
    c.priority_class("nodeguard-test-mid", 1000)
    c.priority_class("nodeguard-test-high", 100000)
    c.install_katib_crds()
    yield c
    c.close()


@pytest.fixture
async def kube(control_plane: TestCluster) -> AsyncIterator[KubeClient]:  # noqa: F811
    """nodeguard's client of the test control plane, closed after the test."""
    k = KubeClient.load(kubeconfig=control_plane.kubeconfig_path)
    yield k
    k.close()


@pytest.fixture(scope="module")
def katib(
    cluster: Cluster,
    control_plane: TestCluster,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Katib]:
    """Katib's real Experiment controller on the test control plane, one a test module
    (tests/katib.py), its log in a temporary directory."""
    log = tmp_path_factory.mktemp("katib") / "katib-experiment-controller.log"
    with running_katib(control_plane=control_plane, cluster=cluster, log_path=log) as k:
        yield k


@pytest.fixture
def v2_host() -> HostPaths:
    return host_paths("v2-systemd-containerd")


# CI runs every test: a skip there (no root, no promtool, no control plane) is a failure, so a
# green run cannot hide a test that did not run. Set by scripts/test.
_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    import os

    if os.environ.get("NODEGUARD_FORBID_SKIPS") == "1" and _skipped and exitstatus == 0:
        print(f"\nNODEGUARD_FORBID_SKIPS=1 and {len(_skipped)} test(s) skipped: {_skipped}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def gpu_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment that gives a ``nodeguard`` process two stub GPUs (the NVML stub, loaded
    through the real nvidia-ml-py) whose processes are pods of the v2 fixture host."""
    from tests.gpu.stub import fixture_host_env

    return fixture_host_env(tmp_path_factory.mktemp("nvml"))


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


@contextlib.asynccontextmanager
async def synced_watcher(*, kubeconfig: Path, node: str) -> AsyncIterator[PodWatcher]:
    """A :class:`PodWatcher` of ``node`` running until the block ends, after its first list."""
    kube = KubeClient.load(kubeconfig=kubeconfig)
    watcher = PodWatcher(kube=kube, node_name=node)
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop=stop))
    try:
        await asyncio.wait_for(watcher.synced.wait(), 15)
        yield watcher
    finally:
        stop.set()
        await asyncio.wait_for(task, 40)
        kube.close()


_states: dict[Path, StateFile] = {}


def state_at(*, path: Path, **kw: Any) -> StateFile:
    """A StateFile at ``path`` as a new agent process would open it: the previous one opened
    here (the "process" before the restart) lets go of the directory first, as a dead process
    does."""
    old = _states.pop(path, None)
    if old is not None:
        old.release()
    state = StateFile(path=path, **kw)
    _states[path] = state
    return state


@pytest.fixture
def proxied(control_plane: TestCluster, tmp_path: Path) -> Iterator[Any]:  # noqa: F811
    """The test control plane behind the fault-injecting proxy (tests/apiproxy.py)."""
    from tests.apiproxy import api_proxy

    with api_proxy(control_plane=control_plane, workdir=tmp_path) as proxy:
        yield proxy
