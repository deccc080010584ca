"""The rule engine: snapshots in, :class:`Firing` out.

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

Time is the snapshot's timestamp, so tests drive the engine with a fake clock by building
snapshots.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from nodeguard.rules.schema import ActionSpec, Rule
from nodeguard.rules.signals import SIGNALS, History, Target, targets
from nodeguard.snapshot import NodeSnapshot

__all__ = ["Firing", "RuleEngine"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Firing:
    """A decision to act, from a local rule or an Alertmanager alert: the one type the
    remediator takes.

    ``kind``: ``firing`` runs the rule's actions, ``resolved`` its resolve actions. ``target``
    is the target key (node name, pod UID, ``<pod uid>/<container id>``); ``values`` the
    signal values that decided; ``snapshot`` the sample it was decided on (the evidence);
    ``node`` the node to act on (an alert may name another node than the agent's own);
    ``pod_ref`` ``(namespace, name)`` of the pod an alert names, when it has no UID.
    """

    rule: str
    kind: Literal["firing", "resolved"]
    scope: str
    target: str
    node: str
    time: float
    actions: tuple[ActionSpec, ...]
    dry_run: bool
    values: Mapping[str, float | None] = field(default_factory=dict)
    pod_uid: str | None = None
    container_id: str | None = None
    pod_ref: tuple[str, str] | None = None
    source: Literal["local", "alertmanager"] = "local"
    summary: str = ""
    snapshot: NodeSnapshot | None = None


@dataclass(slots=True)
class _State:
    pending_since: float | None = None
    firing: bool = False
    busy: bool = False
    last_acted: float | None = None


class RuleEngine:
    """Evaluates rules on snapshots. ``counts`` holds per-rule counters for the exporter:
    ``firings``, ``resolved``, ``suppressed_cooldown``, ``suppressed_cap``."""

    def __init__(self, *, rules: Sequence[Rule], state_file: Path | None = None) -> None:
        self.history = History()
        self._state_file = state_file
        self._rules: tuple[Rule, ...] = ()
        self._states: dict[tuple[str, str], _State] = {}
        self._fired: dict[str, deque[float]] = {}
        self.counts: dict[tuple[str, str], int] = {}
        self._cap_logged: set[str] = set()
        self._load()
        self.set_rules(rules)

    # Which (rule, target) pairs are firing is kept in the state directory: an agent restarted
    # while a rule fires must still run its resolve (uncordon, resume Katib) when it clears.
    def _load(self) -> None:
        if self._state_file is None or not self._state_file.exists():
            return
        try:
            data = json.loads(self._state_file.read_text())
            for rule, target in data.get("firing", []):
                self._states[(str(rule), str(target))] = _State(firing=True)
        except (OSError, ValueError, TypeError) as exc:
            log.warning("ignoring unreadable rule state %s: %s", self._state_file, exc)

    def _save(self) -> None:
        if self._state_file is None:
            return
        firing = sorted([list(k) for k, st in self._states.items() if st.firing])
        try:
            tmp = self._state_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"firing": firing}))
            os.replace(tmp, self._state_file)
        except OSError as exc:
            log.warning("cannot keep rule state in %s: %s", self._state_file, exc)

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self._rules

    def set_rules(self, rules: Sequence[Rule]) -> None:
        """Put new rules in force. A rule that still exists keeps whether it is firing, its
        cooldown and its cap (a reload must not lose the undo of what it did, nor let it act
        again at once); if its definition changed, its ``for`` timers start over. A removed
        rule's state is dropped."""
        old = {r.name: r for r in self._rules}
        names = {r.name for r in rules}
        changed = {r.name for r in rules if old.get(r.name) != r}
        self._states = {k: v for k, v in self._states.items() if k[0] in names}
        for (rule, _), st in self._states.items():
            if rule in changed:
                st.pending_since = None
        self._fired = {k: v for k, v in self._fired.items() if k in names}
        self._rules = tuple(rules)
        self._save()

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
        self.counts[(rule, what)] = self.counts.get((rule, what), 0) + 1

    def _capped(self, rule: Rule, now: float) -> bool:
        if rule.max_firings is None:
            return False
        times = self._fired.setdefault(rule.name, deque())
        while times and times[0] <= now - rule.max_firings.window:
            times.popleft()
        return len(times) >= rule.max_firings.count

    def evaluate(self, snapshot: NodeSnapshot, *, global_dry_run: bool) -> list[Firing]:
        """Evaluate every rule on the snapshot; the firings to act on, in rule order."""
        self.history.observe(snapshot)
        now = snapshot.timestamp
        out: list[Firing] = []
        for rule in self._rules:
            present: set[str] = set()
            for target in targets(snapshot, rule.scope):
                present.add(target.key)
                firing = self._step(rule, target, snapshot, now, global_dry_run)
                if firing is not None:
                    out.append(firing)
            for key in [k for k in self._states if k[0] == rule.name and k[1] not in present]:
                del self._states[key]  # the pod or container is gone
                self._save()
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
                time=now,
                actions=tuple(rule.actions if kind == "firing" else rule.resolve),
                dry_run=dry or bool(rule.dry_run),
                values=values,
                pod_uid=target.pod.uid if target.pod else None,
                container_id=target.container.container_id if target.container else None,
                summary=f"{rule.name} on {rule.scope} {target.key}: "
                + ("" if kind == "firing" else "cleared: ")
                + why,
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
                self._save()
                if rule.resolve:
                    self._count(rule.name, "resolved")
                    return make("resolved")
                return None
            if not holds:
                return None
        elif not holds:
            st.pending_since = None
            return None
        elif st.pending_since is None:
            st.pending_since = now
        since = now if st.pending_since is None else st.pending_since
        if now - since < rule.for_:
            return None
        if st.busy or (st.last_acted is not None and now - st.last_acted < rule.cooldown):
            self._count(rule.name, "suppressed_cooldown")
            return None
        if self._capped(rule, now):
            self._count(rule.name, "suppressed_cap")
            if rule.name in self._cap_logged:
                return None
            self._cap_logged.add(rule.name)  # once per capped spell, not every sample
            log.warning(
                "rule %s reached maxFirings (%d per %.0fs); not firing on %s",
                rule.name,
                rule.max_firings.count if rule.max_firings else 0,
                rule.max_firings.window if rule.max_firings else 0,
                target.key,
            )
            return None
        st.firing, st.busy, st.last_acted = True, True, now
        self._cap_logged.discard(rule.name)
        self._save()
        self._fired.setdefault(rule.name, deque()).append(now)
        self._count(rule.name, "firings")
        return make("firing")

    def finished(self, firing: Firing, *, at: float) -> None:
        """Feed back that the firing's actions are done: the cooldown counts from now."""
        st = self._states.get((firing.rule, firing.target))
        if st is not None and firing.kind == "firing":
            st.busy = False
            st.last_acted = at

    def dropped(self, firing: Firing) -> None:
        """The remediator could not take the firing (queue full): free the target so the rule
        can fire again at the next sample."""
        self._count(firing.rule, "suppressed_queue_full")
        st = self._states.get((firing.rule, firing.target))
        if st is None:
            return
        if firing.kind == "resolved":
            st.firing = True  # still to undo: the next sample emits the resolve again
        else:
            st.busy, st.firing, st.last_acted = False, False, None
            times = self._fired.get(firing.rule)
            if times:
                times.pop()
        self._save()


def _fmt(value: float | None) -> str:
    if value is None:
        return "no data"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"
