"""Rule files written to hurt: YAML bombs, huge numbers and nesting, bad encodings, special files.

Each must come back as a ``RuleError`` of ``FILE:LINE: FIELD: message`` lines, quickly and
without building the value it describes; ``nodeguard check`` reports every file and never a
traceback; a reload keeps the last good rules and counts the failure. The agent process under
these files is in tests/cluster/test_hostile_agent.py.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import socket
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeguard.rules.load import (
    MAX_FILE_BYTES,
    MAX_TOTAL_BYTES,
    RuleError,
    RuleSource,
    load_rule_file,
    load_rules,
)
from tests.support.rule_texts import CHECK_LINE, GOOD_RULE, HOSTILE_RULES


@pytest.mark.parametrize("name", sorted(HOSTILE_RULES))
def test_hostile_file_is_one_clear_error_within_bounds(tmp_path: Path, name: str) -> None:
    text, (line, field, fragment) = HOSTILE_RULES[name]
    path = tmp_path / "rules.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    tracemalloc.start()
    try:
        # A hang guard, not a speed bound (speed is the benchmarks'): before, the 60,000-digit
        # duration took 92 s and the alias bombs ran out of memory; the loader's own bounds
        # (size, depth, aliases, digits) make each a clear error, which the memory peak below
        # holds. The loader runs in a thread so that a regression fails here, not hangs.
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            future = pool.submit(load_rule_file, path)
            with pytest.raises(RuleError) as caught:
                future.result(timeout=60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    messages = caught.value.messages
    parsed = [CHECK_LINE.match(m) for m in messages]
    assert all(parsed), messages
    first = parsed[0]
    assert first is not None
    assert (first["file"], int(first["line"]), first["field"]) == (str(path), line, field), (
        messages[0][:300]
    )
    assert fragment in first["msg"], messages[0][:300]
    assert all(len(m) < 400 for m in messages), "an error message must not carry the input"
    assert peak < 64 << 20, f"{peak} bytes allocated"


@pytest.fixture
def special_files(tmp_path: Path) -> Iterator[dict[str, tuple[Path, str]]]:
    """Entries of a rules directory that are not regular files, with the error each gives."""
    d = tmp_path / "rules"
    d.mkdir()
    os.mkfifo(d / "fifo.yaml")
    (d / "zero.yaml").symlink_to("/dev/zero")
    (d / "urandom.yaml").symlink_to("/dev/urandom")
    (d / "loop.yaml").symlink_to("loop.yaml")
    (d / "dangling.yaml").symlink_to("nowhere.yaml")
    (d / "dir.yaml").mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(d / "socket.yaml"))
    with (d / "huge.yaml").open("wb") as f:
        f.truncate(64 << 20)  # sparse: 64 MiB of NULs that take no disk
    (d / "big.yaml").write_text(GOOD_RULE + "#" * MAX_FILE_BYTES + "\n")
    (d / "good.yaml").write_text(GOOD_RULE)
    try:
        yield {
            "fifo": (d / "fifo.yaml", "(file): a FIFO, not a regular file"),
            "zero": (d / "zero.yaml", "(file): a character device, not a regular file"),
            "urandom": (d / "urandom.yaml", "(file): a character device, not a regular file"),
            "loop": (d / "loop.yaml", "(file): cannot read: a symlink loop"),
            "dangling": (d / "dangling.yaml", "(file): cannot read: No such file or directory"),
            "dir": (d / "dir.yaml", "(file): a directory, not a regular file"),
            "socket": (d / "socket.yaml", "(file): a socket, not a regular file"),
            "huge": (d / "huge.yaml", f"(file): larger than {MAX_FILE_BYTES} bytes"),
            "big": (d / "big.yaml", f"(file): larger than {MAX_FILE_BYTES} bytes"),
        }
    finally:
        sock.close()


def test_special_files_are_refused_without_reading_them(
    special_files: dict[str, tuple[Path, str]],
) -> None:
    for path, message in special_files.values():
        # Read, a FIFO would block for ever and /dev/zero never end: the loader runs in a
        # thread, and one that is still at it after a minute has read what it must not.
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            future = pool.submit(load_rule_file, path)
            with pytest.raises(RuleError) as caught:
                future.result(timeout=60)
        assert caught.value.messages == [f"{path}:1: {message}"]


def test_check_reports_every_file_and_never_a_traceback(
    tmp_path: Path, special_files: dict[str, tuple[Path, str]]
) -> None:
    directory = next(iter(special_files.values()))[0].parent
    for name, (text, _) in HOSTILE_RULES.items():
        data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
        (directory / f"case-{name}.yaml").write_bytes(data)
    (directory / "random.yaml").write_bytes(bytes(range(256)) * 16)
    out = subprocess.run(
        [sys.executable, "-m", "nodeguard", "check", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 1
    assert "Traceback" not in out.stdout + out.stderr
    checked = re.findall(r"^Checking (.+)$", out.stdout, re.M)
    expected = sorted(str(p) for p in directory.iterdir() if p.name != "socket.yaml")
    expected.append(str(directory / "socket.yaml"))
    assert sorted(checked) == sorted(expected)
    assert f"Checking {directory / 'good.yaml'}\n  SUCCESS: 1 rules found" in out.stdout
    assert out.stdout.count("FAILED") == len(checked) - 1
    errors = [ln for ln in out.stdout.splitlines() if not ln.startswith(("Checking", "  "))]
    assert errors and all(CHECK_LINE.match(ln) for ln in errors), errors


def test_rule_files_together_are_bounded(tmp_path: Path) -> None:
    filler = "#" * (MAX_FILE_BYTES - len(GOOD_RULE) - 64) + "\n"
    count = MAX_TOTAL_BYTES // MAX_FILE_BYTES + 1
    for i in range(count):
        (tmp_path / f"r{i}.yaml").write_text(
            GOOD_RULE.replace("name: low", f"name: low{i}") + filler
        )
    with pytest.raises(RuleError) as caught:
        load_rules([tmp_path])
    (message,) = caught.value.messages
    assert message.startswith(f"{tmp_path / f'r{count - 1}.yaml'}:1: (file): ")
    assert f"together are larger than {MAX_TOTAL_BYTES} bytes" in message
    load_rules([tmp_path / f"r{i}.yaml" for i in range(count - 1)])  # one less is fine


def test_reload_keeps_the_last_good_rules_and_counts_each_bad_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(GOOD_RULE)
    source = RuleSource(paths=[path])
    assert [r.name for r in source.current.rules] == ["low"]
    bad = [
        HOSTILE_RULES[n][0] for n in ("alias-bomb", "60000-digit-duration", "latin-1", "nan-for")
    ]
    for i, text in enumerate(bad, start=1):
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
        os.utime(path, (i, i))  # a change the stamp sees even within one second
        caplog.clear()
        assert source.maybe_reload() is False
        assert source.errors_total == i
        assert [r.levelname for r in caplog.records] == ["ERROR"]
        assert f"the last good rules stay in force:\n{path}:" in caplog.text
        assert [r.name for r in source.current.rules] == ["low"]
    path.unlink()
    os.mkfifo(path)
    caplog.clear()
    assert source.maybe_reload() is False
    assert source.errors_total == len(bad) + 1
    assert f"in force:\n{path}:1: (file): a FIFO, not a regular file" in caplog.text


def test_a_directory_whose_files_all_went_keeps_the_last_good_rules(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A ConfigMap mount that lost its keys: every rule silently off would be the worst reading.
    assert RuleSource(paths=[tmp_path]).current.rules == ()
    assert f"no rule file (*.yaml, *.yml) in {tmp_path}: no rule is in force" in caplog.text
    (tmp_path / "rules.yaml").write_text(GOOD_RULE)
    source = RuleSource(paths=[tmp_path])
    (tmp_path / "rules.yaml").unlink()
    assert source.maybe_reload() is False
    assert source.errors_total == 1
    assert [r.name for r in source.current.rules] == ["low"]
    assert f"in force:\n{tmp_path}: no rule file (*.yaml, *.yml) any more" in caplog.text
    # Turning every rule off is said with an empty rule file.
    (tmp_path / "off.yaml").write_text(GOOD_RULE.split("  rules:")[0] + "  rules: []\n")
    assert source.maybe_reload() is True
    assert source.current.rules == ()


def test_a_file_with_a_byte_order_mark_is_fine(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD_RULE.encode())
    assert [r.name for r in load_rule_file(path).spec.rules] == ["low"]
