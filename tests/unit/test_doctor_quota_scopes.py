"""Which pods a scoped ResourceQuota counts (kubernetes pkg/quota/v1/evaluator/core/pods.go
``podMatchesScopeFunc``), and the ``quota-limitrange`` findings of scoped quotas: about the
pods a quota counts, never about those it cannot see."""

from __future__ import annotations

from typing import Any

import pytest

import nodeguard.doctor  # noqa: F401  (registers every check)
from nodeguard.doctor.findings import Finding
from nodeguard.doctor.inputs import Cluster
from nodeguard.doctor.quota_scopes import pod_scope, quota_matches, scope_requirements
from nodeguard.doctor.registry import CHECKS
from tests.support.doctor import GiB, cluster, container, limit_range, pod, quota


def matches(
    quota_spec: dict[str, Any], pod_spec: dict[str, Any], *, best_effort: bool = False
) -> bool:
    return quota_matches(
        scope_requirements(quota_spec), pod_scope({"spec": pod_spec}, best_effort=best_effort)
    )


def selector(scope: str, operator: str, *values: str) -> dict[str, Any]:
    expression: dict[str, Any] = {"scopeName": scope, "operator": operator}
    if values:
        expression["values"] = list(values)
    return {"scopeSelector": {"matchExpressions": [expression]}}


@pytest.mark.parametrize(
    ("quota_spec", "pod_spec", "expected"),
    [
        (selector("PriorityClass", "In", "high"), {"priorityClassName": "high"}, True),
        # Look-alikes: another case, a prefix, none.
        (selector("PriorityClass", "In", "high"), {"priorityClassName": "High"}, False),
        (selector("PriorityClass", "In", "high"), {"priorityClassName": "high-2"}, False),
        (selector("PriorityClass", "In", "high"), {}, False),
        (selector("PriorityClass", "NotIn", "high"), {"priorityClassName": "low"}, True),
        (selector("PriorityClass", "NotIn", "high"), {}, True),  # "" is not in [high]
        (selector("PriorityClass", "NotIn", "high"), {"priorityClassName": "high"}, False),
        (selector("PriorityClass", "Exists"), {"priorityClassName": "low"}, True),
        (selector("PriorityClass", "Exists"), {}, False),
        # The label set {PriorityClass: name} always has the key.
        (selector("PriorityClass", "DoesNotExist"), {}, False),
        (selector("PriorityClass", "DoesNotExist"), {"priorityClassName": "low"}, False),
        ({"scopes": ["Terminating"]}, {"activeDeadlineSeconds": 0}, True),
        ({"scopes": ["Terminating"]}, {}, False),
        ({"scopes": ["NotTerminating"]}, {}, True),
        ({"scopes": ["NotTerminating"]}, {"activeDeadlineSeconds": 600}, False),
        (
            {"scopes": ["CrossNamespacePodAffinity"]},
            {
                "affinity": {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"topologyKey": "x", "namespaceSelector": {}}
                        ]
                    }
                }
            },
            True,
        ),
        (
            {"scopes": ["CrossNamespacePodAffinity"]},
            {
                "affinity": {
                    "podAntiAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "weight": 1,
                                "podAffinityTerm": {"topologyKey": "x", "namespaces": ["b"]},
                            }
                        ]
                    }
                }
            },
            True,
        ),
        (  # an empty namespaces list is this namespace only
            {"scopes": ["CrossNamespacePodAffinity"]},
            {
                "affinity": {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"topologyKey": "x", "namespaces": []}
                        ]
                    }
                }
            },
            False,
        ),
        ({"scopes": ["NotBestEffort"]}, {}, True),
        ({"scopes": ["BestEffort"]}, {}, False),
        ({"scopes": ["SomeScopeOfTomorrow"]}, {}, False),
        # Every scope must match: spec.scopes and the selector together.
        (
            {"scopes": ["NotTerminating"], **selector("PriorityClass", "In", "high")},
            {"priorityClassName": "high", "activeDeadlineSeconds": 5},
            False,
        ),
        ({}, {}, True),
    ],
)
def test_a_scope_counts_the_pods_the_api_servers_evaluator_counts(
    quota_spec: dict[str, Any], pod_spec: dict[str, Any], expected: bool
) -> None:
    assert matches(quota_spec, pod_spec) is expected


def test_best_effort_is_the_pods_qos() -> None:
    assert matches({"scopes": ["BestEffort"]}, {}, best_effort=True)
    assert not matches({"scopes": ["NotBestEffort"]}, {}, best_effort=True)


def found(c: Cluster) -> list[Finding]:
    return list(CHECKS["quota-limitrange"].run(c))


HIGH = selector("PriorityClass", "In", "high")
DEFAULTS = limit_range("defaults", limits=[{"type": "Container", "default": {"memory": "16Gi"}}])


def test_a_quota_on_high_pods_says_nothing_about_the_low_pods_it_never_sees() -> None:
    q = quota("high", hard={"limits.memory": "8Gi"}, spec_extra=HIGH)
    low = pod("prep", node="n1", spec_extra={"priorityClassName": "low"})
    none = pod("web", node="n1")
    assert found(cluster(pods=(low, none), quotas=(q,), limit_ranges=(DEFAULTS,))) == []


def test_a_quota_on_high_pods_names_the_high_pods_a_default_gets_refused() -> None:
    q = quota("high", hard={"limits.memory": "8Gi"}, spec_extra=HIGH)
    pods = (
        pod("trainer-1", node="n1", spec_extra={"priorityClassName": "high"}),
        pod("prep", node="n1", spec_extra={"priorityClassName": "low"}),
        pod("done", node="n1", phase="Succeeded", spec_extra={"priorityClassName": "high"}),
    )
    (f,) = found(cluster(pods=pods, quotas=(q,), limit_ranges=(DEFAULTS,)))
    assert f.title == (
        "LimitRange default limit above the quota's limits.memory in ml "
        "(pods of scope PriorityClass In [high])"
    )
    assert [str(o) for o in f.objects] == [
        "LimitRange ml/defaults",
        "ResourceQuota ml/high",
        "Pod ml/trainer-1",
    ]
    assert [(x.label, x.bytes, x.text) for x in f.evidence] == [
        ("Container default memory", 16 * GiB, None),
        ("quota hard limits.memory", 8 * GiB, None),
        ("quota scope", None, "PriorityClass In [high]"),
        ("pods it counts", None, "trainer-1"),
    ]


def test_a_best_effort_pod_is_counted_as_its_defaulted_copy() -> None:
    # Given the LimitRange's memory default, the copy is Burstable: a NotBestEffort quota
    # counts it, a BestEffort one does not.
    scratch = pod("scratch", node="n1", qos="BestEffort", containers=[container()])
    for scopes, expected in ((["NotBestEffort"], 1), (["BestEffort"], 0)):
        q = quota("q", hard={"limits.memory": "8Gi"}, spec_extra={"scopes": scopes})
        assert (
            len(found(cluster(pods=(scratch,), quotas=(q,), limit_ranges=(DEFAULTS,)))) == expected
        )


def test_a_terminating_quota_without_defaults_names_the_jobs_it_counts() -> None:
    q = quota("jobs", hard={"limits.memory": "8Gi"}, spec_extra={"scopes": ["Terminating"]})
    job = pod("train-step", node="n1", spec_extra={"activeDeadlineSeconds": 3600})
    server = pod("serve", node="n1")
    (f,) = found(cluster(pods=(job, server), quotas=(q,)))
    assert f.title == (
        "quota on limits.memory in ml and no LimitRange default: pods without one are refused "
        "(pods of scope Terminating)"
    )
    assert [str(o) for o in f.objects] == ["ResourceQuota ml/jobs", "Pod ml/train-step"]
