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

import hashlib
import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from nodeguard.firing import Firing
from nodeguard.logs import AUDIT
from nodeguard.rules.schema import Rule
from nodeguard.rules.signals import SIGNALS, History, Target, targets
from nodeguard.snapshot import NodeSnapshot
from nodeguard.statefile import StateFile

__all__ = ["PENDING_GAP", "Firing", "RuleEngine", "rule_digest"]

log = logging.getLogger(__name__)

#: Seconds between the last save and a restart within which ``for`` windows are kept.
PENDING_GAP = 60.0


def rule_digest(rule: Rule) -> str:
    """A short digest of a rule's definition: a firing resumed after a restart runs only if
    its rule is still the one that decided it."""
    return hashlib.sha256(rule.model_dump_json(by_alias=True).encode()).hexdigest()[:16]


@dataclass(slots=True)
class _State:
    pending_since: float | None = None
    firing: bool = False
    busy: bool = False
    last_acted: float | None = None

    def empty(self) -> bool:
        return (
            self.pending_since is None
            and not self.firing
            and not self.busy
            and self.last_acted is None
        )


class RuleEngine:
    """Evaluates rules on snapshots. ``counts`` holds per-rule counters for the exporter:
    ``firings``, ``resolved``, ``suppressed_cooldown``, ``suppressed_cap``,
    ``suppressed_queue_full``, ``suppressed_state_not_persisted``. ``state``: where the
    engine's state is kept (``None``: in memory only, as in tests). ``clock``: what durations
    are measured on, in seconds (``None``: the snapshots' timestamps)."""

    def __init__(
        self,
        *,
        rules: Sequence[Rule],
        state: StateFile | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.history = History()
        self._store = state
        self._clock = clock
        self._rules: tuple[Rule, ...] = ()
        self._states: dict[tuple[str, str], _State] = {}
        self._fired: dict[str, list[float]] = {}
        self._held_until: dict[str, float] = {}
        self.counts: Counter[tuple[str, str]] = Counter()
        self._cap_logged: set[str] = set()
        unreadable = self._load()
        self.set_rules(rules)
        if unreadable and self._store is not None:
            self.assume_recent(now=self._store.now())  # act less, never more, than it would

    # -- the state file ------------------------------------------------------------------------
    def _load(self) -> bool:
        """Read the ``rules`` section; True when part of it could not be read (then every rule
        is held as after a lost state file: see :meth:`assume_recent`)."""
        if self._store is None:
            return False
        section = self._store.section("rules")
        now = self._store.now()
        keep_pending = (
            self._store.saved_at is not None and now - self._store.saved_at <= PENDING_GAP
        )
        unreadable = False
        for rule, data in section.items():
            try:
                self._fired[rule] = [_time(t, now) for t in data.get("fired", [])]
                if data.get("held_until") is not None:
                    self._held_until[rule] = _time(data["held_until"], now, future=True)
                for target, st in data.get("targets", {}).items():
                    self._states[(rule, target)] = _State(
                        pending_since=_opt_time(st.get("p"), now) if keep_pending else None,
                        firing=bool(st.get("f")),
                        busy=bool(st.get("b")),
                        last_acted=_opt_time(st.get("a"), now),
                    )
            except (AttributeError, TypeError, ValueError) as exc:
                # What a rule did is unknown: the others' records stand, and every rule waits.
                log.warning("rule state of %s unreadable (%s): rules wait a cooldown", rule, exc)
                unreadable = True
        return unreadable

    def _write(self, *, now: bool) -> None:
        if self._store is None:
            return
        section = self._store.section("rules")
        section.clear()
        for (rule, target), st in self._states.items():
            if st.empty():
                continue
            entry = section.setdefault(rule, {})
            entry.setdefault("targets", {})[target] = {
                "p": st.pending_since,
                "f": st.firing,
                "b": st.busy,
                "a": st.last_acted,
            }
        for rule, times in self._fired.items():
            if times:
                section.setdefault(rule, {})["fired"] = times
        for rule, until in self._held_until.items():
            section.setdefault(rule, {})["held_until"] = until
        if now:
            self._store.save()
        else:
            self._store.touch()

    def _save(self) -> None:
        self._write(now=True)

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
        self._states = {k: v for k, v in self._states.items() if k[0] in names}
        for (rule, _), st in self._states.items():
            if rule in changed:
                st.pending_since = None
        self._fired = {k: v for k, v in self._fired.items() if k in names}
        self._held_until = {k: v for k, v in self._held_until.items() if k in names}
        self._rules = tuple(rules)
        self._save()

    def assume_recent(self, *, now: float) -> None:
        """The state file was lost: assume every rule acted just now (each waits a cooldown
        from ``now`` on every target, and has one firing counted against ``maxFirings``)."""
        for rule in self._rules:
            self._held_until[rule.name] = now + rule.cooldown
            self._fired.setdefault(rule.name, []).append(now)
        self._save()

    def adopt(self, *, rule: str, target: str) -> bool:
        """Mark ``rule`` as firing on ``target`` without acting: the cluster shows its action
        (a cordon, a pause) but the state file had lost it, so its resolve must still run when
        the rule clears. False when the rule is unknown or already firing there."""
        if self.rule(rule) is None:
            return False
        st = self._states.setdefault((rule, target), _State())
        if st.firing:
            return False
        st.firing = True
        self._save()
        return True

    def state(self) -> dict[str, tuple[int, int]]:
        """Per rule: ``(targets pending, targets firing)``."""
        out = {r.name: (0, 0) for r in self._rules}
        for (rule, _), st in self._states.items():
            pending, firing = out.get(rule, (0, 0))
            out[rule] = (
                pending + (st.pending_since is not None and not st.firing),
                firing + st.firing,
            )
        return out

    def _count(self, rule: str, what: str) -> None:
        self.counts[(rule, what)] += 1

    def _capped(self, rule: Rule, now: float) -> bool:
        if rule.max_firings is None:
            return False
        times = [
            min(t, now)  # the clock stepped back: never a firing in the future
            for t in self._fired.get(rule.name, [])
            if t > now - rule.max_firings.window
        ]
        self._fired[rule.name] = times
        return len(times) >= rule.max_firings.count

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
        vanished = False
        for rule in self._rules:
            present: set[str] = set()
            for target in targets(snapshot, rule.scope, current=True):
                present.add(target.key)
                firing = self._step(rule, target, snapshot, now, global_dry_run)
                if firing is not None:
                    out.append(firing)
            if snapshot.focused is not None:
                continue  # a target it did not re-read is not gone
            for key in [k for k in self._states if k[0] == rule.name and k[1] not in present]:
                if not self._states[key].busy:  # a runbook under way still reports back
                    del self._states[key]  # the pod or container is gone
                    vanished = True
        if vanished:
            self._save()
        if self._store is not None:
            self._store.flush()
        return out

    def _step(
        self, rule: Rule, target: Target, snapshot: NodeSnapshot, now: float, dry: bool
    ) -> Firing | None:
        conds = [*rule.when, *(rule.clear or [])]
        values = {c.signal: SIGNALS[c.signal].fn(snapshot, self.history, target) for c in conds}
        holds = all(c.holds(values[c.signal]) for c in rule.when)
        st = self._states.setdefault((rule.name, target.key), _State())

        def make(kind: Literal["firing", "resolved"]) -> Firing:
            why = " and ".join(
                f"{c} (is {_fmt(values[c.signal])})"
                for c in (rule.when if kind == "firing" else (rule.clear or rule.when))
            )
            return Firing(
                rule=rule.name,
                kind=kind,
                scope=rule.scope,
                target=target.key,
                node=snapshot.node_name,
                time=snapshot.timestamp,
                steps=tuple(a.step for a in (rule.actions if kind == "firing" else rule.resolve)),
                dry_run=dry or bool(rule.dry_run),
                values=values,
                pod_uid=target.pod.uid if target.pod else None,
                container_id=target.container.container_id if target.container else None,
                summary=f"{rule.name} on {rule.scope} {target.key}: "
                + ("" if kind == "firing" else "cleared: ")
                + why,
                rule_digest=rule_digest(rule),
                snapshot=snapshot,
            )

        if st.firing:
            if st.busy:
                return None  # the undo must never overtake the action it undoes
            cleared = (
                all(c.holds(values[c.signal]) for c in rule.clear) if rule.clear else not holds
            )
            if cleared:
                st.firing, st.pending_since = False, None
                if rule.resolve:
                    st.busy = True  # until the undo is done: the rule cannot re-fire under it
                    self._save()
                    self._count(rule.name, "resolved")
                    return make("resolved")
                self._save()
                return None
            if not holds:
                return None
        elif not holds:
            if st.pending_since is not None:
                st.pending_since = None
                self._write(now=False)
            return None
        elif st.pending_since is None:
            st.pending_since = now
            self._write(now=False)
        since = now if st.pending_since is None else st.pending_since
        if now - since < rule.for_ or self._suppressed(rule, target, st, now):
            return None
        st.firing, st.busy, st.last_acted = True, True, now
        self._cap_logged.discard(rule.name)
        self._fired.setdefault(rule.name, []).append(now)
        self._save()
        self._count(rule.name, "firings")
        return make("firing")

    def _suppressed(self, rule: Rule, target: Target, st: _State, now: float) -> bool:
        """Whether a rule whose conditions have held long enough stays quiet on ``target``:
        busy, in its cooldown (its own, or one held over from before a restart), or at its
        ``maxFirings`` cap (logged once per capped spell). Counts the suppression."""
        if st.last_acted is not None and st.last_acted > now:
            st.last_acted = now  # the clock stepped back: a cooldown from the future never ends
        held = self._held_until.get(rule.name)
        if held is not None and held > now + rule.cooldown:
            held = self._held_until[rule.name] = now + rule.cooldown  # written ahead of its time
        if (
            st.busy
            or (st.last_acted is not None and now - st.last_acted < rule.cooldown)
            or (held is not None and now < held)
        ):
            self._count(rule.name, "suppressed_cooldown")
            return True
        if self._capped(rule, now):
            self._count(rule.name, "suppressed_cap")
            if rule.name in self._cap_logged:
                return True
            self._cap_logged.add(rule.name)  # once per capped spell, not every sample
            log.warning(
                "rule %s reached maxFirings (%d per %.0fs); not firing on %s",
                rule.name,
                rule.max_firings.count if rule.max_firings else 0,
                rule.max_firings.window if rule.max_firings else 0,
                target.key,
                extra=AUDIT,
            )
            return True
        return False

    def finished(self, firing: Firing, *, at: float, applied: bool = True) -> None:
        """Feed back that the firing's steps are done (or abandoned): the cooldown counts from
        ``at``; the target may resolve (after a firing) or fire again (after a resolve).
        ``applied=False``: a firing whose steps all failed changed nothing, so nothing needs
        undoing: the target stops firing and may fire again once the cooldown has passed (an
        API outage is retried at the rule's pace, never in a storm)."""
        st = self._states.get((firing.rule, firing.target))
        if st is None:
            return
        st.busy = False
        if firing.kind == "firing":
            st.last_acted = at
            if not applied:
                st.firing = False
        self._save()

    def unplanned(self, firing: Firing, *, changed: bool) -> None:
        """Feed back that the firing was abandoned before a step could plan (its pods were not
        known in time, :mod:`nodeguard.remediation.worker`): it did not act, so no cooldown
        starts and its ``maxFirings`` count is given back; the target fires again at the next
        sample where its condition holds. ``changed``: an earlier step changed something (a
        cordon): the target stays firing, so its undo still runs when it clears."""
        st = self._states.get((firing.rule, firing.target))
        if st is None:
            return
        st.busy = False
        if firing.kind == "firing":
            # The firing was counted at the engine's clock (last_acted), not at the
            # snapshot's wall time the firing carries.
            fired_at, st.firing, st.last_acted = st.last_acted, changed, None
            times = self._fired.get(firing.rule)
            if times and fired_at in times:
                times.remove(fired_at)
        self._save()

    def dropped(
        self,
        firing: Firing,
        *,
        reason: Literal["queue_full", "state_not_persisted"] = "queue_full",
    ) -> None:
        """The remediator could not take the firing (its queue is full, or the state file
        cannot be written: not acted, since the next start would not know of it): free the
        target so the rule can fire again at the next sample. Counted under ``reason``."""
        self._count(firing.rule, f"suppressed_{reason}")
        st = self._states.get((firing.rule, firing.target))
        if st is None:
            return
        st.busy = False
        if firing.kind == "resolved":
            st.firing = True  # still to undo: the next sample emits the resolve again
        else:
            st.firing, st.last_acted = False, None
            times = self._fired.get(firing.rule)
            if times:
                times.pop()
        self._save()

    def release(self, *, rule: str, target: str) -> None:
        """Clear "under way" on a target whose runbook is not in the journal (nothing will
        report back)."""
        st = self._states.get((rule, target))
        if st is not None and st.busy:
            st.busy = False
            self._save()

    def busy_targets(self) -> list[tuple[str, str]]:
        """``(rule, target)`` pairs whose steps are under way (for a restart's check that each
        has a journal entry)."""
        return [k for k, st in self._states.items() if st.busy]


def _time(value: Any, now: float, *, future: bool = False) -> float:
    """A time from the state file: a finite number of seconds; one after ``now`` (the clock
    went back across the restart) counts as ``now``, unless it may be in the ``future`` (a hold
    until a time). Raises ``ValueError``/``TypeError`` on anything else."""
    if isinstance(value, bool):
        raise TypeError(f"not a time: {value!r}")
    t = float(value)
    if not math.isfinite(t):
        raise ValueError(f"not a time: {value!r}")
    return t if future else min(t, now)


def _opt_time(value: Any, now: float) -> float | None:
    return None if value is None else _time(value, now)


def _fmt(value: float | None) -> str:
    if value is None:
        return "no data"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"
