"""``record``: keep the evidence, change nothing.

The incident record of the firing (written by the remediator for every firing) holds the node's
memory breakdown, slab, page cache, top containers and processes and GPU memory; this action
only makes that the point of the step, for rules whose cause eviction cannot fix (an
unreclaimable-slab leak). It needs no cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nodeguard.actions.args import ActionArgs
from nodeguard.actions.base import ActionResult
from nodeguard.actions.registry import Action, register

if TYPE_CHECKING:
    from nodeguard.actions.context import Call

__all__ = ["RecordArgs"]


class RecordArgs(ActionArgs):
    """No arguments."""


async def _run_record(call: Call, args: RecordArgs) -> list[ActionResult]:
    return call.result(action="record", outcome="done", message=f"evidence recorded: {call.note}")


register(
    Action(
        name="record",
        summary="keep the evidence in the incident record; change nothing",
        args=RecordArgs,
        run=_run_record,
        needs_api=False,
        by_hand=False,  # its point is the incident record, which only the agent writes
        reasons={
            "done": "NodeguardEvidenceRecorded",
            "noop": "NodeguardEvidenceRecorded",
            "refused": "NodeguardEvidenceRecorded",
            "blocked": "NodeguardEvidenceRecorded",
            "failed": "NodeguardEvidenceRecorded",
        },
    )
)
