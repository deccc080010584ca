"""End to end: the real ``nodeguard run`` on a fixture tree, ``/metrics`` diffed against a golden
file and linted by promtool. Rewrite the golden files with ``NODEGUARD_UPDATE_GOLDEN=1``."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.support.agent import get, running_agent
from tests.support.hosts import host_flags
from tests.support.promstack import promtool_check

GOLDEN = Path(__file__).parents[1] / "golden"
# Values that differ run to run: timings, the sample time, the connections open (the probes'
# just closed may not be gone yet), the samples taken (focused ones every 250 ms), the kernel
# notifications (set after the first sample, which may or may not be the one scraped), the
# memory history's size (its points are the samples taken), the Python version.
_VOLATILE = re.compile(
    r"^(nodeguard_collector_duration_seconds\{[^}]*\}|nodeguard_snapshot_timestamp_seconds"
    r"|nodeguard_http_connections|nodeguard_sampler_samples_total\{[^}]*\}"
    r"|nodeguard_notify_registered\{[^}]*\}|nodeguard_timeline_points|nodeguard_timeline_bytes"
    r"|nodeguard_collector_available\{collector=\"notify_[a-z]+\"\}) .*$"
    r"|python_version=\"[^\"]*\"",
    re.M,
)


def normalise(body: str) -> str:
    """The exposition with volatile values masked."""
    return _VOLATILE.sub(
        lambda m: m.group(1) + " <volatile>" if m.group(1) else 'python_version="<volatile>"', body
    )


@pytest.mark.parametrize("host", ["v2-systemd-containerd", "v1-cgroupfs-docker"])
def test_metrics_golden(host: str, tmp_path: Path) -> None:
    args = [*host_flags(host), "--interval=1s", f"--path.state={tmp_path / 'state'}"]
    with running_agent(args=args, log_path=tmp_path / "agent.log") as base:
        status, body = get(f"{base}/metrics")
        snap_status, snap_body = get(f"{base}/snapshot")
    assert status == 200
    assert snap_status == 200
    assert json.loads(snap_body)["meminfo"]["total_bytes"] == 32 << 30

    golden = GOLDEN / f"{host}.metrics"
    got = normalise(body)
    if os.environ.get("NODEGUARD_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(got)
    assert got == golden.read_text(), f"/metrics differs from {golden}; see the diff above"

    (tmp_path / "metrics.txt").write_text(body)
    promtool_check(body)
