"""``parse_flat_keyed`` with ``keys`` finds values by search (:func:`nodeguard.sources.files._pick`)
where the text is plain; that search must give exactly what the plain line loop gives, for any
text: real ``memory.stat`` lines, near misses (a key that is a prefix of another, a key inside
a line, a value with a sign, an underscore, a second token, tabs, non-ASCII digits, a missing
final newline) and their mixes. Derandomized, with a fixed budget."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeguard.sources.files import parse_flat_keyed

KEYS = frozenset({"inactive_file", "total_inactive_file", "anon", "oom_kill", "max"})
WORDS = [*KEYS, "inactive", "file", "active_file", "oom", "oom_kill_disable", "maxx", "x"]
VALUES = ["0", "1", "42", "-7", "+3", "1_000", "007", "٣", "1.5", "", "9" * 25, "1 2", "0x10"]
SEPARATORS = [" ", "  ", "\t", " \t", ""]
ENDS = ["\r\n", "\n\n", " \n", "", *"\r\v\f\x1c\x1d\x1e\x1f\x85\u2028"]


def line_loop(text: str, keys: frozenset[str]) -> dict[str, int]:
    """The reference: every line split on white space; two tokens, a wanted key and an int."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in keys:
            with contextlib.suppress(ValueError):
                out[parts[0]] = int(parts[1])
    return out


# Real files are mostly plain lines; each text mixes them with a few odd ones, so that the odd
# part meets the plain search (a tab or a non-ASCII character anywhere sends a text to the loop).
plain_lines = st.builds(
    lambda word, value: f"{word} {value}\n",
    st.sampled_from(WORDS),
    st.sampled_from(["0", "1", "42", "-7", "1_000", "1 2", "1.5"]),
)


def _odd(line: tuple[str, str, str], hazard: tuple[int, str]) -> str:
    """A plain line with one part replaced: the lead, the separator, the value or the end."""
    parts = ["", *line, "\n"]  # lead, word, separator, value, end
    parts[hazard[0]] = hazard[1]
    return "".join(parts)


odd_lines = st.builds(
    _odd,
    st.tuples(st.sampled_from(WORDS), st.just(" "), st.sampled_from(VALUES)),
    st.one_of(
        st.tuples(st.just(0), st.sampled_from([" ", "\t", "  "])),
        st.tuples(st.just(2), st.sampled_from(SEPARATORS)),
        st.tuples(st.just(4), st.sampled_from(ENDS)),
    ),
)
texts = st.lists(st.one_of(plain_lines, plain_lines, plain_lines, odd_lines), max_size=12).map(
    "".join
) | st.text(alphabet=st.sampled_from([*"anoxfilemk_ \t\n\r\v0123456789-+٣"]), max_size=80)


@settings(max_examples=3000, derandomize=True, deadline=None)
@given(text=texts, keys=st.sets(st.sampled_from(sorted(KEYS)), min_size=1).map(frozenset))
def test_the_search_gives_what_the_line_loop_gives(text: str, keys: frozenset[str]) -> None:
    got = parse_flat_keyed(text, keys)
    want = line_loop(text, keys)
    assert got == want


def test_a_real_memory_stat() -> None:
    text = "anon 4096\nfile 8192\ninactive_file 123\nactive_file 5\nanon_thp 0\n"
    assert parse_flat_keyed(text, KEYS) == {"anon": 4096, "inactive_file": 123}


# Every character that ends a line for str.splitlines or is white space for str.split, between
# two lines, at a line's start and after its value: the cases the plain search must leave to
# the loop.
SPLITTERS = [*"\r\v\f\t\x1c\x1d\x1e\x1f\x85\xa0\u2028\u2029\u3000", "\r\n", " "]


@pytest.mark.parametrize("c", SPLITTERS, ids=[f"U+{ord(c[0]):04X}" for c in SPLITTERS])
@pytest.mark.parametrize("shape", ["anon 1{c}max 2\n", "anon 1\n{c}max 2\n", "anon{c}1\nmax 2{c}"])
def test_each_line_end_and_space(c: str, shape: str) -> None:
    text = shape.format(c=c)
    assert parse_flat_keyed(text, KEYS) == line_loop(text, KEYS)
