"""The fixtures every tier shares (the test control plane, Katib, the manifests, the NVML stub,
the fault-injecting proxy), the tier markers from each test's folder, and the check that a CI
run skipped nothing. What tests share besides fixtures is in tests/support/."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeguard.kube.client import KubeClient
from nodeguard.paths import HostPaths
from tests.support.controlplane.cluster import TestCluster
from tests.support.controlplane.fixtures import control_plane  # noqa: F401  (a session fixture)
from tests.support.deploy.fixtures import applier, kustomize_bin, manifests  # noqa: F401  (fixtures)
from tests.support.gpu.fixtures import make_stub, stub_libs  # noqa: F401  (fixtures)
from tests.support.hosts import host_paths
from tests.support.katib import Katib, running_katib
from tests.support.kube_helpers import Cluster


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
    (tests/support/katib.py), its log in a temporary directory."""
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
    from tests.support.gpu.stub import fixture_host_env

    return fixture_host_env(tmp_path_factory.mktemp("nvml"))


@pytest.fixture
def proxied(control_plane: TestCluster, tmp_path: Path) -> Iterator[Any]:  # noqa: F811
    """The test control plane behind the fault-injecting proxy (tests/support/apiproxy.py)."""
    from tests.support.apiproxy import api_proxy

    with api_proxy(control_plane=control_plane, workdir=tmp_path) as proxy:
        yield proxy


#: The tier of a test is its folder under tests/ (CONTRIBUTING.md, "Test tiers"): what it needs.
TIERS = ("unit", "agent", "kernel", "cluster", "image")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its folder's tier (``-m unit``, ``-m "not cluster"``); a module of
    another tier that also needs the kernel keeps its own ``pytest.mark.kernel``."""
    tests = Path(__file__).parent
    for item in items:
        parts = item.path.relative_to(tests).parts if item.path.is_relative_to(tests) else ()
        if parts and parts[0] in TIERS:
            item.add_marker(getattr(pytest.mark, parts[0]))
