"""The action registry: one entry per action, the only list of what nodeguard can do.

An entry (:class:`Action`) holds the action's name, its argument model, its implementation, the
name of its undo, whether it needs the Kubernetes API, and every Event reason it can emit. Each
action module registers its own entries with :func:`register` (``nodeguard/actions/cordon.py``
registers ``cordon`` and ``uncordon``); the package imports every module of itself, so adding an
action is one module and one registration. Rule files (``nodeguard check`` and the loader),
the runbook and ``nodeguard act`` all look actions up here, and :func:`dispatch` is the one way
to run one: it refuses what cannot run (no cluster), runs the implementation, and has the
auditor log, count and event every result once.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from nodeguard.actions.args import ActionArgs
from nodeguard.actions.base import OUTCOMES, ActionResult, Outcome
from nodeguard.fields import unknown_field
from nodeguard.firing import Step

if TYPE_CHECKING:
    from nodeguard.actions.context import Call

__all__ = ["ACTIONS", "Action", "ArgumentError", "dispatch", "parse_step", "register"]

log = logging.getLogger(__name__)

Impl = Callable[["Call", Any], Awaitable[list[ActionResult]]]


class ArgumentError(ValueError):
    """An action's arguments do not fit its model; ``str()`` lists each field's problem as
    ``args.FIELD: message``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """One action.

    - ``name``: as rule files and ``nodeguard act`` spell it (``pause_katib``; the command line
      writes ``pause-katib``).
    - ``args``: the argument model (:class:`~nodeguard.actions.args.ActionArgs`).
    - ``run``: ``await run(call, args)`` -> results; never raises for an API failure (that is a
      ``failed`` result, ``retry=True`` when it is worth retrying); a programming error raises.
    - ``undo``: the action that reverses it (``cordon`` -> ``uncordon``), if any.
    - ``needs_api``: refused without a Kubernetes API.
    - ``needs_pods``: its plan reads this node's pods joined to their cgroups (names,
      priorities, working sets: the snapshot's ``pod_meta``). The agent's runbook waits before
      such a step until its pod list has been listed and a snapshot has named the cgroups from
      it, or abandons the firing with why, rather than plan on no pods
      (:mod:`nodeguard.remediation.worker`).
    - ``reasons``: outcome -> the Event reason written when a result carries no Events of its
      own (on the node); ``extra_reasons``: the other reasons its results' Events use. Both are
      real-run forms; :func:`nodeguard.actions.audit.dry_reason` gives the dry-run form.
    - ``summary``: one line for ``--help`` and the README.
    """

    name: str
    summary: str
    args: type[ActionArgs]
    run: Impl
    reasons: Mapping[Outcome, str]
    undo: str | None = None
    needs_api: bool = True
    needs_pods: bool = False
    extra_reasons: frozenset[str] = field(default_factory=frozenset)

    def all_reasons(self) -> frozenset[str]:
        """Every Event reason this action can emit (real-run forms)."""
        return frozenset(self.reasons.values()) | self.extra_reasons

    def parse(self, args: Mapping[str, Any] | None) -> ActionArgs:
        """The arguments as this action's model. Raises :class:`ArgumentError`."""
        try:
            return self.args.model_validate(dict(args or {}))
        except ValidationError as exc:
            problems = "; ".join(
                ".".join(["args", *(str(p) for p in e["loc"])])
                + ": "
                + (
                    unknown_field(self.args, str(e["loc"][-1]))
                    if e["type"] == "extra_forbidden"
                    else e["msg"].removeprefix("Value error, ")
                )
                for e in exc.errors()
            )
            raise ArgumentError(f"{self.name}: {problems}") from None


#: Action name -> entry, filled by :func:`register` as the action modules are imported.
ACTIONS: dict[str, Action] = {}


def register(action: Action) -> Action:
    """Add an entry; a second entry under one name is a programming error (``ValueError``)."""
    if action.name in ACTIONS:
        raise ValueError(f"action {action.name!r} registered twice")
    missing = [o for o in OUTCOMES if o not in action.reasons]
    if missing:
        raise ValueError(f"action {action.name!r} has no Event reason for {missing}")
    ACTIONS[action.name] = action
    return action


def get(name: str) -> Action:
    """The entry for ``name``. Raises ``KeyError`` naming the known actions."""
    try:
        return ACTIONS[name]
    except KeyError:
        raise KeyError(f"unknown action {name!r} (known: {', '.join(sorted(ACTIONS))})") from None


def parse_step(record: Mapping[str, Any]) -> Step:
    """A :class:`~nodeguard.firing.Step` from ``{"action": NAME, "args": {...}}``. Raises
    ``KeyError`` (unknown action) or :class:`ArgumentError`."""
    action = get(str(record["action"]))
    return Step(action=action.name, args=action.parse(record.get("args")))


async def dispatch(call: Call, step: Step) -> list[ActionResult]:
    """Run one step of ``call.firing`` and audit every result once (log line,
    ``nodeguard_actions_total``, Events). An action that needs the API is ``refused`` without
    one, and says so. Programming errors raise."""
    action = get(step.action)
    if action.needs_api and call.kube is None:
        results = call.result(
            action=action.name,
            outcome="refused",
            message=f"{'would ' if call.dry_run else ''}{action.name}: not possible, no "
            "Kubernetes API configured (--kubeconfig)",
        )
    else:
        results = [_promise(r, one_shot=call.one_shot) for r in await action.run(call, step.args)]
    for result in results:
        await call.env.auditor.record(result=result, default_reason=action.reasons[result.outcome])
    return results


def _promise(result: ActionResult, *, one_shot: bool) -> ActionResult:
    """A result worth retrying says whether it will be: the remediator tries the step again,
    ``nodeguard act`` runs once. The message and its Events say so, and promise nothing more."""
    if not result.retry:
        return result
    said = (
        " (not tried again: nodeguard act runs once)"
        if one_shot
        else " (the agent tries the step again for up to 10 minutes)"
    )
    return dataclasses.replace(
        result,
        message=result.message + said,
        events=tuple(dataclasses.replace(e, message=e.message + said) for e in result.events),
    )
