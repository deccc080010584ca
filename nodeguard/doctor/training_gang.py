"""Check ``training-gang``: multi-replica training jobs that nothing schedules as a whole.

A distributed job's replicas wait for each other (a PyTorch rendezvous, an MPI launcher, a
TF cluster spec): with the default scheduler each pod is placed on its own, so a cluster with
room for some replicas runs those, which hold their memory and GPUs and wait for the rest; two
such jobs can each hold half the cluster for good. A gang scheduler places all of a group or
none:

- Volcano: a Volcano Job is a PodGroup of ``spec.minAvailable`` (its admission webhook sets it
  to the tasks' replicas when unset); the training-operator makes one of
  ``runPolicy.schedulingPolicy.minAvailable`` (else every replica) for each job when it runs
  with ``--gang-scheduler-name=volcano``, and names it on each pod in the annotation
  ``scheduling.k8s.io/group-name`` (pkg/controller.v1/control/podgroup_control.go
  ``DecoratePodTemplateSpec``).
- scheduler-plugins' coscheduling: the same with any other ``--gang-scheduler-name``, the pod
  label ``scheduling.x-k8s.io/pod-group`` (``pod-group.scheduling.sigs.k8s.io`` before v0.25).
- Kueue: a job labelled ``kueue.x-k8s.io/queue-name`` is admitted only when the quota of every
  pod set fits (kueue pkg/scheduler/flavorassigner); ``waitForPodsReady`` adds the same on the
  nodes (a workload whose pods are not all ready in time is evicted and requeued).

``runPolicy.schedulingPolicy`` alone does nothing: the operator reads it only with
``--gang-scheduler-name``, so a job that writes it while no pod of it names a PodGroup is
reported with that said. ``schedulerName: volcano`` alone is no gang either: Volcano gives a pod
that names no PodGroup one of its own, of one member (pkg/controllers/podgroup). JobSet has no
gang of its own (kubernetes-sigs/jobset: Kueue, or the pods' PodGroup).

Finding (*warning*, for each job of the namespaces in scope that runs more than one pod at
once: its replicas, a JobSet's replicas times parallelism; an Experiment's trial job): nothing
above. Not a finding: one-pod jobs, finished jobs, a Katib trial's job (its Experiment is
judged), training pods whose job was not read (a queue label is on the job, not its pods, so
the pods alone cannot tell).
"""

from __future__ import annotations

from collections.abc import Iterator

from nodeguard.doctor.findings import Fact, Finding
from nodeguard.doctor.inputs import Cluster
from nodeguard.doctor.registry import Check, register
from nodeguard.doctor.training_inputs import TrainingJobView
from nodeguard.doctor.training_workloads import (
    KUEUE_QUEUE_LABEL,
    Workload,
    labels_patch,
    manifest,
    pod_group_mark,
    subject,
    workloads,
)

__all__: list[str] = []

CHECK = "training-gang"


def _findings(cluster: Cluster) -> Iterator[Finding]:
    for workload in workloads(cluster):
        job = workload.job
        if job is None or job.replicas < 2:
            continue
        mark = pod_group_mark(workload)
        if mark is None:
            yield _finding(workload, job)
        elif mark.min_member is not None and mark.min_member < job.replicas:
            yield _partial(workload, job, mark.min_member)


def _partial(workload: Workload, job: TrainingJobView, least: int) -> Finding:
    """A Volcano Job whose ``minAvailable`` is below its pods: Volcano starts it once that
    many can be placed, and the rest wait, holding nothing back for them (the job
    controller's PodGroup has ``minMember`` = ``minAvailable``)."""
    return Finding(
        check=CHECK,
        severity="warning",
        title=(
            f"{subject(workload, 'gang', trial_kind=True)} only {least} of its {job.replicas} pods"
        ),
        objects=(workload.ref,),
        evidence=(
            Fact(label="minAvailable", text=str(least)),
            Fact(label="pods at once", text=str(job.replicas)),
        ),
        fix=(
            f"# if every replica must run together (a distributed job), gang them all:\n"
            f"kubectl -n {job.namespace} patch vcjob {job.name} --type=merge "
            f'-p \'{{"spec":{{"minAvailable":{job.replicas}}}}}\''
        ),
    )


def _finding(workload: Workload, job: TrainingJobView) -> Finding:
    ref = workload.ref
    roles = ", ".join(f"{t.role or 'pod'} {t.replicas}" for t in job.templates)
    schedulers = sorted(
        {t.scheduler_name for t in job.templates if t.scheduler_name}
        | {p.scheduler_name for p in workload.pods}
    ) or ["default-scheduler"]
    evidence = [
        Fact(label="pods at once", text=f"{job.replicas} ({roles})"),
        Fact(label="schedulerName", text=", ".join(schedulers)),
        Fact(label="PodGroup or queue", text="none on the job, its templates or its pods"),
    ]
    if job.scheduling_policy:
        evidence.append(
            Fact(
                label="runPolicy.schedulingPolicy",
                text="set, but only an operator run with --gang-scheduler-name reads it",
            )
        )
    return Finding(
        check=CHECK,
        severity="warning",
        title=(
            f"{subject(workload, 'start', trial_kind=True)} {job.replicas} pods with no gang "
            "scheduling"
        ),
        objects=(ref,),
        evidence=tuple(evidence),
        fix=_fix(job),
    )


def _fix(job: TrainingJobView) -> str:
    queue = manifest(labels_patch(job, labels={KUEUE_QUEUE_LABEL: "<local-queue>"}))
    lines = [
        "# queue it with Kueue (all its pods admitted at once; waitForPodsReady for the nodes);",
        "# the label is read when the job is created:",
        queue,
    ]
    if job.layout.endswith("ReplicaSpecs"):
        lines.append(
            "# or run the training-operator with --gang-scheduler-name=volcano (or "
            "scheduler-plugins): it makes a PodGroup of every replica for each job"
        )
    else:
        lines.append(
            "# or name a PodGroup of minMember "
            f"{job.replicas} on every pod template (label scheduling.x-k8s.io/pod-group with "
            "the coscheduling plugin's scheduler)"
        )
    return "\n".join(lines)


register(
    Check(
        id=CHECK,
        title="multi-replica training jobs without gang scheduling",
        run=_findings,
        severities=("warning",),
    )
)
