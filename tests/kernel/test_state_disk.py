"""The agent, a real process, with its state on a real full filesystem and a wall clock that
steps while it is down; killed with SIGKILL at the worst moment and started again.

The agent reads the v2 fixture host (its unreclaimable slab is 31 % of RAM, so the local rule
below holds), takes Alertmanager deliveries on its webhook, and keeps its state in
``--path.state``: in the first test a 64 KiB tmpfs (tests/support/fullfs.py) filled up while it
runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from nodeguard.statefile import StateFile, StateNotPersisted
from tests.support.agent import get, kill_9, running_agent, wait_until
from tests.support.alerts import alert, payload
from tests.support.fullfs import PAGE, can_mount, can_slow_a_disk, fill, slow_disk, small_tmpfs
from tests.support.hostile import (
    Watch,
    daemonset_memory_limit,
    liveness_probe,
    memory_cgroup,
    oom_kills,
)
from tests.support.hosts import host_flags
from tests.support.kernel_cgroup import writable_memory_controller
from tests.support.remediation import incidents

TOKEN = "state-" + "0" * 32
AM_RULES = Path(__file__).resolve().parents[2] / "rules" / "alertmanager.yaml"
RULES = """\
apiVersion: nodeguard.io/v1alpha1
kind: RuleSet
spec:
  rules:
    - name: slab-high
      scope: node
      when:
        - {signal: node_slab_unreclaimable_ratio, op: ">", value: 0.3}
      cooldown: 1h
      maxFirings: {count: 1, window: 1h}
      actions: [{action: record}]
"""
STATE = "remediation-state.json"


def _args(tmp_path: Path, state: Path) -> list[str]:
    token, rules = tmp_path / "token", tmp_path / "rules.yaml"
    token.write_text(TOKEN)
    rules.write_text(RULES)
    return [
        *host_flags("v2-systemd-containerd"),
        "--interval=200ms",
        "--node-name=gpu-1",
        f"--path.state={state}",
        f"--incidents.dir={tmp_path / 'incidents'}",
        f"--webhook.token-file={token}",
        f"--rules={rules}",
        f"--rules={AM_RULES}",
    ]


def _post(base: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        f"{base}/webhook/alertmanager",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _metric(base: str, name: str, **labels: str) -> float | None:
    for line in get(f"{base}/metrics")[1].splitlines():
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] == name and all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


def _incidents(base: str, rule: str) -> int:
    return sum(1 for i in incidents(base) if i["rule"] == rule)


def _on_disk(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data


def _resolved(fingerprint: str) -> dict[str, Any]:
    # The alert rule has no resolve actions: a resolved delivery is taken (remembered in the
    # state file) and acts on nothing.
    return alert("NodeguardSlabUnreclaimableHigh", "resolved", fingerprint=fingerprint)


@pytest.mark.skipif(not can_mount(), reason="mounting a tmpfs needs root")
def test_a_full_disk_then_kill_9_keeps_the_state_and_acts_no_more(tmp_path: Path) -> None:
    # The fault: on the full filesystem the truncated JSON replaced the state file; killed and
    # restarted, the agent set it aside and forgot the deliveries it had taken.
    with small_tmpfs(tmp_path / "state", size=16 * PAGE) as fs:
        args = _args(tmp_path, fs)
        with running_agent(args=args, log_path=tmp_path / "agent-1.log") as base:
            wait_until("the local rule to act", lambda: _incidents(base, "slab-high"), timeout=20)
            code, answer = _post(base, payload(_resolved("before")))
            assert (code, answer["alerts"][0]["outcome"]) == (200, "nothing_to_undo")
            wait_until(
                "the delivery and the firing on disk",
                lambda: (
                    (d := _on_disk(fs / STATE))
                    and d["sections"].get("alerts", {}).get("seen")
                    and d["sections"]["rules"]["slab-high"].get("fired")
                ),
                timeout=10,
            )
            filler = fill(fs, leave=PAGE)  # one page left: less than the state will need
            flood = payload(*(_resolved(f"flood-{i}") for i in range(300)))
            code, answer = _post(base, flood)
            assert code == 503, answer  # Alertmanager sends it again later
            assert "cannot be written" in answer["error"]
            assert _metric(base, "nodeguard_state_persisted") == 0.0
            assert (_metric(base, "nodeguard_state_save_failures_total") or 0) >= 1
            code, answer = _post(base, payload(_resolved("during")))
            assert (code, answer["alerts"][0]["outcome"]) == (503, "state_not_persisted")
            kill_9(base.pid)
        kept = _on_disk(fs / STATE)
        assert kept is not None  # whole JSON: the file before the disk filled
        assert len(kept["sections"]["alerts"]["seen"]) == 1
        assert not [n for n in os.listdir(fs) if n.endswith(".tmp")]  # no temporary file left
        filler.unlink()
        with running_agent(args=args, log_path=tmp_path / "agent-2.log") as base:
            code, answer = _post(base, payload(_resolved("before")))
            assert (code, answer["alerts"][0]["outcome"]) == (200, "duplicate")  # remembered
            wait_until(
                "the restarted agent to hold back",
                lambda: (
                    (_metric(base, "nodeguard_rule_suppressed_total", reason="cooldown") or 0) >= 5
                ),
                timeout=20,
            )
            assert _incidents(base, "slab-high") == 1  # the cooldown and the cap were kept
            assert _metric(base, "nodeguard_state_persisted") == 1.0
    log = (tmp_path / "agent-2.log").read_text()
    assert "not used" not in log and "Traceback" not in log
    first = (tmp_path / "agent-1.log").read_text()
    assert first.count("cannot write the remediation state") == 1  # said once, not per save


def _shift(value: Any, by: float) -> Any:
    """Every Unix time in a state file (seconds, 1e9..1e11) moved by ``by``; boot times and
    alert instants (microseconds) left as they are."""
    if isinstance(value, dict):
        return {k: (v if k == "uptime" else _shift(v, by)) for k, v in value.items()}
    if isinstance(value, list):
        return [_shift(v, by) for v in value]
    if isinstance(value, int | float) and not isinstance(value, bool) and 1e9 < value < 1e11:
        return value + by
    return value


def test_a_wall_clock_step_forward_while_down_skips_no_cooldown(tmp_path: Path) -> None:
    # The fault: killed, restarted seconds later while the wall clock stepped two hours ahead,
    # the agent took the cooldown (1 h) and the maxFirings window (1 h) as over and acted again.
    # A file whose every wall time is two hours back is what a clock two hours ahead reads.
    args = _args(tmp_path, tmp_path / "state")
    path = tmp_path / "state" / STATE
    with running_agent(args=args, log_path=tmp_path / "agent-1.log") as base:
        wait_until("the local rule to act", lambda: _incidents(base, "slab-high"), timeout=20)
        wait_until(
            "its cooldown on disk",
            lambda: (
                (d := _on_disk(path))
                and d["sections"]["rules"]["slab-high"]["targets"]["gpu-1"].get("a")
                and not d["sections"]["rules"]["slab-high"]["targets"]["gpu-1"].get("b")
            ),
            timeout=10,
        )
        kill_9(base.pid)
    path.write_text(json.dumps(_shift(json.loads(path.read_text()), -7200.0)))
    # Down for seconds (the waits' guards below are 20 s), well inside the rule's 1 h cooldown:
    # holding back is the right answer however slow the machine.
    with running_agent(args=args, log_path=tmp_path / "agent-2.log") as base:
        wait_until(
            "the restarted agent to hold back",
            lambda: (
                (_metric(base, "nodeguard_rule_suppressed_total", reason="cooldown") or 0) >= 10
            ),
            timeout=20,
        )
        assert _incidents(base, "slab-high") == 1


FLOOD_RULES = """\
apiVersion: nodeguard.io/v1alpha1
kind: RuleSet
spec:
  rules:
    - name: every-container
      scope: container
      when:
        - {signal: container_working_set_bytes, op: ">=", value: 0}
      for: 1h
      actions: [{action: record}]
"""


@pytest.mark.skipif(not can_slow_a_disk(), reason="needs root, loop devices and blkio v1")
@pytest.mark.skipif(writable_memory_controller() is None, reason="needs a memory controller")
def test_probes_answer_through_a_flood_on_a_slow_disk(tmp_path: Path) -> None:
    # The fault: every alert taken and every step saved the whole state with two fsyncs on the
    # event loop; a webhook flood stalled /healthz and /metrics for seconds (18 of 30 probes
    # over 1 s). Here: 1,000 containers each pending on a rule (1,000 entries in the state),
    # five concurrent deliveries of 300 alerts, the state on a disk writing 128 KiB/s (each
    # write of the state takes seconds), the DaemonSet's memory limit.
    from benchmarks.hosts import make_host  # a generated node of 1,000 containers

    host = make_host(tmp_path / "host", containers=1000)
    token, rules = tmp_path / "token", tmp_path / "rules.yaml"
    token.write_text(TOKEN)
    rules.write_text(FLOOD_RULES)
    timeout, failure_threshold = liveness_probe()
    with (
        slow_disk(tmp_path / "disk", write_bps=128 << 10) as disk,
        memory_cgroup(daemonset_memory_limit()) as memcg,
    ):
        args = [
            *host.flags,
            "--interval=1s",
            "--node-name=gpu-1",
            f"--path.state={disk.mount / 'state'}",
            f"--webhook.token-file={token}",
            f"--rules={rules}",
            f"--rules={AM_RULES}",
        ]

        def preexec() -> None:
            for group in (memcg, disk.cgroup):
                (group / "cgroup.procs").write_text(str(os.getpid()))

        log_path = tmp_path / "agent.log"
        with (
            running_agent(args=args, log_path=log_path, preexec=preexec, ready_timeout=60) as base,
            Watch(base) as w,
        ):
            wait_until(
                "1,000 targets pending",
                lambda: (
                    (_metric(base, "nodeguard_rule_targets", rule="every-container") or 0) >= 1000
                ),
                timeout=60,
            )
            answers: list[int] = []

            def deliver(n: int) -> None:
                body = payload(*(_resolved(f"flood-{n}-{i}") for i in range(300)))
                with contextlib.suppress(OSError):
                    answers.append(_post(base, body)[0])

            threads = [threading.Thread(target=deliver, args=(n,)) for n in range(5)]
            for t in threads:
                t.start()
            took: list[float] = []  # each scrape's seconds, for the closing line

            def scrape() -> bool:
                """One scrape (answered within the probe's timeout); the deliveries done."""
                started = time.monotonic()
                assert get(f"{base}/metrics", timeout=timeout)[0] == 200
                took.append(time.monotonic() - started)
                return not any(t.is_alive() for t in threads)

            wait_until("the deliveries answered, scraping", scrape, timeout=300, step=0.2)
            for t in threads:
                t.join(timeout=1)
            # The bar is the kubelet's: the DaemonSet's own livenessProbe restarts the agent
            # after failureThreshold probes in a row over timeoutSeconds; asked every 0.2 s
            # here with the 1 s of the issue (stricter than timeoutSeconds), never that many.
            assert timeout >= 1.0
            w.check(limit=daemonset_memory_limit(), failure_threshold=failure_threshold)
            assert answers == [200] * 5  # each answered once its alerts were on disk
            assert _metric(base, "nodeguard_state_save_failures_total") == 0.0
            size = (disk.mount / "state" / STATE).stat().st_size
            assert size > 128 << 10  # each write of it took the disk over a second
        assert oom_kills(memcg) == 0
    w.check(limit=daemonset_memory_limit(), failure_threshold=failure_threshold)
    print(
        f"state {size} B; probes {w.probes}, over 1 s {len(w.failures)}, slowest "
        f"{w.slowest:.2f}s; scrapes {len(took)}, slowest {max(took):.2f}s"
    )
    assert "Traceback" not in log_path.read_text()


@pytest.mark.skipif(not can_mount(), reason="mounting a tmpfs needs root")
async def test_a_failed_checkpoint_is_written_once_the_disk_has_room(tmp_path: Path) -> None:
    # Issue 22 review: a write-ahead checkpoint that failed on a full disk never woke the
    # writer: persist() waited for ever, persisted stayed False and the agent refused every
    # firing and delivery (state_not_persisted) until restarted. The writer retries every
    # retry_seconds (statefile.py's promise).
    with small_tmpfs(tmp_path / "fs", size=16 * PAGE) as fs:
        state = StateFile(path=fs / "state.json", node="node-a", retry_seconds=0.05)
        journal = state.section("journal")
        journal["e"] = {"next": 0, "progress": {}}
        state.save()
        assert await state.persist()  # the writer task has run and waits for the next request
        filler = fill(fs)
        journal["e"]["progress"]["0"] = {"inflight": {"done": ["ns/pod"]}}
        with pytest.raises(StateNotPersisted):
            state.checkpoint()  # an eviction's note, just after the eviction
        assert not state.persisted
        filler.unlink()  # room again
        try:
            ok = await asyncio.wait_for(state.persist(), timeout=5)  # a hang guard, not a timing
        except TimeoutError:
            ok = None
        state.release()
        assert ok is True, "persist() never returned: no write was tried after the disk freed"
        assert state.persisted
        assert json.loads((fs / "state.json").read_text())["sections"]["journal"]["e"] == {
            "next": 0,
            "progress": {"0": {"inflight": {"done": ["ns/pod"]}}},
        }
