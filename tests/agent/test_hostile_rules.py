"""Rule files written to hurt: YAML bombs, huge numbers and nesting, bad encodings, special files.

Each must come back as a ``RuleError`` of ``FILE:LINE: FIELD: message`` lines, quickly and
without building the value it describes; ``nodeguard check`` reports every file and never a
traceback; a reload keeps the last good rules and counts the failure. The agent process under
these files is in tests/test_hostile_agent.py.
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
from tests.agent.test_rules_check import GOOD_RULE

#: ``FILE:LINE: FIELD: message``; a field is a path (``spec.rules[0].for``) or a (word).
LINE = re.compile(r"^(?P<file>/[^:]+):(?P<line>\d+): (?P<field>\(top level\)|\S+): (?P<msg>.+)$")


def _with(extra: str) -> str:
    """GOOD_RULE with ``extra`` lines added to its rule (after ``scope: node``, line 6)."""
    return GOOD_RULE.replace("      scope: node\n", f"      scope: node\n{extra}")


def _laughs(levels: int, key: str = "for") -> str:
    """A billion-laughs document inside a rule: 9 ** levels strings from a few hundred bytes."""
    lines = ['      x0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n']
    for i in range(1, levels):
        refs = ",".join([f"*l{i - 1}"] * 9)
        lines.append(f"      x{i}: &l{i} [{refs}]\n")
    return _with("".join(lines) + f"      {key}: *l{levels - 1}\n")


# name -> (file text or bytes, (line, field, message fragment))
CASES: dict[str, tuple[str | bytes, tuple[int, str, str]]] = {
    "alias-bomb": (_laughs(9), (11, "spec.rules[0].x5", "aliases expanded")),
    "alias-bomb-top": (
        "a: &a [x,x,x,x,x,x,x,x,x,x]\n"
        + "".join(
            f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 10)}]\n"
            for i in range(8)
        ),
        (5, "f", "aliases expanded"),
    ),
    "merge-bomb": (
        "a: &a {k0: 0, k1: 1, k2: 2, k3: 3, k4: 4, k5: 5, k6: 6, k7: 7, k8: 8, k9: 9}\n"
        + "".join(
            f"m{i}: &m{i} {{<<: [{', '.join([f'*{p}'] * 10)}]}}\n"
            for i, p in enumerate(["a", "m0", "m1", "m2", "m3", "m4", "m5"])
        ),
        (4, "m3['<<']", "aliases expanded"),
    ),
    "recursive-alias": (
        _with("      for: &r [*r]\n"),
        (7, "spec.rules[0].for[0]", "recursive alias"),
    ),
    "deep-flow": ("a: " + "[" * 100_000 + "]" * 100_000 + "\n", (1, "(yaml)", "deeper than 64")),
    "deep-block": (
        "".join("  " * i + "a:\n" for i in range(500)),
        (64, "(yaml)", "deeper than 64"),
    ),
    "deep-through-aliases": (
        "a: &a " + "[" * 40 + "]" * 40 + "\nb: " + "[" * 40 + "*a" + "]" * 40 + "\n",
        (2, "b" + "[0]" * 15, "deeper than 64 levels with aliases"),
    ),
    "huge-int": (
        GOOD_RULE.replace("value: 0.05", "value: " + "9" * 5000),
        (8, "spec.rules[0].when[0].value", "a number of 5000 characters"),
    ),
    "huge-float": (
        GOOD_RULE.replace("value: 0.05", "value: 0." + "1" * 400),
        (8, "spec.rules[0].when[0].value", "a number of 402 characters"),
    ),
    "huge-int-tagged": (
        _with(f"      cooldown: !!int {'7' * 4400}\n"),
        (7, "spec.rules[0].cooldown", "a number of 4400 characters"),
    ),
    "60000-digit-duration": (
        _with(f'      for: "{"1" * 60_000}"\n'),
        (7, "spec.rules[0].for", "60000 characters (at most 32)"),
    ),
    "long-duration-with-unit": (
        _with(f"      for: {'1' * 5000}s\n"),
        (7, "spec.rules[0].for", "5001 characters"),
    ),
    "nan-for": (_with("      for: .nan\n"), (7, "spec.rules[0].for", "not a finite duration")),
    "inf-cooldown": (
        _with("      cooldown: .inf\n"),
        (7, "spec.rules[0].cooldown", "not a finite duration"),
    ),
    "overflowing-duration": (
        _with("      cooldown: 1.0e+400\n"),
        (7, "spec.rules[0].cooldown", "not a finite duration"),
    ),
    "nan-window": (
        _with("      maxFirings: {count: 1, window: .NaN}\n"),
        (7, "spec.rules[0].maxFirings.window", "not a finite duration"),
    ),
    "duration-as-list": (
        _with("      for: [1m, 2m]\n"),
        (7, "spec.rules[0].for", "not a duration: list"),
    ),
    "huge-free": (
        GOOD_RULE.replace(
            "- action: cordon", f"- action: evict\n          args: {{free: {'9' * 400}Gi}}"
        ),
        (10, "spec.rules[0].actions[0]", "at most 32 characters"),
    ),
    "latin-1": (
        GOOD_RULE.encode() + b"# caf\xe9 au lait\n",
        (11, "(file)", "not UTF-8: byte 0xe9"),
    ),
    "utf-16": (GOOD_RULE.encode("utf-16"), (1, "(file)", "not UTF-8: byte 0xff")),
    "nul-character": ("a: b\nc: \x00\n", (2, "(yaml)", "character U+0000 is not allowed")),
    "lone-surrogate": (
        _with('      description: "\\ud800"\n'),
        (7, "spec.rules[0].description", "lone surrogate"),
    ),
    "sequence-key": ("? [a, b]\n: 1\n", (1, "(top level)", "a key must be a scalar")),
    "mapping-key": ("spec:\n  ? {a: b}\n  : 1\n", (2, "spec", "a key must be a scalar")),
    "duplicate-key": (
        _with("      for: 1m\n      for: 0s\n"),
        (8, "spec.rules[0].for", "duplicate key 'for'"),
    ),
    "two-documents": (
        GOOD_RULE + "---\n" + GOOD_RULE,
        (11, "(yaml)", "but found another document"),
    ),
    "python-tag": ("a: !!python/object/apply:os.system [true]\n", (1, "(yaml)", "invalid YAML")),
    "not-a-mapping": ("- 1\n- 2\n", (1, "(top level)", "a rule file is a mapping")),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_file_is_one_clear_error_within_bounds(tmp_path: Path, name: str) -> None:
    text, (line, field, fragment) = CASES[name]
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
    parsed = [LINE.match(m) for m in messages]
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
    for name, (text, _) in CASES.items():
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
    assert errors and all(LINE.match(ln) for ln in errors), errors


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
    bad = [CASES[n][0] for n in ("alias-bomb", "60000-digit-duration", "latin-1", "nan-for")]
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
