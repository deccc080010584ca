"""What each cgroup's files said and the :class:`CgroupMemory` built from it, for the last full
read and the one under way.

A cgroup whose files say the same as last time (and whose bounds are the same) keeps the same
immutable object: nothing is built anew (docs/benchmarks.md). The swap bounds of the node
(SwapFree, ``vm.swappiness``, Documentation/admin-guide/sysctl/vm.rst) are set once per read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from nodeguard.paths import HostPaths
from nodeguard.snapshot import CgroupMemory
from nodeguard.sources.cgroup_files import CgroupFiles
from nodeguard.sources.cgroup_layout import CgroupLayout
from nodeguard.sources.cgroup_memory import (
    EMPTY,
    NO_SWAP,
    Key,
    ParsedFiles,
    Swap,
    build_memory,
    swappable,
)
from nodeguard.sources.files import read_optional
from nodeguard.sources.unreclaimable import anon_lru, children_swap_bound

__all__ = ["Built", "CgroupRecords"]

#: path -> (what built it; the CgroupMemory built; the inode number of its directory)
Built = dict[str, tuple[Key, CgroupMemory, int]]


class CgroupRecords:
    """The cgroups of the last full read (``built``) and of this one (``building``), read with
    ``files``; ``node_swap``: the node's swap state for this read."""

    def __init__(self, *, files: CgroupFiles, paths: HostPaths) -> None:
        self.files = files
        self._paths = paths
        self.built: Built = {}
        self.building: Built = {}
        self.node_swap = NO_SWAP  # SwapFree and vm.swappiness of this read

    def set_swap(self, swap_free: int | None) -> None:
        """The node's swap state for this read: SwapFree, and ``vm.swappiness`` where there is
        swap free to use (one procfs file; absent or bad: unknown)."""
        swappiness: int | None = None
        if swap_free:
            text = read_optional(self._paths.proc("sys", "vm", "swappiness"))
            try:
                swappiness = int(text) if text is not None else None
            except ValueError:
                swappiness = None
        self.node_swap = Swap(node_free=swap_free, swappiness=swappiness, parent_room=None)

    def turn(self) -> None:
        """This read done: it becomes the last one."""
        self.built, self.building = self.building, {}

    def parts(self, path: str, version: Literal[1, 2], ino: int) -> ParsedFiles:
        """The files of the cgroup at ``path`` (the swap files where the node has swap free)."""
        return self.files.parts(path, version, ino, swap=bool(self.node_swap.node_free))

    def read(
        self,
        *,
        layout: CgroupLayout,
        path: str,
        ino: int,
        parent_limit: int | None,
        total: int | None,
        parent_room: int | None = None,
        children: Iterable[str] | None = None,
    ) -> CgroupMemory | None:
        """The cgroup, or ``None`` when it is gone; a file skipped leaves its values out.
        ``parent_room``: the swap room its pod leaves a container (``None``: no bound);
        ``children``: the paths of the cgroups below it read (a pod's containers, the kubepods
        cgroup's pods), whose swap bounds bound its own (``None``: not counted)."""
        parts = self.parts(path, layout.version, ino)
        if parts.usage is None and not os.path.isdir(path):
            return None  # removed between listing and reading
        swap = self.node_swap._replace(parent_room=parent_room)
        if children is not None:
            swap = swap._replace(children=self.children_swap(layout, parts, children))
        return self.record(
            layout=layout,
            path=path,
            ino=ino,
            parts=parts,
            parent_limit=parent_limit,
            total=total,
            swap=swap,
        )

    def reread(
        self,
        *,
        layout: CgroupLayout,
        path: str,
        ino: int,
        parent_limit: int | None,
        total: int | None,
        parent_room: int | None = None,
        children: tuple[str, ...] | None = None,
    ) -> CgroupMemory | None:
        """One cgroup read again between full reads; what it said replaces the last read's
        record (so the next full read finds it unchanged, and builds nothing anew)."""
        memory = self.read(
            layout=layout,
            path=path,
            ino=ino,
            parent_limit=parent_limit,
            total=total,
            parent_room=parent_room,
            children=children,
        )
        if memory is not None:
            self.built[path] = self.building.pop(path)
        return memory

    def children_swap(
        self, layout: CgroupLayout, parts: ParsedFiles, children: Iterable[str]
    ) -> int | None:
        """What the cgroups at ``children`` (built in this read, or else in the last) let of
        the parent's anon go to swap (:func:`children_swap_bound`); ``None`` where swap cannot
        be used (cgroup v1, no swap free on the node)."""
        if layout.version != 2 or not self.node_swap.node_free:
            return None
        known: list[tuple[int, int]] = []
        for child in children:
            built = self.building.get(child) or self.built.get(child)
            if built is not None:
                known.append((anon_lru(built[0][0].stat or EMPTY), swappable(built[0])))
        return children_swap_bound(anon=anon_lru(parts.stat or EMPTY), children=known)

    def record(
        self,
        *,
        layout: CgroupLayout,
        path: str,
        ino: int,
        parts: ParsedFiles,
        parent_limit: int | None,
        total: int | None,
        swap: Swap,
    ) -> CgroupMemory:
        """The cgroup built from ``parts`` (the last read's object where they and the bounds
        are unchanged), recorded for this read."""
        key = (parts, parent_limit, total, swap)
        last = self.built.get(path)
        if last is not None and last[0] == key:
            memory = last[1]  # the same files said the same: the same (immutable) object
        else:
            root = str(layout.root)
            if path.startswith(root + "/"):  # always, for paths listed under the root
                rel = path[len(root) :]
            else:
                rel = "/" + str(Path(path).relative_to(layout.root))
            memory = build_memory(
                rel=rel,
                version=layout.version,
                parts=parts,
                parent_limit=parent_limit,
                mem_total=total,
                swap=swap,
            )
        self.building[path] = (key, memory, ino)
        return memory
