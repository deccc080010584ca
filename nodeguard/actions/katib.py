"""Pausing and resuming Katib experiments (kubeflow.org/v1beta1 Experiment).

Katib has no suspend. Pausing lowers ``spec.parallelTrialCount`` (how many trials run at once)
to a floor of at least 1 — Katib's validating webhook rejects 0 — and records the original in the
annotation ``nodeguard.io/paused-parallel-trial-count`` (``"unset"`` when the field was absent);
resuming restores it exactly and removes the annotation. ``spec.maxTrialCount`` is never
touched: reaching it ends the experiment, and with the default ``resumePolicy: Never`` an ended
experiment cannot be restarted. Both are idempotent, and both patch with the Experiment's
resourceVersion, so a concurrent edit is a Conflict, not a lost update.

Which experiments: those whose trial pods run on the node (pod label
``katib.kubeflow.org/experiment``), or those named.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from nodeguard.actions.audit import Auditor, ObjectRef
from nodeguard.actions.base import ActionResult
from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import KubeError, NotFound
from nodeguard.snapshot import PodMeta

__all__ = ["experiments_on_node", "pause_katib", "resume_katib"]

GROUP, VERSION, PLURAL = "kubeflow.org", "v1beta1", "experiments"
ANNOTATION = "nodeguard.io/paused-parallel-trial-count"
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
) -> ActionResult:
    action = "pause_katib" if pause else "resume_katib"

    def result(outcome: Any, message: str, **details: Any) -> ActionResult:
        return ActionResult(
            action=action,
            node=node,
            dry_run=dry_run,
            outcome=outcome,
            message=message,
            details={"experiment": f"{namespace}/{name}", **details},
        )

    exp = await kube.get_custom(
        group=GROUP, version=VERSION, plural=PLURAL, namespace=namespace, name=name
    )
    meta, spec = exp.get("metadata", {}), exp.get("spec", {})
    ref = ObjectRef(
        kind="Experiment",
        name=name,
        namespace=namespace,
        uid=meta.get("uid", ""),
        api_version=f"{GROUP}/{VERSION}",
    )
    recorded = (meta.get("annotations") or {}).get(ANNOTATION)
    current = spec.get("parallelTrialCount")
    rv = meta.get("resourceVersion")
    if pause:
        if recorded is not None:
            return result("noop", f"experiment {namespace}/{name} is already paused by nodeguard")
        new = max(1, floor)
        if current is not None and current <= new:
            return result(
                "noop",
                f"experiment {namespace}/{name} runs {current} trial(s) at "
                f"once, already at or below the floor {new}",
            )
        patch = {
            "metadata": {
                "resourceVersion": rv,
                "annotations": {ANNOTATION: _UNSET if current is None else str(current)},
            },
            "spec": {"parallelTrialCount": new},
        }
        message = (
            f"{'would pause' if dry_run else 'paused'} Katib experiment "
            f"{namespace}/{name}: parallelTrialCount {current if current is not None else 'unset'}"
            f" -> {new} (maxTrialCount untouched)"
        )
        reason = "NodeguardKatibPaused"
    else:
        if recorded is None:
            return result("noop", f"experiment {namespace}/{name} was not paused by nodeguard")
        original = None if recorded == _UNSET else int(recorded)
        patch = {
            "metadata": {"resourceVersion": rv, "annotations": {ANNOTATION: None}},
            "spec": {"parallelTrialCount": original},
        }
        message = (
            f"{'would resume' if dry_run else 'resumed'} Katib experiment "
            f"{namespace}/{name}: parallelTrialCount {current} -> "
            f"{original if original is not None else 'unset'}"
        )
        reason = "NodeguardKatibResumed"
    await kube.patch_custom(
        group=GROUP,
        version=VERSION,
        plural=PLURAL,
        namespace=namespace,
        name=name,
        patch=patch,
        dry_run=dry_run,
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
        except KubeError as exc:
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
) -> list[ActionResult]:
    """Pause each ``(namespace, name)`` experiment; one result per experiment. ``note`` (the
    incident) is appended to the Event's message."""
    return await _each(
        kube=kube,
        auditor=auditor,
        node=node,
        experiments=experiments,
        pause=True,
        floor=floor,
        dry_run=dry_run,
        note=note,
    )


async def resume_katib(
    *,
    kube: KubeClient,
    auditor: Auditor,
    node: str,
    experiments: Iterable[tuple[str, str]],
    dry_run: bool,
    note: str = "",
) -> list[ActionResult]:
    """Resume each experiment that nodeguard paused, restoring parallelTrialCount exactly."""
    return await _each(
        kube=kube,
        auditor=auditor,
        node=node,
        experiments=experiments,
        pause=False,
        floor=1,
        dry_run=dry_run,
        note=note,
    )
