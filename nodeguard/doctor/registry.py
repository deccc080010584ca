"""The checks of ``nodeguard doctor``: one module a check, each registering one :class:`Check`
under its id (also its ``check`` in findings, the JSON and the table). Importing
:mod:`nodeguard.doctor` imports every module of the package, so the registry is complete.

A check is a pure function of a :class:`~nodeguard.doctor.inputs.Cluster` (read once by
:mod:`nodeguard.doctor.read`): it calls no API and reads no clock, so it is tested on typed
inputs alone.

A check's ``scope`` says what it needs: ``node`` when each node's findings follow from that node
and the pods bound to it alone (no quota, no LimitRange, no other node), so the agent can run it
on a cluster of its own node (:func:`nodeguard.doctor.node_scope.node_cluster`) and export its
findings (``nodeguard_posture_findings``); ``cluster`` otherwise. ``severities`` are those it
can report, so the agent exports a 0 for each one it did not find.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from nodeguard.doctor.findings import SEVERITIES, Finding, Severity
from nodeguard.doctor.inputs import Cluster

__all__ = ["CHECKS", "Check", "Scope", "node_checks", "register", "run_checks"]

Scope = Literal["cluster", "node"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    """``id`` (short, kebab-case), what it looks for (``title``), its function, its ``scope``
    (module docstring; ``cluster`` unless it says otherwise) and the ``severities`` its
    findings can have (least to most severe; every one unless it says otherwise)."""

    id: str
    title: str
    run: Callable[[Cluster], Iterable[Finding]]
    scope: Scope = "cluster"
    severities: tuple[Severity, ...] = SEVERITIES


#: Check id -> its entry, in registration order.
CHECKS: dict[str, Check] = {}


def register(check: Check) -> Check:
    """Add a check; a second one under an id already taken is a ``ValueError``."""
    if check.id in CHECKS:
        raise ValueError(f"doctor check {check.id!r} registered twice")
    CHECKS[check.id] = check
    return check


def node_checks() -> list[Check]:
    """The registered checks of scope ``node``, in registration order."""
    return [c for c in CHECKS.values() if c.scope == "node"]


def run_checks(cluster: Cluster) -> list[Finding]:
    """Every registered check's findings, most severe first, then by check id and title."""
    findings = [f for check in CHECKS.values() for f in check.run(cluster)]
    return sorted(findings, key=lambda f: (-SEVERITIES.index(f.severity), f.check, f.title))
