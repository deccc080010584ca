"""``nodeguard act evict`` cut short: every pod its run evicted has its Event, whatever the
moment it stops (issue 22, point 6). Each eviction's Event is written as soon as that eviction
is done, before the next one: a run SIGKILLed between two members of a gang leaves no
evicted pod without its Event."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.agent import wait_until
from tests.support.controlplane.cluster import TestCluster
from tests.support.kube_helpers import Cluster
from tests.support.remediation import evicted_pods, katib_gang


def test_act_evict_killed_between_two_members_leaves_no_eviction_without_its_event(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path, proxied: Any
) -> None:
    ns, node, other = cluster.namespace("act-cut"), cluster.node(), cluster.node()
    names = katib_gang(cluster, ns, node, other)
    # The first member's real eviction goes through; the second's is held on the wire.
    second = proxied.hold("POST", r"/pods/t1-\w+/eviction(?!.*dryRun)", skip=1)
    act = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nodeguard",
            "act",
            "evict",
            f"--node={node}",
            "--free=0",
            f"--kubeconfig={proxied.kubeconfig}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        second.wait_hit(timeout=60)
        (first,) = evicted_pods(cluster, ns, names)
        os.kill(act.pid, signal.SIGKILL)
        act.wait(timeout=30)
    finally:
        if act.poll() is None:
            act.kill()
            act.wait()
    second.drop()
    assert act.returncode == -signal.SIGKILL
    # The pod it evicted before it died has its Event, written before the next eviction.
    (event,) = wait_until(
        "the first member's Event",
        lambda: cluster.events(ns, name=first, reason="NodeguardEvicted"),
        timeout=10,
    )
    assert f"evicted {ns}/{first} from {node}" in event.message
    assert (
        cluster.events(
            ns, name="t1-worker" if first == "t1-master" else "t1-master", reason="NodeguardEvicted"
        )
        == []
    )
