"""Do nodeguard and cAdvisor say the same about the same cgroups? The value check of the
benchmarks' peer (and of ``tests/kernel/test_cadvisor_peer.py``): per live container, usage, working
set, anon, file, limit, limit hits and OOM kills, from each exporter's ``/metrics`` text.

What each side reads (cgroup v1; v2 in brackets):

- usage: ``memory.usage_in_bytes`` [``memory.current``], both.
- working set: usage - ``total_inactive_file`` [``inactive_file``] clamped at 0, both
  (cAdvisor's definition, which nodeguard follows).
- anon: ``total_rss`` [``anon``]; cAdvisor's ``container_memory_rss``.
- file: ``total_cache`` [``file``]; cAdvisor's ``container_memory_cache``.
- limit: nodeguard the smallest limit up the tree, cAdvisor the cgroup's own
  (``container_spec_memory_limit_bytes``): equal where the container's own is the smallest.
- limit hits: ``memory.failcnt`` [``memory.events`` ``max``], both.
- OOM kills: both from the kernel log, nodeguard by victim (``task_memcg``), cAdvisor by the
  cgroup whose limit was hit (``oom_memcg``): the same cgroup for a container's own limit.

cAdvisor's values are those of its last housekeeping (every 10-15 s), so the check is made on
containers whose memory stands still; nodeguard's kernel-log series starts at a container's
first kill (absent is 0). A container without a limit has no limit series where cAdvisor
writes 0 (``specMemoryValue``), and nodeguard takes a limit at or above MemTotal for none (it
can never bind before the node runs out) where cAdvisor writes it: "no limit" reads as 0 on
both sides here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["FIELDS", "Check", "compare", "series"]

# (what, nodeguard sample name, cAdvisor sample name on v1, on v2)
FIELDS = (
    (
        "usage",
        "nodeguard_container_memory_usage_bytes",
        "container_memory_usage_bytes",
        "container_memory_usage_bytes",
    ),
    (
        "working set",
        "nodeguard_container_memory_working_set_bytes",
        "container_memory_working_set_bytes",
        "container_memory_working_set_bytes",
    ),
    (
        "anon",
        "nodeguard_container_memory_anon_bytes",
        "container_memory_rss",
        "container_memory_rss",
    ),
    (
        "file",
        "nodeguard_container_memory_file_bytes",
        "container_memory_cache",
        "container_memory_cache",
    ),
    (
        "limit",
        "nodeguard_container_memory_limit_bytes",
        "container_spec_memory_limit_bytes",
        "container_spec_memory_limit_bytes",
    ),
    (
        "limit hits",
        "nodeguard_container_memory_limit_hits_total",
        "container_memory_failcnt_total",  # the counter container_memory_failcnt, as parsed
        "container_memory_events_max_total",
    ),
    (
        "OOM kills",
        "nodeguard_container_kernel_oom_kills_total",
        "container_oom_events_total",
        "container_oom_events_total",
    ),
)
# Absent in nodeguard where cAdvisor writes 0: a counter before its first event, no limit.
_ABSENT_IS_ZERO = frozenset(
    {"nodeguard_container_kernel_oom_kills_total", "nodeguard_container_memory_limit_bytes"}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    """One value of one container from both sides (``None``: the series is absent)."""

    cgroup: str
    what: str
    nodeguard: float | None
    cadvisor: float | None

    @property
    def agrees(self) -> bool:
        return self.nodeguard is not None and self.nodeguard == self.cadvisor


def series(body: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a text-format body, by name and labels."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def _cadvisor_value(
    samples: Mapping[tuple[str, frozenset[tuple[str, str]]], float], name: str, cgroup: str
) -> float | None:
    for (sample, labels), value in samples.items():
        if sample == name and ("id", cgroup) in labels:
            return value
    return None


def compare(
    *, nodeguard: str, cadvisor: str, containers: Mapping[str, tuple[str, str]], version: int
) -> list[Check]:
    """A check per container and field: ``containers`` maps each container's cgroup path
    from the hierarchy root (cAdvisor's ``id``) to its pod UID and container ID (nodeguard's
    ``pod`` and ``container`` labels without a cluster); both bodies in the text format."""
    ours, theirs = series(nodeguard), series(cadvisor)
    node = frozenset({("namespace", ""), ("pod", ""), ("container", "")})
    mem_total = ours.get(("nodeguard_node_memory_total_bytes", node), float("inf"))
    checks = []
    for cgroup, (uid, cid) in containers.items():
        labels = frozenset({("namespace", ""), ("pod", uid), ("container", cid)})
        for what, our_name, v1_name, v2_name in FIELDS:
            ng = ours.get((our_name, labels))
            if ng is None and our_name in _ABSENT_IS_ZERO:
                ng = 0.0
            cadv = _cadvisor_value(theirs, v1_name if version == 1 else v2_name, cgroup)
            if what == "limit" and cadv is not None and cadv >= mem_total:
                cadv = 0.0  # no limit that can bind
            checks.append(Check(cgroup=cgroup, what=what, nodeguard=ng, cadvisor=cadv))
    return checks
