"""PSI parsing, and PSI off in the kernel (absent, EOPNOTSUPP) as no data, reported once."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest

from nodeguard.collectors.base import Parts, run
from nodeguard.collectors.pressure import PressureCollector
from nodeguard.paths import HostPaths
from nodeguard.sampling.sampler import SamplerConfig
from nodeguard.sources import NoDataError, files
from nodeguard.sources.pressure import parse_pressure, read_node_pressure
from tests.support.hosts import host_paths


def test_parse_some_and_full() -> None:
    p = parse_pressure(
        "some avg10=12.50 avg60=8.00 avg300=2.25 total=123456789\n"
        "full avg10=4.00 avg60=1.50 avg300=0.50 total=23456789\n"
    )
    assert p is not None and p.some is not None and p.full is not None
    assert p.some.avg10 == pytest.approx(0.125)
    assert p.some.avg300 == pytest.approx(0.0225)
    assert p.some.total_seconds == pytest.approx(123.456789)
    assert p.full.avg60 == pytest.approx(0.015)
    assert p.full.total_seconds == pytest.approx(23.456789)


def test_some_only_kernel() -> None:
    p = parse_pressure("some avg10=1.00 avg60=0.00 avg300=0.00 total=10\n")
    assert p is not None and p.full is None
    assert p.some is not None and p.some.total_seconds == pytest.approx(1e-5)


def test_garbage_is_none() -> None:
    assert parse_pressure("") is None
    assert parse_pressure("nonsense\n") is None


def test_absent_file_is_no_data() -> None:
    with pytest.raises(NoDataError):
        read_node_pressure(paths=host_paths("v1-cgroupfs-docker"))


def test_eopnotsupp_is_no_data_and_logged_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    # The kernel answers EOPNOTSUPP on read when booted with psi=0; this machine has PSI on, so
    # the read itself is the one thing stood in for.
    psi = tmp_path / "pressure" / "memory"
    psi.parent.mkdir()
    psi.write_text("")
    real_read_file = files.read_file

    def read_file(path: str | Path) -> str:
        if Path(path) == psi:
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        return real_read_file(path)

    monkeypatch.setattr(files, "read_file", read_file)
    paths = HostPaths(procfs=tmp_path)
    caplog.set_level(logging.INFO, logger="nodeguard")

    class Eop(PressureCollector):
        name = "pressure-eop"  # its own name: "logged once" counts from a clean slate

    collector = Eop(settings=SamplerConfig(paths=paths, node_name="n"))
    parts = [Parts() for _ in range(3)]
    results = [run(collector, p) for p in parts]
    assert all(r.success and not r.available for r in results)
    assert all(p.pressure is None for p in parts)
    assert "not supported" in (results[0].error or "")
    no_data_logs = [r for r in caplog.records if "pressure-eop has no data" in r.getMessage()]
    assert len(no_data_logs) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
