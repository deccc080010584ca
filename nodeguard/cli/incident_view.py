"""One incident record for people: what fired, on what, what was done, and the node as it was.

The record's fields are those :meth:`nodeguard.remediation.incidents.IncidentStore.write`
writes; a field an older record lacks is left out, never an error.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from rich.console import Console
from rich.markup import escape

from nodeguard.units import format_bytes

__all__ = ["show_one"]

# The node's memory lines shown, in the order an SRE reads them: the record has the rest.
_MEMORY = (
    ("usable", "usable_bytes"),
    ("available", "available_bytes"),
    ("page cache", "page_cache_bytes"),
    ("slab unreclaimable", "slab_unreclaimable_bytes"),
    ("shmem (tmpfs)", "shmem_bytes"),
)
_TOP = 5


def show_one(record: dict[str, Any], *, console: Console) -> None:
    """Print ``record`` as a short report within 80 columns; ``--json`` has the whole of it."""
    when = dt.datetime.fromtimestamp(record["time"], tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    if record.get("kind") == "oom_kill":
        lines = _kill(record, when=when)
    else:
        lines = _firing(record, when=when)
    lines += _memory_then(record)
    lines += _timeline(record)
    lines.append("The whole record: `nodeguard incidents ID --json`")
    for line in lines:
        console.print(line, soft_wrap=False)


def _kill(record: dict[str, Any], *, when: str) -> list[str]:
    """What the kernel killed, and what nodeguard had done about it."""
    victim = record.get("victim") or {}
    lines = [
        f"[bold]oom-kill[/] {escape(str(record.get('summary', '')))}",
        f"  when    {when} UTC, node {escape(str(record.get('node', '')))}",
        f"  from    the kernel log ({escape(str(victim.get('constraint') or 'no constraint'))})",
        f"  id      {escape(record['id'])}",
    ]
    facts = [f"anon RSS {format_bytes(victim.get('anon_rss_bytes'))}"]
    if victim.get("limit_bytes"):
        facts.append(f"limit {format_bytes(victim['limit_bytes'])}")
    if victim.get("request_bytes"):
        facts.append(f"request {format_bytes(victim['request_bytes'])}")
    if victim.get("qos_class"):
        facts.append(str(victim["qos_class"]))
    if victim.get("priority") is not None:
        facts.append(f"priority {victim['priority']}")
    lines.append(f"  victim  {escape(', '.join(facts))}")
    linked = record.get("linked") or []
    if record.get("sampled_before") is False:
        lines.append("  before  not sampled: nodeguard read the kill from the kernel log later")
    elif not linked:
        lines.append("  before  no rule fired on it in the 10 minutes before")
    for link in linked:
        what = "; ".join(link.get("actions") or []) or "no action"
        how = "dry run: nothing was changed" if link.get("dry_run") else what
        lines.append(
            f"  before  {escape(str(link.get('rule')))} fired "
            f"{link.get('seconds_before_kill', 0):.1f} s before the kill ({escape(how)})"
        )
    return lines


def _firing(record: dict[str, Any], *, when: str) -> list[str]:
    """What fired, on what, and what was done."""
    mode = "dry run: nothing was changed" if record.get("dry_run") else "acted"
    lines = [
        f"[bold]{escape(record['rule'])}[/] {escape(record.get('kind', ''))} on "
        f"{escape(record.get('scope', ''))} {escape(str(record.get('target', '')))}",
        f"  when    {when} UTC, node {escape(str(record.get('node', '')))}",
        f"  from    {escape(str(record.get('source', '')))} ({mode})",
        f"  id      {escape(record['id'])}",
    ]
    if record.get("summary"):
        lines.append(f"  why     {escape(str(record['summary']))}")
    for name, value in (record.get("values") or {}).items():
        lines.append(f"  value   {escape(name)} = {'no data' if value is None else f'{value:g}'}")
    actions = record.get("actions") or []
    lines.append("Actions" if actions else "Actions: none")
    for a in actions:
        lines.append(
            f"  {escape(a.get('action', '?'))}: {escape(a.get('outcome', '?'))}"
            f" - {escape(a.get('message', ''))}"
        )
    later = record.get("killed_later")
    if later:
        lines.append(
            f"  then    the kernel OOM-killed it {later.get('seconds_after', 0):.1f} s later "
            f"({escape(str(later.get('id')))})"
        )
    return lines


def _memory_then(record: dict[str, Any]) -> list[str]:
    """The node's memory and the largest containers as the evidence has them."""
    lines: list[str] = []
    evidence = record.get("evidence") or {}
    memory = evidence.get("memory")
    if memory:
        lines.append("Node memory then")
        for label, key in _MEMORY:
            if memory.get(key) is not None:
                lines.append(f"  {label:<19} {format_bytes(memory[key]):>10}")
    top = evidence.get("top_containers") or []
    if top:
        lines.append(f"Largest containers then (unreclaimable / limit; of {len(top)} recorded)")
    for c in top[:_TOP]:
        name = "/".join(str(c.get(k) or "?") for k in ("namespace", "pod", "container"))
        limit = c.get("limit_bytes")
        lines.append(
            f"  {escape(name)}  {format_bytes(c.get('unreclaimable_bytes'))} / "
            f"{format_bytes(limit) if limit else 'no limit'}"
        )
    return lines


def _timeline(record: dict[str, Any]) -> list[str]:
    """How the node got there: the span of the history, the node's available memory over it,
    and the containers that grew most (working set, first point to last)."""
    points = record.get("timeline") or []
    if not points:
        return []
    span = points[-1]["time"] - points[0]["time"]
    lines = [f"Before it ({len(points)} samples over {span:.0f} s)"]
    first = (points[0].get("memory") or {}).get("available_bytes")
    last = (points[-1].get("memory") or {}).get("available_bytes")
    if first is not None and last is not None:
        lines.append(f"  node available     {format_bytes(first)} -> {format_bytes(last)}")
    seen: dict[str, tuple[str, int, int, float, float]] = {}
    for p in points:
        for c in p.get("containers") or []:
            ws = c.get("working_set_bytes")
            if ws is None:
                continue
            name, start, _, t0, _ = seen.get(
                c["key"], (c.get("name") or c["key"], ws, ws, p["time"], p["time"])
            )
            seen[c["key"]] = (name, start, ws, t0, p["time"])
    grew = sorted(seen.values(), key=lambda x: x[2] - x[1], reverse=True)
    for name, start, end, t0, t1 in grew[:3]:
        if end <= start:
            break
        lines.append(
            f"  {escape(name)}  {format_bytes(start)} -> {format_bytes(end)} in {t1 - t0:.1f} s"
        )
    return lines
