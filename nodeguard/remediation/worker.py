"""The remediator: a journal of runbooks, and workers that carry them out.

Local rule firings and Alertmanager alerts take this one path. The sampler and the web server
only ever enqueue (:meth:`Remediator.submit` never waits): a slow action — an API server timing
out, a PodDisruptionBudget backoff — never blocks sampling or ``/metrics``. A full queue refuses
the firing (the caller counts it and, for Alertmanager, answers 503 so it retries).

**The journal.** A firing is written to the state file's ``journal`` section when it is
queued, and the entry moves on with every step (``next``: the step to run, ``progress``: what
a step has already done, ``results``: the results so far), saved before and after each step.
An agent killed at any point (kill -9, OOM kill) finds its entries after the restart
(:meth:`Remediator.restore`) and decides each on the first sample (:meth:`Remediator.resume`):
a local rule's firing is resumed from the step it was in when its rule is unchanged and its
condition still holds, a resolve (an undo) always, an alert's or a command's within
``resume_window``; anything else is abandoned, and the incident record says why. A step that
was under way (its ``progress`` not empty) is finished first all the same: its condition may
be gone because its write went through (an eviction sent just before the kill), and that
write is reported, with its Event, once; nothing new is started, the later steps not run. A step is
idempotent (cordon and pause check what is already done; eviction skips the units its progress
lists and finishes gangs recorded on the Node), so a step cut short runs again without acting
twice.

**A state that cannot be written.** While the state file cannot be written (a full or failing
disk: :attr:`StateFile.persisted <nodeguard.statefile.StateFile.persisted>`), nothing new is
taken (:meth:`Remediator.submit` refuses: rules count "not acted", the webhook answers 503 so
Alertmanager retries), and no step starts before the journal entry that announces it is on disk
(:meth:`StateFile.persist <nodeguard.statefile.StateFile.persist>`): a runbook under way waits,
and goes on once a write succeeds. An action's write-ahead record that cannot be written
(:class:`~nodeguard.statefile.StateNotPersisted`) stops its step before the next API call; the
step runs again, from that record, later. Acting on what the next start would not know of is
acting more, never less.

**Retries.** A step whose result is a transient API failure (``retry``) is run again with
capped exponential backoff (``retry_base`` .. ``retry_cap`` seconds) until ``resume_window``
after the firing; later steps wait for it (a cordon before the eviction). After that the
failure is final and the runbook goes on. Nothing is retried faster, and nothing else is
retried: a budget's, a limit's or a PodDisruptionBudget's "no" is the answer for this firing.

**Steps that plan from pods.** An action that reads this node's pods joined to their cgroups
(:attr:`~nodeguard.actions.registry.Action.needs_pods`: ``evict``) has nothing to plan on
before the pod watch's first LIST and a sample after it (the snapshot's ``pod_meta`` is
``None`` until then): an eviction would find no working set, evict nothing, and its rule wait a
cooldown. Such a step, whether of a firing decided on the first samples or of a runbook resumed
after a restart, waits for that data (:meth:`nodeguard.actions.context.Env.pod_data`) up to
``pods_wait`` seconds (the agent's ``--remediation.pod-list-wait``), then plans from the
newest snapshot; past the bound the firing is abandoned with why (a ``refused`` result of the
step, audited: log line, ``nodeguard_actions_total``, an Event on the node; the incident's
``abandoned``), and ``on_unplanned`` is told instead of ``on_done``: nothing was planned, so no
cooldown starts and the rule fires again once the data is there. This is client-go's rule for
controllers (``cache.WaitForCacheSync`` before acting on an informer's cache; acting on an
unsynced one removed every node label in kubernetes-sigs/node-feature-discovery#1817/#1936, and
an informer that reported "synced" when empty made maistra/xns-informer#22 reconcile on no
data), bounded as ovn-kubernetes bounds it (#3763: a sync timeout, then an error, not a wait
for ever).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from nodeguard.actions.base import ActionResult
from nodeguard.actions.context import Call, Env
from nodeguard.actions.registry import dispatch, get, parse_step
from nodeguard.firing import Firing
from nodeguard.logs import AUDIT
from nodeguard.remediation.incidents import IncidentStore, incident_id
from nodeguard.snapshot import NodeSnapshot
from nodeguard.statefile import StateFile, StateNotPersisted
from nodeguard.units import format_duration

__all__ = ["Decision", "Done", "Remediator"]

log = logging.getLogger(__name__)

#: ``on_done(firing, results, applied)``: after a firing's last step (or its abandonment);
#: ``applied``: some step changed something (done) or nothing failed.
Done = Callable[[Firing, list[dict[str, Any]], bool], None]
#: ``check(firing, snapshot)`` -> ``None`` to resume a restored firing, else why not.
Check = Callable[[Firing, NodeSnapshot | None], str | None]
#: ``on_unplanned(firing, changed)``: the firing was abandoned because a step that plans from
#: pods found none within ``pods_wait``; ``changed``: an earlier step did something (a cordon,
#: whose undo is still owed).
Unplanned = Callable[[Firing, bool], None]
#: ``await claim(firing)``: claim an alert's delivery cluster-wide before its first step:
#: ``claimed``/``ours`` go on, ``duplicate``/``stale`` drop it, ``unavailable`` waits.
ClaimFn = Callable[[Firing], Awaitable[str]]
#: ``acting()`` -> ``None`` while this agent acts for its node, else who does
#: (:mod:`nodeguard.remediation.actor`): no step runs until it acts again.
Acting = Callable[[], str | None]
#: ``await claim_release(firing)``: give back the claim of an alert's delivery that nothing
#: acted on (abandoned before planning), so its re-sent copy acts on whichever agent it reaches.
ReleaseFn = Callable[[Firing], Awaitable[object]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """What :meth:`Remediator.resume` did with one restored entry."""

    incident: str
    rule: str
    resumed: bool
    why: str


class Remediator:
    """Runs firings' steps with at most ``concurrency`` firings at once.

    ``global_dry_run`` always wins over a firing's own setting (a rule can only add dry run).
    ``acting()``: checked before a runbook's first step and before each next one; while another
    agent holds the node, the entry waits in the journal. ``state``: the state file holding
    the journal (``None``: in memory). ``pods_wait``: the longest a step that plans from pods
    waits for them (seconds), looking every ``pods_poll`` seconds. ``clock`` (default: the
    state's clock, which a step of the wall clock does not move) and ``sleep`` are injectable
    for tests.
    """

    def __init__(
        self,
        *,
        env: Env,
        incidents: IncidentStore,
        global_dry_run: bool,
        state: StateFile | None = None,
        queue_size: int = 64,
        concurrency: int = 2,
        on_done: Done | None = None,
        resume_window: float = 600.0,
        retry_base: float = 5.0,
        retry_cap: float = 60.0,
        claim: ClaimFn | None = None,
        claim_release: ReleaseFn | None = None,
        pods_wait: float = 30.0,
        pods_poll: float = 0.1,
        on_unplanned: Unplanned | None = None,
        acting: Acting | None = None,
        claim_done: Callable[[Firing], Awaitable[None]] | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.env = env
        self._claim, self._acting, self._claim_done = claim, acting, claim_done
        self._release = claim_release
        self.incidents = incidents
        self.global_dry_run = global_dry_run
        self.state = state if state is not None else StateFile(path=None, node=env.node)
        self.journal = self.state.section("journal")
        self.queue_size = queue_size
        self.concurrency = concurrency
        self.on_done = on_done
        self.on_unplanned = on_unplanned
        self.pods_wait, self.pods_poll = pods_wait, pods_poll
        self._pods_deadline: dict[str, float] = {}
        self.resume_window, self.retry_base, self.retry_cap = resume_window, retry_base, retry_cap
        self._clock, self._sleep = clock or self.state.now, sleep
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._firings: dict[str, Firing] = {}
        self._restored: dict[str, Firing] = {}
        self._waiting: set[asyncio.Task[None]] = set()
        # Set by run(): once set, no step starts (the one under way may finish).
        self._stop: asyncio.Event | None = None
        # The entry each busy worker handles (for the audit line of a step cut short).
        self._handling: dict[asyncio.Task[Any], str] = {}
        self.in_flight = 0
        self.abandoned_total = 0
        self.resumed_total = 0

    # -- queueing ------------------------------------------------------------------------------
    def queued(self) -> int:
        """Firings waiting for a worker (retries waiting for their time not counted)."""
        return self._queue.qsize()

    def full(self) -> bool:
        """Whether :meth:`submit` would refuse now."""
        return self.refusal() is not None

    def refusal(self) -> Literal["queue_full", "state_not_persisted"] | None:
        """Why :meth:`submit` would refuse now: the queue is full, or the state file cannot
        be written (a firing taken now would be unknown to the next start); ``None``: it
        takes."""
        if not self.state.persisted:
            return "state_not_persisted"
        if self._queue.qsize() >= self.queue_size:
            return "queue_full"
        return None

    def submit(self, firing: Firing) -> bool:
        """Journal and queue a firing without waiting; False when the queue is full or the
        state cannot be written (:meth:`refusal`)."""
        if not self.state.persisted:
            log.error(
                "remediation state not written: not acting on %s %s on %s",
                firing.kind,
                firing.rule,
                firing.target,
                extra=AUDIT,
            )
            return False
        if self.full():
            log.error(
                "remediation queue full (%d): dropping %s %s on %s",
                self.queue_size,
                firing.kind,
                firing.rule,
                firing.target,
                extra=AUDIT,
            )
            return False
        key = incident_id(firing)
        while key in self.journal:  # two decisions in one microsecond: keep both
            key += "-1"
        self.journal[key] = {
            "firing": firing.to_record(),
            "next": 0,
            "results": [],
            "progress": {},
            "created": self._clock(),
            "attempts": 0,
        }
        self._firings[key] = firing
        self.state.save()
        self._queue.put_nowait(key)
        return True

    # -- after a restart -----------------------------------------------------------------------
    def restore(self) -> list[str]:
        """Read the journal left by an earlier process: its entries wait for :meth:`resume`.
        An entry that cannot be read is dropped with a warning (and its incident says so)."""
        for key, entry in list(self.journal.items()):
            try:
                firing = Firing.from_record(entry["firing"], parse_step=parse_step)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("journal entry %s unreadable, dropped: %s", key, exc)
                del self.journal[key]
                continue
            self._restored[key] = firing
        if self._restored:
            log.warning(
                "%d runbook(s) under way before the restart: %s",
                len(self._restored),
                ", ".join(sorted(self._restored)),
            )
        self.state.save()
        return sorted(self._restored)

    def restored_firing(self, key: str) -> Firing | None:
        """The firing of a restored (or adopted) entry waiting for :meth:`resume`."""
        return self._restored.get(key)

    def restored_targets(self) -> set[tuple[str, str]]:
        """``(rule, target)`` of the restored entries."""
        return {(f.rule, f.target) for f in self._restored.values()}

    def resume(self, *, snapshot: NodeSnapshot | None, check: Check) -> list[Decision]:
        """Decide each restored entry: ``check(firing, snapshot)`` says why not to resume a
        local rule's firing (``None``: resume); alerts and commands resume within
        ``resume_window``; resolves always resume. Resumed entries go to the queue with the
        fresh snapshot as evidence; the others are abandoned (incident written, ``on_done``),
        but for an entry whose step was under way (its ``progress`` not empty): that step runs
        once more with :attr:`~nodeguard.actions.context.Call.finishing` set, then the entry
        ends (incident ``finished_under_way``: why; ``steps_not_run``)."""
        decisions = []
        now = self._clock()
        for key, firing in sorted(self._restored.items()):
            entry = self.journal.get(key)
            if entry is None:
                continue
            why: str | None
            if firing.kind == "resolved":
                why = None
            elif firing.source == "local":
                why = check(firing, snapshot)
            elif now - float(entry.get("created", 0)) > self.resume_window:
                why = f"decided {now - float(entry.get('created', 0)):.0f}s before the restart"
            else:
                why = None
            index = int(entry.get("next", 0))
            if why is not None and entry.get("progress", {}).get(str(index)):
                # Its step was under way: writes it started may have reached the API server (an
                # eviction sent, then the kill). Run that step once more to finish and report
                # them (every action's resume is idempotent), start nothing new, and abandon
                # the steps after it.
                entry["finishing"] = why
                log.warning(
                    "finishing step %d of %s (%s), under way before the restart: %s",
                    index + 1,
                    key,
                    firing.rule,
                    why,
                )
                why = None
            if why is None:
                fresh = firing.with_snapshot(
                    snapshot if snapshot is not None and snapshot.node_name == firing.node else None
                )
                self._firings[key] = fresh
                entry["resumed"] = int(entry.get("resumed", 0)) + 1
                # Claimed by this agent's last process (or the dead actor it took over from):
                # claimed again as this one, so no third agent takes it over as well.
                entry.pop("claimed", None)
                self._queue.put_nowait(key)
                self.resumed_total += 1
                log.warning("resuming %s (%s) at step %d", key, firing.rule, entry["next"] + 1)
                decisions.append(Decision(incident=key, rule=firing.rule, resumed=True, why=""))
            else:
                self._abandon(key, firing.with_snapshot(snapshot), why=why)
                decisions.append(Decision(incident=key, rule=firing.rule, resumed=False, why=why))
        self._restored.clear()
        self.state.save()
        return decisions

    def _abandon(self, key: str, firing: Firing, *, why: str) -> None:
        entry = self.journal.pop(key, {})
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
        self.abandoned_total += 1
        results = list(entry.get("results", []))
        self.incidents.write(
            firing=firing,
            results=results,
            dry_run=self.global_dry_run or firing.dry_run,
            incident=key,
            extra={"abandoned": why, "steps_not_run": left, "resumed": entry.get("resumed", 0)},
        )
        self._finish(firing, results)

    # -- running -------------------------------------------------------------------------------
    def _finish(self, firing: Firing, results: list[dict[str, Any]]) -> None:
        applied = any(r.get("outcome") == "done" for r in results) or not any(
            r.get("outcome") == "failed" for r in results
        )
        if self.on_done is not None:
            try:
                self.on_done(firing, results, applied)
            except Exception:
                log.exception("remediation feedback for %s failed", firing.rule)

    async def handle(self, key: str) -> list[dict[str, Any]] | None:
        """Run the journal entry ``key`` from its next step; its results, or ``None`` when a
        step waits for a retry (the entry is queued again when its time comes)."""
        entry, firing = self.journal[key], self._firings[key]
        dry = self.global_dry_run or firing.dry_run
        note = f"incident {key}: {firing.summary}"
        if self._held(key, entry):
            return None
        if entry["next"] == 0 and not entry.get("attempts") and not entry.get("audited"):
            # Once per firing: a firing that waits (for its pods, for the state, for its node's
            # Lease) comes here again with nothing tried; the flag is saved with the entry's
            # next save.
            entry["audited"] = True
            log.warning(
                "%s %s%s",
                "resolving" if firing.kind == "resolved" else "acting on",
                firing.summary,
                " (dry run)" if dry else "",
                extra=AUDIT,
            )
        if not await self.state.persist():
            self._wait_for_state(key)  # what the step would act on is not on disk yet
            return None
        if firing.key and self._claim is not None and not entry.get("claimed"):
            claim = await self._claim(firing)
            if claim in ("duplicate", "stale"):
                log.info("%s: delivery handled by another agent (%s): dropped", key, claim)
                self.journal.pop(key, None)
                self._firings.pop(key, None)
                self.state.save()
                return []
            late = self._clock() - float(entry["created"]) > self.resume_window
            if claim == "unavailable" and not late:
                self._retry(key, entry, what="claim", message="the Node cannot be claimed")
                return None
            entry["claimed"] = claim
            self.state.save()
        call = Call(
            env=self.env,
            firing=firing,
            dry_run=dry,
            note=note,
            checkpoint=self.state.checkpoint,
            finishing=bool(entry.get("finishing")),
        )
        while entry["next"] < len(firing.steps):
            index = entry["next"]
            if self.stopping:
                return None  # the agent stops: no new step; the journal keeps the rest
            if self._held(key, entry):
                return None  # lost the node mid-runbook: this step waits, journaled
            if get(firing.steps[index].action).needs_pods:
                ready = self.env.pod_data(firing)
                if ready is None:
                    if self._wait_for_pods(key, firing):
                        return None
                    return await self._unplanned(key, entry, firing, index=index, dry=dry)
                self._pods_deadline.pop(key, None)
                if ready is not firing:  # planned on the first snapshot that names the pods
                    firing = call.firing = self._firings[key] = ready
            call.progress = entry["progress"].setdefault(str(index), {})
            if not await self.state.persist():
                self._wait_for_state(key)
                return None
            try:
                results = await dispatch(call, firing.steps[index])
            except StateNotPersisted:
                self._wait_for_state(key)  # stopped before its next API call: runs again later
                return None
            late = self._clock() - float(entry["created"]) > self.resume_window
            if any(r.retry for r in results) and not late:
                failed = next(r for r in results if r.retry)
                self._retry(key, entry, what=firing.steps[index].action, message=failed.message)
                return None
            entry["results"].extend(r.to_record() for r in results)
            entry["next"], entry["attempts"] = index + 1, 0
            entry.pop("retry_at", None)
            self.state.save()
            if entry.get("finishing"):
                break
        if firing.key and self._claim_done is not None and entry.get("claimed"):
            await self._claim_done(firing)  # done: never taken over by another agent
        self.journal.pop(key, None)
        self._firings.pop(key, None)
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
        self.incidents.write(
            firing=firing, results=entry["results"], dry_run=dry, incident=key, extra=extra
        )
        self.state.save()
        self._finish(firing, entry["results"])
        return list(entry["results"])

    def _wait_for_pods(self, key: str, firing: Firing) -> bool:
        """Whether the entry ``key`` may wait longer for its pods (then it is queued again as
        soon as they are there, or when the wait is over)."""
        now = self._clock()
        deadline = self._pods_deadline.get(key)
        if deadline is None:
            deadline = self._pods_deadline[key] = now + self.pods_wait
            log.warning(
                "%s: %s waits up to %s for the pods of %s: %s",
                key,
                firing.rule,
                format_duration(self.pods_wait),
                firing.node,
                self.env.pod_data_missing(),
            )
        if now >= deadline:
            return False

        async def wait() -> None:
            while self._clock() < deadline and key in self._firings:
                if self.env.pod_data(self._firings[key]) is not None:
                    break
                await self._sleep(self.pods_poll)
            self._queue.put_nowait(key)

        task = asyncio.get_running_loop().create_task(wait(), name=f"pods-{key}")
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)
        return True

    async def _unplanned(
        self, key: str, entry: dict[str, Any], firing: Firing, *, index: int, dry: bool
    ) -> list[dict[str, Any]]:
        """Abandon the entry ``key`` at step ``index``, whose plan found no pods in time: the
        step's ``refused`` result is audited and recorded, the incident says why."""
        self._pods_deadline.pop(key, None)
        step = firing.steps[index]
        action = get(step.action)
        why = (
            f"{step.action} plans from the pods of {firing.node}, and after "
            f"{format_duration(self.pods_wait)} {self.env.pod_data_missing()}: abandoned "
            "rather than planned on no pods (the rule may fire again once they are known)"
        )
        result = ActionResult(
            action=step.action,
            node=firing.node,
            dry_run=dry,
            outcome="refused",
            message=why,
            details={
                "waited_seconds": self.pods_wait,
                "pod_list_synced": bool(self.env.pods_synced and self.env.pods_synced()),
            },
        )
        await self.env.auditor.record(result=result, default_reason=action.reasons["refused"])
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
        self.journal.pop(key, None)
        self._firings.pop(key, None)
        extra: dict[str, Any] = {"abandoned": why, "steps_not_run": left}
        for name in ("resumed", "retried"):
            if entry.get(name):
                extra[name] = entry[name]
        self.incidents.write(firing=firing, results=results, dry_run=dry, incident=key, extra=extra)
        self.state.save()
        changed = any(r.get("outcome") == "done" for r in results)
        if self.on_unplanned is None:
            self._finish(firing, results)
        else:
            try:
                self.on_unplanned(firing, changed)
            except Exception:
                log.exception("remediation feedback for %s failed", firing.rule)
        return results

    def _held(self, key: str, entry: dict[str, Any]) -> bool:
        """Whether another agent holds the node: then the entry says so and waits."""
        holder = self._acting() if self._acting is not None else None
        if holder is None:
            entry.pop("held", None)
            return False
        if entry.get("held") != holder:
            entry["held"] = holder
            self.state.save()
            log.warning("%s: step %d waits: node held by %s", key, entry["next"] + 1, holder)
        self._later(key, self.retry_base)
        return True

    def adopt(self, entries: dict[str, Any]) -> list[str]:
        """Take into the journal the runbooks an agent that died left under way (its journal,
        mirrored on the node's Lease), those not already here; they wait for :meth:`resume`
        like entries restored after a restart. The keys adopted."""
        adopted = []
        for key, entry in sorted(entries.items()):
            if key in self.journal or not isinstance(entry, dict):
                continue
            try:
                firing = Firing.from_record(entry["firing"], parse_step=parse_step)
                int(entry["next"])
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("adopted journal entry %s unreadable, dropped: %s", key, exc)
                continue
            entry.pop("held", None)
            self.journal[key] = entry
            self._restored[key] = firing
            adopted.append(key)
        if adopted:
            log.warning("adopted %d runbook(s) of the last actor: %s", len(adopted), adopted)
            self.state.save()
        return adopted

    def _retry(self, key: str, entry: dict[str, Any], *, what: str, message: str) -> None:
        entry["attempts"] = int(entry.get("attempts", 0)) + 1
        delay = min(self.retry_base * 2 ** (entry["attempts"] - 1), self.retry_cap)
        entry["retry_at"] = self._clock() + delay
        entry.setdefault("retried", []).append([what, message[:300]])
        del entry["retried"][:-10]
        self.state.save()
        log.warning("%s: %s failed (%s); trying again in %.0fs", key, what, message, delay)
        self._later(key, delay)

    def _wait_for_state(self, key: str) -> None:
        """Run ``key`` again once the state may be written (no attempt counted: nothing was
        tried)."""
        log.warning("%s waits: the remediation state cannot be written", key)
        self._later(key, self.retry_base)

    def _later(self, key: str, delay: float) -> None:
        async def wait() -> None:
            await self._sleep(delay)
            self._queue.put_nowait(key)

        task = asyncio.get_running_loop().create_task(wait(), name=f"retry-{key}")
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

    @property
    def stopping(self) -> bool:
        """Whether :meth:`run` was told to stop: no step starts any more."""
        return self._stop is not None and self._stop.is_set()

    async def _worker(self) -> None:
        while not self.stopping:
            key = await self._queue.get()
            if self.stopping:
                self._queue.task_done()  # taken as the stop came: the journal keeps it
                return
            self.in_flight += 1
            task = asyncio.current_task()
            assert task is not None
            self._handling[task] = key
            try:
                if key in self.journal and key in self._firings:
                    await self.handle(key)
            except asyncio.CancelledError:
                self._cut_short(key)
                raise
            except Exception:
                # A bug in an action: record the entry as failed rather than retry it forever.
                log.exception("remediation %s failed", key)
                firing = self._firings.pop(key, None)
                entry = self.journal.pop(key, None)
                if firing is not None and entry is not None:
                    results = [
                        *entry.get("results", []),
                        ActionResult(
                            action=firing.steps[min(entry["next"], len(firing.steps) - 1)].action,
                            node=firing.node,
                            dry_run=self.global_dry_run or firing.dry_run,
                            outcome="failed",
                            message="internal error: see the agent's log",
                        ).to_record(),
                    ]
                    self.incidents.write(
                        firing=firing, results=results, incident=key, extra={"internal_error": True}
                    )
                    self.state.save()
                    self._finish(firing, results)
            finally:
                self._handling.pop(task, None)
                self.in_flight -= 1
                self._queue.task_done()

    def _cut_short(self, key: str) -> None:
        """The audit line of a step cancelled under way (the stop's grace is over, or the
        process is going down): its journal entry stays, for the next start."""
        entry, firing = self.journal.get(key), self._firings.get(key)
        if entry is None or firing is None:
            return
        index = min(int(entry.get("next", 0)), len(firing.steps) - 1)
        log.warning(
            "%s (%s): step %d (%s) cut short by the stop; it stays in the journal and is "
            "finished at the next start",
            key,
            firing.rule,
            index + 1,
            firing.steps[index].action,
            extra=AUDIT,
        )

    async def run(self, *, stop: asyncio.Event, grace: float | None = None) -> None:
        """Run the workers until ``stop`` is set. Then nothing new starts: idle workers and
        waiting firings end at once, and a step under way may finish (its API calls answered,
        its Events written) for ``grace`` seconds (``None``: until this task is cancelled, as
        the agent does after ``--shutdown.timeout``); what is still under way then is
        cancelled, with an audit line. What is queued or under way stays in the journal, for
        the next start."""
        self._stop = stop
        # Events an earlier process kept for a later try (its last calls timed out): now,
        # beside the workers (an API server that is away does not hold them up).
        flush = asyncio.create_task(self.env.auditor.flush(), name="events-flush")
        self._waiting.add(flush)
        flush.add_done_callback(self._waiting.discard)
        workers = [
            asyncio.create_task(self._worker(), name=f"remediator-{i}")
            for i in range(self.concurrency)
        ]
        try:
            await stop.wait()
            busy = set(self._handling)
            for w in [*self._waiting, *(w for w in workers if w not in busy)]:
                w.cancel()
            if busy:
                await asyncio.wait(busy, timeout=grace)
        finally:
            for w in [*workers, *self._waiting]:
                w.cancel()
            for w in [*workers, *self._waiting]:
                with contextlib.suppress(asyncio.CancelledError):
                    await w
            self.state.save()
