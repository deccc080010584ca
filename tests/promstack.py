"""Debian's Prometheus and Alertmanager, started on loopback for end-to-end tests."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.agent import free_port, get, wait_ready
from tests.controlplane.cluster import terminate

PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


@contextlib.contextmanager
def _process(cmd: list[str], *, log: Path, ready: str) -> Iterator[None]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_ready(
                ready, proc=proc, log_path=log, what=Path(cmd[0]).name, timeout=30, interval=0.1
            )
            yield
        finally:
            terminate(proc, timeout=10)


@contextlib.contextmanager
def alertmanager(*, workdir: Path, webhook_url: str, token: str) -> Iterator[str]:
    """An Alertmanager that sends every alert to ``webhook_url`` at once (group_wait and
    group_interval 1 s), with ``send_resolved`` and a bearer token; yields its base URL."""
    if ALERTMANAGER is None:
        raise RuntimeError(
            "prometheus-alertmanager not found: install Debian's "
            "prometheus-alertmanager package (.ci/run does)"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "token").write_text(token)
    config = {
        "route": {
            "receiver": "nodeguard",
            "group_by": ["alertname", "node"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [
            {
                "name": "nodeguard",
                "webhook_configs": [
                    {
                        "url": webhook_url,
                        "send_resolved": True,
                        "http_config": {
                            "authorization": {
                                "type": "Bearer",
                                "credentials_file": str(workdir / "token"),
                            }
                        },
                    }
                ],
            }
        ],
    }
    (workdir / "alertmanager.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    cmd = [
        ALERTMANAGER,
        f"--config.file={workdir / 'alertmanager.yml'}",
        f"--storage.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]
    base = f"http://127.0.0.1:{port}"
    with _process(cmd, log=workdir / "alertmanager.log", ready=f"{base}/-/ready"):
        yield base


@contextlib.contextmanager
def prometheus(
    *, workdir: Path, target: str, rule_files: list[Path], alertmanager_url: str
) -> Iterator[str]:
    """A Prometheus scraping ``target`` every second with ``honor_labels``, evaluating the
    rule files every second, sending alerts to Alertmanager; yields its base URL."""
    if PROMETHEUS is None:
        raise RuntimeError("prometheus not found: install Debian's prometheus package")
    workdir.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "nodeguard",
                "honor_labels": True,
                "static_configs": [{"targets": [target]}],
            }
        ],
        "rule_files": [str(p) for p in rule_files],
        "alerting": {
            "alertmanagers": [
                {"static_configs": [{"targets": [alertmanager_url.removeprefix("http://")]}]}
            ]
        },
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    cmd = [
        PROMETHEUS,
        f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    base = f"http://127.0.0.1:{port}"
    with _process(cmd, log=workdir / "prometheus.log", ready=f"{base}/-/ready"):
        yield base


def query(base: str, expr: str) -> list[dict[str, Any]]:
    """An instant query's result vector (raises on a query error)."""
    status, body = get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    data = json.loads(body)
    if status != 200 or data.get("status") != "success":
        raise AssertionError(f"query failed ({status}): {expr}\n{body}")
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


def promtool_check(body: str) -> None:
    """``promtool check metrics`` on an exposition body; fails the test with its output."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: install Debian's prometheus package (.ci/run does)")
    lint = subprocess.run(
        [promtool, "check", "metrics"], input=body, text=True, capture_output=True, check=False
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
