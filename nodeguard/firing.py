"""A decision to act, and the steps it runs: the one type every source of decisions produces.

Local rules (:mod:`nodeguard.rules.engine`), Alertmanager alerts (:mod:`nodeguard.alerts`) and
``nodeguard act`` all build a :class:`Firing`; the remediator and the actions take nothing else.
Like :class:`~nodeguard.snapshot.NodeSnapshot` it is a shared type at the bottom of the import
layers: it imports nothing of nodeguard but the snapshot.

A firing outlives the process that decided it: the remediator journals it in the state file
before it runs (:meth:`Firing.to_record` / :meth:`Firing.from_record`), so an agent killed
halfway through a runbook resumes it after the restart. The snapshot is not journalled (it is
evidence, and large); a resumed firing carries the first snapshot after the restart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import BaseModel

from nodeguard.snapshot import NodeSnapshot

__all__ = ["Firing", "FiringKind", "Source", "Step"]

FiringKind = Literal["firing", "resolved"]
Source = Literal["local", "alertmanager", "act"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One runbook step: a registered action's name and its arguments, parsed once (when the
    rule file was loaded, or the command line read) into that action's argument model."""

    action: str
    args: BaseModel

    def to_record(self) -> dict[str, Any]:
        """``{"action": NAME, "args": {...}}`` as a rule file would write it (aliases)."""
        return {"action": self.action, "args": self.args.model_dump(by_alias=True, mode="json")}


@dataclass(frozen=True, slots=True, kw_only=True)
class Firing:
    """A decision to act, from a local rule, an Alertmanager alert or ``nodeguard act``.

    - ``rule``: the rule (or alert rule) name; ``kind``: ``firing`` runs the rule's actions,
      ``resolved`` its resolve actions (the undo).
    - ``scope``: ``node``, ``pod``, ``container`` or ``gpu``; ``target`` the target key (node
      name, pod UID, ``<pod uid>/<container id>``, GPU UUID, ``<namespace>/<pod>`` for an alert
      naming a pod); ``node`` the node to act on (an alert may name another node than the
      agent's own).
    - ``time``: Unix seconds of the decision; ``values``: the signal values that decided.
    - ``steps``: the actions to run, in order; ``dry_run``: the effective dry run of the
      decision (the global one or the rule's; the remediator may still add the global one).
    - ``pod_uid``/``container_id``: the workload a pod or container rule is about;
      ``pod_ref``: ``(namespace, name)`` of the pod an alert names, when it has no UID.
    - ``source``: who decided; ``summary``: one line for people; ``key``: the delivery key of
      an alert (what the webhook deduplicates on), empty otherwise; ``rule_digest``: a digest
      of the rule's definition when the firing was decided (a resumed firing checks the rule is
      unchanged).
    - ``snapshot``: the sample it was decided on (the evidence); ``None`` for an alert about
      another node and for a firing restored from the journal before the first sample.
    """

    rule: str
    kind: FiringKind
    scope: str
    target: str
    node: str
    time: float
    steps: tuple[Step, ...]
    dry_run: bool
    values: Mapping[str, float | None] = field(default_factory=dict)
    pod_uid: str | None = None
    container_id: str | None = None
    pod_ref: tuple[str, str] | None = None
    source: Source = "local"
    summary: str = ""
    key: str = ""
    rule_digest: str = ""
    snapshot: NodeSnapshot | None = None

    def with_snapshot(self, snapshot: NodeSnapshot | None) -> Firing:
        """The same decision with other evidence (a resumed firing takes a fresh sample)."""
        return replace(self, snapshot=snapshot)

    def to_record(self) -> dict[str, Any]:
        """The firing as JSON-able data for the journal, without the snapshot."""
        return {
            "rule": self.rule,
            "kind": self.kind,
            "scope": self.scope,
            "target": self.target,
            "node": self.node,
            "time": self.time,
            "steps": [s.to_record() for s in self.steps],
            "dry_run": self.dry_run,
            "values": dict(self.values),
            "pod_uid": self.pod_uid,
            "container_id": self.container_id,
            "pod_ref": list(self.pod_ref) if self.pod_ref else None,
            "source": self.source,
            "summary": self.summary,
            "key": self.key,
            "rule_digest": self.rule_digest,
        }

    @classmethod
    def from_record(
        cls, record: Mapping[str, Any], *, parse_step: Callable[[Mapping[str, Any]], Step]
    ) -> Firing:
        """A firing from :meth:`to_record`'s data; ``parse_step`` turns ``{"action", "args"}``
        back into a :class:`Step` (the action registry's parser). Raises ``KeyError``,
        ``TypeError`` or ``ValueError`` on data that is not such a record."""
        ref = record.get("pod_ref")
        kind = str(record["kind"])
        source = str(record.get("source", "local"))
        if kind not in ("firing", "resolved") or source not in ("local", "alertmanager", "act"):
            raise ValueError(f"not a firing record: kind {kind!r}, source {source!r}")
        return cls(
            rule=str(record["rule"]),
            kind=kind,  # type: ignore[arg-type]  # checked above
            scope=str(record["scope"]),
            target=str(record["target"]),
            node=str(record["node"]),
            time=float(record["time"]),
            steps=tuple(parse_step(s) for s in record["steps"]),
            dry_run=bool(record["dry_run"]),
            values={str(k): (None if v is None else float(v)) for k, v in record["values"].items()},
            pod_uid=record.get("pod_uid"),
            container_id=record.get("container_id"),
            pod_ref=(str(ref[0]), str(ref[1])) if ref else None,
            source=source,  # type: ignore[arg-type]  # checked above
            summary=str(record.get("summary", "")),
            key=str(record.get("key", "")),
            rule_digest=str(record.get("rule_digest", "")),
        )
