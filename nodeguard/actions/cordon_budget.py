"""What the cordon budget's Lease tells the agents that did not count: so that a thousand
agents pressured at once (a cluster-wide incident) do not each list every Node.

The holder of the budget Lease (:class:`~nodeguard.actions.cordon.BudgetLease`) writes on it,
when it lets it go, three annotations:

- :data:`ANN_NODES` / :data:`ANN_NODES_AT`: the cluster's Node count and when it was counted
  (Unix seconds). ``--cordon.budget-percent`` is a share of every Node, and counting them is a
  list of every Node. The next holders use the count from here, while it is younger than
  :data:`COUNT_TTL`, only to refuse: a count says the budget is spent, or the holder lists the
  Nodes itself before it cordons. A count edited by hand, or made before a scale-down, can then
  never cordon more than the budget (one made before a scale-up refuses more: the safe side),
  and a cluster-wide incident costs one list a cordon the budget allows, not one an agent.
  The age is judged on this node's clock against the writer's (the count's only use is to
  refuse, so a skewed clock can only keep a count a little longer or shorter).
- :data:`ANN_CORDONED`: how many nodes nodeguard had cordoned when it let go (the one it
  cordoned included). An agent waiting for the Lease reads it at each try; once it says the
  budget is spent and nodeguard's cordons (a label-selected list, a few Nodes) confirm it, the
  waiter gives up at once (refused) rather than polling the Lease until its turn only to count
  and refuse. The notes alone can be stale (nodes uncordoned since); the label list is the
  truth, so a budget freed by uncordons is never refused on old notes.

Before contending at all, an agent counts nodeguard's cordons with the label-selected list (a
few Nodes) and, with the cached count, refuses at once when the budget is spent
(:class:`~nodeguard.actions.cordon._Budget`).
"""

from __future__ import annotations

import math
import time
from typing import Any

from nodeguard.kube.client import JSON

__all__ = [
    "ANN_CORDONED",
    "ANN_NODES",
    "ANN_NODES_AT",
    "COUNT_TTL",
    "allowed",
    "cached_total",
    "notes",
    "spent_in_notes",
]

ANN_NODES = "nodeguard.io/budget-nodes"
ANN_NODES_AT = "nodeguard.io/budget-nodes-at"
ANN_CORDONED = "nodeguard.io/budget-cordoned"
#: How long a Node count on the Lease is used, in seconds.
COUNT_TTL = 300.0
#: How far in the future a count's time may be (another node's clock ahead of this one's).
_AHEAD = 60.0


def allowed(*, budget_nodes: int | None, budget_percent: float | None, total: int) -> int | None:
    """The most nodes nodeguard may hold cordoned: the smaller of ``budget_nodes`` and
    ``budget_percent`` of ``total`` (at least 1); ``None`` without a budget."""
    limits = []
    if budget_nodes is not None:
        limits.append(budget_nodes)
    if budget_percent is not None:
        limits.append(max(1, math.floor(total * budget_percent / 100.0)))
    return min(limits) if limits else None


def _annotations(lease: JSON | None) -> dict[str, Any]:
    if not lease:
        return {}
    found = (lease.get("metadata") or {}).get("annotations")
    return found if isinstance(found, dict) else {}


def cached_total(lease: JSON | None, *, now: float | None = None) -> int | None:
    """The Node count on ``lease`` while younger than :data:`COUNT_TTL`; ``None`` when there
    is none, it is older, from the future by more than the TTL (a clock far off) or not a
    count."""
    notes_ = _annotations(lease)
    try:
        total, at = int(notes_[ANN_NODES]), float(notes_[ANN_NODES_AT])
    except (KeyError, TypeError, ValueError):
        return None
    age = (time.time() if now is None else now) - at
    return total if total > 0 and -_AHEAD < age < COUNT_TTL else None


def notes(*, total: int | None, counted_at: float | None, cordoned: int) -> dict[str, str]:
    """The annotations the holder writes when it lets the Lease go (module docstring)."""
    out = {ANN_CORDONED: str(cordoned)}
    if total is not None and counted_at is not None:
        out |= {ANN_NODES: str(total), ANN_NODES_AT: f"{counted_at:.0f}"}
    return out


def spent_in_notes(
    lease: JSON | None, *, budget_nodes: int | None, budget_percent: float | None
) -> str | None:
    """Why the budget is spent by the Lease's notes, for an agent waiting for it; ``None``
    when they do not say so (no notes, no budget, or a percent budget without a count)."""
    notes_ = _annotations(lease)
    try:
        cordoned = int(notes_[ANN_CORDONED])
    except (KeyError, TypeError, ValueError):
        return None
    total = cached_total(lease) if budget_percent is not None else 0
    if total is None:
        return None
    most = allowed(budget_nodes=budget_nodes, budget_percent=budget_percent, total=total)
    if most is None or cordoned < most:
        return None
    return f"budget spent, {cordoned} of {most} node(s) already cordoned by nodeguard"
