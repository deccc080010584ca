"""Check ``katib-fit``: Katib Experiments whose parallel trials cannot fit (kubeflow/katib
v0.19 sources).

A trial's pods come from ``spec.trialTemplate.trialSpec`` with each
``${trialParameters.<name>}`` replaced, as text, by the value the suggestion gave the
experiment parameter it ``reference``\\ s (pkg/controller.v1beta1/experiment/manifest/
generator.go ``applyParameters``), and the Experiment controller keeps
``spec.parallelTrialCount`` trials running at once (3 when unset:
``DefaultTrialParallelCount``). So the largest memory a trial can ask for is found by trying
the values a suggestion can give the parameters that reach a ``resources`` field: every
``feasibleSpace.list`` value (categorical, discrete), and for ``int``/``double`` ``min`` and
``max`` and, when there are at most :data:`GRID` of them, every ``step`` between. A trial's
pods are every pod template in the trial spec, times its ``replicas`` (Kubeflow training
jobs' ``*ReplicaSpecs``, JobSet's ``replicatedJobs``) or ``parallelism`` (a batch Job); each
pod's request is nodeguard's ``PodRequests`` (:func:`nodeguard.kube.resources.pod_memory`).

- **quota** (error): ``parallelTrialCount`` x the largest trial's request (limit) above an
  unscoped ResourceQuota's ``requests.memory`` (``limits.memory``) of the namespace: the
  quota admission plugin refuses the trials' pods past it (pkg/quota/v1/evaluator/core/pods.go)
  and those trials never start. The fix is the largest ``parallelTrialCount`` that fits, or,
  when one trial alone does not, the quota a single trial needs.
- **no node** (error): a trial pod whose request is above the allocatable memory of every node
  it may land on (those matching its ``nodeSelector``, with GPUs when it requests
  ``nvidia.com/gpu``): the scheduler's ``NodeResourcesFit`` filter never places it.
- **nodes too small** (warning): ``parallelTrialCount`` trials' pods summed above those nodes'
  allocatable summed: trials wait for one another (other pods come on top).
- **limit below request** (error): a container whose memory limit is below its request for some
  parameter value: the API server refuses the pod (pkg/apis/core/validation
  ``ValidateResourceRequirements``, "must be less than or equal to memory limit").
- **LimitRange max** (error): a trial pod that LimitRanger refuses once it has given the
  containers the namespace's defaults (a container above a ``Container`` ``max`` or with no
  limit under one, the pod's limits above a ``Pod`` ``max`` or none under one:
  :func:`nodeguard.doctor.template_limits.refusal`): the per-pod maximum below what the
  training template asks for.
- **no limit** (warning): trial containers with no memory limit: a trial that grows takes the
  node's memory from its neighbours.

The node findings need every node: with ``--namespace`` or ``--node`` the nodes read are only
some, so they are not judged (the quota and template findings are). A trial template from a
ConfigMap (``trialTemplate.configMap``) is not read.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from nodeguard.doctor.findings import Fact, Finding, ObjectRef
from nodeguard.doctor.inputs import Cluster, NodeView
from nodeguard.doctor.katib_inputs import ExperimentView, ParameterView
from nodeguard.doctor.registry import Check, register
from nodeguard.doctor.template_limits import Refusal, refusal
from nodeguard.doctor.training_inputs import ContainerSize, TemplateView
from nodeguard.kube.resources import memory_bytes, pod_memory

__all__ = ["GRID", "TrialPod", "parameter_values", "substitute", "trial_pods"]

CHECK = "katib-fit"
#: A range parameter's grid is tried whole up to this many points, else its ends.
GRID = 16
#: Parameter combinations tried at most; past it, only each parameter's ends.
COMBINATIONS = 4096
GPU = "nvidia.com/gpu"
_PLACEHOLDER = re.compile(r"\$\{trialParameters\.([^}]+)\}")
JSON = dict[str, Any]


def parameter_values(param: ParameterView) -> list[str]:
    """The values a suggestion can give ``param``, as the text substituted: its ``list``, or
    for a range (``int``, ``double``) ``min``, ``max`` and, when ``step`` makes at most
    :data:`GRID` points, those between; ``[]`` when the space is not readable."""
    if param.values:
        return list(param.values)
    if param.min is None or param.max is None:
        return []
    try:
        low, high = Decimal(param.min), Decimal(param.max)
        step = Decimal(param.step) if param.step else (Decimal(1) if param.type == "int" else None)
    except InvalidOperation:
        return []
    ends = [param.min, param.max] if low != high else [param.min]
    if step is None or step <= 0 or (high - low) / step > GRID:
        return ends
    points, value = [], low
    while value <= high:
        points.append(str(value))
        value += step
    return points if points[-1] == str(high) else [*points, param.max]


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialPod:
    """One pod template of a trial with its parameters in: how many of it a trial runs, its
    memory request and limit (bytes, ``PodRequests``/``PodLimits``; limit ``None`` when a
    container has none), its containers without a limit and those whose limit is below the
    request, its ``nodeSelector`` and the GPUs it requests."""

    count: int
    request: int
    limit: int | None
    unlimited: tuple[str, ...]
    limit_below_request: tuple[str, ...]
    node_selector: tuple[tuple[str, str], ...]
    gpus: int
    #: Each container's memory request and limit as written, for LimitRanger's defaults.
    containers: tuple[ContainerSize, ...] = ()


def _count(value: Any) -> int:
    try:
        return max(int(value), 0)
    except (TypeError, ValueError):
        return 1


def _pod_specs(node: Any, times: int = 1) -> Iterator[tuple[JSON, int]]:
    """Every pod spec under ``node`` (a dict with ``containers``), with how many of it run: the
    ``replicas`` (or ``parallelism``) beside each ``template`` on the way down, multiplied."""
    if isinstance(node, list):
        for item in node:
            yield from _pod_specs(item, times)
        return
    if not isinstance(node, dict):
        return
    if isinstance(node.get("containers"), list):
        yield node, times
        return
    if "template" in node:
        times *= _count(node.get("replicas", node.get("parallelism", 1)))
    for value in node.values():
        yield from _pod_specs(value, times)


def trial_pods(trial: JSON) -> list[TrialPod]:
    """The pods one trial made of ``trial`` (a trial spec with its parameters in) runs."""
    pods = []
    for spec, count in _pod_specs(trial.get("spec") or {}):
        memory = pod_memory({"spec": spec})
        unlimited, below = [], []
        gpus = 0
        sizes = []
        inits = spec.get("initContainers") or []
        for i, c in enumerate([*inits, *spec["containers"]]):
            resources = c.get("resources") or {}
            request = memory_bytes(resources.get("requests"))
            limit = memory_bytes(resources.get("limits"))
            sizes.append(ContainerSize(init=i < len(inits), request=request, limit=limit))
            if limit is None:
                unlimited.append(c.get("name", ""))
            elif request is not None and limit < request:
                below.append(c.get("name", ""))
            gpus += _count((resources.get("limits") or {}).get(GPU, 0))
        selector = spec.get("nodeSelector") or {}
        pods.append(
            TrialPod(
                count=count,
                request=memory.request,
                limit=memory.limit,
                unlimited=tuple(unlimited),
                limit_below_request=tuple(below),
                node_selector=tuple(sorted((str(k), str(v)) for k, v in selector.items())),
                gpus=gpus,
                containers=tuple(sizes),
            )
        )
    return pods


@dataclass(frozen=True, slots=True, kw_only=True)
class _Trial:
    assignment: tuple[tuple[str, str], ...]  # experiment parameter -> value
    pods: tuple[TrialPod, ...]

    @property
    def request(self) -> int:
        return sum(p.count * p.request for p in self.pods)

    @property
    def limit(self) -> int | None:
        limits = [p.limit for p in self.pods]
        return None if None in limits else sum(p.count * (p.limit or 0) for p in self.pods)

    def shown(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.assignment) or "no parameter"


def _trials(exp: ExperimentView) -> list[_Trial]:
    """The trials worth trying: one per combination of the values of the parameters whose
    placeholders reach a ``resources`` field (others at their first value)."""
    if exp.trial_spec is None:
        return []
    refs = {t.name: t.reference for t in exp.trial_parameters}
    params = {p.name: p for p in exp.parameters}
    resources_text = " ".join(
        json.dumps(s.get("containers")) + json.dumps(s.get("initContainers"))
        for s, _ in _pod_specs(json.loads(exp.trial_spec))
    )
    varying = sorted({refs[n] for n in _PLACEHOLDER.findall(resources_text) if n in refs})
    choices = {name: parameter_values(params[name]) if name in params else [] for name in varying}
    choices = {name: values for name, values in choices.items() if values}
    if _product(len(v) for v in choices.values()) > COMBINATIONS:
        choices = {name: list(dict.fromkeys([v[0], v[-1]])) for name, v in choices.items()}
    first = {p.name: (parameter_values(p) or [""])[0] for p in exp.parameters}
    trials = []
    for combo in itertools.product(*choices.values()):
        assignment = dict(zip(choices, combo, strict=True))
        values = {**first, **assignment}
        text = substitute(exp.trial_spec, values=values, refs=refs)
        try:
            spec = json.loads(text)
        except json.JSONDecodeError:
            continue
        trials.append(_Trial(assignment=tuple(assignment.items()), pods=tuple(trial_pods(spec))))
    return trials


def substitute(text: str, *, values: dict[str, str], refs: dict[str, str]) -> str:
    """``text`` with each ``${trialParameters.<name>}`` replaced as Katib replaces it (a
    placeholder with no value is left as it is)."""
    return _PLACEHOLDER.sub(lambda m: values.get(refs.get(m[1], ""), m[0]), text)


def _product(sizes: Iterator[int]) -> int:
    total = 1
    for size in sizes:
        total *= size
    return total


def _ref(exp: ExperimentView) -> ObjectRef:
    return ObjectRef(kind="Experiment", namespace=exp.namespace, name=exp.name)


def _finding(
    exp: ExperimentView, severity: str, title: str, facts: list[Fact], fix: str
) -> Finding:
    return Finding(
        check=CHECK,
        severity="error" if severity == "error" else "warning",
        title=f"Katib experiment {exp.namespace}/{exp.name}: {title}",
        objects=(_ref(exp),),
        evidence=tuple(facts),
        fix=fix,
    )


def _quota(cluster: Cluster, exp: ExperimentView, trials: list[_Trial]) -> Iterator[Finding]:
    quotas = [q for q in cluster.quotas if q.namespace == exp.namespace and not q.scoped]
    for word, hard_name in (("request", "requests.memory"), ("limit", "limits.memory")):
        sized = [(t.request if word == "request" else t.limit, t) for t in trials]
        known = [(v, t) for v, t in sized if v is not None]
        present = [
            (h, q)
            for q in quotas
            if (h := q.hard_requests_memory if word == "request" else q.hard_limits_memory)
            is not None
        ]
        if not known or not present:
            continue
        (largest, trial), (hard, quota) = max(known, key=lambda x: x[0]), min(present)
        parallel = exp.parallel_trial_count
        if parallel * largest <= hard:
            continue
        fits = hard // largest if largest else parallel
        ns, name = exp.namespace, exp.name
        if fits:
            fix = (
                f"# {fits} trial(s) of the largest fit the quota at once:\n"
                f"kubectl -n {ns} patch experiment {name} --type=merge "
                f'-p \'{{"spec":{{"parallelTrialCount":{fits}}}}}\''
            )
        else:
            fix = (
                "# not even one such trial fits: raise the quota (or bind the memory to a "
                "smaller parameter value)\n"
                f"kubectl -n {ns} patch resourcequota {quota.name} --type=merge "
                f'-p \'{{"spec":{{"hard":{{"{hard_name}":"{_mib(parallel * largest)}"}}}}}}\''
            )
        yield _finding(
            exp,
            "error",
            f"{parallel} parallel trials need more memory {word}s than quota {quota.name} admits",
            [
                Fact(label="parallelTrialCount", text=str(parallel)),
                Fact(label=f"largest trial {word}", bytes=largest),
                Fact(label="at", text=trial.shown()),
                Fact(label=f"quota hard {hard_name}", bytes=hard),
                Fact(label="trials that fit", text=str(fits)),
            ],
            fix,
        )


def _mib(value: int) -> str:
    return f"{-(-value // 2**20)}Mi"


def _candidates(cluster: Cluster, pod: TrialPod) -> list[NodeView]:
    labels = {n.node: dict(n.labels) for n in cluster.katib.node_labels}
    return [
        n
        for n in cluster.nodes
        if all(labels.get(n.name, {}).get(k) == v for k, v in pod.node_selector)
        and (n.gpus > 0 or not pod.gpus)
        and n.meta.allocatable_memory_bytes is not None
    ]


def _nodes(cluster: Cluster, exp: ExperimentView, trials: list[_Trial]) -> Iterator[Finding]:
    if cluster.namespaces or not cluster.nodes:
        return  # only some nodes read (module docstring)
    pods = [(p, t) for t in trials for p in t.pods]
    if not pods:
        return
    pod, trial = max(pods, key=lambda x: x[0].request)
    nodes = _candidates(cluster, pod)
    room = max((n.meta.allocatable_memory_bytes or 0 for n in nodes), default=0)
    where = ", ".join(f"{k}={v}" for k, v in pod.node_selector) or "any node"
    if pod.request > room:
        yield _finding(
            exp,
            "error",
            "a trial pod requests more memory than any node it may run on has",
            [
                Fact(label="pod request", bytes=pod.request),
                Fact(label="at", text=trial.shown()),
                Fact(label="nodes", text=f"{len(nodes)} ({where}{', GPU' if pod.gpus else ''})"),
                Fact(label="largest allocatable", bytes=room),
            ],
            f"# bound the memory request to at most {_mib(room)} for every value, e.g. drop the "
            f"largest values of the parameters from the feasible space:\n"
            f"kubectl -n {exp.namespace} edit experiment {exp.name}",
        )
        return
    largest = max(trials, key=lambda t: t.request)
    need = exp.parallel_trial_count * largest.request
    total = sum(n.meta.allocatable_memory_bytes or 0 for n in nodes)
    if need > total:
        yield _finding(
            exp,
            "warning",
            f"{exp.parallel_trial_count} parallel trials need more memory than its nodes have",
            [
                Fact(label="parallel trials' requests", bytes=need),
                Fact(label="at", text=largest.shown()),
                Fact(label=f"allocatable of {len(nodes)} node(s)", bytes=total),
            ],
            f"# trials past {total // largest.request} wait for one another:\n"
            f"kubectl -n {exp.namespace} patch experiment {exp.name} --type=merge "
            f'-p \'{{"spec":{{"parallelTrialCount":{max(1, total // largest.request)}}}}}\'',
        )


def _limits(exp: ExperimentView, trials: list[_Trial]) -> Iterator[Finding]:
    below = sorted({(c, t.shown()) for t in trials for p in t.pods for c in p.limit_below_request})
    if below:
        yield _finding(
            exp,
            "error",
            "trial pods with a memory limit below the request: the API server refuses them",
            [Fact(label="container", text=f"{c} at {at}") for c, at in below[:5]],
            "# bind the limit to a parameter at least the request's, or to the same one\n"
            f"kubectl -n {exp.namespace} edit experiment {exp.name}",
        )
    unlimited = sorted({c for t in trials[:1] for p in t.pods for c in p.unlimited})
    if unlimited:
        yield _finding(
            exp,
            "warning",
            "trial containers without a memory limit",
            [Fact(label="containers", text=", ".join(unlimited))],
            _limit_fix(exp),
        )


def _limit_fix(exp: ExperimentView) -> str:
    """A limit for each container of the template that has none: its request as written (a
    ``${trialParameters.X}`` stays one, so the limit follows the parameter), else a starting
    value to size."""
    lines = []
    for spec, _ in _pod_specs(json.loads(exp.trial_spec or "{}")):
        for c in [*(spec.get("initContainers") or []), *spec["containers"]]:
            resources = c.get("resources") or {}
            if (resources.get("limits") or {}).get("memory") is not None:
                continue
            request = (resources.get("requests") or {}).get("memory")
            value = f'"{request}"  # its request' if request else "1Gi  # choose: its peak and room"
            lines += [f"- name: {c.get('name', '')}", "  resources:", "    limits:"]
            lines.append(f"      memory: {value}")
    return "# in spec.trialTemplate.trialSpec, the containers' resources:\n" + "\n".join(
        dict.fromkeys(lines)
    )


def _limit_range_max(
    cluster: Cluster, exp: ExperimentView, trials: list[_Trial]
) -> Iterator[Finding]:
    """Trial pods the namespace's LimitRanges refuse, as LimitRanger weighs them after its
    defaults (:func:`nodeguard.doctor.template_limits.refusal`: a container above a
    ``Container`` ``max`` or with no limit under one, a pod's limits above a ``Pod`` ``max``
    or none under one), so those trials never start; the largest refused is named. A request
    above a container's own limit is :func:`_limits`' finding."""
    ranges = [r for r in cluster.limit_ranges if r.namespace == exp.namespace]
    refused: list[tuple[Refusal, _Trial]] = []
    for t in trials:
        for p in t.pods:
            shape = TemplateView(
                role="",
                replicas=p.count,
                priority_class=None,
                scheduler_name=None,
                containers=p.containers,
            )
            why = refusal(shape, ranges)
            if why is not None and why.limit_range:
                refused.append((why, t))
    if not refused:
        return
    why, trial = max(refused, key=lambda x: -1 if x[0].size is None else x[0].size)
    size = (
        Fact(label="after the LimitRange defaults", text="no limit")
        if why.size is None
        else Fact(label="after the LimitRange defaults", bytes=why.size)
    )
    yield Finding(
        check=CHECK,
        severity="error",
        title=(
            f"Katib experiment {exp.namespace}/{exp.name}: trial pods refused at admission "
            f"({why.what} of LimitRange {why.limit_range})"
        ),
        objects=(
            _ref(exp),
            ObjectRef(kind="LimitRange", namespace=exp.namespace, name=why.limit_range),
        ),
        evidence=(
            size,
            Fact(label="at", text=trial.shown()),
            Fact(label=f"{why.what} memory ({why.limit_range})", bytes=why.bound),
        ),
        fix=(
            f"# drop the parameter values above {_mib(why.bound)} from the feasible space, give "
            "the trial's containers limits within it, or raise the max:\n"
            f"kubectl -n {exp.namespace} edit limitrange {why.limit_range}"
        ),
    )


def _findings(cluster: Cluster) -> Iterator[Finding]:
    for exp in sorted(cluster.katib.experiments, key=lambda e: (e.namespace, e.name)):
        if not cluster.in_scope(exp.namespace):
            continue
        trials = _trials(exp)
        if not trials:
            continue
        yield from _quota(cluster, exp, trials)
        yield from _limit_range_max(cluster, exp, trials)
        yield from _nodes(cluster, exp, trials)
        yield from _limits(exp, trials)


register(
    Check(
        id=CHECK,
        title="Katib experiments whose parallel trials cannot fit the quota or the nodes",
        run=_findings,
    )
)
