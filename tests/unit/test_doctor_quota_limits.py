"""``nodeguard doctor``'s ``quota-limitrange`` check on typed inputs: a namespace's quota and
LimitRanges that together refuse pods."""

from __future__ import annotations

from typing import Any

import yaml

import nodeguard.doctor  # noqa: F401  (registers every check)
from nodeguard.doctor.findings import Finding
from nodeguard.doctor.inputs import Cluster, LimitItem
from nodeguard.doctor.quota_limits import FALLBACK_LIMIT, starting_defaults
from nodeguard.doctor.registry import CHECKS
from tests.support.doctor import GiB, cluster, container, limit_range, pod, quota


def found(c: Cluster) -> list[Finding]:
    return list(CHECKS["quota-limitrange"].run(c))


def test_a_default_limit_above_the_quota_refuses_every_defaulted_pod() -> None:
    q = quota("compute", hard={"limits.memory": "8Gi", "requests.memory": "4Gi"})
    lr = limit_range(
        "defaults",
        limits=[
            {
                "type": "Container",
                "default": {"memory": "16Gi"},
                "defaultRequest": {"memory": "2Gi"},
            }
        ],
    )
    (f,) = found(cluster(quotas=(q,), limit_ranges=(lr,)))
    assert f.severity == "error"
    assert f.title == "LimitRange default limit above the quota's limits.memory in ml"
    assert [str(o) for o in f.objects] == ["LimitRange ml/defaults", "ResourceQuota ml/compute"]
    assert [(x.label, x.bytes) for x in f.evidence] == [
        ("Container default memory", 16 * GiB),
        ("quota hard limits.memory", 8 * GiB),
    ]
    assert f.fix == (
        "# lower spec.limits[0].default.memory to at most 8192Mi (or raise the quota):\n"
        "kubectl -n ml edit limitrange defaults"
    )


def test_a_default_request_above_the_quota_and_memory_as_requests() -> None:
    q = quota("compute", hard={"memory": "1Gi"})  # "memory" is requests.memory
    lr = limit_range(
        "defaults", limits=[{"type": "Container", "defaultRequest": {"memory": "2Gi"}}]
    )
    (f,) = found(cluster(quotas=(q,), limit_ranges=(lr,)))
    assert f.title == "LimitRange default request above the quota's requests.memory in ml"


def test_defaults_that_fit_the_quota_exactly_are_fine() -> None:
    q = quota("compute", hard={"limits.memory": "8Gi", "requests.memory": "4Gi"})
    lr = limit_range(
        "defaults",
        limits=[
            {"type": "Container", "default": {"memory": "8Gi"}, "defaultRequest": {"memory": "4Gi"}}
        ],
    )
    assert found(cluster(quotas=(q,), limit_ranges=(lr,))) == []


def test_min_above_max_across_two_limit_ranges() -> None:
    a = limit_range("floor", limits=[{"type": "Container", "min": {"memory": "2Gi"}}])
    b = limit_range("ceiling", limits=[{"type": "Pod", "max": {"memory": "1Gi"}}])
    (f,) = found(cluster(limit_ranges=(a, b)))
    assert f.title == "LimitRange Container min above Pod max in ml: every pod is refused"
    assert {str(o) for o in f.objects} == {"LimitRange ml/floor", "LimitRange ml/ceiling"}
    assert [x.bytes for x in f.evidence] == [2 * GiB, GiB]
    fits = limit_range("ceiling", limits=[{"type": "Pod", "max": {"memory": "2Gi"}}])
    assert found(cluster(limit_ranges=(a, fits))) == []


def test_a_limits_quota_with_no_default_limit_refuses_pods_without_one() -> None:
    q = quota("compute", hard={"limits.memory": "8Gi"})
    (f,) = found(cluster(quotas=(q,)))
    assert f.title == (
        "quota on limits.memory in ml and no LimitRange default: pods without one are refused"
    )
    # No container of the namespace sets memory: the 1 GiB starting value, below the quota.
    assert f.fix.splitlines()[-3:] == [
        "  - type: Container",
        "    default: {memory: 1024Mi}",
        "EOF",
    ]
    # Given a default limit (its defaultRequest filled from it by the API server): no finding.
    lr = limit_range(
        "defaults",
        limits=[
            {"type": "Container", "default": {"memory": "1Gi"}, "defaultRequest": {"memory": "1Gi"}}
        ],
    )
    assert found(cluster(quotas=(q,), limit_ranges=(lr,))) == []


def test_a_scoped_quota_that_counts_no_pod_and_namespaces_out_of_scope_yield_nothing() -> None:
    scoped = quota("scoped", hard={"limits.memory": "8Gi"}, scoped=True)
    other = quota("compute", namespace="team-b", hard={"limits.memory": "8Gi"})
    assert found(cluster(quotas=(scoped, other), namespaces=frozenset({"ml"}))) == []


def test_both_quota_names_without_defaults_are_one_finding_with_one_limit_range() -> None:
    """Two LimitRanges named alike, one per finding, would overwrite each other when applied:
    one finding, one LimitRange giving both, at the median of what the containers set, within
    the quota and the namespace's Container max, the request at most the limit."""
    q = quota("compute", hard={"limits.memory": "64Gi", "requests.memory": "6Gi"})
    cap = limit_range("ceiling", limits=[{"type": "Container", "max": {"memory": "3Gi"}}])
    pods = tuple(
        pod(f"p{i}", node="n1", containers=[container(request=r, limit=lim)])
        for i, (r, lim) in enumerate((("1Gi", "2Gi"), ("8Gi", "8Gi"), ("512Mi", "4Gi")))
    )
    (f,) = found(cluster(pods=pods, quotas=(q,), limit_ranges=(cap,)))
    assert f.title == (
        "quota on limits.memory and requests.memory in ml and no LimitRange default and "
        "defaultRequest: pods without one are refused"
    )
    assert [str(o) for o in f.objects] == ["ResourceQuota ml/compute"]
    assert [(x.label, x.bytes) for x in f.evidence][:2] == [
        ("quota hard limits.memory", 64 * GiB),
        ("quota hard requests.memory", 6 * GiB),
    ]
    manifest = f.fix.split("<<EOF\n", 1)[1].rsplit("EOF", 1)[0]
    (item,) = yaml.safe_load(manifest)["spec"]["limits"]
    # Limits 2, 8, 4 Gi: median 4 Gi, held to the Container max of 3 Gi; requests 1, 8, 0.5:
    # median 1 Gi.
    assert item == {
        "type": "Container",
        "default": {"memory": "3072Mi"},
        "defaultRequest": {"memory": "1024Mi"},
    }


def test_starting_defaults_stay_within_min_quota_and_the_limit() -> None:
    floor = limit_range_view_items([{"type": "Container", "min": {"memory": "2Gi"}}])
    big = (pod("p", node="n1", containers=[container(request="40Gi", limit="40Gi")]),)
    assert starting_defaults(pods=(), items=floor, hard_limits=None, hard_requests=GiB) == [
        ("defaultRequest", 2 * GiB)  # the floor wins: below it LimitRanger refuses the pod
    ]
    assert starting_defaults(pods=big, items=(), hard_limits=8 * GiB, hard_requests=16 * GiB) == [
        ("default", 8 * GiB),
        ("defaultRequest", 8 * GiB),  # never above the default limit (ValidateLimitRange)
    ]
    assert starting_defaults(pods=(), items=(), hard_limits=None, hard_requests=None) == []
    assert GiB == FALLBACK_LIMIT


def limit_range_view_items(limits: list[dict[str, Any]]) -> tuple[LimitItem, ...]:
    return limit_range("lr", limits=limits).items
