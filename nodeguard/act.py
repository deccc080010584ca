"""``nodeguard act ACTION --node NODE``: run one runbook action by hand.

Operators use it to ask "what would you evict right now?" (``--dry-run``) and to act during an
incident. For ``evict`` it prints the ranked plan: each unit's place and why, and each excluded
pod and why. Working sets come from the node's agent (``--agent-url http://NODE:9847``, its
``/snapshot``); without one, units rank by priority with usage unknown, and the plan says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import urllib.request
import uuid
from typing import Any

from rich.console import Console
from rich.table import Table

from nodeguard.actions.audit import ActionMetrics, Auditor
from nodeguard.actions.base import ActionResult
from nodeguard.actions.cordon import CordonConfig, cordon, uncordon
from nodeguard.actions.evict import EvictionBackoff, EvictionLimiter, evict
from nodeguard.actions.katib import experiments_on_node, pause_katib, resume_katib
from nodeguard.actions.ranking import EvictFilter, EvictionPlan, plan_eviction
from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import KubeError, NotFound
from nodeguard.kube.objects import parse_bytes, pod_meta
from nodeguard.report import format_bytes

__all__ = ["ACTIONS", "add_act_arguments", "run_act"]

ACTIONS = ("cordon", "uncordon", "evict", "pause-katib", "resume-katib")


def _quantity(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a memory quantity: {text!r} (e.g. 8Gi)") from exc


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"not KEY=VALUE: {text!r}")
    return key, value


def _namespaced(text: str) -> tuple[str, str]:
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name:
        raise argparse.ArgumentTypeError(f"not NAMESPACE/NAME: {text!r}")
    return namespace, name


def add_act_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``nodeguard act``."""
    parser.add_argument("action", choices=ACTIONS)
    parser.add_argument("--node", required=True, help="the node to act on")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="walk the whole path; the API server checks writes without "
        "persisting them (dryRun=All)",
    )
    parser.add_argument(
        "--kubeconfig", help="kubeconfig (default: in-cluster, $KUBECONFIG, ~/.kube/config)"
    )
    parser.add_argument("--rule", default="manual", help="recorded as the rule that acted")
    parser.add_argument("--reason", default="by hand (nodeguard act)")
    g = parser.add_argument_group("cordon")
    g.add_argument("--mode", choices=["unschedulable", "taint"], default="unschedulable")
    g.add_argument("--budget-nodes", type=int)
    g.add_argument("--budget-percent", type=float)
    g.add_argument("--lease-namespace", default="kube-system")
    e = parser.add_argument_group("evict")
    e.add_argument(
        "--target",
        type=_quantity,
        default=0,
        help="memory to free, a quantity like 8Gi (default 0: the first unit only)",
    )
    e.add_argument("--max-priority", type=int)
    e.add_argument("--priority-class", action="append", dest="priority_classes")
    e.add_argument("--namespace", action="append", dest="namespaces")
    e.add_argument(
        "--selector",
        action="append",
        type=_label,
        default=[],
        help="label KEY=VALUE (repeat); VALUE * only requires the label",
    )
    e.add_argument("--agent-url", help="the node's nodeguard, for working sets (its /snapshot)")
    k = parser.add_argument_group("Katib")
    k.add_argument(
        "--experiment",
        action="append",
        type=_namespaced,
        default=[],
        help="NAMESPACE/NAME (repeat); default: experiments with trials on the node",
    )
    k.add_argument("--floor", type=int, default=1, help="parallelTrialCount while paused")


def _usage_from_agent(url: str | None) -> dict[str, int]:
    if not url:
        return {}
    with urllib.request.urlopen(url.rstrip("/") + "/snapshot", timeout=10) as resp:
        snap: dict[str, Any] = json.load(resp)
    return {
        p["uid"]: p["memory"]["working_set_bytes"]
        for p in snap.get("pods", [])
        if p["memory"].get("working_set_bytes") is not None
    }


def render_plan(plan: EvictionPlan, *, console: Console) -> None:
    """The ranked victims and the exclusions, each with its reason."""
    if plan.ranked and not any(u.usage_known for u, _ in plan.ranked):
        console.print(
            "No working sets known (pass --agent-url http://NODE:9847): ranked by "
            "priority alone, and a --target cannot be measured."
        )
    t = Table(title="Eviction plan (first row goes first)", title_justify="left")
    for col in ("#", "unit", "pods", "working set", "request", "priority", "why this place"):
        t.add_column(
            col, justify="right" if col in ("#", "working set", "request", "priority") else "left"
        )
    for i, (unit, why) in enumerate(plan.ranked, 1):
        t.add_row(
            str(i),
            f"{unit.kind} {unit.namespace}/{unit.name}",
            ", ".join(p.name for p in unit.pods),
            format_bytes(unit.usage_bytes) if unit.usage_known else "unknown",
            format_bytes(unit.request_bytes),
            str(unit.priority),
            why,
        )
    console.print(t)
    if plan.excluded:
        x = Table(title="Never evicted here", title_justify="left")
        x.add_column("pod")
        x.add_column("why")
        for e in plan.excluded:
            x.add_row(f"{e.pod.namespace}/{e.pod.name}", e.reason)
        console.print(x)


def _print_results(results: list[ActionResult], console: Console) -> int:
    """Print each result; the exit status: 1 if any failed, 3 if any was refused or blocked
    (a budget, a limit or a PodDisruptionBudget said no), else 0."""
    for r in results:
        style = {
            "done": "green",
            "noop": "",
            "refused": "yellow",
            "blocked": "yellow",
            "failed": "red",
        }[r.outcome]
        prefix = "DRY RUN " if r.dry_run else ""
        console.print(
            f"[{style}]{prefix}{r.action} {r.outcome}[/{style}]: {r.message}"
            if style
            else f"{prefix}{r.action} {r.outcome}: {r.message}"
        )
    if any(r.outcome == "failed" for r in results):
        return 1
    return 3 if any(r.outcome in ("refused", "blocked") for r in results) else 0


async def _act(args: argparse.Namespace, console: Console) -> int:
    kube = KubeClient.load(kubeconfig=args.kubeconfig)
    auditor = Auditor(kube=kube, node_name=args.node, metrics=ActionMetrics(registry=None))
    try:
        if args.action in ("cordon", "uncordon"):
            cfg = CordonConfig(
                mode=args.mode,
                budget_nodes=args.budget_nodes,
                budget_percent=args.budget_percent,
                lease_namespace=args.lease_namespace,
            )
            if args.action == "cordon":
                res = await cordon(
                    kube=kube,
                    auditor=auditor,
                    node=args.node,
                    rule=args.rule,
                    reason=args.reason,
                    identity=f"act/{socket.gethostname()}/{uuid.uuid4().hex[:8]}",
                    dry_run=args.dry_run,
                    config=cfg,
                )
            else:
                res = await uncordon(
                    kube=kube,
                    auditor=auditor,
                    node=args.node,
                    rule=args.rule,
                    dry_run=args.dry_run,
                    config=cfg,
                )
            return _print_results([res], console)
        try:
            await kube.get_node(name=args.node)
        except NotFound:
            console.print(f"[red]error[/red]: no node {args.node!r} in the cluster")
            return 1
        items, _ = await kube.list_pods(node_name=args.node)
        pods = {m.uid: m for m in (pod_meta(p) for p in items)}
        if args.action == "evict":
            labels = dict(args.selector)
            flt = EvictFilter(
                max_priority=args.max_priority,
                priority_classes=frozenset(args.priority_classes)
                if args.priority_classes
                else None,
                namespaces=frozenset(args.namespaces) if args.namespaces else None,
                labels=labels or None,
            )
            try:
                usage = _usage_from_agent(args.agent_url)
            except (OSError, ValueError) as exc:
                console.print(f"[red]error[/red]: cannot read {args.agent_url}/snapshot: {exc}")
                return 1
            plan = plan_eviction(pods=pods, usage=usage, flt=flt)
            render_plan(plan, console=console)
            res = await evict(
                kube=kube,
                auditor=auditor,
                node=args.node,
                plan=plan,
                target_bytes=args.target,
                rule=args.rule,
                dry_run=args.dry_run,
                limiter=EvictionLimiter(),
                backoff=EvictionBackoff(),
            )
            return _print_results([res], console)
        experiments = list(args.experiment) or experiments_on_node(pods)
        if not experiments:
            console.print(f"no Katib experiment has trial pods on {args.node}")
            return 0
        if args.action == "pause-katib":
            results = await pause_katib(
                kube=kube,
                auditor=auditor,
                node=args.node,
                experiments=experiments,
                floor=args.floor,
                dry_run=args.dry_run,
            )
        else:
            results = await resume_katib(
                kube=kube,
                auditor=auditor,
                node=args.node,
                experiments=experiments,
                dry_run=args.dry_run,
            )
        return _print_results(results, console)
    finally:
        kube.close()


def run_act(args: argparse.Namespace) -> int:
    """Run ``nodeguard act``. Exit status: 0 done or nothing to do, 1 failed (including an API
    server that cannot be reached), 2 bad flags (argparse), 3 refused or blocked."""
    console = Console()
    try:
        return asyncio.run(_act(args, console))
    except KubeError as exc:
        console.print(f"[red]error[/red]: {type(exc).__name__}: {exc}")
        return 1
