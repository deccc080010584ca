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

**The resume** deletes the quota (UID precondition: only the one nodeguard made), then updates
the Experiment (its pause annotations removed, ``nodeguard.io/resumed-at`` set): Katib does not
retry a refused create by itself, and an update of the Experiment is an event its controller
watches, so it reconciles at once and creates the trials it is owed; an experiment with no
running trial would otherwise never start another.

Relief for a node under memory pressure comes from cordon and eviction; the pause only stops
an experiment from adding trials while it lasts. Pauses made by nodeguard before this design
(``nodeguard.io/paused-parallel-trial-count``) are still resumed: their count is restored.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, model_validator

from nodeguard.actions.args import ActionArgs
from nodeguard.actions.base import ActionResult, AuditEvent, ObjectRef, Outcome
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

GROUP, VERSION = "kubeflow.org", "v1beta1"
EXPERIMENTS, TRIALS = "experiments", "trials"
EXPERIMENT_LABEL = "katib.kubeflow.org/experiment"
TRIAL_COUNT = "count/trials.kubeflow.org"
QUOTA_LABEL = "nodeguard.io/katib-pause"
ANN_BY = "nodeguard.io/paused-by"
ANN_AT = "nodeguard.io/paused-at"
ANN_REASON = "nodeguard.io/pause-reason"
ANN_QUOTA = "nodeguard.io/pause-quota"
ANN_RESUMED = "nodeguard.io/resumed-at"
_PAUSE_ANNOTATIONS = (ANN_BY, ANN_AT, ANN_REASON, ANN_QUOTA)
# The pause of nodeguard before 0.2 (parallelTrialCount lowered): still resumed.
LEGACY_COUNT = "nodeguard.io/paused-parallel-trial-count"
LEGACY_FLOOR = "nodeguard.io/paused-at-parallel-trial-count"
_UNSET = "unset"
DEFAULT_PARALLEL = 3


def quota_name(experiment: str) -> str:
    """The pause quota's name for an experiment (a DNS subdomain: the experiment's name is a
    DNS label, at most 63 characters)."""
    return f"nodeguard-katib-pause-{experiment}"


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    """What pause and resume read first: the experiment, its trials, its namespace's other
    experiments, and the pause quota if there is one."""

    namespace: str
    name: str
    experiment: JSON
    census: Census
    neighbours: tuple[str, ...]
    quota: JSON | None
    other_pauses: tuple[str, ...]

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

    def paused_by(self) -> str | None:
        """Who paused it (``<node>/<rule>``), from the quota or the experiment; ``None`` when
        nodeguard did not."""
        if self.quota is not None:
            return str((self.quota["metadata"].get("annotations") or {}).get(ANN_BY, ""))
        if ANN_BY in self.annotations or LEGACY_COUNT in self.annotations:
            return str(self.annotations.get(ANN_BY, ""))
        return None


async def _read(kube: KubeClient, namespace: str, name: str) -> _Target:
    exp = await kube.get_custom(
        group=GROUP, version=VERSION, plural=EXPERIMENTS, namespace=namespace, name=name
    )
    trials = await kube.list_custom(
        group=GROUP,
        version=VERSION,
        plural=TRIALS,
        namespace=namespace,
        label_selector=f"{EXPERIMENT_LABEL}={name}",
    )
    others = await kube.list_custom(
        group=GROUP, version=VERSION, plural=EXPERIMENTS, namespace=namespace
    )
    pauses = await kube.list_resource_quotas(
        label_selector=f"{QUOTA_LABEL}=true", namespace=namespace
    )
    quota = next((q for q in pauses if q["metadata"]["name"] == quota_name(name)), None)
    return _Target(
        namespace=namespace,
        name=name,
        experiment=exp,
        census=census(exp, trials),
        neighbours=tuple(
            sorted(
                str(o["metadata"]["name"])
                for o in others
                if o["metadata"]["name"] != name and _finished(o) is None
            )
        ),
        quota=quota,
        other_pauses=tuple(
            sorted(
                str(
                    (q["metadata"].get("labels") or {}).get(EXPERIMENT_LABEL, q["metadata"]["name"])
                )
                for q in pauses
                if q is not quota
            )
        ),
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
            # so a pause never outlives what it paused. Not blocking: no finalizer rights needed.
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


async def pause_experiment(
    *,
    kube: KubeClient,
    node: str,
    namespace: str,
    name: str,
    by: str,
    reason: str,
    dry_run: bool,
) -> ActionResult:
    """Pause one experiment (see the module docstring). Outcomes: done; noop (finished, or
    already paused: then whatever a crash left undone is completed); failed (not found:
    ``details["not_found"]``; an API error, ``retry`` when transient). The result's details
    say which trials keep running, that Katib deletes none, and how many may start while
    paused (none)."""

    result = _Results(
        action="pause_katib", node=node, dry_run=dry_run, namespace=namespace, name=name
    )
    what = f"Katib experiment {namespace}/{name}"
    try:
        target = result.target = await _read(kube, namespace, name)
        c = target.census
        facts: dict[str, Any] = {
            "running_trials": list(c.running),
            "pending_trials": list(c.pending),
            "trials_katib_deletes": 0,
            "trials_that_may_start": 0,
            "quota": f"{namespace}/{quota_name(name)}",
            "namespace_experiments_held": list(target.neighbours),
        }
        if (state := _finished(target.experiment)) is not None:
            return result("noop", f"{what} has {state}: nothing to pause", "NodeguardKatibNoop")
        held = target.quota is not None
        if not held:
            body = _quota_body(target, by=by, reason=reason)
            try:
                await kube.create_resource_quota(namespace=namespace, body=body, dry_run=dry_run)
            except Conflict:  # made meanwhile by another agent: its pause stands
                held = True
        marked = target.annotations.get(ANN_QUOTA) == quota_name(name)
        paused_by = (target.paused_by() or by) if held else by
        if not marked:
            # The quota first, then the mark: killed between the two, the next pause (or any
            # resume) finds the quota and finishes the job.
            patch = {
                "metadata": {
                    "annotations": {
                        ANN_BY: paused_by,
                        ANN_AT: _now(),
                        ANN_REASON: reason[:512],
                        ANN_QUOTA: quota_name(name),
                    }
                }
            }
            await kube.patch_custom(
                group=GROUP,
                version=VERSION,
                plural=EXPERIMENTS,
                namespace=namespace,
                name=name,
                patch=patch,
                dry_run=dry_run,
            )
    except NotFound:
        return result(
            "failed",
            f"{what} not found",
            "NodeguardKatibFailed",
            not_found=True,
        )
    except KubeError as exc:
        return result(
            "failed",
            f"pause of {what} failed: {type(exc).__name__}: {exc}",
            "NodeguardKatibFailed",
            retry=exc.transient,
        )
    if held and marked:
        return result(
            "noop",
            f"{what} is already paused by nodeguard ({target.paused_by() or '?'})",
            "NodeguardKatibNoop",
            **facts,
        )
    deleting = (
        f"Katib deletes none (parallelTrialCount {c.parallel} is left as it is)"
        if c.deletes() == 0
        else f"Katib is deleting {c.deletes()} trial(s) on its own (parallelTrialCount "
        f"{c.parallel} < {c.active} active), not because of this pause"
    )
    verb = "would pause" if dry_run else "paused"
    message = (
        f"{verb} {what}: no new Trial may be created while paused (ResourceQuota "
        f"{quota_name(name)}, {TRIAL_COUNT}=0); {len(c.running)} running and "
        f"{len(c.pending)} pending trial(s) keep running ({_names(c.running + c.pending)}); "
        f"{deleting}; 0 trials may start until it is resumed; {_scope(target)}"
    )
    if held:
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


async def resume_experiment(
    *,
    kube: KubeClient,
    node: str,
    namespace: str,
    name: str,
    only_by: str | None,
    dry_run: bool,
) -> ActionResult:
    """Resume one experiment nodeguard paused: delete its quota, then update the Experiment so
    Katib reconciles now. With ``only_by`` (a rule's resolve: ``<node>/<rule>``), only a pause
    made by it; by hand (``None``), any of nodeguard's. Outcomes: done; noop (not paused by
    nodeguard, or by another rule); failed (not found: ``details["not_found"]``; an API
    error, ``retry`` when transient)."""

    result = _Results(
        action="resume_katib", node=node, dry_run=dry_run, namespace=namespace, name=name
    )
    what = f"Katib experiment {namespace}/{name}"
    try:
        target = result.target = await _read(kube, namespace, name)
        paused_by = target.paused_by()
        if paused_by is None:
            return result("noop", f"{what} was not paused by nodeguard", "NodeguardKatibNoop")
        if only_by is not None and paused_by != only_by:
            return result(
                "noop",
                f"{what} was paused by {paused_by or '?'}, not {only_by}; left for it",
                "NodeguardKatibNoop",
            )
        said = []
        if target.quota is not None:
            said.append(await _delete_quota(kube, target.quota, dry_run=dry_run))
        spec_patch: JSON = {}
        if LEGACY_COUNT in target.annotations:
            spec_patch, restored = _legacy_patch(target)
            said.append(restored)
        patch: JSON = {
            "metadata": {
                "annotations": {
                    **dict.fromkeys((*_PAUSE_ANNOTATIONS, LEGACY_COUNT, LEGACY_FLOOR)),
                    ANN_RESUMED: _now(),
                }
            }
        }
        if spec_patch:
            patch["spec"] = spec_patch
        # Always a real change (resumed-at): the update is what makes Katib reconcile again.
        await kube.patch_custom(
            group=GROUP,
            version=VERSION,
            plural=EXPERIMENTS,
            namespace=namespace,
            name=name,
            patch=patch,
            dry_run=dry_run,
        )
        kicked: tuple[str, ...] = ()
        if not target.other_pauses:
            # The namespace is free again: every experiment the quota held (not only this one)
            # must reconcile, or one whose trials all ended while held never starts another.
            kicked = await _kick(kube, namespace, target.neighbours, dry_run=dry_run)
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
    if target.other_pauses:
        # Another experiment's pause quota still holds the namespace.
        may = 0
        starts = (
            f"no trial may start until the pause(s) of {_names(target.other_pauses)} in "
            f"namespace {namespace} are resumed too"
        )
    else:
        may = c.may_start()
        starts = f"Katib reconciles now and may start {may} trial(s)"
        if kicked:
            starts += f"; the other experiments the quota held reconcile too ({_names(kicked)})"
    message = (
        f"{verb} {what} ({'; '.join(said) or 'its mark removed'}): {starts} "
        f"({len(c.running)} running, {len(c.pending)} pending, parallelTrialCount {c.parallel})"
    )
    return result("done", message, "NodeguardKatibResumed", trials_that_may_start=may)


async def _delete_quota(kube: KubeClient, quota: JSON, *, dry_run: bool) -> str:
    meta = quota["metadata"]
    with contextlib.suppress(NotFound):  # deleted meanwhile: the same end
        await kube.delete_resource_quota(
            name=meta["name"], namespace=meta["namespace"], uid=meta["uid"], dry_run=dry_run
        )
    return f"ResourceQuota {meta['name']} deleted"


async def _kick(
    kube: KubeClient, namespace: str, names: Iterable[str], *, dry_run: bool
) -> tuple[str, ...]:
    """Update each experiment (``nodeguard.io/resumed-at``) so Katib reconciles it: Katib does
    not retry a Trial create the quota refused. The ones updated (gone ones skipped)."""
    kicked = []
    for other in names:
        try:
            await kube.patch_custom(
                group=GROUP,
                version=VERSION,
                plural=EXPERIMENTS,
                namespace=namespace,
                name=other,
                patch={"metadata": {"annotations": {ANN_RESUMED: _now()}}},
                dry_run=dry_run,
            )
        except NotFound:
            continue
        kicked.append(other)
    return tuple(kicked)


async def _resume_gone(
    kube: KubeClient, *, node: str, namespace: str, name: str, dry_run: bool
) -> ActionResult:
    """The experiment was deleted while paused: its pause quota must not outlive it (the
    garbage collector deletes it through its owner reference; without one, or before it runs,
    this does), and the namespace's other experiments reconcile."""
    what = f"Katib experiment {namespace}/{name}"
    pauses = await kube.list_resource_quotas(
        label_selector=f"{QUOTA_LABEL}=true", namespace=namespace
    )
    mine = [q for q in pauses if q["metadata"]["name"] == quota_name(name)]
    result = _Results(
        action="resume_katib", node=node, dry_run=dry_run, namespace=namespace, name=name
    )
    if not mine:
        return result("failed", f"{what} not found", "NodeguardKatibFailed", not_found=True)
    said = await _delete_quota(kube, mine[0], dry_run=dry_run)
    kicked: tuple[str, ...] = ()
    if len(pauses) == 1:
        others = await kube.list_custom(
            group=GROUP, version=VERSION, plural=EXPERIMENTS, namespace=namespace
        )
        kicked = await _kick(
            kube,
            namespace,
            [str(o["metadata"]["name"]) for o in others if _finished(o) is None],
            dry_run=dry_run,
        )
    verb = "would resume" if dry_run else "resumed"
    message = f"{verb} the pause of {what}, which is gone: {said}" + (
        f"; the experiments the quota held reconcile ({_names(kicked)})" if kicked else ""
    )
    return result("done", message, "NodeguardKatibResumed")


async def paused_experiments(
    kube: KubeClient, *, by_node: str | None = None, by: str | None = None
) -> list[tuple[str, str]]:
    """``(namespace, experiment)`` of every experiment nodeguard holds paused: its pause
    quotas (label ``nodeguard.io/katib-pause``) and pre-0.2 pauses (annotation on the
    experiment). ``by``: only those paused by exactly that ``<node>/<rule>``; ``by_node``: only
    those paused from that node."""
    found: set[tuple[str, str]] = set()

    def wanted(annotations: Mapping[str, str]) -> bool:
        who = str(annotations.get(ANN_BY, ""))
        if by is not None:
            return who == by
        if by_node is not None:
            return who.startswith(f"{by_node}/")
        return True

    for q in await kube.list_resource_quotas(label_selector=f"{QUOTA_LABEL}=true"):
        meta = q.get("metadata", {})
        exp = (meta.get("labels") or {}).get(EXPERIMENT_LABEL)
        if exp and wanted(meta.get("annotations") or {}):
            found.add((str(meta["namespace"]), str(exp)))
    for e in await kube.list_custom(group=GROUP, version=VERSION, plural=EXPERIMENTS):
        meta = e.get("metadata", {})
        annotations = meta.get("annotations") or {}
        if (ANN_QUOTA in annotations or LEGACY_COUNT in annotations) and wanted(annotations):
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

    experiments: list[Annotated[str, AfterValidator(_namespaced)]] | None = None

    def named(self) -> list[tuple[str, str]] | None:
        if not self.experiments:
            return None
        return sorted({(e.split("/", 1)[0], e.split("/", 1)[1]) for e in self.experiments})


class PauseArgs(_Experiments):
    """``experiments`` (optional). ``floor`` (nodeguard before 0.2) is refused with why."""

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
    """``experiments`` (optional)."""


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
    if not experiments:
        return _none(
            call,
            "resume_katib",
            f"no Katib experiment paused {'from ' + call.node if by_hand else 'by ' + _by(call)}",
            "NodeguardKatibNoop",
        )
    return [
        await resume_experiment(
            kube=call.api(),
            node=call.node,
            namespace=ns,
            name=name,
            only_by=None if by_hand else _by(call),
            dry_run=call.dry_run,
        )
        for ns, name in experiments
    ]


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
    )
)
register(
    Action(
        name="resume_katib",
        summary="undo nodeguard's pause: delete the quota and make Katib reconcile",
        args=ResumeArgs,
        run=_run_resume,
        reasons={**_REASONS, "done": "NodeguardKatibResumed"},
    )
)
