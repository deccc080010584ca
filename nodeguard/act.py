"""``nodeguard act ACTION --node NODE``: run one runbook action by hand.

Operators use it to ask "what would you evict right now?" (``--dry-run``) and to act during an
incident. It dispatches through the same action registry as the agent's runbook
(:func:`nodeguard.actions.registry.dispatch`): the same argument model and defaults (``evict``
frees 5 % of the node's memory capacity and stops at priority 999 unless told otherwise, as a
rule's ``evict`` does), the same implementation, the same audit (log line, Event). For
``evict`` it prints the ranked plan: each unit's place and why, and each excluded pod and why.
Working sets come from the node's agent (``--agent-url http://NODE:9847``, its ``/snapshot``);
without one, units rank by priority with usage unknown and are not evicted toward a target
(``--free 0`` evicts the first unit).

Exit status: 0 done or nothing to do; 1 failed (an API error, the API server unreachable);
2 bad flags; 3 refused or blocked (a budget, a limit, a PodDisruptionBudget said no);
4 the node or a named experiment does not exist.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import urllib.request
from typing import Any

from rich.console import Console
from rich.table import Table

from nodeguard.actions import registry
from nodeguard.actions.audit import ActionMetrics, Auditor
from nodeguard.actions.base import ActionResult
from nodeguard.actions.context import Call, Env
from nodeguard.actions.cordon import CordonConfig
from nodeguard.actions.evict import DEFAULT_MAX_PRIORITY, DEFAULT_NODE_FREE
from nodeguard.firing import Firing, Step
from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import KubeError, NotFound
from nodeguard.report import format_bytes

__all__ = ["ACTIONS", "EXIT_NOT_FOUND", "add_act_arguments", "run_act"]

#: The actions ``nodeguard act`` runs, as the command line spells them.
ACTIONS = ("cordon", "uncordon", "evict", "pause-katib", "resume-katib")
EXIT_FAILED, EXIT_REFUSED, EXIT_NOT_FOUND = 1, 3, 4


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"not KEY=VALUE: {text!r}")
    return key, value


def add_act_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``nodeguard act``."""
    parser.add_argument(
        "action",
        choices=ACTIONS,
        help="; ".join(f"{a}: {registry.get(a.replace('-', '_')).summary}" for a in ACTIONS),
    )
    parser.add_argument("--node", required=True, help="the node to act on")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="walk the whole path; the API server checks writes without persisting them "
        "(dryRun=All)",
    )
    parser.add_argument(
        "--kubeconfig", help="kubeconfig (default: in-cluster, $KUBECONFIG, ~/.kube/config)"
    )
    parser.add_argument(
        "--rule", default="manual", help="recorded as the rule that acted (default manual)"
    )
    parser.add_argument(
        "--reason", default="by hand (nodeguard act)", help="recorded as why (default: by hand)"
    )
    g = parser.add_argument_group("cordon")
    g.add_argument(
        "--cordon.mode",
        "--mode",
        dest="mode",
        choices=["unschedulable", "taint"],
        default="unschedulable",
        help="spec.unschedulable, or a NoSchedule taint (default unschedulable)",
    )
    g.add_argument(
        "--cordon.budget-nodes",
        "--budget-nodes",
        dest="budget_nodes",
        type=int,
        help="at most this many nodes cordoned by nodeguard at once (default: no budget)",
    )
    g.add_argument(
        "--cordon.budget-percent",
        "--budget-percent",
        dest="budget_percent",
        type=float,
        help="at most this percent of the nodes cordoned by nodeguard (default: no budget)",
    )
    g.add_argument(
        "--cordon.lease-namespace",
        "--lease-namespace",
        dest="lease_namespace",
        default="kube-system",
        help="namespace of the budget's Lease (default kube-system)",
    )
    e = parser.add_argument_group("evict")
    e.add_argument(
        "--free",
        "--target",
        dest="free",
        help=f"working set to free: a quantity (8Gi) or a percent of the node's memory "
        f"(default {DEFAULT_NODE_FREE}); 0: the first unit only",
    )
    e.add_argument(
        "--max-priority",
        type=int,
        default=DEFAULT_MAX_PRIORITY,
        help=f"evict only pods of at most this priority (default {DEFAULT_MAX_PRIORITY}, as "
        "the runbook)",
    )
    e.add_argument(
        "--priority-class",
        action="append",
        dest="priority_classes",
        help="evict only pods of this PriorityClass (repeat)",
    )
    e.add_argument(
        "--namespace",
        action="append",
        dest="namespaces",
        help="evict only pods of this namespace (repeat)",
    )
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
        default=[],
        help="NAMESPACE/NAME (repeat); default: pause the experiments with trial pods on the "
        "node; resume those paused from it",
    )


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


def _action_args(args: argparse.Namespace) -> dict[str, Any]:
    """The action's arguments, as a rule file would give them."""
    if args.action in ("cordon", "uncordon"):
        return {"mode": args.mode} if args.action == "cordon" else {}
    if args.action == "evict":
        out: dict[str, Any] = {"maxPriority": args.max_priority}
        if args.free is not None:
            out["free"] = args.free
        if args.priority_classes:
            out["priorityClasses"] = args.priority_classes
        if args.namespaces:
            out["namespaces"] = args.namespaces
        if args.selector:
            out["selector"] = dict(args.selector)
        return out
    return {"experiments": args.experiment} if args.experiment else {}


def render_plan(plan: dict[str, Any], *, console: Console) -> None:
    """The ranked victims and the exclusions, each with its reason."""
    ranked = plan.get("ranked", [])
    if ranked and all(u["usage_bytes"] is None for u in ranked):
        console.print(
            "No working sets known (pass --agent-url http://NODE:9847): ranked by priority "
            "alone; a --free target cannot be measured (--free 0 evicts the first unit)."
        )
    t = Table(title="Eviction plan (first row goes first)", title_justify="left")
    for col in ("#", "unit", "pods", "working set", "request", "priority", "why this place"):
        t.add_column(
            col, justify="right" if col in ("#", "working set", "request", "priority") else "left"
        )
    for i, u in enumerate(ranked, 1):
        t.add_row(
            str(i),
            f"{u['kind']} {u['namespace']}/{u['name']}",
            ", ".join(u["pods"]),
            format_bytes(u["usage_bytes"]) if u["usage_bytes"] is not None else "unknown",
            format_bytes(u["request_bytes"]),
            str(u["priority"]),
            u["why"],
        )
    console.print(t)
    if plan.get("excluded"):
        x = Table(title="Never evicted here", title_justify="left")
        x.add_column("pod")
        x.add_column("why")
        for ex in plan["excluded"]:
            x.add_row(ex["pod"], ex["why"])
        console.print(x)


def exit_status(results: list[ActionResult]) -> int:
    """4 when something named does not exist, 1 when anything failed, 3 when anything was
    refused or blocked, else 0."""
    if any(r.details.get("not_found") for r in results):
        return EXIT_NOT_FOUND
    if any(r.outcome == "failed" for r in results):
        return EXIT_FAILED
    return EXIT_REFUSED if any(r.outcome in ("refused", "blocked") for r in results) else 0


def _print_results(results: list[ActionResult], console: Console) -> int:
    for r in results:
        style = {
            "done": "green",
            "noop": "",
            "refused": "yellow",
            "blocked": "yellow",
            "failed": "red",
        }[r.outcome]
        prefix = "DRY RUN " if r.dry_run else ""
        head = f"{prefix}{r.action} {r.outcome}"
        # soft_wrap: one result, one line, whatever the width (grep-able, copy-able)
        text = f"[{style}]{head}[/{style}]: {r.message}" if style else f"{head}: {r.message}"
        console.print(text, soft_wrap=True)
    return exit_status(results)


async def _act(args: argparse.Namespace, console: Console, errors: Console) -> int:
    name = args.action.replace("-", "_")
    try:
        step = Step(action=name, args=registry.get(name).parse(_action_args(args)))
    except registry.ArgumentError as exc:
        errors.print(f"nodeguard act: error: {exc}", soft_wrap=True)
        return 2
    try:
        usage = _usage_from_agent(args.agent_url) if args.action == "evict" else {}
    except (OSError, ValueError) as exc:
        errors.print(f"nodeguard act: cannot read {args.agent_url}/snapshot: {exc}")
        return EXIT_FAILED
    kube = KubeClient.load(kubeconfig=args.kubeconfig)
    try:
        try:
            await kube.get_node(name=args.node)
        except NotFound:
            errors.print(f"nodeguard act: no node {args.node!r} in the cluster")
            return EXIT_NOT_FOUND
        env = Env(
            kube=kube,
            auditor=Auditor(kube=kube, node_name=args.node, metrics=ActionMetrics(registry=None)),
            node=args.node,
            cordon=CordonConfig(
                mode=args.mode,
                budget_nodes=args.budget_nodes,
                budget_percent=args.budget_percent,
                lease_namespace=args.lease_namespace,
            ),
            usage=usage,
        )
        firing = Firing(
            rule=args.rule,
            kind="firing",
            scope="node",
            target=args.node,
            node=args.node,
            time=time.time(),
            steps=(step,),
            dry_run=args.dry_run,
            source="act",
            summary=args.reason,
        )
        call = Call(env=env, firing=firing, dry_run=args.dry_run, note=args.reason)
        results = await registry.dispatch(call, step)
        plan = next((r.details["plan"] for r in results if "plan" in r.details), None)
        if plan is not None:
            render_plan(plan, console=console)
        return _print_results(results, console)
    finally:
        kube.close()


def run_act(args: argparse.Namespace) -> int:
    """Run ``nodeguard act``; the exit status (see the module docstring)."""
    errors = Console(stderr=True)
    try:
        return asyncio.run(_act(args, Console(), errors))
    except KubeError as exc:
        errors.print(f"nodeguard act: {type(exc).__name__}: {exc}", soft_wrap=True)
        return EXIT_FAILED
