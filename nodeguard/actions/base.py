"""What every action returns: outcomes, and the Events that tell the cluster about them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["OUTCOMES", "ActionResult", "AuditEvent", "ObjectRef", "Outcome"]

#: done: the action did (or in dry run would do) its work; noop: nothing to do (already in the
#: wanted state, or not ours); refused: a budget, a limit or nodeguard's own safety rule said
#: no; blocked: a PodDisruptionBudget said "later"; failed: an API error or a missing object.
Outcome = Literal["done", "noop", "refused", "blocked", "failed"]
OUTCOMES: tuple[Outcome, ...] = ("done", "noop", "refused", "blocked", "failed")


@dataclass(slots=True, kw_only=True)
class ObjectRef:
    """The object an Event is about: ``kind`` (Node, Pod, Experiment), ``name``,
    ``namespace`` (``""`` for a cluster-scoped object), ``uid`` and ``api_version``
    (core/v1 Event ``involvedObject``)."""

    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    api_version: str = "v1"


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditEvent:
    """One Event to write about an action's result: on ``obj``, with the real-run ``reason``
    (the auditor writes its dry-run form in dry run), ``message`` and ``type``
    (``Normal``/``Warning``)."""

    obj: ObjectRef
    reason: str
    message: str
    type: Literal["Normal", "Warning"] = "Normal"
    #: Already written as it happened (an eviction's Event, before the next eviction): the
    #: audit line names it, the auditor does not write it again.
    written: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionResult:
    """One action's outcome on one node (or one object of it: an experiment).

    ``message`` is for people ("would cordon node-a: ..."); ``details`` holds what a machine
    needs (evicted pods, freed bytes, ...); ``events`` the Events to write, each about the
    object it concerns (the auditor writes one on the node when an action names none);
    ``retry``: the outcome is a transient API failure, worth running the step again later
    (the remediator does, with backoff).
    """

    action: str
    node: str
    dry_run: bool
    outcome: Outcome
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)
    events: tuple[AuditEvent, ...] = ()
    retry: bool = False

    def to_record(self) -> dict[str, Any]:
        """JSON-able, for incident records and the journal (events as reason and object)."""
        return {
            "action": self.action,
            "node": self.node,
            "dry_run": self.dry_run,
            "outcome": self.outcome,
            "message": self.message,
            "details": dict(self.details),
            "retry": self.retry,
            "events": [
                {
                    "reason": e.reason,
                    "object": f"{e.obj.kind}/{e.obj.namespace + '/' if e.obj.namespace else ''}"
                    f"{e.obj.name}",
                }
                for e in self.events
            ],
        }
