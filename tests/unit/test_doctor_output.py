"""``nodeguard doctor``'s registry, reader and table: every check module registers once, the
reader keeps nodeguard's request/limit arithmetic, and the table fits 80 columns."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

import nodeguard.doctor  # noqa: F401  (registers every check)
from nodeguard.cli.doctor import exit_status
from nodeguard.doctor.findings import Fact, Finding, ObjectRef
from nodeguard.doctor.registry import CHECKS, run_checks
from nodeguard.doctor.table import WIDTH, render
from tests.support.doctor import GiB, cluster, container, node, pod

ROOT = Path(__file__).resolve().parents[2]
CHECK_MODULES = {
    "unbounded",
    "overcommit",
    "quota_limits",
    "node_reserve",
    "agents",
    "katib_fit",
    "training_priority",
    "training_gang",
}


def test_every_check_module_registers_one_check_named_in_the_readme() -> None:
    assert {c.run.__module__.rsplit(".", 1)[1] for c in CHECKS.values()} == CHECK_MODULES
    modules = {p.stem for p in (ROOT / "nodeguard/doctor").glob("*.py")}
    assert modules - CHECK_MODULES == {
        "__init__",
        "agent_inputs",
        "findings",
        "gpu_nodes",
        "inputs",
        "katib_inputs",
        "node_scope",
        "quota_scopes",
        "read",
        "read_agents",
        "read_katib",
        "read_kubelet",
        "read_training",
        "registry",
        "table",
        "template_limits",
        "training_inputs",
        "training_workloads",
    }
    readme = (ROOT / "README.md").read_text()
    for check_id in CHECKS:
        assert f"`{check_id}`" in readme, check_id


def test_the_reader_counts_gpus_training_and_limits_as_kubectl_does() -> None:
    p = pod(
        "w",
        node="n",
        containers=[container(request="1Gi", limit="2Gi", gpus=2), container("side")],
        owner=("PyTorchJob", "bert"),
    )
    assert (p.gpus, p.training, p.workload) == (2, True, "pytorchjob/bert")
    # One container without a limit: the pod cgroup is unbounded, the limits still sum to 2Gi.
    assert (p.meta.memory_limit_bytes, p.limits_sum, p.meta.memory_request_bytes) == (
        None,
        2 * GiB,
        GiB,
    )
    assert node("g", gpus=4).gpus == 4 and not node("c").gpu_label


def test_the_table_fits_80_columns_grouped_by_severity_with_each_fix() -> None:
    long = " ".join(f"word{i}" for i in range(30))
    findings = [
        Finding(
            check="overcommit",
            severity="warning",
            title=f"a warning about {long}",
            objects=(ObjectRef(kind="Node", namespace="", name="gpu-1"),),
            evidence=(Fact(label="limits summed", bytes=80 * GiB),),
            fix=f"# a comment {long}\nkubectl taint node gpu-1 {long}",
        ),
        Finding(
            check="node-reserve",
            severity="error",
            title="an error",
            objects=(ObjectRef(kind="Pod", namespace="ml", name="p"),),
            evidence=(Fact(label="reserved", bytes=0), Fact(label="why", text="none")),
            fix="line one\nline two",
        ),
    ]
    text = render(findings)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= WIDTH
    assert lines.index("ERROR (1)") < lines.index("WARNING (1)")
    assert "    evidence: reserved: 0 B; why: none" in lines
    assert "    fix:      line one" in lines and "              line two" in lines
    assert "    evidence: limits summed: 80.0 GiB" in lines
    # The fix stays pasteable: a command continues with a backslash, a comment as a comment.
    start = lines.index(
        "    fix:      # a comment word0 word1 word2 word3 word4 word5 word6 word7 word8"
    )
    assert lines[start + 1].startswith("              # word")
    command = [line for line in lines[start:] if "kubectl taint" in line or line.endswith("\\")]
    assert command[0].startswith("              kubectl taint node gpu-1 word0")
    assert all(line.endswith(" \\") for line in command[:-1]) and len(command) > 1
    assert lines[-1] == "2 finding(s): 1 error, 1 warning, 0 info"
    assert render([]) == "no findings\n"
    assert json.loads(json.dumps(findings[0].to_json()))["evidence"] == [
        {"label": "limits summed", "bytes": 80 * GiB}
    ]


def test_the_exit_status_is_the_worst_finding_against_fail_on() -> None:
    c = cluster(nodes=(node("n", memory="64Gi", allocatable="60Gi"),))
    assert run_checks(c) == []
    warning = Finding(
        check="overcommit", severity="warning", title="t", objects=(), evidence=(), fix="f"
    )
    error = Finding(
        check="overcommit", severity="error", title="t", objects=(), evidence=(), fix="f"
    )
    assert exit_status([], fail_on="warning") == 0
    assert exit_status([warning], fail_on="error") == 0
    assert exit_status([warning], fail_on="warning") == 1
    assert exit_status([warning, error], fail_on="error") == 1


def test_a_fix_in_the_table_pastes_as_it_reads() -> None:
    """A manifest fragment is never wrapped (its lines stay YAML), a comment after code goes on
    its own line first, and a command's trailing comment never wraps into a second command."""
    long = "ip-10-120-33-201.us-west-2.compute.internal"
    fragment = (
        "# in the pod template of ReplicaSet web-5d9\ncontainers:\n  - name: main\n"
        "    resources:\n      limits:\n"
        "        memory: 1Gi  # choose: its peak working set and some room, measured over a day"
    )
    findings = [
        Finding(
            check="unbounded-memory",
            severity="error",
            title="t",
            objects=(),
            evidence=(),
            fix=fragment,
        ),
        Finding(
            check="overcommit",
            severity="error",
            title="u",
            objects=(),
            evidence=(),
            fix=f"kubectl describe node {long}   # Allocated resources",
        ),
    ]
    lines = render(findings).splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("    fix:"))
    end = next(i for i, ln in enumerate(lines) if ln.startswith("  overcommit"))
    prefix = len("    fix:      ")
    loaded = yaml.safe_load("\n".join(ln[prefix:] for ln in lines[start:end]))
    assert loaded["containers"][0]["resources"]["limits"]["memory"] == "1Gi"
    command = [
        ln[prefix:] for ln in lines[end + 3 :] if ln.startswith(" " * prefix) or "fix:" in ln
    ]
    assert command[0] == "# Allocated resources"
    assert command[1] == "kubectl describe node \\"
    assert command[2].strip() == long


def test_a_long_command_never_wraps_inside_a_quoted_word() -> None:
    """A ``\\`` inside quotes continues nothing: the pasted command would break."""
    command = (
        "kubectl -n nodeguard get daemonset nodeguard -o "
        "jsonpath='{.spec.template.spec.tolerations} {.spec.template.spec.nodeSelector}'"
    )
    f = Finding(check="x", severity="error", title="t", objects=(), evidence=(), fix=command)
    lines = [ln for ln in render([f]).splitlines() if ln.startswith(" " * 14) or "fix:" in ln]
    parts = [ln[14:].removesuffix(" \\").strip() for ln in lines]
    assert " ".join(parts) == command
    assert "jsonpath='{.spec.template.spec.tolerations} {.spec.template.spec.nodeSelector}'" in (
        parts
    )
    assert max(len(ln) for ln in lines) <= 80 or any("jsonpath" in ln for ln in lines)
