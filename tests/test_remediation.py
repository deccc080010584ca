"""The remediator (bounded queue, workers, incidents) with stand-in actions, and the agent's rule
reload, end to end on a fixture host."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from nodeguard.actions.audit import Auditor
from nodeguard.actions.base import ActionResult
from nodeguard.remediation.incidents import IncidentStore
from nodeguard.remediation.runbook import Runbook
from nodeguard.remediation.worker import Remediator
from nodeguard.rules.engine import Firing
from nodeguard.rules.schema import ActionSpec
from nodeguard.sampler import Sampler, SamplerConfig
from tests.agent import get, running_agent
from tests.conftest import host_flags, host_paths

GiB = 1 << 30


def firing(rule: str = "r", *, actions: tuple[str, ...] = ("record",), **kw: Any) -> Firing:
    snap = Sampler(
        config=SamplerConfig(paths=host_paths("v2-systemd-containerd"), node_name="node-a")
    ).sample_once()
    return Firing(
        rule=rule,
        kind="firing",
        scope="node",
        target="node-a",
        node="node-a",
        time=kw.pop("time", 1_700_000_000.0),
        actions=tuple(ActionSpec(action=a) for a in actions),
        dry_run=False,
        values={"node_slab_unreclaimable_ratio": 0.3125},
        summary=f"{rule} on node node-a",
        snapshot=snap,
        **kw,
    )


class SlowRunbook(Runbook):
    """A stand-in whose every action waits for the test to release it."""

    def __init__(self, gate: asyncio.Event) -> None:
        super().__init__(
            kube=None, auditor=Auditor(kube=None, node_name="node-a", metrics=None), node="node-a"
        )
        self.gate = gate
        self.ran: list[str] = []

    async def run(
        self, spec: ActionSpec, *, firing: Firing, dry_run: bool, note: str
    ) -> list[ActionResult]:
        self.ran.append(firing.rule)
        await self.gate.wait()
        return [
            ActionResult(
                action=spec.action,
                node="node-a",
                dry_run=dry_run,
                outcome="done",
                message="stand-in",
            )
        ]


async def test_slow_actions_never_block_submit_and_a_full_queue_refuses(tmp_path: Path) -> None:
    gate = asyncio.Event()
    runbook = SlowRunbook(gate)
    done: list[str] = []
    rem = Remediator(
        runbook=runbook,
        incidents=IncidentStore(directory=tmp_path),
        queue_size=1,
        concurrency=1,
        global_dry_run=True,
        on_done=lambda f, _r: done.append(f.rule),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(rem.run(stop=stop))
    started = time.perf_counter()
    assert rem.submit(firing("first"))
    await asyncio.sleep(0.05)  # the worker took it and waits on the gate
    assert rem.in_flight == 1
    assert rem.submit(firing("second"))  # queued
    assert not rem.submit(firing("third"))  # the queue (size 1) is full: refused at once
    assert time.perf_counter() - started < 0.5
    gate.set()
    await asyncio.wait_for(rem.queue.join(), 5)
    await asyncio.sleep(0)
    assert runbook.ran == ["first", "second"]
    assert done == ["first", "second"]
    stop.set()
    await task
    records = IncidentStore(directory=tmp_path).list()
    assert [r["rule"] for r in records] == ["second", "first"]  # same time: ids sort by rule
    assert all(r["dry_run"] for r in records)  # the global dry run, not the firing's own


async def test_without_a_cluster_actions_say_so_and_evidence_is_recorded(tmp_path: Path) -> None:
    store = IncidentStore(directory=tmp_path)
    rem = Remediator(
        runbook=Runbook(
            kube=None, auditor=Auditor(kube=None, node_name="node-a", metrics=None), node="node-a"
        ),
        incidents=store,
        global_dry_run=True,
    )
    results = await rem.handle(firing(actions=("record", "cordon", "evict")))
    assert [(r.action, r.outcome) for r in results] == [
        ("record", "done"),
        ("cordon", "refused"),
        ("evict", "refused"),
    ]
    assert "no Kubernetes API configured" in results[1].message
    (record,) = store.list()
    ev = record["evidence"]
    assert ev["memory"]["total_bytes"] == 32 * GiB
    assert ev["memory"]["available_bytes"] == 6 * GiB
    assert ev["memory"]["slab_unreclaimable_bytes"] == 10 * GiB
    assert ev["memory"]["page_cache_bytes"] == int(2.5 * GiB)
    top = ev["top_containers"][0]
    assert top["working_set_bytes"] == 10 * GiB - 256 * (1 << 20)
    assert top["limit_bytes"] == 30 * GiB
    assert ev["top_processes"][0]["name"] == "python3"
    assert ev["top_processes"][0]["rss_bytes"] == 9 * GiB
    assert record["values"] == {"node_slab_unreclaimable_ratio": 0.3125}
    assert [a["outcome"] for a in record["actions"]] == ["done", "refused", "refused"]


def test_incident_directory_is_bounded(tmp_path: Path) -> None:
    store = IncidentStore(directory=tmp_path, keep=3)
    for i in range(5):
        store.write(firing=firing(f"rule-{i}", time=1_700_000_000.0 + i), results=[])
    assert [r["rule"] for r in store.list()] == ["rule-4", "rule-3", "rule-2"]
    assert len(list(tmp_path.glob("*.json"))) == 3


RULES = """\
apiVersion: nodeguard.io/v1alpha1
kind: RuleSet
spec:
  rules:
    - name: slab-high
      scope: node
      when:
        - {signal: node_slab_unreclaimable_ratio, op: ">", value: 0.3}
      actions:
        - action: record
"""


def _metric(body: str, name: str) -> float:
    line = next(ln for ln in body.splitlines() if ln.startswith(name + " "))
    return float(line.split()[-1])


def _wait(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_agent_acts_on_rules_and_reload_keeps_the_last_good(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    args = [
        *host_flags("v2-systemd-containerd"),
        "--interval=100ms",
        f"--rules={rules}",
        f"--path.state={tmp_path / 'state'}",
        "--node-name=node-a",
    ]
    with running_agent(args=args, log_path=tmp_path / "agent.log") as base:
        _wait(lambda: json.loads(get(f"{base}/incidents")[1]))
        (incident,) = json.loads(get(f"{base}/incidents")[1])
        assert incident["rule"] == "slab-high" and incident["dry_run"] is True
        assert incident["actions"] == ["record:done"]
        full = json.loads(get(f"{base}/incidents/{incident['id']}")[1])
        assert full["evidence"]["memory"]["slab_unreclaimable_bytes"] == 10 * GiB
        assert get(f"{base}/incidents/nonexistent")[0] == 404
        assert get(f"{base}/incidents/..%2F..%2Fetc%2Fpasswd")[0] == 404
        metrics = get(f"{base}/metrics")[1]
        assert _metric(metrics, "nodeguard_rules_loaded") == 1
        assert 'nodeguard_rule_firings_total{kind="firing",rule="slab-high"} 1.0' in metrics
        assert (
            'nodeguard_actions_total{action="record",dry_run="true",outcome="done"}' not in metrics
        )  # record writes no Event and is not a cluster action

        rules.write_text(RULES.replace("value: 0.3}", "value: [}"))  # broken YAML
        _wait(
            lambda: _metric(get(f"{base}/metrics")[1], "nodeguard_rules_reload_errors_total") == 1
        )
        assert _metric(get(f"{base}/metrics")[1], "nodeguard_rules_loaded") == 1

        second = RULES.split("  rules:\n")[1].replace("slab-high", "slab-high-2")
        rules.write_text(RULES + second)
        _wait(lambda: _metric(get(f"{base}/metrics")[1], "nodeguard_rules_loaded") == 2)
        assert _metric(get(f"{base}/metrics")[1], "nodeguard_rules_reloads_total") == 1

        os.kill(base.pid, signal.SIGHUP)
        _wait(lambda: _metric(get(f"{base}/metrics")[1], "nodeguard_rules_reloads_total") == 2)


def test_incidents_command_lists_and_shows(tmp_path: Path) -> None:
    import subprocess
    import sys

    store = IncidentStore(directory=tmp_path / "incidents")
    record = store.write(
        firing=firing("slab-high"),
        results=[
            ActionResult(
                action="cordon", node="node-a", dry_run=True, outcome="done", message="would cordon"
            )
        ],
    )
    env = {"COLUMNS": "200", "PATH": ""}
    listing = subprocess.run(
        [sys.executable, "-m", "nodeguard", "incidents", f"--path.state={tmp_path}"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    assert "slab-high" in listing and "cordon:done" in listing and record["id"] in listing
    shown = subprocess.run(
        [sys.executable, "-m", "nodeguard", "incidents", f"--path.state={tmp_path}", record["id"]],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    assert json.loads(shown)["evidence"]["memory"]["total_bytes"] == 32 * GiB
    missing = subprocess.run(
        [sys.executable, "-m", "nodeguard", "incidents", f"--path.state={tmp_path}", "nope"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert missing.returncode == 1
