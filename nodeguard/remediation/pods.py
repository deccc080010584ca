"""Steps that plan from pods wait for them, up to a bound.

An action that reads this node's pods joined to their cgroups
(:attr:`~nodeguard.actions.registry.Action.needs_pods`: ``evict``) has nothing to plan on
before the pod watch's first LIST and a sample after it. Its step waits for that data
(:meth:`nodeguard.actions.context.Env.pod_data`) up to ``pods_wait`` seconds, without holding a
worker, then plans on the first snapshot that names the pods; past the bound the runbook is
abandoned unplanned (:meth:`Endings.unplanned <nodeguard.remediation.endings.Endings.
unplanned>`). Why the bound: the module docstring of :mod:`nodeguard.remediation.worker`.
"""

from __future__ import annotations

import logging
from typing import Literal

from nodeguard.actions.context import Call, Env
from nodeguard.firing import Firing
from nodeguard.remediation.journal import Journal
from nodeguard.remediation.waits import Timing, Waits
from nodeguard.units import format_duration

__all__ = ["PodsWait"]

# The remediator's log lines keep the one logger name they had before it was split in modules.
log = logging.getLogger("nodeguard.remediation.worker")


class PodsWait:
    """The waits of the journal's steps for their pods, each from its first look (clock
    seconds of ``journal``) for ``timing.pods_wait``, looking every ``timing.pods_poll``."""

    def __init__(self, *, env: Env, journal: Journal, waits: Waits, timing: Timing) -> None:
        self._env, self._journal, self._waits, self._timing = env, journal, waits, timing
        # key -> clock seconds until which its step waits for pods (from its first look).
        self._deadline: dict[str, float] = {}

    def plan(self, key: str, call: Call) -> Literal["ready", "wait", "gone"]:
        """Whether the pods ``call``'s step of entry ``key`` plans from are known (``ready``:
        ``call`` now plans on the first snapshot that names them), may still come (``wait``:
        the key is queued again once they do, or when the wait is over), or did not in time
        (``gone``)."""
        ready = self._env.pod_data(call.firing)
        if ready is None:
            if self._may_wait(key, call.firing):
                return "wait"
            self._deadline.pop(key, None)
            return "gone"
        self._deadline.pop(key, None)
        if ready is not call.firing:  # planned on the first snapshot that names the pods
            call.firing = self._journal.firings[key] = ready
        return "ready"

    def _may_wait(self, key: str, firing: Firing) -> bool:
        now = self._journal.clock()
        deadline = self._deadline.get(key)
        if deadline is None:
            deadline = self._deadline[key] = now + self._timing.pods_wait
            log.warning(
                "%s: %s waits up to %s for the pods of %s: %s",
                key,
                firing.rule,
                format_duration(self._timing.pods_wait),
                firing.node,
                self._env.pod_data_missing(),
            )
        if now >= deadline:
            return False
        firings = self._journal.firings

        def done() -> bool:  # the pods are there, or the entry is gone (ended meanwhile)
            return key not in firings or self._env.pod_data(firings[key]) is not None

        self._waits.until(key, deadline=deadline, done=done, poll=self._timing.pods_poll)
        return True
