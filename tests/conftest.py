"""Shared test helpers: the committed fixture host trees and a running agent."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeguard.paths import HostPaths

HOSTS = Path(__file__).parent / "fixtures" / "hosts"


def host_paths(name: str, *, state: Path | None = None) -> HostPaths:
    """HostPaths of a committed fixture host tree."""
    root = HOSTS / name
    return HostPaths(procfs=root / "proc", sysfs=root / "sys", kmsg=root / "kmsg", state=state)


def host_flags(name: str) -> list[str]:
    """The ``--path.*`` flags pointing ``nodeguard`` at a fixture host tree."""
    root = HOSTS / name
    return [
        f"--path.procfs={root / 'proc'}",
        f"--path.sysfs={root / 'sys'}",
        f"--path.kmsg={root / 'kmsg'}",
    ]


@pytest.fixture
def v2_host() -> HostPaths:
    return host_paths("v2-systemd-containerd")


@pytest.fixture
def v1_host() -> HostPaths:
    return host_paths("v1-cgroupfs-docker")


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
