"""The layering rule, enforced.

1. The math (coding/), the protocol contract (protocol/) and the protocol core (core/) are pure:
   no clock, sockets, files, processes, dynamic imports or global randomness; they get time,
   bytes and arrays from their drivers (net/, sim/), which is what lets one core run on both
   asyncio and the virtual clock.
2. The package is a stack of wings (docs/architecture.md). Each wing imports only the wings
   in its allow list below; the module import graph of ``aiogc/`` has no circle and no arrow
   from a lower wing to a higher one.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "aiogc"
CODING = sorted((ROOT / "coding").glob("*.py"))
CORE = sorted((ROOT / "core").glob("*.py"))
PROTOCOL = sorted((ROOT / "protocol").glob("*.py"))
PURE = [*CODING, *CORE, *PROTOCOL]
#: No clock, sockets, event loop, threads or global randomness in any pure module.
FORBIDDEN = {"asyncio", "socket", "time", "random", "multiprocessing", "threading", "selectors",
             "uvloop"}
#: coding/ and core/ also do no file, process or import machinery: they get bytes and arrays
#: from their callers, never from the file system or a dynamically imported module.
FORBIDDEN_MATH_AND_CORE = FORBIDDEN | {"os", "io", "importlib", "subprocess", "pathlib", "shutil",
                                       "tempfile", "glob", "signal", "sys"}
#: The wings, bottom-up. ``errors`` is errors.py and _version.py; ``facade`` is the package's
#: own __init__ and api.py (the Python API, re-exported lazily; no other wing imports it);
#: ``config`` is config.py, the run configuration every wing above it shares (it builds schemes
#: from the coding registry). A wing may import itself and exactly the wings listed.
WINGS = ("errors", "coding", "config", "protocol", "core", "training", "net", "sim", "harness",
         "experiments", "cli", "facade")
_BELOW_CORE = {"errors", "coding", "config", "protocol"}
MAY_IMPORT: dict[str, set[str]] = {
    "errors": set(),
    "coding": {"errors"},
    "config": {"errors", "coding"},
    "protocol": {"errors"},
    "core": _BELOW_CORE,
    "training": _BELOW_CORE | {"core"},
    "net": _BELOW_CORE | {"core", "training"},
    "sim": _BELOW_CORE | {"core", "training"},  # never net: the two drivers stay apart
    "harness": _BELOW_CORE | {"core", "training", "net", "sim"},
    "experiments": _BELOW_CORE | {"core", "training", "net", "sim", "harness"},
    "cli": set(WINGS) - {"cli", "facade"},
    "facade": set(WINGS) - {"facade"},
}
#: Known, owned exceptions: (file, module) -> why. Empty: the core's ``os.urandom`` nonces
#: became an injected nonce source. A new entry must say why and who removes it.
KNOWN: dict[tuple[str, str], str] = {}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolved_imports(path: Path) -> set[str]:
    return _imports_of_source(path.read_text(), path)


def _imports_of_source(src: str, path: Path) -> set[str]:
    """Absolute names of every module the source of ``path`` imports, anywhere in the file
    (function-level "lazy" imports included), relative imports resolved against the file's
    package, plus ``importlib.import_module("x")`` / ``__import__("x")`` calls with a literal
    name."""
    tree = ast.parse(src, filename=str(path))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func
            fname = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if fname in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.add(node.args[0].value)
    return found


def _tops(mods: set[str]) -> set[str]:
    return {m.split(".")[0] for m in mods}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", PURE, ids=_rel)
def test_pure_modules_import_no_io_clock_or_global_randomness(path: Path) -> None:
    strict = path in CODING or path in CORE
    bad = _tops(_resolved_imports(path)) & (FORBIDDEN_MATH_AND_CORE if strict else FORBIDDEN)
    bad -= {mod for (f, mod) in KNOWN if f == _rel(path)}
    assert not bad, f"{_rel(path)} imports {sorted(bad)}"


def test_known_exceptions_still_exist() -> None:
    """Every KNOWN exception is still real (a fixed one must leave the table)."""
    for where, mod in KNOWN:
        assert mod in _tops(_resolved_imports(ROOT / where)), (where, mod)


def test_relative_and_lazy_imports_are_seen() -> None:
    """The checker itself: a relative import, function-level imports and importlib calls."""
    src = ("from ..net import drivers\n"
           "def f():\n    import os\n    from . import base\n"
           "    importlib.import_module('subprocess')\n    __import__('io')\n")
    found = _imports_of_source(src, ROOT / "coding" / "probe.py")
    assert {"aiogc.net", "aiogc.net.drivers", "os", "aiogc.coding", "aiogc.coding.base",
            "subprocess", "io"} <= found
    assert _tops(found) & FORBIDDEN_MATH_AND_CORE == {"os", "subprocess", "io"}


def _wing(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "facade"
    return {"__main__": "cli", "_version": "errors", "api": "facade"}.get(parts[1], parts[1])


def _all_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _import_graph() -> dict[str, set[str]]:
    """Module -> the aiogc modules it imports (lazy imports included), each imported name
    resolved to the module file that defines it."""
    mods = _all_modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = defaultdict(set)
    for mod, path in mods.items():
        for name in _resolved_imports(path):
            if name.split(".")[0] == "aiogc":
                target = resolve(name)
                if target is not None and target != mod:
                    graph[mod].add(target)
    return graph


def test_every_module_sits_in_a_known_wing() -> None:
    assert {_wing(m) for m in _all_modules()} <= set(WINGS)


def test_wings_import_only_their_allow_list() -> None:
    bad = sorted((a, b) for a, targets in _import_graph().items() for b in targets
                 if _wing(b) != _wing(a) and _wing(b) not in MAY_IMPORT[_wing(a)])
    assert not bad, f"imports outside the allow list: {bad}"


def test_no_arrow_from_a_lower_wing_to_a_higher_one() -> None:
    rank = {w: i for i, w in enumerate(WINGS)}
    for wing, allowed in MAY_IMPORT.items():
        assert all(rank[a] < rank[wing] for a in allowed if a != wing), (wing, allowed)
    up = sorted((a, b) for a, targets in _import_graph().items() for b in targets
                if rank[_wing(b)] > rank[_wing(a)])
    assert not up, f"upward imports: {up}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in list(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_import_graph_has_no_circle() -> None:
    assert _cycles(_import_graph()) == []


def test_the_circle_finder_finds_circles() -> None:
    """The checker itself, on a made-up graph with one circle of three and a tail."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_global_numpy_seeding() -> None:
    for path in ROOT.rglob("*.py"):
        src = path.read_text()
        assert "np.random.seed(" not in src, path
        assert "np.random.rand(" not in src and "np.random.randn(" not in src, path


def test_transition_tables_agree_with_message_directions() -> None:
    """The core's per-phase acceptance tables and messages.py's direction sets are one truth."""
    from aiogc.core import ps, worker
    from aiogc.protocol.messages import KINDS, PS_TO_WORKER, WORKER_TO_PS

    assert set(ps._ACCEPTS) | {"hello"} == set(WORKER_TO_PS)
    assert set(worker._ACCEPTS) == set(PS_TO_WORKER)
    assert set(WORKER_TO_PS) | set(PS_TO_WORKER) == set(KINDS)
