"""Headless Chromium (Debian's ``chromium`` package) on an incident page: the DOM after its
scripts ran (``--dump-dom``), and a screenshot, for tests/agent/test_incident_page.py and
the README's picture (``scripts/incident-screenshot``, which runs :func:`main`): one command,
so the picture is what the test checks.

Chromium runs as root here (``--no-sandbox``: its sandbox refuses root), with no GPU
(``--disable-gpu``: software rendering), a profile of its own in a temporary directory, and
``--virtual-time-budget`` so it waits for the page's scripts before it dumps or shoots (the
page draws synchronously, with no animation, so the budget is a bound, not a sleep).

    python -m tests.support.browser RECORD.json OUT.png
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from nodeguard.remediation.incident_page import page

#: The screenshot's size, as the README shows it.
WINDOW = (1200, 1400)


def chromium() -> str | None:
    """The path of ``chromium``, ``None`` where it is not installed."""
    return shutil.which("chromium")


def _run(url: str, *flags: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    binary = chromium()
    if binary is None:
        raise RuntimeError("chromium not found: install Debian's chromium package")
    argv = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={workdir / 'chromium-profile'}",
        "--virtual-time-budget=10000",
        *flags,
        url,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{argv} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done


def dump_dom(html: Path, *, workdir: Path) -> str:
    """The page's DOM, serialized, after its scripts ran."""
    return _run(html.resolve().as_uri(), "--dump-dom", workdir=workdir).stdout


def screenshot(html: Path, *, out: Path, workdir: Path) -> None:
    """A PNG of the page's first :data:`WINDOW` pixels, written to ``out``."""
    width, height = WINDOW
    _run(
        html.resolve().as_uri(),
        f"--window-size={width},{height}",
        f"--screenshot={out.resolve()}",
        workdir=workdir,
    )


def main(argv: list[str]) -> int:
    """``RECORD.json OUT.png``: the screenshot of the record's page."""
    record_path, out = (Path(a) for a in argv)
    record = json.loads(record_path.read_text())
    with tempfile.TemporaryDirectory(prefix="nodeguard-page-") as tmp:
        html = Path(tmp) / "page.html"
        html.write_text(page(record=record), encoding="utf-8")
        screenshot(html, out=out, workdir=Path(tmp))
    print(f"wrote {out}: the page of {record['id']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
