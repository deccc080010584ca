"""The eviction API's refusals by PodDisruptionBudgets, typed at the one boundary
(:func:`nodeguard.kube.client.translate_error`), against the real API server.

The right values come from kubernetes' eviction handler (pkg/registry/core/pod/storage/
eviction.go): ``checkAndDecrement`` answers a budget that allows no disruption with
``NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)``
and a ``DisruptionBudget`` cause (a Retry-After of 0 sends no header:
apimachinery's responsewriters set it only above 0); a pod that two budgets select gets a
Status of code 500, "This pod has more than one PodDisruptionBudget, which the eviction
subresource does not support."; a missing pod is a plain 404.
"""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from nodeguard.kube.client import KubeClient, translate_error
from nodeguard.kube.errors import (
    BudgetExhausted,
    EvictionRefused,
    MultipleBudgets,
    NotFound,
    ServerError,
    TooManyRequests,
)
from tests.support.kube_helpers import Cluster


async def test_a_budget_that_allows_none_is_a_budget_exhausted(
    cluster: Cluster, kube: KubeClient
) -> None:
    ns, node = cluster.namespace("err"), cluster.node()
    cluster.pod(namespace=ns, node=node, name="kept", request="1Gi", labels={"app": "kept"})
    cluster.blocking_pdb(ns, name="keep", labels={"app": "kept"})
    with pytest.raises(EvictionRefused) as refused:
        await kube.evict_pod(name="kept", namespace=ns, dry_run=True)
    exc = refused.value
    assert isinstance(exc, BudgetExhausted) and isinstance(exc, TooManyRequests)
    assert exc.status == 429 and exc.disruption_budget and not exc.transient
    assert exc.retry_after is None  # Retry-After 0: no header
    assert exc.refusal == (
        "PodDisruptionBudget: Cannot evict pod as it would violate the pod's disruption budget"
    )
    assert isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 429


async def test_a_pod_under_two_budgets_is_multiple_budgets(
    cluster: Cluster, kube: KubeClient
) -> None:
    ns, node = cluster.namespace("err"), cluster.node()
    cluster.pod(namespace=ns, node=node, name="twice", request="1Gi", labels={"a": "1", "b": "1"})
    for name, labels in (("pdb-a", {"a": "1"}), ("pdb-b", {"b": "1"})):
        cluster.policy.create_namespaced_pod_disruption_budget(
            ns,
            client.V1PodDisruptionBudget.model_validate(
                {
                    "metadata": {"name": name},
                    "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}},
                }
            ),
        )
    with pytest.raises(EvictionRefused) as refused:
        await kube.evict_pod(name="twice", namespace=ns, dry_run=True)
    exc = refused.value
    assert isinstance(exc, MultipleBudgets) and isinstance(exc, ServerError)
    assert exc.status == 500 and exc.retry_after is None
    assert exc.refusal == (
        "more than one PodDisruptionBudget covers the pod: This pod has more than one "
        "PodDisruptionBudget, which the eviction subresource does not support."
    )
    assert isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 500


async def test_a_missing_pod_is_not_a_refusal(cluster: Cluster, kube: KubeClient) -> None:
    """The look-alike: an eviction that fails for another reason is no budget's refusal."""
    ns = cluster.namespace("err")
    with pytest.raises(NotFound) as missing:
        await kube.evict_pod(name="absent", namespace=ns, dry_run=True)
    assert not isinstance(missing.value, EvictionRefused)


def test_throttling_and_other_server_errors_are_no_refusal() -> None:
    """A 429 without a ``DisruptionBudget`` cause is the API's own throttling (transient, its
    Retry-After kept), and a 500 that is not eviction.go's two-budget Status a server error."""
    throttled = ApiException(status=429, reason="Too Many Requests")
    throttled.body = '{"kind":"Status","message":"too many requests","reason":"TooManyRequests"}'
    throttled.headers = {"Retry-After": "3"}
    exc = translate_error(throttled)
    assert type(exc) is TooManyRequests and exc.transient and exc.retry_after == 3.0
    broken = ApiException(status=500, reason="Internal Server Error")
    broken.body = '{"kind":"Status","message":"etcdserver: request timed out"}'
    assert type(translate_error(broken)) is ServerError
