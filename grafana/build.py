"""Builds nodeguard's Grafana dashboards (JSON, schemaVersion 39) into this directory.

    python grafana/build.py        # rewrites grafana/*.json

The JSON is committed (import it in Grafana, or mount it with a dashboard provider);
tests/agent/test_promtool_and_dashboards.py checks it, and the end-to-end test runs every query against a real
Prometheus scraping nodeguard. Variables: ``datasource`` (a Prometheus data source), ``node``
(from ``nodeguard_node_info``) and the hidden ``instance`` that ``node`` selects, which every
query filters on, so no query depends on how the scrape config labels targets.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'instance=~"$instance"'


def _variables() -> list[dict[str, Any]]:
    return [
        {
            "name": "datasource",
            "type": "datasource",
            "query": "prometheus",
            "label": "Data source",
            "current": {},
            "hide": 0,
        },
        {
            "name": "node",
            "type": "query",
            "datasource": DS,
            "label": "Node",
            "query": {"query": "label_values(nodeguard_node_info, node)", "refId": "node"},
            "definition": "label_values(nodeguard_node_info, node)",
            "refresh": 2,
            "includeAll": True,
            "multi": True,
            "current": {},
            "sort": 1,
            "hide": 0,
        },
        {
            "name": "instance",
            "type": "query",
            "datasource": DS,
            "label": "Instance",
            "query": {
                "query": 'label_values(nodeguard_node_info{node=~"$node"}, instance)',
                "refId": "instance",
            },
            "definition": 'label_values(nodeguard_node_info{node=~"$node"}, instance)',
            "refresh": 2,
            "includeAll": True,
            "multi": True,
            "current": {},
            "hide": 2,
        },
    ]


def _panel(
    pid: int,
    title: str,
    targets: list[tuple[str, str]],
    *,
    unit: str,
    x: int,
    y: int,
    w: int = 12,
    h: int = 8,
    kind: str = "timeseries",
    stack: bool = False,
    description: str = "",
) -> dict[str, Any]:
    custom: dict[str, Any] = {"lineWidth": 1, "fillOpacity": 10}
    if stack:
        custom.update(stacking={"mode": "normal", "group": "A"}, fillOpacity=60)
    panel: dict[str, Any] = {
        "id": pid,
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {
            "legend": {
                "displayMode": "table",
                "placement": "bottom",
                "calcs": ["lastNotNull", "max"],
            }
        },
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DS,
                "expr": expr,
                "legendFormat": legend,
                **({"format": "table", "instant": True} if kind == "table" else {}),
            }
            for i, (expr, legend) in enumerate(targets)
        ],
    }
    if kind == "timeseries":
        panel["fieldConfig"]["defaults"]["custom"] = custom
    if kind == "table":
        panel["options"] = {"sortBy": [{"displayName": "Value", "desc": True}]}
    return panel


def _dashboard(
    uid: str, title: str, panels: list[dict[str, Any]], tags: list[str]
) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "tags": ["nodeguard", *tags],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "templating": {"list": _variables()},
        "annotations": {"list": []},
        "panels": panels,
    }


def node_memory() -> dict[str, Any]:
    """Node memory: breakdown, PSI, containers against limits, OOM kills, overcommit, GPU,
    the doctor's findings on the node."""
    p = [
        _panel(
            1,
            "Node memory breakdown",
            [
                (
                    f"nodeguard_node_memory_used_bytes{{{SEL}}} - nodeguard_node_memory_slab_unreclaimable_bytes{{{SEL}}}",
                    "used (excl. unreclaimable slab) {{instance}}",
                ),
                (
                    f"nodeguard_node_memory_slab_unreclaimable_bytes{{{SEL}}}",
                    "slab unreclaimable {{instance}}",
                ),
                (
                    f"nodeguard_node_memory_slab_reclaimable_bytes{{{SEL}}}",
                    "slab reclaimable {{instance}}",
                ),
                (f"nodeguard_node_memory_page_cache_bytes{{{SEL}}}", "page cache {{instance}}"),
                (f"nodeguard_node_memory_available_bytes{{{SEL}}}", "available {{instance}}"),
                (f"nodeguard_node_memory_hugetlb_bytes{{{SEL}}}", "hugetlb pool {{instance}}"),
            ],
            unit="bytes",
            x=0,
            y=0,
            w=16,
            h=9,
            description="Used is usable - MemAvailable, usable being MemTotal less the hugetlb "
            "pool (shown apart: never available) and HardwareCorrupted; slab reclaimable and page "
            "cache overlap with available.",
        ),
        _panel(
            2,
            "Available",
            [
                (
                    f"nodeguard_node_memory_available_bytes{{{SEL}}} / nodeguard_node_memory_usable_bytes{{{SEL}}}",
                    "{{instance}}",
                ),
            ],
            unit="percentunit",
            x=16,
            y=0,
            w=8,
            h=9,
            kind="stat",
            description="Share of usable memory (MemTotal less the hugetlb pool and "
            "HardwareCorrupted), as the node-memory-low rule takes it.",
        ),
        _panel(
            3,
            "Memory pressure (PSI)",
            [
                (
                    f'nodeguard_node_memory_pressure_ratio{{{SEL}, window="10s"}}',
                    "{{kind}} avg10 {{instance}}",
                ),
                (
                    f'nodeguard_node_memory_pressure_ratio{{{SEL}, window="60s"}}',
                    "{{kind}} avg60 {{instance}}",
                ),
            ],
            unit="percentunit",
            x=0,
            y=9,
            description="Share of time some (or all, full) tasks stalled waiting for memory.",
        ),
        _panel(
            4,
            "Slab unreclaimable share of usable RAM",
            [
                (
                    f"nodeguard_node_memory_slab_unreclaimable_bytes{{{SEL}}} / nodeguard_node_memory_usable_bytes{{{SEL}}}",
                    "{{instance}}",
                ),
            ],
            unit="percentunit",
            x=12,
            y=9,
            description="Above 30% for long is a kernel or driver leak: eviction does not help.",
        ),
        _panel(
            5,
            "Containers nearest an OOM kill (unreclaimable / limit)",
            [
                (
                    f"topk(15, nodeguard_container_memory_unreclaimable_bytes{{{SEL}}} / nodeguard_container_memory_limit_bytes{{{SEL}}})",
                    "",
                ),
            ],
            unit="percentunit",
            x=0,
            y=17,
            kind="table",
            description="Page cache left out: the kernel reclaims it before it OOM-kills, so a "
            "working set at the limit made of cache is no OOM on its way. What container-near-limit acts on.",
        ),
        _panel(
            6,
            "Largest container working sets",
            [
                (
                    f"topk(10, nodeguard_container_memory_working_set_bytes{{{SEL}}})",
                    "{{namespace}}/{{pod}} {{container}}",
                ),
                (
                    f"topk(10, nodeguard_container_memory_unreclaimable_bytes{{{SEL}}})",
                    "unreclaimable {{namespace}}/{{pod}} {{container}}",
                ),
            ],
            unit="bytes",
            x=12,
            y=17,
        ),
        _panel(
            7,
            "OOM kills",
            [
                (
                    f"sum by (instance, constraint) (increase(nodeguard_node_oom_kills_total{{{SEL}}}[$__rate_interval]))",
                    "kernel log {{constraint}} {{instance}}",
                ),
                (
                    f"sum by (namespace, pod, container) (increase(nodeguard_container_memory_oom_kills_total{{{SEL}}}[$__rate_interval]))",
                    "{{namespace}}/{{pod}} {{container}}",
                ),
            ],
            unit="short",
            x=0,
            y=25,
        ),
        _panel(
            8,
            "Requests and limits against allocatable",
            [
                (f"nodeguard_node_memory_allocatable_bytes{{{SEL}}}", "allocatable {{instance}}"),
                (f"nodeguard_node_memory_requests_bytes{{{SEL}}}", "requests {{instance}}"),
                (f"nodeguard_node_memory_limits_bytes{{{SEL}}}", "limits {{instance}}"),
            ],
            unit="bytes",
            x=12,
            y=25,
            description="Limits above allocatable is overcommit: the node relies on pods not "
            "using their limits at once.",
        ),
        _panel(
            9,
            "GPU memory by device",
            [
                (
                    f"nodeguard_gpu_memory_used_bytes{{{SEL}}}",
                    "used GPU {{gpu}} {{model}} {{instance}}",
                ),
                (f"nodeguard_gpu_memory_total_bytes{{{SEL}}}", "total GPU {{gpu}} {{instance}}"),
            ],
            unit="bytes",
            x=0,
            y=33,
        ),
        _panel(
            10,
            "GPU memory by pod",
            [
                (
                    f"sum by (namespace, pod) (nodeguard_gpu_container_memory_used_bytes{{{SEL}}})",
                    "{{namespace}}/{{pod}}",
                ),
            ],
            unit="bytes",
            x=12,
            y=33,
        ),
        _panel(
            12,
            "Node stall outside cgroups at their own limit",
            [
                (
                    f'nodeguard_node_memory_pressure_ratio{{{SEL}, kind="full", window="10s"}} * ignoring(kind, window) nodeguard_node_memory_stall_outside_limits_ratio{{{SEL}}}',
                    "node's own full avg10 {{instance}}",
                ),
                (
                    f'nodeguard_node_memory_pressure_ratio{{{SEL}, kind="full", window="10s"}}',
                    "all full avg10 {{instance}}",
                ),
                (
                    f'topk(5, rate(nodeguard_container_memory_pressure_stall_seconds_total{{{SEL}, kind="full"}}[$__rate_interval]))',
                    "{{namespace}}/{{pod}} {{container}}",
                ),
            ],
            unit="percentunit",
            x=0,
            y=41,
            description="Node PSI full counts tasks reclaiming inside their own cgroup's limit "
            "too: the node's own share is what cgroups at their limit do not explain "
            "(memory-pressure-high acts on it above 10 %, with direct reclaim above 256 KiB/s). "
            "Containers "
            "stalling most, by their own PSI (cgroup v2).",
        ),
        _panel(
            13,
            "Global reclaim",
            [
                (
                    f"rate(nodeguard_node_vmstat_pgscan_bytes_total{{{SEL}}}[$__rate_interval])",
                    "scanned by {{reclaimer}} {{instance}}",
                ),
                (
                    f"rate(nodeguard_node_vmstat_pgsteal_bytes_total{{{SEL}}}[$__rate_interval])",
                    "reclaimed by {{reclaimer}} {{instance}}",
                ),
            ],
            unit="binBps",
            x=12,
            y=41,
            description="/proc/vmstat: kswapd dropping page cache in the background is the "
            "kernel at work; direct reclaim is allocations reclaiming for themselves, the node "
            "short of free memory (memory-pressure-high needs it above 256 KiB/s). Reclaim at a "
            "cgroup's own limit is not counted here.",
        ),
        _panel(
            11,
            "Collectors",
            [
                (f"nodeguard_collector_success{{{SEL}}}", "success {{collector}} {{instance}}"),
                (
                    f"nodeguard_collector_duration_seconds{{{SEL}}}",
                    "duration {{collector}} {{instance}}",
                ),
            ],
            unit="short",
            x=0,
            y=49,
            w=24,
        ),
        _panel(
            14,
            "Posture findings",
            [
                (
                    f"nodeguard_posture_findings{{{SEL}}} * on (instance, job) group_left (node) nodeguard_node_info{{{SEL}}}",
                    "{{node}} {{check}} {{severity}}",
                ),
            ],
            unit="short",
            x=0,
            y=57,
            w=24,
            kind="table",
            description="Findings of nodeguard doctor's node checks (unbounded-memory, "
            "overcommit, node-reserve) on each node's pods and Node, by check and severity, as "
            "its agent evaluates them every --posture.interval (1m); 0 is none found. "
            "`nodeguard doctor --node NODE` names the objects and the fix. A node without rows "
            "has an agent without Kubernetes access.",
        ),
        _panel(
            15,
            "Katib trials: working set by trial (legend max: each trial's peak)",
            [
                (
                    "max by (namespace, katib_experiment, katib_trial) ("
                    f"nodeguard_pod_memory_working_set_bytes{{{SEL}}} "
                    "* on (instance, job, namespace, pod) group_left (katib_experiment, katib_trial) "
                    f'nodeguard_pod_info{{{SEL}, katib_trial!=""}})',
                    "{{namespace}}/{{katib_experiment}} {{katib_trial}}",
                )
            ],
            unit="bytes",
            x=0,
            y=65,
            w=24,
            description="The largest working set of each Katib trial's pods on these nodes "
            "(nodeguard_pod_info names a trial pod's experiment and trial; the recording rule "
            "katib_trial:nodeguard_pod_memory_working_set_bytes:max is the same across every "
            "node). `nodeguard trials NAMESPACE/EXPERIMENT` has each trial's peak beside its "
            "hyperparameters and the request to set per value.",
        ),
    ]
    return _dashboard("nodeguard-node-memory", "nodeguard / Node memory", p, ["memory"])


def remediation() -> dict[str, Any]:
    """Remediation: rule firings, actions by outcome and dry run, webhook alerts, incidents."""
    p = [
        _panel(
            1,
            "Rule firings",
            [
                (
                    f"sum by (rule, kind) (increase(nodeguard_rule_firings_total{{{SEL}}}[$__rate_interval]))",
                    "{{rule}} {{kind}}",
                ),
            ],
            unit="short",
            x=0,
            y=0,
        ),
        _panel(
            2,
            "Targets per rule",
            [
                (f"sum by (rule, state) (nodeguard_rule_targets{{{SEL}}})", "{{rule}} {{state}}"),
            ],
            unit="short",
            x=12,
            y=0,
        ),
        _panel(
            3,
            "Actions by outcome (and dry run)",
            [
                (
                    f"sum by (action, outcome, dry_run) (increase(nodeguard_actions_total{{{SEL}}}[$__rate_interval]))",
                    "{{action}} {{outcome}} dry_run={{dry_run}}",
                ),
            ],
            unit="short",
            x=0,
            y=8,
            w=24,
        ),
        _panel(
            4,
            "Alertmanager alerts received",
            [
                (
                    f"sum by (status, outcome) (increase(nodeguard_webhook_alerts_total{{{SEL}}}[$__rate_interval]))",
                    "{{status}} {{outcome}}",
                ),
                (
                    f"sum by (code) (increase(nodeguard_webhook_requests_total{{{SEL}}}[$__rate_interval]))",
                    "HTTP {{code}}",
                ),
            ],
            unit="short",
            x=0,
            y=16,
        ),
        _panel(
            5,
            "Incidents recorded",
            [
                (
                    f"sum by (instance) (increase(nodeguard_incidents_total{{{SEL}}}[$__rate_interval]))",
                    "{{instance}}",
                ),
            ],
            unit="short",
            x=12,
            y=16,
        ),
        _panel(
            6,
            "Firings held back",
            [
                (
                    f"sum by (rule, reason) (increase(nodeguard_rule_suppressed_total{{{SEL}}}[$__rate_interval]))",
                    "{{rule}} {{reason}}",
                ),
            ],
            unit="short",
            x=0,
            y=24,
            description="cooldown, cap (maxFirings), queue_full or state_not_persisted: not acted on.",
        ),
        _panel(
            7,
            "Remediation queue",
            [
                (f"nodeguard_remediation_queue_length{{{SEL}}}", "queued {{instance}}"),
                (f"nodeguard_remediation_in_flight{{{SEL}}}", "in flight {{instance}}"),
            ],
            unit="short",
            x=12,
            y=24,
        ),
        _panel(
            8,
            "Rules",
            [
                (f"nodeguard_rules_loaded{{{SEL}}}", "loaded {{instance}}"),
                (f"nodeguard_rules_reload_errors_total{{{SEL}}}", "reload errors {{instance}}"),
            ],
            unit="short",
            x=0,
            y=32,
            w=24,
        ),
    ]
    return _dashboard("nodeguard-remediation", "nodeguard / Remediation", p, ["remediation"])


def main() -> None:
    for name, board in (("node-memory", node_memory()), ("remediation", remediation())):
        path = HERE / f"nodeguard-{name}.json"
        path.write_text(json.dumps(board, indent=2) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
