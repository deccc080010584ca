"""The findings for people: at most 80 columns, grouped by severity (errors first), one entry a
finding: its check and title, the objects, the evidence (memory in binary units) and the fix
(each of its lines kept whole where it fits, a shell command wrapped with ``\\``)."""

from __future__ import annotations

import textwrap

from nodeguard.doctor.findings import SEVERITIES, Finding

__all__ = ["WIDTH", "render"]

WIDTH = 80
_INDENT = "    "
_LABEL = 10  # "evidence: "


def _field(label: str, text: str) -> list[str]:
    head = f"{_INDENT}{label + ':':<{_LABEL}}"
    rest = " " * len(head)
    lines: list[str] = []
    for i, part in enumerate(text.splitlines() or [""]):
        lines.extend(
            textwrap.wrap(
                part,
                width=WIDTH,
                initial_indent=head if i == 0 else rest,
                subsequent_indent=rest + "  ",
                break_on_hyphens=False,
                break_long_words=True,
            )
            or [head.rstrip()]
        )
    return lines


def render(findings: list[Finding]) -> str:
    """The table of ``findings`` (in the order given within a severity), ending with a count."""
    out: list[str] = []
    for severity in reversed(SEVERITIES):
        group = [f for f in findings if f.severity == severity]
        if not group:
            continue
        out.append(f"{severity.upper()} ({len(group)})")
        for f in group:
            out.extend(
                textwrap.wrap(
                    f"{f.check}: {f.title}",
                    width=WIDTH,
                    initial_indent="  ",
                    subsequent_indent=_INDENT,
                )
            )
            out.extend(_field("objects", ", ".join(str(o) for o in f.objects)))
            out.extend(_field("evidence", "; ".join(fact.shown() for fact in f.evidence)))
            out.extend(_field("fix", f.fix))
        out.append("")
    counts = ", ".join(
        f"{sum(f.severity == s for f in findings)} {s}" for s in reversed(SEVERITIES)
    )
    out.append(f"{len(findings)} finding(s): {counts}" if findings else "no findings")
    return "\n".join(out) + "\n"
