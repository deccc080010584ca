"""What the remediator tells the rule engine about a firing it was given.

A firing leaves its target ``busy`` (:mod:`nodeguard.rules.engine`: nothing more until it
reports back); one of these ends that: its steps finished (the cooldown starts), it was
abandoned before planning (no cooldown, its ``maxFirings`` count given back), the queue could
not take it (as if it had not fired), or its runbook is gone from the journal. Each changes
the :class:`~nodeguard.rules.memory.Memory` and saves it; a target the engine no longer knows
is left alone.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

from nodeguard.firing import Firing
from nodeguard.rules.memory import Memory

__all__ = ["Feedback"]


class Feedback:
    """The feedback on firings, into ``memory``; ``counts`` are the engine's per-rule
    counters (``(rule, what)`` -> number)."""

    def __init__(self, *, memory: Memory, counts: Counter[tuple[str, str]]) -> None:
        self._memory, self._counts = memory, counts

    def finished(self, firing: Firing, *, at: float, applied: bool) -> None:
        """The firing's steps are done (or abandoned) at ``at`` (clock seconds): see
        :meth:`RuleEngine.finished <nodeguard.rules.engine.RuleEngine.finished>`."""
        st = self._memory.states.get((firing.rule, firing.target))
        if st is None:
            return
        st.busy = False
        if firing.kind == "firing":
            st.last_acted = at
            if not applied:
                st.firing = False
        self._memory.save()

    def unplanned(self, firing: Firing, *, changed: bool) -> None:
        """The firing was abandoned before a step could plan: see
        :meth:`RuleEngine.unplanned <nodeguard.rules.engine.RuleEngine.unplanned>`."""
        st = self._memory.states.get((firing.rule, firing.target))
        if st is None:
            return
        st.busy = False
        if firing.kind == "firing":
            # The firing was counted at the engine's clock (last_acted), not at the
            # snapshot's wall time the firing carries.
            fired_at, st.firing, st.last_acted = st.last_acted, changed, None
            times = self._memory.fired.get(firing.rule)
            if times and fired_at in times:
                times.remove(fired_at)
        self._memory.save()

    def dropped(
        self, firing: Firing, *, reason: Literal["queue_full", "state_not_persisted"]
    ) -> None:
        """The remediator could not take the firing: see
        :meth:`RuleEngine.dropped <nodeguard.rules.engine.RuleEngine.dropped>`."""
        self._counts[(firing.rule, f"suppressed_{reason}")] += 1
        st = self._memory.states.get((firing.rule, firing.target))
        if st is None:
            return
        st.busy = False
        if firing.kind == "resolved":
            st.firing = True  # still to undo: the next sample emits the resolve again
        else:
            st.firing, st.last_acted = False, None
            times = self._memory.fired.get(firing.rule)
            if times:
                times.pop()
        self._memory.save()

    def release(self, *, rule: str, target: str) -> None:
        """Clear "under way" on a target whose runbook is not in the journal."""
        st = self._memory.states.get((rule, target))
        if st is not None and st.busy:
            st.busy = False
            self._memory.save()
