"""The benchmark scripts start: every module they import resolves (they run only by hand, for
minutes, so an import broken by a change elsewhere would otherwise show only then)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "script", ["run.py", "inprocess.py", "profile.py", "kernel_churn.py", "doctor.py", "agents.py"]
)
def test_benchmark_script_starts(script: str) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--help"],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout


def test_benchmark_modules_import() -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
        "import benchmarks.common, benchmarks.hosts, benchmarks.kernel_files, "
        "benchmarks.reaction, benchmarks.scale, benchmarks.soak, benchmarks.agreement, "
        "benchmarks.cadvisor_peer, benchmarks.kernel_churn, benchmarks.peers, "
        "benchmarks.scrape_loop"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
