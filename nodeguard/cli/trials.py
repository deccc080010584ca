"""``nodeguard trials NAMESPACE/EXPERIMENT [--json]``: a Katib experiment's trials with the
memory they really used, by hyperparameter, and what to request for each value.

Reads the Experiment (``kubeflow.org/v1beta1``), its Trials (label
``katib.kubeflow.org/experiment``) and the memory records the agents wrote beside them
(:mod:`nodeguard.kube.trial_records`; the agents write a pod's when it ends): no Prometheus.
Prints a table of the trials (their parameter assignments, peak working set, limit, OOM kills,
outcome; those OOM-killed or within 10 % of their limit flagged), each parameter's spread by
value, and the fragment to paste into the Experiment (:mod:`nodeguard.cli.trial_fit`).
Exit status: 0; 2 for a bad argument; 3 the cluster could not be read; 4 no such Experiment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from nodeguard.cli.console import stdout_console
from nodeguard.cli.flags import add_json, add_kubeconfig, add_log_level
from nodeguard.cli.trial_fit import Spread, TrialRow, fragment, quantity, rows, spreads
from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import KubeError, NotFound
from nodeguard.kube.trial_records import GROUP, VERSION, TrialRecords
from nodeguard.units import format_bytes

__all__ = ["add_arguments", "run"]

HELP = "a Katib experiment's trials: the memory they used by hyperparameter, what to request"
EXIT_UNREADABLE, EXIT_NOT_FOUND = 3, 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``nodeguard trials``."""
    parser.add_argument("experiment", metavar="NAMESPACE/EXPERIMENT", help="the Experiment")
    add_json(parser, what="the trials, the spreads and the fragment")
    add_kubeconfig(parser, used_for="reading the cluster", home=True)
    add_log_level(parser, default="warning")


async def _read(kube: KubeClient, ns: str, name: str) -> tuple[Any, list[Any], dict[str, Any]]:
    exp = await kube.get_custom(
        group=GROUP, version=VERSION, plural="experiments", namespace=ns, name=name
    )
    trials = await kube.list_custom(
        group=GROUP,
        version=VERSION,
        plural="trials",
        namespace=ns,
        label_selector=f"katib.kubeflow.org/experiment={name}",
    )
    records = await TrialRecords(kube=kube).read(namespace=ns, experiment=name)
    return exp, trials, records


#: Parameters shown a column each up to this many; more share one column (``name=value``), so
#: the numbers always fit 80 columns.
_PARAM_COLUMNS = 2


def _table(found: list[TrialRow], params: list[str]) -> Table:
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left", title="Trials")
    # The numbers are read whole (never cut to "..."); long names and values fold instead.
    longest = max((len(r.name) for r in found), default=5)
    t.add_column("trial", overflow="fold", min_width=min(longest, 16))
    apart = params if len(params) <= _PARAM_COLUMNS else []
    for p in apart:
        widest = max((len(r.parameters.get(p, "")) for r in found), default=0)
        t.add_column(p, overflow="fold", min_width=min(max(widest, len(p)), 12))
    if not apart and params:
        t.add_column("parameters", overflow="fold", min_width=14)
    for head, width in (("peak", 10), ("limit", 10), ("OOM", 3)):
        t.add_column(head, justify="right", no_wrap=True, min_width=width)
    t.add_column("outcome", overflow="fold", min_width=11)
    for r in found:
        outcome = ", ".join(x for x in (r.outcome, r.flag) if x) or "-"
        values = [r.parameters.get(p, "") for p in apart]
        if not apart and params:
            values = [" ".join(f"{p}={r.parameters[p]}" for p in params if p in r.parameters)]
        t.add_row(
            r.name,
            *values,
            format_bytes(r.peak_working_set_bytes) if r.pods else "none yet",
            format_bytes(r.limit_bytes) if r.limit_bytes else ("none" if r.pods else "-"),
            str(r.oom_kills) if r.pods else "-",
            outcome,
        )
    return t


def _spreads(console: Console, found: list[Spread], *, doubles: frozenset[str]) -> None:
    for s in found:
        if not s.explained:
            trials = sum(g.trials for g in s.groups)
            why = (
                "a double, not judged"
                if s.parameter in doubles
                else "one value, not judged"
                if len(s.groups) == 1
                else "a value a trial, not judged"
                if len(s.groups) == trials
                else "explains none of the spread"
            )
            console.print(f"By {s.parameter}: {why}")
            continue
        t = Table(
            box=box.SIMPLE_HEAD,
            pad_edge=False,
            title_justify="left",
            title=f"By {s.parameter} (explains {s.explained:.0%} of the spread)",
        )
        # "need": the peaks, an OOM-killed trial's the guess above its limit.
        t.add_column(s.parameter, overflow="fold", justify="right")
        for head in ("trials", "need", "request", "limit"):
            t.add_column(head, no_wrap=True, justify="right")
        t.add_column("", overflow="fold")
        for g in s.groups:
            span = format_bytes(g.least_bytes)
            if g.most_bytes != g.least_bytes:
                span += f" - {format_bytes(g.most_bytes)}"
            t.add_row(
                g.value,
                str(g.trials),
                span,
                quantity(g.request_bytes),
                quantity(g.limit_bytes),
                "" if g.measured else "a guess: OOM-killed",
            )
        console.print(t)


def show(exp: Any, trials: list[Any], records: dict[str, Any], *, as_json: bool) -> None:
    """Print the report of ``nodeguard trials`` (module docstring) to stdout."""
    ns, name = exp["metadata"]["namespace"], exp["metadata"]["name"]
    spec = exp.get("spec") if isinstance(exp.get("spec"), dict) else {}
    template = spec.get("trialTemplate")
    primary = template.get("primaryContainerName") if isinstance(template, dict) else None
    found = rows(trials, records, container=primary if isinstance(primary, str) else None)
    doubles = frozenset(
        str(p.get("name"))
        for p in spec.get("parameters") or []
        if isinstance(p, dict) and p.get("parameterType") == "double"
    )
    spread = spreads(found, skip=doubles)
    best = spread[0] if spread and spread[0].explains else None
    text = fragment(experiment=f"{ns}/{name}", spread=best, every=found, spec=spec)
    if as_json:
        doc = {
            "experiment": f"{ns}/{name}",
            "trials": [asdict(r) | {"flag": r.flag, "need_bytes": r.need_bytes} for r in found],
            "spreads": [asdict(s) | {"explains": s.explains} for s in spread],
            "explained_by": best.parameter if best else None,
            "fragment": text,
        }
        json.dump(doc, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    console = stdout_console()
    params = sorted({p for r in found for p in r.parameters})
    console.print(_table(found, params))
    recorded = sum(1 for r in found if r.need_bytes is not None)
    console.print(
        f"{len(found)} trial(s) of {ns}/{name}, {recorded} with memory recorded (an agent "
        "records a trial pod's when it ends)"
    )
    _spreads(console, spread, doubles=doubles)
    if not recorded:
        return
    console.print("Paste into the Experiment:")
    console.out(text, end="", highlight=False)


def run(args: argparse.Namespace) -> int:
    """Run ``nodeguard trials``; the exit status (module docstring)."""
    ns, _, name = str(args.experiment).partition("/")
    if not ns or not name or "/" in name:
        sys.stderr.write("nodeguard trials: give NAMESPACE/EXPERIMENT, e.g. kubeflow/mnist\n")
        return 2

    async def read() -> tuple[Any, list[Any], dict[str, Any]]:
        kube = KubeClient.load(kubeconfig=args.kubeconfig)
        try:
            return await _read(kube, ns, name)
        finally:
            kube.close()

    try:
        exp, trials, records = asyncio.run(read())
    except NotFound:
        sys.stderr.write(f"nodeguard trials: no Experiment {ns}/{name} (or no Katib CRD)\n")
        return EXIT_NOT_FOUND
    except KubeError as exc:
        http = f" (HTTP {exc.status})" if exc.status else ""
        sys.stderr.write(f"nodeguard trials: cannot read the cluster: {exc}{http}\n")
        return EXIT_UNREADABLE
    show(exp, trials, records, as_json=args.json)
    return 0
