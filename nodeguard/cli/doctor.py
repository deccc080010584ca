"""``nodeguard doctor``: the cluster's memory posture for ML training, read-only.

Reads Nodes, Pods, ResourceQuotas and LimitRanges once (:mod:`nodeguard.doctor.read`; the
RBAC it needs is ``docs/doctor-rbac.yaml``), runs every registered check
(:mod:`nodeguard.doctor.registry`) and prints the findings as a table at 80 columns grouped by
severity, or with ``--json`` as a JSON object (``findings``: each with ``check``, ``severity``,
``title``, ``objects``, ``evidence`` in bytes and ``fix``; ``worst``;
``exit_status``). ``--namespace`` and ``--node`` (each repeatable) narrow what is checked: a
namespace alone brings the nodes its pods run on, a node alone the namespaces of its pods; a
node's sums always count every pod on it.

Exit status: 0 when no finding is at or above ``--fail-on`` (default ``error``); 1 when one is;
2 bad flags; 3 the cluster could not be read (no configuration, the API server unreachable or
refusing: the message says which); 4 a ``--node`` or ``--namespace`` does not exist.

Notes on what could not be read (the kubelets' ``configz`` without ``nodes/proxy``, the
agents' rules ConfigMap without ``get configmaps``) go to stderr, once each, as kubectl prints
its warnings, so the table and the JSON hold the findings alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from nodeguard.cli.agent_flags import agent_settings
from nodeguard.cli.flags import add_json, add_kubeconfig, add_log_level
from nodeguard.doctor.findings import SEVERITIES, Finding, worst
from nodeguard.doctor.read import read_cluster
from nodeguard.doctor.registry import run_checks
from nodeguard.doctor.table import render
from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import KubeError, NotFound

__all__ = ["EXIT_FINDINGS", "add_arguments", "exit_status", "run"]

HELP = "check the cluster's memory posture for ML training (read-only)"
EPILOG = (
    "exit status: 0 no finding at or above --fail-on; 1 a finding at or above it; 2 bad "
    "flags; 3 the cluster could not be read (no kubeconfig, the API server unreachable or "
    "refusing); 4 a --node or --namespace does not exist. The RBAC it needs: docs/doctor-rbac.yaml"
)
EXIT_OK, EXIT_FINDINGS, EXIT_UNREADABLE, EXIT_NOT_FOUND = 0, 1, 3, 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``nodeguard doctor``."""
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NAMESPACE",
        help="check only this namespace's pods, quotas and LimitRanges, and the nodes its pods "
        "run on (repeatable; default: every namespace)",
    )
    parser.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="NODE",
        help="check only this node, its pods and (without --namespace) their namespaces' "
        "quotas and LimitRanges (repeatable; default: every node)",
    )
    parser.add_argument(
        "--fail-on",
        choices=("warning", "error"),
        default="error",
        help="the least severe finding that makes the exit status 1 (default error)",
    )
    add_json(parser, what="the findings")
    add_kubeconfig(parser, used_for="reading the cluster", home=True)
    add_log_level(parser, default="warning")


def exit_status(findings: list[Finding], *, fail_on: str) -> int:
    """1 when a finding is at least as severe as ``fail_on``, else 0."""
    most = worst(findings)
    if most is not None and SEVERITIES.index(most) >= SEVERITIES.index(fail_on):
        return EXIT_FINDINGS
    return EXIT_OK


async def _doctor(args: argparse.Namespace) -> list[Finding]:
    kube = KubeClient.load(kubeconfig=args.kubeconfig)
    try:
        cluster = await read_cluster(
            kube, namespaces=args.namespace, nodes=args.node, agent_flags=agent_settings
        )
    finally:
        kube.close()
    # What could not be read (a refused configz, a ConfigMap), once each, where kubectl puts
    # its warnings: stderr keeps the table and the JSON the findings alone.
    for note in cluster.notes:
        sys.stderr.write(f"nodeguard doctor: note: {note}\n")
    return run_checks(cluster)


def run(args: argparse.Namespace) -> int:
    """Run ``nodeguard doctor``; the exit status (see the module docstring)."""
    try:
        findings = asyncio.run(_doctor(args))
    except NotFound as exc:
        sys.stderr.write(f"nodeguard doctor: not found: {exc}\n")
        return EXIT_NOT_FOUND
    except KubeError as exc:
        http = f" (HTTP {exc.status})" if exc.status else ""
        sys.stderr.write(f"nodeguard doctor: cannot read the cluster: {exc}{http}\n")
        return EXIT_UNREADABLE
    status = exit_status(findings, fail_on=args.fail_on)
    if args.json:
        json.dump(
            {
                "findings": [f.to_json() for f in findings],
                "worst": worst(findings),
                "exit_status": status,
            },
            sys.stdout,
            indent=1,
        )
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(findings))
    return status
