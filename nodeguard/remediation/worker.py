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
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from nodeguard.actions.context import Env
from nodeguard.firing import Firing
from nodeguard.logs import AUDIT
from nodeguard.remediation.endings import Done, Endings, ReleaseFn, Unplanned
from nodeguard.remediation.incidents import IncidentStore
from nodeguard.remediation.journal import Journal
from nodeguard.remediation.resuming import Check, Decision, resume
from nodeguard.remediation.steps import Acting, ClaimFn, Steps
from nodeguard.remediation.waits import Timing, Waits
from nodeguard.remediation.workers import Workers
from nodeguard.snapshot import NodeSnapshot
from nodeguard.statefile import StateFile

__all__ = ["Check", "Decision", "Done", "Remediator"]

log = logging.getLogger(__name__)


class Remediator:
    """Runs firings' steps with at most ``concurrency`` firings at once.

    ``global_dry_run`` always wins over a firing's own setting (a rule can only add dry run).
    ``acting()``: checked before a runbook's first step and before each next one; while another
    agent holds the node, the entry waits in the journal. ``state``: the state file holding
    the journal (``None``: in memory). ``pods_wait``: the longest a step that plans from pods
    waits for them (seconds), looking every ``pods_poll`` seconds. ``clock`` (default: the
    state's clock, which a step of the wall clock does not move) and ``sleep`` are injectable
    for tests.

    The work is done by the collaborators :func:`_parts` builds, each in a module named for
    what it does (the journal, the steps, the endings, the waits, the workers).
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
        self.env, self.incidents, self.global_dry_run = env, incidents, global_dry_run
        self.state = state if state is not None else StateFile(path=None, node=env.node)
        self.queue_size = queue_size
        self.timing = Timing(
            resume_window=resume_window,
            retry_base=retry_base,
            retry_cap=retry_cap,
            pods_wait=pods_wait,
            pods_poll=pods_poll,
        )
        self._journal = Journal(state=self.state, clock=clock or self.state.now)
        #: The journal's entries (the state file's ``journal`` section): incident id -> entry.
        self.journal = self._journal.entries
        self._waits = Waits(clock=self._journal.clock, sleep=sleep)
        self._endings, steps, self._workers = _parts(
            self,
            on_done=on_done,
            on_unplanned=on_unplanned,
            claim=claim,
            claim_release=claim_release,
            claim_done=claim_done,
            acting=acting,
            concurrency=concurrency,
        )
        #: ``await handle(key)``: run the journal entry ``key`` from its next step
        #: (:meth:`~nodeguard.remediation.steps.Steps.handle`): its results, or ``None`` when
        #: a step waits (the entry is queued again when its time comes).
        self.handle = steps.handle
        self.abandoned_total = 0
        self.resumed_total = 0

    # -- queueing ------------------------------------------------------------------------------
    def queued(self) -> int:
        """Firings waiting for a worker (retries waiting for their time not counted)."""
        return self._waits.queue.qsize()

    @property
    def in_flight(self) -> int:
        """Firings a worker is running now."""
        return self._workers.in_flight

    def full(self) -> bool:
        """Whether :meth:`submit` would refuse now."""
        return self.refusal() is not None

    def refusal(self) -> Literal["queue_full", "state_not_persisted"] | None:
        """Why :meth:`submit` would refuse now: the queue is full, or the state file cannot
        be written (a firing taken now would be unknown to the next start); ``None``: it
        takes."""
        if not self.state.persisted:
            return "state_not_persisted"
        if self.queued() >= self.queue_size:
            return "queue_full"
        return None

    def submit(self, firing: Firing) -> bool:
        """Journal and queue a firing without waiting; False when the queue is full or the
        state cannot be written (:meth:`refusal`)."""
        refusal = self.refusal()
        if refusal is not None:
            _say_refused(firing, why=refusal, queue_size=self.queue_size)
            return False
        self._waits.put(self._journal.add(firing))
        return True

    # -- after a restart -----------------------------------------------------------------------
    def restore(self) -> list[str]:
        """Read the journal left by an earlier process: its entries wait for :meth:`resume`.
        An entry that cannot be read is dropped with a warning (and its incident says so)."""
        return self._journal.restore()

    def restored_firing(self, key: str) -> Firing | None:
        """The firing of a restored (or adopted) entry waiting for :meth:`resume`."""
        return self._journal.restored.get(key)

    def restored_targets(self) -> set[tuple[str, str]]:
        """``(rule, target)`` of the restored entries."""
        return {(f.rule, f.target) for f in self._journal.restored.values()}

    def adopt(self, entries: dict[str, Any]) -> list[str]:
        """Take into the journal the runbooks an agent that died left under way (its journal,
        mirrored on the node's Lease), those not already here; they wait for :meth:`resume`
        like entries restored after a restart. The keys adopted."""
        return self._journal.adopt(entries)

    def resume(self, *, snapshot: NodeSnapshot | None, check: Check) -> list[Decision]:
        """Decide each restored entry (:func:`~nodeguard.remediation.resuming.resume`):
        ``check(firing, snapshot)`` says why not to resume a local rule's firing (``None``:
        resume); resumed ones are queued with ``snapshot`` as evidence, the others end."""
        decisions = resume(
            journal=self._journal,
            waits=self._waits,
            endings=self._endings,
            snapshot=snapshot,
            check=check,
            resume_window=self.timing.resume_window,
        )
        self.resumed_total += sum(d.resumed for d in decisions)
        self.abandoned_total += sum(not d.resumed for d in decisions)
        return decisions

    # -- running -------------------------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        """Whether :meth:`run` was told to stop: no step starts any more."""
        return self._workers.stopping

    async def run(self, *, stop: asyncio.Event, grace: float | None = None) -> None:
        """Run the workers until ``stop`` is set, then stop them, letting a step under way
        finish for ``grace`` seconds (:meth:`~nodeguard.remediation.workers.Workers.run`).
        What is queued or under way stays in the journal, for the next start."""
        await self._workers.run(stop=stop, grace=grace)


def _say_refused(
    firing: Firing, *, why: Literal["queue_full", "state_not_persisted"], queue_size: int
) -> None:
    """The audit line of a firing :meth:`Remediator.submit` refuses."""
    if why == "state_not_persisted":
        log.error(
            "remediation state not written: not acting on %s %s on %s",
            firing.kind,
            firing.rule,
            firing.target,
            extra=AUDIT,
        )
    else:
        log.error(
            "remediation queue full (%d): dropping %s %s on %s",
            queue_size,
            firing.kind,
            firing.rule,
            firing.target,
            extra=AUDIT,
        )


def _parts(
    rem: Remediator,
    *,
    on_done: Done | None,
    on_unplanned: Unplanned | None,
    claim: ClaimFn | None,
    claim_release: ReleaseFn | None,
    claim_done: Callable[[Firing], Awaitable[None]] | None,
    acting: Acting | None,
    concurrency: int,
) -> tuple[Endings, Steps, Workers]:
    """The collaborators of ``rem`` (the arguments: :class:`Remediator`'s), on its journal,
    queue and timing."""
    endings = Endings(
        journal=rem._journal,
        incidents=rem.incidents,
        env=rem.env,
        global_dry_run=rem.global_dry_run,
        pods_wait=rem.timing.pods_wait,
        on_done=on_done,
        on_unplanned=on_unplanned,
        release=claim_release,
    )
    steps = Steps(
        env=rem.env,
        journal=rem._journal,
        waits=rem._waits,
        endings=endings,
        timing=rem.timing,
        global_dry_run=rem.global_dry_run,
        stopping=lambda: rem.stopping,
        claim=claim,
        claim_done=claim_done,
        acting=acting,
    )
    workers = Workers(
        env=rem.env,
        journal=rem._journal,
        waits=rem._waits,
        endings=endings,
        handle=steps.handle,
        concurrency=concurrency,
    )
    return endings, steps, workers
