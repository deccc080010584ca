"""The rule engine's semantics on a fake clock (snapshot timestamps), with stand-in signals."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nodeguard.actions.limits import EvictionBackoff, EvictionLimiter
from nodeguard.rules.engine import RuleEngine
from nodeguard.rules.schema import Rule
from nodeguard.rules.signals import SHARE, SIGNALS, register
from nodeguard.snapshot import ContainerMemory, NodeSnapshot, PodMemory
from nodeguard.statefile import MAX_BYTES, StateFile
from tests.support.hosts import cgroup_memory
from tests.support.state import state_at

# Stand-in signals: the node's value and each container's value come from these dicts, set by
# the test before each step.
NODE: dict[str, float | None] = {"v": None}
CONTAINERS: dict[str, float] = {}

if "test_node_value" not in SIGNALS:
    register(
        "test_node_value",
        scope="node",
        unit="ratio",
        valid=SHARE,
        help="stand-in",
        fn=lambda _s, _h, _t: NODE["v"],
    )
    register(
        "test_container_value",
        scope="container",
        unit="ratio",
        valid=SHARE,
        help="stand-in",
        fn=lambda _s, _h, t: CONTAINERS.get(t.key),
    )


def rule(**over: Any) -> Rule:
    data: dict[str, Any] = {
        "name": "r",
        "scope": "node",
        "when": [{"signal": "test_node_value", "op": ">", "value": 0.5}],
        "actions": [{"action": "record"}],
        "cooldown": "0s",
    }
    data.update(over)
    return Rule.model_validate(data)


def snap(t: float, containers: tuple[str, ...] = ()) -> NodeSnapshot:
    pods = tuple(
        PodMemory(
            uid=f"pod{c}",
            qos_class="burstable",
            memory=cgroup_memory(f"/p{c}", used=1),
            containers=(
                ContainerMemory(
                    container_id=c, runtime="", memory=cgroup_memory(f"/p{c}/{c}", used=1)
                ),
            ),
        )
        for c in containers
    )
    return NodeSnapshot(
        timestamp=t,
        node_name="node-a",
        meminfo=None,
        pressure=None,
        pods=pods,
        oom=None,
        processes=(),
        collectors=(),
    )


def step(engine: RuleEngine, t: float, value: float | None, *, dry: bool = False) -> list[Any]:
    NODE["v"] = value
    return engine.evaluate(snap(t), global_dry_run=dry)


def test_for_duration_and_reset_when_the_value_drops_back() -> None:
    engine = RuleEngine(rules=[rule(**{"for": "30s"})])
    assert step(engine, 0, 0.9) == []
    assert step(engine, 20, 0.9) == []
    assert step(engine, 25, 0.1) == []  # dropped back: the first crossing resets
    assert step(engine, 30, 0.9) == []  # crossed again at t=30
    assert step(engine, 55, 0.9) == []
    fired = step(engine, 60, 0.9)
    assert [(f.rule, f.kind, f.target, f.node) for f in fired] == [
        ("r", "firing", "node-a", "node-a")
    ]
    assert fired[0].values == {"test_node_value": 0.9}
    assert "test_node_value > 0.5 (is 0.9)" in fired[0].summary
    assert engine.state() == {"r": (0, 1)}


def test_no_data_never_holds() -> None:
    engine = RuleEngine(rules=[rule()])
    assert step(engine, 0, None) == []


def test_fires_once_while_busy_then_after_cooldown() -> None:
    engine = RuleEngine(rules=[rule(cooldown="60s")])
    first = step(engine, 0, 0.9)
    assert len(first) == 1
    assert step(engine, 10, 0.9) == []  # its actions have not finished
    engine.finished(first[0], at=20)
    assert step(engine, 50, 0.9) == []  # cooldown counts from the end of the actions
    assert engine.counts[("r", "suppressed_cooldown")] == 1
    again = step(engine, 80, 0.9)
    assert [f.kind for f in again] == ["firing"]


def test_hysteresis_and_resolve_actions() -> None:
    r = rule(
        clear=[{"signal": "test_node_value", "op": "<", "value": 0.3}],
        resolve=[{"action": "uncordon"}],
        actions=[{"action": "cordon"}],
    )
    engine = RuleEngine(rules=[r])
    fired = step(engine, 0, 0.9)
    engine.finished(fired[0], at=0)
    assert step(engine, 10, 0.4) == []  # below 0.5 but not below 0.3: still firing
    assert engine.state() == {"r": (0, 1)}
    resolved = step(engine, 20, 0.2)
    assert [(f.kind, [a.action for a in f.steps]) for f in resolved] == [("resolved", ["uncordon"])]
    assert "cleared: test_node_value < 0.3 (is 0.2)" in resolved[0].summary
    assert engine.state() == {"r": (0, 0)}
    assert step(engine, 30, 0.25) == []


def test_without_clear_it_resolves_when_when_stops_holding() -> None:
    engine = RuleEngine(rules=[rule(resolve=[{"action": "record"}])])
    engine.finished(step(engine, 0, 0.9)[0], at=0)
    assert [f.kind for f in step(engine, 5, 0.4)] == ["resolved"]


def test_one_firing_per_target_and_the_cap() -> None:
    r = rule(
        scope="container",
        when=[{"signal": "test_container_value", "op": ">=", "value": 0.95}],
        maxFirings={"count": 2, "window": "10m"},
        cooldown="1h",
    )
    engine = RuleEngine(rules=[r])
    CONTAINERS.clear()
    CONTAINERS.update({"poda/a": 0.99, "podb/b": 0.97, "podc/c": 0.96, "podd/d": 0.5})
    fired = engine.evaluate(snap(0, ("a", "b", "c", "d")), global_dry_run=False)
    assert [(f.target, f.pod_uid, f.container_id) for f in fired] == [
        ("poda/a", "poda", "a"),
        ("podb/b", "podb", "b"),
    ]
    assert engine.counts[("r", "suppressed_cap")] == 1
    for f in fired:
        engine.finished(f, at=0)
    # The window passes: the third container may fire now; the first two are cooling down.
    later = engine.evaluate(snap(601, ("a", "b", "c", "d")), global_dry_run=False)
    assert [f.target for f in later] == ["podc/c"]


def test_vanished_targets_are_forgotten() -> None:
    r = rule(
        scope="container", when=[{"signal": "test_container_value", "op": ">=", "value": 0.95}]
    )
    engine = RuleEngine(rules=[r])
    CONTAINERS.clear()
    CONTAINERS.update({"poda/a": 0.99})
    (f,) = engine.evaluate(snap(0, ("a",)), global_dry_run=False)
    assert engine.state() == {"r": (0, 1)}
    engine.evaluate(snap(5, ()), global_dry_run=False)
    assert engine.state() == {"r": (0, 1)}  # its runbook is still under way: it reports back
    engine.finished(f, at=6)
    engine.evaluate(snap(7, ()), global_dry_run=False)
    assert engine.state() == {"r": (0, 0)}


@pytest.mark.parametrize(
    ("global_dry", "rule_dry", "expected"),
    [
        (True, None, True),
        (True, False, True),
        (False, True, True),
        (False, None, False),
        (False, False, False),
    ],
)
def test_global_dry_run_always_wins(
    global_dry: bool, rule_dry: bool | None, expected: bool
) -> None:
    engine = RuleEngine(rules=[rule(dryRun=rule_dry)])
    assert step(engine, 0, 0.9, dry=global_dry)[0].dry_run is expected


def test_reload_keeps_state_of_unchanged_rules_only() -> None:
    a = rule(name="a", **{"for": "30s"})
    b = rule(name="b", **{"for": "30s"})
    engine = RuleEngine(rules=[a, b])
    step(engine, 0, 0.9)
    engine.set_rules([a, rule(name="b", **{"for": "40s"})])
    fired = step(engine, 30, 0.9)
    assert [f.rule for f in fired] == ["a"]  # b changed: its timer started over at t=30
    assert [f.rule for f in step(engine, 70, 0.9)] == ["b"]


def test_dropped_firing_can_fire_again() -> None:
    engine = RuleEngine(rules=[rule(cooldown="10m", maxFirings={"count": 1, "window": "1h"})])
    fired = step(engine, 0, 0.9)
    engine.dropped(fired[0])  # the queue was full
    assert engine.counts[("r", "suppressed_queue_full")] == 1
    assert len(step(engine, 5, 0.9)) == 1  # not held back by cooldown or the cap


def test_the_undo_never_overtakes_the_action() -> None:
    engine = RuleEngine(rules=[rule(resolve=[{"action": "uncordon"}])])
    fired = step(engine, 0, 0.9)
    assert step(engine, 5, 0.1) == []  # cleared, but the cordon has not finished
    engine.finished(fired[0], at=6)
    assert [f.kind for f in step(engine, 10, 0.1)] == ["resolved"]


def test_a_dropped_resolve_is_emitted_again() -> None:
    engine = RuleEngine(rules=[rule(resolve=[{"action": "uncordon"}])])
    engine.finished(step(engine, 0, 0.9)[0], at=0)
    resolved = step(engine, 5, 0.1)
    engine.dropped(resolved[0])  # the queue was full
    assert [f.kind for f in step(engine, 10, 0.1)] == ["resolved"]


def test_a_restarted_agent_still_resolves(tmp_path: Any) -> None:
    path = tmp_path / "state.json"
    r = rule(resolve=[{"action": "uncordon"}])
    first = RuleEngine(rules=[r], state=state_at(path=path, node="node-a"))
    first.finished(step(first, 0, 0.9)[0], at=0)
    restarted = RuleEngine(rules=[r], state=state_at(path=path, node="node-a"))
    assert restarted.state() == {"r": (0, 1)}
    (resolved,) = step(restarted, 60, 0.1)
    assert resolved.kind == "resolved"
    restarted.finished(resolved, at=61)
    assert RuleEngine(rules=[r], state=state_at(path=path, node="node-a")).state() == {"r": (0, 0)}


def test_cooldown_and_cap_survive_a_restart(tmp_path: Any) -> None:
    # The fault: cooldown 5m and maxFirings 1/1h, one firing, a restart, a second firing 7 s
    # later. Both the cooldown and the cap are in the state file.
    path = tmp_path / "state.json"
    r = rule(cooldown="5m", maxFirings={"count": 1, "window": "1h"})
    first = RuleEngine(rules=[r], state=state_at(path=path, node="node-a"))
    first.finished(step(first, 0, 0.9)[0], at=1)
    step(first, 2, 0.1)  # cleared
    again = RuleEngine(rules=[r], state=state_at(path=path, node="node-a"))
    assert step(again, 8, 0.9) == []
    assert again.counts[("r", "suppressed_cooldown")] == 1
    assert step(again, 400, 0.9) == []  # the cooldown is over; the cap (1 per hour) is not
    assert again.counts[("r", "suppressed_cap")] == 1
    assert [f.kind for f in step(again, 3700, 0.9)] == ["firing"]


def test_for_windows_survive_a_short_restart_only(tmp_path: Any) -> None:
    path = tmp_path / "state.json"
    clock = {"now": 1000.0}
    r = rule(**{"for": "30s"})
    # Time passes for the wall clock and the boot clock alike (the state's clock runs on it).
    machine = {"clock": lambda: clock["now"], "uptime": lambda: clock["now"]}

    def engine() -> RuleEngine:
        return RuleEngine(
            rules=[r],
            state=state_at(path=path, node="node-a", lazy_seconds=0, **machine),
        )

    first = engine()
    step(first, 1000, 0.9)  # crossed at 1000
    clock["now"] = 1010
    assert step(engine(), 1010, 0.9) == []  # a 10 s restart: the window goes on
    clock["now"] = 1031
    assert [f.kind for f in step(engine(), 1031, 0.9)] == ["firing"]
    second = RuleEngine(
        rules=[rule(name="s", **{"for": "30s"})],
        state=state_at(path=tmp_path / "b.json", node="n", lazy_seconds=0, **machine),
    )
    step(second, 1031, 0.9)
    clock["now"] = 1031 + 600  # ten minutes down: nobody saw whether it dipped
    later = RuleEngine(
        rules=[rule(name="s", **{"for": "30s"})],
        state=state_at(path=tmp_path / "b.json", node="n", **machine),
    )
    assert step(later, clock["now"], 0.9) == []
    assert step(later, clock["now"] + 31, 0.9) != []


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"\xff\xfe garbage",
        b'{"kind": "something-else"}',
        b'{"kind": "nodeguard-remediation-state", "format": 99, "node": "node-a", "sections": {}}',
        b'{"kind": "nodeguard-remediation-state", "format": 1, "node": "node-b", "sections": {}}',
        b'{"kind": "nodeguard-remediation-state", "format": 1, "node": "node-a", "sections": []}',
    ],
    ids=["corrupt", "binary", "foreign", "newer", "other-node", "bad-sections"],
)
def test_an_unusable_state_file_means_acting_less(tmp_path: Any, content: bytes) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(content)
    state = state_at(path=path, node="node-a", clock=lambda: 1000.0)
    assert state.recovered is not None
    assert not path.exists() and list(tmp_path.glob("state.json.bad-*"))  # set aside, kept
    r = rule(cooldown="5m", maxFirings={"count": 2, "window": "1h"})
    engine = RuleEngine(rules=[r], state=state)
    engine.assume_recent(now=1000)
    assert step(engine, 1010, 0.9) == []  # waits a cooldown, as if it had just acted
    (f,) = step(engine, 1301, 0.9)  # then acts, once more of its two an hour
    engine.finished(f, at=1301)
    assert step(engine, 1700, 0.1) == []
    assert step(engine, 1701, 0.9) == [] and engine.counts[("r", "suppressed_cap")] == 1
    state.save()
    assert state_at(path=path, node="node-a").recovered is None  # a good file again


def test_a_failed_firing_that_changed_nothing_fires_again_after_its_cooldown() -> None:
    engine = RuleEngine(rules=[rule(cooldown="1m", resolve=[{"action": "uncordon"}])])
    (f,) = step(engine, 0, 0.9)
    engine.finished(f, at=1, applied=False)  # the API was down: nothing to undo
    assert step(engine, 30, 0.9) == []  # cooldown
    assert [x.kind for x in step(engine, 62, 0.9)] == ["firing"]  # tried again, at its pace


def test_a_reload_that_changes_a_firing_rule_keeps_its_undo() -> None:
    engine = RuleEngine(rules=[rule(resolve=[{"action": "uncordon"}])])
    engine.finished(step(engine, 0, 0.9)[0], at=0)
    engine.set_rules([rule(description="edited", resolve=[{"action": "uncordon"}])])
    assert [f.kind for f in step(engine, 5, 0.1)] == ["resolved"]


def test_one_bad_value_in_the_rule_state_makes_every_rule_wait(tmp_path: Any) -> None:
    # Found by a reviewer: one unreadable entry dropped every rule's cooldown, so the agent
    # acted more after the restart. Now the readable entries stand and every rule waits.
    path = tmp_path / "state.json"
    r = rule(cooldown="1h", maxFirings={"count": 1, "window": "1h"})
    first = RuleEngine(rules=[r], state=state_at(path=path, node="node-a", clock=lambda: 100.0))
    first.finished(step(first, 0, 0.9)[0], at=1)
    data = json.loads(path.read_text())
    data["sections"]["rules"]["old-rule"] = {"fired": ["yesterday"]}
    path.write_text(json.dumps(data))
    again = RuleEngine(rules=[r], state=state_at(path=path, node="node-a", clock=lambda: 100.0))
    assert step(again, 100, 0.1) == [] and step(again, 101, 0.9) == []
    assert step(again, 3000, 0.9) == []  # the cap: one an hour, counted from the first
    # A NaN (Python's JSON reader takes it) makes the whole file unusable: set aside.
    path.write_text(json.dumps(data).replace('"yesterday"', "NaN"))
    assert state_at(path=path, node="node-a").recovered is not None


def test_a_second_agent_on_one_state_directory_is_refused(tmp_path: Any) -> None:
    first = state_at(path=tmp_path / "state.json", node="node-a")
    with pytest.raises(RuntimeError, match="another nodeguard uses the state directory"):
        StateFile(path=tmp_path / "state.json", node="node-a")
    first.release()
    StateFile(path=tmp_path / "state.json", node="node-a").release()


def test_a_huge_state_file_is_set_aside_unread(tmp_path: Any) -> None:
    path = tmp_path / "state.json"
    with open(path, "wb") as f:
        f.truncate(MAX_BYTES + 1)
    state = state_at(path=path, node="node-a")
    assert state.recovered is not None and "too large" in state.recovered


def test_a_clock_that_steps_back_does_not_silence_a_rule() -> None:
    # Found by a reviewer: times written while the clock was ahead held the rule back for the
    # whole jump. A last action "in the future" counts as now.
    engine = RuleEngine(rules=[rule(cooldown="1m")])
    (f,) = step(engine, 10_000, 0.9)
    engine.finished(f, at=10_000)
    step(engine, 10_001, 0.1)  # cleared
    assert step(engine, 500, 0.9) == []  # the clock stepped back 9,500 s: one cooldown...
    assert [x.kind for x in step(engine, 561, 0.9)] == ["firing"]  # ...not 9,500 s


def test_limits_and_backoffs_are_never_longer_than_their_window_after_a_step_back() -> None:
    now = {"t": 10_000.0}
    limiter = EvictionLimiter(max_units=1, window=600, clock=lambda: now["t"])
    backoff = EvictionBackoff(base=10, cap=300, clock=lambda: now["t"])
    limiter.record("n")
    backoff.refused("u")
    now["t"] = 1_000.0  # the clock stepped back
    assert not limiter.allows("n") and backoff.until("u") == 1_300.0
    now["t"] = 1_601.0
    assert limiter.allows("n") and backoff.until("u") is None


@pytest.mark.parametrize("changed", [False, True])
def test_a_firing_abandoned_unplanned_fires_again_at_the_next_sample(changed: bool) -> None:
    # Its eviction found no pods to plan on (the pod list not yet there after a start): it did
    # not act, so neither the 5m cooldown nor the cap of one firing an hour holds it back.
    r = rule(
        cooldown="5m",
        maxFirings={"count": 1, "window": "1h"},
        clear=[{"signal": "test_node_value", "op": "<", "value": 0.3}],
        resolve=[{"action": "uncordon"}],
    )
    engine = RuleEngine(rules=[r])
    (f,) = step(engine, 0, 0.9)
    engine.unplanned(f, changed=changed)
    (again,) = step(engine, 1, 0.9)
    assert again.kind == "firing"
    assert engine.counts[("r", "suppressed_cooldown")] == 0
    assert engine.counts[("r", "suppressed_cap")] == 0
    # That one acted: now the cooldown and the cap hold, as after any firing.
    engine.finished(again, at=2)
    assert step(engine, 3, 0.9) == []
    assert engine.counts[("r", "suppressed_cooldown")] == 1


@pytest.mark.parametrize(("changed", "undo"), [(False, []), (True, ["resolved"])])
def test_an_unplanned_firing_owes_its_undo_only_when_an_earlier_step_changed_something(
    changed: bool, undo: list[str]
) -> None:
    r = rule(
        cooldown="5m",
        clear=[{"signal": "test_node_value", "op": "<", "value": 0.3}],
        resolve=[{"action": "uncordon"}],
    )
    engine = RuleEngine(rules=[r])
    (f,) = step(engine, 0, 0.9)
    engine.unplanned(f, changed=changed)  # changed: its cordon was done before the eviction
    assert [x.kind for x in step(engine, 1, 0.1)] == undo


# -- a wall clock that steps (issue 22, point 5) ------------------------------------------------
# The agent measures durations on the state's clock (boot time); the snapshots carry the wall
# clock, stepped here by an operator or a bad NTP server while the machine's time runs on.


def wall_stepping_engine(r: Rule, boot: dict[str, float]) -> RuleEngine:
    return RuleEngine(rules=[r], clock=lambda: boot["t"])


def test_a_step_back_during_a_for_window_does_not_silence_the_rule() -> None:
    # The fault: the rule waited the size of the step (here 5,000 s) on top of its 30 s.
    boot = {"t": 0.0}
    engine = wall_stepping_engine(rule(**{"for": "30s"}), boot)
    assert step(engine, 10_000, 0.9) == []  # crossed
    boot["t"] = 10
    assert step(engine, 5_010, 0.9) == []  # the wall clock stepped back 5,000 s
    boot["t"] = 31
    assert [f.kind for f in step(engine, 5_031, 0.9)] == ["firing"]  # held 31 s: fires


def test_a_step_forward_skips_neither_a_for_window_nor_a_cooldown() -> None:
    boot = {"t": 0.0}
    engine = wall_stepping_engine(rule(**{"for": "30s"}, cooldown="5m"), boot)
    assert step(engine, 10_000, 0.9) == []
    boot["t"] = 5
    assert step(engine, 13_605, 0.9) == []  # an hour forward: still 5 s of the 30
    boot["t"] = 31
    (f,) = step(engine, 13_631, 0.9)
    engine.finished(f, at=boot["t"])
    boot["t"] = 40
    assert step(engine, 13_640, 0.1) == []  # cleared
    boot["t"] = 80
    assert step(engine, 13_680 + 7200, 0.9) == []  # crossed again, two hours forward
    boot["t"] = 120
    assert step(engine, 13_720 + 7200, 0.9) == []  # 89 s after the action: the cooldown holds
    assert engine.counts[("r", "suppressed_cooldown")] == 1
    boot["t"] = 332
    assert [f.kind for f in step(engine, 13_932 + 7200, 0.9)] == ["firing"]  # 5 min after


def test_a_step_forward_does_not_open_a_max_firings_window() -> None:
    boot = {"t": 0.0}
    engine = wall_stepping_engine(rule(maxFirings={"count": 1, "window": "1h"}), boot)
    (f,) = step(engine, 10_000, 0.9)
    engine.finished(f, at=0)
    boot["t"] = 10
    assert step(engine, 10_010, 0.1) == []
    boot["t"] = 600
    assert step(engine, 10_600 + 86_400, 0.9) == []  # a day forward, ten minutes later: capped
    assert engine.counts[("r", "suppressed_cap")] == 1
    boot["t"] = 3601
    assert [f.kind for f in step(engine, 3_601 - 86_400, 0.9)] == ["firing"]  # and back


def test_a_cooldown_survives_a_restart_across_which_the_wall_clock_stepped(tmp_path: Any) -> None:
    # Killed, restarted 5 s later, while the wall clock jumped two hours ahead: the cooldown
    # (5 min) and the cap (1 an hour) still hold, by the boot time that passed.
    path = tmp_path / "state.json"
    m = {"wall": 1_000_000.0, "up": 100.0}

    def engine() -> tuple[RuleEngine, StateFile]:
        state = state_at(
            path=path, node="node-a", clock=lambda: m["wall"], uptime=lambda: m["up"], boot_id="b"
        )
        r = rule(cooldown="5m", maxFirings={"count": 1, "window": "1h"})
        return RuleEngine(rules=[r], state=state, clock=state.now), state

    first, state = engine()
    (f,) = step(first, m["wall"], 0.9)
    first.finished(f, at=state.now())
    m["wall"] += 7200 + 5
    m["up"] += 5
    again, _ = engine()
    assert step(again, m["wall"], 0.9) == []
    assert again.counts[("r", "suppressed_cooldown")] == 1
    m["wall"] -= 3 * 7200  # and now back, far: neither held longer
    m["up"] += 301
    assert step(again, m["wall"], 0.9) == []  # the cooldown is over; the cap is not
    assert again.counts[("r", "suppressed_cap")] == 1
    m["up"] += 3600
    assert [x.kind for x in step(again, m["wall"], 0.9)] == ["firing"]
