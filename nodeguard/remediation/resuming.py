"""After a restart: which restored runbooks resume, which are only finished, which end.

The rule of the module docstring of :mod:`nodeguard.remediation.worker`: a resolve always
resumes, a local rule's firing when ``check`` finds its rule unchanged and its condition
holding, an alert's or a command's within ``resume_window``; a step that was under way is
finished all the same (nothing new started); anything else is abandoned with why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nodeguard.firing import Firing
from nodeguard.remediation.endings import Endings
from nodeguard.remediation.journal import Journal
from nodeguard.remediation.waits import Waits
from nodeguard.snapshot import NodeSnapshot

__all__ = ["Check", "Decision", "resume"]

# The remediator's log lines keep the one logger name they had before it was split in modules.
log = logging.getLogger("nodeguard.remediation.worker")

#: ``check(firing, snapshot)`` -> ``None`` to resume a restored firing, else why not.
Check = Callable[[Firing, NodeSnapshot | None], str | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """What :meth:`Remediator.resume <nodeguard.remediation.worker.Remediator.resume>` did
    with one restored entry."""

    incident: str
    rule: str
    resumed: bool
    why: str


def resume(
    *,
    journal: Journal,
    waits: Waits,
    endings: Endings,
    snapshot: NodeSnapshot | None,
    check: Check,
    resume_window: float,
) -> list[Decision]:
    """Decide each of ``journal``'s restored entries (then none is left restored).

    ``check(firing, snapshot)`` says why not to resume a local rule's firing (``None``:
    resume); alerts and commands resume within ``resume_window`` seconds of being queued;
    resolves always resume. Resumed entries are queued on ``waits`` with the fresh
    ``snapshot`` as evidence; the others are abandoned through ``endings`` (incident written,
    ``on_done``), but for an entry whose step was under way (its ``progress`` not empty):
    that step runs once more with :attr:`~nodeguard.actions.context.Call.finishing` set, then
    the entry ends (incident ``finished_under_way``: why; ``steps_not_run``)."""
    decisions = []
    now = journal.clock()
    for key, firing in sorted(journal.restored.items()):
        entry = journal.entries.get(key)
        if entry is None:
            continue
        why = _finish_under_way(
            key,
            entry,
            firing,
            why=_why_not(
                entry, firing, now=now, check=check, snapshot=snapshot, resume_window=resume_window
            ),
        )
        if why is None:
            mine = snapshot if snapshot is not None and snapshot.node_name == firing.node else None
            journal.firings[key] = firing.with_snapshot(mine)
            entry["resumed"] = int(entry.get("resumed", 0)) + 1
            # Claimed by this agent's last process (or the dead actor it took over from):
            # claimed again as this one, so no third agent takes it over as well.
            entry.pop("claimed", None)
            waits.put(key)
            log.warning("resuming %s (%s) at step %d", key, firing.rule, entry["next"] + 1)
            decisions.append(Decision(incident=key, rule=firing.rule, resumed=True, why=""))
        else:
            endings.abandoned(key, firing.with_snapshot(snapshot), why=why)
            decisions.append(Decision(incident=key, rule=firing.rule, resumed=False, why=why))
    journal.restored.clear()
    journal.state.save()
    return decisions


def _why_not(
    entry: dict[str, Any],
    firing: Firing,
    *,
    now: float,
    check: Check,
    snapshot: NodeSnapshot | None,
    resume_window: float,
) -> str | None:
    """Why the restored ``entry`` is not resumed; ``None``: it is."""
    if firing.kind == "resolved":
        return None
    if firing.source == "local":
        return check(firing, snapshot)
    age = now - float(entry.get("created", 0))
    if age > resume_window:
        return f"decided {age:.0f}s before the restart"
    return None


def _finish_under_way(
    key: str, entry: dict[str, Any], firing: Firing, *, why: str | None
) -> str | None:
    """``why`` not to resume ``entry``, unless its step was under way: writes it started may
    have reached the API server (an eviction sent, then the kill). Then that step runs once
    more to finish and report them (every action's resume is idempotent), nothing new
    starts, and the steps after it are abandoned: ``None``, and ``entry["finishing"]`` says
    why."""
    index = int(entry.get("next", 0))
    if why is None or not entry.get("progress", {}).get(str(index)):
        return why
    entry["finishing"] = why
    log.warning(
        "finishing step %d of %s (%s), under way before the restart: %s",
        index + 1,
        key,
        firing.rule,
        why,
    )
    return None
