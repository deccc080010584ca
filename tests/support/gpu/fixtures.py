"""Fixtures for the GPU tests (imported by tests/conftest.py): the stub NVML builds, and a
factory of stub environments per scenario."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.gpu.stub import Scenario, StubEnv, build

StubFactory = Callable[..., StubEnv]


@pytest.fixture(scope="session")
def stub_libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The stub NVML builds (tests/support/gpu/stub.py ``VARIANTS``) and a directory whose
    libnvidia-ml.so.1 does not load."""
    try:
        return build(tmp_path_factory.mktemp("nvml-stub"))
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"building the stub NVML failed:\n{exc.stderr}")
    except RuntimeError as exc:
        pytest.fail(str(exc))


@pytest.fixture
def make_stub(stub_libs: dict[str, Path], tmp_path: Path) -> StubFactory:
    """``make(scenario, variant="full", name="stub")``: a :class:`StubEnv` for one scenario."""

    def make(scenario: Scenario, variant: str = "full", name: str = "stub") -> StubEnv:
        return StubEnv(
            library_dir=stub_libs[variant],
            scenario=scenario.write(tmp_path / f"{name}.scenario"),
            log=tmp_path / f"{name}.calls",
        )

    return make
