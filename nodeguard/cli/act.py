"""``nodeguard act ACTION --node NODE``: run one runbook action by hand.

Each registered action (:mod:`nodeguard.actions.registry`) is a subcommand, spelled with ``-``
for ``_`` (``pause-katib``), whose flags come from its entry: its arguments' flags from its
argument model (:mod:`nodeguard.cli.model_flags`: ``--max-priority`` is ``maxPriority``), its
settings' flags (``--cordon.mode``), and the flags it adds by hand (``evict``'s
``--agent-url``); an action added to the registry is a subcommand with nothing else to write.

Operators use it to ask "what would you evict right now?" (``--dry-run``) and to act during an
incident. It dispatches through the same action registry as the agent's runbook
(:func:`nodeguard.actions.registry.dispatch`): the same argument model and defaults (``evict``
frees 5 % of the node's memory capacity and stops at priority 999 unless told otherwise, as a
rule's ``evict`` does), the same implementation, the same audit (log line, Event). For
``evict`` it prints the ranked plan: each unit's place and why, and each excluded pod and why.
Usage comes from the node's agent (``--agent-url http://AGENT_POD_IP:9847``, its
``/snapshot``): each pod's unreclaimable memory, what its eviction frees, as the agent's own
``evict`` counts it (the working set where the agent has no unreclaimable figure); without one,
units rank by priority
with usage unknown and are not evicted toward a target (``--free 0`` evicts the first unit).

Output fits 80 columns: sizes in binary units (``--json``: the results with exact bytes), each
result starting its own line with the action and its outcome, wrapped with an indent, every pod
evicted, blocked or skipped named with its reason.

Exit status: 0 done or nothing to do; 1 failed (an API error, the API server unreachable);
2 bad flags; 3 refused or blocked (a budget, a limit, a PodDisruptionBudget said no);
4 the node or a named experiment does not exist.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from nodeguard.actions import registry
from nodeguard.actions.audit import ActionMetrics, Auditor
from nodeguard.actions.base import ActionResult
from nodeguard.actions.context import Call, Env
from nodeguard.actions.ranking import UNRECLAIMABLE, usage_measure
from nodeguard.cli.console import stdout_console
from nodeguard.cli.flags import add_json, add_log_level, add_settings, settings_value
from nodeguard.cli.model_flags import FieldFlag, add_model_flags, model_values
from nodeguard.firing import Firing, Step
from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import KubeError, NotFound
from nodeguard.units import format_bytes

__all__ = [
    "EXIT_NOT_FOUND",
    "action_args",
    "actions",
    "add_arguments",
    "exit_status",
    "render_plan",
    "run",
]

HELP = "run one runbook action by hand (--dry-run: what it would do)"
#: Shown under ``act --help`` and each ``act ACTION --help``.
EPILOG = (
    "exit status: 0 done or nothing to do; 1 failed (an API error, the API server "
    "unreachable); 2 bad flags; 3 refused or blocked (a budget, a limit, a "
    "PodDisruptionBudget said no); 4 the node or a named experiment does not exist"
)

EXIT_FAILED, EXIT_BAD_FLAGS, EXIT_REFUSED, EXIT_NOT_FOUND = 1, 2, 3, 4
_STYLES = {"done": "green", "noop": "", "refused": "yellow", "blocked": "yellow", "failed": "red"}


def actions() -> dict[str, registry.Action]:
    """The actions ``nodeguard act`` runs, as the command line spells them (``pause-katib``):
    every registered entry offered by hand, read when the parser is built."""
    return {a.name.replace("_", "-"): a for a in registry.ACTIONS.values() if a.by_hand}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The subcommands of ``nodeguard act``, one per action (:func:`actions`): the flags
    every action takes, its arguments' flags (from its argument model), its settings' flags
    and its own extra flags (from its registry entry)."""
    sub = parser.add_subparsers(
        prog=parser.prog,
        dest="action",
        required=True,
        metavar="ACTION",
        help="the action, each listed below with what it does (nodeguard act ACTION --help: "
        "its flags)",
    )
    for name, action in actions().items():
        p = sub.add_parser(name, help=action.summary, description=action.summary, epilog=EPILOG)
        _common(p)
        if action.settings is not None:
            add_settings(p, settings=[action.settings], aliases=True)
        arg_flags = add_model_flags(
            p.add_argument_group(f"{name} (as a rule's args)"), model=action.args
        )
        p.set_defaults(arg_flags=arg_flags)
        for flag in action.cli_flags:
            p.add_argument(*flag.names, dest=flag.dest, metavar=flag.metavar, help=flag.help)


def _common(parser: argparse.ArgumentParser) -> None:
    """The flags of every ``nodeguard act ACTION``."""
    parser.add_argument(
        "--node", required=True, metavar="NODE", help="the node to act on (required: no default)"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="walk the whole path; the API server checks writes without persisting them "
        "(dryRun=All; default off: act)",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        help="kubeconfig (default: $KUBECONFIG, else the in-cluster config in a pod, else "
        "~/.kube/config)",
    )
    parser.add_argument(
        "--rule",
        default="manual",
        metavar="NAME",
        help="recorded as the rule that acted (default manual)",
    )
    parser.add_argument(
        "--reason",
        default="by hand (nodeguard act)",
        metavar="TEXT",
        help="recorded as why, in Events and annotations (default 'by hand (nodeguard act)')",
    )
    add_json(parser, what="the results (and the eviction plan)")
    add_log_level(parser, default="warning")


def _usage_from_agent(url: str | None) -> tuple[dict[str, int], str]:
    """Pod UID -> bytes its eviction frees, from the agent's ``/snapshot``: its unreclaimable
    memory, the working set where that is unknown (as the agent's ``evict`` counts); and the
    words for what that counts (:func:`~nodeguard.actions.ranking.usage_measure`)."""
    if not url:
        return {}, UNRECLAIMABLE
    with urllib.request.urlopen(url.rstrip("/") + "/snapshot", timeout=10) as resp:
        snap: dict[str, Any] = json.load(resp)
    usage: dict[str, int] = {}
    exact = 0
    for p in snap.get("pods", []):
        m = p["memory"]
        if m.get("unreclaimable_bytes") is not None:
            usage[p["uid"]], exact = m["unreclaimable_bytes"], exact + 1
        elif m.get("working_set_bytes") is not None:
            usage[p["uid"]] = m["working_set_bytes"]
    return usage, usage_measure(unreclaimable=exact, working_set=len(usage) - exact)


def action_args(args: argparse.Namespace) -> dict[str, Any]:
    """The action's arguments, as a rule file would give them (those whose flag was given)."""
    flags: list[FieldFlag] = args.arg_flags
    return model_values(args, flags)


def render_plan(plan: dict[str, Any], *, console: Console) -> None:
    """The ranked units and the exclusions, each with its reason: a numbered column and a
    column of text that wraps within itself, so 80 columns hold every line."""
    ranked = plan.get("ranked", [])
    measure = plan.get("measure", UNRECLAIMABLE)
    if ranked and all(u["usage_bytes"] is None for u in ranked):
        console.print(
            f"No {measure} known (pass --agent-url http://AGENT_POD_IP:9847): ranked by priority "
            "alone; a --free target cannot be measured (--free 0 evicts the first unit)."
        )
    console.print(f"[bold]Eviction plan[/bold] ({len(ranked)} unit(s), first goes first):")
    units = Table.grid(padding=(0, 1))
    units.add_column(justify="right", min_width=4)
    units.add_column(overflow="fold")
    for i, u in enumerate(ranked, 1):
        usage = "unknown" if u["usage_bytes"] is None else format_bytes(u["usage_bytes"])
        lines = [
            f"{u['kind']} {u['namespace']}/{u['name']}: request "
            f"{format_bytes(u['request_bytes'])}, priority {u['priority']}",
            f"{measure}: {usage}",
        ]
        if u["kind"] != "pod":
            lines.append(f"pods: {', '.join(u['pods'])}")
        lines.append(f"why here: {u['why']}")
        units.add_row(f"{i}.", Text("\n".join(lines)))
    console.print(units)
    excluded = plan.get("excluded", [])
    if excluded:
        console.print(f"[bold]Never evicted here[/bold] ({len(excluded)} pod(s)):")
        pods = Table.grid(padding=(0, 1))
        pods.add_column(min_width=4)
        pods.add_column(overflow="fold")
        for ex in excluded:
            pods.add_row("", Text(f"{ex['pod']}: {ex['why']}"))
        console.print(pods)


def exit_status(results: list[ActionResult]) -> int:
    """4 when something named does not exist, 1 when anything failed, 3 when anything was
    refused or blocked, else 0."""
    if any(r.details.get("not_found") for r in results):
        return EXIT_NOT_FOUND
    if any(r.outcome == "failed" for r in results):
        return EXIT_FAILED
    return EXIT_REFUSED if any(r.outcome in ("refused", "blocked") for r in results) else 0


def _print_results(results: list[ActionResult], console: Console) -> None:
    for r in results:
        style = _STYLES[r.outcome]
        head = f"{'DRY RUN ' if r.dry_run else ''}{r.action} {r.outcome}"
        # Wrapped within the width as the plans are, the continuation indented, so each result
        # still starts its own line with the action and outcome (grep finds it; --json has the
        # message whole).
        lines = textwrap.wrap(
            f"{head}: {r.message}",
            width=max(console.width, 40),
            subsequent_indent="    ",
            break_on_hyphens=False,
        )
        first = escape(lines[0][len(head) :])
        console.print(f"[{style}]{head}[/{style}]{first}" if style else f"{head}{first}")
        for line in lines[1:]:
            console.print(escape(line), soft_wrap=True)


def _print_json(results: list[ActionResult]) -> None:
    records = []
    for r in results:
        record = r.to_record()
        record["exit_status"] = exit_status([r])
        records.append(record)
    json.dump(records, sys.stdout, indent=1, default=str)
    sys.stdout.write("\n")


async def _act(args: argparse.Namespace, console: Console, errors: Console) -> int:
    name = args.action.replace("-", "_")
    try:
        step = Step(action=name, args=registry.get(name).parse(action_args(args)))
    except registry.ArgumentError as exc:
        errors.print(f"nodeguard act: error: {escape(str(exc))}", soft_wrap=True)
        return EXIT_BAD_FLAGS
    try:
        # Where the action's entry offers --agent-url (evict): usage from that agent.
        usage, measure = _usage_from_agent(getattr(args, "agent_url", None))
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
        # The action's settings (cordon's mode and budget), in the Env field of their group.
        settings = registry.get(name).settings
        env = Env(
            kube=kube,
            auditor=Auditor(kube=kube, node_name=args.node, metrics=ActionMetrics(registry=None)),
            node=args.node,
            usage=usage,
            usage_measure=measure,
            **({settings.group: settings_value(args, settings)} if settings else {}),
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
        if args.json:
            _print_json(results)
        else:
            plan = next((r.details["plan"] for r in results if "plan" in r.details), None)
            if plan is not None:
                render_plan(plan, console=console)
            _print_results(results, console)
        return exit_status(results)
    finally:
        kube.close()


def run(args: argparse.Namespace) -> int:
    """Run ``nodeguard act``; the exit status (see the module docstring)."""
    errors = Console(stderr=True)
    try:
        return asyncio.run(_act(args, stdout_console(), errors))
    except KubeError as exc:
        # The API's own words (or where no config was found), not the class that carried them.
        status = f" (HTTP {exc.status})" if exc.status else ""
        errors.print(f"nodeguard act: {escape(str(exc))}{status}", soft_wrap=True)
        return EXIT_FAILED
