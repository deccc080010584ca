"""The action registry: the one list of actions, read by rule files, the runbook and
``nodeguard act``; every Event reason an action can write is registered and documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nodeguard.actions import registry
from nodeguard.actions.audit import dry_reason
from nodeguard.actions.evict import EvictArgs
from nodeguard.cli.act import ACTIONS as ACT_ACTIONS
from nodeguard.rules.schema import ActionSpec

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("cordon", "uncordon", "evict", "pause_katib", "resume_katib", "record")


def test_the_shipped_actions_are_registered_once_each() -> None:
    assert set(SHIPPED) <= set(registry.ACTIONS)
    assert {a.replace("-", "_") for a in ACT_ACTIONS} <= set(SHIPPED)
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(registry.ACTIONS["record"])


def test_every_event_reason_is_registered_and_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    written = set(re.findall(r'"(Nodeguard[A-Za-z]+)"', _source())) - {"NodeguardDryRun"}
    registered = {r for name in SHIPPED for r in registry.ACTIONS[name].all_reasons()}
    # Reasons in the code are the registry's (or the dry-run table's forms of them).
    assert written - {dry_reason(r) for r in registered} <= registered, written - registered
    for reason in sorted(registered):
        assert f"`{reason}`" in readme, reason
        assert f"`{dry_reason(reason)}`" in readme, dry_reason(reason)


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
    from tests.acting import env_for, run_action
    from tests.standin_actions import FLAKY

    FLAKY["left"] = 1
    (result,) = await run_action(
        env=env_for(None, "n"),
        node="n",
        action="test_flaky",
        source=source,  # type: ignore[arg-type]
    )
    assert result.outcome == "failed" and result.message == f"test_flaky stand-in: failed {said}"
