"""Issue 17, the operator's first hour: what someone new runs from README.md, as they run it,
read at 80 columns (``kubectl exec`` without a TTY).

- The README's "try act" steps on the test control plane, read from the README itself and
  carried out (``kubectl`` by its API calls, ``nodeguard act`` as a process): the plan fits 80
  columns, sizes are human, every blocked pod is named, dry-run Events promise nothing a
  one-shot command will not do, ``--json`` has exact bytes.
- ``nodeguard snapshot --kubeconfig``: containers named, each "no data" said once, no retry
  promised by a one-shot command.
- ``nodeguard incidents``: 80 columns, ids shortened to a unique start, any unique start taken.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import utils
from kubernetes.client.exceptions import ApiException

from nodeguard.actions.base import ActionResult
from nodeguard.cli.incidents import short_ids
from nodeguard.firing import Firing
from nodeguard.remediation.incidents import IncidentStore
from tests.support.agent import running_agent, wait_until
from tests.support.controlplane.cluster import TestCluster
from tests.support.hosts import host_flags
from tests.support.kube_helpers import Cluster, mirror_pod, name_of

REPO = Path(__file__).resolve().parents[2]
WIDTH = 80


def nodeguard(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``nodeguard ARGV`` as a process at 80 columns, without a TTY."""
    return subprocess.run(
        [sys.executable, "-m", "nodeguard", *argv],
        capture_output=True,
        text=True,
        check=False,
        env={"COLUMNS": str(WIDTH), "PATH": "", **(env or {})},
        timeout=120,
    )


def readme_steps(section: str) -> list[list[str]]:
    """The commands of the first ``sh`` block of a README section, continuation lines joined,
    a ``for X in ...; do ...; done`` loop unrolled, comments dropped."""
    text = (REPO / "README.md").read_text()
    body = text[text.index(f"## {section}\n") :]
    block = body[body.index("```sh\n") + 6 : body.index("```\n", body.index("```sh\n") + 6)]
    lines = block.replace("\\\n", " ").splitlines()
    steps: list[list[str]] = []
    loop: tuple[str, list[str]] | None = None
    for line in lines:
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] == "for":
            loop = (words[1], [w.rstrip(";") for w in words[3 : words.index("do")]])
            continue
        if words == ["done"]:
            loop = None
            continue
        if loop is None:
            steps.append(words)
        else:
            var, values = loop
            steps += [[w.replace(f"${var}", v) for w in words] for v in values]
    return steps


def _lines_within(text: str, width: int = WIDTH) -> list[str]:
    """The lines longer than ``width`` (results wrap too, as the plans do)."""
    return [line for line in text.splitlines() if len(line) > width]


def _results(text: str, head: str) -> list[str]:
    """Each result that starts with ``head`` (``DRY RUN evict``), its wrapped lines (indented
    by four) joined back into one."""
    out: list[str] = []
    for line in text.splitlines():
        if line.startswith(head):
            out.append(line)
        elif out and line.startswith("    ") and not line.startswith("     "):
            out[-1] += " " + line.strip()
    return out


def test_try_act_on_the_test_control_plane_as_the_readme_says(
    cluster: Cluster, control_plane: TestCluster
) -> None:
    kubeconfig = str(control_plane.kubeconfig_path)
    outputs: list[tuple[list[str], subprocess.CompletedProcess[str]]] = []
    events: list[dict[str, Any]] = []
    quotas: list[list[str]] = []
    for step in readme_steps("The test control plane"):
        if step[0] == "export":
            continue  # KUBECONFIG: the test control plane's, given to each command below
        if step[:3] == ["kubectl", "apply", "-f"]:
            _apply(cluster, REPO / step[3])
        elif step[:2] == ["kubectl", "wait"]:
            assert "--for" in step and step[step.index("--for") + 1] == "condition=established"
            for crd in [w.removeprefix("crd/") for w in step if w.startswith("crd/")]:
                wait_until(f"{crd} established", partial(_established, cluster, crd), timeout=60)
        elif step[1:] == ["-n", "try", "get", "resourcequota"]:
            quotas.append(
                sorted(name_of(q) for q in cluster.core.list_namespaced_resource_quota("try").items)
            )
        elif step[0] == "kubectl" and "patch" in step:
            patch = json.loads(step[step.index("-p") + 1])
            assert "--subresource=status" in step and "--type=merge" in step, step
            if step[1:3] == ["patch", "node"]:
                cluster.core.patch_node_status(step[3], patch)
            else:
                assert step[1] == "-n" and step[3:5] == ["patch", "pod"], step
                cluster.core.patch_namespaced_pod_status(step[5], step[2], patch)
        elif step[0] == ".venv/bin/nodeguard":
            outputs.append((step, nodeguard(*step[1:], "--kubeconfig", kubeconfig)))
        elif step[:3] == ["kubectl", "get", "events"]:
            namespace = step[step.index("-n") + 1]
            events = [e.to_dict() for e in cluster.core.list_namespaced_event(namespace).items]
        else:
            raise AssertionError(f"the README runs a step this test does not know: {step}")
    (
        (first, plan),
        (_, blocked),
        (_, cordon),
        (_, would_pause),
        (_, pause),
        (_, resume),
        (
            _,
            doctor,
        ),
    ) = outputs

    # The plan: every line within 80 columns, sizes in binary units, the exclusion named.
    assert plan.returncode == 0, plan.stderr
    assert _lines_within(plan.stdout) == [], plan.stdout
    # What the rank counts is what eviction frees: unreclaimable memory (none known here:
    # no agent was asked), not the working set, whose page cache the kernel reclaims anyway.
    assert re.search(r"1\. pod try/preprocess: request 2\.0 GiB, priority 100 *\n", plan.stdout)
    assert re.search(r"\n +unreclaimable memory: unknown *\n", plan.stdout), plan.stdout
    assert "No unreclaimable memory known (pass --agent-url" in plan.stdout
    assert "pods: trial-a-worker-0, trial-a-worker-1" in plan.stdout
    assert "try/trainer: priority 100000 above the maximum 999" in plan.stdout
    result = _results(plan.stdout, "DRY RUN evict")
    assert result == [
        "DRY RUN evict done: would evict 1 unit(s) (pod/try/preprocess: try/preprocess), 0 B "
        "of unreclaimable memory (target 0: the first unit alone)"
    ]
    assert not re.search(r"\d{4,} B\b", plan.stdout), "raw bytes where people read"

    # Blocked by the budget: the pod named, with why; exit status 3; no retry promised.
    assert blocked.returncode == 3, blocked.stdout + blocked.stderr
    (line,) = _results(blocked.stdout, "DRY RUN evict")
    # The gang counted against its budget whole (minAvailable 2 of 2 pods: 0 allowed, 2 needed).
    assert "would not evict gang katib-trial/try/trial-a: budget try/trial-a allows 0 of 2" in line
    assert line.endswith("not tried again: nodeguard act runs once)")

    assert cordon.returncode == 0 and "DRY RUN cordon done" in cordon.stdout, cordon.stdout

    # The Events of a one-shot dry run promise nothing it will not do.
    (would_block,) = [e for e in events if e["reason"] == "NodeguardWouldBeBlocked"]
    assert would_block["involved_object"]["name"] == "trial-a-worker-0"
    assert would_block["message"].endswith(
        "never by DELETE; not tried again: nodeguard act runs once"
    )
    for e in events:
        assert not re.search(r"try again|retr(y|ied)|tried again after", e["message"]), e

    # Katib: the experiment found from its trial's pods on the node; the dry run holds nothing,
    # the real pause is a quota on Trials in its namespace, the resume deletes it.
    assert would_pause.returncode == 0, would_pause.stdout + would_pause.stderr
    assert _results(would_pause.stdout, "DRY RUN pause_katib done"), would_pause.stdout
    assert "try/sweep" in would_pause.stdout
    assert pause.returncode == 0 and _results(pause.stdout, "pause_katib done"), pause.stdout
    assert quotas == [["nodeguard-katib-pause-sweep"]]
    assert resume.returncode == 0 and _results(resume.stdout, "resume_katib done"), resume.stdout
    assert not cluster.core.list_namespaced_resource_quota("try").items
    sweep = cast(
        dict[str, Any],
        cluster.custom.get_namespaced_custom_object(
            "kubeflow.org", "v1beta1", "try", "experiments", "sweep"
        ),
    )
    assert "nodeguard.io/resumed-at" in sweep["metadata"]["annotations"], sweep["metadata"]

    # The doctor on the whole scene (README.md, "Checking a cluster", shows this run): the
    # trial's pods at the preprocessing's priority, the PyTorchJob at none and with no gang.
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert _lines_within(doctor.stdout) == [], doctor.stdout
    for title in (
        "training-priority: Experiment try/sweep's trials run at priority 100, no higher",
        "training-priority: PyTorchJob try/bert runs without a PriorityClass (priority 0)",
        "training-gang: PyTorchJob try/bert starts 4 pods with no gang scheduling",
    ):
        assert title in " ".join(doctor.stdout.split()), doctor.stdout

    # --json: the same result with exact bytes.
    data = json.loads(
        nodeguard(*first[1:], "--json", "--kubeconfig", str(control_plane.kubeconfig_path)).stdout
    )
    (evict,) = data
    assert evict["outcome"] == "done" and evict["exit_status"] == 0
    ranked = evict["details"]["plan"]["ranked"]
    assert ranked[0]["request_bytes"] == 2 << 30 and evict["details"]["target_bytes"] == 0


def _apply(cluster: Cluster, path: Path) -> None:
    """``kubectl apply -f PATH`` for what the README applies: core objects and CRDs through
    kubernetes.utils (an object another test made already is left as it is), Katib's custom
    objects through the custom objects API."""
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        group, _, version = doc["apiVersion"].rpartition("/")
        try:
            if group == "kubeflow.org":
                plural = f"{doc['kind'].lower()}s"
                cluster.custom.create_namespaced_custom_object(
                    group, version, doc["metadata"]["namespace"], plural, doc
                )
            else:
                # kubernetes.utils carries no annotations.
                utils.create_from_dict(cluster.api, doc)  # type: ignore[no-untyped-call]
        except ApiException as exc:
            if exc.status != 409:
                raise
        except utils.FailToCreateError as exc:
            if any(e.status != 409 for e in exc.api_exceptions):
                raise


def _established(cluster: Cluster, name: str) -> bool:
    status = cluster.ext.read_custom_resource_definition(name).status
    conditions = (status.conditions if status else None) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def test_snapshot_names_containers_with_a_kubeconfig(
    cluster: Cluster, control_plane: TestCluster
) -> None:
    ns, node = cluster.namespace("snap"), cluster.node()
    mirror_pod(cluster, namespace=ns, node=node)
    flags = [*host_flags("v2-cgroupns"), f"--node-name={node}"]
    named = nodeguard("snapshot", *flags, "--kubeconfig", str(control_plane.kubeconfig_path))
    assert named.returncode == 0, named.stderr
    # At 80 columns a long name folds within its column: nothing is cut, no column lost.
    assert _lines_within(named.stdout) == [] and "…" not in named.stdout, named.stdout
    # Unreclaimable memory beside the working set, and its share of the limit (what the
    # default rules read).
    assert re.search(r"working +unreclaim- +of +OOM", named.stdout), named.stdout
    wide = nodeguard(
        "snapshot",
        *flags,
        "--kubeconfig",
        str(control_plane.kubeconfig_path),
        env={"COLUMNS": "200"},
    )
    assert f"{ns}/kube-apiserver-{node}/kube-apiserver" in wide.stdout
    # Each "no data" is said once, by its section, and a one-shot command promises no retry.
    assert named.stdout.count("no data") == named.stdout.count("GPUs: no data") == 1
    assert "retried" not in named.stdout + named.stderr
    assert named.stderr == ""  # one-shot commands log warnings and worse only
    anonymous = nodeguard("snapshot", *flags, env={"COLUMNS": "200"})
    assert f"kube-apiserver-{node}" not in anonymous.stdout
    # A cluster that cannot be reached: the report all the same, and one line that says why.
    missing = nodeguard("snapshot", *flags, "--kubeconfig", "/nonexistent/kubeconfig")
    assert missing.returncode == 0 and "Node memory" in missing.stdout
    assert "pod names unknown: no usable Kubernetes config" in missing.stderr
    assert "tried --kubeconfig /nonexistent/kubeconfig" in missing.stderr


def _firing(rule: str, t: float, target: str) -> Firing:
    return Firing(
        rule=rule,
        kind="firing",
        scope="node",
        target=target,
        node="gpu-node-with-a-long-name-7",
        time=t,
        steps=(),
        dry_run=True,
        source="local",
        summary="test",
    )


def test_incidents_fit_80_columns_and_take_any_unique_start(tmp_path: Path) -> None:
    store = IncidentStore(directory=tmp_path / "incidents")
    done = [
        ActionResult(action=a, node="n", dry_run=True, outcome="done", message="would").to_record()
        for a in ("cordon", "evict", "record")
    ]
    t = 1_764_497_700.0  # 2025-11-30T10:15:00Z
    ids = [
        store.write(firing=_firing("slab-unreclaimable-high", t, "n"), results=done)["id"],
        # Two in the same second: their ids differ only after the second.
        store.write(firing=_firing("node-memory-low", t + 60.25, "a"), results=done)["id"],
        store.write(firing=_firing("node-memory-low", t + 60.5, "b"), results=done)["id"],
    ]
    state = f"--path.state={tmp_path}"
    listing = nodeguard("incidents", state)
    assert listing.returncode == 0
    assert _lines_within(listing.stdout) == [], listing.stdout
    assert "…" not in listing.stdout  # nothing cut
    short = short_ids(ids)
    assert short[ids[0]] == "20251130T101500"
    assert short[ids[1]].startswith("20251130T101600.2") and short[ids[1]] != short[ids[2]]
    for i in ids:
        assert short[i] in listing.stdout, short[i]
        shown = nodeguard("incidents", state, short[i], "--json")
        assert shown.returncode == 0 and json.loads(shown.stdout)["id"] == i
    both = nodeguard("incidents", state, "20251130T1016")
    assert both.returncode == 1
    assert "is the start of 2 incident ids" in both.stdout
    # "newest:" lists the newest first.
    assert both.stdout.index(ids[2]) < both.stdout.index(ids[1]), both.stdout
    assert nodeguard("incidents", state, "2024").returncode == 1


def test_one_incident_for_people_and_rule_names_whole(tmp_path: Path) -> None:
    """``nodeguard incidents ID`` is a short report within 80 columns: the rule, its target,
    when, each action with its outcome, the node's memory and the largest containers then;
    ``--json`` is the record. In the list, a long rule name is never broken mid-word."""
    store = IncidentStore(directory=tmp_path / "incidents")
    t = 1_764_497_700.0  # 2025-11-30T10:15:00Z
    evicted = ActionResult(
        action="evict", node="n", dry_run=True, outcome="done", message="would evict ml/prep"
    ).to_record()
    firing = dataclasses.replace(
        _firing("container-thrashing-at-limit", t, "ml/prep/main"),
        summary="unreclaimable memory at 97 % of the limit",
        values={"container_unreclaimable_limit_ratio": 0.97},
    )
    record = store.write(firing=firing, results=[evicted])
    record_id = record["id"]
    state = f"--path.state={tmp_path}"
    listing = nodeguard("incidents", state)
    assert "container-thrashing-at-limit" in listing.stdout, listing.stdout
    shown = nodeguard("incidents", state, record_id[:15])
    assert shown.returncode == 0, shown.stdout + shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "container-thrashing-at-limit firing on node ml/prep/main"
    assert lines[1] == "  when    2025-11-30 10:15:00 UTC, node gpu-node-with-a-long-name-7"
    assert lines[2] == "  from    local (dry run: nothing was changed)"
    assert "  value   container_unreclaimable_limit_ratio = 0.97" in lines
    assert "  evict: done - would evict ml/prep" in lines
    assert _lines_within(shown.stdout) == [], shown.stdout
    whole = nodeguard("incidents", state, record_id[:15], "--json")
    assert json.loads(whole.stdout) == json.loads(json.dumps(record, default=str))


def test_short_ids_are_unique_starts() -> None:
    ids = ["20251130T101500.000000Z-a", "20251130T101500.500000Z-b", "20251201T000000.000000Z-c"]
    assert short_ids(ids) == {
        ids[0]: "20251130T101500.0",
        ids[1]: "20251130T101500.5",
        ids[2]: "20251201T000000",
    }
    assert all(sum(other.startswith(s) for other in ids) == 1 for s in short_ids(ids).values())


def test_docs_try_cluster_is_what_the_readme_applies() -> None:
    steps = readme_steps("The test control plane")
    applied = [s[3] for s in steps if s[:3] == ["kubectl", "apply", "-f"]]
    assert applied == [
        "docs/try/cluster.yaml",
        "docs/try/katib-crds.yaml",
        "docs/try/katib.yaml",
        "docs/try/training-crds.yaml",
        "docs/try/training.yaml",
    ]
    # The CRD a user applies is the one the tests vendor.
    (crd,) = [d for d in yaml.safe_load_all((REPO / applied[3]).read_text()) if d]
    vendored = REPO / "tests/fixtures/training/crd-pytorchjob.yaml"
    assert [crd] == [d for d in yaml.safe_load_all(vendored.read_text()) if d]
    kinds = [d["kind"] for d in yaml.safe_load_all((REPO / applied[0]).read_text()) if d]
    assert kinds.count("Pod") == 4 and "Node" in kinds and "PodDisruptionBudget" in kinds


def test_the_first_log_line_counts_alert_rules(tmp_path: Path) -> None:
    """With only the alert mapping, the agent's first line says it has 4 alert rules (and the
    webhook off without a token), not "rules=0" alone."""
    args = [
        *host_flags("v2-systemd-containerd"),
        f"--path.state={tmp_path / 'state'}",
        f"--rules={REPO / 'rules' / 'alertmanager.yaml'}",
    ]
    with running_agent(args=args, log_path=tmp_path / "agent.log"):
        pass
    log = (tmp_path / "agent.log").read_text()
    assert "rules=0 alert_rules=4" in log, log
    assert "alert rules are loaded but the webhook is off" in log
