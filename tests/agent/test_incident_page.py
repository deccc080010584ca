"""The incident page in a real browser: headless Chromium (Debian's chromium package) opens the
page of a real OOM kill's record (tests/fixtures/incidents/oom-kill.json, see its README),
runs its scripts, and the DOM it dumps says what Chart.js drew: two charts, every series the
record calls for, both canvases painted. Its screenshot is a PNG of the window's size (the
README's picture is made by the same command, scripts/incident-screenshot)."""

from __future__ import annotations

import html
import json
import os
import re
import struct
from pathlib import Path
from typing import Any

import pytest

from nodeguard.remediation.incident_charts import MEMORY_PARTS, OOM_KILL
from nodeguard.remediation.incident_page import page
from tests.support import browser

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "incidents" / "oom-kill.json"


@pytest.fixture(scope="module", autouse=True)
def _chromium() -> None:
    if browser.chromium() is None:
        why = "chromium not found: install Debian's chromium package (scripts/test does)"
        if os.environ.get("NODEGUARD_FORBID_SKIPS") == "1":
            pytest.fail(why)
        pytest.skip(why)


def _body(dom: str) -> dict[str, str]:
    """The attributes of the dumped DOM's ``<body>`` (Chromium writes each ``name="value"``,
    the value HTML-escaped)."""
    found = re.search(r"<body([^>]*)>", dom)
    assert found is not None, dom[:2000]
    return {k: html.unescape(v) for k, v in re.findall(r'([\w-]+)="([^"]*)"', found[1])}


@pytest.fixture(scope="module")
def record() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    return data


def test_chromium_draws_both_charts_with_every_series(
    record: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "page.html"
    path.write_text(page(record=record), encoding="utf-8")
    body = _body(browser.dump_dom(path, workdir=tmp_path))
    assert body.get("data-error") is None, body["data-error"]
    assert body.get("data-charts") == "2", body
    series = json.loads(body["data-series"])
    names = {c["name"] for p in record["timeline"] for c in p["containers"]}
    assert len(names) == 3  # the victim and its two neighbours
    expected = [p.label for p in MEMORY_PARTS] + sorted(names)
    assert sorted(series[: len(expected)]) == sorted(expected), series
    limit = f"victim's limit {record['victim']['limit_bytes'] >> 20}.0 MiB"
    (link,) = record["linked"]
    fired = f"half-way fired ({link['seconds_before_kill']:.1f} s before)"
    assert series[len(expected) :] == [limit, OOM_KILL, fired]
    assert json.loads(body["data-painted"]) == [True, True]


def test_a_page_without_a_timeline_draws_nothing_and_says_so(
    record: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "page.html"
    bare = record | {"timeline": [], "sampled_before": False}
    path.write_text(page(record=bare), encoding="utf-8")
    dom = browser.dump_dom(path, workdir=tmp_path)
    body = _body(dom)
    assert (body.get("data-charts"), body.get("data-series")) == ("0", "[]"), body
    assert "no timeline: not sampled before" in dom


def test_the_screenshot_is_a_png_of_the_window(record: dict[str, Any], tmp_path: Path) -> None:
    path, png = tmp_path / "page.html", tmp_path / "page.png"
    path.write_text(page(record=record), encoding="utf-8")
    browser.screenshot(path, out=png, workdir=tmp_path)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    width, height = struct.unpack(">II", data[16:24])
    assert (length, kind) == (13, b"IHDR") and (width, height) == browser.WINDOW == (1200, 1400)
