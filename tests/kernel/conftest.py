"""Fixtures of the real-kernel tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.kernel_cgroup import (
    PrivateKubepods,
    private_kubepods,
    writable_memory_controller,
)


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[PrivateKubepods]:
    """A kubepods of this test's own: the code under test reads these cgroups alone."""
    if writable_memory_controller() is None:
        pytest.skip("needs root and a writable cgroup memory controller (CI has both)")
    with private_kubepods(tmp_path) as made:
        yield made
