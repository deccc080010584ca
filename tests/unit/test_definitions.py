"""No definition in nodeguard/ (function, method or class) runs over 150 lines.

A definition's length is ``end_lineno - lineno + 1`` of its ``ast`` node (decorators left out),
the way a reader meets it on the page. Modules of about 150 lines, named for what they do, are
the kopf habit the project follows (shared STYLE.md); a class longer than that holds more than
one job.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nodeguard

MAX_LINES = 150
PACKAGE = Path(nodeguard.__file__).parent

_Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def _long_definitions(root: Path = PACKAGE) -> dict[str, int]:
    """``"<path under root>:<qualified name>"`` -> lines, for each definition over the limit,
    nested ones included."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _Definition):
                name = f"{prefix}{child.name}"
                assert child.end_lineno is not None
                lines = child.end_lineno - child.lineno + 1
                if lines > MAX_LINES:
                    found[f"{where}:{name}"] = lines
                visit(child, f"{name}.", where)
            else:
                visit(child, prefix, where)

    for path in sorted(root.rglob("*.py")):
        visit(ast.parse(path.read_text(), filename=str(path)), "", str(path.relative_to(root)))
    return found


def test_no_definition_is_over_150_lines() -> None:
    over = _long_definitions()
    listing = "\n".join(f"  {k}: {v} lines" for k, v in sorted(over.items(), key=lambda i: -i[1]))
    assert not over, f"definitions over {MAX_LINES} lines:\n{listing}"


def test_the_walk_finds_what_is_long_and_nothing_else(tmp_path: Path) -> None:
    """The look-alikes: a function of exactly 150 lines is not over; a method of 151 is, and
    so is the class around it; a long class of short methods is the class's finding alone; an
    ``async def`` nested in a function counts as itself."""
    ok = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES - 1))
    over = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "a.py").write_text(f"def fits() -> None:\n{ok}\n")
    (tmp_path / "b.py").write_text(f"class B:\n    def long(self) -> None:\n{over}\n")
    short = "".join(f"    def m{i}(self) -> None:\n        pass\n" for i in range(80))
    (tmp_path / "c.py").write_text(f"class C:\n{short}")
    nested = "\n".join(f"        y{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "d.py").write_text(f"def f() -> None:\n    async def g() -> None:\n{nested}\n")
    assert _long_definitions(tmp_path) == {
        "b.py:B": MAX_LINES + 2,
        "b.py:B.long": MAX_LINES + 1,
        "c.py:C": 161,
        "d.py:f": MAX_LINES + 2,
        "d.py:f.g": MAX_LINES + 1,
    }
