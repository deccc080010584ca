"""The node's Lease in the API: read, written as this agent's, released.

The reads and writes of :class:`~nodeguard.remediation.actor.NodeActor`, which keeps the
decisions (whether to take the Lease, whether it still holds the node). :class:`LeaseApi`
builds the Lease as this agent writes it (:func:`~nodeguard.remediation.lease_takeover.as_ours`,
the annotations of :mod:`~nodeguard.remediation.lease_takeover`, the journal mirrored by
:mod:`~nodeguard.remediation.lease_mirror`), sends it with the ``resourceVersion`` it was read
with (a conditional write: of two agents racing for it exactly one wins, the other gets 409)
and keeps the last version seen.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from nodeguard.kube.client import JSON, KubeClient
from nodeguard.kube.errors import Conflict, KubeError, NotFound
from nodeguard.remediation.lease_mirror import Inherited, Mirror, inherited
from nodeguard.remediation.lease_takeover import (
    ANN_DRY_RUN,
    ANN_HOLDER_STATE,
    Candidate,
    as_ours,
    lease_annotations,
    lease_spec,
)

__all__ = ["LeaseApi"]


class LeaseApi:
    """The Lease ``namespace/name`` (``coordination.k8s.io/v1``) as ``candidate`` reads and
    writes it through ``kube``; ``mirror()``: the journal and eviction times a real agent
    writes on it with every write (a dry run writes none)."""

    def __init__(
        self,
        *,
        kube: KubeClient,
        namespace: str,
        name: str,
        candidate: Candidate,
        mirror: Callable[[], Mapping[str, Any]],
    ) -> None:
        self._kube, self._namespace, self._name = kube, namespace, name
        self._identity, self._duration = candidate.identity, candidate.duration
        self._dry_run, self._state_id = candidate.dry_run, candidate.state_id
        self._mirror = Mirror(
            mirror=mirror, state_id=candidate.state_id, namespace=namespace, name=name
        )
        #: The last version this agent wrote, or read as another agent's (set by its
        #: :class:`~nodeguard.remediation.actor.NodeActor` when it observes one); ``None``
        #: after a 409, when this copy is stale: read it again.
        self.last: JSON | None = None

    async def read(self) -> JSON | None:
        """The Lease as the API server has it now; ``None`` when there is none (404). Raises
        :class:`~nodeguard.kube.errors.KubeError` when the API cannot say."""
        try:
            return await self._kube.get_lease(name=self._name, namespace=self._namespace)
        except NotFound:
            return None

    def as_ours(self, lease: JSON | None, *, previous: str) -> tuple[JSON, Inherited | None]:
        """``lease`` (changed in place; ``None``: a new one) held by this agent from now, taken
        from the holder ``previous`` (``""``: none; this agent's identity: a renewal), with
        this agent's annotations; and what that holder left on it for the next one (``None``
        for a renewal), read before this agent's mirror replaces it."""
        body = as_ours(
            lease,
            name=self._name,
            namespace=self._namespace,
            identity=self._identity,
            duration=self._duration,
            previous=previous,
        )
        ann = lease_annotations(body)
        left = None
        if previous != self._identity:
            # A dry-run holder sent nothing destructive (it fences nothing): nothing it did is
            # unknown, so its rules' cooldowns need not be assumed to run.
            lapsed = bool(previous) and ann.get(ANN_DRY_RUN) != "true"
            left = inherited(
                ann,
                state_id=self._state_id,
                lapsed=lapsed,
                namespace=self._namespace,
                name=self._name,
            )
        ann[ANN_DRY_RUN] = "true" if self._dry_run else "false"
        ann[ANN_HOLDER_STATE] = self._state_id
        if not self._dry_run:  # a dry run keeps what a real agent left, for the next real one
            self._mirror.write(ann)
        return body, left

    async def send(self, body: JSON, *, create: bool) -> JSON | None:
        """Create (``create``) or replace the Lease with ``body``: the version written, kept as
        :attr:`last`; ``None`` when another agent wrote it first (409; :attr:`last` is
        forgotten). Raises :class:`~nodeguard.kube.errors.KubeError` for any other failure."""
        try:
            if create:
                written = await self._kube.create_lease(namespace=self._namespace, body=body)
            else:
                written = await self._kube.replace_lease(
                    name=self._name, namespace=self._namespace, body=body
                )
        except Conflict:
            self.last = None  # someone else wrote it: read again
            return None
        self.last = written
        return written

    async def reread(self) -> JSON | None:
        """After a 409: the Lease as the agent that wrote it first left it; ``None`` when it is
        gone (404) or the API cannot say."""
        try:
            return await self.read()
        except KubeError:
            return None

    async def release(self) -> bool:
        """Clear ``holderIdentity`` on :attr:`last`, so the next agent need not wait; the
        mirrored state stays on it. False when there is no :attr:`last` to release (nothing is
        sent). Failures of the write are ignored: the Lease lapses anyway."""
        lease = self.last
        if lease is None:
            return False
        lease_spec(lease)["holderIdentity"] = None
        with contextlib.suppress(KubeError):
            await self._kube.replace_lease(name=self._name, namespace=self._namespace, body=lease)
        return True
