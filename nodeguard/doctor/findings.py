"""A finding: what one check found wrong with one set of objects, and how to fix it.

``severity`` is ``info``, ``warning`` or ``error``: *error* is a configuration that already
fails (pods refused at admission, memory that cannot be given back) or leaves a node with no
defence (no limit where training runs, nothing reserved for the system); *warning* is one that
fails under load (limits past allocatable); *info* is worth knowing. ``evidence`` holds the
numbers, each memory amount in bytes (the table adds binary units); ``fix`` is a ``kubectl``
command or a manifest fragment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from nodeguard.units import format_bytes

__all__ = ["SEVERITIES", "Fact", "Finding", "ObjectRef", "Severity", "worst"]

Severity = Literal["info", "warning", "error"]
#: Least to most severe.
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "error")


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectRef:
    """A Kubernetes object by kind, namespace (``""`` for a cluster-scoped one) and name."""

    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Fact:
    """One number of the evidence: ``bytes`` for a memory amount, else ``text``."""

    label: str
    bytes: int | None = None
    text: str | None = None

    def shown(self) -> str:
        """``label: 8.0 GiB`` (or its text) for the table."""
        value = format_bytes(self.bytes) if self.bytes is not None else (self.text or "")
        return f"{self.label}: {value}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One finding of check ``check`` (its registered id)."""

    check: str
    severity: Severity
    title: str
    objects: tuple[ObjectRef, ...]
    evidence: tuple[Fact, ...]
    fix: str

    def to_json(self) -> dict[str, Any]:
        """The finding for ``--json``: amounts in bytes, exact."""
        return {
            "check": self.check,
            "severity": self.severity,
            "title": self.title,
            "objects": [
                {"kind": o.kind, "namespace": o.namespace, "name": o.name} for o in self.objects
            ],
            "evidence": [
                {
                    "label": f.label,
                    **({"bytes": f.bytes} if f.bytes is not None else {}),
                    **({"text": f.text} if f.text is not None else {}),
                }
                for f in self.evidence
            ],
            "fix": self.fix,
        }


def worst(findings: list[Finding]) -> Severity | None:
    """The most severe severity among ``findings``; ``None`` when there are none."""
    ranks = [SEVERITIES.index(f.severity) for f in findings]
    return SEVERITIES[max(ranks)] if ranks else None
