"""NodeActor (nodeguard.remediation.actor) as the Lease tests build it: one per agent, each on
a fake monotonic clock of its own, against the test API server's ``default`` namespace."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nodeguard.kube.client import KubeClient
from nodeguard.remediation.actor import NodeActor

#: leaseDurationSeconds of the tests' Leases.
DURATION = 15
#: The namespace of the tests' Leases.
NS = "default"


class Clock:
    """A fake monotonic clock in seconds: ``now`` is moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_actor(
    kube: KubeClient,
    node: str,
    who: str,
    clock: Clock,
    *,
    dry_run: bool = False,
    mirror: Callable[[], dict[str, Any]] | None = None,
) -> NodeActor:
    """An actor for ``node`` with identity ``who``, a state of its own (``state-of-<who>``) and
    an empty journal to hand over unless ``mirror`` gives one."""
    return NodeActor(
        kube=kube,
        node=node,
        namespace=NS,
        identity=who,
        duration=DURATION,
        dry_run=dry_run,
        state_id=f"state-of-{who}",
        mirror=mirror or (lambda: {"journal": {}, "evictions": []}),
        clock=clock,
    )
