"""The README's quick start on a clean checkout (a copy of the repository's files, no .venv):
``scripts/run`` says what it installs and shows pip's progress, keeps its state in the checkout
and says where; ``scripts/test-cluster`` then works from the .venv that made, adding what the
cluster needs (cryptography) and saying so."""

from __future__ import annotations

import fcntl
import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
import yaml

from tests.support import progress
from tests.support.agent import free_port, wait_until
from tests.support.deploy.container import http

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's files (committed or not, ignored ones left out) in a new directory."""
    root = tmp_path_factory.mktemp("clean") / "nodeguard"
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        src = REPO / name
        if src.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / name)
    return root


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "VIRTUAL_"))}


def _lines(stream: IO[str]) -> Iterator[str]:
    """The stream's lines as they come, from a thread (a read never blocks the test)."""
    q: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in stream:
            q.put(line)
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    while (line := q.get(timeout=600)) is not None:
        yield line


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_scripts_run_installs_with_progress_and_keeps_state_in_the_checkout(
    checkout: Path,
) -> None:
    port = free_port()
    proc = subprocess.Popen(
        ["scripts/run", f"--listen-address=127.0.0.1:{port}", "--rules", "rules/default.yaml"],
        cwd=checkout,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
    )
    assert proc.stdout is not None
    said: list[str] = []
    try:
        for line in _lines(proc.stdout):
            said.append(line)
            if "nodeguard " in line and "serving on" in line:
                break
        wait_until(
            "the quickstart's agent ready",
            lambda: http(f"http://127.0.0.1:{port}/readyz")[0] == 200,
            timeout=60,
            step=0.2,
            detail=lambda: "".join(said),
        )
    finally:
        _stop(proc)
    text = "".join(said)
    assert "== creating .venv" in text and "== installing nodeguard into .venv" in text, text
    assert "Successfully installed" in text  # pip's own progress, not -q
    state = checkout / ".nodeguard" / "state"
    assert f"state in {checkout}/.nodeguard/state" in text
    assert f"state={state}/remediation-state.json" in text  # the agent's first line says so
    shipped = yaml.safe_load((checkout / "rules" / "default.yaml").read_text())["spec"]["rules"]
    assert f"rules={len(shipped)} alert_rules=0" in text and len(shipped) >= 6
    assert state.is_dir()
    # Once installed, nothing more to install.
    again = subprocess.run(
        ["scripts/run", "--help"],
        cwd=checkout,
        capture_output=True,
        text=True,
        env=_env(),
        check=False,
    )
    assert again.returncode == 0 and "== installing" not in again.stderr


def test_scripts_test_cluster_works_from_the_quick_starts_venv(checkout: Path) -> None:
    venv = checkout / ".venv" / "bin" / "python"
    assert venv.exists(), "scripts/run made .venv"
    missing = subprocess.run(
        [str(venv), "-c", "import cryptography"], capture_output=True, check=False
    )
    assert missing.returncode != 0, "the quick start's .venv has no cryptography"
    proc = subprocess.Popen(
        ["scripts/test-cluster"],
        cwd=checkout,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        kubeconfig = Path(next(_lines(proc.stdout)).strip())
        assert kubeconfig.is_file(), kubeconfig
    finally:
        _stop(proc)
    err = proc.stderr.read()
    assert "== installing cryptography into .venv" in err, err
    assert "kube-apiserver v1." in err and "ready in" in err


def test_a_long_step_says_it_is_under_way(capsys: pytest.CaptureFixture[str]) -> None:
    with progress.step("building x", every=0.05):
        time.sleep(0.3)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "building x ..." and err[-1] == "building x: done in 0s"
    assert "  ... still building x (0s)" in err[1:-1]


def test_waiting_for_another_build_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / ".lock"
    with open(path, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        threading.Timer(0.3, fcntl.flock, (held, fcntl.LOCK_UN)).start()
        with open(path, "w") as mine:
            progress.take_lock(mine, what="the test control plane")
    err = capsys.readouterr().err
    assert f"waiting for another process that builds the test control plane ({path})" in err
