"""What every action returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["ActionResult", "Outcome"]

#: done: the action did (or in dry run would do) its work; noop: nothing to do (already in the
#: wanted state, or not ours); refused: a budget or limit said no; blocked: a
#: PodDisruptionBudget said "later"; failed: an API error, to retry later.
Outcome = Literal["done", "noop", "refused", "blocked", "failed"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionResult:
    """One action's outcome on one node. ``message`` is for people ("would cordon node-a:
    ..."); ``details`` holds what a machine needs (evicted pods, freed bytes, ...)."""

    action: str
    node: str
    dry_run: bool
    outcome: Outcome
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)
