"""The journal of runbooks under way: one entry a firing, kept in the state file.

The entries live in the state file's ``journal`` section (:class:`~nodeguard.statefile.
StateFile`), so an agent killed at any point finds them after its restart; the firings they run
are kept beside them in memory, as last planned. :class:`~nodeguard.remediation.worker.
Remediator` owns one :class:`Journal`; its collaborators (the step runner, the endings, the
workers) read and move the same entries.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from nodeguard.actions.registry import parse_step
from nodeguard.firing import Firing
from nodeguard.remediation.incidents import incident_id
from nodeguard.statefile import StateFile

__all__ = ["Journal"]

# The remediator's log lines keep the one logger name they had before it was split in modules.
log = logging.getLogger("nodeguard.remediation.worker")


class Journal:
    """The runbooks under way, by incident id.

    :attr:`entries` is the state file's ``journal`` section (saved with it): incident id ->
    ``{"firing": Firing.to_record(), "next": index of the step to run, "results": the
    ActionResult records so far, "progress": {str(step index): what that step has done},
    "created": clock seconds when it was queued, "attempts": tries of step ``next``}``, and as
    the runbook goes ``retry_at``, ``retried`` (the last 10 ``[what, message]``), ``claimed``
    (the claim of an alert's delivery), ``held`` (who holds the node while it waits),
    ``audited``, ``finishing`` (why a step under way at a restart is only finished) and
    ``resumed`` (how many restarts it came through).

    :attr:`firings`: the firing each queued entry runs (in memory; replaced when a step plans
    on a fresher snapshot). :attr:`restored`: entries read after a restart (or adopted from a
    dead actor) that wait for a decision. ``clock``: seconds, the one ``created`` is read on.
    """

    def __init__(self, *, state: StateFile, clock: Callable[[], float]) -> None:
        self.state = state
        self.entries = state.section("journal")
        self.firings: dict[str, Firing] = {}
        self.restored: dict[str, Firing] = {}
        self.clock = clock

    def add(self, firing: Firing) -> str:
        """Journal a new firing (saved at once); its key, the incident id."""
        key = incident_id(firing)
        while key in self.entries:  # two decisions in one microsecond: keep both
            key += "-1"
        self.entries[key] = {
            "firing": firing.to_record(),
            "next": 0,
            "results": [],
            "progress": {},
            "created": self.clock(),
            "attempts": 0,
        }
        self.firings[key] = firing
        self.state.save()
        return key

    def running(self, key: str) -> bool:
        """Whether ``key`` is journaled and has its firing here (a worker may run it)."""
        return key in self.entries and key in self.firings

    def drop(self, key: str) -> None:
        """Forget ``key`` (not saved: the caller saves once it has recorded why)."""
        self.entries.pop(key, None)
        self.firings.pop(key, None)

    def age(self, entry: dict[str, Any]) -> float:
        """Seconds since ``entry`` was queued."""
        return self.clock() - float(entry["created"])

    def restore(self) -> list[str]:
        """Read the journal left by an earlier process into :attr:`restored`; the keys. An
        entry that cannot be read is dropped with a warning."""
        for key, entry in list(self.entries.items()):
            try:
                firing = Firing.from_record(entry["firing"], parse_step=parse_step)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("journal entry %s unreadable, dropped: %s", key, exc)
                del self.entries[key]
                continue
            self.restored[key] = firing
        if self.restored:
            log.warning(
                "%d runbook(s) under way before the restart: %s",
                len(self.restored),
                ", ".join(sorted(self.restored)),
            )
        self.state.save()
        return sorted(self.restored)

    def adopt(self, entries: dict[str, Any]) -> list[str]:
        """Take the entries of a dead actor's journal (mirrored on the node's Lease) that are
        not here already into :attr:`restored`; the keys adopted. Unreadable ones are
        dropped with a warning."""
        adopted = []
        for key, entry in sorted(entries.items()):
            if key in self.entries or not isinstance(entry, dict):
                continue
            try:
                firing = Firing.from_record(entry["firing"], parse_step=parse_step)
                int(entry["next"])
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("adopted journal entry %s unreadable, dropped: %s", key, exc)
                continue
            entry.pop("held", None)  # held from the dead actor's point of view
            self.entries[key] = entry
            self.restored[key] = firing
            adopted.append(key)
        if adopted:
            log.warning("adopted %d runbook(s) of the last actor: %s", len(adopted), adopted)
            self.state.save()
        return adopted
