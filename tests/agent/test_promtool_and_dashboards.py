"""Shipped Prometheus rules pass promtool (check and unit tests), the documented configs parse,
and the Grafana dashboards are well-formed with units Grafana understands."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROM_RULES = sorted((ROOT / "rules" / "prometheus").glob("*.yml"))
PROM_TESTS = sorted((ROOT / "rules" / "prometheus" / "tests").glob("*.yml"))
DASHBOARDS = sorted((ROOT / "grafana").glob("*.json"))
# Grafana's unit ids used here (grafana/packages/grafana-data/src/valueFormats/categories.ts).
UNITS = {"bytes", "binBps", "percentunit", "short", "s"}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} not found: install Debian's prometheus and prometheus-alertmanager "
            "packages (.ci/run does)"
        )
    return path


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)


def test_there_is_something_to_check() -> None:
    assert PROM_RULES and PROM_TESTS and len(DASHBOARDS) == 2


@pytest.mark.parametrize("path", PROM_RULES, ids=lambda p: p.name)
def test_promtool_check_rules(path: Path) -> None:
    out = _run(_tool("promtool"), "check", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    # Every alert of the file was read: as many as the file names (a rule lost in a bad
    # indentation would be missing from promtool's count).
    alerts = sum(len(g["rules"]) for g in yaml.safe_load(path.read_text())["groups"])
    assert alerts >= 12 and f"SUCCESS: {alerts} rules found" in out.stdout


@pytest.mark.parametrize("path", PROM_TESTS, ids=lambda p: p.name)
def test_promtool_test_rules(path: Path) -> None:
    out = _run(_tool("promtool"), "test", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def _alerts() -> set[str]:
    """The alerts the shipped rule files define (their recording rules left out)."""
    import yaml

    return {
        r["alert"]
        for p in PROM_RULES
        for g in yaml.safe_load(p.read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }


def test_every_alert_has_a_unit_test() -> None:
    import yaml

    alerts = _alerts()
    tested = {
        t["alertname"]
        for p in PROM_TESTS
        for case in yaml.safe_load(p.read_text())["tests"]
        for t in case.get("alert_rule_test", [])
        if t.get("exp_alerts")
    }
    assert alerts - tested == set()


def test_documented_configs_parse() -> None:
    prom = _run(_tool("promtool"), "check", "config", "docs/prometheus-scrape.yml")
    assert prom.returncode == 0, prom.stdout + prom.stderr
    am = _run(_tool("amtool"), "check-config", "docs/alertmanager.yml")
    assert am.returncode == 0, am.stdout + am.stderr
    text = (ROOT / "docs" / "alertmanager.yml").read_text()
    assert "send_resolved: true" in text and "/webhook/alertmanager" in text
    assert "honor_labels: true" in (ROOT / "docs" / "prometheus-scrape.yml").read_text()


def test_shipped_alert_mapping_names_shipped_alerts() -> None:

    from nodeguard.rules.load import load_rules

    alerts = _alerts()
    mapped = {a.alertname for a in load_rules([ROOT / "rules" / "alertmanager.yaml"]).alerts}
    assert mapped and mapped <= alerts


def test_dashboards_are_current_with_their_builder(tmp_path: Path) -> None:
    before = {p.name: p.read_text() for p in DASHBOARDS}
    out = _run(sys.executable, "grafana/build.py")
    assert out.returncode == 0, out.stderr
    after = {p.name: p.read_text() for p in sorted((ROOT / "grafana").glob("*.json"))}
    assert after == before, "grafana/*.json differ from grafana/build.py: commit the rebuild"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_shape(path: Path) -> None:
    board = json.loads(path.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert "nodeguard_node_info" in variables["node"]["query"]["query"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"] in UNITS, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert 'instance=~"$instance"' in target["expr"], (panel["title"], target["expr"])
