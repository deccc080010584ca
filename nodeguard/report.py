"""``nodeguard snapshot``: one sample as a report a person reads at a glance (rich tables):
node memory, PSI, containers against their limits, OOM kills, processes, GPUs and their
processes."""

from __future__ import annotations

import datetime as dt

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from nodeguard.snapshot import (
    NODE_MEMORY_BREAKDOWN,
    ContainerMemory,
    GpuMemory,
    NodeSnapshot,
    PodMemory,
)
from nodeguard.units import format_bytes

__all__ = ["format_bytes", "render_report"]


def _missing(snap: NodeSnapshot, name: str, what: str) -> Text:
    """Why a section has nothing, in one line, from its collector's own status."""
    st = snap.collector(name)
    if st is None:
        why = f"collector off (--no-collector.{name})"
    elif not st.success:
        why = f"collector FAILED: {st.error}"
    else:
        why = f"no data ({st.error})" if st.error else "none"
    return Text(f"{what}: {why}", style="" if st is None or st.success else "yellow")


def _workload(snap: NodeSnapshot, pod_uid: str, container_id: str) -> str:
    """``namespace/pod/container``; before pod names are known (no cluster), the start of the
    pod UID and the container ID's first 12 characters, as ``crictl ps`` shows it."""
    lab = snap.labels_for(pod_uid, container_id)
    if lab.namespace:
        return f"{lab.namespace}/{lab.pod}/{lab.container}"
    return f"pod {pod_uid[:8]}/{container_id[:12]}"


def _pct(part: int | None, whole: int | None) -> str:
    if part is None or not whole:
        return "-"
    return f"{100.0 * part / whole:.1f}%"


# Lines that are not a part of usable memory (the total, the pool carved out of it).
_OUTSIDE_USABLE = frozenset({"total_bytes", "hugetlb_bytes"})


def _node_table(snap: NodeSnapshot) -> Table | Text:
    mem = snap.meminfo
    if mem is None:
        return _missing(snap, "meminfo", "node memory")
    t = Table(title="Node memory", title_justify="left")
    t.add_column("")
    t.add_column("bytes", justify="right")
    t.add_column("of total", justify="right")
    # The share the rules and alerts take: of the memory that can ever be available.
    t.add_column("of usable", justify="right")
    for part in NODE_MEMORY_BREAKDOWN:
        name = part.label
        if part.field == "available_bytes" and mem.available_estimated:
            name += " (estimated)"
        value = getattr(mem, part.field)
        of_usable = "" if part.field in _OUTSIDE_USABLE else _pct(value, mem.usable_bytes)
        t.add_row(name, format_bytes(value), _pct(value, mem.total_bytes), of_usable)
    return t


def _pressure_table(snap: NodeSnapshot) -> Table | Text:
    psi = snap.pressure
    if psi is None:
        return _missing(snap, "pressure", "memory pressure (PSI)")
    t = Table(title="Memory pressure (PSI, share of time stalled)", title_justify="left")
    for col in ("", "avg10", "avg60", "avg300", "total stall"):
        t.add_column(col, justify="right")
    for kind, line in (("some", psi.some), ("full", psi.full)):
        if line is not None:
            t.add_row(
                kind,
                f"{line.avg10:.1%}",
                f"{line.avg60:.1%}",
                f"{line.avg300:.1%}",
                f"{line.total_seconds:.1f}s",
            )
    return t


def _containers_table(snap: NodeSnapshot, top: int) -> Table | Text:
    if not snap.pods:
        st = snap.collector("cgroups")
        if st is not None and st.success and st.available:
            # The reader found the kubepods cgroup (else the collector has no data): no pods.
            return Text("containers: none (the kubepods cgroup holds no pods)")
        return _missing(snap, "cgroups", "containers")

    # Nearest to an OOM kill first: unreclaimable memory against the limit, as the default
    # rules read it (page cache fills a limit and is reclaimed there, never killed for); then
    # the working set's share, which the kubelet and cAdvisor show.
    def key(item: tuple[PodMemory, ContainerMemory]) -> tuple[float, float, int]:
        m = item[1].memory
        return (m.unreclaimable_ratio or 0.0, m.limit_ratio or 0.0, m.working_set_bytes or 0)

    items = sorted(snap.containers(), key=key, reverse=True)[:top]
    t = Table(
        title=f"Top containers against their limits (of {len(snap.containers())})",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        # Seven columns in 80: one space between them, none at the edges.
        collapse_padding=True,
        show_edge=False,
    )
    # One column names the container, folded rather than cut, so 80 columns lose nothing.
    t.add_column("namespace/pod/container", overflow="fold", ratio=1, min_width=18)
    t.add_column("qos", overflow="fold")
    for col in ("working\nset", "limit", "unreclaim-\nable", "of\nlimit", "OOM\nkills"):
        t.add_column(col, justify="right", no_wrap=True)
    for pod, c in items:
        m = c.memory
        t.add_row(
            _workload(snap, pod.uid, c.container_id),
            pod.qos_class,
            format_bytes(m.working_set_bytes),
            format_bytes(m.effective_limit_bytes) if m.effective_limit_bytes else "none",
            format_bytes(m.unreclaimable_bytes),
            _pct(m.unreclaimable_bytes, m.effective_limit_bytes),
            "?" if m.oom_kills is None else str(m.oom_kills),
        )
    return t


def _process_table(snap: NodeSnapshot) -> Table | Text:
    if not snap.processes:
        return _missing(snap, "processes", "processes")
    t = Table(
        title="Top processes by RSS", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False
    )
    for col in ("pid", "name", "rss", "container"):
        t.add_column(col, justify="right" if col in ("pid", "rss") else "left", overflow="fold")
    for p in snap.processes:
        where = p.container_id[:12] if p.container_id else (p.cgroup or "?")
        t.add_row(str(p.pid), p.name, format_bytes(p.rss_bytes), where)
    return t


def _gpu_table(snap: NodeSnapshot) -> Table | Text:
    info = snap.gpu
    if info is None:
        return _missing(snap, "gpu", "GPUs")
    uuids: list[str] = []
    t = Table(
        title=f"GPU memory (NVIDIA driver {info.driver_version or '?'})",
        title_justify="left",
        caption_justify="left",
    )
    for col in ("gpu", "model", "MIG", "total", "used", "reserved", "free", "in use"):
        t.add_column(col, justify="left" if col in ("gpu", "model", "MIG") else "right")

    def row(name: str, model: str, mig: str, m: GpuMemory | None) -> None:
        t.add_row(
            name,
            model,
            mig,
            format_bytes(m.total_bytes if m else None),
            format_bytes(m.used_bytes if m else None),
            format_bytes(m.reserved_bytes if m else None),
            format_bytes(m.free_bytes if m else None),
            _pct(m.total_bytes - m.free_bytes, m.total_bytes) if m else "-",
        )

    for dev in info.devices:
        mig = "-" if dev.mig_enabled is None else ("on" if dev.mig_enabled else "off")
        row(str(dev.index), dev.name or "?", "LOST" if dev.lost else mig, dev.memory)
        uuids.append(f"{dev.index}: {dev.uuid or '?'}")
        for mdev in dev.mig_devices:
            name = f"{dev.index}/gi{mdev.gpu_instance_id}"
            row(f"  {name}", f"MIG ci{mdev.compute_instance_id}", "", mdev.memory)
            uuids.append(f"{name}: {mdev.uuid or '?'}")
    t.caption = "\n".join(uuids)
    return t


def _gpu_processes_table(snap: NodeSnapshot, top: int) -> Table | Text | None:
    if snap.gpu is None:
        return None
    rows = [(d, p) for d in snap.gpu.devices for p in d.processes or ()]
    notes = [f"GPU {d.index}: {'; '.join(d.errors)}" for d in snap.gpu.devices if d.errors]
    if not rows:
        return Text("\n".join(["GPU processes: none", *notes]))
    rows.sort(key=lambda r: r[1].used_bytes or 0, reverse=True)
    t = Table(
        title="Top GPU processes",
        title_justify="left",
        caption="\n".join(notes) or None,
        caption_justify="left",
    )
    for col in ("gpu", "pid", "namespace/pod", "container", "used"):
        t.add_column(col, justify="right" if col in ("pid", "used") else "left")
    for dev, p in rows[:top]:
        where, container = "(not in a pod)", ""
        if p.pod_uid is not None:
            lab = snap.labels_for(p.pod_uid, p.container_id)
            where = f"{lab.namespace}/{lab.pod}" if lab.namespace else lab.pod
            container = lab.container[:24]
        gpu = str(dev.index)
        if p.mig_gpu_instance_id is not None:
            gpu += f"/gi{p.mig_gpu_instance_id}"
        used = "not available" if p.used_bytes is None else format_bytes(p.used_bytes)
        if p.mps_server:  # its memory is its clients' (GpuProcess), listed on their own rows
            used += " (MPS server)"
        t.add_row(gpu, str(p.pid), where, container, used)
    return t


def _oom_text(snap: NodeSnapshot) -> Text:
    oom = snap.oom
    if oom is None:
        return _missing(snap, "kmsg", "OOM kills (kernel log; needs /dev/kmsg and CAP_SYSLOG)")
    shown = list(oom.recent)[-5:]
    lines = [f"OOM kills this boot (kernel log): {oom.total}"]
    if shown:
        lines.append(f"  the newest {len(shown)}:" if oom.total > len(shown) else "  all:")
    for k in shown:
        when = dt.datetime.fromtimestamp(k.time, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        lines.append(
            f"  {when}Z pid {k.pid} ({k.process}) anon-rss "
            f"{format_bytes(k.anon_rss_bytes)} cgroup {k.task_memcg or '?'}"
        )
    return Text("\n".join(lines))


def render_report(
    snap: NodeSnapshot,
    *,
    console: Console,
    top: int = 10,
) -> None:
    """Print the report of one snapshot to ``console``."""
    when = dt.datetime.fromtimestamp(snap.timestamp, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    header = Text(f"nodeguard snapshot of {snap.node_name} at {when}Z", style="bold")
    # Each section says itself, once, why it has no data (its collector's status).
    parts: list[Table | Text] = [header]
    parts += [
        _node_table(snap),
        _pressure_table(snap),
        _containers_table(snap, top),
        _oom_text(snap),
        _process_table(snap),
        _gpu_table(snap),
    ]
    gpu_processes = _gpu_processes_table(snap, top)
    if gpu_processes is not None:
        parts.append(gpu_processes)
    console.print(Group(*parts))
