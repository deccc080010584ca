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
  plugin refuses every pod of it ("no PriorityClass with name ... was found"). Judged on the
  templates even when the job has pods: those it has are the admitted ones (a Volcano Job's
  ``spec.priorityClassName`` counts for a template that names none: Volcano's job
  controller gives it to those pods). The fix creates every class named.
- *warning*: no PriorityClass and no global default: priority 0.
- *warning*: its priority is at or below a preprocessing pod's on its nodes (any pod not training,
  no DaemonSet's or static pod, below the system classes), or at or below the nodeguard
  agents' evict ``maxPriority``.

Not a finding: training above every such pod and above the agents' evict; finished jobs and
Experiments; a Katib trial's job (its Experiment's template is judged); a template naming no
class when the PriorityClasses could not be read (a global default may give it one).
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
    subject,
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
    """A workload's priority: the lowest of its pods' (or templates'), and the class names
    that give it (``""``: none)."""

    value: int
    classes: tuple[str, ...]

    @property
    def classless(self) -> bool:
        return not any(self.classes)


def _default(classes: tuple[PriorityClassView, ...]) -> PriorityClassView | None:
    defaults = [c for c in classes if c.global_default]
    return min(defaults, key=lambda c: c.value) if defaults else None


def _missing_classes(cluster: Cluster, workload: Workload) -> tuple[str, ...]:
    """The class names its templates give that no PriorityClass has (none when the classes
    were not read). Judged on the templates even when it has pods: the pods of a template
    naming a missing class are the ones the API server refused, so those it has are others."""
    classes, job = cluster.training.priority_classes, workload.job
    if classes is None or job is None:
        return ()
    names = {c.name for c in classes}
    named = {t.priority_class for t in job.templates if t.priority_class}
    named |= set(job.trial_classes)  # an Experiment's, for every value of its parameter
    named = {n for n in named if "${" not in n}
    return tuple(sorted(named - names))


def _priority(cluster: Cluster, workload: Workload) -> _Priority | None:
    """Its priority: its pods' ``spec.priority`` (the admission plugin's), else its templates'
    classes resolved; ``None`` when that cannot be known (classes not read)."""
    if workload.pods:
        return _Priority(
            value=min(p.meta.priority for p in workload.pods),
            classes=tuple(sorted({p.meta.priority_class for p in workload.pods})),
        )
    job, classes = workload.job, cluster.training.priority_classes
    if job is None or classes is None:
        return None  # a template without a class gets the global default, unknown here
    by_name = {c.name: c for c in classes}
    default = _default(classes)
    values: list[int] = []
    names: list[str] = []
    for t in job.templates:
        if t.priority_class is None:  # the admission plugin gives it the global default
            values.append(default.value if default else 0)
            names.append(default.name if default else "")
        elif t.priority_class in by_name:
            values.append(by_name[t.priority_class].value)
            names.append(t.priority_class)
    if not values:
        return None
    return _Priority(value=min(values), classes=tuple(sorted(set(names))))


def _findings(cluster: Cluster) -> Iterator[Finding]:
    evict = evict_max_priority(cluster)
    competitors = Competitors(cluster)
    for workload in workloads(cluster):
        near = competitors.near(workload)
        missing = _missing_classes(cluster, workload)
        if missing and workload.job is not None:
            floor = max([SUGGESTED_FLOOR - 1, *(p.meta.priority for p in near[:1])])
            yield _missing(
                workload, workload.job, missing, floor=max(floor, evict[0] if evict else 0)
            )
            continue
        priority = _priority(cluster, workload)
        if priority is None:
            continue
        above = [p for p in near if p.meta.priority >= priority.value]
        evicted = evict is not None and priority.value <= evict[0]
        if priority.classless or above or evicted:
            yield _low(cluster, workload, priority, above, evict if evicted else None)


def _pods(n: int) -> str:
    return f"{n} pod" if n == 1 else f"{n} pods"


def _missing(
    workload: Workload, job: TrainingJobView, missing: tuple[str, ...], *, floor: int
) -> Finding:
    names = ", ".join(missing)
    one = len(missing) == 1
    value = _suggested_value(floor)
    manifests = "\n---\n".join(
        _class_manifest(n, value, why=f"create {n}, as its templates name it") for n in missing
    )
    return Finding(
        check=CHECK,
        severity="error",
        title=f"{subject(workload, 'name')} {'a PriorityClass' if one else 'PriorityClasses'} "
        f"that {'does' if one else 'do'} not exist: {names}",
        objects=(
            workload.ref,
            *(ObjectRef(kind="PriorityClass", namespace="", name=n) for n in missing),
        ),
        evidence=(
            Fact(label="priorityClassName", text=names),
            Fact(label="pods at once", text=str(job.replicas)),
            Fact(label="admission", text="the Priority admission plugin refuses those pods"),
        ),
        fix=manifests,
    )


def _low(
    cluster: Cluster,
    workload: Workload,
    priority: _Priority,
    above: list[PodView],
    evict: tuple[int, str] | None,
) -> Finding:
    if priority.classless:
        title = f"{subject(workload, 'run')} without a PriorityClass (priority {priority.value})"
    else:
        title = f"{subject(workload, 'run')} at priority {priority.value}, no higher than " + (
            "non-training pods on its nodes" if above else "nodeguard's evict"
        )
    evidence = [
        Fact(
            label="priority",
            text=f"{priority.value} ({', '.join(c or 'no class' for c in priority.classes)})",
        ),
        Fact(
            label="judged on",
            text=_pods(len(workload.pods)) if workload.pods else "its templates",
        ),
    ]
    if above:
        top = above[0]
        evidence.append(
            Fact(
                label="non-training pods at or above it",
                text=f"{_pods(len(above))}; highest {top.meta.namespace}/{top.meta.name} "
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


def _suggested_value(floor: int) -> int:
    """The next thousand above ``floor`` (1000 above the default runbook's 999), below the
    system classes."""
    return min(HIGHEST_USER_PRIORITY, (floor // 1000 + 1) * 1000)


def _suggested_name(cluster: Cluster, value: int) -> str:
    """``training``, or ``training-<value>`` (then ``training-<value>-2``...) where that name
    is taken: a PriorityClass's value cannot be changed (the API server refuses an update of
    ``value``), so a fix never names a class that exists."""
    taken = {c.name for c in cluster.training.priority_classes or ()}
    names = [SUGGESTED_CLASS, f"{SUGGESTED_CLASS}-{value}"]
    names += (f"{SUGGESTED_CLASS}-{value}-{n}" for n in range(2, len(taken) + 3))
    return next(n for n in names if n not in taken)


def _fix(
    cluster: Cluster, workload: Workload, above: list[PodView], evict: tuple[int, str] | None
) -> str:
    """A PriorityClass above every competitor (an existing one when one fits, else a new
    one) and where the job's templates name it. Each comment is one line: the table joins
    consecutive comment lines into one paragraph."""
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
        where = f"PriorityClass {name} (value {fit[0].value}) is above every competitor; "
    else:
        value = _suggested_value(floor)
        name = _suggested_name(cluster, value)
        lines += [_class_manifest(name, value, why="a class above every competitor"), "---"]
        where = ""
    job = workload.job
    if job is None:
        lines.append(
            f"# {where}set priorityClassName: {name} in the pod templates of {workload.ref} (or "
            "what creates them); running pods keep the priority they were admitted with"
        )
        return "\n".join(lines)
    lists = job.layout in ("replicatedJobs", "tasks")
    lines.append(
        f"# {where}in {workload.ref.kind} {workload.ref.namespace}/{workload.ref.name}'s "
        "manifest (running pods keep the priority they were admitted with)"
        + (": edit it, as a merge patch would replace the whole list" if lists else ":")
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
