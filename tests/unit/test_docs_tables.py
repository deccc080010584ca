"""The README's tables say what the registries hold: every rule signal with its scope and unit,
every action by name. Adding a signal or an action without its line in README.md fails here
(CONTRIBUTING.md's checklists)."""

from __future__ import annotations

import re
from pathlib import Path

from nodeguard.actions.registry import ACTIONS
from nodeguard.rules.signals import SIGNALS

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _table(header: str) -> list[list[str]]:
    """The rows of the README table whose header line is ``header``, as cells."""
    lines = README.splitlines()
    start = lines.index(header) + 2  # the header, then the |---| line
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def test_the_signal_table_is_the_registry() -> None:
    rows = _table("| signal | scope | unit | meaning |")
    documented = {r[0].strip("`"): (r[1], r[2]) for r in rows}
    registered = {
        name: (s.scope, s.unit) for name, s in SIGNALS.items() if not name.startswith("test_")
    }
    assert documented == registered
    assert len(rows) == len(documented)  # no signal twice


def test_every_action_is_named_in_the_readme() -> None:
    paragraph = README[README.index("Actions: `cordon`") :].split("\n\n")[0]
    named = set(re.findall(r"`([a-z_]+)`", paragraph))
    # Every registered action but the tests' stand-ins (``test_*``), wherever it is defined.
    shipped = {n for n in ACTIONS if not n.startswith("test_")}
    assert len(shipped) >= 6 and shipped <= named, shipped - named


def _expand(token: str) -> list[str]:
    """``a_{b,c}_d`` -> ``a_b_d``, ``a_c_d`` (every group); a trailing ``{labels}`` dropped."""
    token = re.sub(r"\{[^{}]*\}$", "", token)
    m = re.search(r"\{([^{}]*)\}", token)
    if m is None:
        return [token]
    return [
        name
        for part in m.group(1).split(",")
        for name in _expand(token[: m.start()] + part + token[m.end() :])
    ]


def test_the_metric_table_names_every_family_of_a_snapshot() -> None:
    # Every family a snapshot renders (both fixture hosts, every collector), by the name its
    # series carry, is in the README's table, and the table names nothing else.
    from nodeguard.exposition.exporter import snapshot_families
    from nodeguard.sampling.sampler import Sampler, SamplerConfig
    from tests.support.hosts import host_paths

    rendered = set()
    for host in ("v2-systemd-containerd", "v1-cgroupfs-docker"):
        sampler = Sampler(config=SamplerConfig(paths=host_paths(host), node_name="n"))
        for family in snapshot_families(sampler.sample_once()):
            rendered.add(family.name + ("_total" if family.kind == "counter" else ""))
        sampler.close()
    documented = {
        name
        for row in _table("| metric | source |")
        for token in re.findall(r"`(nodeguard_[^`]+)`", row[0])
        for name in _expand(token)
    }
    # No GPU in the fixture hosts: the GPU families are documented under "GPU" and tested
    # against the stub driver (tests/agent/test_gpu.py).
    gpu = {n for n in documented if n.startswith("nodeguard_gpu_")}
    assert rendered == documented - gpu
