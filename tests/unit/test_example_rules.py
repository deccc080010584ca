"""The shipped runbooks (rules/default.yaml, rules/examples/, the DaemonSet's copy) evict on
memory the kernel cannot reclaim, never on the working set.

The working set (usage - inactive_file, cAdvisor's) counts active page cache, which the kernel
reclaims before it OOM-kills (cgroup-v2.rst "memory.max"; kubernetes#43916, cadvisor#2604): a
trial whose growth is page cache (a data loader re-reading its dataset), or a preprocessing pod
reading parquet files, is no OOM kill on its way, and evicting it is the false eviction issue 21
exists to stop. Each example is run on the page-cache look-alike (must not fire) and on the
anon growth it is there for (must fire).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from nodeguard.rules.engine import RuleEngine
from nodeguard.rules.load import load_rules
from nodeguard.snapshot import NodeSnapshot, PodMeta
from tests.support.memory_host import MiB, memory_host, memory_snapshot, memory_stat, read_host

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "rules" / "examples"
GiB = 1 << 30
_WORKING_SET_SIGNALS = {"pod_seconds_to_limit", "container_seconds_to_limit"}


def _shipped_rule_files() -> list[Path]:
    return sorted([*(ROOT / "rules").rglob("*.yaml"), *(ROOT / "daemonset").rglob("rules/*.yaml")])


def test_no_shipped_eviction_decides_on_the_working_set() -> None:
    """Every rule of every shipped rule file that evicts: no working-set signal in ``when``."""
    files = [p for p in _shipped_rule_files() if "kind: RuleSet" in p.read_text()]
    assert any("daemonset" in str(p) for p in files)
    assert any("examples" in str(p) for p in files)
    offenders = []
    for path in files:
        for rule in load_rules([path]).rules:
            if not any(a.action == "evict" for a in rule.actions):
                continue
            for cond in rule.when:
                if "working_set" in cond.signal or cond.signal in _WORKING_SET_SIGNALS:
                    offenders.append(f"{path.relative_to(ROOT)}: {rule.name}: {cond.signal}")
    assert offenders == []


def _fired(tmp_path: Path, name: str, *, anon: list[int], cache: list[int]) -> set[str]:
    """The rules of ``name`` that fire over one container (1 GiB limit) sampled once a second
    with these anon and page cache sizes."""
    engine = RuleEngine(rules=load_rules([EXAMPLES / name]).rules)
    fired: set[str] = set()
    for i, (a, c) in enumerate(zip(anon, cache, strict=True)):
        stat = memory_stat(anon=a, active_anon=a, file=c, active_file=c)
        paths, uid, cid = memory_host(tmp_path / str(i), container=stat, current=a + c)
        snap = memory_snapshot(1_000.0 + i, read_host(paths)[0], uid, cid)
        for f in engine.evaluate(snap, global_dry_run=True):
            if f.kind == "firing":
                fired.add(f.rule)
    return fired


@pytest.mark.parametrize("name", ["katib-mixed-trials.yaml", "shared-gpu-nodes.yaml"])
def test_example_rules_do_not_evict_on_page_cache(tmp_path: Path, name: str) -> None:
    # 50 MiB of anon that stays, page cache growing 20 MiB/s toward the 1 GiB limit.
    cache = [750 * MiB + i * 20 * MiB for i in range(12)]
    assert _fired(tmp_path, name, anon=[50 * MiB] * 12, cache=cache) == set()


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("katib-mixed-trials.yaml", "trial-near-limit"),
        ("shared-gpu-nodes.yaml", "team-pod-over-limit-soon"),
    ],
)
def test_example_rules_evict_on_anon_heading_for_the_limit(
    tmp_path: Path, name: str, rule: str
) -> None:
    # Anon growing 5 MiB/s from 960 MiB (94 %) beside 20 MiB of page cache: an OOM kill in
    # seconds.
    anon = [960 * MiB + i * 5 * MiB for i in range(12)]
    assert rule in _fired(tmp_path, name, anon=anon, cache=[20 * MiB] * 12)


def _preprocessing(tmp_path: Path, *, anon: int, cache: int) -> set[str]:
    """The preprocessing example over one Burstable pod of ``anon`` + ``cache`` bytes with a
    4 GiB request, for 40 s."""
    engine = RuleEngine(rules=load_rules([EXAMPLES / "preprocessing-beside-training.yaml"]).rules)
    stat = memory_stat(anon=anon, active_anon=anon, file=cache, active_file=cache)
    paths, uid, cid = memory_host(tmp_path, container=stat, current=anon + cache)
    mem = read_host(paths)[0]
    meta = PodMeta(
        uid=uid,
        name="preprocess",
        namespace="data",
        node_name="n",
        phase="Running",
        priority=0,
        priority_class="",
        qos_class="burstable",
        memory_request_bytes=4 * GiB,
        memory_limit_bytes=None,
        owners=(),
        labels={},
        annotations={},
        containers={cid: "main"},
        container_requests={"main": 4 * GiB},
        mirror=False,
        daemonset=False,
        terminating=False,
    )
    fired: set[str] = set()
    for t in range(0, 41, 5):
        snap: NodeSnapshot = dataclasses.replace(
            memory_snapshot(1_000.0 + t, mem, uid, cid), pod_meta={uid: meta}
        )
        for f in engine.evaluate(snap, global_dry_run=True):
            if f.kind == "firing":
                fired.add(f.rule)
    return fired


def test_preprocessing_pod_reading_files_is_not_far_above_its_request(tmp_path: Path) -> None:
    # 2 GiB of dataframes and 20 GiB of the parquet files it reads (page cache): the working
    # set is 5.5x its request and 22 GiB, what does not free itself is half its request.
    assert _preprocessing(tmp_path / "a", anon=2 * GiB, cache=20 * GiB) == set()
    # 20 GiB of dataframes: 5x its request by what the kernel cannot take back.
    assert "pod-far-above-request" in _preprocessing(tmp_path / "b", anon=20 * GiB, cache=0)
