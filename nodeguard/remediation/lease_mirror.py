"""What the holder of a node's Lease writes on it for the next one, and what a taker reads.

The fenced write of :mod:`nodeguard.remediation.actor` carries the holder's journal of
runbooks under way and its eviction times on this node (annotation
``nodeguard.io/actor-state``, JSON ``{"journal": {incident id: entry}, "evictions": [Unix
seconds]}``), and the id of its state file (``nodeguard.io/actor-state-id``). An agent taking
over from one that died reads them back as :class:`Inherited`. Annotations of one object
share 256 KiB, so the journal is cut to :data:`MAX_STATE` characters, the runbooks nothing
has started first.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ANN_STATE", "ANN_STATE_ID", "MAX_STATE", "Inherited", "Mirror", "inherited"]

# The actor's log lines keep the one logger name they had before it was split in modules.
log = logging.getLogger("nodeguard.remediation.actor")

ANN_STATE = "nodeguard.io/actor-state"
ANN_STATE_ID = "nodeguard.io/actor-state-id"
#: The journal mirrored on the Lease, in characters at most (annotations share 256 KiB).
MAX_STATE = 96 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Inherited:
    """What an agent that died left on the Lease: ``journal`` (incident id -> journal entry)
    and ``evictions`` (its eviction times on this node, Unix seconds); ``same_state``: it used
    this agent's own state file (a restart of the same agent: nothing to adopt); ``lapsed``:
    it did not release the Lease (killed, or cut off), so what it did last is unknown."""

    journal: dict[str, Any]
    evictions: list[float]
    same_state: bool
    lapsed: bool


def inherited(
    ann: Mapping[str, str], *, state_id: str, lapsed: bool, namespace: str, name: str
) -> Inherited:
    """What the annotations ``ann`` of the Lease ``namespace/name`` hand over to the agent of
    state file ``state_id`` (an unreadable mirror is warned about and counts as empty)."""
    same = ann.get(ANN_STATE_ID) == state_id
    try:
        data = json.loads(ann.get(ANN_STATE) or "{}")
        journal = {str(k): v for k, v in dict(data.get("journal") or {}).items()}
        evictions = [float(t) for t in data.get("evictions") or []]
    except (ValueError, TypeError, AttributeError):
        log.warning("lease %s/%s: unreadable %s, ignored", namespace, name, ANN_STATE)
        journal, evictions = {}, []
    return Inherited(journal=journal, evictions=evictions, same_state=same, lapsed=lapsed)


class Mirror:
    """Writes ``mirror()`` (the journal and eviction times) and ``state_id`` into the
    annotations of the Lease ``namespace/name``."""

    def __init__(
        self, *, mirror: Callable[[], Mapping[str, Any]], state_id: str, namespace: str, name: str
    ) -> None:
        self._mirror, self._state_id = mirror, state_id
        self._namespace, self._name = namespace, name
        self._cut_said = False

    def write(self, ann: dict[str, str]) -> None:
        """Put the mirror in ``ann``, its journal cut to :data:`MAX_STATE` characters."""
        data = dict(self._mirror())
        text = json.dumps(data, separators=(",", ":"), default=str)
        journal = dict(data.get("journal") or {})
        # Runbooks are journaled when queued, so the oldest entries are the ones under way
        # (an eviction on the wire): the cut drops queued deliveries nothing has started
        # (Alertmanager re-sends them; a local rule fires again), the newest first, and
        # runbooks under way only when those are not enough, the oldest first.
        order = [k for k in reversed(journal) if _not_started(journal[k])]
        order += [k for k in journal if k not in set(order)]
        cut = 0
        while len(text) > MAX_STATE and journal:
            journal.pop(order[cut])
            cut += 1
            text = json.dumps({**data, "journal": journal}, separators=(",", ":"), default=str)
        if cut and not self._cut_said:
            self._cut_said = True  # once: a flood would say it on every renewal
            log.warning(
                "lease %s/%s: journal over %d characters: %d of %d runbooks not mirrored "
                "(queued ones first); an agent taking over does not see them",
                self._namespace,
                self._name,
                MAX_STATE,
                cut,
                cut + len(journal),
            )
        ann[ANN_STATE] = text
        ann[ANN_STATE_ID] = self._state_id


def _not_started(entry: Any) -> bool:
    return isinstance(entry, dict) and not entry.get("next") and not entry.get("progress")
