"""Pytest fixtures for the real-Kubernetes test control plane.

Import into a ``conftest.py`` (or a test module) to use::

    from tests.support.controlplane.fixtures import control_plane  # noqa: F401
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.controlplane.cluster import GoNotFoundError, TestCluster

REQUIRED_ENV = "NODEGUARD_CONTROLPLANE_REQUIRED"


@pytest.fixture(scope="session")
def control_plane() -> Iterator[TestCluster]:
    """One etcd + kube-apiserver for the whole session (built on first use).

    Skips the requesting tests when the binaries are not cached and Go is missing,
    unless ``$NODEGUARD_CONTROLPLANE_REQUIRED`` is set to ``1`` (then it fails).
    """
    cluster = TestCluster()
    try:
        cluster.start()
    except GoNotFoundError as error:
        if os.environ.get(REQUIRED_ENV) == "1":
            raise
        pytest.skip(str(error))
    try:
        yield cluster
    finally:
        cluster.stop()
