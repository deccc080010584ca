"""The cordon budget's notes on its Lease: the Node count reused while fresh (never a stale,
future or malformed one), and a waiter told the budget is spent only when the notes say so for
its own budget."""

from __future__ import annotations

from typing import Any

from nodeguard.actions.cordon_budget import (
    ANN_CORDONED,
    ANN_NODES,
    ANN_NODES_AT,
    COUNT_TTL,
    allowed,
    cached_total,
    notes,
    spent_in_notes,
)


def _lease(annotations: dict[str, str] | None) -> dict[str, Any]:
    return {"metadata": {"name": "b", "annotations": annotations}, "spec": {}}


def test_the_count_is_reused_while_fresh_only() -> None:
    written = notes(total=5000, counted_at=1000.0, cordoned=3)
    assert written == {ANN_CORDONED: "3", ANN_NODES: "5000", ANN_NODES_AT: "1000"}
    lease = _lease(written)
    assert cached_total(lease, now=1000.0 + COUNT_TTL - 1) == 5000
    assert cached_total(lease, now=1000.0 + COUNT_TTL + 1) is None  # too old: counted again
    assert cached_total(lease, now=1000.0 - 61) is None  # from a clock more than a minute ahead
    for bad in ({ANN_NODES: "many", ANN_NODES_AT: "1000"}, {ANN_NODES: "0", ANN_NODES_AT: "1"}):
        assert cached_total(_lease(bad), now=1000.0) is None
    assert cached_total(_lease(None)) is None and cached_total(None) is None
    # A budget of nodes alone needs no count: none is written.
    assert notes(total=None, counted_at=None, cordoned=1) == {ANN_CORDONED: "1"}


def test_a_waiter_gives_up_only_on_its_own_budget_spent() -> None:
    import time

    now = time.time()
    lease = _lease(notes(total=200, counted_at=now, cordoned=20))
    # 10 % of 200 is 20: spent. 15 % is 30: not.
    assert spent_in_notes(lease, budget_nodes=None, budget_percent=10) == (
        "budget spent, 20 of 20 node(s) already cordoned by nodeguard"
    )
    assert spent_in_notes(lease, budget_nodes=None, budget_percent=15) is None
    assert spent_in_notes(lease, budget_nodes=20, budget_percent=None) is not None
    assert spent_in_notes(lease, budget_nodes=None, budget_percent=None) is None  # no budget
    stale = _lease(notes(total=200, counted_at=now - 2 * COUNT_TTL, cordoned=20))
    assert spent_in_notes(stale, budget_nodes=None, budget_percent=10) is None
    assert spent_in_notes(_lease({}), budget_nodes=1, budget_percent=None) is None
    assert allowed(budget_nodes=None, budget_percent=10, total=5) == 1  # at least one
    assert allowed(budget_nodes=3, budget_percent=10, total=5000) == 3
