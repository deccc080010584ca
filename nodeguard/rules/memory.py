"""What the rule engine remembers per rule and target, and how it is kept in the state file.

The memory is the state of :mod:`nodeguard.rules.engine`'s module docstring: which targets
fire, whose actions are under way, the last action of each target (cooldowns), each rule's
recent firings (``maxFirings``), the holds from a lost state (:meth:`Memory.hold_all`) and the
first-crossing times (``for``). It lives in the state file's ``rules`` section
(:class:`~nodeguard.statefile.StateFile`): rule name -> ``{"targets": {target key: {"p":
pending since, "f": firing, "b": busy, "a": last acted}}, "fired": [times], "held_until":
time}``, every time in seconds of the engine's clock.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from nodeguard.rules.schema import Rule
from nodeguard.statefile import StateFile

__all__ = ["PENDING_GAP", "Memory", "TargetState"]

# The rule engine's log lines keep the one logger name they had before it was split in modules.
log = logging.getLogger("nodeguard.rules.engine")

#: Seconds between the last save and a restart within which ``for`` windows are kept.
PENDING_GAP = 60.0


@dataclass(slots=True)
class TargetState:
    """One rule on one target: ``pending_since`` (clock seconds its ``when`` first held in
    this spell; ``None``: it does not hold), ``firing`` (it fired and has not cleared),
    ``busy`` (its runbook is under way: nothing more until it reports back), ``last_acted``
    (clock seconds of its last firing: the cooldown runs from there)."""

    pending_since: float | None = None
    firing: bool = False
    busy: bool = False
    last_acted: float | None = None

    def empty(self) -> bool:
        """Whether there is nothing to remember (the state file leaves it out)."""
        return (
            self.pending_since is None
            and not self.firing
            and not self.busy
            and self.last_acted is None
        )


class Memory:
    """The engine's memory (see the module docstring), kept in ``store`` (``None``: in memory
    only, as in tests).

    :attr:`states`: ``(rule, target key)`` -> :class:`TargetState`; :attr:`fired`: rule ->
    the clock seconds of its recent firings; :attr:`held_until`: rule -> clock seconds until
    which it is held on every target (after a lost state file).
    """

    def __init__(self, *, store: StateFile | None) -> None:
        self.store = store
        self.states: dict[tuple[str, str], TargetState] = {}
        self.fired: dict[str, list[float]] = {}
        self.held_until: dict[str, float] = {}

    def load(self) -> bool:
        """Read the ``rules`` section; True when part of it could not be read (then every rule
        is to be held as after a lost state file: :meth:`hold_all`). ``for`` windows are kept
        only when the state was saved less than :data:`PENDING_GAP` seconds ago."""
        if self.store is None:
            return False
        section = self.store.section("rules")
        now = self.store.now()
        keep_pending = self.store.saved_at is not None and now - self.store.saved_at <= PENDING_GAP
        unreadable = False
        for rule, data in section.items():
            try:
                self.fired[rule] = [_time(t, now) for t in data.get("fired", [])]
                if data.get("held_until") is not None:
                    self.held_until[rule] = _time(data["held_until"], now, future=True)
                for target, st in data.get("targets", {}).items():
                    self.states[(rule, target)] = TargetState(
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

    def write(self, *, now: bool) -> None:
        """Put the memory in the ``rules`` section, and save it ``now`` or mark it to be saved
        with the next flush (a ``for`` window's start is not worth a write of its own)."""
        if self.store is None:
            return
        section = self.store.section("rules")
        section.clear()
        for (rule, target), st in self.states.items():
            if st.empty():
                continue
            entry = section.setdefault(rule, {})
            entry.setdefault("targets", {})[target] = {
                "p": st.pending_since,
                "f": st.firing,
                "b": st.busy,
                "a": st.last_acted,
            }
        for rule, times in self.fired.items():
            if times:
                section.setdefault(rule, {})["fired"] = times
        for rule, until in self.held_until.items():
            section.setdefault(rule, {})["held_until"] = until
        if now:
            self.store.save()
        else:
            self.store.touch()

    def save(self) -> None:
        """:meth:`write` and save now."""
        self.write(now=True)

    def keep(self, *, names: Collection[str], changed: Collection[str]) -> None:
        """After a reload: forget the rules not in ``names``; the ``for`` timers of those
        ``changed`` start over. Saved."""
        self.states = {k: v for k, v in self.states.items() if k[0] in names}
        for (rule, _), st in self.states.items():
            if rule in changed:
                st.pending_since = None
        self.fired = {k: v for k, v in self.fired.items() if k in names}
        self.held_until = {k: v for k, v in self.held_until.items() if k in names}
        self.save()

    def hold_all(self, rules: Collection[Rule], *, now: float) -> None:
        """Assume every rule acted at ``now``: each waits a cooldown on every target and has
        one firing counted against ``maxFirings``. Saved."""
        for rule in rules:
            self.held_until[rule.name] = now + rule.cooldown
            self.fired.setdefault(rule.name, []).append(now)
        self.save()

    def mark_firing(self, *, rule: str, target: str) -> bool:
        """Mark ``rule`` as firing on ``target`` (saved); False when it already is."""
        st = self.states.setdefault((rule, target), TargetState())
        if st.firing:
            return False
        st.firing = True
        self.save()
        return True

    def tally(self, names: Iterable[str]) -> dict[str, tuple[int, int]]:
        """Per rule of ``names`` (and any other still remembered): ``(targets pending,
        targets firing)``."""
        out = {name: (0, 0) for name in names}
        for (rule, _), st in self.states.items():
            pending, firing = out.get(rule, (0, 0))
            out[rule] = (
                pending + (st.pending_since is not None and not st.firing),
                firing + st.firing,
            )
        return out

    def capped(self, rule: Rule, *, now: float) -> bool:
        """Whether ``rule`` has fired ``maxFirings.count`` times in its window before ``now``
        (firings out of the window are forgotten)."""
        if rule.max_firings is None:
            return False
        times = [
            min(t, now)  # the clock stepped back: never a firing in the future
            for t in self.fired.get(rule.name, [])
            if t > now - rule.max_firings.window
        ]
        self.fired[rule.name] = times
        return len(times) >= rule.max_firings.count


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
