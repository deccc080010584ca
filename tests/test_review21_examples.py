"""Review of issue 21, point 1, in the shipped example runbooks (rules/examples/, which the
README offers for Katib trials and teams sharing GPU nodes): their container rules still evict
on the working set, which counts active page cache the kernel reclaims before it OOM-kills
(cgroup-v2.rst "memory.max"; kubernetes#43916, cadvisor#2604). A trial whose growth is page
cache (a data loader re-reading its dataset) is evicted by them, the false eviction the issue
exists to stop.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeguard.rules.engine import RuleEngine
from nodeguard.rules.load import load_rules
from tests.test_unreclaimable import MiB, _host, _read, _snapshot, _stat

EXAMPLES = Path(__file__).resolve().parents[1] / "rules" / "examples"


@pytest.mark.parametrize("name", ["katib-mixed-trials.yaml", "shared-gpu-nodes.yaml"])
def test_review21_example_rules_do_not_evict_on_page_cache(tmp_path: Path, name: str) -> None:
    engine = RuleEngine(rules=load_rules([EXAMPLES / name]).rules)
    fired: set[str] = set()
    for i in range(12):
        # 50 MiB of anon that stays, page cache growing 20 MiB/s toward the 1 GiB limit.
        cache = 750 * MiB + i * 20 * MiB
        stat = _stat(anon=50 * MiB, active_anon=50 * MiB, file=cache, active_file=cache)
        paths, uid, cid = _host(tmp_path / str(i), container=stat, current=cache + 50 * MiB)
        snap = _snapshot(1_000.0 + i, _read(paths)[0], uid, cid)
        for f in engine.evaluate(snap, global_dry_run=True):
            if f.kind == "firing":
                fired.add(f.rule)
    assert fired == set()  # today: trial-near-limit / team-pod-over-limit-soon fire (evict)
