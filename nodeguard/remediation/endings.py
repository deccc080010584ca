"""How a runbook ends: its incident record, its journal entry dropped, its feedback told.

Every way a runbook leaves the journal is here, each writing the incident that says how it
ended: done (its last step run, or the one under way at a restart finished), abandoned after
a restart (its condition gone), abandoned unplanned (its pods never listed in time) and failed
on a bug in an action. The feedback (``on_done``, ``on_unplanned``) is what the rule engine
hears: a cooldown starts after a runbook that planned, none after one that did not.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from nodeguard.actions.base import ActionResult
from nodeguard.actions.context import Env
from nodeguard.actions.registry import get
from nodeguard.firing import Firing
from nodeguard.logs import AUDIT
from nodeguard.remediation.incidents import IncidentStore
from nodeguard.remediation.journal import Journal
from nodeguard.units import format_duration

__all__ = ["Done", "Endings", "ReleaseFn", "Unplanned"]

# The remediator's log lines keep the one logger name they had before it was split in modules.
log = logging.getLogger("nodeguard.remediation.worker")

#: ``on_done(firing, results, applied)``: after a firing's last step (or its abandonment);
#: ``applied``: some step changed something (done) or nothing failed.
Done = Callable[[Firing, list[dict[str, Any]], bool], None]
#: ``on_unplanned(firing, changed)``: the firing was abandoned because a step that plans from
#: pods found none within ``pods_wait``; ``changed``: an earlier step did something (a cordon,
#: whose undo is still owed).
Unplanned = Callable[[Firing, bool], None]
#: ``await claim_release(firing)``: give back the claim of an alert's delivery that nothing
#: acted on (abandoned before planning), so its re-sent copy acts on whichever agent it reaches.
ReleaseFn = Callable[[Firing], Awaitable[object]]


class Endings:
    """Ends the runbooks of ``journal``: writes their incidents to ``incidents`` and tells
    ``on_done`` / ``on_unplanned`` (a failing feedback is logged, never raised).
    ``global_dry_run`` wins over a firing's own; ``env`` audits an unplanned step's refusal;
    ``release`` gives back an unplanned delivery's claim; ``pods_wait``: seconds a step waited
    for its pods, for the refusal's message."""

    def __init__(
        self,
        *,
        journal: Journal,
        incidents: IncidentStore,
        env: Env,
        global_dry_run: bool,
        pods_wait: float,
        on_done: Done | None,
        on_unplanned: Unplanned | None,
        release: ReleaseFn | None,
    ) -> None:
        self._journal, self._incidents, self._env = journal, incidents, env
        self._global_dry_run, self._pods_wait = global_dry_run, pods_wait
        self._on_done, self._on_unplanned, self._release = on_done, on_unplanned, release

    def feedback(self, firing: Firing, results: list[dict[str, Any]]) -> None:
        """Tell ``on_done`` how the firing went."""
        applied = any(r.get("outcome") == "done" for r in results) or not any(
            r.get("outcome") == "failed" for r in results
        )
        if self._on_done is not None:
            try:
                self._on_done(firing, results, applied)
            except Exception:
                log.exception("remediation feedback for %s failed", firing.rule)

    def completed(
        self, key: str, entry: dict[str, Any], firing: Firing, *, dry: bool
    ) -> list[dict[str, Any]]:
        """The runbook ``key`` ran its last step (or, ``finishing``, the one under way at a
        restart): its incident, with the steps not run; its results."""
        self._journal.drop(key)
        extra: dict[str, Any] = {}
        if entry.get("finishing"):
            left = [s.action for s in firing.steps[entry["next"] :]]
            extra.update(finished_under_way=entry["finishing"], steps_not_run=left)
            if left:
                extra["abandoned"] = entry["finishing"]
                log.warning("abandoning %s (%s): steps not run: %s", key, firing.rule, left)
        if entry.get("resumed"):
            extra["resumed"] = entry["resumed"]
        if entry.get("retried"):
            extra["retried"] = entry["retried"]
        self._incidents.write(
            firing=firing, results=entry["results"], dry_run=dry, incident=key, extra=extra
        )
        self._journal.state.save()
        self.feedback(firing, entry["results"])
        return list(entry["results"])

    def abandoned(self, key: str, firing: Firing, *, why: str) -> None:
        """A restored runbook not resumed (``why``): its incident, with the steps not run."""
        entry = self._journal.entries.pop(key, {})
        done_steps = int(entry.get("next", 0))
        left = [s.action for s in firing.steps[done_steps:]]
        log.warning(
            "abandoning %s (%s) after a restart: %s; steps not run: %s",
            key,
            firing.rule,
            why,
            ", ".join(left) or "none",
            extra=AUDIT,
        )
        results = list(entry.get("results", []))
        self._incidents.write(
            firing=firing,
            results=results,
            dry_run=self._global_dry_run or firing.dry_run,
            incident=key,
            extra={"abandoned": why, "steps_not_run": left, "resumed": entry.get("resumed", 0)},
        )
        self.feedback(firing, results)

    async def unplanned(
        self, key: str, entry: dict[str, Any], firing: Firing, *, index: int, dry: bool
    ) -> list[dict[str, Any]]:
        """Abandon ``key`` at step ``index``, whose plan found no pods in time: the step's
        ``refused`` result is audited (log line, metric, Event) and recorded, the incident
        says why; its results."""
        step = firing.steps[index]
        result = _no_pods(
            env=self._env, firing=firing, action=step.action, dry=dry, waited=self._pods_wait
        )
        why = result.message
        reason = get(step.action).reasons["refused"]
        await self._env.auditor.record(result=result, default_reason=reason)
        results = [*entry["results"], result.to_record()]
        left = [s.action for s in firing.steps[index:]]
        log.warning(
            "abandoning %s (%s): %s; steps not run: %s",
            key,
            firing.rule,
            why,
            ", ".join(left),
            extra=AUDIT,
        )
        if entry.get("claimed") and self._release is not None:
            # Nothing acted on the delivery: the claim that names this agent would make its
            # re-sent copy a "duplicate" on every other agent for the claim's whole life.
            await self._release(firing)
        self._journal.drop(key)
        extra: dict[str, Any] = {"abandoned": why, "steps_not_run": left}
        for name in ("resumed", "retried"):
            if entry.get(name):
                extra[name] = entry[name]
        self._incidents.write(
            firing=firing, results=results, dry_run=dry, incident=key, extra=extra
        )
        self._journal.state.save()
        self._tell_unplanned(firing, results)
        return results

    def _tell_unplanned(self, firing: Firing, results: list[dict[str, Any]]) -> None:
        # Without on_unplanned, the rule hears of it as of any other end.
        if self._on_unplanned is None:
            self.feedback(firing, results)
            return
        changed = any(r.get("outcome") == "done" for r in results)
        try:
            self._on_unplanned(firing, changed)
        except Exception:
            log.exception("remediation feedback for %s failed", firing.rule)

    def internal_error(self, key: str) -> None:
        """A bug in an action stopped ``key``: recorded as failed rather than retried for
        ever (the traceback is in the log)."""
        firing = self._journal.firings.pop(key, None)
        entry = self._journal.entries.pop(key, None)
        if firing is None or entry is None:
            return
        failed = _internal_error(firing, step=entry["next"], dry=self._global_dry_run)
        results = [*entry.get("results", []), failed.to_record()]
        self._incidents.write(
            firing=firing, results=results, incident=key, extra={"internal_error": True}
        )
        self._journal.state.save()
        self.feedback(firing, results)


def _no_pods(*, env: Env, firing: Firing, action: str, dry: bool, waited: float) -> ActionResult:
    """The ``refused`` result of ``action``, which plans from the pods of ``firing.node`` and
    found none after ``waited`` seconds (what is missing: ``env.pod_data_missing()``)."""
    why = (
        f"{action} plans from the pods of {firing.node}, and after "
        f"{format_duration(waited)} {env.pod_data_missing()}: abandoned "
        "rather than planned on no pods (the rule may fire again once they are known)"
    )
    return ActionResult(
        action=action,
        node=firing.node,
        dry_run=dry,
        outcome="refused",
        message=why,
        details={
            "waited_seconds": waited,
            "pod_list_synced": bool(env.pods_synced and env.pods_synced()),
        },
    )


def _internal_error(firing: Firing, *, step: int, dry: bool) -> ActionResult:
    """The ``failed`` result of step ``step`` (the last one when past the end) that raised;
    ``dry``: the global dry run (a firing's own adds to it)."""
    return ActionResult(
        action=firing.steps[min(step, len(firing.steps) - 1)].action,
        node=firing.node,
        dry_run=dry or firing.dry_run,
        outcome="failed",
        message="internal error: see the agent's log",
    )
