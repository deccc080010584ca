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
    lines.append("The whole record: `nodeguard incidents ID --json`")
    for line in lines:
        console.print(line, soft_wrap=False)
