"""CONTRIBUTING.md's rules for the tests themselves, read from their source (``ast``):

- a test module imports from ``tests/support/``, never a private name (``_x``) of another
  module of ``tests/``, and never another ``tests/<tier>/test_*`` module, but for the one
  exception CONTRIBUTING.md names: ``tests/unit/test_one_registration.py`` runs the README
  checks of ``test_docs_tables`` and ``test_registry`` (their public ``test_*`` functions alone);
- no test asserts on wall-clock time, and no module loops on a clock: waiting is
  ``tests.support.agent.wait_until`` / ``wait_until_async`` (a loop that does more than wait,
  a measurement, says so on the line above: ``# not a wait: ...``);
- real kernel cgroups only under a private root (``tests/support/kernel_cgroup.py``): no other
  module joins ``kubepods`` to the real ``/sys/fs/cgroup``, and a module that makes kubelet
  cgroups reads them through its private sysfs view (``HostPaths(sysfs=...)``), never the
  machine's ``/sys``.

Each check is also run on planted files in ``tmp_path``, violations beside their look-alikes.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

#: ``(importer, imported)``: the one import of a test module by another (CONTRIBUTING.md).
ALLOWED_TEST_IMPORTS = {
    ("tests.unit.test_one_registration", "tests.unit.test_docs_tables"),
    ("tests.unit.test_one_registration", "tests.unit.test_registry"),
}
#: Where a clock may be looped on: the wait helpers.
WAIT_HELPERS = {("support/agent.py", "wait_until"), ("support/agent.py", "wait_until_async")}
#: The one module that makes cgroups on the real cgroupfs under kubepods (a private root's).
KERNEL_CGROUP = "support/kernel_cgroup.py"
#: What makes kubelet-shaped cgroups: a module that imports one reads through a private view.
CGROUP_MAKERS = {"kubelet_cgroup", "pod_container", "private_kubepods"}

_TEST_MODULE = re.compile(r"^tests\.(unit|agent|kernel|cluster|image)\.test_\w+$")
_CLOCKS = {"monotonic", "monotonic_ns", "time", "time_ns", "perf_counter", "perf_counter_ns"}
_REAL_CGROUPFS = "/sys/fs/cgroup"


Module = tuple[str, str, ast.Module, list[str]]


def _modules(root: Path) -> tuple[Module, ...]:
    """``(path under root, dotted name as tests.…, tree, source lines)`` of each module (the
    tree of ``tests/`` parsed once for the three checks)."""
    return _parse(root) if root != TESTS else _parse_tests()


@functools.cache
def _parse_tests() -> tuple[Module, ...]:
    return _parse(TESTS)


def _parse(root: Path) -> tuple[Module, ...]:
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        text = path.read_text()
        tree = ast.parse(text, str(path))
        out.append((str(rel), ".".join(["tests", *parts]), tree, text.splitlines()))
    return tuple(out)


def _resolve(node: ast.ImportFrom, *, package: str) -> str:
    """The module an ``import from`` names, relative ones resolved from ``package``."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


# -- 1. imports ------------------------------------------------------------------------------
def _imported(node: ast.stmt, *, package: str) -> list[tuple[str, str]]:
    """``(what, local name)`` for each name of ``tests.…`` an import statement binds: a
    module (``tests.unit.test_x``) or a module's attribute (``tests.support.m._y``)."""
    if isinstance(node, ast.Import):
        return [(a.name, a.asname or a.name) for a in node.names if a.name.startswith("tests.")]
    if not isinstance(node, ast.ImportFrom):
        return []
    source = _resolve(node, package=package)
    if source != "tests" and not source.startswith("tests."):
        return []
    return [(f"{source}.{a.name}", a.asname or a.name) for a in node.names]


def _test_module(what: str) -> str | None:
    """The test module ``what`` is or is in (``tests.unit.test_b.x``: ``tests.unit.test_b``)."""
    prefix = ".".join(what.split(".")[:3])
    return prefix if _TEST_MODULE.match(prefix) else None


def import_violations(root: Path = TESTS) -> list[str]:
    """Each import of a private name of ``tests.…``, and of a test module by another (but
    :data:`ALLOWED_TEST_IMPORTS`, whose modules may be used for their ``test_*`` names only)."""
    found: list[str] = []
    for rel, name, tree, _ in _modules(root):
        package = name if rel.endswith("__init__.py") else name.rpartition(".")[0]
        allowed: dict[str, str] = {}  # local name -> an allowed test module
        for node in ast.walk(tree):
            if not isinstance(node, ast.stmt):
                continue
            for what, local in _imported(node, package=package):
                last = what.rpartition(".")[2]
                if last.startswith("_") and not last.startswith("__"):
                    found.append(f"{rel}:{node.lineno}: private {what}")
                module = _test_module(what)
                if module is None or module == name:
                    continue
                if (name, module) in ALLOWED_TEST_IMPORTS:
                    allowed[local] = module
                else:
                    found.append(f"{rel}:{node.lineno}: imports the test module {module}")
        found += [
            f"{rel}:{n.lineno}: {allowed[n.value.id]}.{n.attr}"
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id in allowed
            and not n.attr.startswith("test_")
        ]
    return found


def test_no_test_module_imports_another_or_a_private_name() -> None:
    assert import_violations() == []


def test_the_import_check_finds_what_is_planted(tmp_path: Path) -> None:
    (tmp_path / "support").mkdir()
    (tmp_path / "support" / "helpers.py").write_text("def _private(): ...\ndef public(): ...\n")
    (tmp_path / "unit").mkdir()
    (tmp_path / "unit" / "test_a.py").write_text(
        "from tests.support.helpers import _private, public\n"  # a private name: found
        "from tests.support.helpers import __doc__\n"  # a dunder: not private
        "from tests.unit.test_b import test_x\n"  # another test module: found
        "from tests.unit import test_c\n"  # the same, by its package: found
        "import tests.cluster.test_d\n"  # the same, as a module: found
        "from ..support.helpers import _private as p\n"  # relative: found
        "import _thread\n"  # not of tests/: fine
    )
    (tmp_path / "unit" / "test_one_registration.py").write_text(
        "from tests.unit import test_docs_tables, test_registry\n"
        "test_docs_tables.test_the_signal_table_is_the_registry()\n"  # its public tests: fine
        "test_registry.ACTIONS\n"  # anything else of it: found
    )
    assert import_violations(tmp_path) == [
        "unit/test_a.py:1: private tests.support.helpers._private",
        "unit/test_a.py:3: imports the test module tests.unit.test_b",
        "unit/test_a.py:4: imports the test module tests.unit.test_c",
        "unit/test_a.py:5: imports the test module tests.cluster.test_d",
        "unit/test_a.py:6: private tests.support.helpers._private",
        "unit/test_one_registration.py:3: tests.unit.test_registry.ACTIONS",
    ]


# -- 2. wall-clock time ----------------------------------------------------------------------
def _is_clock(node: ast.AST, clocks: set[str]) -> bool:
    """A call of ``time.monotonic()`` (and the like), or of a clock imported from ``time``."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "time":
        return f.attr in _CLOCKS
    return isinstance(f, ast.Name) and f.id in clocks


def _timed(node: ast.AST, *, clocks: set[str], tainted: set[str]) -> bool:
    """Whether ``node`` reads a clock, directly or through a name holding a reading."""
    return any(
        _is_clock(n, clocks) or (isinstance(n, ast.Name) and n.id in tainted)
        for n in ast.walk(node)
    )


def _reading(node: ast.AST, *, clocks: set[str], tainted: set[str]) -> bool:
    """Whether ``node`` computes a clock reading: a clock, a name holding one, arithmetic on
    them and numbers, or ``max``/``min``/``abs``/``round`` of one (``env_for(now=...)`` does
    not: a value built with a reading is not a reading)."""
    if _is_clock(node, clocks):
        return True
    if isinstance(node, ast.Name):
        return node.id in tainted
    if isinstance(node, ast.UnaryOp):
        return _reading(node.operand, clocks=clocks, tainted=tainted)
    if isinstance(node, ast.BinOp):
        return any(_reading(x, clocks=clocks, tainted=tainted) for x in (node.left, node.right))
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in {"max", "min", "abs", "round"}
        and any(_reading(x, clocks=clocks, tainted=tainted) for x in node.args)
    )


def _names(targets: list[ast.expr]) -> set[str]:
    """The plain names assigned (``a``, ``a, b``), not ``self.x`` or ``d[k]``."""
    out: set[str] = set()
    for t in targets:
        if isinstance(t, ast.Name):
            out.add(t.id)
        elif isinstance(t, ast.Tuple | ast.List):
            out |= _names(list(t.elts))
    return out


def _scopes(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    yield "<module>", tree
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node


def _own(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``scope``, not those of the functions defined in it."""
    for child in ast.iter_child_nodes(scope):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        yield child
        yield from _own(child)


def clock_violations(root: Path = TESTS) -> list[str]:
    """Each ``assert`` comparing a clock reading (a call of a clock, or a name assigned from
    one in the same function), and each loop on a clock or a ``deadline``, outside
    :data:`WAIT_HELPERS` and but for a loop under a ``# not a wait:`` line."""
    found: list[str] = []
    for rel, _, tree, lines in _modules(root):
        clocks = {
            a.asname or a.name
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module == "time"
            for a in n.names
            if a.name in _CLOCKS
        }
        for fn, scope in _scopes(tree):
            if (rel, fn) in WAIT_HELPERS:
                continue
            nodes = list(_own(scope))
            tainted: set[str] = {"deadline"}
            for n in nodes:
                if isinstance(n, ast.Assign):
                    value, targets = n.value, n.targets
                elif isinstance(n, ast.AnnAssign | ast.AugAssign) and n.value is not None:
                    value, targets = n.value, [n.target]
                else:
                    continue
                if _reading(value, clocks=clocks, tainted=tainted):
                    tainted |= _names(targets)
            for n in nodes:
                if isinstance(n, ast.Assert) and any(
                    isinstance(c, ast.Compare) and _timed(c, clocks=clocks, tainted=tainted)
                    for c in ast.walk(n.test)
                ):
                    found.append(f"{rel}:{n.lineno}: asserts on wall-clock time")
                elif isinstance(n, ast.While) and _timed(n.test, clocks=clocks, tainted=tainted):
                    if not lines[n.lineno - 2].strip().startswith("# not a wait:"):
                        found.append(f"{rel}:{n.lineno}: loops on a clock")
                elif isinstance(n, ast.Name) and n.id == "deadline":
                    found.append(f"{rel}:{n.lineno}: a deadline")
    return sorted(set(found), key=lambda f: (f.split(":")[0], int(f.split(":")[1])))


def test_no_test_asserts_on_wall_clock_time_or_loops_on_a_clock() -> None:
    assert clock_violations() == []


def test_the_clock_check_finds_what_is_planted(tmp_path: Path) -> None:
    # The planted sources are fixture files, not strings here, so that this file holds no
    # wall-clock assert of its own, even as text.
    planted = TESTS / "fixtures/clock_rules"
    (tmp_path / "support").mkdir()
    for name in ("support/agent.py", "test_x.py"):
        (tmp_path / name).write_text((planted / f"{name}.txt").read_text())
    assert clock_violations(tmp_path) == [
        "support/agent.py:6: loops on a clock",
        "test_x.py:6: asserts on wall-clock time",
        "test_x.py:7: asserts on wall-clock time",
        "test_x.py:19: loops on a clock",
        "test_x.py:21: a deadline",
    ]


# -- 3. kernel cgroups under a private root --------------------------------------------------
def _real_cgroupfs(node: ast.AST, tainted: set[str]) -> bool:
    """Whether ``node`` is (or is built from) the real cgroup mount: a ``/sys/fs/cgroup``
    string, ``CGROUP_FS``, ``writable_memory_controller()`` or a name assigned from them."""
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            if n.value.startswith(_REAL_CGROUPFS):
                return True
        elif isinstance(n, ast.Name) and (n.id in tainted or n.id == "CGROUP_FS"):
            return True
        elif isinstance(n, ast.Call):
            f = n.func
            called = f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
            if called == "writable_memory_controller":
                return True
    return False


def _says_kubepods(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and "kubepods" in n.value
        for n in ast.walk(node)
    )


def cgroup_violations(root: Path = TESTS) -> list[str]:
    """Each place outside :data:`KERNEL_CGROUP` that names kubepods on the real cgroupfs (a
    string of both, or a path join of one onto the other), and each ``HostPaths(...)``
    without ``sysfs=`` in a module that makes kubelet cgroups (it would read the machine's)."""
    found: list[str] = []
    for rel, _, tree, _ in _modules(root):
        if rel == KERNEL_CGROUP:
            continue
        makes = any(
            isinstance(n, ast.ImportFrom) and any(a.name in CGROUP_MAKERS for a in n.names)
            for n in ast.walk(tree)
        )
        for _, scope in _scopes(tree):
            nodes = list(_own(scope))
            tainted: set[str] = set()
            for n in nodes:
                if isinstance(n, ast.Assign) and _real_cgroupfs(n.value, tainted):
                    tainted |= _names(n.targets)
            for n in nodes:
                if isinstance(n, ast.Constant) and isinstance(n.value, str):
                    if n.value.startswith(_REAL_CGROUPFS) and "kubepods" in n.value:
                        found.append(f"{rel}:{n.lineno}: kubepods on the real cgroupfs")
                elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div):
                    if _real_cgroupfs(n.left, tainted) and _says_kubepods(n.right):
                        found.append(f"{rel}:{n.lineno}: kubepods on the real cgroupfs")
                elif (
                    makes
                    and isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Name)
                    and n.func.id == "HostPaths"
                    and "sysfs" not in {k.arg for k in n.keywords}
                ):
                    found.append(f"{rel}:{n.lineno}: HostPaths() reads the machine's cgroups")
    return sorted(set(found), key=lambda f: (f.split(":")[0], int(f.split(":")[1])))


def test_kernel_cgroups_only_under_a_private_root() -> None:
    assert cgroup_violations() == []


def test_the_cgroup_check_finds_what_is_planted(tmp_path: Path) -> None:
    (tmp_path / "support").mkdir()
    (tmp_path / "support" / "kernel_cgroup.py").write_text(
        'CGROUP_FS = "/sys/fs/cgroup"\nKP = CGROUP_FS / "kubepods"\n'  # the helper: fine
    )
    (tmp_path / "test_k.py").write_text(
        "from pathlib import Path\n"
        "from tests.support.kernel_cgroup import CGROUP_FS, kubelet_cgroup\n"
        "from nodeguard.paths import HostPaths\n"
        "def test_a(tmp_path, pods):\n"
        '    Path("/sys/fs/cgroup/memory/kubepods/burstable").mkdir()\n'  # found
        '    (CGROUP_FS / "memory" / "kubepods").mkdir()\n'  # found
        "    version, root = writable_memory_controller()\n"
        '    (root / "kubepods/besteffort").mkdir()\n'  # found, through the names
        '    (tmp_path / "sys/fs/cgroup/kubepods.slice").mkdir()\n'  # a fixture tree: fine
        '    (pods.kubepods / "burstable").mkdir()\n'  # the private root: fine
        '    (root / "nodeguard-hostile").mkdir()\n'  # no kubepods: fine
        "    HostPaths(sysfs=pods.sysfs)\n"  # the private view: fine
        "    HostPaths()\n"  # the machine's /sys, where kubelet cgroups are made: found
    )
    (tmp_path / "test_fixture.py").write_text(
        "from nodeguard.paths import HostPaths\nHostPaths()\n"  # makes no cgroup: fine
    )
    assert cgroup_violations(tmp_path) == [
        "test_k.py:5: kubepods on the real cgroupfs",
        "test_k.py:6: kubepods on the real cgroupfs",
        "test_k.py:8: kubepods on the real cgroupfs",
        "test_k.py:13: HostPaths() reads the machine's cgroups",
    ]
