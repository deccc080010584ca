"""The action registry: one entry per action, the only list of what nodeguard can do.

An entry (:class:`Action`) holds the action's name, its argument model, its implementation, the
name of its undo, whether it needs the Kubernetes API, every Event reason it can emit and their
dry-run forms, the settings the agent gives it (:class:`Settings`) and the command-line flags
``nodeguard act`` needs beyond its arguments (:class:`CliFlag`). Each
action module registers its own entries with :func:`register` (``nodeguard/actions/cordon.py``
registers ``cordon`` and ``uncordon``); the package imports every module of itself, so adding an
action is one module and one registration. Rule files (``nodeguard check`` and the loader),
the runbook, ``nodeguard act`` (a subcommand per entry, its flags made from the argument
model) and ``nodeguard run`` (the settings' flags) all look actions up here, and
:func:`dispatch` is the one way to run one: it refuses what cannot run (no cluster), runs the
implementation, and has the auditor log, count and event every result once.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from nodeguard.actions.args import ActionArgs
from nodeguard.actions.base import OUTCOMES, ActionResult, Outcome
from nodeguard.fields import unknown_field
from nodeguard.firing import Step

if TYPE_CHECKING:
    from nodeguard.actions.context import Call

__all__ = [
    "ACTIONS",
    "Action",
    "ArgumentError",
    "CliFlag",
    "Settings",
    "dispatch",
    "dry_reason",
    "parse_step",
    "register",
]

log = logging.getLogger(__name__)

Impl = Callable[["Call", Any], Awaitable[list[ActionResult]]]


class ArgumentError(ValueError):
    """An action's arguments do not fit its model; ``str()`` lists each field's problem as
    ``args.FIELD: message``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """What the agent (and ``nodeguard act``) gives an action besides its arguments, the same
    for every rule: ``nodeguard run``'s and ``nodeguard act``'s ``--GROUP.FIELD`` flags, made
    from ``model``'s fields (:class:`~nodeguard.actions.args.Flag`, as for arguments).

    - ``group``: the flags' prefix and the :class:`~nodeguard.actions.context.Env` field that
      holds the value at run time (``cordon``: ``--cordon.mode``, ``env.cordon``).
    - ``model``: a pydantic model of the settings; ``make(model)`` -> the value ``Env`` holds.
    - ``title``: the flags' group in ``--help``.
    Entries that share settings (``cordon`` and ``uncordon``) name the same object.
    """

    group: str
    title: str
    model: type[BaseModel]
    make: Callable[[Any], Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class CliFlag:
    """A flag of ``nodeguard act NAME`` that is no argument of the action (``evict``'s
    ``--agent-url``, where working sets come from): ``names``, ``dest``, ``metavar`` and
    ``help`` as ``argparse`` takes them (the help gives the default; the value is text, or
    ``None`` when not given). ``nodeguard act`` says what it does with each."""

    names: tuple[str, ...]
    dest: str
    metavar: str
    help: str


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
      real-run forms. ``dry_reasons``: outcome -> the reason a dry run writes instead of
      ``reasons[outcome]`` where it differs from the default ``NodeguardDryRun...`` form
      (``done`` of ``cordon``: ``NodeguardWouldCordon``); :func:`dry_reason` reads them.
    - ``summary``: one line for ``--help`` and the README.
    - ``settings``: what the agent gives it besides the arguments (:class:`Settings`), if
      anything; ``cli_flags``: flags ``nodeguard act NAME`` adds (:class:`CliFlag`).
    - ``by_hand``: whether ``nodeguard act`` offers it (``record`` is not: its point is the
      incident record, which only the agent's runbook writes).
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
    dry_reasons: Mapping[Outcome, str] = field(default_factory=dict)
    settings: Settings | None = None
    cli_flags: tuple[CliFlag, ...] = ()
    by_hand: bool = True

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
    for outcome, would in action.dry_reasons.items():
        real = action.reasons[outcome]
        said = _dry_table().get(real)
        if said is not None and said != would:
            raise ValueError(
                f"action {action.name!r}: dry-run reason {would!r} for {real!r}, which another "
                f"action writes as {said!r}"
            )
    ACTIONS[action.name] = action
    return action


def _dry_table() -> dict[str, str]:
    return {a.reasons[o]: would for a in ACTIONS.values() for o, would in a.dry_reasons.items()}


def dry_reason(reason: str) -> str:
    """The dry-run form of an Event reason (real-run form): an entry's ``dry_reasons``
    (``NodeguardWould<Do>``, for what changes something), else ``NodeguardDryRun<...>``."""
    return _dry_table().get(reason) or reason.replace("Nodeguard", "NodeguardDryRun", 1)


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
