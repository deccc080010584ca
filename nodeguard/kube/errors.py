"""Outcomes of Kubernetes API calls as nodeguard's own exception types.

Callers decide "retry later" or "give up" by type, never by parsing strings. Each is raised
``from`` the client library's exception (kubernetes ``ApiException`` or a urllib3 connection
error), so the original stays in ``__cause__``. The tree::

    KubeError
    ├── NotFound            404: the object is gone (a pod evicted meanwhile)
    ├── Conflict            409: resourceVersion moved on (optimistic concurrency) or exists
    ├── TooManyRequests     429: API throttling, or a PodDisruptionBudget (below);
    │   │                        ``retry_after`` seconds when the server said
    │   └── BudgetExhausted     429 to an Eviction, cause ``DisruptionBudget``: the budget
    │                            allows no disruption now (also an EvictionRefused)
    ├── Forbidden           401/403: RBAC (or authentication) refuses the call
    ├── Invalid             400/422: the request itself is wrong (admission webhook, validation)
    ├── ServerError         5xx, or the API server cannot be reached (``unreachable``): retry
    │   └── MultipleBudgets     500 to an Eviction: more than one budget covers the pod, which
    │                            the eviction subresource refuses (also an EvictionRefused)
    └── Fenced              not sent: this agent no longer holds its node's Lease

:class:`EvictionRefused` is what both refusals of an Eviction by the pod's budgets share: the
caller leaves the pod for later (``retry_after``) and reads ``refusal`` for why, never the
message. The eviction handler (kubernetes pkg/registry/core/pod/storage/eviction.go) answers
``checkAndDecrement``'s "no disruption allowed" with 429 ``TooManyRequests`` and a
``DisruptionBudget`` cause (Retry-After 0; 10 while the budget's status is older than its spec,
``createTooManyRequestsError``), and a pod that more than one budget selects with a Status of
code 500 and the message "This pod has more than one PodDisruptionBudget, which the eviction
subresource does not support." (no reason, no cause: the message is all it has, read in
:func:`nodeguard.kube.translate.translate_error` alone). Its 403s on a budget
(``disruptionsAllowed`` negative, ``DisruptedPods`` over 2000) stay :class:`Forbidden`.
"""

from __future__ import annotations

__all__ = [
    "BudgetExhausted",
    "Conflict",
    "EvictionRefused",
    "Fenced",
    "Forbidden",
    "Invalid",
    "KubeError",
    "MultipleBudgets",
    "NotFound",
    "ServerError",
    "TooManyRequests",
]


class KubeError(Exception):
    """Base of API call failures. ``status`` is the HTTP status (0 when none was received);
    ``reason`` the API's Status reason where there was one."""

    def __init__(self, message: str, *, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason

    @property
    def transient(self) -> bool:
        """Whether the same call may succeed later without anyone changing anything: the API
        server down or overloaded (5xx, no answer, throttling 429) or an object edited under
        us (409). RBAC, validation and a missing object are not transient."""
        return False


class NotFound(KubeError):
    """404."""


class Conflict(KubeError):
    """409."""

    @property
    def transient(self) -> bool:
        return True


class TooManyRequests(KubeError):
    """429. ``retry_after`` is the server's Retry-After in seconds, ``None`` if not given.
    ``disruption_budget`` is True when a PodDisruptionBudget is the cause."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 429,
        reason: str = "",
        retry_after: float | None = None,
        disruption_budget: bool = False,
    ) -> None:
        super().__init__(message, status=status, reason=reason)
        self.retry_after = retry_after
        self.disruption_budget = disruption_budget

    @property
    def transient(self) -> bool:
        return not self.disruption_budget


class Forbidden(KubeError):
    """401 or 403."""


class Invalid(KubeError):
    """400 or 422."""


class ServerError(KubeError):
    """5xx, or no answer at all (``unreachable``): worth retrying later with backoff."""

    def __init__(
        self, message: str, *, status: int = 0, reason: str = "", unreachable: bool = False
    ) -> None:
        super().__init__(message, status=status, reason=reason)
        self.unreachable = unreachable

    @property
    def transient(self) -> bool:
        return True


class Fenced(KubeError):
    """A destructive write that was never sent: this agent does not (or no longer) hold its
    node's Lease (:mod:`nodeguard.remediation.actor`). Transient: the step waits, and runs when
    this agent holds the Lease again (or the agent that does finishes it)."""

    @property
    def transient(self) -> bool:
        return True


class EvictionRefused(KubeError):
    """An Eviction the pod's PodDisruptionBudgets refuse for now (never raised itself: see
    :class:`BudgetExhausted` and :class:`MultipleBudgets`). ``refusal``: why, in words, for
    the Event and the result; ``retry_after``: the server's Retry-After in seconds, ``None``
    where it named none."""

    retry_after: float | None = None

    @property
    def refusal(self) -> str:
        """Why, in words."""
        raise NotImplementedError


class BudgetExhausted(TooManyRequests, EvictionRefused):
    """429 to an Eviction, with a ``DisruptionBudget`` cause: a budget allows no disruption of
    the pod now (``disruption_budget`` is True)."""

    def __init__(self, message: str, *, reason: str = "", retry_after: float | None = None) -> None:
        super().__init__(message, reason=reason, retry_after=retry_after, disruption_budget=True)

    @property
    def refusal(self) -> str:
        return f"PodDisruptionBudget: {str(self).rstrip('.')}"


class MultipleBudgets(ServerError, EvictionRefused):
    """500 to an Eviction: more than one PodDisruptionBudget selects the pod, and the API never
    evicts it until that is fixed."""

    @property
    def refusal(self) -> str:
        return f"more than one PodDisruptionBudget covers the pod: {self}"
