"""The ``nodeguard`` command: flags, the snapshot report, JSON output."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from nodeguard.cli import SUBCOMMANDS, build_parser
from nodeguard.cli.console import stdout_console
from nodeguard.cli.flags import cordon_config
from nodeguard.cli.flags import duration as parse_duration
from nodeguard.cli.run import focus_interval, notify_config
from nodeguard.units import format_bytes
from tests.fixtures.make_hosts import CID, UID_B
from tests.support.hosts import fixture_snapshot, host_flags


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5s", 5.0), ("500ms", 0.5), ("1m", 60.0), ("2", 2.0), ("1.5s", 1.5), ("1h", 3600.0)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "-1s", "0s", "s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


def test_run_defaults_follow_node_exporter() -> None:
    args = build_parser().parse_args(["run"])
    assert args.dry_run is True
    assert args.interval == 5.0
    assert args.listen_address == (None, 9847)  # every address, IPv4 and IPv6
    assert str(args.procfs) == "/proc" and str(args.sysfs) == "/sys"
    args = build_parser().parse_args(
        ["run", "--no-dry-run", "--no-collector.kmsg", "--listen-address=127.0.0.1:1234"]
    )
    assert args.dry_run is False
    assert args.collector_kmsg is False
    assert args.listen_address == ("127.0.0.1", 1234)


@pytest.mark.parametrize(
    "argv",
    [
        ["--interval=0.0001ms"],
        ["--interval=10ms"],
        ["--listen-address=:99999"],
        ["--listen-address=nonsense"],
        ["--top-processes=-5"],
        ["--webhook.max-body=0"],  # aiohttp's 0 is no bound at all
        ["--webhook.max-body=1023"],
    ],
)
def test_run_rejects_bad_flags(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["run", *argv])
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "nodeguard",
                "run",
                f"--listen-address=127.0.0.1:{port}",
                *host_flags("v2-systemd-containerd"),
                f"--path.state={tmp_path}",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert out.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr


def test_format_bytes() -> None:
    assert format_bytes(None) == "-"
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536 * 1024 * 1024) == "1.5 GiB"


def _snapshot(*extra: str) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "nodeguard",
            "snapshot",
            *host_flags("v2-systemd-containerd"),
            *extra,
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "160", "PATH": ""},
    )
    return out.stdout


def test_snapshot_json_in_bytes() -> None:
    data = json.loads(_snapshot("--json"))
    assert data["meminfo"]["available_bytes"] == 6 << 30
    assert data["meminfo"]["slab_unreclaimable_bytes"] == 10 << 30
    assert data["cgroup_version"] == 2
    pod = next(p for p in data["pods"] if p["uid"] == UID_B)
    c = next(c for c in pod["containers"] if c["container_id"] == CID[3])
    assert c["memory"]["working_set_bytes"] == 10 * (1 << 30) - 256 * (1 << 20)
    assert data["oom"]["total"] == 2


def test_snapshot_with_a_failing_collector_says_so_in_one_line_and_exits_1(
    tmp_path: Path,
) -> None:
    """A typo in --path.procfs: meminfo and processes fail, one line each on stderr and no
    traceback, the rest is printed, and the exit status is 1. The look-alike is not a failure:
    a host without PSI (the pressure collector's "no data") exits 0."""
    argv = [sys.executable, "-m", "nodeguard", "snapshot", *host_flags("v2-systemd-containerd")]
    typo = [
        a if not a.startswith("--path.procfs=") else f"--path.procfs={tmp_path}/proc" for a in argv
    ]
    assert typo != argv
    # At --log.level=error: with the procfs gone the kernel log's kills are dated from this
    # machine's boot (there is no btime to read), so on a machine up for less than the
    # fixture's timestamps they read as recent and are logged as warnings, which are not the
    # subject here.
    typo.append("--log.level=error")
    env = {"COLUMNS": "160", "PATH": ""}
    out = subprocess.run(typo, check=False, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 1
    errors = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert [ln.split("collector ")[1].split()[0] for ln in errors] == ["meminfo", "processes"]
    assert all("No such file or directory" in ln for ln in errors), errors
    assert "Top containers against their limits" in out.stdout  # the cgroups were still read
    quiet = subprocess.run(
        [sys.executable, "-m", "nodeguard", "snapshot", *host_flags("v1-rhel7-3.10")],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert quiet.returncode == 0, quiet.stderr
    assert "ERROR" not in quiet.stderr


def test_piped_output_has_no_trailing_padding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Piped, rich pads a table's title and a wrapped line to its width; every command's
    console (snapshot, incidents, act) cuts that padding and keeps the rest, character for
    character."""
    text = _snapshot()
    assert "Node memory" in text
    assert not [ln for ln in text.splitlines() if ln.endswith(" ")]
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    console = stdout_console()
    table = Table(title="a title narrower than its table")
    table.add_column("a column wider than the title above it, padded")
    table.add_row("x")
    console.print(table)
    console.print("no newline", end="")
    console.file.flush()
    padded = io.StringIO()
    Console(file=padded, width=console.width).print(table)
    assert padded.getvalue().splitlines()[0].endswith(" ")  # the look-alike: rich pads it
    written = out.getvalue()
    assert written == "".join(ln.rstrip(" ") + "\n" for ln in padded.getvalue().splitlines()) + (
        "no newline"
    )


def test_snapshot_report_reads_at_a_glance() -> None:
    text = _snapshot()
    assert "Node memory" in text
    assert "slab unreclaimable" in text and "10.0 GiB" in text and "31.2%" in text
    assert "available" in text and "6.0 GiB" in text
    assert "Memory pressure" in text and "12.5%" in text
    assert "Top containers against their limits (of 6)" in text
    # The nearest to an OOM kill comes first: the guaranteed container, working set 3.4 GiB
    # (memory.current 3.5 GiB - inactive_file 100 MiB), unreclaimable 3.0 GiB (anon 3 GiB +
    # kernel 1 MiB, no reclaimable slab): 75.0 % of its 4 GiB limit.
    rows = [ln for ln in text.splitlines() if "GiB" in ln and "guaranteed" in ln]
    assert rows and re.search(r"3\.4 GiB +4\.0 GiB +3\.0 GiB +75\.0%", rows[0]), rows
    assert "OOM kills this boot (kernel log): 2" in text
    assert "python3" in text and "9.0 GiB" in text


def test_snapshot_report_ranks_page_cache_below_anon() -> None:
    # The look-alike: a loader whose working set is 99 % of its 4 GiB limit, all of it page
    # cache but 256 MiB (which the kernel reclaims at the limit, never killing for it), beside
    # the fixture's guaranteed container, 3.0 GiB of it anon (75 %). Nearest to an OOM kill
    # first: the anon one; the loader shows both figures.
    from rich.console import Console

    from nodeguard.report import render_report

    snap = fixture_snapshot("v2-systemd-containerd")
    gib = 1 << 30
    pods = []
    for pod in snap.pods:
        containers = []
        for c in pod.containers:
            if c.container_id == CID[3]:
                mem = dataclasses.replace(
                    c.memory,
                    working_set_bytes=int(0.99 * 4 * gib),
                    unreclaimable_bytes=256 << 20,
                    effective_limit_bytes=4 * gib,
                    oom_kills=0,
                )
                containers.append(dataclasses.replace(c, memory=mem))
            else:
                containers.append(c)
        pods.append(dataclasses.replace(pod, containers=tuple(containers)))
    out = io.StringIO()
    render_report(dataclasses.replace(snap, pods=tuple(pods)), console=Console(file=out, width=200))
    rows = [ln for ln in out.getvalue().splitlines() if re.search(r"GiB +\d", ln)]
    assert re.search(r"3\.4 GiB +4\.0 GiB +3\.0 GiB +75\.0%", rows[0]), rows
    (loader,) = [r for r in rows if f"/{CID[3][:12]}" in r]
    assert re.search(r"4\.0 GiB +4\.0 GiB +256\.0 MiB +6\.2%", loader), loader
    assert rows.index(loader) > 0


# -- every flag of every subcommand: help with its default, values with their unit -------------
#: What a flag's value is, as its usage line names it; the units (DURATION, BYTES, COUNT,
#: PERCENT, AMOUNT) each have one grammar, which the help text gives.
METAVARS = {
    "DURATION": "500ms, 30s, 5m, 1h30m",
    "BYTES": "1Mi",
    "AMOUNT": "8Gi",
    "PERCENT": "",
    "COUNT": "",
    "PRIORITY": "",
    "SECONDS": "",
    "DIR": "",
    "FILE": "",
    "PATH": "",
    "URL": "",
    "NAME": "",
    "NODE": "",
    "NAMESPACE": "",
    "NAMESPACE/NAME": "",
    "LABEL": "",
    "KEY=VALUE": "",
    "REGEX,...": "regular expressions",
    "TEXT": "",
    "HOST:PORT": "",
}


def _flags(
    parser: argparse.ArgumentParser | None = None, prefix: str = ""
) -> list[tuple[str, argparse.Action]]:
    """Every flag of every subcommand, ``nodeguard act``'s subcommands too ("act evict")."""
    parser = parser or build_parser()
    out: list[tuple[str, argparse.Action]] = []
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        command = f"{prefix}{name}"
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                out.append((command, action))
                out.extend(_flags(p, f"{command} "))
            elif not isinstance(action, argparse._HelpAction):
                out.append((command, action))
    return out


def test_every_subcommand_is_a_module_of_the_cli_package() -> None:

    assert list(SUBCOMMANDS) == [
        "run",
        "snapshot",
        "check",
        "incidents",
        "act",
        "doctor",
        "trials",
    ]
    assert {m.__name__ for m in SUBCOMMANDS.values()} == {f"nodeguard.cli.{n}" for n in SUBCOMMANDS}
    assert {c.split()[0] for c, _ in _flags()} == set(SUBCOMMANDS)


def test_every_flag_says_its_default_and_unit() -> None:
    seen = 0
    for command, action in _flags():
        name = f"nodeguard {command} {'/'.join(action.option_strings) or action.dest}"
        assert action.help, f"{name}: no help"
        if not action.option_strings:
            continue  # a positional: said in the usage line
        seen += 1
        assert "default" in action.help, f"{name}: the help does not give the default"
        assert not action.required or "required" in action.help, name
        if action.nargs == 0 or action.choices is not None:
            continue  # a switch (on/off), or one of the values listed in the usage line
        assert action.metavar in METAVARS, f"{name}: value {action.metavar!r} names no unit"
        example = METAVARS[str(action.metavar)]
        assert example in action.help, f"{name}: the help does not show the grammar ({example})"
    assert seen > 60


def test_one_log_level_flag_everywhere() -> None:
    levels = {
        (command, tuple(a.choices or ()))
        for command, a in _flags()
        if "--log.level" in a.option_strings
    }
    assert {c.split()[0] for c, _ in levels} == set(SUBCOMMANDS)
    assert {choices for _, choices in levels} == {("debug", "info", "warning", "error")}
    assert build_parser().parse_args(["run"]).log_level == "info"
    assert build_parser().parse_args(["check", "f"]).log_level == "warning"


def test_one_duration_grammar_for_flags_and_rule_files() -> None:
    from nodeguard.rules.schema import Rule

    args = build_parser().parse_args(["run", "--evict.window=1h30m", "--interval=1m30s"])
    assert (args.evict_window, args.interval) == (5400.0, 90.0)
    assert build_parser().parse_args(["run"]).evict_window == 600.0  # the default, "10m"
    rule = Rule.model_validate(
        {
            "name": "r",
            "scope": "node",
            "for": "1h30m",
            "when": [{"signal": "node_memory_available_ratio", "op": "<", "value": 0.05}],
            "actions": [{"action": "record"}],
        }
    )
    assert rule.for_ == parse_duration("1h30m") == 5400.0


def test_act_spells_the_cordon_flags_as_run_does() -> None:
    run = build_parser().parse_args(["run", "--cordon.mode=taint", "--cordon.budget-percent=10"])
    act = build_parser().parse_args(
        ["act", "cordon", "--node=n", "--cordon.mode=taint", "--cordon.budget-percent=10"]
    )
    old = build_parser().parse_args(
        ["act", "cordon", "--node=n", "--mode=taint", "--budget-percent=10"]
    )
    for args in (run, act, old):
        config = cordon_config(args)
        assert (config.mode, config.budget_percent) == ("taint", 10.0)


def test_sizes_flags_take_quantities() -> None:
    assert build_parser().parse_args(["run"]).webhook_max_body == 1 << 20
    args = build_parser().parse_args(["run", "--webhook.max-body=512k"])
    assert args.webhook_max_body == 512_000


@pytest.mark.parametrize(
    ("argv", "focus"),
    [
        ([], 0.25),
        (["--interval=250ms"], 0.0),  # the default: off where a full sample is as frequent
        (["--interval=100ms", "--focus.interval=0"], 0.0),
        (["--interval=1s", "--focus.interval=500ms"], 0.5),
    ],
)
def test_the_focus_interval_is_shorter_than_the_interval(argv: list[str], focus: float) -> None:
    assert focus_interval(build_parser().parse_args(["run", *argv])) == focus


def test_the_psi_stall_is_not_checked_without_psi_triggers() -> None:
    argv = ["run", "--no-notify.psi", "--notify.psi-stall=3s", "--notify.psi-window=2s"]
    assert notify_config(build_parser().parse_args(argv)).psi_stall == 3.0


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--focus.interval=10s"], "--focus.interval (10s) is not shorter than --interval (5s)"),
        (["--interval=1s", "--focus.interval=1s"], "not shorter than --interval (1s)"),
        (
            ["--interval=500ms", "--focus.interval=600ms"],
            "(600ms) is not shorter than --interval (500ms)",
        ),
        (
            ["--notify.psi-stall=3s", "--notify.psi-window=2s"],
            "--notify.psi-stall (3s) is longer than --notify.psi-window (2s)",
        ),
    ],
)
def test_flags_at_odds_are_one_clear_line(argv: list[str], said: str) -> None:
    args = build_parser().parse_args(["run", *argv])
    with pytest.raises(SystemExit) as exc:
        notify_config(args)
        focus_interval(args)
    assert said in str(exc.value)


def test_act_evict_and_a_rules_evict_take_the_same_defaults() -> None:
    """`nodeguard act evict` with no --free and a rule's `evict` with no `free`: one argument
    model, one set of defaults (5 % of the node's memory, priority 999 or less)."""
    from nodeguard.actions import registry
    from nodeguard.cli.act import action_args
    from nodeguard.rules.schema import ActionSpec

    args = build_parser().parse_args(["act", "evict", "--node", "n"])
    by_hand = registry.get("evict").parse(action_args(args))
    assert by_hand == ActionSpec(action="evict").step.args
    assert by_hand.free is None and by_hand.max_priority == 999  # type: ignore[attr-defined]


def test_without_a_kubeconfig_act_says_where_it_looked(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nodeguard", "act", "cordon", "--node", "n", "--dry-run"],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "", "HOME": str(tmp_path), "COLUMNS": "200"},
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert (
        "tried --kubeconfig (not given), $KUBECONFIG (unset), the in-cluster config (not in a "
        f"pod), {tmp_path}/.kube/config (absent)" in out.stderr
    ), out.stderr
    # The reason, not the class that carried it nor the library's preamble.
    assert "KubeError" not in out.stderr and "Invalid kube-config file" not in out.stderr


def test_every_command_finds_its_cluster_in_one_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--kubeconfig, else $KUBECONFIG, else the pod's ServiceAccount, else ~/.kube/config for
    the interactive commands only: the agent is never pointed at a cluster by a file it found
    in a home directory."""
    from nodeguard.kube.config import cluster_named

    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    assert not cluster_named(kubeconfig=None, home=True)
    home = tmp_path / ".kube" / "config"
    home.parent.mkdir()
    home.write_text("apiVersion: v1\nkind: Config\n")
    assert cluster_named(kubeconfig=None, home=True)
    assert not cluster_named(kubeconfig=None, home=False)  # the agent
    assert cluster_named(kubeconfig=tmp_path / "given", home=False)
    # An empty $KUBECONFIG is unset, as kubectl reads it.
    monkeypatch.setenv("KUBECONFIG", "")
    assert not cluster_named(kubeconfig=None, home=False)
    assert cluster_named(kubeconfig=None, home=True)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "env"))
    assert cluster_named(kubeconfig=None, home=False)
    monkeypatch.delenv("KUBECONFIG")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert cluster_named(kubeconfig=None, home=False)


def test_snapshot_reads_kubeconfig_from_the_environment(tmp_path: Path) -> None:
    """$KUBECONFIG is read by snapshot as by act (it was ignored): a broken one is said in one
    line, with where it was looked for, and the report is still printed."""
    broken = tmp_path / "kubeconfig"
    broken.write_text("apiVersion: v1\nkind: Config\n")
    out = subprocess.run(
        [sys.executable, "-m", "nodeguard", "snapshot", *host_flags("v2-systemd-containerd")],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "", "HOME": str(tmp_path), "KUBECONFIG": str(broken), "COLUMNS": "160"},
    )
    assert out.returncode == 0 and "Node memory" in out.stdout, out.stderr
    assert f"tried --kubeconfig (not given), $KUBECONFIG={broken}" in out.stderr, out.stderr
    assert f"$KUBECONFIG={broken} (absent)" not in out.stderr  # it is there, but broken
    assert "pod names unknown" in out.stderr
    gone = subprocess.run(
        [sys.executable, "-m", "nodeguard", "act", "cordon", "--node", "n", "--dry-run"],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "", "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "nope")},
    )
    assert f"$KUBECONFIG={tmp_path / 'nope'} (absent)" in gone.stderr, gone.stderr


def _every_command() -> list[list[str]]:
    """Each command and subcommand, from the registries (a new one is covered unlisted)."""
    from nodeguard.cli.act import actions

    return [[], *([name] for name in SUBCOMMANDS), *(["act", name] for name in actions())]


@pytest.mark.parametrize("command", _every_command(), ids=lambda c: " ".join(c) or "nodeguard")
def test_help_fits_80_columns(command: list[str]) -> None:
    """``--help`` of every command within 80 columns (kubectl exec without a TTY), its usage
    one line; the subcommands named as typed (``nodeguard act evict``)."""
    out = subprocess.run(
        [sys.executable, "-m", "nodeguard", *command, "--help"],
        capture_output=True,
        text=True,
        check=False,
        env={"COLUMNS": "80", "PATH": ""},
    )
    assert out.returncode == 0, out.stderr
    assert [ln for ln in out.stdout.splitlines() if len(ln) > 80] == []
    assert out.stdout.splitlines()[0].startswith(f"usage: {' '.join(['nodeguard', *command])} ")


def test_a_bad_flag_is_one_line_and_where_to_look() -> None:
    """As kubectl: the error and the command's --help to read, on stderr, exit status 2; the
    subcommand that refused the flag is the one named."""
    for argv, error in (
        (["run", "--interval=abc"], "nodeguard run: error: argument --interval: not a duration"),
        (["act", "evict", "--node", "n", "--bogus"], "nodeguard act evict: error: unrecognized"),
        (["snapshot", "--bogus"], "nodeguard snapshot: error: unrecognized arguments: --bogus"),
    ):
        out = subprocess.run(
            [sys.executable, "-m", "nodeguard", *argv],
            capture_output=True,
            text=True,
            check=False,
            env={"COLUMNS": "80", "PATH": ""},
        )
        lines = out.stderr.splitlines()
        assert out.returncode == 2 and len(lines) == 2, out.stderr
        assert lines[0].startswith(error), lines
        prog = error.split(":")[0]
        assert lines[1] == f"See '{prog} --help'."


def test_act_help_lists_the_exit_statuses() -> None:
    """Each exit status ``act`` returns is in ``act --help`` and each ``act ACTION --help``."""
    from nodeguard.cli import act

    codes = {act.EXIT_FAILED, act.EXIT_BAD_FLAGS, act.EXIT_REFUSED, act.EXIT_NOT_FOUND}
    for command in (["act"], ["act", "evict"]):
        text = subprocess.run(
            [sys.executable, "-m", "nodeguard", *command, "--help"],
            capture_output=True,
            text=True,
            check=True,
            env={"COLUMNS": "80", "PATH": ""},
        ).stdout
        described = " ".join(text.split("exit status:")[1].split())
        assert all(f"; {code} " in described for code in codes), described
        assert described.startswith("0 done")


def test_the_usage_line_names_the_positionals() -> None:
    """One line, the flags below it, but what must follow the command named."""
    parser = build_parser()
    usage = {}
    for name in SUBCOMMANDS:
        with pytest.raises(SystemExit), contextlib.redirect_stdout(io.StringIO()) as out:
            parser.parse_args([name, "--help"])
        usage[name] = out.getvalue().splitlines()[0]
    assert usage["act"] == "usage: nodeguard act [flags] ACTION"
    assert usage["incidents"] == "usage: nodeguard incidents [flags] [ID]"
    assert usage["check"] == "usage: nodeguard check [flags] PATH..."
    assert usage["run"] == "usage: nodeguard run [flags]"
    assert usage["trials"] == "usage: nodeguard trials [flags] NAMESPACE/EXPERIMENT"


@pytest.mark.parametrize("text", ["garbage: [\n", "[1, 2]\n"], ids=["not-yaml", "a-list"])
def test_a_malformed_kubeconfig_is_a_clear_error(tmp_path: Path, text: str) -> None:
    """A kubeconfig that is not YAML, or YAML of another shape, is bad input: one line saying
    so and where it was found, exit status 1, no traceback."""
    broken = tmp_path / "kubeconfig"
    broken.write_text(text)
    out = subprocess.run(
        [sys.executable, "-m", "nodeguard", "act", "cordon", "--node", "n", "--dry-run"],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "", "HOME": str(tmp_path), "KUBECONFIG": str(broken), "COLUMNS": "200"},
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "no usable Kubernetes config (not a kubeconfig: " in out.stderr
    assert f"$KUBECONFIG={broken}" in out.stderr
