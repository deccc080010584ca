"""Training jobs' pod templates above their namespace's LimitRange ``max``, for check
``quota-limitrange``: LimitRanger's ``PodValidateLimitFunc`` refuses a container whose memory
request or limit is above a ``Container`` entry's ``max``, and a pod whose summed request or
limit is above a ``Pod`` entry's ``max`` (plugin/pkg/admission/limitranger/admission.go). A
job whose template is above one never starts those replicas: the operator's pod create is
refused, over and over, and a distributed job waits for good on the replicas it has.

The jobs are those of :mod:`~nodeguard.doctor.training_workloads` (not finished, no Katib
trial's job, and no Experiment: check ``katib-fit`` weighs a trial template over its
parameters); only the job's templates are weighed, the pods it already has were admitted.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from nodeguard.doctor.findings import Fact, Finding, ObjectRef
from nodeguard.doctor.inputs import Cluster, LimitRangeView
from nodeguard.doctor.training_workloads import job_ref

__all__ = ["templates_above_max"]


def templates_above_max(
    cluster: Cluster, *, namespace: str, ranges: Sequence[LimitRangeView], check: str
) -> Iterator[Finding]:
    """One error finding per job of ``namespace`` and LimitRange entry type (``Container``,
    ``Pod``) whose largest template is above the smallest ``max`` of that type."""
    jobs = [
        j
        for j in cluster.training.jobs
        if j.namespace == namespace
        and not j.finished
        and j.owner_kind != "Trial"
        and j.trial_kind is None
    ]
    for kind in ("Container", "Pod"):
        caps = [(i.max, r) for r in ranges for i in r.items if i.type == kind and i.max is not None]
        if not caps:
            continue
        cap, lr = min(caps, key=lambda c: c[0])
        for job in jobs:
            sized = [
                (t.largest_container_bytes if kind == "Container" else t.pod_bytes, t.role)
                for t in job.templates
            ]
            if not sized:
                continue
            above = [r or "its" for s, r in sized if s > cap]
            if not above:
                continue
            size, role = max(s for s, _ in sized), ", ".join(above)
            ref = job_ref(job)
            yield Finding(
                check=check,
                severity="error",
                title=(
                    f"{ref.kind} {namespace}/{job.name}: {role} pods above the "
                    f"LimitRange's {kind} max: refused at admission"
                ),
                objects=(ref, ObjectRef(kind="LimitRange", namespace=namespace, name=lr.name)),
                evidence=(
                    Fact(label=f"largest {kind.lower()} request or limit", bytes=size),
                    Fact(label="templates", text=role),
                    Fact(label=f"{kind} max memory ({lr.name})", bytes=cap),
                ),
                fix=(
                    f"# the memory of {role} at or below {cap // 2**20}Mi (in the "
                    "manifest that creates the job), or raise the max:\n"
                    f"kubectl -n {namespace} edit limitrange {lr.name}"
                ),
            )
