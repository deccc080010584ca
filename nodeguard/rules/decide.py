"""One rule on one target at one sample: pending, firing, suppressed, cleared or resolved.

The transitions of :mod:`nodeguard.rules.engine`'s module docstring, on the
:class:`~nodeguard.rules.memory.Memory` of the target: ``when`` held for ``for`` fires once;
a firing target clears on ``clear`` (or on ``when`` no longer holding) and emits its
``resolve``; a cooldown, a busy target or the ``maxFirings`` cap keeps it quiet and is
counted. The values compared are the rule's signals (:mod:`nodeguard.rules.signals`) on the
snapshot.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections import Counter
from typing import Literal

from nodeguard.firing import Firing
from nodeguard.logs import AUDIT
from nodeguard.rules.memory import Memory, TargetState
from nodeguard.rules.schema import Rule
from nodeguard.rules.signals import SIGNALS, History, Target
from nodeguard.snapshot import NodeSnapshot

__all__ = ["Decider", "rule_digest"]

# The rule engine's log lines keep the one logger name they had before it was split in modules.
log = logging.getLogger("nodeguard.rules.engine")


def rule_digest(rule: Rule) -> str:
    """A short digest of a rule's definition: a firing resumed after a restart runs only if
    its rule is still the one that decided it."""
    return hashlib.sha256(rule.model_dump_json(by_alias=True).encode()).hexdigest()[:16]


class Decider:
    """Decides rules on targets (:meth:`step`), in ``memory``, with the signals' ``history``;
    counts firings and suppressions in ``counts`` (``(rule, what)`` -> number)."""

    def __init__(
        self, *, memory: Memory, history: History, counts: Counter[tuple[str, str]]
    ) -> None:
        self._memory, self._history, self._counts = memory, history, counts
        # Rules whose maxFirings cap was logged in this capped spell.
        self._cap_logged: set[str] = set()

    def step(
        self, rule: Rule, target: Target, snapshot: NodeSnapshot, *, now: float, dry: bool
    ) -> Firing | None:
        """``rule`` on ``target`` at ``now`` (clock seconds): the firing (or resolve) to act
        on, if any. ``dry``: the global dry run (a rule's own adds to it)."""
        conds = [*rule.when, *(rule.clear or [])]
        values = {c.signal: SIGNALS[c.signal].fn(snapshot, self._history, target) for c in conds}
        holds = all(c.holds(values[c.signal]) for c in rule.when)
        memory = self._memory
        st = memory.states.setdefault((rule.name, target.key), TargetState())

        def make(kind: Literal["firing", "resolved"]) -> Firing:
            return _firing(rule, target, snapshot, values=values, kind=kind, dry=dry)

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
                    memory.save()
                    self._counts[(rule.name, "resolved")] += 1
                    return make("resolved")
                memory.save()
                return None
            if not holds:
                return None
        elif not holds:
            if st.pending_since is not None:
                st.pending_since = None
                memory.write(now=False)
            return None
        elif st.pending_since is None:
            st.pending_since = now
            memory.write(now=False)
        since = now if st.pending_since is None else st.pending_since
        if now - since < rule.for_ or self._suppressed(rule, target, st, now):
            return None
        st.firing, st.busy, st.last_acted = True, True, now
        self._cap_logged.discard(rule.name)
        memory.fired.setdefault(rule.name, []).append(now)
        memory.save()
        self._counts[(rule.name, "firings")] += 1
        return make("firing")

    def _suppressed(self, rule: Rule, target: Target, st: TargetState, now: float) -> bool:
        """Whether a rule whose conditions have held long enough stays quiet on ``target``:
        busy, in its cooldown (its own, or one held over from before a restart), or at its
        ``maxFirings`` cap (logged once per capped spell). Counts the suppression."""
        if st.last_acted is not None and st.last_acted > now:
            st.last_acted = now  # the clock stepped back: a cooldown from the future never ends
        held_until = self._memory.held_until
        held = held_until.get(rule.name)
        if held is not None and held > now + rule.cooldown:
            held = held_until[rule.name] = now + rule.cooldown  # written ahead of its time
        if (
            st.busy
            or (st.last_acted is not None and now - st.last_acted < rule.cooldown)
            or (held is not None and now < held)
        ):
            self._counts[(rule.name, "suppressed_cooldown")] += 1
            return True
        if self._memory.capped(rule, now=now):
            self._counts[(rule.name, "suppressed_cap")] += 1
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


def _firing(
    rule: Rule,
    target: Target,
    snapshot: NodeSnapshot,
    *,
    values: dict[str, float | None],
    kind: Literal["firing", "resolved"],
    dry: bool,
) -> Firing:
    """The firing (its ``actions``) or resolve (its ``resolve`` steps) of ``rule`` on
    ``target``, with the signal ``values`` that decided it as evidence."""
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


def _fmt(value: float | None) -> str:
    if value is None:
        return "no data"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"
