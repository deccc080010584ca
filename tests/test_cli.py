"""The ``nodeguard`` command: flags, the snapshot report, JSON output."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from nodeguard.cli import build_parser, parse_duration
from nodeguard.report import format_bytes
from tests.conftest import host_flags
from tests.fixtures.make_hosts import CID, UID_B


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5s", 5.0), ("500ms", 0.5), ("1m", 60.0), ("2", 2.0), ("1.5s", 1.5), ("1h", 3600.0)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "-1s", "0s", "s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


def test_run_defaults_follow_node_exporter() -> None:
    args = build_parser().parse_args(["run"])
    assert args.dry_run is True
    assert args.interval == 5.0
    assert args.listen_address == (None, 9847)  # every address, IPv4 and IPv6
    assert str(args.procfs) == "/proc" and str(args.sysfs) == "/sys"
    args = build_parser().parse_args(
        ["run", "--no-dry-run", "--no-collector.kmsg", "--listen-address=127.0.0.1:1234"]
    )
    assert args.dry_run is False
    assert args.collector_kmsg is False
    assert args.listen_address == ("127.0.0.1", 1234)


@pytest.mark.parametrize(
    "argv",
    [
        ["--interval=0.0001ms"],
        ["--interval=10ms"],
        ["--listen-address=:99999"],
        ["--listen-address=nonsense"],
        ["--top-processes=-5"],
    ],
)
def test_run_rejects_bad_flags(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["run", *argv])
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_port_in_use_is_a_clear_error(tmp_path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "nodeguard",
                "run",
                f"--listen-address=127.0.0.1:{port}",
                *host_flags("v2-systemd-containerd"),
                f"--path.state={tmp_path}",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert out.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr


def test_format_bytes() -> None:
    assert format_bytes(None) == "-"
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536 * 1024 * 1024) == "1.5 GiB"


def _snapshot(*extra: str) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "nodeguard",
            "snapshot",
            *host_flags("v2-systemd-containerd"),
            *extra,
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "160", "PATH": ""},
    )
    return out.stdout


def test_snapshot_json_in_bytes() -> None:
    data = json.loads(_snapshot("--json"))
    assert data["meminfo"]["available_bytes"] == 6 << 30
    assert data["meminfo"]["slab_unreclaimable_bytes"] == 10 << 30
    assert data["cgroup_version"] == 2
    pod = next(p for p in data["pods"] if p["uid"] == UID_B)
    c = next(c for c in pod["containers"] if c["container_id"] == CID[3])
    assert c["memory"]["working_set_bytes"] == 10 * (1 << 30) - 256 * (1 << 20)
    assert data["oom"]["total"] == 2


def test_snapshot_report_reads_at_a_glance() -> None:
    text = _snapshot()
    assert "Node memory" in text
    assert "slab unreclaimable" in text and "10.0 GiB" in text and "31.2%" in text
    assert "available" in text and "6.0 GiB" in text
    assert "Memory pressure" in text and "12.5%" in text
    assert "Top containers against their limits (of 6)" in text
    # The nearest to its limit comes first: the guaranteed container at 3.4 of 4 GiB (85.1%).
    rows = [ln for ln in text.splitlines() if "GiB" in ln and "guaranteed" in ln]
    assert rows and "85.1%" in rows[0]
    assert "OOM kills this boot (kernel log): 2" in text
    assert "python3" in text and "9.0 GiB" in text
