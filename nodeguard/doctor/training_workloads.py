"""The training workloads that checks ``training-priority`` and ``training-gang`` judge: each
training job read (:mod:`nodeguard.doctor.training_inputs`) with its pods, each Katib
Experiment's trial job, and the training pods of no job read (a kind not read, a read
refused), grouped by the job they name.

A job's pods are those its controller makes: a training-operator job's pods have the job as
their controller owner (pkg/controller.v1/common/pod.go); a JobSet's carry
``jobset.sigs.k8s.io/jobset-name`` (they are owned by its Jobs); a Volcano Job's carry
``volcano.sh/job-name``; a Katib Experiment's trial pods carry ``katib.kubeflow.org/experiment``
(Katib's pod webhook copies the Trial's labels, which the Experiment controller gives it,
onto each trial pod: pkg/webhook/v1beta1/pod/utils.go ``mutatePodMetadata``). A Katib trial's job
(controller owner ``Trial``) is judged once, as its Experiment (whose trial template is the
fix's place), so it is left out, as are finished jobs (they hold nothing); training pods of
no job read are grouped by the job or trial label they carry.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import yaml

from nodeguard.actions.ranking import PODGROUP_ANNOTATIONS, PODGROUP_LABELS
from nodeguard.doctor.findings import ObjectRef
from nodeguard.doctor.gpu_nodes import gpu_or_training
from nodeguard.doctor.inputs import Cluster, PodView
from nodeguard.doctor.training_inputs import TrainingJobView

__all__ = [
    "HIGHEST_USER_PRIORITY",
    "KUEUE_QUEUE_LABEL",
    "Competitors",
    "PodGroupMark",
    "Workload",
    "evict_max_priority",
    "job_ref",
    "labels_patch",
    "manifest",
    "pod_group_mark",
    "subject",
    "template_patch",
    "workloads",
]

#: Kueue's LocalQueue label on a job (kueue pkg/controller/constants ``QueueLabel``).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: The highest priority a user's PriorityClass may have (pkg/apis/scheduling
#: ``HighestUserDefinablePriority``); the system classes are above it.
HIGHEST_USER_PRIORITY = 1_000_000_000
_TRAINING_LABELS = {
    "JobSet": "jobset.sigs.k8s.io/jobset-name",
    "Job": "volcano.sh/job-name",
    "Experiment": "katib.kubeflow.org/experiment",
}
#: The labels a training pod names its job by, and that job's kind (``None``: its owner's).
_POD_JOB_LABELS: dict[str, str | None] = {
    "training.kubeflow.org/job-name": None,
    "jobset.sigs.k8s.io/jobset-name": "JobSet",
    "volcano.sh/job-name": "Job.batch.volcano.sh",
    "katib.kubeflow.org/trial": "Trial",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """A training workload: the object its fix goes in, the job read (``None``: judged on its
    pods alone) and its pods holding resources."""

    ref: ObjectRef
    job: TrainingJobView | None
    pods: tuple[PodView, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PodGroupMark:
    """What makes a workload a gang: ``how`` in the evidence's words; ``min_member``: the
    pods the gang waits for where it is known (a Volcano Job's ``minAvailable``)."""

    how: str
    min_member: int | None = None


def subject(workload: Workload, verb: str, *, trial_kind: bool = False) -> str:
    """The workload and ``verb`` agreeing with it, for a finding's title: ``PyTorchJob
    ml/bert runs``; an Experiment's ``trials run`` (``trials (PyTorchJob) run`` with
    ``trial_kind``)."""
    ref, job = workload.ref, workload.job
    if job is not None and job.trial_kind is not None:
        kind = f" ({job.trial_kind})" if trial_kind else ""
        return f"Experiment {ref.namespace}/{ref.name}'s trials{kind} {verb}"
    return f"{ref.kind} {ref.namespace}/{ref.name} {verb}s"


def job_ref(job: TrainingJobView) -> ObjectRef:
    """The job as an object (a Volcano Job as ``Job.batch.volcano.sh``, apart from batch/v1's)."""
    kind = "Job.batch.volcano.sh" if job.api_version.startswith("batch.volcano.sh/") else job.kind
    return ObjectRef(kind=kind, namespace=job.namespace, name=job.name)


def _pod_keys(pod: PodView) -> Iterator[tuple[str, str, str, str]]:
    """The keys a pod is found by: ``(namespace, "owner", kind, name)`` of its controller
    and ``(namespace, "label", key, value)`` of each job label it carries."""
    ns = pod.meta.namespace
    for o in pod.meta.owners:
        if o.controller:
            yield ns, "owner", o.kind, o.name
    for label in _TRAINING_LABELS.values():
        if label in pod.meta.labels:
            yield ns, "label", label, pod.meta.labels[label]


def _job_key(job: TrainingJobView) -> tuple[str, str, str, str]:
    label = _TRAINING_LABELS.get(job.kind)
    if label is not None:
        return job.namespace, "label", label, job.name
    return job.namespace, "owner", job.kind, job.name


def workloads(cluster: Cluster) -> Iterator[Workload]:
    """The workloads of the namespaces in scope, jobs first in the order read."""
    live = [p for p in cluster.pods if p.training and not p.meta.finished]
    # Indexed once: a scan of every pod per job is quadratic on a large cluster.
    by_key: dict[tuple[str, str, str, str], list[PodView]] = {}
    for p in live:
        for key in _pod_keys(p):
            by_key.setdefault(key, []).append(p)
    joined: set[str] = set()
    read_jobs = {(j.namespace, j.kind, j.name) for j in cluster.training.jobs}
    for job in cluster.training.jobs:
        pods = tuple(by_key.get(_job_key(job), ()))
        joined.update(p.meta.uid for p in pods)  # a skipped job's pods are not judged alone
        if job.finished or job.owner_kind == "Trial" or not cluster.in_scope(job.namespace):
            continue
        yield Workload(ref=job_ref(job), job=job, pods=pods)
    groups: dict[tuple[str, str, str], list[PodView]] = {}
    for pod in live:
        if pod.meta.uid in joined or not cluster.in_scope(pod.meta.namespace):
            continue
        # Its job was read and is not judged (finished, a trial's, out of scope). A pod of a
        # job not there (deleted, its pods orphaned and still running) is judged alone.
        ns = pod.meta.namespace
        if any(o.controller and (ns, o.kind, o.name) in read_jobs for o in pod.meta.owners):
            continue
        groups.setdefault(_pod_group(pod), []).append(pod)
    for (ns, kind, name), members in groups.items():
        yield Workload(
            ref=ObjectRef(kind=kind, namespace=ns, name=name), job=None, pods=tuple(members)
        )


def _pod_group(pod: PodView) -> tuple[str, str, str]:
    """``(namespace, kind, name)`` of the job a training pod names."""
    owner = next((o for o in pod.meta.owners if o.controller), None)
    if owner is not None and owner.kind != "Job":
        return pod.meta.namespace, owner.kind, owner.name
    for label, labelled in _POD_JOB_LABELS.items():
        if label in pod.meta.labels:
            named = labelled or (owner.kind if owner else "Pod")
            return pod.meta.namespace, named, pod.meta.labels[label]
    kind, name = (owner.kind, owner.name) if owner else ("Pod", pod.meta.name)
    return pod.meta.namespace, kind, name


def _marked(
    labels: Mapping[str, str], annotations: Mapping[str, str], *, scheduler: str | None
) -> str | None:
    for key in PODGROUP_ANNOTATIONS:
        # Volcano's PodGroup controller gives a pod that names no group one of its own,
        # ``podgroup-<owner UID>`` of minMember 1 (pkg/controllers/podgroup/pg_controller.go):
        # each pod is then scheduled alone, which is no gang; and the default scheduler
        # reads no PodGroup at all.
        value = annotations.get(key)
        if value is None or value.startswith("podgroup-"):
            continue
        if scheduler in (None, "default-scheduler"):
            continue
        return f"annotation {key}={value}"
    for key in PODGROUP_LABELS:
        if key in labels:
            return f"label {key}={labels[key]}"
    return None


def pod_group_mark(workload: Workload) -> PodGroupMark | None:
    """How the workload is scheduled as a gang, ``None`` when nothing says it is: a Volcano
    Job (a PodGroup of ``minAvailable``, Volcano's job controller: ``min_member``), a Kueue
    queue label on the job (Kueue admits the quota of every pod set at once; on the pods
    alone it is no gang: Kueue's pod integration admits each such pod on its own), or a
    PodGroup named on a pod or a template: Volcano's ``scheduling.k8s.io/group-name``
    annotation (the training-operator adds it with ``--gang-scheduler-name=volcano``), which
    only a scheduler other than ``default-scheduler`` reads, or the coscheduling plugin's
    ``scheduling.x-k8s.io/pod-group`` label (added with ``scheduler-plugins``; which scheduler
    runs that plugin cannot be told from here)."""
    job = workload.job
    if job is not None:
        if job.api_version.startswith("batch.volcano.sh/"):
            least = job.min_available or job.replicas
            return PodGroupMark(how=f"Volcano Job (minAvailable {least})", min_member=least)
        if KUEUE_QUEUE_LABEL in job.labels:
            return PodGroupMark(how=f"Kueue LocalQueue {job.labels[KUEUE_QUEUE_LABEL]}")
        for t in job.templates:
            if how := _marked(t.labels, t.annotations, scheduler=t.scheduler_name):
                return PodGroupMark(how=f"template {t.role or '-'}: {how}")
    for p in workload.pods:
        if how := _marked(p.meta.labels, p.meta.annotations, scheduler=p.scheduler_name):
            return PodGroupMark(how=f"pod {p.meta.name}: {how}")
    return None


class Competitors:
    """The pods that compete with a training workload for its nodes' memory and are not
    training: on the nodes its pods run on (none yet: every GPU or training node in scope),
    not training, not a DaemonSet's or a static pod's, below the system classes, holding
    resources; highest priority first. Made once per run: workloads share nodes, and the
    GPU nodes are found once."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._gpu_nodes: frozenset[str] | None = None
        self._near: dict[frozenset[str], list[PodView]] = {}

    def near(self, workload: Workload) -> list[PodView]:
        """The competitors of ``workload`` (a list shared between calls: do not change it)."""
        cluster = self._cluster
        nodes = frozenset(p.meta.node_name for p in workload.pods if p.meta.node_name)
        if not nodes:
            if self._gpu_nodes is None:
                self._gpu_nodes = frozenset(
                    n.name
                    for n in cluster.nodes
                    if gpu_or_training(n, cluster.pods_on(n.name)) is not None
                )
            nodes = self._gpu_nodes
        if nodes not in self._near:
            near = [
                p
                for n in sorted(nodes)
                for p in cluster.pods_on(n)
                if not p.training
                and not p.meta.daemonset
                and not p.meta.mirror
                and p.meta.priority < HIGHEST_USER_PRIORITY
            ]
            near.sort(key=lambda p: (-p.meta.priority, -p.meta.memory_request_bytes, p.meta.name))
            self._near[nodes] = near
        return self._near[nodes]


def evict_max_priority(cluster: Cluster) -> tuple[int, str] | None:
    """The highest ``maxPriority`` of an ``evict`` action in the nodeguard agents' rules and
    the ConfigMap it is in (an evict with no ``maxPriority`` may take any pod below the
    system classes: :data:`HIGHEST_USER_PRIORITY`); ``None`` when no rules were read or none
    evicts."""
    best: tuple[int, str] | None = None
    for source in cluster.agent_rules:
        steps = [a for r in source.rules for a in r.actions]
        steps += [a for r in source.alerts for a in r.actions]
        for action in steps:
            if action.action != "evict":
                continue
            value = action.args.get("maxPriority", HIGHEST_USER_PRIORITY)
            where = f"ConfigMap {source.source.namespace}/{source.source.config_map}"
            if isinstance(value, int) and (best is None or value > best[0]):
                best = (value, where)
    return best


def template_patch(job: TrainingJobView, *, pod_spec: Mapping[str, object]) -> dict[str, object]:
    """A fragment of the job's manifest that sets ``pod_spec`` fields in each of its pod
    templates, laid out as its kind keeps them (an Experiment's under
    ``spec.trialTemplate.trialSpec``)."""
    roles = [t.role for t in job.templates] or [""]

    def leaf() -> dict[str, object]:  # one each: a shared one would dump as a YAML alias
        return {"spec": dict(pod_spec)}

    spec: dict[str, object]
    if job.layout == "replicatedJobs":
        spec = {
            "replicatedJobs": [
                {"name": r, "template": {"spec": {"template": leaf()}}} for r in roles
            ]
        }
    elif job.layout == "tasks":
        spec = {"tasks": [{"name": r, "template": leaf()} for r in roles]}
    elif job.layout == "template":
        spec = {"template": leaf()}
    else:
        spec = {job.layout: {r: {"template": leaf()} for r in roles}}
    return _in_trial(job, {"spec": spec})


def manifest(fragment: Mapping[str, object]) -> str:
    """``fragment`` as block YAML, keys in their order: libyaml's emitter when PyYAML has it
    (a fifth of the pure-Python one's time: the fixes were most of the checks' time on 1,000
    pods, docs/benchmarks.md), else PyYAML's own."""
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(dict(fragment), Dumper=dumper, sort_keys=False).rstrip()


def labels_patch(job: TrainingJobView, *, labels: Mapping[str, str]) -> dict[str, object]:
    """A fragment of the job's manifest that sets ``labels`` on the job itself (an
    Experiment's on its trial job)."""
    return _in_trial(job, {"metadata": {"labels": dict(labels)}})


def _in_trial(job: TrainingJobView, fragment: dict[str, object]) -> dict[str, object]:
    if job.trial_kind is None:
        return fragment
    return {"spec": {"trialTemplate": {"trialSpec": fragment}}}
