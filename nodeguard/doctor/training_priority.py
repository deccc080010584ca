"""Check ``training-priority``: training that the node gives up first, or as soon as anything
else.

When a node runs short of memory the kubelet evicts by, in order: usage above the pod's
request, then lower priority, then usage above request (pkg/kubelet/eviction/helpers.go
``rankMemoryPressure``); the scheduler preempts only pods of lower priority than the one it
places (pkg/scheduler/framework/plugins/defaultpreemption ``isPreemptionAllowed``); nodeguard's
own ``evict`` takes pods at or below its ``maxPriority`` (the default runbook: 999). A
training pod at the priority of the preprocessing beside it is therefore no safer than that
preprocessing, and one with no PriorityClass runs at 0 unless a class is ``globalDefault``
(the Priority admission plugin, plugin/pkg/admission/priority/admission.go: the lowest-valued
global default, else 0).

Findings, for each training workload of the namespaces in scope
(:mod:`nodeguard.doctor.training_workloads`; a pod's ``spec.priority`` when it has pods, its
templates resolved against the PriorityClasses when it has none):

- *error*: a template names a PriorityClass that does not exist: the Priority admission
  plugin refuses every pod of it ("no PriorityClass with name ... was found").
- *warning*: no PriorityClass and no global default: priority 0.
- *warning*: its priority is at or below a preprocessing pod's on its nodes (any pod not training,
  no DaemonSet's or static pod, below the system classes), or at or below the nodeguard
  agents' evict ``maxPriority``.

Not a finding: training above every such pod and above the agents' evict; finished jobs; a
Katib trial's job (its Experiment's template is judged).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from nodeguard.doctor.findings import Fact, Finding, ObjectRef
from nodeguard.doctor.inputs import Cluster, PodView
from nodeguard.doctor.registry import Check, register
from nodeguard.doctor.training_inputs import PriorityClassView, TrainingJobView
from nodeguard.doctor.training_workloads import (
    HIGHEST_USER_PRIORITY,
    Competitors,
    Workload,
    evict_max_priority,
    manifest,
    template_patch,
    workloads,
)

__all__: list[str] = []

CHECK = "training-priority"
#: The class nodeguard suggests when none is fit, and the least value it gives it: above the
#: default runbook's evict ``maxPriority`` (999).
SUGGESTED_CLASS = "training"
SUGGESTED_FLOOR = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class _Priority:
    """A workload's priority: the lowest of its pods' (or templates'), the class names that
    give it (``""``: none), and the names no PriorityClass has."""

    value: int
    classes: tuple[str, ...]
    missing: tuple[str, ...] = ()

    @property
    def classless(self) -> bool:
        return not any(self.classes)


def _default(classes: tuple[PriorityClassView, ...]) -> PriorityClassView | None:
    defaults = [c for c in classes if c.global_default]
    return min(defaults, key=lambda c: c.value) if defaults else None


def _priority(cluster: Cluster, workload: Workload) -> _Priority | None:
    if workload.pods:
        return _Priority(
            value=min(p.meta.priority for p in workload.pods),
            classes=tuple(sorted({p.meta.priority_class for p in workload.pods})),
        )
    job, classes = workload.job, cluster.training.priority_classes
    if job is None:
        return None
    by_name = {c.name: c for c in classes or ()}
    default = _default(classes or ())
    values: list[int] = []
    names: list[str] = []
    missing: list[str] = []
    for t in job.templates:
        if t.priority_class is None:  # the admission plugin gives it the global default
            values.append(default.value if default else 0)
            names.append(default.name if default else "")
        elif t.priority_class in by_name:
            values.append(by_name[t.priority_class].value)
            names.append(t.priority_class)
        elif classes is not None:
            missing.append(t.priority_class)
        else:  # classes not read: the value is unknown
            return None
    if not values and not missing:
        return None
    return _Priority(
        value=min(values) if values else 0,
        classes=tuple(sorted(set(names))),
        missing=tuple(sorted(set(missing))),
    )


def _findings(cluster: Cluster) -> Iterator[Finding]:
    evict = evict_max_priority(cluster)
    competitors = Competitors(cluster)
    for workload in workloads(cluster):
        priority = _priority(cluster, workload)
        if priority is None:
            continue
        if priority.missing and workload.job is not None:
            yield _missing(workload, workload.job, priority)
            continue
        near = competitors.near(workload)
        above = [p for p in near if p.meta.priority >= priority.value]
        evicted = evict is not None and priority.value <= evict[0]
        if priority.classless or above or evicted:
            yield _low(cluster, workload, priority, above, evict if evicted else None)


def _what(workload: Workload) -> str:
    ref = workload.ref
    if workload.job is not None and workload.job.trial_kind is not None:
        return f"Experiment {ref.namespace}/{ref.name}'s trials"
    return f"{ref.kind} {ref.namespace}/{ref.name}"


def _missing(workload: Workload, job: TrainingJobView, priority: _Priority) -> Finding:
    names = ", ".join(priority.missing)
    return Finding(
        check=CHECK,
        severity="error",
        title=f"{_what(workload)} name a PriorityClass that does not exist: {names}",
        objects=(
            workload.ref,
            *(ObjectRef(kind="PriorityClass", namespace="", name=n) for n in priority.missing),
        ),
        evidence=(
            Fact(label="priorityClassName", text=names),
            Fact(label="replicas", text=str(job.replicas)),
            Fact(label="admission", text="the Priority admission plugin refuses its pods"),
        ),
        fix=_class_manifest(priority.missing[0], SUGGESTED_FLOOR, why="create the class it names"),
    )


def _low(
    cluster: Cluster,
    workload: Workload,
    priority: _Priority,
    above: list[PodView],
    evict: tuple[int, str] | None,
) -> Finding:
    if priority.classless:
        title = f"{_what(workload)} run without a PriorityClass (priority {priority.value})"
    else:
        title = f"{_what(workload)} run at priority {priority.value}, no higher than " + (
            "non-training pods on its nodes" if above else "nodeguard's evict"
        )
    evidence = [
        Fact(
            label="priority",
            text=f"{priority.value} ({', '.join(c or 'no class' for c in priority.classes)})",
        ),
        Fact(
            label="judged on",
            text=f"{len(workload.pods)} pods" if workload.pods else "its templates",
        ),
    ]
    if above:
        top = above[0]
        evidence.append(
            Fact(
                label="non-training pods at or above it",
                text=f"{len(above)} pods; highest {top.meta.namespace}/{top.meta.name} "
                f"(priority {top.meta.priority})",
            )
        )
    if evict is not None:
        evidence.append(Fact(label="nodeguard evict maxPriority", text=f"{evict[0]} ({evict[1]})"))
    objects = (
        workload.ref,
        *(ObjectRef(kind="Pod", namespace=p.meta.namespace, name=p.meta.name) for p in above[:3]),
    )
    return Finding(
        check=CHECK,
        severity="warning",
        title=title,
        objects=objects,
        evidence=tuple(evidence),
        fix=_fix(cluster, workload, above, evict),
    )


def _fix(
    cluster: Cluster, workload: Workload, above: list[PodView], evict: tuple[int, str] | None
) -> str:
    """A PriorityClass above every competitor (an existing one when one fits, else a new
    ``training`` class) and where the job's templates name it."""
    floor = max(
        [SUGGESTED_FLOOR - 1, *(p.meta.priority for p in above), *((evict[0],) if evict else ())]
    )
    if floor >= HIGHEST_USER_PRIORITY:
        return (
            "# nodeguard's evict has no maxPriority, so it may take any pod below the system "
            "classes: give that rule a maxPriority below training's, then set a class here"
        )
    fit = sorted(
        (
            c
            for c in cluster.training.priority_classes or ()
            if floor < c.value <= HIGHEST_USER_PRIORITY
        ),
        key=lambda c: c.value,
    )
    lines: list[str] = []
    if fit:
        name = fit[0].name
        lines.append(f"# PriorityClass {name} (value {fit[0].value}) is above them")
    else:
        name = SUGGESTED_CLASS
        # The next thousand above every competitor (1000 above the default runbook's 999).
        value = min(HIGHEST_USER_PRIORITY, (floor // 1000 + 1) * 1000)
        lines.append(_class_manifest(name, value, why="a class above them"))
        lines.append("---")
    job = workload.job
    if job is None:
        lines.append(
            f"# set priorityClassName: {name} in the pod templates of {workload.ref} (or what "
            "creates them); running pods keep the priority they were admitted with"
        )
    else:
        lines.append(
            f"# in {workload.ref.kind} {workload.ref.namespace}/{workload.ref.name}'s manifest; "
            "running pods keep the priority they were admitted with"
        )
        lines.append(manifest(template_patch(job, pod_spec={"priorityClassName": name})))
    return "\n".join(lines)


def _class_manifest(name: str, value: int, *, why: str) -> str:
    return "\n".join(
        [
            f"# {why} (PriorityClass values up to 1000000000 are a user's)",
            "apiVersion: scheduling.k8s.io/v1",
            "kind: PriorityClass",
            f"metadata: {{name: {name}}}",
            f"value: {value}",
            "description: ML training, kept over other work",
        ]
    )


register(
    Check(
        id=CHECK,
        title="training at no higher priority than preprocessing, or at none",
        run=_findings,
        severities=("warning", "error"),
    )
)
