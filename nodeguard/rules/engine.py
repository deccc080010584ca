"""The rule engine: snapshots in, :class:`~nodeguard.firing.Firing` out.

For every rule and every target of its scope (oomd's detector semantics):

- ``when`` holds (all conditions) -> the first-crossing time is kept; it resets as soon as the
  value drops back. Held for ``for`` -> the rule fires on that target, once.
- While firing it does not fire again until its actions have finished (their result is fed back
  with :meth:`RuleEngine.finished`) and ``cooldown`` has passed since then, so a rule that
  evicted waits for the eviction and a cooldown's worth of samples before it acts again.
- It stops firing when ``clear`` holds (hysteresis; without ``clear``, when ``when`` no longer
  holds); then ``resolve`` actions, if any, are emitted as a ``resolved`` firing.
- ``maxFirings`` caps firings of a rule over all targets per window; a capped or cooled-down
  firing is counted, never queued.

Durations run on ``clock`` (the agent's: the state file's clock,
:meth:`~nodeguard.statefile.StateFile.now`, which runs with the boot clock and is continued
across restarts by the boot time that passed): a step of the wall clock during a ``for``
window, a cooldown or a ``maxFirings`` window neither shortens nor lengthens it. Without a
``clock`` (tests) time is the snapshots' timestamps, so tests drive the engine with a fake
clock by building snapshots. A firing's ``time`` is always its snapshot's (wall clock: when it
was decided, for incidents). The state means the same after a restart: which targets
fire, whose actions are under way, the last action of each target (cooldowns), each rule's
recent firings (``maxFirings``) and the first-crossing times (``for``) live in the state file's
``rules`` section (:class:`~nodeguard.statefile.StateFile`). A ``for`` window survives a
restart only when the state was saved less than :data:`PENDING_GAP` seconds before it: after a
longer gap nobody watched whether the value dropped back. When the state file could not be used,
every rule waits one cooldown and counts one firing (:meth:`RuleEngine.assume_recent`): acting
less, never more, than with the lost state. Times read back that lie after now (a file
written by a clock that ran ahead) count as now, and a hold as at most one cooldown from now.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Literal

from nodeguard.firing import Firing
from nodeguard.rules.decide import Decider, rule_digest
from nodeguard.rules.feedback import Feedback
from nodeguard.rules.memory import PENDING_GAP, Memory
from nodeguard.rules.schema import Rule
from nodeguard.rules.signals import SIGNALS, History, targets
from nodeguard.snapshot import NodeSnapshot
from nodeguard.statefile import StateFile

__all__ = ["PENDING_GAP", "Firing", "RuleEngine", "rule_digest"]


class RuleEngine:
    """Evaluates rules on snapshots. ``counts`` holds per-rule counters for the exporter:
    ``firings``, ``resolved``, ``suppressed_cooldown``, ``suppressed_cap``,
    ``suppressed_queue_full``, ``suppressed_state_not_persisted``. ``state``: where the
    engine's state is kept (``None``: in memory only, as in tests). ``clock``: what durations
    are measured on, in seconds (``None``: the snapshots' timestamps).

    Its parts: what it remembers (:mod:`~nodeguard.rules.memory`), one rule on one target
    (:mod:`~nodeguard.rules.decide`), what the remediator reports back
    (:mod:`~nodeguard.rules.feedback`).
    """

    def __init__(
        self,
        *,
        rules: Sequence[Rule],
        state: StateFile | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.history = History()
        self._clock = clock
        self._rules: tuple[Rule, ...] = ()
        self.counts: Counter[tuple[str, str]] = Counter()
        self._memory = Memory(store=state)
        self._decider = Decider(memory=self._memory, history=self.history, counts=self.counts)
        self._feedback = Feedback(memory=self._memory, counts=self.counts)
        unreadable = self._memory.load()
        self.set_rules(rules)
        if unreadable and state is not None:
            self.assume_recent(now=state.now())  # act less, never more, than it would

    # -- rules ---------------------------------------------------------------------------------
    @property
    def rules(self) -> tuple[Rule, ...]:
        return self._rules

    def rule(self, name: str) -> Rule | None:
        """The rule in force under ``name``."""
        return next((r for r in self._rules if r.name == name), None)

    def set_rules(self, rules: Sequence[Rule]) -> None:
        """Put new rules in force. A rule that still exists keeps whether it is firing, its
        cooldown and its cap (a reload must not lose the undo of what it did, nor let it act
        again at once); if its definition changed, its ``for`` timers start over. A removed
        rule's state is dropped."""
        old = {r.name: r for r in self._rules}
        names = {r.name for r in rules}
        changed = {r.name for r in rules if r.name in old and old[r.name] != r}
        self._rules = tuple(rules)
        self._memory.keep(names=names, changed=changed)

    def assume_recent(self, *, now: float) -> None:
        """The state file was lost: assume every rule acted just now (each waits a cooldown
        from ``now`` on every target, and has one firing counted against ``maxFirings``)."""
        self._memory.hold_all(self._rules, now=now)

    def adopt(self, *, rule: str, target: str) -> bool:
        """Mark ``rule`` as firing on ``target`` without acting: the cluster shows its action
        (a cordon, a pause) but the state file had lost it, so its resolve must still run when
        the rule clears. False when the rule is unknown or already firing there."""
        if self.rule(rule) is None:
            return False
        return self._memory.mark_firing(rule=rule, target=target)

    def state(self) -> dict[str, tuple[int, int]]:
        """Per rule: ``(targets pending, targets firing)``."""
        return self._memory.tally(r.name for r in self._rules)

    # -- evaluation ----------------------------------------------------------------------------
    def holds(self, *, rule: str, target: str, snapshot: NodeSnapshot) -> bool | None:
        """Whether ``rule``'s ``when`` holds on ``target`` in ``snapshot`` now (a runbook
        resumed after a restart checks this first); ``None`` when the rule or the target is
        not there any more."""
        r = self.rule(rule)
        if r is None:
            return None
        self.history.observe(snapshot)
        for t in targets(snapshot, r.scope):
            if t.key == target:
                return all(c.holds(SIGNALS[c.signal].fn(snapshot, self.history, t)) for c in r.when)
        return None

    def evaluate(self, snapshot: NodeSnapshot, *, global_dry_run: bool) -> list[Firing]:
        """Evaluate every rule on the snapshot; the firings to act on, in rule order. Of a
        focused sample (:mod:`nodeguard.sampler`), only the node and the targets it re-read:
        the others were evaluated on the values it carries."""
        self.history.observe(snapshot)
        now = snapshot.timestamp if self._clock is None else self._clock()
        out: list[Firing] = []
        states = self._memory.states
        vanished = False
        for rule in self._rules:
            present: set[str] = set()
            for target in targets(snapshot, rule.scope, current=True):
                present.add(target.key)
                firing = self._decider.step(rule, target, snapshot, now=now, dry=global_dry_run)
                if firing is not None:
                    out.append(firing)
            if snapshot.focused is not None:
                continue  # a target it did not re-read is not gone
            for key in [k for k in states if k[0] == rule.name and k[1] not in present]:
                if not states[key].busy:  # a runbook under way still reports back
                    del states[key]  # the pod or container is gone
                    vanished = True
        if vanished:
            self._memory.save()
        if self._memory.store is not None:
            self._memory.store.flush()
        return out

    # -- feedback from the remediator ----------------------------------------------------------
    def finished(self, firing: Firing, *, at: float, applied: bool = True) -> None:
        """Feed back that the firing's steps are done (or abandoned): the cooldown counts from
        ``at``; the target may resolve (after a firing) or fire again (after a resolve).
        ``applied=False``: a firing whose steps all failed changed nothing, so nothing needs
        undoing: the target stops firing and may fire again once the cooldown has passed (an
        API outage is retried at the rule's pace, never in a storm)."""
        self._feedback.finished(firing, at=at, applied=applied)

    def unplanned(self, firing: Firing, *, changed: bool) -> None:
        """Feed back that the firing was abandoned before a step could plan (its pods were not
        known in time, :mod:`nodeguard.remediation.worker`): it did not act, so no cooldown
        starts and its ``maxFirings`` count is given back; the target fires again at the next
        sample where its condition holds. ``changed``: an earlier step changed something (a
        cordon): the target stays firing, so its undo still runs when it clears."""
        self._feedback.unplanned(firing, changed=changed)

    def dropped(
        self,
        firing: Firing,
        *,
        reason: Literal["queue_full", "state_not_persisted"] = "queue_full",
    ) -> None:
        """The remediator could not take the firing (its queue is full, or the state file
        cannot be written: not acted, since the next start would not know of it): free the
        target so the rule can fire again at the next sample. Counted under ``reason``."""
        self._feedback.dropped(firing, reason=reason)

    def release(self, *, rule: str, target: str) -> None:
        """Clear "under way" on a target whose runbook is not in the journal (nothing will
        report back)."""
        self._feedback.release(rule=rule, target=target)

    def busy_targets(self) -> list[tuple[str, str]]:
        """``(rule, target)`` pairs whose steps are under way (for a restart's check that each
        has a journal entry)."""
        return [k for k, st in self._memory.states.items() if st.busy]
