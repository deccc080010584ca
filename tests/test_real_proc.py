"""This machine's real /proc: ``/metrics`` agrees with /proc/meminfo read at the same moment."""

from __future__ import annotations

import re
from pathlib import Path

from nodeguard.sources.meminfo import parse_meminfo
from tests.agent import get, running_agent

MiB = 1 << 20
NODE = 'container="",namespace="",pod=""'  # a node series names no workload


def _metric(body: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", body, re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


def test_metrics_agree_with_proc_meminfo(tmp_path: Path) -> None:
    args = ["--interval=100ms", "--no-collector.kmsg", f"--path.state={tmp_path}"]
    with running_agent(args=args, log_path=tmp_path / "agent.log") as base:
        body = get(f"{base}/metrics")[1]
        fields, _ = parse_meminfo(Path("/proc/meminfo").read_text())
    assert _metric(body, f"nodeguard_node_memory_total_bytes{{{NODE}}}") == fields["MemTotal"]
    meminfo_total = (
        'nodeguard_node_meminfo_bytes{container="",field="MemTotal",namespace="",pod=""}'
    )
    assert _metric(body, meminfo_total) == fields["MemTotal"]
    # Sampled at most 100 ms apart on a machine running other things: within 2 % of total.
    tolerance = max(64 * MiB, 0.02 * fields["MemTotal"])
    for metric, field in (
        ("available_bytes", "MemAvailable"),
        ("free_bytes", "MemFree"),
        ("slab_unreclaimable_bytes", "SUnreclaim"),
    ):
        got = _metric(body, f"nodeguard_node_memory_{metric}{{{NODE}}}")
        assert abs(got - fields[field]) <= tolerance, (metric, got, fields[field])
    used = _metric(body, f"nodeguard_node_memory_used_bytes{{{NODE}}}")
    assert abs(used - (fields["MemTotal"] - fields["MemAvailable"])) <= tolerance
    assert _metric(body, 'nodeguard_collector_success{collector="meminfo"}') == 1.0
