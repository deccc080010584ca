"""The OOM counts kept across agent restarts, in ``<state>/kmsg-oom.json``.

The file holds the boot ID (``/proc/sys/kernel/random/boot_id``), the sequence number of the
last kernel log record read, and the counts; it is only read back on the same boot (a new boot
starts the ring buffer and its sequence numbers over). It is written whole to a temporary file
and renamed over the old one, so a crash mid-write keeps the previous state.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from nodeguard.snapshot import OomKill
from nodeguard.sources.oom_counts import ContainerCount, OomCounts

__all__ = ["STATE_FILE", "load_state", "save_state"]

# The reader's logger, as before it was split (the log's repeat limits key on its name).
log = logging.getLogger("nodeguard.sources.kmsg")

STATE_FILE = "kmsg-oom.json"


def load_state(path: Path, *, boot_id: str, counts: OomCounts) -> int:
    """Fill ``counts`` from the state at ``path`` if it is of this boot (``boot_id``, never
    empty); the last sequence number read, ``-1`` where nothing was kept (absent, unreadable:
    logged, or of another boot)."""
    if not path.exists():
        return -1
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable OOM state %s: %s", path, exc)
        return -1
    if data.get("boot_id") != boot_id or not boot_id:
        return -1  # a new boot: the ring buffer and its sequence numbers start over
    counts.total = int(data.get("total", 0))
    counts.by_constraint.update({str(k): int(v) for k, v in data.get("by_constraint", {}).items()})
    # [victims, last counted] (before repeats were kept) or [victims, last, repeats]
    counts.by_container = {
        str(k): ContainerCount(
            victims=int(v[0]), last=float(v[1]), repeats=int(v[2]) if len(v) > 2 else 0
        )
        for k, v in data.get("by_container", {}).items()
    }
    for item in data.get("recent", []):
        counts.recent.append(OomKill(**item))
    return int(data.get("last_sequence", -1))


def save_state(path: Path, *, boot_id: str, last_sequence: int, counts: OomCounts) -> None:
    """Write the state to ``path`` (its directory made if need be); a failure is logged, never
    raised."""
    data = {
        "boot_id": boot_id,
        "last_sequence": last_sequence,
        "total": counts.total,
        "by_constraint": counts.by_constraint,
        "by_container": {k: [c.victims, c.last, c.repeats] for k, c in counts.by_container.items()},
        "recent": [asdict(k) for k in counts.recent],
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)  # atomic: a crash mid-write never loses the old state
    except OSError as exc:
        log.warning("cannot keep OOM state in %s: %s", path, exc)
