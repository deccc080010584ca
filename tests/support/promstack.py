"""Debian's Prometheus and Alertmanager, started on loopback for end-to-end tests."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.agent import free_port, get, wait_ready
from tests.support.controlplane.cluster import terminate

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
    *,
    workdir: Path,
    target: str | None = None,
    rule_files: list[Path] | None = None,
    alertmanager_url: str | None = None,
    scrape_configs: list[dict[str, Any]] | None = None,
) -> Iterator[str]:
    """A Prometheus scraping every second, ``target`` with ``honor_labels`` (or the given
    ``scrape_configs``), evaluating the rule files every second, sending alerts to Alertmanager
    where one is given; yields its base URL."""
    if PROMETHEUS is None:
        raise RuntimeError("prometheus not found: install Debian's prometheus package")
    workdir.mkdir(parents=True, exist_ok=True)
    jobs = scrape_configs or [
        {"job_name": "nodeguard", "honor_labels": True, "static_configs": [{"targets": [target]}]}
    ]
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": jobs,
        "rule_files": [str(p) for p in rule_files or []],
    }
    if alertmanager_url is not None:
        config["alerting"] = {
            "alertmanagers": [
                {"static_configs": [{"targets": [alertmanager_url.removeprefix("http://")]}]}
            ]
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


# -- scrape configs as Kubernetes would give them ----------------------------------------------
# Debian's Prometheus is built without Kubernetes service discovery. A file_sd target carrying
# the __meta_kubernetes_* labels that discovery would give the agent's pod stands in for it; the
# relabelling, honor_labels and everything after discovery are Prometheus's own.


def kubernetes_meta(
    *, address: str, service: dict[str, Any], daemonset: dict[str, Any], pod: str
) -> dict[str, str]:
    """The ``__meta_kubernetes_*`` labels of the agent's metrics endpoint as Kubernetes service
    discovery (roles ``endpoints`` and ``pod``, Prometheus discovery/kubernetes) gives them, for
    the rendered Service and DaemonSet: the Service's name, namespace and labels, the pod's
    name, labels, phase, container and port name."""
    template = daemonset["spec"]["template"]
    ctr = template["spec"]["containers"][0]
    port = next(p for p in ctr["ports"] if p.get("name") == "metrics")
    meta = {
        "__address__": address,
        "__meta_kubernetes_namespace": service["metadata"]["namespace"],
        "__meta_kubernetes_service_name": service["metadata"]["name"],
        "__meta_kubernetes_endpoint_port_name": service["spec"]["ports"][0]["name"],
        "__meta_kubernetes_endpoint_address_target_kind": "Pod",
        "__meta_kubernetes_endpoint_address_target_name": pod,
        "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_container_name": ctr["name"],
        "__meta_kubernetes_pod_container_port_name": port["name"],
        "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
    }
    for kind, labels in (
        ("service", service["metadata"].get("labels") or {}),
        ("pod", template["metadata"].get("labels") or {}),
    ):
        for key, value in labels.items():
            name = re.sub(r"[^a-zA-Z0-9_]", "_", key)
            meta[f"__meta_kubernetes_{kind}_label_{name}"] = value
            meta[f"__meta_kubernetes_{kind}_labelpresent_{name}"] = "true"
    return meta


def servicemonitor_job(monitor: dict[str, Any], *, sd_file: Path) -> dict[str, Any]:
    """The scrape job the Prometheus Operator generates for a ServiceMonitor's first endpoint
    (prometheus-operator pkg/prometheus/promcfg.go ``generateServiceMonitorConfig``, as in its
    testdata ``*ServiceMonitor*.golden``): keep the selected Service and port, then the target
    labels node/pod (from the endpoint's target), namespace, service, pod, container, job (the
    Service's name) and endpoint (the port's name); discovery from ``sd_file``, every second."""
    spec = monitor["spec"]
    ep = spec["endpoints"][0]
    relabel: list[dict[str, Any]] = []
    for key, value in sorted(spec["selector"].get("matchLabels", {}).items()):
        name = re.sub(r"[^a-zA-Z0-9_]", "_", key)
        relabel.append(
            {
                "action": "keep",
                "source_labels": [
                    f"__meta_kubernetes_service_label_{name}",
                    f"__meta_kubernetes_service_labelpresent_{name}",
                ],
                "regex": f"({value});true",
            }
        )
    target = [
        "__meta_kubernetes_endpoint_address_target_kind",
        "__meta_kubernetes_endpoint_address_target_name",
    ]
    relabel += [
        {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"],
         "regex": ep["port"]},
        {"source_labels": target, "separator": ";", "regex": "Node;(.*)",
         "replacement": "${1}", "target_label": "node"},
        {"source_labels": target, "separator": ";", "regex": "Pod;(.*)",
         "replacement": "${1}", "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
         "regex": "(Failed|Succeeded)"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job",
         "replacement": "${1}"},
        {"target_label": "endpoint", "replacement": ep["port"]},
    ]  # fmt: skip
    meta = monitor["metadata"]
    return {
        "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/0",
        "honor_labels": bool(ep.get("honorLabels", False)),
        "metrics_path": ep.get("path", "/metrics"),
        "scrape_interval": "1s",
        "file_sd_configs": [{"files": [str(sd_file)]}],
        "relabel_configs": relabel,
    }


def with_file_sd(job: dict[str, Any], *, sd_file: Path) -> dict[str, Any]:
    """A scrape job as written (relabelling, honor_labels), its Kubernetes discovery replaced by
    ``sd_file``, every second."""
    out = {k: v for k, v in job.items() if k != "kubernetes_sd_configs"}
    return {**out, "scrape_interval": "1s", "file_sd_configs": [{"files": [str(sd_file)]}]}
