"""The action registry: the one list of actions, read by rule files, the runbook and
``nodeguard act``; every Event reason an action can write is registered and documented."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from nodeguard.actions import registry
from nodeguard.actions.evict import EvictArgs
from nodeguard.actions.registry import dry_reason
from nodeguard.cli import build_parser
from nodeguard.cli.act import actions as act_actions
from nodeguard.rules.schema import ActionSpec

ROOT = Path(__file__).resolve().parents[2]


def shipped() -> dict[str, registry.Action]:
    """The registered actions but the tests' stand-ins (``test_*``), from the registry."""
    return {n: a for n, a in registry.ACTIONS.items() if not n.startswith("test_")}


def test_every_action_module_registers_and_act_offers_each() -> None:
    """Every module of ``nodeguard/actions/`` that defines an argument model registers an
    action; ``nodeguard act`` has a subcommand for every entry offered by hand, with a flag
    for every argument."""
    modules = {
        p.stem
        for p in (ROOT / "nodeguard/actions").glob("*.py")
        if re.search(r"^class \w+\((ActionArgs|_\w+)\):", p.read_text(), re.M) and p.stem != "args"
    }
    registering = {a.run.__module__.rsplit(".", 1)[1] for a in shipped().values()}
    assert modules == registering, modules ^ registering
    assert len(shipped()) >= 6
    # The stand-ins (tests/support/standin_actions.py, registered once a test module imports them)
    # are
    # subcommands too while the suite runs: only the shipped ones are compared.
    offered = {a for a in act_actions() if not a.startswith("test-")}
    assert offered == {n.replace("_", "-") for n, a in shipped().items() if a.by_hand}
    assert not shipped()["record"].by_hand  # the incident record is the agent's alone
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(registry.ACTIONS["record"])


def test_every_event_reason_is_registered_and_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    written = set(re.findall(r'"(Nodeguard[A-Za-z]+)"', _source())) - {"NodeguardDryRun"}
    registered = {r for a in shipped().values() for r in a.all_reasons()}
    # Reasons in the code are the registry's (or the dry-run table's forms of them).
    assert written - {dry_reason(r) for r in registered} <= registered, written - registered
    for reason in sorted(registered):
        assert f"`{reason}`" in readme, reason
        assert f"`{dry_reason(reason)}`" in readme, dry_reason(reason)


def test_the_dry_run_reasons_are_the_entries_and_a_clash_is_refused() -> None:
    """A dry run's Event reason comes from the entry of the action that writes it
    (``dry_reasons``), else the ``NodeguardDryRun`` form; two entries giving one reason two
    dry-run forms is a programming error at registration."""
    assert dry_reason("NodeguardCordoned") == "NodeguardWouldCordon"
    assert dry_reason("NodeguardEvictionBlocked") == "NodeguardWouldBeBlocked"
    assert dry_reason("NodeguardKatibResumed") == "NodeguardWouldResumeKatib"
    assert dry_reason("NodeguardCordonRefused") == "NodeguardDryRunCordonRefused"
    cordon = registry.ACTIONS["cordon"]
    clash = dataclasses.replace(cordon, name="test_clash", dry_reasons={"done": "NodeguardX"})
    with pytest.raises(ValueError, match="NodeguardWouldCordon"):
        registry.register(clash)
    assert "test_clash" not in registry.ACTIONS


def test_act_flags_are_the_argument_models_fields() -> None:
    """Each argument of each action offered by hand is a flag of its `nodeguard act`
    subcommand whose help is the field's description; a flag's value is validated by the
    field, so the command line refuses what a rule file refuses (exit status 2)."""
    parser = build_parser()
    for name, action in act_actions().items():
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        act = next(
            a for a in sub.choices["act"]._actions if isinstance(a, argparse._SubParsersAction)
        )
        helps = {a.help for a in act.choices[name]._actions}
        for field, info in action.args.model_fields.items():
            if field == "mode":  # cordon's: the --cordon.mode setting is that choice
                continue
            assert info.description is not None, (name, field)
            assert info.description.replace("%", "%%") in helps, (name, field)
    for argv in (
        ["act", "evict", "--node=n", "--free=lots"],
        ["act", "resume-katib", "--node=n", "--experiment=no-slash"],
        ["act", "pause-katib", "--node=n", "--enforce-wait-seconds=301"],
        ["act", "pause-katib", "--node=n", "--force"],  # resume-katib's alone
    ):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(argv)
        assert exc.value.code == 2, argv


def _source() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "nodeguard").rglob("*.py"))


def test_arguments_are_parsed_once_at_load_as_kubernetes_quantities() -> None:
    def free(text: str) -> object:
        args = ActionSpec(action="evict", args={"free": text}).step.args
        assert isinstance(args, EvictArgs) and args.free is not None
        return args.free.bytes if args.free.bytes is not None else args.free.fraction

    assert free("4Gi") == 4 << 30
    assert free("4k") == 4000  # decimal SI, as Kubernetes reads it
    assert free("1e9") == 10**9
    assert free("0") == 0
    assert free("5%") == pytest.approx(0.05)
    for bad in ("4 GiB", "1m", "-1Gi", "0%", "101%", "lots", "nan%"):
        with pytest.raises(ValueError, match="free"):
            ActionSpec(action="evict", args={"free": bad})
    # The same model and defaults serve the runbook and `nodeguard act`.
    assert ActionSpec(action="evict").step.args == registry.get("evict").parse({})
    assert registry.get("evict").parse({}).max_priority == 999  # type: ignore[attr-defined]


def test_unknown_actions_and_arguments_name_what_is_known() -> None:
    with pytest.raises(
        ValueError, match=r"unknown action 'evicts' \(did you mean 'evict'\?\) \(known: .*evict"
    ):
        ActionSpec(action="evicts")
    with pytest.raises(ValueError, match="floor: no longer taken"):
        ActionSpec(action="pause_katib", args={"floor": 1})
    with pytest.raises(ValueError, match="NAMESPACE/NAME"):
        ActionSpec(action="resume_katib", args={"experiments": ["no-slash"]})


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("local", "(the agent tries the step again for up to 10 minutes)"),
        ("act", "(not tried again: nodeguard act runs once)"),
    ],
)
async def test_a_transient_failure_says_whether_it_is_retried(source: str, said: str) -> None:
    """The remediator retries a step that failed transiently; `nodeguard act` does not: the
    result and its Events say which, and promise nothing more."""
    from tests.support.acting import env_for, run_action
    from tests.support.standin_actions import FLAKY

    FLAKY["left"] = 1
    (result,) = await run_action(
        env=env_for(None, "n"),
        node="n",
        action="test_flaky",
        source=source,  # type: ignore[arg-type]
    )
    assert result.outcome == "failed" and result.message == f"test_flaky stand-in: failed {said}"
