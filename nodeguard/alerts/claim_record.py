"""The claims of alert deliveries on one Node, as the annotation ``nodeguard.io/alert-deliveries``
holds them: read, decoded, encoded, and written back as a merge patch carrying the
``resourceVersion`` they were read at (the API server answers 409 when another agent wrote the
Node meanwhile). What a claim means, and who wins one, is :mod:`nodeguard.alerts.claims`'.

The annotation is JSON: ``claimants``, the agents' names; ``seen``, each recent delivery as
``[digest, expiry, claimant index]`` (expiry in Unix seconds; index :data:`DONE` once it is
finished); ``resolved``, the latest resolved instant (µs) per fingerprint digest. An annotation
that cannot be read, or over :data:`_MAX_ANNOTATION` characters, reads as no claims.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from nodeguard.kube.client import KubeClient

__all__ = ["ANNOTATION", "DONE", "KEEP", "ClaimRecord", "Seen", "read_record", "write_record"]

# The claims' log lines keep the one logger name they had before they were split in modules.
log = logging.getLogger("nodeguard.alerts.claims")

ANNOTATION = "nodeguard.io/alert-deliveries"
#: Deliveries kept per Node.
KEEP = 1024
#: The claimant index of a finished delivery: no one takes it over.
DONE = -1
_MAX_ANNOTATION = 192 * 1024  # what is read of the annotation at most, in characters


@dataclass(slots=True, kw_only=True)
class Seen:
    """One delivery seen recently: the ``digest`` of its key, its ``expiry`` (Unix seconds:
    remembered until then) and the index of its ``claimant`` in
    :attr:`ClaimRecord.claimants` (:data:`DONE`: finished)."""

    digest: str
    expiry: int
    claimant: int


@dataclass(slots=True, kw_only=True)
class ClaimRecord:
    """A Node's claims as read at its ``version`` (``metadata.resourceVersion``; ``None`` when
    the Node did not say): ``claimants``, ``seen`` and ``resolved`` (fingerprint digest ->
    instant, µs), as the module docstring describes them."""

    claimants: list[str]
    seen: list[Seen]
    resolved: dict[str, int]
    version: str | None

    def index(self, claimant: str) -> int | None:
        """The index of ``claimant`` in :attr:`claimants`; ``None`` when it is not there."""
        return self.claimants.index(claimant) if claimant in self.claimants else None

    def join(self, claimant: str) -> int:
        """The index of ``claimant``, added to :attr:`claimants` when it is not there yet."""
        if claimant not in self.claimants:
            self.claimants.append(claimant)
        return self.claimants.index(claimant)

    def holder(self, entry: Seen) -> str:
        """The claimant of ``entry``; ``""`` when it is done or its index is out of range."""
        i = entry.claimant
        return self.claimants[i] if 0 <= i < len(self.claimants) else ""

    def text(self) -> str:
        """The annotation's value, everything kept as it is."""
        seen = [[e.digest, e.expiry, e.claimant] for e in self.seen]
        return _dumps(claimants=self.claimants, seen=seen, resolved=self.resolved)

    def compact_text(self) -> str:
        """The annotation's value with at most :data:`KEEP` deliveries (the soonest to expire
        go) and resolved instants, and only the claimants those deliveries name (their
        indices renumbered)."""
        seen = sorted(self.seen, key=lambda e: float(e.expiry))[-KEEP:]
        used = sorted({e.claimant for e in seen if e.claimant != DONE})
        remap = {old: new for new, old in enumerate(used)}
        remap[DONE] = DONE
        return _dumps(
            claimants=[self.claimants[i] for i in used if 0 <= i < len(self.claimants)],
            seen=[[e.digest, e.expiry, remap[e.claimant]] for e in seen],
            resolved=dict(list(self.resolved.items())[-KEEP:]),
        )


def _dumps(*, claimants: list[str], seen: list[list[Any]], resolved: dict[str, int]) -> str:
    value = {"claimants": claimants, "seen": seen, "resolved": resolved}
    return json.dumps(value, separators=(",", ":"))


def decode(text: str | None, *, version: str | None) -> ClaimRecord:
    """The claims in the annotation's value ``text`` (``None``: no annotation), read at
    ``version``; none when it is unreadable or too long (the latter logged)."""
    empty = ClaimRecord(claimants=[], seen=[], resolved={}, version=version)
    if text and len(text) > _MAX_ANNOTATION:
        log.warning("%s is over %d characters: ignored", ANNOTATION, _MAX_ANNOTATION)
        return empty
    try:
        data = json.loads(text or "{}")
        claimants = [str(c) for c in data.get("claimants", [])]
        seen = [
            Seen(digest=str(e[0]), expiry=int(e[1]), claimant=int(e[2]))
            for e in data.get("seen", [])
            if isinstance(e, list) and len(e) == 3
        ]
        resolved = {str(k): int(v) for k, v in dict(data.get("resolved", {})).items()}
    except (ValueError, TypeError, AttributeError):
        return empty
    return ClaimRecord(claimants=claimants, seen=seen, resolved=resolved, version=version)


async def read_record(*, kube: KubeClient, node: str) -> ClaimRecord:
    """The claims on Node ``node`` now. Raises :class:`~nodeguard.kube.errors.KubeError` when
    it cannot be read (:class:`~nodeguard.kube.errors.NotFound`: no such Node)."""
    meta = (await kube.get_node(name=node)).get("metadata", {})
    text = (meta.get("annotations") or {}).get(ANNOTATION)
    return decode(text, version=meta.get("resourceVersion"))


async def write_record(*, kube: KubeClient, node: str, record: ClaimRecord, text: str) -> None:
    """Write ``text`` (:meth:`ClaimRecord.text` or :meth:`~ClaimRecord.compact_text`) as the
    annotation of Node ``node``, if it is still at ``record``'s version. Raises
    :class:`~nodeguard.kube.errors.Conflict` when another writer changed it since,
    :class:`~nodeguard.kube.errors.KubeError` for any other failure."""
    patch = {"metadata": {"resourceVersion": record.version, "annotations": {ANNOTATION: text}}}
    await kube.patch_node(name=node, patch=patch, dry_run=False)
