"""Review of issue 22 point 6: the log rate limiter under many kinds that really repeat.

nodeguard.logs promises "a burst of BURST records of one kind through per WINDOW seconds", with
at most ``_KINDS`` (1024) kinds remembered. A node whose 1,100 containers each make one line a
sample (a cgroup file that cannot be read, say) has 1,100 kinds that repeat: the least recently
seen kind is forgotten just before it comes round again, so every line is "new" and nothing
is ever dropped."""

from __future__ import annotations

import logging

from nodeguard.logs import RepeatFilter


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("nodeguard.test", logging.WARNING, __file__, 1, msg, args, None)


def test_review22_more_repeating_kinds_than_remembered_are_still_rate_limited() -> None:
    repeat = RepeatFilter(burst=5, window=60.0, clock=lambda: 0.0)  # all within one window
    kinds, rounds = 1100, 10
    passed = 0
    for _ in range(rounds):
        for i in range(kinds):
            passed += repeat.filter(_record("cannot read %s: %s", f"/sys/fs/cgroup/c{i}", "EIO"))
    # Each kind repeated 10 times in one window: at most 5 of each reach the log.
    assert passed <= 5 * kinds, f"{passed} of {kinds * rounds} lines let through"
