"""The checks of ``nodeguard doctor``: one module a check, each registering one :class:`Check`
under its id (also its ``check`` in findings, the JSON and the table). Importing
:mod:`nodeguard.doctor` imports every module of the package, so the registry is complete.

A check is a pure function of a :class:`~nodeguard.doctor.inputs.Cluster` (read once by
:mod:`nodeguard.doctor.read`): it calls no API and reads no clock, so it is tested on typed
inputs alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from nodeguard.doctor.findings import SEVERITIES, Finding
from nodeguard.doctor.inputs import Cluster

__all__ = ["CHECKS", "Check", "register", "run_checks"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    """``id`` (short, kebab-case), what it looks for (``title``) and its function."""

    id: str
    title: str
    run: Callable[[Cluster], Iterable[Finding]]


#: Check id -> its entry, in registration order.
CHECKS: dict[str, Check] = {}


def register(check: Check) -> Check:
    """Add a check; a second one under an id already taken is a ``ValueError``."""
    if check.id in CHECKS:
        raise ValueError(f"doctor check {check.id!r} registered twice")
    CHECKS[check.id] = check
    return check


def run_checks(cluster: Cluster) -> list[Finding]:
    """Every registered check's findings, most severe first, then by check id and title."""
    findings = [f for check in CHECKS.values() for f in check.run(cluster)]
    return sorted(findings, key=lambda f: (-SEVERITIES.index(f.severity), f.check, f.title))
