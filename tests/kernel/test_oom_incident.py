"""On the real kernel: a process in a kubelet-shaped cgroup grows past its 64 MiB limit and the
kernel OOM-kills it. With no rule about OOM kills, the agent records the kill as an incident:
the victim as the kernel log and the sample before name it, the node's evidence then, the
timeline of the container's growth, and the dry-run firing that came before it, linked both
ways. The agent is then SIGKILLed and started again on the same state: the kill is recorded
once, also when the store's bound has removed its record; one whose record was never written
(killed between the kernel-log save and the write) is recorded at the restart; the human view
of it fits 80 columns; its HTML page, served by the agent, is the record's and the one the
command line writes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.agent import get, kill_9, running_agent, wait_until
from tests.support.kernel_cgroup import (
    PrivateKubepods,
    hog_in,
    kubelet_cgroup,
)

MiB = 1 << 20
LIMIT = 64 * MiB

# A container rule that fires (in dry run, the default) half-way to the limit: the firing the
# kill is linked to.
HALF_WAY = """\
apiVersion: nodeguard.io/v1alpha1
kind: RuleSet
spec:
  rules:
    - name: half-way
      scope: container
      when:
        - {signal: container_unreclaimable_limit_ratio, op: ">=", value: 0.5}
      actions:
        - action: record
"""


def _records(state: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted((state / "incidents").glob("*.json")):
        out.append(json.loads(path.read_text()))
    return out


def _points(metrics: str) -> float:
    line = next(ln for ln in metrics.splitlines() if ln.startswith("nodeguard_timeline_points "))
    return float(line.split()[1])


def _served(url: str) -> tuple[int, str, bytes]:
    """``(status, Content-Type, body)`` of a GET."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), resp.read()


def _kills(state: Path, container_id: str) -> list[dict[str, Any]]:
    return [
        r
        for r in _records(state)
        if r.get("kind") == "oom_kill" and r["victim"].get("container_id") == container_id
    ]


def test_a_kernel_oom_kill_is_an_incident_with_its_timeline(
    pods: PrivateKubepods, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    rules = tmp_path / "rules.yaml"
    rules.write_text(HALF_WAY)
    with kubelet_cgroup(pods, limit_bytes=LIMIT) as cg:
        args = [
            f"--path.sysfs={pods.sysfs}",
            "--interval=100ms",
            f"--path.state={state}",
            "--no-collector.processes",
            f"--rules={rules}",
        ]
        with running_agent(args=args, log_path=tmp_path / "agent.log") as base:
            with hog_in(cg, step=1 * MiB, pause=0.03, up_to=4 * LIMIT) as hog:
                wait_until("the hog's end", lambda: hog.poll() is not None, timeout=60)
                hog.wait(timeout=10)
                assert hog.returncode == -9, "the kernel should have OOM-killed the hog"
            (kill,) = wait_until(
                "the kill recorded", lambda: _kills(state, cg.container_id), timeout=30
            )
            metrics = get(f"{base}/metrics")[1]
            status, content_type, served = _served(f"{base}/incidents/{kill['id']}.html")
            kill_9(base.pid)

        # Its page: the whole record embedded, and the same bytes from the command line (the
        # page is a function of the record alone, which neither changed).
        assert (status, content_type) == (200, "text/html; charset=utf-8")
        embedded = re.findall(
            r'<script type="application/json" id="nodeguard-record">(.*?)</script>',
            served.decode(),
            re.S,
        )
        assert [json.loads(x) for x in embedded] == [kill]
        written = tmp_path / "kill.html"
        command = ["incidents", kill["id"], "--html", str(written), f"--path.state={state}"]
        subprocess.run(
            [sys.executable, "-m", "nodeguard", *command],
            capture_output=True,
            check=True,
        )
        assert written.read_bytes() == served

        victim = kill["victim"]
        assert (victim["constraint"], victim["pod_uid"]) == ("CONSTRAINT_MEMCG", cg.pod_uid)
        assert victim["process"].startswith("python") and victim["limit_bytes"] == LIMIT
        assert LIMIT // 2 <= victim["anon_rss_bytes"] <= LIMIT + 16 * MiB
        assert (kill["rule"], kill["source"], kill["scope"]) == ("oom-kill", "kernel", "container")
        assert kill["summary"].endswith("at its limit 64.0 MiB"), kill["summary"]
        # The evidence is the sample before the kill, not the one that saw it.
        assert kill["evidence_time"] is not None and kill["evidence_time"] <= kill["time"]
        assert kill["evidence"]["memory"]["available_bytes"] > 0

        # The timeline: the container's working set rising toward its limit, before the kill.
        key = f"{cg.pod_uid}/{cg.container_id}"
        grown = [
            c["working_set_bytes"]
            for p in kill["timeline"]
            for c in p["containers"]
            if c["key"] == key
        ]
        assert all(p["time"] <= kill["time"] for p in kill["timeline"])
        assert len(set(grown)) >= 3, grown
        assert max(grown) >= LIMIT // 2 and grown.index(max(grown)) > grown.index(min(grown))

        # The dry-run firing before it, linked both ways.
        (link,) = kill["linked"]
        assert (link["rule"], link["dry_run"], link["acted"]) == ("half-way", True, False)
        assert 0 < link["seconds_before_kill"] < 60
        (firing,) = [r for r in _records(state) if r["id"] == link["id"]]
        assert firing["killed_later"]["id"] == kill["id"]
        assert firing["timeline"], "a firing's record carries the timeline too"

        # The history's size is on /metrics, bounded.
        assert 3 <= _points(metrics) <= 6000

        # Killed and started again on the same state: the kill is recorded once.
        with running_agent(args=args, log_path=tmp_path / "agent2.log") as again:
            wait_until(
                "a few samples after the restart",
                lambda: _points(get(f"{again}/metrics")[1]) >= 5,
                timeout=30,
            )
        assert len(_kills(state, cg.container_id)) == 1

        shown = subprocess.run(
            [sys.executable, "-m", "nodeguard", "incidents", f"--path.state={state}", kill["id"]],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "COLUMNS": "80"},
        ).stdout
        lines = shown.splitlines()
        assert lines[0].startswith("oom-kill the kernel OOM-killed python (pid "), shown
        assert "  from    the kernel log (CONSTRAINT_MEMCG)" in lines
        assert any(ln.startswith("  before  half-way fired ") for ln in lines), shown
        assert any(ln.startswith("Before it (") for ln in lines), shown
        assert max(len(ln) for ln in lines) <= 80, shown

        # Its record removed by the store's bound (the file gone): a restart, reading the
        # kernel log's recent kills back, does not write it again.
        (state / "incidents" / f"{kill['id']}.json").unlink()
        with running_agent(args=args, log_path=tmp_path / "agent3.log") as third:
            wait_until(
                "a few samples", lambda: _points(get(f"{third}/metrics")[1]) >= 5, timeout=30
            )
        assert _kills(state, cg.container_id) == []

        # Killed after the kernel-log position was saved but before the record was written
        # (the file gone and the state without it): the restart records it from the saved
        # recent kills, with no evidence of a sample before it in this run, and no timeline.
        saved = state / "remediation-state.json"
        data = json.loads(saved.read_text())
        data["sections"]["oom_incidents"]["kills"] = []
        saved.write_text(json.dumps(data))
        with running_agent(args=args, log_path=tmp_path / "agent4.log"):
            (again_kill,) = wait_until(
                "the kill recorded again", lambda: _kills(state, cg.container_id), timeout=30
            )
        assert again_kill["id"].endswith(kill["id"].rsplit("-", 1)[1])
        assert again_kill["victim"]["pid"] == victim["pid"]
        assert (again_kill["evidence_time"], again_kill["timeline"]) == (None, [])
        assert again_kill["sampled_before"] is False
