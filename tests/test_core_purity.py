"""No process-global mutable state in the pure core (aiogc/core/).

A module-level dict, list, set, deque, WeakKeyDictionary... in the core is state shared by
every PS and worker of the process: caches belong to objects a driver creates and injects
(``WorkerCache``), and tables are immutable (MappingProxyType, frozenset, tuple). Nor does a
core function rebind a module global (``global``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "aiogc" / "core"

#: constructors whose result is a mutable container
MUTABLE_CALLS = frozenset({
    "dict", "list", "set", "bytearray", "defaultdict", "OrderedDict", "Counter", "deque",
    "ChainMap", "WeakKeyDictionary", "WeakValueDictionary", "WeakSet", "SimpleNamespace",
    "array", "Queue", "SimpleQueue",
})
MUTABLE_NODES = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)

#: (file, name) -> why a mutable module-level binding is tolerated. Keep it short.
ALLOWED: dict[tuple[str, str], str] = {
    # the export list is a list by convention; nothing appends to it at run time
    **{(f.name, "__all__"): "export list" for f in CORE.glob("*.py")},
}


def _is_mutable(value: ast.expr | None) -> bool:
    if isinstance(value, MUTABLE_NODES):
        return True
    if isinstance(value, ast.Call):
        f = value.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) \
            else ""
        return name in MUTABLE_CALLS
    return False


def _module_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements that run at import: the body and what if/try/with blocks hold."""
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.With):
            yield from _module_level(node.body)
            yield from _module_level(getattr(node, "orelse", []))
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody,
                          *(h.body for h in node.handlers)):
                yield from _module_level(block)


def mutable_globals(source: str) -> list[tuple[str, int]]:
    """(name, line) of each module-level name bound to a mutable container."""
    found = []
    for node in _module_level(ast.parse(source).body):
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets, value = [node.target], node.value
        if not _is_mutable(value):
            continue
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Name):
                    found.append((sub.id, node.lineno))
    return found


def test_no_module_level_mutable_containers_in_core() -> None:
    files = sorted(CORE.glob("*.py"))
    assert {"worker.py", "ps.py", "common.py"} <= {f.name for f in files}
    bad = [(f.name, name, line) for f in files for name, line in mutable_globals(f.read_text())
           if (f.name, name) not in ALLOWED]
    assert not bad, f"module-level mutable state in aiogc/core: {bad}"


def test_no_core_function_rebinds_a_global() -> None:
    bad = [(f.name, node.lineno) for f in sorted(CORE.glob("*.py"))
           for node in ast.walk(ast.parse(f.read_text())) if isinstance(node, ast.Global)]
    assert not bad


def test_the_check_sees_each_kind_of_container() -> None:
    src = """
import weakref, collections
from collections import deque
A = {}
B: list[int] = []
C = set()
D = weakref.WeakKeyDictionary()
E = collections.defaultdict(list)
F = deque()
G = {k: 1 for k in "ab"}
if True:
    H = dict(a=1)
OK1 = frozenset({1})
OK2 = (1, 2)
OK3 = 3
"""
    assert [n for n, _ in mutable_globals(src)] == list("ABCDEFGH")
