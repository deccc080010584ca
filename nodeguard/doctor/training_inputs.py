"""What checks ``training-priority`` and ``training-gang`` read beside the pods: the training
jobs (Kubeflow training-operator jobs, MPIJob, JobSet, Volcano Job) as plain, frozen types,
and the cluster's PriorityClasses (:mod:`nodeguard.doctor.read_training` reads them).

A job is judged on its pod templates, as its controller will make the pods, and on the pods
it has (:mod:`nodeguard.doctor.training_workloads` joins them): a queue label lives on the job
only, and what the operator adds to a pod (a gang scheduler's PodGroup name) on the pod only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "ContainerSize",
    "PriorityClassView",
    "TemplateView",
    "TrainingInputs",
    "TrainingJobView",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class PriorityClassView:
    """A PriorityClass (scheduling.k8s.io/v1): its ``value`` and ``globalDefault``, which the
    Priority admission plugin gives a pod that names no class
    (plugin/pkg/admission/priority/admission.go ``getDefaultPriority``)."""

    name: str
    value: int
    global_default: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerSize:
    """A template's container as written: ``init`` for an init container (a sidecar too),
    its memory request and limit in bytes (``None``: not set)."""

    init: bool
    request: int | None
    limit: int | None
    #: A restartable init container (``restartPolicy: Always``): it runs beside the app.
    sidecar: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class TemplateView:
    """One pod template of a job: its role (a replica type such as ``Worker``, a JobSet
    replicated job's or a Volcano task's name), the pods it runs at once (``replicas``, times
    the Job's ``parallelism`` for a JobSet), ``spec.priorityClassName`` and
    ``spec.schedulerName`` (``None``: not set), the template's labels and annotations, and
    each container's memory request and limit as written (LimitRanger defaults them before it
    weighs them against a ``max``: :mod:`~nodeguard.doctor.template_limits`)."""

    role: str
    replicas: int
    priority_class: str | None
    scheduler_name: str | None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    containers: tuple[ContainerSize, ...] = ()
    #: The pod-level ``spec.resources.limits.memory`` (bytes), where the template sets one.
    pod_limit: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingJobView:
    """A training job: ``kind`` and ``api_version`` as served (``PyTorchJob``,
    ``kubeflow.org/v1``), its templates, its metadata labels (Kueue's
    ``kueue.x-k8s.io/queue-name`` is one), its controlling owner's kind (``Trial`` for a
    Katib trial's job), whether it has finished (a terminal condition or phase), and what it
    says of gang scheduling itself: ``min_available`` (``runPolicy.schedulingPolicy
    .minAvailable``, a Volcano Job's ``spec.minAvailable``), ``scheduling_policy`` (a
    ``runPolicy.schedulingPolicy`` is written), and for a Volcano Job its ``spec``
    ``schedulerName`` and ``priorityClassName``. ``layout`` says where its pod templates are,
    for the fixes: the ``spec`` key of a training-operator job's replica specs
    (``pytorchReplicaSpecs``: a map of role to ``template``), ``replicatedJobs`` (JobSet),
    ``tasks`` (Volcano) or ``template`` (batch/v1 Job); ``trial_kind`` is the kind of an
    Experiment's trial job (its ``spec.trialTemplate.trialSpec``), ``None`` for a job."""

    kind: str
    api_version: str
    namespace: str
    name: str
    templates: tuple[TemplateView, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    owner_kind: str | None = None
    finished: bool = False
    min_available: int | None = None
    scheduling_policy: bool = False
    scheduler_name: str | None = None
    priority_class: str | None = None
    layout: str = "template"
    trial_kind: str | None = None
    #: Every PriorityClass name a trial template can give (a ``priorityClassName`` bound to
    #: a trial parameter takes each value of its feasible space).
    trial_classes: tuple[str, ...] = ()

    @property
    def replicas(self) -> int:
        """The pods it runs at once, every template together."""
        return sum(t.replicas for t in self.templates)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingInputs:
    """The jobs of the namespaces in scope (a kind whose CRD is not installed is read as
    none) and the PriorityClasses (``None``: not read, so a class name cannot be resolved)."""

    jobs: tuple[TrainingJobView, ...] = ()
    priority_classes: tuple[PriorityClassView, ...] | None = None
