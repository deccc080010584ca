"""Pausing and resuming Katib experiments (kubeflow.org/v1beta1 Experiment).

Katib has no suspend. Pausing lowers ``spec.parallelTrialCount`` (how many trials run at once)
to a floor of at least 1 — Katib's validating webhook rejects 0 — and records the original in the
annotation ``nodeguard.io/paused-parallel-trial-count`` (``"unset"`` when the field was absent)
and the value it set in ``nodeguard.io/paused-at-parallel-trial-count``; resuming restores the
original exactly and removes both — unless someone changed the count while it was paused, whose
newer intent is then kept. A finished experiment (Succeeded or Failed) is not paused.
``spec.maxTrialCount`` is never touched: reaching it ends the experiment, and with the default
``resumePolicy: Never`` an ended experiment cannot be restarted. Both are idempotent, and both
patch with the Experiment's resourceVersion, so a concurrent edit is a Conflict (re-read and
tried again), not a lost update.

Which experiments: those whose trial pods run on the node (pod label
``katib.kubeflow.org/experiment``), or those named.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from nodeguard.actions.audit import Auditor, ObjectRef
from nodeguard.actions.base import ActionResult
from nodeguard.kube.client import JSON, KubeClient
from nodeguard.kube.errors import Conflict, KubeError, NotFound
from nodeguard.snapshot import PodMeta

__all__ = ["experiments_on_node", "pause_katib", "resume_katib"]

GROUP, VERSION, PLURAL = "kubeflow.org", "v1beta1", "experiments"
ANNOTATION = "nodeguard.io/paused-parallel-trial-count"
FLOOR_ANNOTATION = "nodeguard.io/paused-at-parallel-trial-count"
BY_ANNOTATION = "nodeguard.io/paused-by"
EXPERIMENT_LABEL = "katib.kubeflow.org/experiment"
_UNSET = "unset"


def experiments_on_node(pods: Mapping[str, PodMeta]) -> list[tuple[str, str]]:
    """``(namespace, experiment)`` of every experiment with a live trial pod on the node."""
    found = {
        (p.namespace, p.labels[EXPERIMENT_LABEL])
        for p in pods.values()
        if EXPERIMENT_LABEL in p.labels and not p.terminating
    }
    return sorted(found)


def _finished(exp: JSON) -> str | None:
    """The terminal condition of an Experiment (Succeeded or Failed, status True), if any."""
    for cond in (exp.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Succeeded", "Failed") and cond.get("status") == "True":
            return str(cond["type"]).lower()
    return None


def _plan(
    exp: JSON,
    *,
    namespace: str,
    name: str,
    pause: bool,
    floor: int,
    dry_run: bool,
    by: str,
    only_by: str | None,
) -> tuple[JSON | None, str, str]:
    """``(patch or None for nothing to do, message, Event reason)`` for one experiment."""
    meta, spec = exp.get("metadata", {}), exp.get("spec", {})
    annotations = meta.get("annotations") or {}
    recorded, paused_at = annotations.get(ANNOTATION), annotations.get(FLOOR_ANNOTATION)
    current = spec.get("parallelTrialCount")
    rv = meta.get("resourceVersion")
    what = f"Katib experiment {namespace}/{name}"
    if pause:
        if recorded is not None:
            return None, f"{what} is already paused by nodeguard", ""
        if (state := _finished(exp)) is not None:
            return None, f"{what} has {state}: nothing to pause", ""
        new = max(1, floor)
        if current is not None and current <= new:
            return (
                None,
                (f"{what} runs {current} trial(s) at once, already at or below the floor {new}"),
                "",
            )
        patch = {
            "metadata": {
                "resourceVersion": rv,
                "annotations": {
                    ANNOTATION: _UNSET if current is None else str(current),
                    FLOOR_ANNOTATION: str(new),
                    BY_ANNOTATION: by,
                },
            },
            "spec": {"parallelTrialCount": new},
        }
        shown = current if current is not None else "unset"
        return (
            patch,
            (
                f"{'would pause' if dry_run else 'paused'} {what}: parallelTrialCount "
                f"{shown} -> {new} (maxTrialCount untouched)"
            ),
            "NodeguardKatibPaused",
        )
    if recorded is None:
        return None, f"{what} was not paused by nodeguard", ""
    paused_by = annotations.get(BY_ANNOTATION, "")
    if only_by is not None and paused_by != only_by:
        return None, f"{what} was paused by {paused_by or '?'}, not {only_by}; left for it", ""
    unmark = {ANNOTATION: None, FLOOR_ANNOTATION: None, BY_ANNOTATION: None}
    if recorded != _UNSET and not recorded.isdigit():
        raise ValueError(
            f"{what}: annotation {ANNOTATION}={recorded!r} is not a count; "
            "not guessing what to restore"
        )
    if paused_at is not None and str(current) != paused_at:
        # Someone set parallelTrialCount while it was paused: theirs is the newer intent.
        patch = {"metadata": {"resourceVersion": rv, "annotations": unmark}}
        return (
            patch,
            (
                f"{'would leave' if dry_run else 'left'} {what} at parallelTrialCount "
                f"{current}, set by someone else while paused (was {recorded}); "
                "nodeguard's mark removed"
            ),
            "NodeguardKatibResumed",
        )
    original = None if recorded == _UNSET else int(recorded)
    patch = {
        "metadata": {"resourceVersion": rv, "annotations": unmark},
        "spec": {"parallelTrialCount": original},
    }
    shown_original = original if original is not None else "unset"
    return (
        patch,
        (
            f"{'would resume' if dry_run else 'resumed'} {what}: parallelTrialCount "
            f"{current} -> {shown_original}"
        ),
        "NodeguardKatibResumed",
    )


async def _one(
    *,
    kube: KubeClient,
    auditor: Auditor,
    node: str,
    namespace: str,
    name: str,
    pause: bool,
    floor: int,
    dry_run: bool,
    note: str,
    by: str,
    only_by: str | None,
) -> ActionResult:
    action = "pause_katib" if pause else "resume_katib"

    def result(outcome: Any, message: str) -> ActionResult:
        return ActionResult(
            action=action,
            node=node,
            dry_run=dry_run,
            outcome=outcome,
            message=message,
            details={"experiment": f"{namespace}/{name}"},
        )

    for attempt in range(3):
        exp = await kube.get_custom(
            group=GROUP, version=VERSION, plural=PLURAL, namespace=namespace, name=name
        )
        patch, message, reason = _plan(
            exp,
            namespace=namespace,
            name=name,
            pause=pause,
            floor=floor,
            dry_run=dry_run,
            by=by,
            only_by=only_by,
        )
        if patch is None:
            return result("noop", message)
        try:
            await kube.patch_custom(
                group=GROUP,
                version=VERSION,
                plural=PLURAL,
                namespace=namespace,
                name=name,
                patch=patch,
                dry_run=dry_run,
            )
            break
        except Conflict:
            if attempt == 2:  # edited under us three times running: give up for now
                raise
    meta = exp.get("metadata", {})
    ref = ObjectRef(
        kind="Experiment",
        name=name,
        namespace=namespace,
        uid=meta.get("uid", ""),
        api_version=f"{GROUP}/{VERSION}",
    )
    res = result("done", f"{message}; {note}" if note else message)
    await auditor.record(result=res, obj=ref, reason=reason)
    return res


async def _each(
    *,
    kube: KubeClient,
    auditor: Auditor,
    node: str,
    experiments: Iterable[tuple[str, str]],
    pause: bool,
    floor: int,
    dry_run: bool,
    note: str,
    by: str = "",
    only_by: str | None = None,
) -> list[ActionResult]:
    results = []
    action = "pause_katib" if pause else "resume_katib"
    for namespace, name in experiments:
        try:
            results.append(
                await _one(
                    kube=kube,
                    auditor=auditor,
                    node=node,
                    namespace=namespace,
                    name=name,
                    pause=pause,
                    floor=floor,
                    dry_run=dry_run,
                    note=note,
                    by=by,
                    only_by=only_by,
                )
            )
        except NotFound:
            results.append(
                ActionResult(
                    action=action,
                    node=node,
                    dry_run=dry_run,
                    outcome="noop",
                    message=f"experiment {namespace}/{name} not found",
                )
            )
        except (KubeError, ValueError) as exc:
            res = ActionResult(
                action=action,
                node=node,
                dry_run=dry_run,
                outcome="failed",
                message=f"{action} of {namespace}/{name} failed: {type(exc).__name__}: {exc}",
            )
            await auditor.record(
                result=res,
                obj=ObjectRef(
                    kind="Experiment",
                    name=name,
                    namespace=namespace,
                    api_version=f"{GROUP}/{VERSION}",
                ),
                reason="NodeguardKatibFailed",
                event_type="Warning",
            )
            results.append(res)
    return results


async def pause_katib(
    *,
    kube: KubeClient,
    auditor: Auditor,
    node: str,
    experiments: Iterable[tuple[str, str]],
    floor: int = 1,
    dry_run: bool,
    note: str = "",
    by: str = "nodeguard act",
) -> list[ActionResult]:
    """Pause each ``(namespace, name)`` experiment; one result per experiment. ``note`` (the
    incident) is appended to the Event's message; ``by`` (``<node>/<rule>``) is recorded on the
    experiment, so that rule's resolve resumes only what it paused."""
    return await _each(
        kube=kube,
        auditor=auditor,
        node=node,
        experiments=experiments,
        pause=True,
        floor=floor,
        dry_run=dry_run,
        note=note,
        by=by,
    )


async def resume_katib(
    *,
    kube: KubeClient,
    auditor: Auditor,
    node: str,
    experiments: Iterable[tuple[str, str]],
    dry_run: bool,
    note: str = "",
    only_by: str | None = None,
) -> list[ActionResult]:
    """Resume each experiment that nodeguard paused, restoring parallelTrialCount exactly.
    With ``only_by``, only those that pause recorded as paused by it (a rule's resolve); by
    hand (``None``), any that nodeguard paused."""
    return await _each(
        kube=kube,
        auditor=auditor,
        node=node,
        experiments=experiments,
        pause=False,
        floor=1,
        dry_run=dry_run,
        note=note,
        only_by=only_by,
    )
