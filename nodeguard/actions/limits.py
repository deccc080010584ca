"""The eviction limits that outlive a firing: evictions per node per window, and the backoff of a
unit a PodDisruptionBudget refused.

Both keep their state in a plain mapping that the agent takes from its state file
(:class:`nodeguard.statefile.StateFile`), on the clock they are given (the agent's: the state
file's, which a step of the wall clock does not move), so they survive a restart (kill -9
included): an agent restarted by the memory pressure it fights does not get a fresh eviction
allowance. Both offer :meth:`scratch`: a copy from the same state, for a dry run that must spend
the limit as the real run would without spending the real one.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EvictionBackoff", "EvictionLimiter"]

Clock = Callable[[], float]


def _fresh() -> dict[str, Any]:
    return {}


@dataclass(slots=True, kw_only=True)
class EvictionLimiter:
    """At most ``max_units`` units evicted per node per ``window`` seconds.

    ``store``: node -> list of eviction times (Unix seconds); ``changed()`` is called after
    every change (the agent saves its state file)."""

    max_units: int = 5
    window: float = 600.0
    clock: Clock = time.time
    store: MutableMapping[str, Any] = field(default_factory=_fresh)
    changed: Callable[[], None] = lambda: None

    def _times(self, node: str) -> list[float]:
        now = self.clock()
        # A time after now: the clock stepped back; it counts as now, never for a whole jump.
        times = [
            min(float(t), now) for t in self.store.get(node, []) if now - self.window < float(t)
        ]
        if times != [float(t) for t in self.store.get(node, [])]:
            self.store[node] = times
        return times

    def allows(self, node: str) -> bool:
        """Whether one more unit may be evicted from ``node`` now."""
        return len(self._times(node)) < self.max_units

    def used(self, node: str) -> int:
        """Units evicted from ``node`` in the current window."""
        return len(self._times(node))

    def record(self, node: str) -> None:
        """Count one evicted unit now."""
        self.store[node] = [*self._times(node), self.clock()]
        self.changed()

    def exhaust(self, node: str) -> None:
        """Count the whole allowance as spent now (a state file that could not be read: what
        was evicted just before is unknown, so assume the worst)."""
        self.store[node] = [self.clock()] * self.max_units
        self.changed()

    def scratch(self) -> EvictionLimiter:
        """A copy from the same state that writes nowhere (dry run)."""
        return EvictionLimiter(
            max_units=self.max_units,
            window=self.window,
            clock=self.clock,
            store=copy.deepcopy(dict(self.store)),
        )


@dataclass(slots=True, kw_only=True)
class EvictionBackoff:
    """Per unit: after the n-th refusal wait ``min(base * 2**(n-1), cap)`` seconds, or the
    server's Retry-After when longer (still at most ``cap``).

    ``store``: unit key -> ``[refusals, retry_at]`` (Unix seconds)."""

    base: float = 10.0
    cap: float = 300.0
    clock: Clock = time.time
    store: MutableMapping[str, Any] = field(default_factory=_fresh)
    changed: Callable[[], None] = lambda: None

    def until(self, key: str) -> float | None:
        """When the unit may be tried again (clock time), ``None`` if now."""
        state = self.store.get(key)
        if state is None:
            return None
        now = self.clock()
        retry_at = float(state[1])
        if retry_at > now + self.cap:
            # The clock stepped back: never longer than the cap from now, and kept so.
            retry_at = now + self.cap
            self.store[key] = [state[0], retry_at]
            self.changed()
        if retry_at <= now:
            return None
        return retry_at

    def refused(self, key: str, *, retry_after: float | None = None) -> float:
        """Record a refusal; the delay before the next try, in seconds."""
        count = int(self.store.get(key, (0, 0.0))[0]) + 1
        delay: float = min(self.base * 2.0 ** (count - 1), self.cap)
        if retry_after is not None:
            delay = min(max(delay, retry_after), self.cap)
        self.store[key] = [count, self.clock() + delay]
        self._forget_old()
        self.changed()
        return delay

    def succeeded(self, key: str) -> None:
        """The unit was evicted: forget its refusals."""
        if self.store.pop(key, None) is not None:
            self.changed()

    def _forget_old(self) -> None:
        # A unit refused long ago and never tried again (the pod went away) would stay forever.
        stale = self.clock() - 4 * self.cap
        for key in [k for k, v in self.store.items() if float(v[1]) < stale]:
            del self.store[key]

    def scratch(self) -> EvictionBackoff:
        """A copy from the same state that writes nowhere (dry run)."""
        return EvictionBackoff(
            base=self.base, cap=self.cap, clock=self.clock, store=copy.deepcopy(dict(self.store))
        )
