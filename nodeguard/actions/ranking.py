"""Choosing eviction victims as the kubelet would, in gangs, with every exclusion explained.

The kubelet ranks pods for eviction under memory pressure (pkg/kubelet/eviction/helpers.go,
rankMemoryPressure) by: usage above request first, then lower priority first, then larger usage
minus request first. nodeguard ranks the same way, with two differences that keep a GPU node
useful:

- Never: system-critical pods (priority >= 2000000000, or the ``system-node-critical`` /
  ``system-cluster-critical`` PriorityClasses), DaemonSet pods, mirror/static pods, pods already
  terminating or finished. A rule narrows further (max priority, PriorityClass names,
  namespaces, labels).
- Gangs: the pods of one Katib trial (label ``katib.kubeflow.org/trial``), one PodGroup
  (Volcano's ``scheduling.k8s.io/group-name`` annotation, or the coscheduling plugin's label),
  one Kubeflow training job (label ``training.kubeflow.org/job-name``, or a
  PyTorchJob/TFJob/MPIJob/XGBoostJob owner) or one Indexed Job are one unit: evicting one
  member kills the whole, so they are counted (usage, request, highest priority) and evicted
  together, with their members on other nodes.
- Finished pods (phase ``Succeeded``/``Failed``: a Katib trial kept with ``retain: true``, a
  Job's completed index, a PyTorchJob's pods under ``cleanPodPolicy: None``) are dropped before
  any grouping: never a victim, and never "a member that may not be evicted" that would keep
  its gang's running pods from being one (kubectl drain skips them too, kubernetes#26080).

Pure functions: no I/O, tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nodeguard.snapshot import GpuDevice, NodeSnapshot, PodMeta
from nodeguard.units import format_bytes

__all__ = [
    "PODGROUP_ANNOTATIONS",
    "PODGROUP_LABELS",
    "EvictFilter",
    "EvictionPlan",
    "Exclusion",
    "Unit",
    "excluded_by",
    "gang_of",
    "gpu_eviction_plan",
    "never_evicted",
    "plan_eviction",
    "usage_measure",
]

SYSTEM_CRITICAL_PRIORITY = 2_000_000_000
SYSTEM_CLASSES = frozenset({"system-node-critical", "system-cluster-critical"})
TRAINING_KINDS = frozenset(
    {"PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob", "TrainJob"}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class EvictFilter:
    """What a rule allows to be evicted. ``None`` fields do not restrict.
    ``labels``: all must match; a value ``"*"`` only requires the label to exist."""

    max_priority: int | None = None
    priority_classes: frozenset[str] | None = None
    namespaces: frozenset[str] | None = None
    labels: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Unit:
    """One eviction unit: a lone pod or a gang. ``kind``/``name`` say which gang
    (``pod`` for a lone pod); sums are over this node's members."""

    kind: str
    namespace: str
    name: str
    pods: tuple[PodMeta, ...]
    usage_bytes: int
    request_bytes: int
    priority: int
    usage_known: bool

    @property
    def exceeds_request(self) -> bool:
        return self.usage_known and self.usage_bytes > self.request_bytes

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"

    def label_selector(self) -> str | None:
        """A label selector narrowing the namespace's pods to the gang's, where one exists
        (the caller still checks each pod's gang); ``None``: list the namespace."""
        member = self.pods[0]
        if self.kind == "katib-trial":
            return f"katib.kubeflow.org/trial={self.name}"
        if self.kind == "training-job" and "training.kubeflow.org/job-name" in member.labels:
            return f"training.kubeflow.org/job-name={self.name}"
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Exclusion:
    """A pod that will not be evicted, and why."""

    pod: PodMeta
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EvictionPlan:
    """Units in eviction order, each with the reason for its place; exclusions with theirs.
    ``not_found``: for a plan narrowed to one pod (a pod or container rule), why that pod is
    not in it (excluded, or not on the node); empty otherwise. ``measure``: what the units'
    ``usage_bytes`` count, in the words reasons and messages use (:func:`usage_measure`)."""

    ranked: tuple[tuple[Unit, str], ...]
    excluded: tuple[Exclusion, ...] = field(default=())
    not_found: str = ""
    measure: str = "unreclaimable memory"


#: What evicting a pod frees, and what its usage counts (nodeguard.sources.unreclaimable):
#: the memory the kernel cannot reclaim from it (anon, shmem, kernel memory), not its page
#: cache, which the working set (usage - inactive_file) still counts when active.
UNRECLAIMABLE = "unreclaimable memory"
WORKING_SET = "working set"


def usage_measure(*, unreclaimable: int, working_set: int) -> str:
    """The words for a usage mapping made of ``unreclaimable`` pods' unreclaimable memory and
    ``working_set`` pods' working set (where memory.stat lacks the lines unreclaimable memory
    is made of, the working set stands in): ``"unreclaimable memory"``, ``"working set"``, or
    both named when the mapping mixes them."""
    if working_set == 0:
        return UNRECLAIMABLE
    if unreclaimable == 0:
        return WORKING_SET
    return f"{UNRECLAIMABLE} or {WORKING_SET}"


# Pod annotations and labels that name a PodGroup: Volcano, and the scheduler-plugins
# coscheduling plugin.
PODGROUP_ANNOTATIONS = ("scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name")
PODGROUP_LABELS = ("scheduling.x-k8s.io/pod-group", "pod-group.scheduling.sigs.k8s.io")


def gang_of(pod: PodMeta) -> tuple[str, str]:
    """``(kind, name)`` of the gang a pod belongs to; ``("pod", pod.name)`` if none.

    A plain Job of independent workers is not a gang; an Indexed Job (pods annotated
    ``batch.kubernetes.io/job-completion-index``, what distributed training runs as) is.
    """
    trial = pod.labels.get("katib.kubeflow.org/trial")
    if trial:
        return "katib-trial", trial
    for key in PODGROUP_ANNOTATIONS:
        if pod.annotations.get(key):
            return "podgroup", pod.annotations[key]
    for key in PODGROUP_LABELS:
        if pod.labels.get(key):
            return "podgroup", pod.labels[key]
    job = pod.labels.get("training.kubeflow.org/job-name")
    if job:
        return "training-job", job
    for owner in pod.owners:
        if owner.controller and owner.kind in TRAINING_KINDS:
            return "training-job", owner.name
        if (
            owner.controller
            and owner.kind == "Job"
            and "batch.kubernetes.io/job-completion-index" in pod.annotations
        ):
            return "job", owner.name
    return "pod", pod.name


def never_evicted(pod: PodMeta) -> str | None:
    """Why a pod may never be evicted by nodeguard, ``None`` if it may."""
    if pod.terminating:
        return "already terminating"
    if pod.phase in ("Succeeded", "Failed"):
        return f"phase {pod.phase}"
    if pod.mirror or pod.annotations.get("kubernetes.io/config.source", "api") != "api":
        return "static pod (mirror): the kubelet owns it, eviction cannot remove it"
    if pod.daemonset:
        return "DaemonSet pod: it would be recreated on this node at once"
    if pod.priority >= SYSTEM_CRITICAL_PRIORITY or pod.priority_class in SYSTEM_CLASSES:
        return f"system-critical (priority {pod.priority}, class {pod.priority_class or '-'})"
    return None


def excluded_by(pod: PodMeta, flt: EvictFilter) -> str | None:
    """Why ``flt`` (a rule's or a command's filter) does not allow evicting ``pod``, ``None``
    if it does."""
    if flt.namespaces is not None and pod.namespace not in flt.namespaces:
        return f"namespace {pod.namespace} not in the namespaces asked for"
    if flt.max_priority is not None and pod.priority > flt.max_priority:
        return f"priority {pod.priority} above the maximum {flt.max_priority}"
    if flt.priority_classes is not None and pod.priority_class not in flt.priority_classes:
        return f"PriorityClass {pod.priority_class or '(none)'} not in the classes asked for"
    if flt.labels and not all(
        k in pod.labels if v == "*" else pod.labels.get(k) == v for k, v in flt.labels.items()
    ):
        return "labels do not match the selector asked for"
    return None


def plan_eviction(
    *,
    pods: Mapping[str, PodMeta],
    usage: Mapping[str, int],
    flt: EvictFilter,
    measure: str = UNRECLAIMABLE,
) -> EvictionPlan:
    """Rank this node's pods for eviction, as the kubelet ranks them (usage above request,
    then priority, then usage - request: pkg/kubelet/eviction/helpers.go ``rankMemoryPressure``),
    with usage what eviction frees.

    ``pods``: pod UID -> metadata (this node's pods); ``usage``: pod UID -> bytes, by default
    the pod's unreclaimable memory from the snapshot; ``measure`` names what it counts in the
    reasons (:func:`usage_measure`). A pod without usage ranks as if it used nothing, and says
    so.
    """
    excluded: list[Exclusion] = []
    gangs: dict[tuple[str, str, str], list[PodMeta]] = {}
    for pod in sorted(pods.values(), key=lambda p: (p.namespace, p.name)):
        if pod.finished:
            # Before grouping: a finished member neither ranks nor holds its gang back.
            excluded.append(Exclusion(pod=pod, reason=f"phase {pod.phase}: finished"))
            continue
        kind, name = gang_of(pod)
        gangs.setdefault((kind, pod.namespace, name), []).append(pod)

    units: list[Unit] = []
    for (kind, namespace, name), members in gangs.items():
        reasons = [(p, never_evicted(p) or excluded_by(p, flt)) for p in members]
        bad = [(p, r) for p, r in reasons if r]
        if bad:
            for p, r in reasons:
                why = r or f"its {kind} {name} has a member that may not be evicted"
                excluded.append(Exclusion(pod=p, reason=why))
            continue
        known = all(p.uid in usage for p in members)
        units.append(
            Unit(
                kind=kind,
                namespace=namespace,
                name=name,
                pods=tuple(members),
                usage_bytes=sum(usage.get(p.uid, 0) for p in members),
                request_bytes=sum(p.memory_request_bytes for p in members),
                priority=max(p.priority for p in members),
                usage_known=known,
            )
        )

    units.sort(
        key=lambda u: (not u.exceeds_request, u.priority, -(u.usage_bytes - u.request_bytes), u.key)
    )
    ranked: list[tuple[Unit, str]] = []
    for u in units:
        over = u.usage_bytes - u.request_bytes
        if not u.usage_known:
            why = f"usage unknown; priority {u.priority}"
        elif u.exceeds_request:
            why = f"{measure} {format_bytes(over)} above its request; priority {u.priority}"
        else:
            why = f"within its request ({format_bytes(-over)} to spare); priority {u.priority}"
        if u.kind != "pod":
            why += f"; {u.kind} of {len(u.pods)} pod(s) on this node, evicted together"
        ranked.append((u, why))
    return EvictionPlan(ranked=tuple(ranked), excluded=tuple(excluded), measure=measure)


def gpu_eviction_plan(
    *, snapshot: NodeSnapshot, device: GpuDevice, flt: EvictFilter
) -> tuple[EvictionPlan, dict[str, int]]:
    """Rank the pods with compute processes on one GPU for a ``gpu`` rule: lowest priority
    first, then the most memory on that GPU (NVML's per-process ``usedGpuMemory``), then the
    unit key. Returns the plan and pod UID -> bytes on that GPU; a pod with any process whose
    memory NVML does not report has an unknown total (it ranks with usage unknown)."""
    usage: dict[str, int] = {}
    unknown: set[str] = set()
    for u in snapshot.gpu_containers():
        if u.gpu_index != device.index:
            continue
        if u.used_bytes is None:
            unknown.add(u.pod_uid)
        else:
            usage[u.pod_uid] = usage.get(u.pod_uid, 0) + u.used_bytes
    on_gpu = unknown | set(usage)
    pods = {uid: m for uid, m in (snapshot.pod_meta or {}).items() if uid in on_gpu}
    for uid in unknown:
        usage.pop(uid, None)  # part of its GPU memory is unknown, so is its total
    plan = plan_eviction(pods=pods, usage=usage, flt=flt, measure="GPU memory")
    ranked = sorted(plan.ranked, key=lambda r: (r[0].priority, -r[0].usage_bytes, r[0].key))
    where = f"GPU {device.index} ({device.key})"
    reasons = []
    for unit, _ in ranked:
        known = f"{format_bytes(unit.usage_bytes)} of GPU memory on {where}"
        why = known if unit.usage_known else f"GPU memory on {where} unknown"
        why += f"; priority {unit.priority}"
        if unit.kind != "pod":
            why += f"; {unit.kind} of {len(unit.pods)} pod(s) on this GPU, evicted together"
        reasons.append((unit, why))
    return EvictionPlan(ranked=tuple(reasons), excluded=plan.excluded, measure=plan.measure), usage
