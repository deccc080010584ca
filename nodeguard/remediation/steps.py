"""One runbook's steps, run from its journal entry: claim, wait, plan, dispatch, retry.

A worker hands :meth:`Steps.handle` a journal key; it runs the entry's steps from ``next``
until the last one is done, or until one has to wait (the node held by another agent, the
state file not writable, a retry's backoff, pods not listed yet): then the entry stays in the
journal and :class:`~nodeguard.remediation.waits.Waits` queues it again when its time comes.
The order of the checks before each step is the safety of the module docstring of
:mod:`nodeguard.remediation.worker`: no step starts before the journal entry that announces it
is on disk, nor while another agent acts for the node.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from nodeguard.actions.context import Call, Env
from nodeguard.actions.registry import dispatch, get
from nodeguard.firing import Firing
from nodeguard.logs import AUDIT
from nodeguard.remediation.endings import Endings
from nodeguard.remediation.journal import Journal
from nodeguard.remediation.pods import PodsWait
from nodeguard.remediation.waits import Timing, Waits
from nodeguard.statefile import StateNotPersisted

__all__ = ["Acting", "ClaimFn", "Steps"]

# The remediator's log lines keep the one logger name they had before it was split in modules.
log = logging.getLogger("nodeguard.remediation.worker")

#: ``await claim(firing)``: claim an alert's delivery cluster-wide before its first step:
#: ``claimed``/``ours`` go on, ``duplicate``/``stale`` drop it, ``unavailable`` waits.
ClaimFn = Callable[[Firing], Awaitable[str]]
#: ``acting()`` -> ``None`` while this agent acts for its node, else who does
#: (:mod:`nodeguard.remediation.actor`): no step runs until it acts again.
Acting = Callable[[], str | None]

Results = list[dict[str, Any]]


class Steps:
    """Runs journal entries' steps (see the module docstring).

    ``claim`` / ``claim_done``: an alert delivery's cluster-wide claim, taken before its first
    step and marked done after its last; ``acting``: who holds the node (``None``: this
    agent); ``stopping()``: whether the agent stops (then no step starts). ``global_dry_run``
    wins over a firing's own.
    """

    def __init__(
        self,
        *,
        env: Env,
        journal: Journal,
        waits: Waits,
        endings: Endings,
        timing: Timing,
        global_dry_run: bool,
        stopping: Callable[[], bool],
        claim: ClaimFn | None,
        claim_done: Callable[[Firing], Awaitable[None]] | None,
        acting: Acting | None,
    ) -> None:
        self._env, self._journal, self._waits, self._endings = env, journal, waits, endings
        self._timing, self._global_dry_run, self._stopping = timing, global_dry_run, stopping
        self._claim, self._claim_done, self._acting = claim, claim_done, acting
        self._pods = PodsWait(env=env, journal=journal, waits=waits, timing=timing)

    async def handle(self, key: str) -> Results | None:
        """Run the journal entry ``key`` from its next step; its results, or ``None`` when a
        step waits (the entry is queued again when its time comes)."""
        entry, firing = self._journal.entries[key], self._journal.firings[key]
        dry = self._global_dry_run or firing.dry_run
        if self._held(key, entry):
            return None
        _audit_once(entry, firing, dry=dry)
        if not await self._journal.state.persist():
            self._wait_for_state(key)  # what the step would act on is not on disk yet
            return None
        claim = await self._claimed(key, entry, firing)
        if claim != "go":
            return [] if claim == "dropped" else None
        call = Call(
            env=self._env,
            firing=firing,
            dry_run=dry,
            note=f"incident {key}: {firing.summary}",
            checkpoint=self._journal.state.checkpoint,
            finishing=bool(entry.get("finishing")),
        )
        while entry["next"] < len(call.firing.steps):
            index = entry["next"]
            if self._stopping():
                return None  # the agent stops: no new step; the journal keeps the rest
            if self._held(key, entry):
                return None  # lost the node mid-runbook: this step waits, journaled
            if get(call.firing.steps[index].action).needs_pods:
                pods = self._pods.plan(key, call)
                if pods == "wait":
                    return None
                if pods == "gone":
                    return await self._endings.unplanned(
                        key, entry, call.firing, index=index, dry=dry
                    )
            if not await self._step(key, entry, call, index=index):
                return None
            if entry.get("finishing"):
                break
        if call.firing.key and self._claim_done is not None and entry.get("claimed"):
            await self._claim_done(call.firing)  # done: never taken over by another agent
        return self._endings.completed(key, entry, call.firing, dry=dry)

    async def _claimed(
        self, key: str, entry: dict[str, Any], firing: Firing
    ) -> Literal["go", "wait", "dropped"]:
        """Claim an alert's delivery before its first step (once: the claim is journaled)."""
        if not firing.key or self._claim is None or entry.get("claimed"):
            return "go"
        claim = await self._claim(firing)
        if claim in ("duplicate", "stale"):
            log.info("%s: delivery handled by another agent (%s): dropped", key, claim)
            self._journal.drop(key)
            self._journal.state.save()
            return "dropped"
        late = self._journal.age(entry) > self._timing.resume_window
        if claim == "unavailable" and not late:
            self._retry(key, entry, what="claim", message="the Node cannot be claimed")
            return "wait"
        entry["claimed"] = claim
        self._journal.state.save()
        return "go"

    async def _step(self, key: str, entry: dict[str, Any], call: Call, *, index: int) -> bool:
        """Run step ``index``; whether it is done (its results journaled, ``next`` moved on)
        rather than waiting (for the state file, or for a retry)."""
        call.progress = entry["progress"].setdefault(str(index), {})
        if not await self._journal.state.persist():
            self._wait_for_state(key)
            return False
        step = call.firing.steps[index]
        try:
            results = await dispatch(call, step)
        except StateNotPersisted:
            self._wait_for_state(key)  # stopped before its next API call: runs again later
            return False
        late = self._journal.age(entry) > self._timing.resume_window
        if any(r.retry for r in results) and not late:
            failed = next(r for r in results if r.retry)
            self._retry(key, entry, what=step.action, message=failed.message)
            return False
        entry["results"].extend(r.to_record() for r in results)
        entry["next"], entry["attempts"] = index + 1, 0
        entry.pop("retry_at", None)
        self._journal.state.save()
        return True

    def _held(self, key: str, entry: dict[str, Any]) -> bool:
        """Whether another agent holds the node: then the entry says so and waits."""
        holder = self._acting() if self._acting is not None else None
        if holder is None:
            entry.pop("held", None)
            return False
        if entry.get("held") != holder:
            entry["held"] = holder
            self._journal.state.save()
            log.warning("%s: step %d waits: node held by %s", key, entry["next"] + 1, holder)
        self._waits.later(key, delay=self._timing.retry_base)
        return True

    def _retry(self, key: str, entry: dict[str, Any], *, what: str, message: str) -> None:
        entry["attempts"] = int(entry.get("attempts", 0)) + 1
        delay = self._timing.backoff(entry["attempts"])
        entry["retry_at"] = self._journal.clock() + delay
        entry.setdefault("retried", []).append([what, message[:300]])
        del entry["retried"][:-10]
        self._journal.state.save()
        log.warning("%s: %s failed (%s); trying again in %.0fs", key, what, message, delay)
        self._waits.later(key, delay=delay)

    def _wait_for_state(self, key: str) -> None:
        """Run ``key`` again once the state may be written (no attempt counted: nothing was
        tried)."""
        log.warning("%s waits: the remediation state cannot be written", key)
        self._waits.later(key, delay=self._timing.retry_base)


def _audit_once(entry: dict[str, Any], firing: Firing, *, dry: bool) -> None:
    # Once per firing: a firing that waits (for its pods, for the state, for its node's
    # Lease) comes here again with nothing tried; the flag is saved with the entry's next
    # save.
    if entry["next"] == 0 and not entry.get("attempts") and not entry.get("audited"):
        entry["audited"] = True
        log.warning(
            "%s %s%s",
            "resolving" if firing.kind == "resolved" else "acting on",
            firing.summary,
            " (dry run)" if dry else "",
            extra=AUDIT,
        )
