"""Stand-in actions for testing the remediator apart from the real actions (as oomd tests its
engine with trivial plugins): registered in the real registry under ``test_*`` names."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TYPE_CHECKING

from nodeguard.actions.args import ActionArgs
from nodeguard.actions.base import ActionResult
from nodeguard.actions.registry import ACTIONS, Action, register

if TYPE_CHECKING:
    from nodeguard.actions.context import Call

#: Each stand-in's runs, by action and rule.
RUNS: Counter[tuple[str, str]] = Counter()
#: ``test_gate`` waits for this event (one per test: an Event belongs to one loop).
GATE = {"event": asyncio.Event()}
#: ``test_flaky`` fails (transiently) this many more times.
FLAKY = {"left": 0}
#: ``test_finish``: each run's ``call.finishing`` and the progress it found.
FINISHING: list[tuple[bool, dict[str, object]]] = []


class NoArgs(ActionArgs):
    """No arguments."""


def _result(call: Call, action: str, outcome: str = "done", **kw: object) -> ActionResult:
    return ActionResult(
        action=action,
        node=call.node,
        dry_run=call.dry_run,
        outcome=outcome,  # type: ignore[arg-type]
        message=f"{action} stand-in: {outcome}",
        **kw,  # type: ignore[arg-type]
    )


async def _gate(call: Call, args: NoArgs) -> list[ActionResult]:
    RUNS[("test_gate", call.firing.rule)] += 1
    await GATE["event"].wait()
    return [_result(call, "test_gate")]


def new_gate() -> asyncio.Event:
    """A closed gate for ``test_gate``, bound to the running test's loop."""
    GATE["event"] = asyncio.Event()
    return GATE["event"]


async def _count(call: Call, args: NoArgs) -> list[ActionResult]:
    RUNS[("test_count", call.firing.rule)] += 1
    return [_result(call, "test_count")]


async def _flaky(call: Call, args: NoArgs) -> list[ActionResult]:
    RUNS[("test_flaky", call.firing.rule)] += 1
    if FLAKY["left"] > 0:
        FLAKY["left"] -= 1
        return [_result(call, "test_flaky", "failed", retry=True)]
    return [_result(call, "test_flaky")]


#: What ``test_pods`` planned on: the pods of each run's snapshot (``None``: none listed).
PLANNED: list[int | None] = []


async def _pods(call: Call, args: NoArgs) -> list[ActionResult]:
    snap = call.firing.snapshot
    PLANNED.append(None if snap is None or snap.pod_meta is None else len(snap.pod_meta))
    return [_result(call, "test_pods")]


async def _finish(call: Call, args: NoArgs) -> list[ActionResult]:
    RUNS[("test_finish", call.firing.rule)] += 1
    FINISHING.append((call.finishing, dict(call.progress)))
    return [_result(call, "test_finish")]


_REASONS = dict.fromkeys(("done", "noop", "refused", "blocked", "failed"), "NodeguardTestStandIn")
for _name, _run in (
    ("test_gate", _gate),
    ("test_count", _count),
    ("test_flaky", _flaky),
    ("test_finish", _finish),
):
    if _name not in ACTIONS:
        register(
            Action(
                name=_name,
                summary="a stand-in for tests",
                args=NoArgs,
                run=_run,
                needs_api=False,
                reasons=_REASONS,  # type: ignore[arg-type]
            )
        )
if "test_pods" not in ACTIONS:  # plans from the node's pods, as evict does
    register(
        Action(
            name="test_pods",
            summary="a stand-in for tests",
            args=NoArgs,
            run=_pods,
            needs_api=False,
            needs_pods=True,
            reasons=_REASONS,  # type: ignore[arg-type]
        )
    )
