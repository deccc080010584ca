"""The README's tables say what the registries hold: every rule signal with its scope and unit,
every action by name. Adding a signal or an action without its line in README.md fails here
(CONTRIBUTING.md's checklists)."""

from __future__ import annotations

import re
from pathlib import Path

from nodeguard.actions.registry import ACTIONS
from nodeguard.rules.signals import SIGNALS

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


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
    assert set(ACTIONS) <= named, set(ACTIONS) - named
