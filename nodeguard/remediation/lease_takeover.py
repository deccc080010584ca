"""Who may take a node's Lease, and the Lease as written by the agent that takes or renews it.

The rules of :mod:`nodeguard.remediation.actor`'s module docstring, after client-go's leader
election (``tools/leaderelection/leaderelection.go``, ``tryAcquireOrRenew``): another holder's
Lease has lapsed when this agent has watched the same ``holderIdentity`` and ``renewTime``
stay unchanged for ``leaseDurationSeconds`` on its own monotonic clock; a released Lease (no
holder), one held by this agent's own earlier process (same state file, annotation
``nodeguard.io/actor-holder-state``) and, for a real agent, one held by a dry run are taken at
once; a dry run never takes one from a real agent (annotation ``nodeguard.io/actor-dry-run``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nodeguard.kube.client import JSON

__all__ = [
    "ANN_DRY_RUN",
    "ANN_HOLDER_STATE",
    "Candidate",
    "Takeover",
    "as_ours",
    "lease_annotations",
    "lease_spec",
]

ANN_DRY_RUN = "nodeguard.io/actor-dry-run"
#: The holder's state file id (written by every holder, dry run too).
ANN_HOLDER_STATE = "nodeguard.io/actor-holder-state"


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """An agent that may hold a node's Lease (client-go's leader election calls it a
    candidate): its ``identity`` (``holderIdentity``: pod name and a start id), the
    ``duration`` it writes (``leaseDurationSeconds``, also assumed for a Lease that does not
    say), whether it is a ``dry_run``, and ``state_id``, the id of its state file
    (annotation ``nodeguard.io/actor-holder-state``)."""

    identity: str
    duration: int
    dry_run: bool
    state_id: str


def lease_spec(lease: JSON) -> dict[str, Any]:
    """The Lease's ``spec`` (created empty when missing)."""
    value: dict[str, Any] = lease.setdefault("spec", {})
    return value


def lease_annotations(lease: JSON) -> dict[str, str]:
    """The Lease's ``metadata.annotations`` (created empty when missing or null)."""
    meta = lease.setdefault("metadata", {})
    ann: dict[str, str] = meta.get("annotations") or {}
    meta["annotations"] = ann
    return ann


def as_ours(
    lease: JSON | None, *, name: str, namespace: str, identity: str, duration: int, previous: str
) -> JSON:
    """``lease`` (``None``: a new one named ``namespace/name``) held by ``identity`` for
    ``duration`` seconds from now (``renewTime``), taken from ``previous`` when that is
    another identity (``acquireTime``; ``leaseTransitions`` + 1 when it had a holder)."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # MicroTime
    body: JSON = (
        lease
        if lease is not None
        else {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"leaseTransitions": 0},
        }
    )
    body_spec = lease_spec(body)
    body_spec.update(holderIdentity=identity, leaseDurationSeconds=duration, renewTime=now)
    if previous != identity:
        body_spec["acquireTime"] = now
        if previous:
            body_spec["leaseTransitions"] = int(body_spec.get("leaseTransitions") or 0) + 1
    return body


class Takeover:
    """Judges, for ``candidate``, whether it may take a Lease now (:meth:`may_take`), watching
    other holders' renewals on ``clock`` (monotonic seconds)."""

    def __init__(self, *, candidate: Candidate, clock: Callable[[], float]) -> None:
        self._identity, self._duration = candidate.identity, candidate.duration
        self._dry_run, self._state_id = candidate.dry_run, candidate.state_id
        self._clock = clock
        # The other holder's (holderIdentity, renewTime) last seen, and when it was first seen.
        self._observed: tuple[str, str] | None = None
        self._observed_at = 0.0

    def forget(self) -> None:
        """This agent holds the Lease now: no other holder is being watched."""
        self._observed = None

    def may_take(self, lease: JSON) -> tuple[bool, str]:
        """Whether this agent may take ``lease`` now; else who holds it, for the log."""
        spec = lease_spec(lease)
        holder = str(spec.get("holderIdentity") or "")
        if not holder or holder == self._identity:
            return True, ""
        renewed = spec.get("renewTime") or spec.get("acquireTime")
        record = (holder, str(renewed or ""))
        now = self._clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self._duration)
        holder_dry = lease_annotations(lease).get(ANN_DRY_RUN) == "true"
        left = self._observed_at + duration - now
        why = (
            f"{holder}{' (dry run)' if holder_dry else ''} until {renewed or '?'} + {duration:.0f}s"
        )
        if self._dry_run and not holder_dry:
            return False, why  # a dry run never takes the node from a real agent
        if self._state_id and lease_annotations(lease).get(ANN_HOLDER_STATE) == self._state_id:
            # The holder used this agent's own state file, which this process holds locked
            # (flock, nodeguard.statefile): it was this agent before a restart, and is dead.
            return True, ""
        if holder_dry and not self._dry_run:
            return True, ""  # a real agent takes it from a dry run at once
        return left <= 0, f"{why} ({max(left, 0):.0f}s left as seen here)"
