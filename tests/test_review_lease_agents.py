"""Review of issue 22 point 3 (one agent acts for a node) with real agent processes against the
test kube-apiserver: reproducers that FAIL on the merged code (see
tests/test_review_lease_actor.py for the ones on the Lease itself)."""

from __future__ import annotations

from pathlib import Path

from tests.agent import running_agent
from tests.controlplane.cluster import TestCluster
from tests.kube_helpers import Cluster
from tests.test_one_actor import EVICT_ONE, _args, _incidents, _state
from tests.test_restarts import _evicted, _metric, _pods, _rules, _until


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
    names = _pods(cluster, ns, node, 3)
    rules = _rules(tmp_path, actions=EVICT_ONE)
    kubeconfig = control_plane.kubeconfig_path
    dry = [*_args(tmp_path, "agent-d", node=node, kubeconfig=kubeconfig, rules=rules), "--dry-run"]
    real = _args(tmp_path, "agent-r", node=node, kubeconfig=kubeconfig, rules=rules)
    with running_agent(args=dry, log_path=tmp_path / "agent-d.log") as d:
        _until("the dry-run agent to act", lambda: _state(d, "actor") == 1.0)
        _until("its dry-run runbook", lambda: _incidents(d))
        with running_agent(args=real, log_path=tmp_path / "agent-r.log") as r:
            _until("the real agent to take the node", lambda: _state(r, "actor") == 1.0)
            mark = _metric(r, "nodeguard_sampler_samples_total")
            _until(
                "50 more samples",
                lambda: _metric(r, "nodeguard_sampler_samples_total") >= mark + 50,
            )
            assert _state(d, "observer") == 1.0
            assert len(_evicted(cluster, ns, names)) == 1
