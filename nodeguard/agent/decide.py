"""What each snapshot decides: the sampler's listener in ``nodeguard run``.

After a full sample the rule files are looked at (read and parsed in a thread of their own, so
that two reloads never overlap; at once after SIGHUP) and the kernel notifications are kept on
what the snapshot shows. The first snapshot resumes the runbooks the last stop cut short,
before anything new is decided. An observer (another agent holds the node's Lease) decides
nothing; an agent that just took the node over first finishes what the last holder left under
way. Then the rule engine's firings go to the remediator's queue (never awaited).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from nodeguard.actions.context import Env
from nodeguard.remediation.actor import NodeActor
from nodeguard.remediation.oom_incidents import OomIncidents
from nodeguard.remediation.recovery import resume_check
from nodeguard.remediation.trial_memory import TrialMemory
from nodeguard.remediation.worker import Remediator
from nodeguard.rules.engine import RuleEngine
from nodeguard.rules.load import RuleSource
from nodeguard.sampling.focus import Notifications, threshold_levels
from nodeguard.sampling.sampler import Sampler
from nodeguard.snapshot import NodeSnapshot
from nodeguard.statefile import StateFile

__all__ = ["Decisions", "levels"]

log = logging.getLogger(__name__)


def levels(engine: RuleEngine, *, focus_share: float) -> list[float]:
    """The shares of a limit that the kernel notifications watch: the focus share and each
    level the rules compare a working set with."""
    conditions = [(c.signal, c.op, c.value) for r in engine.rules for c in r.when]
    return threshold_levels(conditions=conditions, focus=focus_share)


class Decisions:
    """The sampler's listener (module docstring); :meth:`request_reload` (SIGHUP) has the rule
    files read at the next full sample. ``actor`` is ``None`` without a cluster (this agent
    acts alone), ``source`` without rule files, ``notifications`` with every one turned off;
    ``oom`` records each kernel OOM kill as an incident (every snapshot, before the rules);
    ``trials`` keeps the Katib trial pods' peaks."""

    def __init__(
        self,
        *,
        engine: RuleEngine,
        source: RuleSource | None,
        remediator: Remediator,
        actor: NodeActor | None,
        env: Env,
        state: StateFile,
        sampler: Sampler,
        notifications: Notifications | None,
        dry_run: bool,
        oom: OomIncidents | None = None,
        trials: TrialMemory | None = None,
    ) -> None:
        self._engine, self._source, self._remediator = engine, source, remediator
        self._actor, self._env, self._state = actor, env, state
        self._sampler, self._notifications, self._dry_run = sampler, notifications, dry_run
        self._oom, self._trials = oom, trials
        self._reload_requested = False
        self._first = True
        # Reading and parsing a rule file is bounded (nodeguard.rules.load) but takes up to a
        # second of CPU: off the event loop, in one thread so that two reloads never overlap.
        self._rules_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rules")

    def request_reload(self) -> None:
        """Read the rule files at the next full sample, changed or not (SIGHUP)."""
        self._reload_requested = True

    async def __call__(self, snapshot: NodeSnapshot) -> None:
        if snapshot.focused is None:  # rule files are looked at every interval, not every sample
            await self._full(snapshot)
        if self._oom is not None:
            # Evidence, not action: every agent records the kills it sees, observer or not
            # (one agent a state directory, so one a node's incidents).
            self._oom.observe(snapshot)
        if self._trials is not None:
            try:  # evidence too: every agent, observer or not; never in the way of the rules
                self._trials.observe(snapshot)
            except Exception:
                log.exception("trial memory: this sample's peaks not kept")
        remediator, engine, actor = self._remediator, self._engine, self._actor
        if self._first:
            # Runbooks cut short by the last stop resume (or are abandoned, with why) before
            # anything new is decided.
            self._first = False
            remediator.resume(snapshot=snapshot, check=resume_check(engine))
        if actor is not None and not actor.is_actor():
            return  # an observer decides nothing: the actor's engine does, once
        if actor is not None and actor.inherited is not None:
            self._inherit(actor, snapshot)
        for firing in engine.evaluate(snapshot, global_dry_run=self._dry_run):
            if not remediator.submit(firing):
                engine.dropped(firing, reason=remediator.refusal() or "queue_full")

    async def _full(self, snapshot: NodeSnapshot) -> None:
        """The rule files reloaded where they changed, the notifications kept on ``snapshot``."""
        force, self._reload_requested = self._reload_requested, False
        source, notifications = self._source, self._notifications
        loop = asyncio.get_running_loop()
        if source is not None and await loop.run_in_executor(
            self._rules_thread, functools.partial(source.maybe_reload, force=force)
        ):
            self._engine.set_rules(source.current.rules)
            if notifications is not None:
                share = self._sampler.config.focus_share
                notifications.set_levels(levels(self._engine, focus_share=share))
        if notifications is not None:
            notifications.sync(snapshot)
            self._sampler.refresh_statuses()  # /metrics says what is registered now

    def _inherit(self, actor: NodeActor, snapshot: NodeSnapshot) -> None:
        """Just took the node over from another agent: finish what it left under way."""
        got, actor.inherited = actor.inherited, None
        if got is None or got.same_state:
            return
        env, engine, remediator = self._env, self._engine, self._remediator
        node = env.node
        env.limiter.store[node] = sorted(
            {*map(float, env.limiter.store.get(node, [])), *got.evictions}
        )
        self._state.save()
        if got.lapsed:
            # It was cut off, not stopped: what it did after its last write is unknown.
            engine.assume_recent(now=time.time())
        for key in remediator.adopt(got.journal):
            firing = remediator.restored_firing(key)
            if firing is not None and firing.source == "local":
                engine.adopt(rule=firing.rule, target=firing.target)
        remediator.resume(snapshot=snapshot, check=resume_check(engine))

    def close(self) -> None:
        """Stop the rule files' thread (a read in flight is not waited for)."""
        self._rules_thread.shutdown(wait=False)
