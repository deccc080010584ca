"""One registration reaches every entry point (CONTRIBUTING.md's checklists): a toy collector,
a toy action and a toy signal, each one class or function and one registration made here (and
removed after), reach

- the flags of ``nodeguard run`` and ``nodeguard snapshot`` (``--collector.toy``) and the
  sampler they configure;
- ``nodeguard act toy``, its flags made from the toy's argument model (help from the field's
  description, the value validated by the field) and its settings' flags;
- ``nodeguard check``, which takes a rule using the toy signal and the toy action (and refuses
  it once they are gone);
- the README checks (tests/unit/test_docs_tables.py, tests/unit/test_registry.py), which see the toy
  and fail because the README does not document it: a contributor who forgets the README line
  is told.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import pytest
from pydantic import BaseModel, ConfigDict, Field

from nodeguard.actions.args import ActionArgs, Count, Flag
from nodeguard.actions.base import ActionResult
from nodeguard.actions.registry import ACTIONS, Action, CliFlag, Settings, register
from nodeguard.cli import build_parser, main
from nodeguard.cli.act import action_args
from nodeguard.cli.flags import sampler_config, settings_value
from nodeguard.collectors import base
from nodeguard.collectors.base import Collector, Parts
from nodeguard.collectors.families import Families, Family
from nodeguard.rules import signals
from nodeguard.rules.signals import SHARE, SIGNALS
from nodeguard.snapshot import NodeSnapshot
from tests.support.hosts import host_flags
from tests.unit import test_docs_tables, test_registry

if TYPE_CHECKING:
    from collections.abc import Iterator as Iter

    from nodeguard.actions.context import Call


class ToyCollector(Collector):
    """Reads one number; renders it as ``nodeguard_toy_value``."""

    name = "toy"

    def read(self, parts: Parts) -> None:
        parts.extra[self.name] = 0.25

    @staticmethod
    def render(snapshot: NodeSnapshot, out: Families) -> Iter[Family]:
        value = snapshot.extra.get("toy")
        if value is not None:
            family = out.gauge("toy_value", "the toy collector's number")
            family.add((), value)
            yield family


class ToyArgs(ActionArgs):
    """``times`` (default 1)."""

    times: Annotated[Count, Flag(metavar="COUNT")] = Field(
        default=1, description="how many times (default 1)"
    )


class ToySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    loudness: Annotated[Count, Flag(metavar="COUNT")] = Field(
        default=3, description="how loud, for every rule (default 3)"
    )


async def _run_toy(call: Call, args: ToyArgs) -> list[ActionResult]:
    return call.result(action="toy", outcome="done", message=f"toy x{args.times}")


TOY_ACTION = Action(
    name="toy",
    summary="a toy action",
    args=ToyArgs,
    run=_run_toy,
    needs_api=False,
    reasons=dict.fromkeys(("done", "noop", "refused", "blocked", "failed"), "NodeguardToyDone"),
    dry_reasons={"done": "NodeguardWouldToy"},
    settings=Settings(group="toy", title="toy", model=ToySettings, make=lambda s: s.loudness),
    cli_flags=(
        CliFlag(names=("--toy-url",), dest="toy_url", metavar="URL", help="(default: none)"),
    ),
)


@contextlib.contextmanager
def registered_toys() -> Iterator[None]:
    """The toy collector, action and signal registered, and removed after."""
    try:
        base.register(ToyCollector)
        register(TOY_ACTION)
        signals.register(
            "toy_ratio",
            scope="node",
            unit="ratio",
            valid=SHARE,
            help="the toy collector's number",
            fn=lambda snap, _h, _t: snap.extra.get("toy"),
        )
        yield
    finally:
        base.COLLECTORS.pop("toy", None)
        ACTIONS.pop("toy", None)
        SIGNALS.pop("toy_ratio", None)


@pytest.fixture
def toys() -> Iterator[None]:
    """The toys registered for one test."""
    with registered_toys():
        yield


@pytest.mark.usefixtures("toys")
def test_the_toy_collector_is_a_flag_of_run_and_snapshot_and_samples() -> None:
    parser = build_parser()
    for command in ("run", "snapshot"):
        assert parser.parse_args([command]).collector_toy is True
        args = parser.parse_args([command, "--no-collector.toy"])
        assert args.collector_toy is False
    args = parser.parse_args(["snapshot", *host_flags("v2-systemd-containerd")])
    config = sampler_config(args, state=None, interval=5.0)
    assert config.collectors is not None and "toy" in config.collectors
    args = parser.parse_args(["snapshot", "--no-collector.toy"])
    assert "toy" not in (sampler_config(args, state=None, interval=5.0).collectors or ())


@pytest.mark.usefixtures("toys")
def test_the_toy_action_is_a_subcommand_of_act_with_its_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = build_parser()
    args = parser.parse_args(["act", "toy", "--node=n", "--times=3", "--toy.loudness=7"])
    assert action_args(args) == {"times": 3}
    assert ACTIONS["toy"].parse(action_args(args)) == ToyArgs(times=3)
    assert settings_value(args, TOY_ACTION.settings) == 7  # type: ignore[arg-type]
    args = parser.parse_args(["act", "toy", "--node=n", "--loudness=2", "--toy-url=http://x"])
    assert (action_args(args), settings_value(args, TOY_ACTION.settings)) == ({}, 2)  # type: ignore[arg-type]
    assert args.toy_url == "http://x"
    # The help is the field's description; the value is validated by the field.
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    act = next(a for a in sub.choices["act"]._actions if isinstance(a, argparse._SubParsersAction))
    flags = {s: a for a in act.choices["toy"]._actions for s in a.option_strings}
    assert flags["--times"].help == "how many times (default 1)"
    assert flags["--times"].metavar == "COUNT"
    assert flags["--toy.loudness"].help == "how loud, for every rule (default 3)"
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["act", "toy", "--node=n", "--times=-1"])
    assert exc.value.code == 2
    assert "not a count (0 or more): '-1'" in capsys.readouterr().err


RULE = """\
apiVersion: nodeguard.io/v1alpha1
kind: RuleSet
metadata: {name: toy}
spec:
  rules:
    - name: toy-rule
      scope: node
      when:
        - {signal: toy_ratio, op: ">", value: 0.5}
      actions:
        - {action: toy, args: {times: 2}}
"""


def test_check_takes_a_rule_of_the_toy_signal_and_action(tmp_path: Path) -> None:
    path = tmp_path / "toy.yaml"
    path.write_text(RULE)
    with registered_toys():
        assert main(["check", str(path)]) == 0
    assert main(["check", str(path)]) == 1  # gone with their registration


@pytest.mark.usefixtures("toys")
def test_the_readme_checks_see_the_toys() -> None:
    for check in (
        test_docs_tables.test_the_signal_table_is_the_registry,
        test_docs_tables.test_every_action_is_named_in_the_readme,
        test_docs_tables.test_the_metric_table_names_every_family_of_a_snapshot,
        test_registry.test_every_event_reason_is_registered_and_in_the_readme,
    ):
        with pytest.raises(AssertionError, match=r"[Tt]oy"):
            check()
