"""The import-linter contracts of ``pyproject.toml`` hold the package as a whole: a new module
anywhere but ``nodeguard/kube/`` that imports the Kubernetes client (or urllib3, its HTTP
library) breaks "Only the Kubernetes layer imports the Kubernetes client", without being listed
anywhere; the same import under ``nodeguard/kube/`` keeps it. The independence contracts name
every registered action module and every registered collector module (from the registries), so
a new one is covered as soon as it registers."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeguard.actions.registry import ACTIONS
from nodeguard.collectors.base import COLLECTORS

ROOT = Path(__file__).resolve().parents[2]
KUBE_CONTRACT = "Only the Kubernetes layer imports the Kubernetes client"


def _contracts() -> dict[str, dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {c["name"]: c for c in config["tool"]["importlinter"]["contracts"]}


def _lint_imports() -> str:
    """``lint-imports``' report (exit status ignored: the report says which contract broke)."""
    out = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    return out.stdout + out.stderr


def _broken(report: str) -> str:
    """The report's "Broken contracts" section ('' when every contract is kept)."""
    return report.partition("Broken contracts")[2]


@pytest.fixture
def module() -> Iterator[list[Path]]:
    """Files written under ``nodeguard/`` by the test, removed after it."""
    made: list[Path] = []
    try:
        yield made
    finally:
        for path in made:
            path.unlink(missing_ok=True)


@pytest.mark.parametrize("library", ["urllib3", "kubernetes"])
def test_a_new_module_importing_the_client_breaks_the_contract(
    module: list[Path], library: str
) -> None:
    # A top-level module: one that no list of modules in pyproject.toml names.
    path = ROOT / "nodeguard" / f"_tmp_violation_{os.getpid()}.py"
    module.append(path)
    path.write_text(f"import {library}  # noqa: F401\n")
    broken = _broken(_lint_imports())
    section = broken.partition(KUBE_CONTRACT)[2]
    assert section, broken
    assert f"nodeguard.{path.stem} -> {library}" in section, broken


def test_the_same_import_in_the_kubernetes_layer_keeps_it(module: list[Path]) -> None:
    path = ROOT / "nodeguard" / "kube" / f"_tmp_allowed_{os.getpid()}.py"
    module.append(path)
    path.write_text("import urllib3  # noqa: F401\n")
    report = _lint_imports()
    assert f"{KUBE_CONTRACT} KEPT" in report, report
    assert KUBE_CONTRACT not in _broken(report)


def test_the_contract_names_the_whole_package() -> None:
    contract = _contracts()[KUBE_CONTRACT]
    assert contract["source_modules"] == ["nodeguard"]
    assert {i.split(" -> ")[0] for i in contract["ignore_imports"]} <= {  # type: ignore[attr-defined]
        "nodeguard.kube",
        "nodeguard.kube.**",
    }


def test_independence_contracts_name_every_action_and_collector_module() -> None:
    contracts = _contracts()
    actions = {
        a.run.__module__ for n, a in ACTIONS.items() if a.run.__module__.startswith("nodeguard.")
    }
    collectors = {
        c.__module__ for c in COLLECTORS.values() if c.__module__.startswith("nodeguard.")
    }

    def modules(name: str) -> set[str]:
        found = contracts[name]["modules"]
        assert isinstance(found, list)
        return {str(m) for m in found}

    assert modules("Actions are independent of each other") == actions
    assert modules("Collectors are independent of each other") == collectors
