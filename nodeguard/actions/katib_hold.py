"""What a Katib pause holds, and how every experiment it held is woken again.

A pause quota (``count/trials.kubeflow.org: 0``) holds its whole namespace. Katib's
Experiment controller (kubeflow/katib ``pkg/controller.v1beta1/experiment/
experiment_controller.go``) logs a Trial create the quota refused and goes on (``createTrials``:
"Trial create error", ``continue``); it reconciles an experiment again only on an event: its
watches are the Experiment itself (any update, no predicate) and the Trials and Suggestions it
controls. An experiment whose trials all ended while held gets no event once the quota goes, so
it stays stopped (until the cache's resync, hours later) unless someone updates it: the *kick*.

The kicks owed are recorded on the cluster before the quota goes, so no agent dies holding
them in memory: every unfinished experiment of a held namespace carries the label
``nodeguard.io/katib-held=true`` (put on at the pause and again just before a resume deletes
the quota, which also covers experiments made while held). :func:`release` kicks the labelled
ones once no pause quota is left in the namespace, each kick removing the label in the same
update. So whatever ends a pause — a resume killed between its kicks, two resumes at once (each
looks for other pauses *after* its own delete, so the later look sees none), the garbage
collector deleting the quota with its experiment (owner reference) — leaves labels that
:func:`stranded` finds and :func:`release` completes.

The pause is enforced only once the quota controller has written the quota's status: the API
server's ResourceQuota admission (k8s.io/apiserver ``pkg/admission/plugin/resourcequota/
controller.go`` ``CheckRequest``) checks ``status.hard``, not ``spec.hard``; with no
``status.hard`` nothing is restricted and a Trial is admitted; with ``status.hard`` but no
``status.used`` for it the create is refused as "status unknown for quota"; with both, as
"exceeded quota". So the pause holds once ``status.hard`` is written; :func:`enforcement`
waits, bounded, for that and for the count.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

from nodeguard.kube.client import JSON, KubeClient
from nodeguard.kube.errors import NotFound

__all__ = [
    "ANN_BY",
    "ANN_PAUSERS",
    "ANN_RESUMED",
    "ANN_RESUMING",
    "EXPERIMENTS",
    "EXPERIMENT_LABEL",
    "GROUP",
    "HELD_LABEL",
    "QUOTA_LABEL",
    "TRIALS",
    "TRIAL_COUNT",
    "VERSION",
    "Enforcement",
    "Release",
    "enforcement",
    "hold",
    "is_pause",
    "now",
    "pausers",
    "quota_name",
    "record_pausers",
    "release",
    "stranded",
    "unfinished",
]

GROUP, VERSION = "kubeflow.org", "v1beta1"
EXPERIMENTS, TRIALS = "experiments", "trials"
EXPERIMENT_LABEL = "katib.kubeflow.org/experiment"
TRIAL_COUNT = "count/trials.kubeflow.org"
QUOTA_LABEL = "nodeguard.io/katib-pause"
HELD_LABEL = "nodeguard.io/katib-held"
ANN_BY = "nodeguard.io/paused-by"
ANN_PAUSERS = "nodeguard.io/pausers"
ANN_RESUMED = "nodeguard.io/resumed-at"
# Set by a resume on the experiment, naming the UID of the quota it is about to delete: a
# pauser that finds it knows the quota is going (not a pause half made) and tries again later.
ANN_RESUMING = "nodeguard.io/resuming-quota"


def quota_name(experiment: str) -> str:
    """The pause quota's name for an experiment (a DNS subdomain: the experiment's name is a
    DNS label, at most 63 characters)."""
    return f"nodeguard-katib-pause-{experiment}"


def now() -> str:
    """The time now, as the annotations write it (RFC 3339, UTC, seconds)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_pause(quota: JSON, experiment: str | None = None) -> bool:
    """Whether ``quota`` is a nodeguard pause (of ``experiment`` when given): nodeguard's
    label, the experiment's label, the pause's name and exactly ``count/trials.kubeflow.org:
    0`` as its spec. A user's quota that happens to bear the name, or that carries the label
    with other limits, is not one: nodeguard neither counts on it nor deletes it."""
    meta = quota.get("metadata") or {}
    labels = meta.get("labels") or {}
    exp = labels.get(EXPERIMENT_LABEL)
    return (
        labels.get(QUOTA_LABEL) == "true"
        and bool(exp)
        and (experiment is None or exp == experiment)
        and meta.get("name") == quota_name(str(exp))
        and ((quota.get("spec") or {}).get("hard") or {}) == {TRIAL_COUNT: "0"}
    )


def unfinished(experiment: JSON) -> bool:
    """No terminal condition (Succeeded or Failed, status True): Katib still reconciles it."""
    return not any(
        c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True"
        for c in (experiment.get("status") or {}).get("conditions") or []
    )


def pausers(annotations: Mapping[str, str], *, fallback: str | None) -> list[str]:
    """Every ``<node>/<rule>`` holding the pause, first one first: the experiment's
    ``nodeguard.io/pausers`` (a JSON list), else ``[fallback]`` (a pause made before the list,
    or whose mark on the experiment was lost: its quota's ``paused-by``), else none."""
    raw = annotations.get(ANN_PAUSERS)
    if raw:
        try:
            found = json.loads(raw)
        except ValueError:
            found = None
        if isinstance(found, list) and all(isinstance(p, str) for p in found):
            return list(dict.fromkeys(found))
    return [fallback] if fallback is not None else []


async def _patch(kube: KubeClient, namespace: str, name: str, patch: JSON, dry_run: bool) -> bool:
    try:
        await kube.patch_custom(
            group=GROUP,
            version=VERSION,
            plural=EXPERIMENTS,
            namespace=namespace,
            name=name,
            patch=patch,
            dry_run=dry_run,
        )
    except NotFound:  # deleted meanwhile: nothing to hold or kick
        return False
    return True


async def hold(
    kube: KubeClient, *, namespace: str, experiments: Iterable[JSON], dry_run: bool
) -> tuple[str, ...]:
    """Label every unfinished one of ``experiments`` (of ``namespace``) as held, where it is
    not yet: the record of the kick it is owed. Their names, labelled now or before."""
    held = []
    for exp in experiments:
        meta = exp.get("metadata") or {}
        if not unfinished(exp):
            continue
        name = str(meta.get("name", ""))
        if (meta.get("labels") or {}).get(HELD_LABEL) != "true":
            patch: JSON = {"metadata": {"labels": {HELD_LABEL: "true"}}}
            if not await _patch(kube, namespace, name, patch, dry_run):
                continue
        held.append(name)
    return tuple(sorted(held))


@dataclass(frozen=True, slots=True, kw_only=True)
class Release:
    """What :func:`release` found. ``held_by``: the experiments whose pause quotas still hold
    the namespace (then nothing was kicked); ``kicked``: the experiments updated so Katib
    reconciles them."""

    held_by: tuple[str, ...]
    kicked: tuple[str, ...]


async def release(
    kube: KubeClient,
    *,
    namespace: str,
    gone: str | None = None,
    also: Iterable[str] = (),
    dry_run: bool,
) -> Release:
    """Kick the held experiments of ``namespace`` if no pause quota holds it any more: each
    labelled one (and each of ``also``) is updated (label removed, ``nodeguard.io/resumed-at``
    set), an event Katib's controller reconciles on. Call it *after* deleting a quota: the
    pauses are read now, so of two resumes at once the later read sees none. ``gone``: the
    quota just deleted (a dry run did not delete it: it is not counted)."""
    pauses = await kube.list_resource_quotas(
        label_selector=f"{QUOTA_LABEL}=true", namespace=namespace
    )
    held_by = sorted(
        str(q["metadata"]["labels"][EXPERIMENT_LABEL])
        for q in pauses
        if is_pause(q) and q["metadata"]["name"] != gone
    )
    if held_by:
        return Release(held_by=tuple(held_by), kicked=())
    labelled = await kube.list_custom(
        group=GROUP,
        version=VERSION,
        plural=EXPERIMENTS,
        namespace=namespace,
        label_selector=f"{HELD_LABEL}=true",
    )
    names = sorted({str(e["metadata"]["name"]) for e in labelled} | set(also))
    kick: JSON = {
        "metadata": {
            "labels": {HELD_LABEL: None},
            "annotations": {ANN_RESUMED: now(), ANN_RESUMING: None},
        }
    }
    kicked = [n for n in names if await _patch(kube, namespace, n, kick, dry_run)]
    return Release(held_by=(), kicked=tuple(kicked))


async def stranded(kube: KubeClient) -> list[str]:
    """Namespaces with experiments labelled held and no pause quota left: a pause ended with
    its kicks undone (its resume killed between them, its quota garbage-collected with its
    experiment). Sorted."""
    labelled = await kube.list_custom(
        group=GROUP, version=VERSION, plural=EXPERIMENTS, label_selector=f"{HELD_LABEL}=true"
    )
    if not labelled:
        return []
    pauses = await kube.list_resource_quotas(label_selector=f"{QUOTA_LABEL}=true")
    paused = {str(q["metadata"]["namespace"]) for q in pauses if is_pause(q)}
    return sorted({str(e["metadata"]["namespace"]) for e in labelled} - paused)


@dataclass(frozen=True, slots=True, kw_only=True)
class Enforcement:
    """Whether the API server enforces a pause quota. ``enforced``: its ``status.hard`` holds
    ``count/trials.kubeflow.org``, so admission refuses every new Trial (else ``why`` says what
    is missing); ``counted``: ``status.used`` holds it too (refusals say "exceeded quota";
    before, "status unknown for quota"). ``quota``: the quota as last read (``None``: gone)."""

    enforced: bool
    counted: bool
    why: str | None
    quota: JSON | None


def _status(quota: JSON | None) -> tuple[str | None, bool]:
    if quota is None:
        return "the quota is gone", False
    status = quota.get("status") or {}
    counted = TRIAL_COUNT in (status.get("used") or {})
    if TRIAL_COUNT not in (status.get("hard") or {}):
        return (
            "the quota controller (kube-controller-manager) has not written its status.hard, "
            "and until it does the API server admits new Trials"
        ), counted
    return None, counted


async def enforcement(
    kube: KubeClient,
    *,
    namespace: str,
    experiment: str,
    wait: float,
    interval: float = 0.25,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Enforcement:
    """Read the pause quota of ``experiment`` until the quota controller has written its
    status and counted Trials, at most ``wait`` seconds (every ``interval``); by then it may be
    enforced without being counted (a quota made before the controller discovered Trials is
    counted at its next full resync, 5 min by default: admission refuses Trials meanwhile).
    ``sleep``/``clock`` for a fake clock. Raises :class:`~nodeguard.kube.errors.KubeError` on
    an API error."""
    deadline = clock() + wait
    while True:
        pauses = await kube.list_resource_quotas(
            label_selector=f"{QUOTA_LABEL}=true", namespace=namespace
        )
        quota = next((q for q in pauses if is_pause(q, experiment)), None)
        why, counted = _status(quota)
        # Enforced and counted, or as good as it gets by the deadline.
        if (why is None and counted) or quota is None or clock() >= deadline:
            return Enforcement(enforced=why is None, counted=counted, why=why, quota=quota)
        await sleep(interval)


async def record_pausers(
    kube: KubeClient,
    *,
    experiment: JSON,
    annotations: Mapping[str, str | None],
    dry_run: bool,
) -> None:
    """Patch the experiment's annotations with its ``resourceVersion`` as a precondition: a
    pauser or resumer that changed it since it was read makes this a
    :class:`~nodeguard.kube.errors.Conflict` (re-read and decide again), so two of them never
    overwrite each other's list."""
    meta = experiment["metadata"]
    patch: JSON = {
        "metadata": {"resourceVersion": meta["resourceVersion"], "annotations": dict(annotations)}
    }
    await kube.patch_custom(
        group=GROUP,
        version=VERSION,
        plural=EXPERIMENTS,
        namespace=meta["namespace"],
        name=meta["name"],
        patch=patch,
        dry_run=dry_run,
    )
