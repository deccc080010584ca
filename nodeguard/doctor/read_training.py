"""Reading training jobs and PriorityClasses for checks ``training-priority`` and
``training-gang``: ``list`` on each job kind's CRD and on ``priorityclasses``
(scheduling.k8s.io/v1) through :meth:`~nodeguard.kube.client.KubeClient.list_custom`, turned
into :mod:`nodeguard.doctor.training_inputs` by pure functions.

The kinds, and where each keeps its pod templates (the Go types of each project):

- Kubeflow training-operator v1 (``kubeflow.org/v1``): TFJob ``spec.tfReplicaSpecs``,
  PyTorchJob ``spec.pytorchReplicaSpecs``, XGBoostJob ``spec.xgbReplicaSpecs``, PaddleJob
  ``spec.paddleReplicaSpecs``, JAXJob ``spec.jaxReplicaSpecs``, MPIJob
  ``spec.mpiReplicaSpecs``: a map of replica type to ``replicas`` (default 1) and
  ``template``; ``spec.runPolicy.schedulingPolicy`` (``minAvailable``, ``queue``,
  ``priorityClass``) is read by the operator only when it runs with
  ``--gang-scheduler-name`` (pkg/apis/kubeflow.org/v1/common_types.go). MPIJob is also
  served as ``v2beta1`` by kubeflow/mpi-operator, the same ``mpiReplicaSpecs`` and
  ``runPolicy``; the CRD serves one or the other, so both are tried.
- JobSet (``jobset.x-k8s.io/v1alpha2``): ``spec.replicatedJobs[]`` ``replicas`` (default 1)
  Jobs of ``template`` (a JobTemplateSpec: ``spec.parallelism`` pods at once, default 1, of
  ``spec.template``).
- Volcano Job (``batch.volcano.sh/v1alpha1``): ``spec.tasks[]`` ``replicas`` of ``template``;
  ``spec.minAvailable`` (the gang: Volcano's admission webhook sets it to the sum of the
  tasks' replicas when unset), ``spec.schedulerName``, ``spec.priorityClassName``.
- Katib Experiments (already read by :mod:`~nodeguard.doctor.read_katib`): the trial
  template's ``trialSpec`` is the job each trial runs, read as one of the above (or a
  batch/v1 Job, one pod a trial unless ``parallelism`` says more).

A kind whose CRD is not installed (404) has no jobs. A 403 is a note: the pods of that kind
are then judged on their own (priority only). A terminal job (condition ``Succeeded``,
``Completed`` or ``Failed`` true; a Volcano phase ``Completed``, ``Failed``, ``Terminated``,
``Aborted``) is ``finished``: its pods are gone or hold nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from nodeguard.doctor.katib_fit import parameter_values, substitute
from nodeguard.doctor.katib_inputs import ExperimentView
from nodeguard.doctor.training_inputs import (
    ContainerSize,
    PriorityClassView,
    TemplateView,
    TrainingInputs,
    TrainingJobView,
)
from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import Forbidden, NotFound
from nodeguard.kube.resources import memory_bytes

__all__ = ["JOB_KINDS", "JobKind", "job_view", "priority_class_view", "read_training"]

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class JobKind:
    """A job kind's CRD: group, the versions to try (first served wins), plural, and the
    ``spec`` key of its replica specs (``None`` for JobSet and Volcano, read their own way)."""

    kind: str
    group: str
    versions: tuple[str, ...]
    plural: str
    replica_specs: str | None = None


JOB_KINDS: tuple[JobKind, ...] = (
    JobKind(
        kind="PyTorchJob",
        group="kubeflow.org",
        versions=("v1",),
        plural="pytorchjobs",
        replica_specs="pytorchReplicaSpecs",
    ),
    JobKind(
        kind="TFJob",
        group="kubeflow.org",
        versions=("v1",),
        plural="tfjobs",
        replica_specs="tfReplicaSpecs",
    ),
    JobKind(
        kind="MPIJob",
        group="kubeflow.org",
        versions=("v2beta1", "v1"),
        plural="mpijobs",
        replica_specs="mpiReplicaSpecs",
    ),
    JobKind(
        kind="XGBoostJob",
        group="kubeflow.org",
        versions=("v1",),
        plural="xgboostjobs",
        replica_specs="xgbReplicaSpecs",
    ),
    JobKind(
        kind="PaddleJob",
        group="kubeflow.org",
        versions=("v1",),
        plural="paddlejobs",
        replica_specs="paddleReplicaSpecs",
    ),
    JobKind(
        kind="JAXJob",
        group="kubeflow.org",
        versions=("v1",),
        plural="jaxjobs",
        replica_specs="jaxReplicaSpecs",
    ),
    JobKind(kind="JobSet", group="jobset.x-k8s.io", versions=("v1alpha2",), plural="jobsets"),
    JobKind(kind="Job", group="batch.volcano.sh", versions=("v1alpha1",), plural="jobs"),
)
_BY_KIND = {k.kind: k for k in JOB_KINDS if k.replica_specs}
_TERMINAL_CONDITIONS = frozenset({"Succeeded", "Completed", "Failed"})
_TERMINAL_PHASES = frozenset({"Completed", "Failed", "Terminated", "Aborted"})


def _int(value: Any, *, default: int) -> int:
    """An integer field; a Katib placeholder (``${trialParameters.workers}``) or a missing
    value is ``default``."""
    try:
        return int(value) if value is not None else default
    except (TypeError, ValueError):
        return default


def _text(value: Any) -> str | None:
    return str(value) if value else None


def _dict(value: Any) -> JSON:
    """``value`` where it is an object, else empty: a job the CRD's loose schema let through
    with a list or a string where an object goes is read as far as it is well formed."""
    return value if isinstance(value, dict) else {}


def _objects(value: Any) -> list[JSON]:
    """The objects of ``value`` where it is a list (anything else in it left out)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _sizes(spec: JSON) -> tuple[ContainerSize, ...]:
    """Each container's memory request and limit as written (init containers first)."""
    sizes = []
    for key in ("initContainers", "containers"):
        for c in _objects(spec.get(key)):
            resources = _dict(c.get("resources"))
            sizes.append(
                ContainerSize(
                    init=key == "initContainers",
                    request=memory_bytes(_dict(resources.get("requests"))),
                    limit=memory_bytes(_dict(resources.get("limits"))),
                    sidecar=key == "initContainers" and c.get("restartPolicy") == "Always",
                )
            )
    return tuple(sizes)


def _template(
    role: str, replicas: int, template: Any, *, default_class: Any = None
) -> TemplateView:
    template = _dict(template)
    meta, spec = _dict(template.get("metadata")), _dict(template.get("spec"))
    return TemplateView(
        role=role,
        replicas=replicas,
        priority_class=_text(spec.get("priorityClassName")) or _text(default_class),
        scheduler_name=_text(spec.get("schedulerName")),
        labels={str(k): str(v) for k, v in _dict(meta.get("labels")).items()},
        annotations={str(k): str(v) for k, v in _dict(meta.get("annotations")).items()},
        containers=_sizes(spec),
        pod_limit=memory_bytes(_dict(_dict(spec.get("resources")).get("limits"))),
    )


def _templates(kind: str, spec: JSON) -> tuple[tuple[TemplateView, ...], str]:
    """The templates of a job of ``kind`` and its layout (:class:`TrainingJobView`)."""
    if kind in _BY_KIND:
        key = str(_BY_KIND[kind].replica_specs)
        specs = _dict(spec.get(key))
        views = tuple(
            _template(
                str(role), _int(_dict(rs).get("replicas"), default=1), _dict(rs).get("template")
            )
            for role, rs in specs.items()
        )
        return views, key
    if kind == "JobSet":
        views = tuple(
            _template(
                str(rj.get("name", "")),
                _int(rj.get("replicas"), default=1)
                * _int(_dict(_dict(rj.get("template")).get("spec")).get("parallelism"), default=1),
                _dict(_dict(rj.get("template")).get("spec")).get("template"),
            )
            for rj in _objects(spec.get("replicatedJobs"))
        )
        return views, "replicatedJobs"
    if kind == "Job" and "tasks" in spec:  # Volcano
        # Volcano's job controller gives a task's pods the Job's spec.priorityClassName where
        # their template names none (pkg/controllers/job/job_controller_util.go createJobPod).
        views = tuple(
            _template(
                str(t.get("name", "")),
                _int(t.get("replicas"), default=1),
                t.get("template"),
                default_class=spec.get("priorityClassName"),
            )
            for t in _objects(spec.get("tasks"))
        )
        return views, "tasks"
    # batch/v1 Job (a Katib trial's): parallelism pods at once.
    return (_template("", _int(spec.get("parallelism"), default=1), spec.get("template")),), (
        "template"
    )


def _finished(status: JSON) -> bool:
    conditions = _objects(status.get("conditions"))
    if any(c.get("type") in _TERMINAL_CONDITIONS and c.get("status") == "True" for c in conditions):
        return True
    return _dict(status.get("state")).get("phase") in _TERMINAL_PHASES


def job_view(job: JSON, *, kind: str, api_version: str) -> TrainingJobView:
    """A :class:`TrainingJobView` from a job object of ``kind`` (a :data:`JOB_KINDS` kind, or
    ``Job`` of batch/v1 for a trial template)."""
    meta, spec = _dict(job.get("metadata")), _dict(job.get("spec"))
    policy = _dict(spec.get("runPolicy")).get("schedulingPolicy")
    volcano = api_version.startswith("batch.volcano.sh/")
    min_available = spec.get("minAvailable") if volcano else _dict(policy).get("minAvailable")
    if volcano and not min_available and _objects(spec.get("tasks")):
        # Volcano's webhook sets an unset minAvailable to the tasks' own minAvailable summed,
        # each its replicas where it names none (pkg/webhooks/admission/jobs/mutate
        # patchDefaultMinAvailable).
        min_available = sum(
            _int(t.get("minAvailable"), default=_int(t.get("replicas"), default=1))
            for t in _objects(spec.get("tasks"))
        )
    owner = next((o for o in _objects(meta.get("ownerReferences")) if o.get("controller")), None)
    templates, layout = _templates(kind, spec)
    return TrainingJobView(
        kind=kind,
        api_version=api_version,
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        templates=templates,
        labels={str(k): str(v) for k, v in _dict(meta.get("labels")).items()},
        owner_kind=str(owner.get("kind")) if owner else None,
        finished=_finished(_dict(job.get("status"))),
        min_available=_int(min_available, default=0) if min_available is not None else None,
        scheduling_policy=isinstance(policy, dict),
        scheduler_name=_text(spec.get("schedulerName")) if volcano else None,
        priority_class=_text(spec.get("priorityClassName")) if volcano else None,
        layout=layout,
    )


def experiment_job(experiment: ExperimentView) -> TrainingJobView | None:
    """The job an Experiment's trials run, as a :class:`TrainingJobView` named for the
    Experiment (kind ``Experiment``); ``None`` when its ``trialSpec`` is not an object."""
    if experiment.trial_spec is None:
        return None
    # Each placeholder at its largest value (a number of workers set by a parameter is its
    # largest: the trial that needs the most), as Katib substitutes it into the text.
    largest = {p.name: _largest(parameter_values(p)) for p in experiment.parameters}
    refs = {t.name: t.reference for t in experiment.trial_parameters}
    text = substitute(experiment.trial_spec, values=largest, refs=refs)
    try:
        trial = json.loads(text)
    except json.JSONDecodeError:
        trial = json.loads(experiment.trial_spec)
    if not isinstance(trial, dict):
        return None
    trial_kind = str(trial.get("kind", "Job"))
    view = job_view(trial, kind=trial_kind, api_version=str(trial.get("apiVersion", "")))
    return TrainingJobView(
        kind="Experiment",
        api_version="kubeflow.org/v1beta1",
        namespace=experiment.namespace,
        name=experiment.name,
        templates=view.templates,
        labels=view.labels,
        min_available=view.min_available,
        scheduling_policy=view.scheduling_policy,
        scheduler_name=view.scheduler_name,
        priority_class=view.priority_class,
        layout=view.layout,
        trial_kind=trial_kind,
        finished=experiment.finished,
        trial_classes=_trial_classes(experiment),
    )


_CLASS_PLACEHOLDER = re.compile(r'"priorityClassName":\s*"\$\{trialParameters\.([^}]+)\}"')


def _trial_classes(experiment: ExperimentView) -> tuple[str, ...]:
    """The class names a ``priorityClassName`` bound to a trial parameter can take."""
    params = {p.name: p for p in experiment.parameters}
    refs = {t.name: t.reference for t in experiment.trial_parameters}
    names: set[str] = set()
    for placeholder in _CLASS_PLACEHOLDER.findall(experiment.trial_spec or ""):
        param = params.get(refs.get(placeholder, ""))
        if param is not None:
            names.update(parameter_values(param))
    return tuple(sorted(names))


def _largest(values: list[str]) -> str:
    """The largest of ``values`` that are numbers, else the first ("" for none)."""
    numbers = []
    for v in values:
        try:
            numbers.append((Decimal(v), v))
        except InvalidOperation:
            continue
    return max(numbers)[1] if numbers else (values[0] if values else "")


def priority_class_view(pc: JSON) -> PriorityClassView:
    """A :class:`PriorityClassView` from a PriorityClass object."""
    return PriorityClassView(
        name=str((pc.get("metadata") or {}).get("name", "")),
        value=_int(pc.get("value"), default=0),
        global_default=bool(pc.get("globalDefault")),
    )


async def _list(
    kube: KubeClient, *, group: str, version: str, plural: str, namespaces: Sequence[str]
) -> list[JSON]:
    docs: list[JSON] = []
    targets: list[str | None] = [*namespaces] or [None]
    for ns in targets:
        docs += await kube.list_custom(group=group, version=version, plural=plural, namespace=ns)
    return docs


async def _jobs(
    kube: KubeClient, kind: JobKind, namespaces: Sequence[str]
) -> Iterator[TrainingJobView]:
    """The jobs of ``kind``; raises NotFound when no version of its CRD is served."""
    for version in kind.versions:
        try:
            docs = await _list(
                kube, group=kind.group, version=version, plural=kind.plural, namespaces=namespaces
            )
        except NotFound:
            continue
        api_version = f"{kind.group}/{version}"
        return iter([job_view(d, kind=kind.kind, api_version=api_version) for d in docs])
    raise NotFound(f"{kind.plural}.{kind.group}")


async def read_training(
    kube: KubeClient,
    *,
    namespaces: Sequence[str],
    experiments: Sequence[ExperimentView] = (),
) -> tuple[TrainingInputs, tuple[str, ...]]:
    """The training jobs of ``namespaces`` (empty: every namespace), the jobs ``experiments``
    run, the PriorityClasses, and the notes. Raises :mod:`nodeguard.kube.errors` other than
    forbidden and not found."""
    jobs: list[TrainingJobView] = []
    forbidden: list[str] = []
    for kind in JOB_KINDS:
        try:
            jobs += await _jobs(kube, kind, namespaces)
        except NotFound:
            pass  # no such CRD: no such jobs
        except Forbidden:
            forbidden.append(f"{kind.plural}.{kind.group}")
    jobs += [j for e in experiments if (j := experiment_job(e)) is not None]
    notes: list[str] = []
    if forbidden:
        notes.append(
            f"training jobs were not read (list {', '.join(forbidden)} forbidden): their pods "
            "are judged alone, on priority only; bind nodeguard-doctor (docs/doctor-rbac.yaml)"
        )
    classes: tuple[PriorityClassView, ...] | None
    try:
        docs = await kube.list_custom(
            group="scheduling.k8s.io", version="v1", plural="priorityclasses"
        )
        classes = tuple(priority_class_view(d) for d in docs)
    except Forbidden:
        classes = None
        notes.append(
            "PriorityClasses were not read (list priorityclasses.scheduling.k8s.io forbidden): "
            "training-priority judges templates by class name only; bind nodeguard-doctor"
        )
    inputs = TrainingInputs(jobs=tuple(jobs), priority_classes=classes)
    return inputs, tuple(notes)
