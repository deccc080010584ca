"""The remediator (bounded queue, workers, incidents) with stand-in actions, and the agent's rule
reload, end to end on a fixture host."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

import tests.support.standin_actions as standin
from nodeguard.actions.base import ActionResult
from nodeguard.firing import Firing
from nodeguard.remediation.incidents import IncidentStore
from nodeguard.remediation.worker import Remediator
from nodeguard.rules.schema import ActionSpec
from nodeguard.sampling.sampler import Sampler, SamplerConfig
from nodeguard.snapshot import NodeSnapshot, PodMeta
from nodeguard.statefile import StateFile
from tests.support.acting import env_for
from tests.support.agent import get, running_agent, wait_until, wait_until_async
from tests.support.fullfs import PAGE, can_mount, fill, small_tmpfs
from tests.support.hosts import host_flags, host_paths
from tests.support.state import state_at

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
        steps=tuple(ActionSpec(action=a).step for a in actions),
        dry_run=False,
        values={"node_slab_unreclaimable_ratio": 0.3125},
        summary=f"{rule} on node node-a",
        snapshot=snap,
        **kw,
    )


def remediator(tmp_path: Path, **kw: Any) -> Remediator:
    state = kw.pop("state", None) or state_at(path=tmp_path / "state.json", node="node-a")
    return Remediator(
        env=kw.pop("env", None) or env_for(None, "node-a"),
        incidents=IncidentStore(directory=tmp_path / "incidents"),
        state=state,
        global_dry_run=kw.pop("global_dry_run", True),
        **kw,
    )


async def test_slow_actions_never_block_submit_and_a_full_queue_refuses(tmp_path: Path) -> None:
    gate = standin.new_gate()
    done: list[str] = []
    rem = remediator(
        tmp_path, queue_size=1, concurrency=1, on_done=lambda f, _r, _a: done.append(f.rule)
    )
    stop = asyncio.Event()
    task = asyncio.create_task(rem.run(stop=stop))
    # submit() is synchronous and the gate never opens by itself: were it to wait for a
    # worker, this test would hang here rather than pass.
    assert rem.submit(firing("first", actions=("test_gate",)))
    await asyncio.sleep(0.05)  # the worker took it and waits on the gate
    assert rem.in_flight == 1
    assert rem.submit(firing("second", actions=("test_gate",)))  # queued
    assert not rem.submit(firing("third", actions=("test_gate",)))  # full: refused at once
    gate.set()
    await wait_until_async(
        "both runbooks done", lambda: done == ["first", "second"], timeout=30, step=0.01
    )
    stop.set()
    await task
    records = IncidentStore(directory=tmp_path / "incidents").list()
    assert [r["rule"] for r in records] == ["second", "first"]  # same time: ids sort by rule
    assert all(r["dry_run"] for r in records)  # the global dry run, not the firing's own
    assert rem.journal == {}  # every runbook done: nothing left under way


async def test_without_a_cluster_actions_say_so_and_evidence_is_recorded(tmp_path: Path) -> None:
    rem = remediator(tmp_path)
    assert rem.submit(firing(actions=("record", "cordon", "evict")))
    (key,) = rem.journal
    results = await rem.handle(key)
    assert results is not None
    assert [(r["action"], r["outcome"]) for r in results] == [
        ("record", "done"),
        ("cordon", "refused"),
        ("evict", "refused"),
    ]
    assert "no Kubernetes API configured" in results[1]["message"]
    (record,) = rem.incidents.list()
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


async def test_the_journal_resumes_a_runbook_at_the_step_it_was_in(tmp_path: Path) -> None:
    # A runbook of three steps; the agent dies while the second runs (the gate never opens).
    standin.new_gate()
    standin.RUNS.clear()
    first = remediator(tmp_path)
    stop = asyncio.Event()
    task = asyncio.create_task(first.run(stop=stop))
    assert first.submit(firing("rb", actions=("test_count", "test_gate", "test_count")))
    await wait_until_async(
        "step 2 under way", lambda: standin.RUNS[("test_gate", "rb")] == 1, timeout=30, step=0.01
    )
    (key,) = first.journal
    assert first.journal[key]["next"] == 1  # on disk: step 1 done, step 2 under way
    task.cancel()  # as good as kill -9: nothing after this point runs
    with contextlib.suppress(asyncio.CancelledError):
        await task

    # The next process finds it in the state file and resumes it at step 2, not step 1.
    standin.new_gate().set()
    done: list[tuple[str, bool]] = []
    second = remediator(tmp_path, on_done=lambda f, _r, applied: done.append((f.rule, applied)))
    assert second.restore() == [key]
    (decision,) = second.resume(snapshot=None, check=lambda f, s: None)
    assert decision.resumed
    stop2 = asyncio.Event()
    task2 = asyncio.create_task(second.run(stop=stop2))
    await wait_until_async(
        "the resumed runbook done", lambda: done == [("rb", True)], timeout=30, step=0.01
    )
    stop2.set()
    await task2
    assert standin.RUNS[("test_count", "rb")] == 2  # steps 1 and 3, each once
    assert standin.RUNS[("test_gate", "rb")] == 2  # step 2 again: it never finished
    (record,) = second.incidents.list()
    assert record["resumed"] == 1
    assert [a["action"] for a in record["actions"]] == ["test_count", "test_gate", "test_count"]


async def test_a_runbook_whose_rule_no_longer_applies_is_abandoned_with_why(
    tmp_path: Path,
) -> None:
    first = remediator(tmp_path)
    assert first.submit(firing("gone", actions=("test_count", "test_count")))
    (key,) = first.journal
    first.journal[key]["next"] = 1  # the first step was done when the agent died
    first.journal[key]["results"] = [{"action": "test_count", "outcome": "done"}]
    first.state.save()
    assert await first.state.persist()  # written before it died
    done: list[tuple[str, bool]] = []
    second = remediator(tmp_path, on_done=lambda f, _r, applied: done.append((f.rule, applied)))
    second.restore()
    (decision,) = second.resume(snapshot=None, check=lambda f, s: "its condition no longer holds")
    assert not decision.resumed and decision.why == "its condition no longer holds"
    assert second.journal == {} and done == [("gone", True)]
    (record,) = second.incidents.list()
    assert record["abandoned"] == "its condition no longer holds"
    assert record["steps_not_run"] == ["test_count"]
    assert [a["outcome"] for a in record["actions"]] == ["done"]


async def test_a_step_under_way_is_finished_though_its_condition_is_gone(tmp_path: Path) -> None:
    # The agent died inside step 2, after it had written ahead what it was doing (an eviction
    # sent: the write may have landed, which is why the hog's condition is gone now). That
    # step runs once more, told it is only finishing; step 3 is not run.
    standin.RUNS.clear()
    standin.FINISHING.clear()
    first = remediator(tmp_path)
    assert first.submit(firing("cut", actions=("test_count", "test_finish", "test_count")))
    (key,) = first.journal
    entry = first.journal[key]
    entry["next"] = 1
    entry["results"] = [{"action": "test_count", "outcome": "done"}]
    entry["progress"] = {"1": {"inflight": {"unit": "pod/ns/hog"}}}
    first.state.save()
    assert await first.state.persist()  # on disk before the "restart" reads it
    done: list[tuple[str, bool]] = []
    second = remediator(tmp_path, on_done=lambda f, _r, applied: done.append((f.rule, applied)))
    second.restore()
    (decision,) = second.resume(snapshot=None, check=lambda f, s: "its condition no longer holds")
    assert decision.resumed
    stop = asyncio.Event()
    task = asyncio.create_task(second.run(stop=stop))
    await wait_until_async(
        "the cut-short runbook done", lambda: done == [("cut", True)], timeout=30, step=0.01
    )
    stop.set()
    await task
    assert standin.FINISHING == [(True, {"inflight": {"unit": "pod/ns/hog"}})]
    assert standin.RUNS[("test_count", "cut")] == 0  # neither step 1 again nor step 3
    (record,) = second.incidents.list()
    assert record["finished_under_way"] == "its condition no longer holds"
    assert record["abandoned"] == "its condition no longer holds"
    assert record["steps_not_run"] == ["test_count"]
    assert record["resumed"] == 1
    assert [a["action"] for a in record["actions"]] == ["test_count", "test_finish"]
    assert second.journal == {}


async def test_a_transient_failure_is_retried_with_backoff_and_later_steps_wait(
    tmp_path: Path,
) -> None:
    standin.RUNS.clear()
    standin.FLAKY["left"] = 3
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    done: list[str] = []
    rem = remediator(
        tmp_path,
        retry_base=5,
        retry_cap=15,
        sleep=sleep,
        on_done=lambda f, _r, _a: done.append(f.rule),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(rem.run(stop=stop))
    rem.submit(firing("flaky", actions=("test_flaky", "test_count")))
    await wait_until_async(
        "the retried runbook done", lambda: done == ["flaky"], timeout=30, step=0.01
    )
    stop.set()
    await task
    assert slept == [5, 10, 15]  # capped exponential backoff
    assert standin.RUNS[("test_flaky", "flaky")] == 4
    assert standin.RUNS[("test_count", "flaky")] == 1  # waited for the step before it
    (record,) = rem.incidents.list()
    assert [a["outcome"] for a in record["actions"]] == ["done", "done"]
    assert len(record["retried"]) == 3


async def test_after_the_resume_window_a_failure_is_final_and_the_runbook_goes_on(
    tmp_path: Path,
) -> None:
    standin.RUNS.clear()
    standin.FLAKY["left"] = 100
    now = {"t": 1000.0}
    done: list[bool] = []
    rem = remediator(
        tmp_path,
        clock=lambda: now["t"],
        resume_window=600,
        on_done=lambda f, _r, applied: done.append(applied),
    )
    rem.submit(firing("late", actions=("test_flaky", "test_count")))
    (key,) = rem.journal
    now["t"] += 601
    results = await rem.handle(key)
    assert results is not None
    assert [(r["action"], r["outcome"]) for r in results] == [
        ("test_flaky", "failed"),
        ("test_count", "done"),
    ]
    assert done == [True]


async def test_a_delivery_claimed_by_another_agent_runs_nothing(tmp_path: Path) -> None:
    standin.RUNS.clear()
    outcomes = iter(["unavailable", "duplicate"])

    async def claim(_f: Firing) -> str:
        return next(outcomes)

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    rem = remediator(tmp_path, claim=claim, sleep=sleep)
    stop = asyncio.Event()
    task = asyncio.create_task(rem.run(stop=stop))
    rem.submit(firing("am", actions=("test_count",), key="fp:1:firing", source="alertmanager"))
    await wait_until_async("the journal empty", lambda: rem.journal == {}, timeout=30, step=0.01)
    stop.set()
    await task
    assert slept == [5.0]  # the API was away once: the claim waited for it
    assert standin.RUNS[("test_count", "am")] == 0
    assert rem.incidents.list() == []


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

        def firings() -> list[dict[str, Any]]:
            # The fixture's kernel log has OOM kills: each is an incident of its own too.
            listing = json.loads(get(f"{base}/incidents")[1])
            return [i for i in listing if i["kind"] != "oom_kill"]

        wait_until("an incident", firings, timeout=30, step=0.05)
        (incident,) = firings()
        assert incident["rule"] == "slab-high" and incident["dry_run"] is True
        assert incident["actions"] == ["record:done"]
        full = json.loads(get(f"{base}/incidents/{incident['id']}")[1])
        assert full["evidence"]["memory"]["slab_unreclaimable_bytes"] == 10 * GiB
        assert get(f"{base}/incidents/nonexistent")[0] == 404
        assert get(f"{base}/incidents/..%2F..%2Fetc%2Fpasswd")[0] == 404
        metrics = get(f"{base}/metrics")[1]
        assert _metric(metrics, "nodeguard_rules_loaded") == 1
        assert 'nodeguard_rule_firings_total{kind="firing",rule="slab-high"} 1.0' in metrics
        # Every result is counted, record's too (it writes no Event without a cluster).
        assert (
            'nodeguard_actions_total{action="record",dry_run="true",outcome="done"} 1.0' in metrics
        )

        rules.write_text(RULES.replace("value: 0.3}", "value: [}"))  # broken YAML
        wait_until(
            "the bad reload counted",
            lambda: _metric(get(f"{base}/metrics")[1], "nodeguard_rules_reload_errors_total") == 1,
            timeout=30,
            step=0.05,
        )
        assert _metric(get(f"{base}/metrics")[1], "nodeguard_rules_loaded") == 1

        second = RULES.split("  rules:\n")[1].replace("slab-high", "slab-high-2")
        rules.write_text(RULES + second)
        wait_until(
            "two rules loaded",
            lambda: _metric(get(f"{base}/metrics")[1], "nodeguard_rules_loaded") == 2,
            timeout=30,
            step=0.05,
        )
        assert _metric(get(f"{base}/metrics")[1], "nodeguard_rules_reloads_total") == 1

        os.kill(base.pid, signal.SIGHUP)
        wait_until(
            "the SIGHUP reload",
            lambda: _metric(get(f"{base}/metrics")[1], "nodeguard_rules_reloads_total") == 2,
            timeout=30,
            step=0.05,
        )


def test_incidents_command_lists_and_shows(tmp_path: Path) -> None:
    import subprocess
    import sys

    store = IncidentStore(directory=tmp_path / "incidents")
    record = store.write(
        firing=firing("slab-high"),
        results=[
            ActionResult(
                action="cordon", node="node-a", dry_run=True, outcome="done", message="would cordon"
            ).to_record()
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
    # Named by the shortest unique start of its id, its time to the second.
    short = record["id"][:15]
    assert "slab-high" in listing and "cordon:done" in listing and short in listing
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "nodeguard",
            "incidents",
            f"--path.state={tmp_path}",
            short,
            "--json",
        ],
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


def _listed(snap: NodeSnapshot | None, *uids: str) -> NodeSnapshot:
    """``snap`` as sampled once the pod list is there: its cgroups named."""
    assert snap is not None
    meta = {
        uid: PodMeta(
            uid=uid,
            name=f"pod-{i}",
            namespace="ml",
            node_name="node-a",
            phase="Running",
            priority=0,
            priority_class="",
            qos_class="burstable",
            memory_request_bytes=GiB,
            memory_limit_bytes=None,
            owners=(),
            labels={},
            annotations={},
            containers={},
            container_requests={},
            mirror=False,
            daemonset=False,
            terminating=False,
        )
        for i, uid in enumerate(uids)
    }
    return dataclasses.replace(snap, pod_meta=meta)


class _Start:
    """An agent's first seconds on a fake clock: the pod list is listed at ``synced_at`` and
    the first sample that names the cgroups from it is taken at ``sampled_at`` (never, with
    ``None``); the remediator's sleeps advance the clock."""

    def __init__(self, first: NodeSnapshot | None, *, synced_at: float | None, sampled_at: float):
        self.now, self.first = 1000.0, first
        self.synced_at, self.sampled_at = synced_at, sampled_at

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)

    def synced(self) -> bool:
        return self.synced_at is not None and self.now >= self.synced_at

    def latest(self) -> NodeSnapshot | None:
        if self.synced() and self.now >= self.sampled_at:
            return _listed(self.first, "uid-a", "uid-b")
        return self.first


async def test_a_step_that_plans_from_pods_waits_for_the_pod_list_then_plans_on_it(
    tmp_path: Path,
) -> None:
    # Decided (or resumed) on the first sample, before the watch's first LIST: the snapshot has
    # no pods. Listed at +2 s, a sample names the cgroups at +4 s: the step runs then, on it.
    standin.PLANNED.clear()
    f = firing("early", actions=("test_count", "test_pods"))
    assert f.snapshot is not None and f.snapshot.pod_meta is None
    start = _Start(f.snapshot, synced_at=1002.0, sampled_at=1004.0)
    env = env_for(None, "node-a", pods_synced=start.synced, latest=start.latest)
    done: list[bool] = []
    unplanned: list[bool] = []
    rem = remediator(
        tmp_path,
        env=env,
        pods_wait=30,
        pods_poll=0.5,
        clock=start.clock,
        sleep=start.sleep,
        on_done=lambda _f, _r, applied: done.append(applied),
        on_unplanned=lambda _f, changed: unplanned.append(changed),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(rem.run(stop=stop))
    rem.submit(f)
    await wait_until_async("the runbook done", lambda: done == [True], timeout=30, step=0.01)
    stop.set()
    await task
    assert standin.PLANNED == [2]  # once, on the two pods listed: never on none
    assert unplanned == []
    (record,) = rem.incidents.list()
    assert [(a["action"], a["outcome"]) for a in record["actions"]] == [
        ("test_count", "done"),
        ("test_pods", "done"),
    ]
    assert "abandoned" not in record


@pytest.mark.parametrize(
    ("synced_at", "missing"),
    [
        (None, "the pod list of node-a has not been listed"),
        (1001.0, "no snapshot has named the cgroups of node-a from its pod list"),
    ],
)
async def test_a_step_whose_pods_never_come_is_abandoned_with_why_and_not_as_done(
    tmp_path: Path, synced_at: float | None, missing: str
) -> None:
    standin.PLANNED.clear()
    f = firing("starved", actions=("test_count", "test_pods", "test_count"))
    start = _Start(f.snapshot, synced_at=synced_at, sampled_at=float("inf"))
    env = env_for(None, "node-a", pods_synced=start.synced, latest=start.latest)
    done: list[bool] = []
    unplanned: list[tuple[str, bool]] = []
    rem = remediator(
        tmp_path,
        env=env,
        pods_wait=30,
        pods_poll=0.5,
        clock=start.clock,
        sleep=start.sleep,
        on_done=lambda _f, _r, applied: done.append(applied),
        on_unplanned=lambda g, changed: unplanned.append((g.rule, changed)),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(rem.run(stop=stop))
    rem.submit(f)
    await wait_until_async("the unplanned claim", lambda: unplanned != [], timeout=30, step=0.01)
    stop.set()
    await task
    assert standin.PLANNED == []  # never planned on no pods
    assert unplanned == [("starved", True)]  # its first step did something: undo owed
    assert done == []  # not fed back as acted: no cooldown starts
    assert start.now >= 1030.0  # it waited its whole bound
    assert rem.journal == {}
    (record,) = rem.incidents.list()
    assert missing in record["abandoned"] and "after 30s" in record["abandoned"]
    assert record["steps_not_run"] == ["test_pods", "test_count"]
    assert [(a["action"], a["outcome"]) for a in record["actions"]] == [
        ("test_count", "done"),
        ("test_pods", "refused"),
    ]
    assert missing in record["actions"][1]["message"]


async def test_without_a_pod_list_of_its_own_a_step_plans_at_once(tmp_path: Path) -> None:
    # nodeguard act (and an agent without a cluster) keeps no pod list: nothing to wait for.
    standin.PLANNED.clear()
    rem = remediator(tmp_path, pods_wait=30)
    rem.submit(firing("act", actions=("test_pods",)))
    (key,) = rem.journal
    results = await rem.handle(key)
    assert results is not None and [r["outcome"] for r in results] == ["done"]
    assert standin.PLANNED == [None]


@pytest.mark.skipif(not can_mount(), reason="mounting a tmpfs needs root")
async def test_no_step_starts_and_nothing_new_is_taken_while_the_state_cannot_be_written(
    tmp_path: Path,
) -> None:
    # Acting on a journal entry that is not on disk is acting more than the next start knows:
    # on a full filesystem a queued runbook waits, a new firing is refused, and both go on
    # once a write succeeds.
    with small_tmpfs(tmp_path / "fs", size=16 * PAGE) as fs:
        state = StateFile(path=fs / "state.json", node="node-a", retry_seconds=0.05)
        rem = remediator(tmp_path, state=state, retry_base=0.05, concurrency=1)
        stop = asyncio.Event()
        task = asyncio.create_task(rem.run(stop=stop))
        assert await state.persist()
        filler = fill(fs)  # nothing left
        # A big enough entry that the write cannot fit anywhere.
        assert rem.submit(firing("waits", actions=("test_count",), time=1.0))
        rem.journal[next(iter(rem.journal))]["padding"] = "x" * (8 * PAGE)
        await asyncio.sleep(0.5)
        assert not state.persisted and state.save_failures >= 1
        assert standin.RUNS[("test_count", "waits")] == 0  # not acted: not on disk
        assert rem.refusal() == "state_not_persisted"
        assert not rem.submit(firing("refused", actions=("test_count",)))
        filler.unlink()
        await wait_until_async(
            "the step run once saved", lambda: standin.RUNS[("test_count", "waits")], timeout=30
        )
        assert standin.RUNS[("test_count", "waits")] == 1 and state.persisted
        assert rem.refusal() is None
        stop.set()
        await task
        state.close()
