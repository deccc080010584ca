"""One incident record as a self-contained HTML page: ``nodeguard incidents ID --html FILE``
and ``GET /incidents/ID.html``.

The page needs no network: Chart.js (vendored, ``static/``, :mod:`importlib.resources`) and the
page's own script are inlined, and the record itself is embedded whole as JSON in
``<script type="application/json" id="nodeguard-record">`` (every ``<`` written ``\\u003c``, so
no name in it, a pod called ``</script>`` included, can end the element). Every text from the
record is HTML-escaped. It shows:

- what happened: for an OOM kill (kind ``oom_kill``) the victim (pod, container, process,
  the constraint, its limit, request, QoS class and priority), the node, the time (UTC) and
  the firings linked to it (how long before the kill each acted, or that it did not: a dry
  run); for a firing, its rule, target, values, each action's outcome and ``killed_later``;
- two charts over the record's ``timeline``, x in seconds from the incident
  (:mod:`nodeguard.remediation.incident_charts`): the node's memory stacked by kind, and the
  containers' working sets with the victim's limit and the events as lines of their own;
  without a timeline, a line that says so;
- the node's memory, the largest containers and GPU memory by device, as the evidence has
  them.

The page is a function of the record alone (no clock, no host): the same record gives the
same bytes, from the command line and from the agent.
"""

from __future__ import annotations

import functools
import html
import json
from collections.abc import Iterable, Mapping
from importlib import resources
from typing import Any

from nodeguard.remediation.incident_charts import chart_specs, when
from nodeguard.snapshot import NODE_MEMORY_BREAKDOWN
from nodeguard.units import format_bytes

__all__ = ["page"]

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1140px;
       color: #1d1d1f; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
.summary { font-size: 16px; margin: 0 0 12px; }
table { border-collapse: collapse; margin: 4px 0 12px; }
th, td { text-align: left; padding: 3px 12px 3px 0; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
table.grid th { border-bottom: 1px solid #bbb; } table.grid td { border-bottom: 1px solid #eee; }
table.facts th { color: #555; font-weight: 500; white-space: nowrap; }
.chart { position: relative; height: 380px; margin: 8px 0 16px; }
.note, .none { color: #555; } code, .id { font-family: ui-monospace, monospace; font-size: 12px; }
"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
{body}
<script type="application/json" id="nodeguard-record">{record}</script>
<script type="application/json" id="nodeguard-charts">{charts}</script>
<script>{chartjs}</script>
<script>{script}</script>
</body>
</html>
"""


@functools.cache
def _static(name: str) -> str:
    """A file of ``static/``, checked to be safe to inline in a ``<script>`` element."""
    text = resources.files("nodeguard.remediation").joinpath("static", name).read_text("utf-8")
    if "</script" in text.lower() or "<!--" in text:
        raise ValueError(f"static/{name} cannot be inlined in a <script> element")
    return text


def _json(value: Any) -> str:
    """``value`` as JSON to embed in a ``<script>`` element: ``<`` escaped."""
    return json.dumps(value, default=str, separators=(",", ":")).replace("<", "\\u003c")


def _e(value: Any) -> str:
    return html.escape(str(value))


def _bytes(value: Any) -> str:
    return format_bytes(value) if isinstance(value, int) else "-"


def _facts(rows: Iterable[tuple[str, Any]]) -> str:
    """A table of ``(name, value)`` rows, a row left out where its value is ``None``."""
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows if v is not None)
    return f'<table class="facts">{body}</table>'


def _grid(head: Iterable[str], rows: Iterable[Iterable[Any]], *, numeric: set[int]) -> str:
    """A table with a header row; the columns of ``numeric`` right-aligned."""
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    trs = "".join(
        "<tr>"
        + "".join(f"<td{' class=n' if i in numeric else ''}>{_e(v)}</td>" for i, v in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f'<table class="grid"><tr>{th}</tr>{trs}</table>'


def _link(link: Mapping[str, Any]) -> str:
    """One firing linked to a kill: when before it, and what it did."""
    ahead = f"{float(link.get('seconds_before_kill') or 0):.1f} s"
    actions = "; ".join(link.get("actions") or []) or "no action"
    if link.get("dry_run"):
        did = f"fired {ahead} before the kill; no action: dry run ({actions})"
    elif link.get("acted"):
        did = f"acted {ahead} before the kernel ({actions})"
    else:
        did = f"fired {ahead} before the kill; nothing done ({actions})"
    return f"<li><b>{_e(link.get('rule'))}</b> {_e(did)} <span class=id>{_e(link.get('id'))}</span>"


def _kill(record: Mapping[str, Any]) -> str:
    """The header of an OOM kill: the victim and what nodeguard had done about it."""
    v = record.get("victim") or {}
    where = {
        "CONSTRAINT_MEMCG": "a cgroup at its limit",
        "CONSTRAINT_NONE": "the node out of memory",
    }
    constraint = v.get("constraint")
    rows = [
        ("when", when(record)),
        ("node", record.get("node")),
        ("namespace", v.get("namespace")),
        ("pod", v.get("pod")),
        ("container", v.get("container")),
        ("process", f"{v.get('process')} (pid {v.get('pid')})"),
        ("constraint", f"{constraint} ({where.get(str(constraint), 'from the kernel log')})"),
        ("limit", _bytes(v.get("limit_bytes"))),
        ("request", _bytes(v.get("request_bytes"))),
        ("working set before", _bytes(v.get("working_set_bytes"))),
        (
            "RSS at the kill",
            f"anon {_bytes(v.get('anon_rss_bytes'))}, file "
            f"{_bytes(v.get('file_rss_bytes'))}, shmem {_bytes(v.get('shmem_rss_bytes'))}",
        ),
        ("QoS class", v.get("qos_class")),
        (
            "priority",
            None
            if v.get("priority") is None
            else f"{v['priority']} ({v.get('priority_class') or 'no class'})",
        ),
        ("cgroup", v.get("task_memcg")),
        ("id", record.get("id")),
    ]
    linked = record.get("linked") or []
    if record.get("sampled_before") is False:
        before = "<p>Not sampled: nodeguard read the kill from the kernel log later.</p>"
    elif not linked:
        before = "<p>No rule fired on it in the 10 minutes before.</p>"
    else:
        before = "<ul>" + "".join(_link(x) for x in linked) + "</ul>"
    return (
        f'<h1>OOM kill</h1><p class="summary">{_e(record.get("summary", ""))}</p>'
        f"{_facts(rows)}<h2>Before it: nodeguard's firings on it</h2>{before}"
    )


def _firing(record: Mapping[str, Any]) -> str:
    """The header of a firing: what fired, on what, and what was done."""
    mode = "dry run: nothing was changed" if record.get("dry_run") else "acted"
    rows: list[tuple[str, Any]] = [
        ("when", when(record)),
        ("node", record.get("node")),
        ("target", f"{record.get('scope')} {record.get('target')}"),
        ("source", f"{record.get('source')} ({mode})"),
    ]
    rows += [
        (f"value {k}", "no data" if x is None else f"{x:g}")
        for k, x in (record.get("values") or {}).items()
    ]
    rows.append(("id", record.get("id")))
    actions = record.get("actions") or []
    done = "".join(
        f"<li><b>{_e(a.get('action', '?'))}</b>: {_e(a.get('outcome', '?'))}"
        f"{' - ' + _e(a['message']) if a.get('message') else ''}"
        for a in actions
    )
    later = record.get("killed_later")
    then = (
        f"<p>Then the kernel OOM-killed it {float(later.get('seconds_after') or 0):.1f} s "
        f"later (<span class=id>{_e(later.get('id'))}</span>).</p>"
        if later
        else ""
    )
    return (
        f"<h1>{_e(record.get('rule'))} fired</h1>"
        f'<p class="summary">{_e(record.get("summary", ""))}</p>{_facts(rows)}'
        f"<h2>Actions</h2>{f'<ul>{done}</ul>' if actions else '<p>None.</p>'}{then}"
    )


def _charts(record: Mapping[str, Any], specs: list[dict[str, Any]]) -> str:
    if not specs:
        why = (
            "not sampled before"
            if record.get("sampled_before") is False
            else "the record carries no memory history"
        )
        return f'<h2>Before it</h2><p class="none">no timeline: {_e(why)}</p>'
    points = len(record.get("timeline") or [])
    canvases = "".join(
        f'<div class="chart"><canvas id="{s["canvas"]}"></canvas></div>' for s in specs
    )
    return (
        f"<h2>Before it ({points} samples)</h2>{canvases}"
        '<p class="note">Node memory: usable = used + available. Used is split into slab '
        "unreclaimable, shmem and the rest (workloads: anonymous memory, and the kernel's "
        "stacks, page tables and the reserves MemAvailable holds back); available into page "
        "cache, slab reclaimable and the rest (free). The split is approximate where "
        "/proc/meminfo does not give the kernel's own.</p>"
    )


def _evidence(record: Mapping[str, Any]) -> str:
    """The node's memory, the largest containers and GPU memory, from the evidence."""
    evidence = record.get("evidence") or {}
    out = []
    memory = evidence.get("memory")
    if memory:
        rows = [(p.label, _bytes(memory.get(p.field))) for p in NODE_MEMORY_BREAKDOWN]
        out.append(f"<h2>Node memory then</h2>{_grid(('', 'bytes'), rows, numeric={1})}")
    top = evidence.get("top_containers") or []
    if top:
        head = (
            "container",
            "working set",
            "unreclaimable",
            "limit",
            "request",
            "QoS",
            "priority",
            "OOM kills",
        )
        rows2 = [
            (
                "/".join(str(c.get(k) or "?") for k in ("namespace", "pod", "container")),
                _bytes(c.get("working_set_bytes")),
                _bytes(c.get("unreclaimable_bytes")),
                _bytes(c.get("limit_bytes")),
                _bytes(c.get("request_bytes")),
                c.get("qos_class") or "-",
                "-" if c.get("priority") is None else c["priority"],
                "-" if c.get("oom_kills") is None else c["oom_kills"],
            )
            for c in top
        ]
        out.append(f"<h2>Largest containers then</h2>{_grid(head, rows2, numeric={1, 2, 3, 4})}")
    gpu = evidence.get("gpu") or {}
    if gpu.get("devices"):
        head = ("GPU", "name", "UUID", "total", "used", "free", "reserved", "processes")
        rows3 = [
            (
                d.get("index"),
                d.get("name") or "-",
                d.get("uuid") or "-",
                *(
                    _bytes((d.get("memory") or {}).get(f"{k}_bytes"))
                    for k in ("total", "used", "free", "reserved")
                ),
                ", ".join(
                    f"{p.get('pod') or 'pid'}/{p.get('container') or p.get('pid')} "
                    f"{_bytes(p.get('used_bytes'))}"
                    for p in d.get("processes") or []
                )
                or "-",
            )
            for d in gpu["devices"]
        ]
        driver = f" (driver {gpu['driver_version']})" if gpu.get("driver_version") else ""
        grid = _grid(head, rows3, numeric={3, 4, 5, 6})
        out.append(f"<h2>GPU memory then{_e(driver)}</h2>{grid}")
    return "".join(out)


def page(*, record: Mapping[str, Any]) -> str:
    """The HTML page of ``record`` (an incident record as the store holds it, module
    docstring): one self-contained document, UTF-8 text. A field the record lacks is left out;
    a record without ``timeline`` points gives a page without charts that says so."""
    specs = chart_specs(record)
    header = _kill(record) if record.get("kind") == "oom_kill" else _firing(record)
    license_ = _static("LICENSE.md").replace("*/", "* /")
    return _PAGE.format(
        title=_e(f"nodeguard: {record.get('summary') or record.get('id', 'incident')}"),
        style=_STYLE,
        body=header + _charts(record, specs) + _evidence(record),
        record=_json(record),
        charts=_json(specs),
        chartjs=f"/*! Chart.js's licence:\n{license_}*/\n{_static('chart.umd.min.js')}",
        script=_static("incident-page.js"),
    )
