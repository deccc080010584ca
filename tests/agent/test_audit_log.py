"""The log is the audit trail: every action result, firing, refusal and rule-reload error gets
its line, and what the rate limiter drops is always said (issue 22, point 6)."""

from __future__ import annotations

import json
import logging
import re
import urllib.request
from functools import partial
from pathlib import Path

from nodeguard.logs import AUDIT, MAX_KINDS, RepeatFilter
from tests.support.agent import get, running_agent, wait_until

_LINE = "action=%s outcome=%s dry_run=%s node=%s objects=%s message=%r"


def _record(msg: str, *args: object, audit: bool = False) -> logging.LogRecord:
    record = logging.LogRecord("nodeguard.test", logging.INFO, __file__, 1, msg, args, None)
    if audit:
        record.__dict__.update(AUDIT)
    return record


class _Notes(logging.Handler):
    """Collects what the filter's own notes say (they go through the ``nodeguard.logs`` logger)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _notes() -> tuple[_Notes, logging.Logger]:
    handler, logger = _Notes(), logging.getLogger("nodeguard.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)  # the notes keep the level of the lines they stand for
    return handler, logger


def test_thirty_action_results_are_thirty_lines() -> None:
    # One template, the same words thirty times (thirty `record`s of one node): audit lines,
    # every one let through. Before, 5 of them were.
    repeat = RepeatFilter(burst=5, window=60.0, clock=lambda: 0.0)
    args = ("record", "done", "true", "n1", "Node/n1", "recorded")
    passed = [repeat.filter(_record(_LINE, *args, audit=True)) for _ in range(30)]
    assert passed.count(True) == 30 and repeat.suppressed == 0


def test_one_template_saying_different_things_is_not_one_kind() -> None:
    # Thirteen rule-reload errors, each its own file and line: all thirteen are told.
    repeat = RepeatFilter(burst=5, window=60.0, clock=lambda: 0.0)
    msg = "rule reload failed; the last good rules stay in force:\n%s"
    passed = [repeat.filter(_record(msg, f"rules/r.yaml:{i}: for: bad")) for i in range(13)]
    assert passed.count(True) == 13
    # The same error thirteen times really repeats: five, and the rest counted.
    same = [repeat.filter(_record(msg, "rules/r.yaml:99: for: bad")) for _ in range(13)]
    assert same.count(True) == 5 and repeat.suppressed == 8


def test_drops_are_said_even_when_the_line_never_comes_back() -> None:
    now = [0.0]
    repeat = RepeatFilter(burst=2, window=60.0, clock=lambda: now[0])
    handler, logger = _notes()
    try:
        for _ in range(10):
            repeat.filter(_record("disk %s full", "/var"))
        assert handler.lines == []  # the window is still open: nothing to say yet
        now[0] = 61.0
        assert repeat.filter(_record("something else"))  # any later line sweeps
        (note,) = handler.lines
        assert note.startswith("8 more line(s) like this dropped") and note.endswith(
            "disk /var full"
        )
        # A window still open when the agent stops: report_dropped says it at once.
        for _ in range(4):
            repeat.filter(_record("probe %s slow", "healthz"))
        repeat.report_dropped()
        assert handler.lines[-1].startswith("2 more line(s)")
        assert handler.lines[-1].endswith("probe healthz slow")
        repeat.report_dropped()
        assert len(handler.lines) == 2  # said once
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)


def test_a_kind_is_forgotten_for_room_only_once_its_window_ended() -> None:
    # Every kind remembered is inside its window: "first" keeps its count and the kinds that
    # find no room are limited together (their logger and level's overflow).
    now = [0.0]
    repeat = RepeatFilter(burst=1, window=60.0, clock=lambda: now[0])
    handler, logger = _notes()
    try:
        repeat.filter(_record("first"))
        repeat.filter(_record("first"))
        passed = [repeat.filter(_record("line %d", i)) for i in range(1100)]
        # "first" and lines 0-1022 fill the 1024 kinds; of the 77 more, one (the burst) passes.
        assert passed.count(True) == 1023 + 1
        assert not repeat.filter(_record("first"))  # still remembered, still limited
        assert handler.lines == []  # every window still open: nothing to say yet
        now[0] = 61.0
        # "first"'s window has ended: forgotten for the new kind's room, its drops said first;
        # then the sweep says the overflow's.
        assert repeat.filter(_record("new"))
        assert handler.lines == [
            "2 more line(s) like this dropped (logger nodeguard.test) in a 60s window: first",
            "76 line(s) of 76 kind(s) dropped (logger nodeguard.test) in a 60s window, over the "
            "1024 kinds remembered; one: line 1024",
        ]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)


def test_more_repeating_kinds_than_remembered_are_still_rate_limited() -> None:
    # Issue 22 review: 1,100 containers each logging one line a sample (a cgroup file that
    # cannot be read) are 1,100 kinds that repeat. Forgetting the least recently seen kind for
    # room forgot each one just before it came round: all 11,000 lines passed.
    repeat = RepeatFilter(burst=5, window=60.0, clock=lambda: 0.0)
    kinds, rounds = 1100, 10
    passed = 0
    for _ in range(rounds):
        for i in range(kinds):
            passed += repeat.filter(_record("cannot read %s: %s", f"/sys/fs/cgroup/c{i}", "EIO"))
    # 5 of each kind remembered, 5 of the overflow's 76 kinds together.
    assert passed == 5 * MAX_KINDS + 5
    assert len(repeat._kinds) == MAX_KINDS


def test_an_overflow_counts_its_lines_and_its_kinds() -> None:
    repeat = RepeatFilter(burst=1, window=60.0, clock=lambda: 0.0)
    handler, logger = _notes()
    try:
        for i in range(MAX_KINDS):
            repeat.filter(_record("kept %d", i))
        overflow = ["over 0", "over 1", "over 1", "over 2", "over 1"]
        assert [repeat.filter(_record(line)) for line in overflow] == [True] + [False] * 4
        repeat.report_dropped()  # the agent stops: said at once
        assert handler.lines == [
            "4 line(s) of 2 kind(s) dropped (logger nodeguard.test) in a 60s window, over the "
            "1024 kinds remembered; one: over 1"
        ]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)


_RULES = """\
apiVersion: nodeguard.io/v1alpha1
kind: RuleSet
metadata: {name: audit}
spec:
  alerts:
    - name: am-record
      alertname: NodeguardTestRecord
      actions:
        - action: record
"""


def _post(url: str, alerts: list[dict[str, object]]) -> int:
    body = json.dumps({"version": "4", "status": "firing", "alerts": alerts}).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return int(resp.status)


def test_a_real_agent_logs_every_result_of_a_burst(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "am.yaml").write_text(_RULES)
    args = [
        "--interval=200ms",
        "--no-collector.kmsg",
        "--node-name=n1",
        "--webhook.allow-unauthenticated",
        f"--path.state={tmp_path / 'state'}",
        f"--rules={rules}",
    ]
    log_path = tmp_path / "agent.log"
    with running_agent(args=args, log_path=log_path) as base:
        alerts: list[dict[str, object]] = [
            {
                "status": "firing",
                "labels": {"alertname": "NodeguardTestRecord", "node": "n1", "i": str(i)},
                "annotations": {},
                "startsAt": "2026-12-02T05:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "fingerprint": f"{i:016x}",
            }
            for i in range(30)
        ]
        assert _post(f"{base}/webhook/alertmanager", alerts) == 200

        def results() -> int:
            return len(re.findall(r"action=record outcome=\w+", log_path.read_text()))

        def reload_errors(count: int) -> bool:
            return f"nodeguard_rules_reload_errors_total {count}.0" in get(f"{base}/metrics")[1]

        wait_until("30 results logged", lambda: results() >= 30, timeout=60)
        # Thirteen bad versions of the rule file, each a reload error of its own line.
        for i in range(1, 14):
            (rules / "am.yaml").write_text(_RULES + f"    - name: bad{i}\n      nope: {i}\n")
            wait_until(f"reload error {i}", partial(reload_errors, i), timeout=30)
    log = log_path.read_text()
    assert results() == 30
    assert log.count("rule reload failed") == 13, log[-3000:]
