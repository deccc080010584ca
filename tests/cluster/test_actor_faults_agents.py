"""Faults of one agent acting for a node (issue 22 point 3), with real agent processes against
the test kube-apiserver (tests/cluster/test_actor_faults.py has the ones on the Lease itself)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from nodeguard.remediation.actor import lease_name
from tests.support.agent import running_agent, wait_until
from tests.support.controlplane.cluster import TestCluster
from tests.support.kube_helpers import Cluster
from tests.support.remediation import (
    EVICT_ONE,
    actor_args,
    actor_state,
    evicted_events,
    evicted_pods,
    incidents,
    low_priority_pods,
    metric_value,
    slab_rules,
)


def test_a_real_agent_started_beside_a_dry_run_agent_acts(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path
) -> None:
    """A dry-run agent holds the node (a trial DaemonSet beside the real one, a debug copy);
    the real agent starts and takes the Lease at once (as designed), but records the takeover
    as ``lapsed`` and so ``engine.assume_recent``: every rule waits its cooldown and has a
    firing counted against ``maxFirings`` (here 1/1h): the real agent evicts nothing for an
    hour while the node stays short. The dry-run holder sent nothing destructive (no fence
    in dry run): should act at once, as a real agent started alone does (one pod due)."""
    ns, node = cluster.namespace("dry-then-real"), cluster.node()
    names = low_priority_pods(cluster, ns, node, 3)
    rules = slab_rules(tmp_path, actions=EVICT_ONE)
    kubeconfig = control_plane.kubeconfig_path
    dry = [
        *actor_args(tmp_path, "agent-d", node=node, kubeconfig=kubeconfig, rules=rules),
        "--dry-run",
    ]
    real = actor_args(tmp_path, "agent-r", node=node, kubeconfig=kubeconfig, rules=rules)
    with running_agent(args=dry, log_path=tmp_path / "agent-d.log") as d:
        wait_until(
            "the dry-run agent to act",
            lambda: actor_state(d, "actor") == 1.0,
            timeout=30,
            step=0.05,
        )
        wait_until("its dry-run runbook", lambda: incidents(d), timeout=30, step=0.05)
        with running_agent(args=real, log_path=tmp_path / "agent-r.log") as r:
            wait_until(
                "the real agent to take the node",
                lambda: actor_state(r, "actor") == 1.0,
                timeout=30,
                step=0.05,
            )
            mark = metric_value(r, "nodeguard_sampler_samples_total")
            wait_until(
                "50 more samples",
                lambda: metric_value(r, "nodeguard_sampler_samples_total") >= mark + 50,
                timeout=30,
                step=0.05,
            )
            assert actor_state(d, "observer") == 1.0
            assert len(evicted_pods(cluster, ns, names)) == 1


def test_an_actor_paused_in_its_fence_and_resumed_after_the_takeover_sends_nothing(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    """Agent a's fence (the renewal right before its eviction) reaches the API server; a is
    SIGSTOPped before it reads the answer (a long GC pause, a frozen container, a throttled
    cgroup). b sees that renewal stay unchanged for a whole lease and takes the node over, and
    finishes a's unit from the mirrored journal. a is resumed (SIGCONT) and reads the answer.

    Before, a's fence returns (the write succeeded; the renew deadline is not looked at after
    it), and a sends its eviction and records it: a second NodeguardEvicted Event and a second
    incident for one unit, from an agent that no longer holds the node. Should: a's fence
    raises Fenced (its answer came after ``sent + 2/3 lease``), a sends and records nothing."""
    ns, node = cluster.namespace("paused"), cluster.node()
    names = low_priority_pods(cluster, ns, node, 3)
    rules = slab_rules(tmp_path, actions=EVICT_ONE)
    lease = "--actor.lease-duration=6"  # renewals every 2 s: the fence is the first PUT
    a_args = [
        *actor_args(tmp_path, "agent-a", node=node, kubeconfig=proxied.kubeconfig, rules=rules)
    ]
    b_args = [
        *actor_args(
            tmp_path, "agent-b", node=node, kubeconfig=control_plane.kubeconfig_path, rules=rules
        )
    ]
    held = proxied.hold("PUT", rf"/leases/{lease_name(node)}$", after=True)
    with running_agent(args=[*a_args, lease], log_path=tmp_path / "agent-a.log") as a:
        held.wait_hit()
        os.kill(a.pid, signal.SIGSTOP)
        held.release()  # the answer waits in a's socket
        with running_agent(args=[*b_args, lease], log_path=tmp_path / "agent-b.log") as b:
            wait_until(
                "b to take the node", lambda: actor_state(b, "actor") == 1.0, timeout=60, step=0.05
            )
            wait_until("b's runbook", lambda: incidents(b), timeout=60, step=0.05)
            os.kill(a.pid, signal.SIGCONT)
            mark = metric_value(a, "nodeguard_sampler_samples_total")
            wait_until(
                "a to sample 30 more times",
                lambda: metric_value(a, "nodeguard_sampler_samples_total") >= mark + 30,
                timeout=30,
                step=0.05,
            )
            after = [m for m, p in proxied.seen if "eviction" in p]
            found = (
                len(evicted_pods(cluster, ns, names)),
                after,
                evicted_events(cluster, ns, names),
                len(incidents(a)) + len(incidents(b)),
            )
    # (pods evicted, evictions a sent after b took the node, Events, incidents)
    assert found == (1, [], 1, 1)
