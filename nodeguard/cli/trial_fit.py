"""What a Katib experiment's trials really needed, by hyperparameter: the rows of
``nodeguard trials``, the spread of their needs by each parameter's values, and a request and
limit for each value of the parameter that explains the memory.

A request is set on a container, so the numbers are the trial's primary container's
(``trialTemplate.primaryContainerName``) where the records have it, not the pod's: Katib's
metrics-collector sidecar has a limit of its own (100Mi by default, Katib's
``pkg/apis/config/v1beta1/defaults.go``) that the pod's would add. Each pod is judged against
its own limit (a distributed trial's launcher and workers differ). A pod's *need* is its peak
working set; one the kernel OOM-killed needed more than its limit, by an amount no sample can
tell: for the spread it counts as its limit (what it surely needed), for the recommendation as
:data:`OOM_GUESS` times that limit, marked not measured. A trial's need is its pods' largest.

A parameter *explains* the memory when omega squared, the share of the needs' variance
between its values' groups corrected for how many groups there are (Hays: (SSb - (k-1) MSw) /
(SSt + MSw)), is at least :data:`EXPLAINS`. It is judged only where the parameter has fewer
values than the trials measured and is not a ``double`` (a learning rate with a value a trial
explains everything and nothing); among those that explain, the one with the fewest values wins
a near tie. The recommendation for a group: request = need + :data:`REQUEST_ROOM`, limit =
need + :data:`LIMIT_ROOM`, both rounded up to 64 MiB.

Katib puts a parameter's value into the trial template as text (``${trialParameters.X}``,
``applyParameters`` in ``pkg/controller.v1beta1/experiment/manifest/generator.go``) and cannot
compute a memory from a batch size, so values that need different memory are written as
Experiments of their own, each with the parameter's ``feasibleSpace`` cut to its values
(:func:`fragment`); a value the Experiment allows but no trial tried goes with the class that
needs the most.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from nodeguard.remediation.trial_memory import whole_count

__all__ = [
    "EXPLAINS",
    "LIMIT_ROOM",
    "NEAR_LIMIT",
    "OOM_GUESS",
    "REQUEST_ROOM",
    "Group",
    "Spread",
    "TrialRow",
    "fragment",
    "quantity",
    "rows",
    "spreads",
]

OOM_GUESS = 1.5
EXPLAINS = 0.5
REQUEST_ROOM = 0.10
LIMIT_ROOM = 0.30
#: A trial whose peak is within 10 % of its limit is flagged.
NEAR_LIMIT = 0.9
#: Two parameters whose shares are this close are a tie: the one with fewer values wins.
_TIE = 0.1
_ROUND = 64 << 20
_OUTCOMES = ("Succeeded", "Failed", "EarlyStopped", "MetricsUnavailable", "Killed", "Running")
_PLACEHOLDER = re.compile(r"\$\{trialParameters\.([^}]+)\}")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialRow:
    """One Trial: ``parameters`` (``spec.parameterAssignments``), ``outcome`` (the first of
    its true ``status.conditions`` of :data:`_OUTCOMES`, else ``Created``/``""``), and its pods'
    records summed up (bytes): the largest peaks, the limit of the pod with the largest need,
    the OOM kills summed; ``pods`` 0 when no agent recorded one. ``need``, ``floor`` and
    ``near`` are :func:`rows`' (module docstring); without them (a row made by hand) they are
    taken from the row's own peak, limit and OOM kills."""

    name: str
    parameters: Mapping[str, str]
    outcome: str
    pods: int = 0
    peak_working_set_bytes: int | None = None
    peak_anon_bytes: int | None = None
    kernel_peak_bytes: int | None = None
    limit_bytes: int | None = None
    request_bytes: int | None = None
    oom_kills: int = 0
    need: int | None = None
    floor: int | None = None
    near: bool | None = None

    @property
    def flag(self) -> str:
        """``OOM-killed``, ``near limit`` (a pod's peak at least 90 % of its limit) or ``""``."""
        if self.oom_kills:
            return "OOM-killed"
        if self.near is not None:
            return "near limit" if self.near else ""
        peak, limit = self.peak_working_set_bytes, self.limit_bytes
        return "near limit" if peak is not None and limit and peak >= NEAR_LIMIT * limit else ""

    @property
    def need_bytes(self) -> int | None:
        """What it needed, for the recommendation (module docstring); ``None``: not recorded."""
        if self.need is not None:
            return self.need
        return _pod_need(self.peak_working_set_bytes, self.limit_bytes, self.oom_kills)[0]

    @property
    def floor_bytes(self) -> int | None:
        """What it surely needed, for the spread: an OOM-killed pod's limit, not a guess."""
        if self.floor is not None:
            return self.floor
        return _pod_need(self.peak_working_set_bytes, self.limit_bytes, self.oom_kills)[1]


def _pod_need(peak: int | None, limit: int | None, oom: int) -> tuple[int | None, int | None]:
    """(need, floor) of one pod (module docstring)."""
    if oom and limit:
        return max(peak or 0, int(limit * OOM_GUESS)), max(peak or 0, limit)
    return peak, peak


def _outcome(trial: Mapping[str, Any]) -> str:
    conditions = (trial.get("status") or {}).get("conditions") or []
    true = {c.get("type") for c in conditions if isinstance(c, dict) and c.get("status") == "True"}
    return next((o for o in _OUTCOMES if o in true), "Created" if "Created" in true else "")


def _part(record: Mapping[str, Any], container: str | None) -> Mapping[str, Any]:
    """The primary container's part of a pod's record where it has one, else the pod's."""
    containers = record.get("containers")
    if container and isinstance(containers, dict) and isinstance(containers.get(container), dict):
        return {**containers[container], "request_bytes": record.get("request_bytes")}
    return record


def _row(
    name: str, params: dict[str, str], outcome: str, pods: list[Mapping[str, Any]]
) -> TrialRow:
    judged = []  # (need, floor, peak, limit, oom, near) a pod with a peak
    for p in pods:
        peak, limit = (
            whole_count(p.get("peak_working_set_bytes")),
            whole_count(p.get("limit_bytes")),
        )
        oom = whole_count(p.get("oom_kills")) or 0
        need, floor = _pod_need(peak, limit, oom)
        near = bool(peak is not None and limit and peak >= NEAR_LIMIT * limit)
        judged.append((need, floor, peak, limit, oom, near))
    measured = [j for j in judged if j[0] is not None]
    worst = max(measured, key=lambda j: j[0] or 0) if measured else None

    def most(key: str) -> int | None:
        values = [v for p in pods if (v := whole_count(p.get(key))) is not None]
        return max(values) if values else None

    return TrialRow(
        name=name,
        parameters=params,
        outcome=outcome,
        pods=len(pods),
        peak_working_set_bytes=most("peak_working_set_bytes"),
        peak_anon_bytes=most("peak_anon_bytes"),
        kernel_peak_bytes=most("kernel_peak_bytes"),
        limit_bytes=worst[3] if worst else most("limit_bytes"),
        request_bytes=most("request_bytes"),
        oom_kills=sum(j[4] for j in judged),
        need=max(j[0] or 0 for j in measured) if measured else None,
        floor=max(j[1] or 0 for j in measured) if measured else None,
        near=any(j[5] for j in judged),
    )


def rows(
    trials: Sequence[Mapping[str, Any]],
    records: Mapping[str, Mapping[str, Mapping[str, Any]]],
    *,
    container: str | None = None,
) -> list[TrialRow]:
    """One row a Trial (by name), its pods' ``records`` (trial -> pod -> record) joined, the
    numbers of ``container`` (the primary container) where the records have it."""
    out = []
    for t in sorted(trials, key=lambda t: str((t.get("metadata") or {}).get("name"))):
        name = str(t["metadata"]["name"])
        raw = t.get("spec")
        assignments = raw.get("parameterAssignments") if isinstance(raw, dict) else None
        params = {
            str(a.get("name")): str(a.get("value"))
            for a in (assignments if isinstance(assignments, list) else [])
            if isinstance(a, dict)
        }
        pods = [_part(r, container) for r in (records.get(name) or {}).values()]
        out.append(_row(name, params, _outcome(t), pods))
    return out


def quantity(value: int) -> str:
    """Bytes as a Kubernetes quantity: ``Gi`` where whole, else ``Mi`` (rounded up)."""
    if value % (1 << 30) == 0:
        return f"{value >> 30}Gi"
    return f"{math.ceil(value / (1 << 20))}Mi"


def _round_up(value: float) -> int:
    return max(_ROUND, int(math.ceil(value / _ROUND) * _ROUND))


@dataclass(frozen=True, slots=True, kw_only=True)
class Group:
    """The trials with one value of a parameter: their count, the smallest and largest need
    (bytes), whether every need was measured (none OOM-killed), and the recommendation."""

    value: str
    trials: int
    least_bytes: int
    most_bytes: int
    measured: bool
    request_bytes: int
    limit_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Spread:
    """One parameter's groups (in the order of their values, numbers numerically) and the
    share of the needs' variance it explains (omega squared, 0..1; 0 where not judged)."""

    parameter: str
    groups: list[Group] = field(default_factory=list)
    explained: float = 0.0

    @property
    def explains(self) -> bool:
        """Whether it explains the memory (module docstring)."""
        return self.explained >= EXPLAINS


def _key(value: str) -> tuple[int, float, str]:
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)


def _group(value: str, members: Sequence[TrialRow]) -> Group:
    needs = [r.need_bytes for r in members if r.need_bytes is not None]
    most = max(needs)
    return Group(
        value=value,
        trials=len(members),
        least_bytes=min(needs),
        most_bytes=most,
        measured=not any((r.need_bytes or 0) > (r.floor_bytes or 0) for r in members),
        request_bytes=_round_up(most * (1 + REQUEST_ROOM)),
        limit_bytes=_round_up(most * (1 + LIMIT_ROOM)),
    )


def _omega_squared(groups: Sequence[Sequence[float]]) -> float:
    values = [v for g in groups for v in g]
    n, k = len(values), len(groups)
    if not 1 < k < n:
        return 0.0
    mean = sum(values) / n
    total = sum((v - mean) ** 2 for v in values)
    between = sum(len(g) * (sum(g) / len(g) - mean) ** 2 for g in groups)
    within = (total - between) / (n - k)
    if total <= 0:
        return 0.0
    return max(0.0, (between - (k - 1) * within) / (total + within))


def spreads(measured: Sequence[TrialRow], *, skip: frozenset[str] = frozenset()) -> list[Spread]:
    """Each parameter's :class:`Spread` over the trials with a need and a value of it, best
    explaining first (a near tie to the fewer values); ``skip``: parameters never judged (the
    Experiment's ``double`` ones); with none measured, ``[]``."""
    have = [r for r in measured if r.need_bytes is not None]
    out = []
    for name in sorted({p for r in have for p in r.parameters}):
        by: dict[str, list[TrialRow]] = {}
        for r in have:
            if name in r.parameters:  # a trial without it says nothing about it
                by.setdefault(r.parameters[name], []).append(r)
        groups = [by[v] for v in sorted(by, key=_key)]
        share = 0.0
        if name not in skip:
            share = _omega_squared([[float(r.floor_bytes or 0) for r in g] for g in groups])
        out.append(
            Spread(
                parameter=name,
                groups=[_group(v, by[v]) for v in sorted(by, key=_key)],
                explained=share,
            )
        )
    best = max((s.explained for s in out), default=0.0)
    return sorted(
        out,
        key=lambda s: (not s.explains, s.explained < best - _TIE, len(s.groups), -s.explained),
    )


def _comment(text: str) -> str:
    """``text`` on one comment line: a value holding a newline never escapes into YAML."""
    return " ".join(text.split())


def _allowed_values(spec: Mapping[str, Any], parameter: str) -> list[str]:
    """The values the Experiment's ``feasibleSpace.list`` allows ``parameter`` (``[]``: a
    range, or not in the Experiment)."""
    listed = spec.get("parameters")
    for p in listed if isinstance(listed, list) else []:
        if isinstance(p, dict) and p.get("name") == parameter:
            values = (p.get("feasibleSpace") or {}).get("list")
            return [str(v) for v in values] if isinstance(values, list) else []
    return []


def fragment(
    *, experiment: str, spread: Spread | None, every: Sequence[TrialRow], spec: Mapping[str, Any]
) -> str:
    """The YAML a user pastes (module docstring), from the Experiment's ``spec``: one
    document a memory class of ``spread``'s values, each the Experiment's ``parameters`` with
    that parameter's ``feasibleSpace`` cut to the class's values and its ``trialTemplate``
    with the primary container's memory request and limit set; where no parameter explains
    the memory (or every value needs the same), one document with the request and limit that
    fit every trial (``every``'s largest need). A template kept in a ConfigMap is not read:
    the resources are written as a comment for it."""
    head = f"# nodeguard trials {_comment(experiment)}: memory by what the trials used"
    measured = [r for r in every if r.need_bytes is not None]
    if not measured:
        return f"{head}\n# no trial's memory is recorded yet\n"
    classes: dict[tuple[int, int], list[Group]] = {}
    for g in spread.groups if spread is not None and spread.explains else ():
        classes.setdefault((g.request_bytes, g.limit_bytes), []).append(g)
    if spread is None or len(classes) < 2:
        g = _group("", measured)
        guess = "" if g.measured else " (OOM-killed trials: a guess above their limit, rerun)"
        why = (
            "no parameter explains the spread"
            if spread is None or not spread.explains
            else f"every value of {spread.parameter} needs the same"
        )
        doc = _document(spec, request=g.request_bytes, limit=g.limit_bytes)
        return f"{head}\n# {why}: one request and limit fits every trial{guess}\n{doc}"
    tried = {g.value for g in spread.groups}
    untried = [v for v in _allowed_values(spec, spread.parameter) if v not in tried]
    biggest = max(classes)
    ranges = _ranges(spec, spread.parameter, classes)
    out = [
        head,
        f"# {spread.parameter} explains {spread.explained:.0%} of the spread. Katib puts a "
        "value into the",
        "# template as text and cannot derive a memory from it: one Experiment a class.",
    ]
    if not _reaches_template(spec, spread.parameter):
        out += [
            f"# Note: {spread.parameter} reaches no ${{trialParameters...}} of the trial template:",
            "# its trials ran the same command whatever its value.",
        ]
    if ranges is None and _range_of(spec, spread.parameter) is not None:
        out += [
            f"# Note: memory does not grow along {spread.parameter}'s range:",
            "# the classes are cut to the values tried.",
        ]
    for (request, limit), groups in classes.items():
        values = [g.value for g in groups] + (untried if (request, limit) == biggest else [])
        notes = "" if all(g.measured for g in groups) else " (OOM-killed: a guess, rerun)"
        if untried and (request, limit) == biggest:
            notes += f" ({', '.join(untried)}: not tried, given the largest class)"
        space = ranges.get((request, limit)) if ranges else None
        shown = f"{space['min']} to {space['max']}" if space else ", ".join(values)
        out += [
            "---",
            _comment(
                f"# {spread.parameter} {shown}: request {quantity(request)}, "
                f"limit {quantity(limit)}{notes}"
            ),
            _document(
                spec,
                request=request,
                limit=limit,
                parameter=spread.parameter,
                values=values,
                space=space,
            ).rstrip("\n"),
        ]
    return "\n".join(out) + "\n"


def _reaches_template(spec: Mapping[str, Any], parameter: str) -> bool:
    """Whether a trial parameter referring to ``parameter`` is used in the trial template
    (``True`` where the template is not in the Experiment: it cannot be told)."""
    template = spec.get("trialTemplate")
    if not isinstance(template, dict) or not isinstance(template.get("trialSpec"), dict):
        return True
    used = set(_PLACEHOLDER.findall(json.dumps(template["trialSpec"])))
    names = {
        t.get("name")
        for t in template.get("trialParameters") or []
        if isinstance(t, dict) and t.get("reference") == parameter
    }
    return bool(names & used)


def _range_of(spec: Mapping[str, Any], parameter: str) -> tuple[float, float] | None:
    """The ``min`` and ``max`` of ``parameter``'s ``feasibleSpace`` where it is a range."""
    listed = spec.get("parameters")
    for p in listed if isinstance(listed, list) else []:
        if isinstance(p, dict) and p.get("name") == parameter:
            space = p.get("feasibleSpace")
            try:
                return float(space["min"]), float(space["max"])  # type: ignore[index]
            except (KeyError, TypeError, ValueError):
                return None
    return None


def _ranges(
    spec: Mapping[str, Any], parameter: str, classes: Mapping[tuple[int, int], list[Group]]
) -> dict[tuple[int, int], dict[str, str]] | None:
    """For a range parameter (``int``: min, max), each class's part of the range, cut half-way
    between the classes' values; ``None`` where it is no range or the classes are not each one
    run of the values in order (memory not growing along it)."""
    bounds = _range_of(spec, parameter)
    if bounds is None:
        return None
    try:
        order = sorted((float(g.value), key) for key, groups in classes.items() for g in groups)
    except ValueError:
        return None
    runs = [key for i, (_, key) in enumerate(order) if i == 0 or order[i - 1][1] != key]
    if len(runs) != len(set(runs)):
        return None
    cuts = [
        math.floor((order[i - 1][0] + order[i][0]) / 2)
        for i in range(1, len(order))
        if order[i - 1][1] != order[i][1]
    ]
    lows = [bounds[0], *(c + 1 for c in cuts)]
    highs = [*cuts, bounds[1]]
    return {
        key: {"min": f"{lo:g}", "max": f"{hi:g}"}
        for key, lo, hi in zip(runs, lows, highs, strict=True)
    }


def _document(
    spec: Mapping[str, Any],
    *,
    request: int,
    limit: int,
    parameter: str | None = None,
    values: Sequence[str] = (),
    space: Mapping[str, str] | None = None,
) -> str:
    """``spec: {parameters, trialTemplate}`` of one memory class, as YAML: ``parameter``'s
    feasible space the class's part of its range (``space``) or its ``values``."""
    listed = spec.get("parameters")
    params = copy.deepcopy(
        [p for p in listed if isinstance(p, dict)] if isinstance(listed, list) else []
    )
    if parameter is not None:
        p = next((p for p in params if p.get("name") == parameter), None)
        if p is None:  # assigned to the trials, but no longer in the Experiment
            p = {"name": parameter}
            params.append(p)
        if space is not None:  # its type kept: an int range cut in parts
            p["feasibleSpace"] = {**(p.get("feasibleSpace") or {}), **space}
        else:
            numeric = all(_key(v)[0] == 0 for v in values)
            # Katib's feasibleSpace.list is read for categorical and discrete parameters only.
            p["parameterType"] = "discrete" if numeric else "categorical"
            p["feasibleSpace"] = {"list": list(values)}
    raw = spec.get("trialTemplate")
    template = copy.deepcopy(dict(raw)) if isinstance(raw, dict) else {}
    primary = str(template.get("primaryContainerName") or "")
    memory = {"requests": quantity(request), "limits": quantity(limit)}
    found = _set_memory(template.get("trialSpec"), name=primary, memory=memory)
    body: dict[str, Any] = {"parameters": params} if parameter else {}
    text = ""
    if found:
        params = _unbound(template, params)
        if parameter:
            body["parameters"] = params
        body["trialTemplate"] = template
    else:
        where = (
            "the trial template is not in the Experiment"
            if not isinstance(template.get("trialSpec"), dict)
            else f"no container {primary or '(primaryContainerName unset)'} in the trial template"
        )
        text = (
            f"# {_comment(where)}: in its primary container set resources {{requests: "
            f"{{memory: {memory['requests']}}}, limits: {{memory: {memory['limits']}}}}}\n"
        )
    if body:
        text += yaml.safe_dump({"spec": body}, sort_keys=False, width=100)
    return text


def _unbound(template: dict[str, Any], params: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trial parameters the template no longer uses (a memory that was bound to one)
    taken out of ``trialParameters``, and their parameters out of ``params`` where no other
    trial parameter refers to them: Katib's validator refuses a trial parameter the template
    does not use."""
    used = set(_PLACEHOLDER.findall(json.dumps(template.get("trialSpec"))))
    trial_params = [t for t in template.get("trialParameters") or [] if isinstance(t, dict)]
    kept = [t for t in trial_params if t.get("name") in used]
    if len(kept) == len(trial_params):
        return params
    template["trialParameters"] = kept
    referenced = {t.get("reference") for t in kept}
    dropped = {t.get("reference") for t in trial_params if t not in kept}
    return [p for p in params if p.get("name") not in dropped - referenced]


def _set_memory(node: Any, *, name: str, memory: Mapping[str, str]) -> bool:
    """Set the memory request and limit of every container named ``name`` in ``node`` (a
    trial spec: a Job's, a PyTorchJob's replicas', ...), its other resources kept; whether one
    was found."""
    found = False
    if isinstance(node, dict):
        for c in node.get("containers") or []:
            if isinstance(c, dict) and c.get("name") == name:
                res = c.get("resources")
                res = c["resources"] = dict(res) if isinstance(res, dict) else {}
                for kind in ("requests", "limits"):
                    have = res.get(kind)
                    res[kind] = {**(have if isinstance(have, dict) else {}), "memory": memory[kind]}
                found = True
        for key, value in node.items():
            if key != "containers":
                found |= _set_memory(value, name=name, memory=memory)
    elif isinstance(node, list):
        for value in node:
            found |= _set_memory(value, name=name, memory=memory)
    return found
