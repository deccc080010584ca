"""``nodeguard snapshot``: take one sample and print it as a report (``--json``: the same as
JSON, in bytes and seconds).

With a cluster (``--kubeconfig``, or the pod's ServiceAccount inside the DaemonSet) the node's
pods are listed once, so containers are named ``namespace/pod`` and ``container`` as in
``/metrics``; without one they show as pod UIDs and container IDs. A one-off snapshot keeps no
state: it never moves the running agent's kernel-log position.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys

from nodeguard.cli.console import stdout_console
from nodeguard.cli.flags import add_host, add_json, add_kubeconfig, add_log_level, sampler_config
from nodeguard.kube.client import KubeClient
from nodeguard.kube.config import cluster_named
from nodeguard.kube.errors import KubeError
from nodeguard.kube.watch import PodWatcher
from nodeguard.report import render_report
from nodeguard.sampling.sampler import Sampler
from nodeguard.snapshot import NodeSnapshot, to_jsonable

__all__ = ["add_arguments", "run", "take"]

log = logging.getLogger("nodeguard")

HELP = "take one sample and print it (tables, or --json)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``nodeguard snapshot``."""
    add_host(parser)
    add_kubeconfig(parser, used_for="pod and container names", home=True)
    add_json(parser, what="the snapshot")
    add_log_level(parser, default="warning")


def _pods(args: argparse.Namespace) -> PodWatcher | None:
    """This node's pods, listed once; ``None`` without a cluster or when the list fails (said
    in one line: the report is still worth having)."""
    if not cluster_named(kubeconfig=args.kubeconfig, home=True):
        return None
    try:
        kube = KubeClient.load(kubeconfig=args.kubeconfig)
    except KubeError as exc:
        log.warning("pod names unknown: %s", exc)
        return None
    watcher = PodWatcher(kube=kube, node_name=args.node_name)
    try:
        asyncio.run(watcher.list_once())
    except KubeError as exc:
        log.warning("pod names unknown: cannot list the pods of %s: %s", args.node_name, exc)
        return None
    finally:
        kube.close()
    return watcher


def take(args: argparse.Namespace) -> NodeSnapshot:
    """One snapshot with the flags' settings (pods named where a cluster is at hand)."""
    sampler = Sampler(config=sampler_config(args, state=None, interval=5.0), cluster=_pods(args))
    try:
        return sampler.sample_once()
    finally:
        sampler.close()


def run(args: argparse.Namespace) -> int:
    """Print one snapshot: 0, or 1 when a collector failed (each failure is one log line on
    stderr; what the others read is still printed). "No data" (PSI off, no GPU) is not a
    failure."""
    snap = take(args)
    failed = any(not c.success for c in snap.collectors)
    try:
        if args.json:
            json.dump(to_jsonable(snap), sys.stdout, indent=1)
            sys.stdout.write("\n")
        else:
            render_report(snap, console=stdout_console(), top=args.top_processes)
        sys.stdout.flush()
    except BrokenPipeError:
        # `nodeguard snapshot --json | head`: the reader has what it wanted. Python would
        # report the pipe again when it flushes stdout at exit: point stdout at /dev/null.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1 if failed else 0
