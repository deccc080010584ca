"""The findings for people: at most 80 columns, grouped by severity (errors first), one entry a
finding: its check and title, the objects, the evidence (memory in binary units, never split
from its number) and the fix, which stays pasteable: a long command is wrapped with ``\\`` at
the end of each part (never inside a quoted word), a long comment continues as a comment (a
comment after code first goes on a line of its own), and a manifest line is never wrapped."""

from __future__ import annotations

import textwrap

from nodeguard.doctor.findings import SEVERITIES, Finding

__all__ = ["WIDTH", "render"]

WIDTH = 80
_INDENT = "    "
_LABEL = 10  # "evidence: "
_NBSP = "\u00a0"  # holds a number to its unit while wrapping


def _wrap(text: str, *, first: str, rest: str, width: int = WIDTH) -> list[str]:
    lines = textwrap.wrap(
        text,
        width=width,
        initial_indent=first,
        subsequent_indent=rest,
        break_on_hyphens=False,
        break_long_words=False,
    )
    return [line.replace(_NBSP, " ") for line in lines] or [first.rstrip()]


def _field(label: str, text: str) -> list[str]:
    head = f"{_INDENT}{label + ':':<{_LABEL}}"
    return _wrap(text, first=head, rest=" " * len(head) + "  ")


def _hold_quoted(line: str) -> str:
    """``line`` with each space inside a shell quote (``'...'``, ``"..."``) held by a no-break
    space, so that wrapping never splits a quoted word: a ``\\`` inside quotes continues
    nothing, and the pasted command would break. Quotes are told as POSIX sh tells them
    (a backslash escapes outside single quotes)."""
    out, quote, escaped = [], "", False
    for ch in line:
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote and ch == quote:
            quote = ""
        elif not quote and ch in "'\"":
            quote = ch
        out.append(_NBSP if ch == " " and quote else ch)
    return "".join(out)


def _continues(previous: str, line: str) -> bool:
    """Whether comment ``line`` goes on from comment ``previous`` (the same indent)."""
    indent = len(line) - len(line.lstrip())
    return (
        previous.lstrip().startswith("#")
        and line.lstrip().startswith("#")
        and indent == len(previous) - len(previous.lstrip())
    )


def _fix(text: str) -> list[str]:
    head = f"{_INDENT}{'fix:':<{_LABEL}}"
    pad = " " * len(head)
    out: list[str] = []
    lines: list[str] = []
    for line in text.splitlines() or [""]:
        # A comment after code goes on a line of its own before it: wrapped, a trailing
        # comment would continue as code (a "\\" in a comment continues nothing).
        code, sep, comment = line.partition("  # ")
        if sep and code.strip():
            lines += [f"{' ' * (len(code) - len(code.lstrip()))}# {comment}", code]
        elif _continues(lines[-1] if lines else "", line):
            # Consecutive comment lines are one paragraph, wrapped again at the table's width:
            # kept as written, a line broken for the source wraps again into a ragged one.
            lines[-1] += " " + line.lstrip()[1:].lstrip()
        else:
            lines.append(line)
    for i, line in enumerate(lines):
        first = head if i == 0 else pad
        if line.lstrip().startswith("#"):
            indent = line[: len(line) - len(line.lstrip())]
            out.extend(_wrap(line.lstrip(), first=first + indent, rest=pad + indent + "# "))
        elif line.startswith("kubectl "):
            # A command wraps with "\\" at the end of each part, still one command pasted.
            parts = _wrap(_hold_quoted(line), first=first, rest=pad + "  ", width=WIDTH - 2)
            out.extend(p + " \\" for p in parts[:-1])
            out.append(parts[-1])
        else:
            # A manifest line is never wrapped: a broken YAML line is no longer YAML.
            out.append(first + line)
    return out


def render(findings: list[Finding]) -> str:
    """The table of ``findings`` (in the order given within a severity), ending with a count."""
    out: list[str] = []
    for severity in reversed(SEVERITIES):
        group = [f for f in findings if f.severity == severity]
        if not group:
            continue
        out.append(f"{severity.upper()} ({len(group)})")
        for f in group:
            out.extend(_wrap(f"{f.check}: {f.title}", first="  ", rest=_INDENT))
            out.extend(_field("objects", ", ".join(str(o) for o in f.objects)))
            facts = "; ".join(fact.shown().replace(" ", _NBSP) for fact in f.evidence)
            out.extend(_field("evidence", facts.replace(f":{_NBSP}", ": ")))
            out.extend(_fix(f.fix))
        out.append("")
    counts = ", ".join(
        f"{sum(f.severity == s for f in findings)} {s}" for s in reversed(SEVERITIES)
    )
    out.append(f"{len(findings)} finding(s): {counts}" if findings else "no findings")
    return "\n".join(out) + "\n"
