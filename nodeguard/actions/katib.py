"""Pausing and resuming Katib experiments (kubeflow.org/v1beta1) without losing a trial.

Katib has no suspend, and its Experiment controller (kubeflow/katib v0.19,
``pkg/controller.v1beta1/experiment/experiment_controller.go``) makes the obvious pause
destructive: ``ReconcileTrials`` computes ``active = pending + running`` from the trials, and
when ``spec.parallelTrialCount`` is below it, ``deleteTrials`` deletes the ``active - parallel``
newest trials at once, wherever they run. nodeguard therefore never touches
``parallelTrialCount`` (nor ``maxTrialCount``: reaching it ends the experiment, and with the
default ``resumePolicy: Never`` it cannot be restarted).

**The pause** is a ResourceQuota ``nodeguard-katib-pause-<experiment>`` in the experiment's
namespace with ``count/trials.kubeflow.org: "0"``. The API server's ResourceQuota admission
refuses every new Trial object there; nothing is deleted (a quota is checked only when an
object is created), so running and pending trials run to their end. Katib's ``createTrials``
logs the refused create and goes on (it does not requeue); the trial's suggestion stays in
the Suggestion's status, so nothing is lost either. It is race-free: the API server enforces
it, not a reconcile loop racing Katib's. Its scope is the whole namespace — an object-count
quota cannot select one experiment's Trials — so every experiment of that namespace is held
while it stands; the dry run, the result and the Event name them. What was paused, by whom
(``<node>/<rule>``), why and when live on the quota (labels ``nodeguard.io/katib-pause`` and
``katib.kubeflow.org/experiment``, annotations) and on the Experiment (annotations), so any
agent after any restart, and ``nodeguard act resume-katib``, finds and resumes it.

The pause is done only once the API server enforces it: admission reads the quota's
``status.hard``, which the quota controller writes (:mod:`nodeguard.actions.katib_hold`); the
pause waits, bounded, until the quota counts Trials, and names any Trial created meanwhile.
Every pauser (``<node>/<rule>``) is recorded on the Experiment (``nodeguard.io/pausers``); a
rule's resolve lets go of its own hold and the last one ends the pause (by hand: one pauser, or
``force``). A quota that bears the pause's name but not nodeguard's labels and spec is a
user's: never taken for the pause, never deleted.

**The resume** marks the Experiment as resuming (the quota's UID, so a pauser coming in between
tries again instead of joining a pause that is going), labels every unfinished experiment of
the namespace held (the kicks owed, on the cluster), deletes the quota (UID precondition: only
the one nodeguard made), then reads the namespace's pauses again and, with none left, updates
every held experiment (label removed, ``nodeguard.io/resumed-at`` set): Katib does not retry a
refused create by itself, and an update of the Experiment is an event its controller watches,
so it reconciles at once and creates the trials it is owed. Every resume also completes the
kicks any ended pause left undone (:func:`~nodeguard.actions.katib_hold.stranded`).

Relief for a node under memory pressure comes from cordon and eviction; the pause only stops
an experiment from adding trials while it lasts. Pauses made by nodeguard before this design
(``nodeguard.io/paused-parallel-trial-count``) are still resumed: their count is restored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, Field, model_validator

from nodeguard.actions.args import ActionArgs, Flag
from nodeguard.actions.base import ActionResult, AuditEvent, ObjectRef, Outcome
from nodeguard.actions.katib_hold import (
    ANN_BY,
    ANN_PAUSERS,
    ANN_RESUMING,
    EXPERIMENT_LABEL,
    EXPERIMENTS,
    GROUP,
    QUOTA_LABEL,
    TRIAL_COUNT,
    TRIALS,
    VERSION,
    Enforcement,
    enforcement,
    hold,
    is_pause,
    pausers,
    quota_name,
    record_pausers,
    release,
    stranded,
    unfinished,
)
from nodeguard.actions.katib_hold import now as _now
from nodeguard.actions.registry import Action, register
from nodeguard.kube.client import JSON, KubeClient
from nodeguard.kube.errors import Conflict, KubeError, NotFound
from nodeguard.kube.objects import pod_meta
from nodeguard.snapshot import PodMeta

if TYPE_CHECKING:
    from nodeguard.actions.context import Call

__all__ = [
    "EXPERIMENT_LABEL",
    "QUOTA_LABEL",
    "Census",
    "census",
    "experiments_on_node",
    "pause_experiment",
    "paused_experiments",
    "quota_name",
    "resume_experiment",
]

ANN_AT = "nodeguard.io/paused-at"
ANN_REASON = "nodeguard.io/pause-reason"
ANN_QUOTA = "nodeguard.io/pause-quota"
_PAUSE_ANNOTATIONS = (ANN_BY, ANN_AT, ANN_REASON, ANN_QUOTA, ANN_PAUSERS)
# The pause of nodeguard before 0.2 (parallelTrialCount lowered): still resumed.
LEGACY_COUNT = "nodeguard.io/paused-parallel-trial-count"
LEGACY_FLOOR = "nodeguard.io/paused-at-parallel-trial-count"
_UNSET = "unset"
DEFAULT_PARALLEL = 3
#: How long a pause waits for the quota controller to make its quota count Trials.
DEFAULT_ENFORCE_WAIT = 10.0
# Reads and decides again this often when the experiment changed meanwhile (Katib's own status
# updates change its resourceVersion too), a short while apart.
_ATTEMPTS = 8
_AGAIN_DELAY = 0.2


def experiments_on_node(pods: Mapping[str, PodMeta]) -> list[tuple[str, str]]:
    """``(namespace, experiment)`` of every experiment with a live trial pod on the node (pod
    label ``katib.kubeflow.org/experiment``, set by Katib's trial templates): neither
    terminating nor finished. A trial's pod kept after it ended (``retain: true``, katib#708;
    phase ``Succeeded``/``Failed``) runs nothing here and holds no experiment."""
    found = {
        (p.namespace, p.labels[EXPERIMENT_LABEL])
        for p in pods.values()
        if EXPERIMENT_LABEL in p.labels and not p.terminating and not p.finished
    }
    return sorted(found)


# -- Katib's own arithmetic --------------------------------------------------------------------
def _has(trial: JSON, kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (trial.get("status") or {}).get("conditions") or []
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Census:
    """An experiment's trials as Katib's controller counts them
    (``experiment/util/status_util.go`` ``updateTrialsSummary``: a trial is killed, failed,
    succeeded, early-stopped, running or metrics-unavailable, in that order of its true
    conditions, else pending) and what ``ReconcileTrials`` makes of them.

    ``running``/``pending``: trial names; ``completed``: succeeded + failed + killed +
    early-stopped (what ``ReconcileTrials`` subtracts from ``maxTrialCount``); ``parallel``:
    ``spec.parallelTrialCount``; ``max_trials``: ``spec.maxTrialCount`` (``None``: no cap)."""

    running: tuple[str, ...]
    pending: tuple[str, ...]
    completed: int
    parallel: int | None
    max_trials: int | None

    @property
    def active(self) -> int:
        return len(self.running) + len(self.pending)

    def deletes(self) -> int:
        """Trials Katib deletes at its next reconcile: ``active - parallel`` when positive."""
        if self.parallel is None:
            return 0
        return max(0, self.active - self.parallel)

    def may_start(self) -> int:
        """Trials Katib creates at its next reconcile with no quota in the way:
        ``min(parallel, max - completed) - active`` when positive."""
        if self.parallel is None:
            return 0
        wanted = self.parallel
        if self.max_trials is not None:
            wanted = min(wanted, self.max_trials - self.completed)
        return max(0, wanted - self.active)


def census(experiment: JSON, trials: Iterable[JSON]) -> Census:
    """Count ``trials`` (those of the experiment) as Katib does."""
    running, pending, completed = [], [], 0
    for t in trials:
        name = str(t.get("metadata", {}).get("name", ""))
        if any(_has(t, k) for k in ("Killed", "Failed", "Succeeded", "EarlyStopped")):
            completed += 1
        elif _has(t, "Running"):
            running.append(name)
        elif not _has(t, "MetricsUnavailable"):
            pending.append(name)
    spec = experiment.get("spec") or {}
    parallel, max_trials = spec.get("parallelTrialCount"), spec.get("maxTrialCount")
    return Census(
        running=tuple(sorted(running)),
        pending=tuple(sorted(pending)),
        completed=completed,
        parallel=int(parallel) if parallel is not None else None,
        max_trials=int(max_trials) if max_trials is not None else None,
    )


def _finished(exp: JSON) -> str | None:
    """The terminal condition of an Experiment (Succeeded or Failed, status True), if any."""
    for cond in (exp.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Succeeded", "Failed") and cond.get("status") == "True":
            return str(cond["type"]).lower()
    return None


def _names(items: Iterable[str], *, most: int = 8) -> str:
    items = list(items)
    shown = ", ".join(items[:most])
    return shown + (f" and {len(items) - most} more" if len(items) > most else "") or "none"


# -- one experiment ----------------------------------------------------------------------------
@dataclass(slots=True, kw_only=True)
class _Target:
    """What pause and resume read first: the experiment, its trials, its namespace's
    experiments and Trials, and the pause quota if there is one (``quota``: only one that is
    nodeguard's pause, :func:`is_pause`; ``foreign``: a quota of nodeguard's label and the
    pause's name that is not)."""

    namespace: str
    name: str
    experiment: JSON
    census: Census
    experiments: tuple[JSON, ...]
    trials: frozenset[str]
    quota: JSON | None
    foreign: bool

    @property
    def neighbours(self) -> tuple[str, ...]:
        """The namespace's other unfinished experiments (what the quota holds too)."""
        return tuple(
            sorted(
                str(e["metadata"]["name"])
                for e in self.experiments
                if e["metadata"]["name"] != self.name and unfinished(e)
            )
        )

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef(
            kind="Experiment",
            name=self.name,
            namespace=self.namespace,
            uid=str(self.experiment.get("metadata", {}).get("uid", "")),
            api_version=f"{GROUP}/{VERSION}",
        )

    @property
    def annotations(self) -> Mapping[str, str]:
        return self.experiment.get("metadata", {}).get("annotations") or {}

    @property
    def resuming(self) -> bool:
        """A resume marked the experiment and is deleting this very quota."""
        return self.quota is not None and self.annotations.get(ANN_RESUMING) == str(
            self.quota["metadata"].get("uid")
        )

    def paused_by(self) -> str | None:
        """Who paused it first (``<node>/<rule>``), from the quota or the experiment; ``None``
        when nodeguard did not."""
        if self.quota is not None:
            return str((self.quota["metadata"].get("annotations") or {}).get(ANN_BY, ""))
        if ANN_BY in self.annotations or LEGACY_COUNT in self.annotations:
            return str(self.annotations.get(ANN_BY, ""))
        return None

    def pausers(self) -> list[str]:
        """Everyone holding the pause (:func:`pausers`); none when not paused or when a resume
        is deleting the quota."""
        if self.resuming:
            return []
        marked = self.annotations.get(ANN_QUOTA) == quota_name(self.name)
        if self.quota is not None and not marked:
            # The quota without the mark: a pause cut short between the two, or one made
            # before the list: its quota names its pauser.
            return pausers({}, fallback=self.paused_by())
        return pausers(self.annotations, fallback=self.paused_by())


async def _read(kube: KubeClient, namespace: str, name: str) -> _Target:
    exp = await kube.get_custom(
        group=GROUP, version=VERSION, plural=EXPERIMENTS, namespace=namespace, name=name
    )
    trials = await kube.list_custom(
        group=GROUP, version=VERSION, plural=TRIALS, namespace=namespace
    )
    others = await kube.list_custom(
        group=GROUP, version=VERSION, plural=EXPERIMENTS, namespace=namespace
    )
    # Every quota, not only those of nodeguard's label: a user's that bears the pause's name
    # must be told apart from the pause (the name alone would make the create a Conflict).
    quotas = await kube.list_resource_quotas(namespace=namespace)
    quota = next((q for q in quotas if is_pause(q, name)), None)
    return _Target(
        namespace=namespace,
        name=name,
        experiment=exp,
        census=census(
            exp,
            (
                t
                for t in trials
                if (t["metadata"].get("labels") or {}).get(EXPERIMENT_LABEL) == name
            ),
        ),
        experiments=tuple(others),
        trials=frozenset(str(t["metadata"]["name"]) for t in trials),
        quota=quota,
        foreign=quota is None and any(q["metadata"]["name"] == quota_name(name) for q in quotas),
    )


def _quota_body(t: _Target, *, by: str, reason: str) -> JSON:
    meta = t.experiment.get("metadata", {})
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {
            "name": quota_name(t.name),
            "namespace": t.namespace,
            # Owned by the experiment: deleting it deletes the pause (the garbage collector),
            # so a pause never outlives what it paused; the held labels on the namespace's
            # experiments say who is owed a kick then. Not blocking: no finalizer rights needed.
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "Experiment",
                    "name": t.name,
                    "uid": meta.get("uid", ""),
                    "controller": False,
                    "blockOwnerDeletion": False,
                }
            ],
            "labels": {QUOTA_LABEL: "true", EXPERIMENT_LABEL: t.name},
            "annotations": {
                ANN_BY: by,
                ANN_AT: _now(),
                ANN_REASON: reason[:512],
                "nodeguard.io/note": "Katib Experiment "
                f"{t.namespace}/{t.name} paused by nodeguard: no new Trial may be created in "
                "this namespace while this quota exists; delete it (or run nodeguard act "
                "resume-katib) to resume",
            },
        },
        "spec": {"hard": {TRIAL_COUNT: "0"}},
    }


def _scope(t: _Target) -> str:
    if not t.neighbours:
        return f"namespace {t.namespace} has no other running experiment"
    return (
        f"the quota holds the whole namespace {t.namespace}: also experiment(s) "
        f"{_names(t.neighbours)}"
    )


def _foreign(t: _Target) -> str:
    return (
        f"Katib experiment {t.namespace}/{t.name} not paused: a ResourceQuota "
        f"{quota_name(t.name)} exists in {t.namespace} and is not nodeguard's pause (it lacks "
        f"the label {QUOTA_LABEL}=true or {EXPERIMENT_LABEL}={t.name}, or its spec.hard is not "
        f"{TRIAL_COUNT}: 0); it is left as it is"
    )


@dataclass(slots=True, kw_only=True)
class _Results:
    """Makes the results of one action on one experiment, each with its Event on the
    experiment (``target``, once read; by name before that)."""

    action: str
    node: str
    dry_run: bool
    namespace: str
    name: str
    target: _Target | None = None

    def __call__(
        self, outcome: Outcome, message: str, reason: str, *, retry: bool = False, **details: Any
    ) -> ActionResult:
        ref = (
            self.target.ref
            if self.target is not None
            else ObjectRef(
                kind="Experiment",
                name=self.name,
                namespace=self.namespace,
                api_version=f"{GROUP}/{VERSION}",
            )
        )
        return ActionResult(
            action=self.action,
            node=self.node,
            dry_run=self.dry_run,
            outcome=outcome,
            message=message,
            details={"experiment": f"{self.namespace}/{self.name}", **details},
            events=(
                AuditEvent(
                    obj=ref,
                    reason=reason,
                    message=message,
                    type="Normal" if outcome in ("done", "noop") else "Warning",
                ),
            ),
            retry=retry,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Paused:
    """One pass of a pause that stood: who holds it now, whether this pass made it or joined
    it, and whether the API server enforces it (``None``: a dry run, not checked)."""

    target: _Target
    created: bool
    joined: bool
    marked: bool
    holders: tuple[str, ...]
    enforced: Enforcement | None
    created_meanwhile: tuple[str, ...]


class _Again(Exception):
    """Someone changed the experiment or the quota since it was read: read and decide again."""


@dataclass(slots=True, kw_only=True)
class _Progress:
    """What a pause keeps from one read-and-decide pass to the next: the namespace's Trials
    at its first read (what was created after is "meanwhile") and whether it made the quota
    (then the pausers start afresh: marks on the experiment are an ended pause's)."""

    baseline: frozenset[str] | None = None
    made: bool = False


async def _pause_once(
    kube: KubeClient,
    t: _Target,
    *,
    by: str,
    reason: str,
    dry_run: bool,
    wait: float,
    progress: _Progress,
) -> _Paused:
    """Create the quota (or find it), wait until it is enforced, record ``by`` among its
    pausers on the experiment, label the namespace's experiments held. Raises :class:`_Again`
    when a concurrent pauser or resumer got in between, :class:`KubeError` otherwise."""
    ns, name = t.namespace, t.name
    if t.resuming and t.quota is not None:
        # A resume is deleting this quota (or was killed before it could): delete it in its
        # place (UID precondition) and pause afresh. The held labels it left stay, so the
        # kicks it owed come when the new pause ends.
        if not dry_run:
            await _delete_quota(kube, t.quota, dry_run=False)
            raise _Again("a resume was deleting the pause quota")
        t.quota = None
    if progress.baseline is None:
        progress.baseline = t.trials
    if t.quota is None:
        try:
            await kube.create_resource_quota(
                namespace=ns, body=_quota_body(t, by=by, reason=reason), dry_run=dry_run
            )
        except Conflict as exc:  # made meanwhile by another pauser, or a user's of that name
            raise _Again("the quota was made meanwhile") from exc
        progress.made = True
    created = progress.made
    enforced = None
    created_meanwhile: tuple[str, ...] = ()
    if not dry_run:
        # Admission reads status.hard, which the quota controller writes: until then a Trial
        # may still be created, and the pause must not be said done.
        enforced = await enforcement(kube, namespace=ns, experiment=name, wait=wait)
        if enforced.quota is None:
            raise _Again("the quota went meanwhile (resumed)")
        trials = await kube.list_custom(group=GROUP, version=VERSION, plural=TRIALS, namespace=ns)
        created_meanwhile = tuple(
            sorted({str(x["metadata"]["name"]) for x in trials} - progress.baseline)
        )
    # A quota made now starts a fresh list: marks left on the experiment name pausers of an
    # earlier pause that ended.
    holders = [] if created else t.pausers()
    joined = by not in holders
    marked = t.annotations.get(ANN_QUOTA) == quota_name(name)
    if joined or not marked or created:
        holders = [*holders, by] if joined else holders
        annotations: dict[str, str | None] = {ANN_PAUSERS: json.dumps(holders), ANN_RESUMING: None}
        if not marked or created:
            annotations |= {
                ANN_BY: holders[0],
                ANN_AT: _now(),
                ANN_REASON: reason[:512],
                ANN_QUOTA: quota_name(name),
            }
        try:
            await record_pausers(
                kube, experiment=t.experiment, annotations=annotations, dry_run=dry_run
            )
        except Conflict as exc:
            raise _Again("the experiment changed meanwhile") from exc
    await hold(kube, namespace=ns, experiments=t.experiments, dry_run=dry_run)
    return _Paused(
        target=t,
        created=created,
        joined=joined and not created,
        marked=marked,
        holders=tuple(holders),
        enforced=enforced,
        created_meanwhile=created_meanwhile,
    )


async def pause_experiment(
    *,
    kube: KubeClient,
    node: str,
    namespace: str,
    name: str,
    by: str,
    reason: str,
    dry_run: bool,
    enforce_wait: float = DEFAULT_ENFORCE_WAIT,
) -> ActionResult:
    """Pause one experiment (see the module docstring) for ``by`` (``<node>/<rule>``), waiting
    at most ``enforce_wait`` seconds for the quota controller to make the quota count Trials.
    Outcomes: done (paused, or ``by`` recorded among the pausers of a pause that stood); noop
    (finished, or already paused by ``by``: then whatever a crash left undone is completed);
    failed (not found: ``details["not_found"]``; a quota of the pause's name that is not
    nodeguard's; not enforced within the wait, ``retry``; an API error, ``retry`` when
    transient). The details say which trials keep running, that Katib deletes none, how many
    may start while paused (none), and which Trials were created before it was enforced."""

    result = _Results(
        action="pause_katib", node=node, dry_run=dry_run, namespace=namespace, name=name
    )
    what = f"Katib experiment {namespace}/{name}"
    progress = _Progress()
    try:
        for attempt in range(_ATTEMPTS):
            if attempt:
                await asyncio.sleep(_AGAIN_DELAY)
            target = result.target = await _read(kube, namespace, name)
            if (state := _finished(target.experiment)) is not None:
                return result("noop", f"{what} has {state}: nothing to pause", "NodeguardKatibNoop")
            if target.foreign:
                return result("failed", _foreign(target), "NodeguardKatibFailed")
            try:
                done = await _pause_once(
                    kube,
                    target,
                    by=by,
                    reason=reason,
                    dry_run=dry_run,
                    wait=enforce_wait,
                    progress=progress,
                )
                break
            except _Again:
                continue
        else:
            return result(
                "failed",
                f"pause of {what} not made: other pausers or resumers kept changing it",
                "NodeguardKatibFailed",
                retry=True,
            )
    except NotFound:
        return result("failed", f"{what} not found", "NodeguardKatibFailed", not_found=True)
    except KubeError as exc:
        return result(
            "failed",
            f"pause of {what} failed: {type(exc).__name__}: {exc}",
            "NodeguardKatibFailed",
            retry=exc.transient,
        )
    return _pause_result(result, done, by=by)


def _enforced(e: Enforcement | None) -> str:
    if e is None:  # a dry run: no quota was made to wait for
        return ""
    if e.counted:
        return ", enforced"
    return (
        ", enforced: new Trials are refused as 'status unknown for quota' until the quota "
        "controller counts them"
    )


def _pause_result(result: _Results, p: _Paused, *, by: str) -> ActionResult:
    t, c = p.target, p.target.census
    what = f"Katib experiment {t.namespace}/{t.name}"
    facts: dict[str, Any] = {
        "running_trials": list(c.running),
        "pending_trials": list(c.pending),
        "trials_katib_deletes": 0,
        "trials_that_may_start": 0,
        "quota": f"{t.namespace}/{quota_name(t.name)}",
        "namespace_experiments_held": list(t.neighbours),
        "pausers": list(p.holders),
        "enforced": None if p.enforced is None else p.enforced.enforced,
        "trials_counted": None if p.enforced is None else p.enforced.counted,
        "trials_created_meanwhile": list(p.created_meanwhile),
    }
    meanwhile = (
        f"; {len(p.created_meanwhile)} Trial(s) were created in {t.namespace} before the quota "
        f"was enforced: {_names(p.created_meanwhile)} (they run)"
        if p.created_meanwhile
        else ""
    )
    if p.enforced is not None and not p.enforced.enforced:
        return result(
            "failed",
            f"{what}: the pause quota {quota_name(t.name)} stands but is not enforced after "
            f"waiting: {p.enforced.why}{meanwhile}",
            "NodeguardKatibFailed",
            retry=True,
            **facts,
        )
    if not (p.created or p.joined or not p.marked):
        return result(
            "noop",
            f"{what} is already paused by nodeguard ({_names(p.holders)}){meanwhile}",
            "NodeguardKatibNoop",
            **facts,
        )
    verb = "would pause" if result.dry_run else "paused"
    if p.joined:
        message = (
            f"{what} is already paused by {_names(p.holders[:-1])}: {by} "
            f"{'would be' if result.dry_run else 'is'} recorded as a pauser too; the pause "
            f"ends when the last of {_names(p.holders)} resumes it (or a forced resume by hand)"
        )
        return result("done", message + meanwhile, "NodeguardKatibPaused", **facts)
    deleting = (
        f"Katib deletes none (parallelTrialCount {c.parallel} is left as it is)"
        if c.deletes() == 0
        else f"Katib is deleting {c.deletes()} trial(s) on its own (parallelTrialCount "
        f"{c.parallel} < {c.active} active), not because of this pause"
    )
    message = (
        f"{verb} {what}: no new Trial may be created while paused (ResourceQuota "
        f"{quota_name(t.name)}, {TRIAL_COUNT}=0"
        f"{_enforced(p.enforced)}); {len(c.running)} running and "
        f"{len(c.pending)} pending trial(s) keep running ({_names(c.running + c.pending)}); "
        f"{deleting}; 0 trials may start until it is resumed; {_scope(t)}{meanwhile}"
    )
    if not p.created:
        message += " (the quota was already in place: its mark on the experiment completed)"
    return result("done", message, "NodeguardKatibPaused", **facts)


def _legacy_patch(t: _Target) -> tuple[JSON, str]:
    """The spec restore of a pre-0.2 pause (parallelTrialCount lowered) and what it says."""
    recorded = str(t.annotations[LEGACY_COUNT])
    current = (t.experiment.get("spec") or {}).get("parallelTrialCount")
    floor = t.annotations.get(LEGACY_FLOOR)
    if recorded != _UNSET and not recorded.isdigit():
        raise ValueError(f"annotation {LEGACY_COUNT}={recorded!r} is not a count")
    if floor is not None and str(current) != floor:
        return {}, f"parallelTrialCount {current} kept (set by someone else while paused)"
    if recorded == _UNSET:
        # Unset before the pause: Katib's defaulting webhook would set 3
        # (experiments/v1beta1 constants.go DefaultTrialParallelCount), and its controller
        # dereferences the field, so removing it would stop the experiment for good.
        return (
            {"parallelTrialCount": DEFAULT_PARALLEL},
            f"parallelTrialCount {current} -> {DEFAULT_PARALLEL} (unset before; Katib's default)",
        )
    return {"parallelTrialCount": int(recorded)}, f"parallelTrialCount {current} -> {recorded}"


async def _unmark(kube: KubeClient, t: _Target, *, annotations: JSON, dry_run: bool) -> list[str]:
    """Patch the experiment's pause annotations (precondition: the resourceVersion read; a
    pauser or resumer in between makes it :class:`_Again`), restoring a pre-0.2 pause's spec.
    What it said."""
    said: list[str] = []
    patch: JSON = {
        "metadata": {
            "resourceVersion": t.experiment["metadata"]["resourceVersion"],
            "annotations": annotations,
        }
    }
    if LEGACY_COUNT in t.annotations and LEGACY_COUNT in annotations:
        spec, restored = _legacy_patch(t)
        said.append(restored)
        if spec:
            patch["spec"] = spec
    try:
        await kube.patch_custom(
            group=GROUP,
            version=VERSION,
            plural=EXPERIMENTS,
            namespace=t.namespace,
            name=t.name,
            patch=patch,
            dry_run=dry_run,
        )
    except Conflict as exc:
        raise _Again("the experiment changed meanwhile") from exc
    return said


async def resume_experiment(
    *,
    kube: KubeClient,
    node: str,
    namespace: str,
    name: str,
    only_by: str | None,
    dry_run: bool,
    force: bool = False,
) -> ActionResult:
    """Resume one experiment nodeguard paused. With ``only_by`` (a rule's resolve:
    ``<node>/<rule>``), release only that pauser's hold: the pause ends when its last pauser
    lets go. By hand (``None``), end a pause of one pauser, or of several with ``force``.
    Ending it: the experiment is marked as resuming, every unfinished experiment of the
    namespace labelled held, the quota deleted, then each held one kicked if no other pause
    holds the namespace (:func:`release`). Outcomes: done; noop (not paused by nodeguard, by
    another rule, or still held by other pausers); refused (several pausers, by hand, no
    ``force``); failed (not found: ``details["not_found"]``; an API error, ``retry`` when
    transient)."""

    result = _Results(
        action="resume_katib", node=node, dry_run=dry_run, namespace=namespace, name=name
    )
    what = f"Katib experiment {namespace}/{name}"
    try:
        for attempt in range(_ATTEMPTS):
            if attempt:
                await asyncio.sleep(_AGAIN_DELAY)
            target = result.target = await _read(kube, namespace, name)
            holders = target.pausers()
            try:
                if target.resuming:
                    said = ["a resume cut short completed"]  # whoever comes next finishes it
                    break
                if not holders:
                    return result(
                        "noop", f"{what} was not paused by nodeguard", "NodeguardKatibNoop"
                    )
                if only_by is not None and only_by not in holders:
                    return result(
                        "noop",
                        f"{what} was paused by {_names(holders)}, not {only_by}; left for it",
                        "NodeguardKatibNoop",
                        pausers=holders,
                    )
                rest = [p for p in holders if p != only_by] if only_by is not None else []
                if only_by is None and len(holders) > 1 and not force:
                    return result(
                        "refused",
                        f"{what} is held by {len(holders)} pausers ({_names(holders)}): each "
                        "one's resolve lets go and the last ends the pause; resume it with "
                        "force (nodeguard act resume-katib --force) to end it now for all",
                        "NodeguardKatibFailed",
                        pausers=holders,
                    )
                if rest:
                    await _unmark(
                        kube, target, annotations={ANN_PAUSERS: json.dumps(rest)}, dry_run=dry_run
                    )
                    return result(
                        "noop",
                        f"{only_by} {'would let' if dry_run else 'lets'} go of {what}; it stays "
                        f"paused for {_names(rest)} (the last of them ends the pause)",
                        "NodeguardKatibNoop",
                        pausers=rest,
                        trials_that_may_start=0,
                    )
                annotations: JSON = dict.fromkeys((*_PAUSE_ANNOTATIONS, LEGACY_COUNT, LEGACY_FLOOR))
                if target.quota is not None:
                    annotations[ANN_RESUMING] = str(target.quota["metadata"]["uid"])
                said = await _unmark(kube, target, annotations=annotations, dry_run=dry_run)
                break
            except _Again:
                continue
        else:
            return result(
                "failed",
                f"resume of {what} not made: other pausers or resumers kept changing it",
                "NodeguardKatibFailed",
                retry=True,
            )
        # The kicks owed are on the cluster before the quota goes: killed after the delete,
        # the next resume (or any command's sweep) finds the held labels and completes them.
        held = await hold(
            kube, namespace=namespace, experiments=target.experiments, dry_run=dry_run
        )
        if target.quota is not None:
            said.append(await _delete_quota(kube, target.quota, dry_run=dry_run))
        gone = quota_name(name) if target.quota is not None else None
        freed = await release(kube, namespace=namespace, gone=gone, also=held, dry_run=dry_run)
    except NotFound:
        return await _resume_gone(kube, node=node, namespace=namespace, name=name, dry_run=dry_run)
    except (KubeError, ValueError) as exc:
        transient = isinstance(exc, KubeError) and exc.transient
        return result(
            "failed",
            f"resume of {what} failed: {type(exc).__name__}: {exc}",
            "NodeguardKatibFailed",
            retry=transient,
        )
    c = target.census
    verb = "would resume" if dry_run else "resumed"
    if freed.held_by:
        # Another experiment's pause quota still holds the namespace: its last resume kicks.
        may = 0
        starts = (
            f"no trial may start until the pause(s) of {_names(freed.held_by)} in "
            f"namespace {namespace} are resumed too"
        )
    else:
        may = c.may_start()
        starts = f"Katib reconciles now and may start {may} trial(s)"
        others = [k for k in freed.kicked if k != name]
        if others:
            starts += f"; the other experiments the quota held reconcile too ({_names(others)})"
    message = (
        f"{verb} {what} ({'; '.join(said) or 'its mark removed'}): {starts} "
        f"({len(c.running)} running, {len(c.pending)} pending, parallelTrialCount {c.parallel})"
    )
    return result(
        "done",
        message,
        "NodeguardKatibResumed",
        trials_that_may_start=may,
        kicked=list(freed.kicked),
        namespace_held_by=list(freed.held_by),
    )


async def _delete_quota(kube: KubeClient, quota: JSON, *, dry_run: bool) -> str:
    meta = quota["metadata"]
    with contextlib.suppress(NotFound):  # deleted meanwhile: the same end
        await kube.delete_resource_quota(
            name=meta["name"], namespace=meta["namespace"], uid=meta["uid"], dry_run=dry_run
        )
    return f"ResourceQuota {meta['name']} deleted"


async def _resume_gone(
    kube: KubeClient, *, node: str, namespace: str, name: str, dry_run: bool
) -> ActionResult:
    """The experiment was deleted while paused: its pause quota must not outlive it (the
    garbage collector deletes it through its owner reference; without one, or before it runs,
    this does), and the namespace's held experiments are kicked."""
    what = f"Katib experiment {namespace}/{name}"
    pauses = await kube.list_resource_quotas(
        label_selector=f"{QUOTA_LABEL}=true", namespace=namespace
    )
    mine = [q for q in pauses if is_pause(q, name)]
    result = _Results(
        action="resume_katib", node=node, dry_run=dry_run, namespace=namespace, name=name
    )
    if not mine:
        return result("failed", f"{what} not found", "NodeguardKatibFailed", not_found=True)
    others = await kube.list_custom(
        group=GROUP, version=VERSION, plural=EXPERIMENTS, namespace=namespace
    )
    held = await hold(kube, namespace=namespace, experiments=others, dry_run=dry_run)
    said = await _delete_quota(kube, mine[0], dry_run=dry_run)
    freed = await release(
        kube, namespace=namespace, gone=quota_name(name), also=held, dry_run=dry_run
    )
    verb = "would resume" if dry_run else "resumed"
    message = f"{verb} the pause of {what}, which is gone: {said}" + (
        f"; the experiments the quota held reconcile ({_names(freed.kicked)})"
        if freed.kicked
        else ""
    )
    return result("done", message, "NodeguardKatibResumed", kicked=list(freed.kicked))


async def _sweep(kube: KubeClient, *, node: str, dry_run: bool) -> list[ActionResult]:
    """Kick the experiments a pause left stopped when it ended without its kicks (a resume
    killed between them; its quota garbage-collected with its experiment): one result per
    namespace (:func:`stranded`)."""
    out = []
    for ns in await stranded(kube):
        freed = await release(kube, namespace=ns, dry_run=dry_run)
        if not freed.kicked:
            continue
        message = (
            f"{'would restart' if dry_run else 'restarted'} Katib experiment(s) "
            f"{_names(freed.kicked)} in {ns}: a nodeguard pause held them and ended without "
            "making Katib reconcile them (its resume cut short, or its quota deleted with its "
            "experiment), so they would have started no trial"
        )
        out.append(
            ActionResult(
                action="resume_katib",
                node=node,
                dry_run=dry_run,
                outcome="done",
                message=message,
                details={"namespace": ns, "kicked": list(freed.kicked)},
                events=tuple(
                    AuditEvent(
                        obj=ObjectRef(
                            kind="Experiment",
                            name=k,
                            namespace=ns,
                            api_version=f"{GROUP}/{VERSION}",
                        ),
                        reason="NodeguardKatibResumed",
                        message=message,
                    )
                    for k in freed.kicked
                ),
            )
        )
    return out


async def paused_experiments(
    kube: KubeClient, *, by_node: str | None = None, by: str | None = None
) -> list[tuple[str, str]]:
    """``(namespace, experiment)`` of every experiment nodeguard holds paused: its pause
    quotas (label ``nodeguard.io/katib-pause``) and pre-0.2 pauses (annotation on the
    experiment). ``by``: only those with exactly that ``<node>/<rule>`` among their pausers;
    ``by_node``: only those with a pauser on that node."""
    found: set[tuple[str, str]] = set()

    def wanted(who: Iterable[str]) -> bool:
        who = list(who)
        if by is not None:
            return by in who
        if by_node is not None:
            return any(w.startswith(f"{by_node}/") for w in who)
        return True

    for q in await kube.list_resource_quotas(label_selector=f"{QUOTA_LABEL}=true"):
        meta = q.get("metadata", {})
        if is_pause(q) and wanted([str((meta.get("annotations") or {}).get(ANN_BY, ""))]):
            found.add((str(meta["namespace"]), str(meta["labels"][EXPERIMENT_LABEL])))
    for e in await kube.list_custom(group=GROUP, version=VERSION, plural=EXPERIMENTS):
        meta = e.get("metadata", {})
        annotations = meta.get("annotations") or {}
        if ANN_QUOTA in annotations or LEGACY_COUNT in annotations:
            fallback = str(annotations.get(ANN_BY, ""))
            if wanted(pausers(annotations, fallback=fallback)):
                found.add((str(meta["namespace"]), str(meta["name"])))
    return sorted(found)


# -- the actions -------------------------------------------------------------------------------
def _namespaced(value: str) -> str:
    namespace, sep, name = value.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"not NAMESPACE/NAME: {value!r}")
    return value


class _Experiments(ActionArgs):
    """``experiments``: ``NAMESPACE/NAME`` of the experiments to act on; default: those the
    firing is about (its pod's; those with trial pods on the node; for a resume, those it
    paused)."""

    experiments: Annotated[
        list[Annotated[str, AfterValidator(_namespaced)]] | None,
        Flag(name="experiment", metavar="NAMESPACE/NAME"),
    ] = Field(
        default=None,
        description="repeat for more (default: pause the experiments with trial pods on the "
        "node; resume those paused from it)",
    )

    def named(self) -> list[tuple[str, str]] | None:
        if not self.experiments:
            return None
        return sorted({(e.split("/", 1)[0], e.split("/", 1)[1]) for e in self.experiments})


class PauseArgs(_Experiments):
    """``experiments`` (optional); ``enforceWaitSeconds`` (default 10, at most 300): how long
    to wait for the quota controller to make the pause quota count Trials (the API server
    enforces it only then). ``floor`` (nodeguard before 0.2) is refused with why."""

    enforce_wait: Annotated[float, Flag(metavar="SECONDS")] = Field(
        default=DEFAULT_ENFORCE_WAIT,
        ge=0,
        le=300,
        alias="enforceWaitSeconds",
        description="how long to wait for the quota controller to count Trials in the pause "
        f"quota, at most 300 (default {DEFAULT_ENFORCE_WAIT:g})",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_floor(cls, data: Any) -> Any:
        if isinstance(data, dict) and "floor" in data:
            raise ValueError(
                "floor: no longer taken: lowering parallelTrialCount makes Katib delete "
                "running trials; the pause now holds new trials with a ResourceQuota "
                "(remove the argument)"
            )
        return data


class ResumeArgs(_Experiments):
    """``experiments`` (optional); ``force`` (by hand only; default false): end a pause that
    several rules hold, for all of them."""

    force: bool = Field(
        default=False,
        description="end a pause several rules hold, for all of them (default: a pause of "
        "several pausers is refused; each rule's resolve lets go, the last one ends it)",
    )


async def _chosen(call: Call) -> list[tuple[str, str]]:
    """The experiments a pause acts on: the pod's (a pod or container rule, an alert naming a
    pod), else those with trial pods on the node (from the snapshot, or the API)."""
    firing = call.firing
    snap = firing.snapshot
    if snap is not None and snap.node_name == firing.node and snap.pod_meta is not None:
        pods = dict(snap.pod_meta)
    else:
        items, _ = await call.api().list_pods(node_name=firing.node)
        pods = {m.uid: m for m in (pod_meta(p) for p in items)}
    uid = firing.pod_uid or next(
        (m.uid for m in pods.values() if (m.namespace, m.name) == firing.pod_ref), None
    )
    if firing.scope in ("pod", "container") and uid in pods:
        meta = pods[uid]
        exp = meta.labels.get(EXPERIMENT_LABEL)
        return [(meta.namespace, exp)] if exp else []
    return experiments_on_node(pods)


def _by(call: Call) -> str:
    return f"{call.firing.node}/{call.firing.rule}"


def _none(call: Call, action: str, message: str, reason: str) -> list[ActionResult]:
    return [
        ActionResult(
            action=action,
            node=call.node,
            dry_run=call.dry_run,
            outcome="noop",
            message=message,
            events=(
                AuditEvent(
                    obj=ObjectRef(kind="Node", name=call.node), reason=reason, message=message
                ),
            ),
        )
    ]


async def _run_pause(call: Call, args: PauseArgs) -> list[ActionResult]:
    named = args.named() or [(str(e[0]), str(e[1])) for e in call.progress.get("experiments", [])]
    try:
        experiments = named or await _chosen(call)
    except KubeError as exc:
        return call.result(
            action="pause_katib",
            outcome="failed",
            message=f"cannot list the pods of {call.node}: {exc}",
            retry=exc.transient,
        )
    if not experiments:
        return _none(
            call,
            "pause_katib",
            f"no Katib experiment has trials on {call.node}",
            "NodeguardKatibNoop",
        )
    # A pause resumed after a restart acts on the experiments chosen before it.
    call.progress["experiments"] = [list(e) for e in experiments]
    call.checkpoint()
    return [
        await pause_experiment(
            kube=call.api(),
            node=call.node,
            namespace=ns,
            name=name,
            by=_by(call),
            reason=call.note,
            dry_run=call.dry_run,
            enforce_wait=args.enforce_wait,
        )
        for ns, name in experiments
    ]


async def _run_resume(call: Call, args: ResumeArgs) -> list[ActionResult]:
    by_hand = call.firing.source == "act"
    try:
        if args.named():
            experiments = args.named() or []
        elif by_hand:
            # Paused from this node by any rule, and paused ones with trials on it.
            on_node = set(await _chosen(call))
            experiments = sorted(
                set(await paused_experiments(call.api(), by_node=call.node))
                | (on_node & set(await paused_experiments(call.api())))
            )
        else:
            experiments = await paused_experiments(call.api(), by=_by(call))
    except KubeError as exc:
        return call.result(
            action="resume_katib",
            outcome="failed",
            message=f"cannot find the experiments to resume: {exc}",
            retry=exc.transient,
        )
    results = [
        await resume_experiment(
            kube=call.api(),
            node=call.node,
            namespace=ns,
            name=name,
            only_by=None if by_hand else _by(call),
            dry_run=call.dry_run,
            force=by_hand and args.force,
        )
        for ns, name in experiments
    ]
    try:
        # Every resume, by hand or a resolve, also completes the kicks any ended pause left
        # undone: nothing else would ever wake those experiments.
        results += await _sweep(call.api(), node=call.node, dry_run=call.dry_run)
    except KubeError as exc:
        results += call.result(
            action="resume_katib",
            outcome="failed",
            message=f"cannot look for experiments a pause left stopped: {exc}",
            retry=exc.transient,
        )
    if not results:
        return _none(
            call,
            "resume_katib",
            f"no Katib experiment paused {'from ' + call.node if by_hand else 'by ' + _by(call)}",
            "NodeguardKatibNoop",
        )
    return results


_REASONS: dict[Outcome, str] = {
    "done": "NodeguardKatibPaused",
    "noop": "NodeguardKatibNoop",
    "refused": "NodeguardKatibFailed",
    "blocked": "NodeguardKatibFailed",
    "failed": "NodeguardKatibFailed",
}
register(
    Action(
        name="pause_katib",
        summary="stop Katib experiments from creating trials (a ResourceQuota on Trials in "
        "their namespace); running trials keep running",
        args=PauseArgs,
        run=_run_pause,
        undo="resume_katib",
        reasons=_REASONS,
        dry_reasons={"done": "NodeguardWouldPauseKatib"},
    )
)
register(
    Action(
        name="resume_katib",
        summary="undo nodeguard's pause: delete the quota and make Katib reconcile",
        args=ResumeArgs,
        run=_run_resume,
        reasons={**_REASONS, "done": "NodeguardKatibResumed"},
        dry_reasons={"done": "NodeguardWouldResumeKatib"},
    )
)
