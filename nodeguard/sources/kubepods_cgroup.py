"""The kubepods cgroup itself: what the kubelet sets as the node's allocatable memory
(pkg/kubelet/cm node allocatable, ``--enforce-node-allocatable=pods``), read against the
limits above it (a kind or docker node's own)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from nodeguard.snapshot import CgroupMemory
from nodeguard.sources.cgroup_layout import CgroupLayout
from nodeguard.sources.cgroup_records import CgroupRecords

__all__ = ["Kubepods", "read_kubepods", "reread_kubepods"]


class Kubepods(NamedTuple):
    """The kubepods cgroup of the last full read: where it is, the limit above it, and the pod
    cgroups read under it (their swap bounds bound its own)."""

    path: str
    ino: int
    above: int | None
    pods: tuple[str, ...]


def read_kubepods(
    *,
    records: CgroupRecords,
    layout: CgroupLayout,
    path: str,
    total: int | None,
    pods: tuple[str, ...],
) -> Kubepods | None:
    """The kubepods cgroup at ``path`` read into ``records``; ``pods``: the pod cgroups just
    read under it. ``None`` when it cannot be read (gone)."""
    try:
        ino = os.stat(path).st_ino
    except OSError:
        return None
    parent = Path(path).parent
    above = (
        records.files.ancestor_limit(layout=layout, path=parent, mem_total=total)
        if parent != layout.root
        else None
    )
    if records.read(
        layout=layout, path=path, ino=ino, parent_limit=above, total=total, children=pods
    ):
        return Kubepods(path=path, ino=ino, above=above, pods=pods)
    return None


def reread_kubepods(
    *, records: CgroupRecords, layout: CgroupLayout, kubepods: Kubepods, total: int | None
) -> CgroupMemory | None:
    """The kubepods cgroup of the last full read read again; ``None`` when it cannot be."""
    return records.reread(
        layout=layout,
        path=kubepods.path,
        ino=kubepods.ino,
        parent_limit=kubepods.above,
        total=total,
        children=kubepods.pods,
    )
