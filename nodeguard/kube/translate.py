"""The client's and the transport's exceptions as :mod:`nodeguard.kube.errors` types, by the
API's status code and Status body (``metav1.Status``: ``message``, ``reason``,
``details.causes``).
"""

from __future__ import annotations

import json
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from nodeguard.kube.errors import (
    BudgetExhausted,
    Conflict,
    Forbidden,
    Invalid,
    KubeError,
    MultipleBudgets,
    NotFound,
    ServerError,
    TooManyRequests,
)

__all__ = ["translate_error"]

#: What the eviction handler's 500 for a pod under two budgets says (eviction.go).
_MULTIPLE_BUDGETS = "more than one PodDisruptionBudget"


def translate_error(exc: Exception) -> KubeError:
    """Map a client or transport exception (kubernetes ``ApiException``, urllib3's
    ``HTTPError``, ``OSError``) to our error type (the caller raises it ``from exc``). Any
    other exception is a programming error, not an API outcome: ``TypeError``."""
    if isinstance(exc, ApiException):
        return _from_status(exc)
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        return ServerError(f"API server unreachable: {exc}", unreachable=True)
    raise TypeError(f"not a client or transport error: {type(exc).__name__}") from exc


def _from_status(exc: ApiException) -> KubeError:
    status = int(exc.status or 0)
    body: dict[str, Any] = {}
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    message = str(body.get("message") or exc.reason or exc)
    reason = str(body.get("reason") or "")
    if status == 404:
        return NotFound(message, status=status, reason=reason)
    if status == 409:
        return Conflict(message, status=status, reason=reason)
    if status == 429:
        causes = (body.get("details") or {}).get("causes") or []
        pdb = any(c.get("reason") == "DisruptionBudget" for c in causes) or (
            "disruption budget" in message.lower()
        )
        retry = (exc.headers or {}).get("Retry-After") if exc.headers else None
        seconds = float(retry) if retry and str(retry).isdigit() else None
        if pdb:
            return BudgetExhausted(message, reason=reason, retry_after=seconds)
        return TooManyRequests(message, reason=reason, retry_after=seconds)
    if status in (401, 403):
        return Forbidden(message, status=status, reason=reason)
    if status in (400, 422):
        return Invalid(message, status=status, reason=reason)
    if status == 0:
        return ServerError(message, unreachable=True)
    if status == 500 and _MULTIPLE_BUDGETS in message:
        # eviction.go's Status for a pod under two budgets: no reason or cause to go by.
        return MultipleBudgets(message, status=status, reason=reason)
    return ServerError(message, status=status, reason=reason)
