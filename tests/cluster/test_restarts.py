"""Remediation that survives the real world: a real agent process killed with SIGKILL at the worst
moment, the API server stopped mid-action, deliveries arriving together while it is down.
Nothing may be done twice, nothing lost, nothing left half-done without a record.

The agent reads a fixture host (its unreclaimable slab is 31 % of RAM: the node rules below
hold) and acts on Nodes and Pods of the test control plane, through a fault-injecting proxy
(tests/support/apiproxy.py) where a test must stop it inside one API call."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from nodeguard.actions.evict import GANGS_ANNOTATION
from tests.support.agent import get, kill_9, running_agent, wait_until
from tests.support.controlplane.cluster import TestCluster
from tests.support.hosts import HOSTS, host_flags
from tests.support.kube_helpers import Cluster, annotations_of, cordoned, given
from tests.support.remediation import (
    ALERT_RULES,
    SLAB_HIGH,
    SLAB_LOW,
    MiB,
    agent_args,
    alert_delivery,
    evicted_pods,
    host_args,
    incidents,
    katib_gang,
    low_priority_pods,
    metric_value,
    pod_list_request,
    post_delivery,
    slab_rules,
    starved_host,
)


def test_cooldown_cap_and_eviction_limit_survive_kill_9(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path
) -> None:
    # The fault: cooldown 5m and maxFirings 1/1h evicted one pod; the agent was restarted and
    # evicted another 7 s later.
    ns, node = cluster.namespace("restart"), cluster.node()
    names = low_priority_pods(cluster, ns, node, 3)
    rules = slab_rules(tmp_path, actions='[{action: evict, args: {free: "0"}}]')
    args = agent_args(tmp_path, node=node, kubeconfig=control_plane.kubeconfig_path, rules=rules)
    with running_agent(args=args, log_path=tmp_path / "agent-1.log") as base:
        wait_until(
            "one eviction",
            lambda: len(evicted_pods(cluster, ns, names)) == 1,
            timeout=30,
            step=0.05,
        )
        wait_until(
            "the runbook to finish",
            lambda: incidents(base),
            timeout=30,
            step=0.05,
        )
        kill_9(base.pid)
    state = json.loads((tmp_path / "state" / "remediation-state.json").read_text())
    assert state["sections"]["rules"]["slab-high"]["fired"]
    assert len(state["sections"]["evictions"][node]) == 1
    with running_agent(args=args, log_path=tmp_path / "agent-2.log") as base:
        wait_until(
            "the restarted agent to hold back",
            lambda: metric_value(base, "nodeguard_rule_suppressed_total", reason="cooldown") >= 10,
            timeout=30,
            step=0.05,
        )
        assert len(evicted_pods(cluster, ns, names)) == 1
        assert incidents(base)  # the incident of the first run is kept


def test_killed_right_after_the_cordon_the_eviction_still_runs_once(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    ns, node = cluster.namespace("after-cordon"), cluster.node()
    names = low_priority_pods(cluster, ns, node, 3)
    rules = slab_rules(tmp_path, actions='[{action: cordon}, {action: evict, args: {free: "0"}}]')
    args = agent_args(tmp_path, node=node, kubeconfig=proxied.kubeconfig, rules=rules)
    held = proxied.hold("POST", r"/pods/[^/]+/eviction")
    with running_agent(args=args, log_path=tmp_path / "agent-1.log") as base:
        held.wait_hit()  # the cordon is done, the eviction is on the wire
        assert cordoned(cluster.core.read_node(node))
        kill_9(base.pid)
    proxied.clear()  # the eviction reaches the API server after the agent died
    wait_until(
        "the in-flight eviction",
        lambda: len(evicted_pods(cluster, ns, names)) == 1,
        timeout=30,
        step=0.05,
    )
    with running_agent(args=args, log_path=tmp_path / "agent-2.log") as base:
        (incident,) = wait_until(
            "the resumed runbook",
            lambda: incidents(base),
            timeout=30,
            step=0.05,
        )
        full = json.loads(get(f"{base}/incidents/{incident['id']}")[1])
    assert full["resumed"] == 1
    assert [(a["action"], a["outcome"]) for a in full["actions"]] == [
        ("cordon", "done"),
        ("evict", "done"),
    ]
    # The unit under way was completed, not a second one chosen: one pod evicted, and cordoned.
    assert len(evicted_pods(cluster, ns, names)) == 1
    assert "completed" in full["actions"][1]["details"]["evicted"][0]["why"]
    assert cordoned(cluster.core.read_node(node))


def test_killed_while_the_cordon_waits_on_the_api_the_runbook_resumes(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    ns, node = cluster.namespace("in-cordon"), cluster.node()
    names = low_priority_pods(cluster, ns, node, 2)
    rules = slab_rules(tmp_path, actions='[{action: cordon}, {action: evict, args: {free: "0"}}]')
    args = agent_args(tmp_path, node=node, kubeconfig=proxied.kubeconfig, rules=rules)
    held = proxied.hold("PATCH", rf"/api/v1/nodes/{node}\b")
    with running_agent(args=args, log_path=tmp_path / "agent-1.log") as base:
        held.wait_hit()
        kill_9(base.pid)
    held.drop()  # that PATCH is lost with the agent
    time.sleep(0.5)
    assert not cordoned(cluster.core.read_node(node))
    proxied.clear()
    with running_agent(args=args, log_path=tmp_path / "agent-2.log", ready_timeout=40) as base:
        (incident,) = wait_until(
            "the resumed runbook",
            lambda: incidents(base),
            timeout=60,
            step=0.05,
        )
        full = json.loads(get(f"{base}/incidents/{incident['id']}")[1])
    assert full["resumed"] == 1
    assert [(a["action"], a["outcome"]) for a in full["actions"]] == [
        ("cordon", "done"),
        ("evict", "done"),
    ]
    assert cordoned(cluster.core.read_node(node))
    assert len(evicted_pods(cluster, ns, names)) == 1


def test_a_gang_cut_short_by_the_api_server_is_finished_and_every_pod_recorded(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    ns, node, other = cluster.namespace("gang-outage"), cluster.node(), cluster.node()
    names = katib_gang(cluster, ns, node, other)
    rules = slab_rules(tmp_path, actions='[{action: evict, args: {free: "0"}}]')
    args = agent_args(tmp_path, node=node, kubeconfig=proxied.kubeconfig, rules=rules)
    # Let the dry-run checks and the first member's eviction through; stop at the second.
    held = proxied.hold("POST", r"/pods/t1-\w+/eviction(?!.*dryRun)", skip=1)
    with running_agent(args=args, log_path=tmp_path / "agent.log") as base:
        held.wait_hit()
        (first,) = evicted_pods(cluster, ns, names)
        assert first in ("t1-master", "t1-worker")
        annotations = annotations_of(cluster.core.read_node(node))
        assert "t1-worker" in annotations[GANGS_ANNOTATION]  # the gang, written ahead
        control_plane.stop_apiserver()
        held.release()  # the held request now finds no API server: 502
        try:
            time.sleep(2)
        finally:
            control_plane.start_apiserver()
        (incident,) = wait_until(
            "the retried runbook",
            lambda: incidents(base),
            timeout=60,
            step=0.05,
        )
        full = json.loads(get(f"{base}/incidents/{incident['id']}")[1])
    assert full["retried"] and full["actions"][0]["outcome"] == "done"
    assert evicted_pods(cluster, ns, names) == ["t1-master", "t1-worker"]  # not the bystander
    assert GANGS_ANNOTATION not in annotations_of(cluster.core.read_node(node))
    for name in ("t1-master", "t1-worker"):  # every pod evicted has its Event, once
        assert len(cluster.events(ns, name=name, reason="NodeguardEvicted")) == 1, name


def test_killed_mid_gang_within_its_budget_the_next_agent_finishes_it(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    ns, node, other = cluster.namespace("gang-kill"), cluster.node(), cluster.node()
    names = katib_gang(cluster, ns, node, other)
    # A budget over the trial that affords the whole gang: minAvailable 0 of two healthy pods,
    # as the disruption controller computes it (2 allowed, 2 needed).
    cluster.budget(
        ns, name="trial", labels={"katib.kubeflow.org/trial": "e-t1"}, min_available=0, healthy=2
    )
    rules = slab_rules(tmp_path, actions='[{action: evict, args: {free: "0"}}]')
    args = agent_args(tmp_path, node=node, kubeconfig=proxied.kubeconfig, rules=rules)
    # The budget check and the dry-run asks pass, the first member goes; hold the second.
    held = proxied.hold("POST", r"/pods/t1-\w+/eviction(?!.*dryRun)", skip=1)
    with running_agent(args=args, log_path=tmp_path / "agent-1.log") as base:
        held.wait_hit()
        (first,) = evicted_pods(cluster, ns, names)
        kill_9(base.pid)
    held.drop()  # the second eviction is lost with the agent
    proxied.clear()
    assert evicted_pods(cluster, ns, names) == [first]  # half-evicted, and recorded on the node
    assert "t1-worker" in annotations_of(cluster.core.read_node(node))[GANGS_ANNOTATION]
    pdb = cluster.policy.read_namespaced_pod_disruption_budget("trial", ns)
    assert given(pdb.status).disruptions_allowed == 1  # the first eviction spent one of the two
    with running_agent(args=args, log_path=tmp_path / "agent-2.log") as base:
        (incident,) = wait_until(
            "the resumed runbook",
            lambda: incidents(base),
            timeout=30,
            step=0.05,
        )
        full = json.loads(get(f"{base}/incidents/{incident['id']}")[1])
    assert full["actions"][0]["outcome"] == "done", full["actions"][0]
    # The gang is whole again in one way only: both members gone, the bystander left.
    assert evicted_pods(cluster, ns, names) == ["t1-master", "t1-worker"]
    assert GANGS_ANNOTATION not in annotations_of(cluster.core.read_node(node))


def test_act_evict_rerun_finishes_a_half_evicted_gang(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    ns, node, other = cluster.namespace("gang-act"), cluster.node(), cluster.node()
    names = katib_gang(cluster, ns, node, other)

    def act(kubeconfig: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "nodeguard",
                "act",
                "evict",
                f"--node={node}",
                "--free=0",
                f"--kubeconfig={kubeconfig}",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, "COLUMNS": "200"},
        )

    proxied.fail("POST", r"/pods/t1-\w+/eviction(?!.*dryRun)", status=503, skip=1)
    first = act(proxied.kubeconfig)
    assert first.returncode == 1, first.stdout + first.stderr
    (evicted,) = evicted_pods(cluster, ns, names)
    assert evicted in first.stdout and "ServerError" in first.stdout
    # The rerun (no fault now) finishes the gang first, and evicts nothing else for it.
    second = act(control_plane.kubeconfig_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "finishing a gang" in second.stdout
    assert evicted_pods(cluster, ns, names) == ["t1-master", "t1-worker"]
    for name in ("t1-master", "t1-worker"):
        assert len(cluster.events(ns, name=name, reason="NodeguardEvicted")) == 1, name


def test_identical_deliveries_act_once_across_agents_while_the_api_server_is_down(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path
) -> None:
    # The fault: with a cluster, 50 identical deliveries at once were queued 41 times, and 20
    # identical alerts ran 13 times. Two agents behind one Service; the API server down while
    # the deliveries arrive (startsAt written three ways: one alert).
    ns, target = cluster.namespace("storm"), cluster.node()
    names = low_priority_pods(cluster, ns, target, 4)
    (tmp_path / "rules.yaml").write_text(ALERT_RULES)
    token = "t" * 40
    (tmp_path / "token").write_text(token)
    agents = []
    with contextlib.ExitStack() as stack:
        for name in ("agent-a", "agent-b"):
            cluster.node(name=f"{name}-{ns}")
            args = [
                *host_flags("v2-systemd-containerd"),
                f"--kubeconfig={control_plane.kubeconfig_path}",
                f"--rules={tmp_path / 'rules.yaml'}",
                f"--node-name={name}-{ns}",
                "--interval=1s",
                "--no-dry-run",
                f"--path.state={tmp_path / name}",
                f"--webhook.token-file={tmp_path / 'token'}",
            ]
            agents.append(
                stack.enter_context(running_agent(args=args, log_path=tmp_path / f"{name}.log"))
            )
        control_plane.stop_apiserver()
        try:
            forms = [
                "2026-11-30T10:00:00Z",
                "2026-11-30T10:00:00.000Z",
                "2026-11-30T11:00:00+01:00",
            ]

            async def storm() -> list[int]:
                return await asyncio.gather(
                    *(
                        post_delivery(
                            f"{a}/webhook/alertmanager", alert_delivery(target, forms[i % 3]), token
                        )
                        for i in range(25)
                        for a in agents
                    )
                )

            assert set(asyncio.run(storm())) == {200}
            queued = [
                metric_value(a, "nodeguard_webhook_alerts_total", status="firing", outcome="queued")
                for a in agents
            ]
            assert queued == [1.0, 1.0]  # one each: the rest were duplicates, at once
        finally:
            control_plane.start_apiserver()
        wait_until(
            "one agent to claim and act",
            lambda: (
                sum(
                    metric_value(a, "nodeguard_webhook_claims_total", outcome="claimed")
                    for a in agents
                )
                == 1
                and sum(
                    metric_value(a, "nodeguard_webhook_claims_total", outcome="duplicate")
                    for a in agents
                )
                == 1
            ),
            timeout=90,
            step=0.05,
        )
        time.sleep(2)
        assert len(evicted_pods(cluster, ns, names)) == 1


UNDO_RULES = """\
apiVersion: nodeguard.io/v1alpha1
kind: RuleSet
spec:
  rules:
    - name: slab-high
      scope: node
      when:
        - {signal: node_slab_unreclaimable_ratio, op: ">", value: 0.3}
      clear:
        - {signal: node_slab_unreclaimable_ratio, op: "<", value: 0.2}
      cooldown: 0s
      actions: [{action: cordon}]
      resolve: [{action: uncordon}]
"""


@pytest.mark.parametrize("state", ["kept", "corrupted"])
def test_an_undo_owed_before_kill_9_still_runs(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, state: str
) -> None:
    # Cordoned, killed; the slab leak is gone when the agent comes back: it must uncordon, from
    # its state file, or (the state file corrupted) from the cordon's own mark on the Node.
    node = cluster.node()
    host = tmp_path / "host"
    shutil.copytree(HOSTS / "v2-systemd-containerd", host, symlinks=True)
    (tmp_path / "rules.yaml").write_text(UNDO_RULES)
    args = [
        f"--path.procfs={host / 'proc'}",
        f"--path.sysfs={host / 'sys'}",
        f"--path.kmsg={host / 'kmsg'}",
        f"--kubeconfig={control_plane.kubeconfig_path}",
        f"--rules={tmp_path / 'rules.yaml'}",
        f"--node-name={node}",
        "--interval=100ms",
        "--no-dry-run",
        f"--path.state={tmp_path / 'state'}",
        "--cordon.lease-namespace=default",
    ]
    with running_agent(args=args, log_path=tmp_path / "agent-1.log") as base:
        wait_until(
            "the cordon", lambda: cordoned(cluster.core.read_node(node)), timeout=30, step=0.05
        )
        wait_until(
            "its runbook to end",
            lambda: incidents(base),
            timeout=30,
            step=0.05,
        )
        kill_9(base.pid)
    meminfo = host / "proc" / "meminfo"
    low = meminfo.read_text().replace("SUnreclaim:     10485760 kB", "SUnreclaim:      1048576 kB")
    meminfo.write_text(low)  # 3 % of RAM: the rule clears
    state_file = tmp_path / "state" / "remediation-state.json"
    if state == "corrupted":
        state_file.write_bytes(b"\x00" * 64)
    with running_agent(args=args, log_path=tmp_path / "agent-2.log") as base:
        wait_until(
            "the uncordon",
            lambda: not cordoned(cluster.core.read_node(node)),
            timeout=30,
            step=0.05,
        )
    log = (tmp_path / "agent-2.log").read_text()
    if state == "corrupted":
        assert "not used (corrupt" in log and "undos owed by rule(s) slab-high" in log
        assert list((tmp_path / "state").glob("remediation-state.json.bad-*"))


def test_a_pdb_backoff_survives_kill_9(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path
) -> None:
    ns, node = cluster.namespace("backoff"), cluster.node()
    cluster.pod(
        namespace=ns,
        node=node,
        name="serving",
        request="1Gi",
        labels={"app": "serving"},
        priority_class="nodeguard-test-low",
    )
    # What the disruption controller would write: nothing may be disrupted.
    cluster.blocking_pdb(ns, name="serving", labels={"app": "serving"})
    rules = slab_rules(tmp_path, actions='[{action: evict, args: {free: "0"}}]', cooldown="1s")
    rules.write_text(rules.read_text().replace("count: 1", "count: 100"))
    args = agent_args(tmp_path, node=node, kubeconfig=control_plane.kubeconfig_path, rules=rules)

    def blocked() -> int:
        return len(cluster.events(ns, name="serving", reason="NodeguardEvictionBlocked"))

    with running_agent(args=args, log_path=tmp_path / "agent-1.log") as base:
        wait_until("the budget's refusal", lambda: blocked() == 1, timeout=30, step=0.05)
        kill_9(base.pid)
    with running_agent(args=args, log_path=tmp_path / "agent-2.log") as base:
        # It fires every second (cooldown 1s); within the 10 s backoff it never asks again.
        wait_until(
            "firings after the restart",
            lambda: (
                metric_value(base, "nodeguard_rule_firings_total", rule="slab-high", kind="firing")
                >= 3
            ),
            timeout=30,
            step=0.05,
        )
        assert blocked() == 1
        wait_until(
            "the backoff to pass and the next refusal",
            lambda: blocked() == 2,
            timeout=30,
            step=0.05,
        )


def _killed_between_cordon_and_evict(
    *, cluster: Cluster, ns: str, node: str, tmp_path: Path, proxied: Any
) -> list[str]:
    """Run the agent on :func:`_starved_host` behind ``proxied`` until its pods are known, make
    slab-high hold, and SIGKILL it when its runbook's cordon is done and journalled and its
    eviction's first API call (the read of the Node's gang record) is on the wire: the
    journal's next step is the eviction, unplanned. Returns the agent's arguments, for the
    agent that resumes it."""
    host = starved_host(tmp_path, cluster, ns, node)
    args = host_args(host, tmp_path, node=node, kubeconfig=proxied.kubeconfig)
    state = tmp_path / "state" / "remediation-state.json"
    with running_agent(args=args, log_path=tmp_path / "a1.log") as base:
        wait_until(
            "the pod list",
            lambda: metric_value(base, "nodeguard_pod_info", pod="hog") == 1,
            timeout=30,
            step=0.05,
        )
        # The cordon reads the Node twice (before and under its Lease); the third read is the
        # eviction's. The pod watch read it with its list, already done.
        held = proxied.hold("GET", rf"^/api/v1/nodes/{node}$", skip=2)
        meminfo = host / "proc" / "meminfo"
        meminfo.write_text(meminfo.read_text().replace(SLAB_LOW, SLAB_HIGH))
        held.wait_hit()
        kill_9(base.pid)
    proxied.clear()
    (entry,) = json.loads(state.read_text())["sections"]["journal"].values()
    assert entry["next"] == 1 and not entry["progress"].get("1")  # nothing of it done
    assert [(r["action"], r["outcome"]) for r in entry["results"]] == [("cordon", "done")]
    return args


def test_an_eviction_resumed_before_the_pod_list_waits_for_it_and_evicts_the_right_pod(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    # The fault: resumed on the first snapshot, before the pod list, the eviction found no
    # working set, evicted nothing ("refused") and the rule waited its 5 m cooldown.
    ns, node = cluster.namespace("resume-pods"), cluster.node()
    args = _killed_between_cordon_and_evict(
        cluster=cluster, ns=ns, node=node, tmp_path=tmp_path, proxied=proxied
    )
    listing = proxied.hold("GET", pod_list_request(node), times=2)
    with running_agent(args=args, log_path=tmp_path / "agent-2.log") as base:
        listing.wait_hit()
        time.sleep(3)  # the pod list held back for a few seconds (one API call's timeout: 20 s)
        assert incidents(base) == []  # the resumed eviction waits
        assert evicted_pods(cluster, ns, ["hog", "idle"]) == []
        listing.release()
        (incident,) = wait_until(
            "the resumed runbook",
            lambda: incidents(base),
            timeout=30,
            step=0.05,
        )
        full = json.loads(get(f"{base}/incidents/{incident['id']}")[1])
    assert full["resumed"] == 1 and "abandoned" not in full
    assert [(a["action"], a["outcome"]) for a in full["actions"]] == [
        ("cordon", "done"),
        ("evict", "done"),
    ]
    evicted = full["actions"][1]["details"]["evicted"]
    assert [(e["pods"], e["usage_bytes"]) for e in evicted] == [([f"{ns}/hog"], 1843 * MiB)]
    assert evicted_pods(cluster, ns, ["hog", "idle"]) == ["hog"]
    # It waited: for the pods ("waits up to 20.2s for the pods of"), or first for its node's
    # Lease (the restarted agent takes its own back at once) and then found them listed.
    log = (tmp_path / "agent-2.log").read_text()
    assert "waits up to 20.2s for the pods of" in log or "step 2 waits: node held by" in log


def test_an_eviction_whose_pod_list_never_comes_is_abandoned_and_its_rule_fires_again(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    ns, node = cluster.namespace("resume-starved"), cluster.node()
    args = _killed_between_cordon_and_evict(
        cluster=cluster, ns=ns, node=node, tmp_path=tmp_path, proxied=proxied
    )
    listing = proxied.hold("GET", pod_list_request(node), times=100)  # every LIST, retries included
    wait = [*args, "--remediation.pod-list-wait=2s"]
    with running_agent(args=wait, log_path=tmp_path / "agent-2.log") as base:
        (incident,) = wait_until("the abandon", lambda: incidents(base), timeout=30, step=0.05)
        full = json.loads(get(f"{base}/incidents/{incident['id']}")[1])
        assert full["resumed"] == 1
        assert f"after 2s the pod list of {node} has not been listed" in full["abandoned"]
        assert full["steps_not_run"] == ["evict"]
        assert [(a["action"], a["outcome"]) for a in full["actions"]] == [
            ("cordon", "done"),
            ("evict", "refused"),
        ]
        events = cluster.events("default", name=node, reason="NodeguardEvictRefused")
        assert events and "has not been listed" in events[0].message
        # Nothing was planned: no 5 m cooldown, no maxFirings (1 an hour) spent. It fires again
        # (and waits again) while the cordon stays, its undo owed.
        wait_until(
            "slab-high to fire again",
            lambda: metric_value(
                base, "nodeguard_rule_firings_total", rule="slab-high", kind="firing"
            ),
            timeout=30,
            step=0.05,
        )
        assert evicted_pods(cluster, ns, ["hog", "idle"]) == []
        assert cordoned(cluster.core.read_node(node))
        listing.release()  # the pod list at last: the firing under way evicts the right pod
        wait_until(
            "the eviction",
            lambda: evicted_pods(cluster, ns, ["hog", "idle"]) == ["hog"],
            timeout=30,
            step=0.05,
        )


def test_the_first_firing_after_a_start_waits_for_the_pod_list_too(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    # No restart of a runbook: slab-high holds on the agent's first sample, before its pod list.
    ns, node = cluster.namespace("first-firing"), cluster.node()
    host = starved_host(tmp_path, cluster, ns, node)
    meminfo = host / "proc" / "meminfo"
    meminfo.write_text(meminfo.read_text().replace(SLAB_LOW, SLAB_HIGH))
    args = host_args(host, tmp_path, node=node, kubeconfig=proxied.kubeconfig)
    listing = proxied.hold("GET", pod_list_request(node), times=2)
    with running_agent(args=args, log_path=tmp_path / "agent.log") as base:
        listing.wait_hit()
        wait_until(
            "the cordon", lambda: cordoned(cluster.core.read_node(node)), timeout=30, step=0.05
        )
        time.sleep(2)
        assert incidents(base) == []  # its eviction waits
        listing.release()
        (incident,) = wait_until("the runbook", lambda: incidents(base), timeout=30, step=0.05)
        full = json.loads(get(f"{base}/incidents/{incident['id']}")[1])
    assert [(a["action"], a["outcome"]) for a in full["actions"]] == [
        ("cordon", "done"),
        ("evict", "done"),
    ]
    (evicted,) = full["actions"][1]["details"]["evicted"]
    assert evicted["pods"] == [f"{ns}/hog"] and evicted["usage_bytes"] == 1843 * MiB
    assert evicted_pods(cluster, ns, ["hog", "idle"]) == ["hog"]
