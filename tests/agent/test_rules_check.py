"""Rule files: every shipped file passes ``nodeguard check``; broken files give exact errors
with file, line and field."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from nodeguard.cli.check import check_files
from nodeguard.rules.load import RuleError, load_rules
from tests.support.rule_texts import GOOD_RULE

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted([ROOT / "rules" / "default.yaml", *(ROOT / "rules" / "examples").glob("*.yaml")])


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_rule_files_pass_check(path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nodeguard", "check", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
    assert "warning" not in out.stdout  # the shipped files say what they mean


def test_shipped_rules_load_together() -> None:
    rules = load_rules([ROOT / "rules" / "default.yaml", ROOT / "rules" / "examples"]).rules
    assert {r.name for r in rules} >= {
        "container-near-limit",
        "node-memory-low",
        "slab-unreclaimable-high",
        "memory-pressure-high",
        "container-thrashing-at-limit",
    }


def _check(tmp_path: Path, text: str) -> tuple[int, str]:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    out = io.StringIO()
    return check_files([path], out=out), out.getvalue().replace(str(path), "F")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "apiVersion: nodeguard.io/v1alpha1\nkind: RuleSet\nspec:\n  rules: [\n",
            "F:5: (yaml): invalid YAML",
        ),
        (
            GOOD_RULE.replace("node_memory_available_ratio", "node_memory_free_ratio"),
            "F:8: spec.rules[0].when[0].signal: unknown signal 'node_memory_free_ratio'",
        ),
        (
            GOOD_RULE.replace("action: cordon", "action: reboot"),
            "F:10: spec.rules[0].actions[0]: unknown action 'reboot'",
        ),
        (
            GOOD_RULE.replace("value: 0.05", "value: five percent"),
            "F:8: spec.rules[0].when[0].value: Input should be a valid number",
        ),
        (
            GOOD_RULE.replace("      scope: node\n", "      scope: node\n      for: -1m\n"),
            "F:7: spec.rules[0].for: negative duration '-1m'",
        ),
        (
            GOOD_RULE + GOOD_RULE.split("  rules:\n")[1],
            "F:11: spec.rules[1].name: duplicate rule name 'low' (also at F:5)",
        ),
        (
            GOOD_RULE.replace("      scope: node\n", "      scope: node\n      severity: high\n"),
            "F:7: spec.rules[0].severity: unknown field 'severity'; allowed: name, description, "
            "scope, when, for, clear, cooldown, maxFirings, dryRun, actions, resolve",
        ),
        (
            GOOD_RULE.replace("      scope: node\n", "      scope: node\n      cooldwn: 5m\n"),
            "F:7: spec.rules[0].cooldwn: unknown field 'cooldwn' (did you mean 'cooldown'?); "
            "allowed: name, description, scope, when, for, clear, cooldown, maxFirings, dryRun",
        ),
        (
            GOOD_RULE.replace("{signal:", "{sigal:"),
            "F:8: spec.rules[0].when[0].sigal: unknown field 'sigal' (did you mean 'signal'?); "
            "allowed: signal, op, value",
        ),
        (
            GOOD_RULE.replace("- action: cordon", "- action: evict\n          args: {frees: 5%}"),
            "F:10: spec.rules[0].actions[0]: evict: args.frees: unknown field 'frees' (did you "
            "mean 'free'?); allowed: free, maxPriority, priorityClasses, namespaces, selector",
        ),
        (
            GOOD_RULE.replace("action: cordon", "action: cordn"),
            "F:10: spec.rules[0].actions[0]: unknown action 'cordn' (did you mean 'cordon'?)",
        ),
        (
            GOOD_RULE.replace("value: 0.05", "value: -0.05"),
            "F:8: spec.rules[0].when[0].value: node_memory_available_ratio is a ratio, 0 to 1: "
            "-0.05 is outside it, so the condition never holds",
        ),
        (
            GOOD_RULE.replace("value: 0.05", "value: 30"),
            "F:8: spec.rules[0].when[0].value: node_memory_available_ratio is a ratio, 0 to 1: "
            "30 is outside it, so the condition always holds (a ratio: 5 % is 0.05)",
        ),
        (
            GOOD_RULE.replace('op: "<", value: 0.05', 'op: "<", value: 0'),
            "F:8: spec.rules[0].when[0].value: node_memory_available_ratio is a ratio, 0 to 1: "
            "node_memory_available_ratio < 0 never holds",
        ),
        (
            GOOD_RULE.replace("node_memory_available_ratio", "node_memory_available_bytes").replace(
                "value: 0.05", "value: -1Gi"
            ),
            "F:8: spec.rules[0].when[0].value: node_memory_available_bytes is in bytes, 0 or "
            "more: -1073741824 is outside it, so the condition never holds",
        ),
        (
            GOOD_RULE.replace("node_memory_available_ratio", "node_memory_available_bytes").replace(
                "value: 0.05", "value: lots"
            ),
            "F:8: spec.rules[0].when[0].value: node_memory_available_bytes is in bytes: 'lots' "
            "is not a quantity (8Gi, 500M, or bytes)",
        ),
        (
            GOOD_RULE.replace("scope: node", "scope: container"),
            "F:5: spec.rules[0]: signal 'node_memory_available_ratio' is a node signal, but the "
            "rule's scope is container",
        ),
        (
            GOOD_RULE.replace("- action: cordon", "- action: evict\n          args: {free: lots}"),
            "F:10: spec.rules[0].actions[0]: evict: args.free: not a memory quantity or percent",
        ),
        (
            GOOD_RULE.replace("kind: RuleSet", "kind: PrometheusRule"),
            "F:2: kind: unknown kind 'PrometheusRule': a rule file is kind RuleSet",
        ),
        (
            GOOD_RULE.replace(
                "      scope: node\n", "      scope: node\n      for: 1m\n      for: 0s\n"
            ),
            "F:8: spec.rules[0].for: duplicate key 'for'",
        ),
    ],
    ids=[
        "yaml",
        "signal",
        "action",
        "type",
        "negative-duration",
        "duplicate",
        "unknown-key",
        "misspelt-key",
        "misspelt-condition-key",
        "misspelt-action-argument",
        "misspelt-action",
        "ratio-below-its-range",
        "ratio-as-a-percent",
        "ratio-below-zero-never",
        "bytes-below-zero",
        "bytes-not-a-quantity",
        "scope",
        "action-args",
        "kind",
        "duplicate-key",
    ],
)
def test_broken_files_give_exact_errors(tmp_path: Path, text: str, error: str) -> None:
    rc, out = _check(tmp_path, text)
    assert rc == 1
    assert "FAILED" in out
    assert error in out, out


def test_good_file(tmp_path: Path) -> None:
    rc, out = _check(tmp_path, GOOD_RULE)
    assert (rc, out) == (0, "Checking F\n  SUCCESS: 1 rules found\n")


def test_duplicate_names_across_files(tmp_path: Path) -> None:
    # One check for both: the agent's load and `nodeguard check` give the same line, at the
    # second file's name, pointing at the first.
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(GOOD_RULE)
    b.write_text("# the same rule again\n" + GOOD_RULE)
    message = f"{b}:6: spec.rules[0].name: duplicate rule name 'low' (also at {a}:5)"
    with pytest.raises(RuleError) as err:
        load_rules([tmp_path])
    assert err.value.messages == [message]
    out = io.StringIO()
    assert check_files([tmp_path], out=out) == 1
    assert out.getvalue() == (
        f"Checking {a}\n  SUCCESS: 1 rules found\nChecking {b}\n  FAILED: 1 error(s)\n{message}\n"
    )


def test_a_file_named_twice_is_read_once(tmp_path: Path) -> None:
    # Given twice, or as a directory and a file in it: not a duplicate of itself.
    a = tmp_path / "a.yaml"
    a.write_text(GOOD_RULE)
    for paths in ([a, a], [tmp_path, a], [a, tmp_path / "." / "a.yaml"]):
        assert [r.name for r in load_rules(paths).rules] == ["low"]


def test_thresholds_take_their_signals_unit(tmp_path: Path) -> None:
    """A bytes signal takes a quantity, a seconds signal a duration: both as the signal's
    unit, so `check` and the engine compare like with like."""
    text = (
        GOOD_RULE.replace("node_memory_available_ratio", "node_memory_available_bytes")
        .replace("value: 0.05", "value: 2Gi")
        .replace(
            "      actions:",
            "      clear:\n        - {signal: node_memory_available_bytes, op: '>', value: 4e9}\n"
            "      actions:",
        )
    )
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    rule = load_rules([path]).rules[0]
    assert rule.when[0].value == 2 << 30
    assert rule.clear is not None and rule.clear[0].value == 4e9
    eta = GOOD_RULE.replace("scope: node", "scope: container").replace(
        '{signal: node_memory_available_ratio, op: "<", value: 0.05}',
        '{signal: container_seconds_to_limit, op: "<", value: 1m30s}',
    )
    path.write_text(eta)
    assert load_rules([path]).rules[0].when[0].value == 90.0


def test_duplicate_names_on_one_line(tmp_path: Path) -> None:
    rule = "{name: low, scope: node, when: [{signal: node_memory_available_ratio, op: '<', value: 0.05}], actions: [{action: cordon}]}"  # noqa: E501
    text = f"apiVersion: nodeguard.io/v1alpha1\nkind: RuleSet\nspec: {{rules: [{rule}, {rule}]}}\n"
    rc, out = _check(tmp_path, text)
    assert rc == 1
    assert "F:3: spec.rules[1].name: duplicate rule name 'low' (also at F:3)" in out


def _check_cli(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nodeguard", "check", *map(str, paths)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_directory_without_rule_files_fails_check(tmp_path: Path) -> None:
    # The agent given this directory would run with no rule in force: `check` says so and
    # fails, instead of exiting 0 with nothing printed.
    (tmp_path / "rules.txt").write_text(GOOD_RULE)
    (tmp_path / ".hidden.yaml").write_text("not read: hidden, as ConfigMap's ..data links")
    done = _check_cli(tmp_path)
    assert done.returncode == 1
    assert done.stdout == (
        f"{tmp_path}: not read (not *.yaml or *.yml): rules.txt\n"
        f"{tmp_path}: FAILED: no rule file (*.yaml, *.yml) in this directory\n"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _check_cli(empty).returncode == 1


def test_a_directory_names_what_it_does_not_read(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(GOOD_RULE)
    (tmp_path / "b.yaml.bak").write_text(GOOD_RULE)
    done = _check_cli(tmp_path)
    assert done.returncode == 0, done.stdout
    assert done.stdout == (
        f"{tmp_path}: not read (not *.yaml or *.yml): b.yaml.bak\n"
        f"Checking {tmp_path / 'a.yaml'}\n  SUCCESS: 1 rules found\n"
    )


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (
            ("value: 0.05", 'value: "5%"'),
            "F:8: spec.rules[0].when[0].value: node_memory_available_ratio is a ratio, not a "
            "percent: write 0.05 for '5%'",
        ),
        (
            ('op: "<"', 'op: "=<"'),
            "F:8: spec.rules[0].when[0].op: '=<' is not a comparison: did you mean '<='?",
        ),
        (
            ('op: "<"', 'op: "=="'),
            "'==' is not a comparison: a sampled value is almost never exactly the threshold",
        ),
        (
            ("scope: node", "scope: nodes"),
            "F:6: spec.rules[0].scope: unknown scope 'nodes' (did you mean 'node'?) (one of: "
            "node, pod, container, gpu)",
        ),
        (
            ("nodeguard.io/v1alpha1", "nodeguard.io/v1"),
            "F:1: apiVersion: unknown apiVersion 'nodeguard.io/v1': this nodeguard reads "
            "nodeguard.io/v1alpha1",
        ),
    ],
    ids=["percent", "reversed-op", "equality", "scope", "api-version"],
)
def test_each_error_says_what_to_write(tmp_path: Path, change: tuple[str, str], error: str) -> None:
    """The mistakes people make in rule files, each answered with what to write instead."""
    rc, out = _check(tmp_path, GOOD_RULE.replace(*change))
    assert rc == 1 and error in out, out


def test_warnings_for_what_loads_but_is_likely_meant_otherwise(tmp_path: Path) -> None:
    """A duration without a unit is read as seconds and a byte amount under 1Mi is almost surely
    missing its unit: each a warning at its line, and the file still passes (exit 0)."""
    text = GOOD_RULE.replace(
        "      scope: node\n",
        "      scope: node\n      for: 30\n      cooldown: 5\n"
        "      maxFirings: {count: 2, window: 600}\n",
    ).replace(
        '        - {signal: node_memory_available_ratio, op: "<", value: 0.05}\n',
        '        - {signal: node_memory_available_ratio, op: "<", value: 0.05}\n'
        '        - {signal: node_memory_available_bytes, op: "<", value: 512}\n',
    )
    rc, out = _check(tmp_path, text)
    assert rc == 0, out
    assert out.splitlines() == [
        "Checking F",
        "  SUCCESS: 1 rules found, 4 warning(s)",
        "F:7: spec.rules[0].for: warning: 30 has no unit, so it is read as 30 seconds: write 30s "
        "(or 5m, 1h) to say so",
        "F:8: spec.rules[0].cooldown: warning: 5 has no unit, so it is read as 5 seconds: write "
        "5s (or 5m, 1h) to say so",
        "F:9: spec.rules[0].maxFirings.window: warning: 600 has no unit, so it is read as 600 "
        "seconds: write 600s (or 5m, 1h) to say so",
        "F:12: spec.rules[0].when[1].value: warning: node_memory_available_bytes is in bytes and "
        "512 bytes is less than 1Mi: if you meant 512Mi or 512Gi, write the unit",
    ]


def test_no_warning_for_what_says_what_it_means(tmp_path: Path) -> None:
    """The look-alikes: durations with units, a zero duration, a byte amount of 1Mi or more
    written as a number, ``> 0`` on bytes, a rate in bytes per second (small by nature), and a
    small amount written with its unit (``512Ki`` says what it means)."""
    text = GOOD_RULE.replace(
        "      scope: node\n",
        "      scope: node\n      for: 30s\n      cooldown: 0\n"
        "      maxFirings: {count: 2, window: 10m}\n",
    ).replace(
        '        - {signal: node_memory_available_ratio, op: "<", value: 0.05}\n',
        '        - {signal: node_memory_available_ratio, op: "<", value: 0.05}\n'
        '        - {signal: node_memory_available_bytes, op: "<", value: 1048576}\n'
        '        - {signal: node_memory_available_bytes, op: ">", value: 0}\n'
        '        - {signal: node_direct_reclaim_bytes_per_second, op: ">", value: 262144}\n'
        '        - {signal: node_memory_available_bytes, op: "<", value: 512Ki}\n',
    )
    rc, out = _check(tmp_path, text)
    assert (rc, out) == (0, "Checking F\n  SUCCESS: 1 rules found\n")


def test_the_agent_logs_the_warnings_when_it_loads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent loads the rules as ``check`` does, and logs each warning once per load."""
    path = tmp_path / "rules.yaml"
    path.write_text(GOOD_RULE.replace("      scope: node\n", "      scope: node\n      for: 30\n"))
    with caplog.at_level(logging.WARNING, logger="nodeguard.rules.load"):
        loaded = load_rules([path])
    assert loaded.rules[0].for_ == 30.0
    # The loader's lines only: the log filter may say here what it dropped in earlier tests.
    assert [r.getMessage() for r in caplog.records if r.name == "nodeguard.rules.load"] == [
        f"{path}:7: spec.rules[0].for: warning: 30 has no unit, so it is read as 30 seconds: "
        "write 30s (or 5m, 1h) to say so"
    ]
