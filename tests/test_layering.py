"""The layering rule, enforced: the math (coding/) and the protocol core (core/) are pure:
no clock, sockets, files, processes, dynamic imports or global randomness; they get time,
bytes and arrays from their drivers (net/, sim/), which is what lets one core run on both
asyncio and the virtual clock."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "aiogc"
CODING = sorted((ROOT / "coding").glob("*.py"))
CORE = sorted((ROOT / "core").glob("*.py"))
PURE = [*CODING, *CORE, ROOT / "messages.py", ROOT / "wire.py"]
#: No clock, sockets, event loop, threads or global randomness in any pure module.
FORBIDDEN = {"asyncio", "socket", "time", "random", "multiprocessing", "threading", "selectors",
             "uvloop"}
#: coding/ and core/ also do no file, process or import machinery: they get bytes and arrays
#: from their callers, never from the file system or a dynamically imported module.
FORBIDDEN_MATH_AND_CORE = FORBIDDEN | {"os", "io", "importlib", "subprocess", "pathlib", "shutil",
                                       "tempfile", "glob", "signal", "sys"}
#: Which aiogc packages each layer may import (by resolved absolute name).
MAY_IMPORT = {
    "coding": {"aiogc.coding", "aiogc.errors"},
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


def test_layers_import_only_what_they_may() -> None:
    for path in CODING:
        own = {m for m in _resolved_imports(path) if m.split(".")[0] == "aiogc"}
        allowed = MAY_IMPORT["coding"]
        bad = {m for m in own if not any(m == a or m.startswith(a + ".") for a in allowed)}
        assert not bad, f"{_rel(path)} imports {sorted(bad)}"
    for path in CORE:
        mods = _resolved_imports(path)
        bad = {m for m in mods if m.startswith(("aiogc.net", "aiogc.sim", "aiogc.runner",
                                                 "aiogc.cli"))}
        assert not bad, f"{_rel(path)} imports {sorted(bad)}"


def test_no_global_numpy_seeding() -> None:
    for path in ROOT.rglob("*.py"):
        src = path.read_text()
        assert "np.random.seed(" not in src, path
        assert "np.random.rand(" not in src and "np.random.randn(" not in src, path


def test_transition_tables_agree_with_message_directions() -> None:
    """The core's per-phase acceptance tables and messages.py's direction sets are one truth."""
    from aiogc.core import ps, worker
    from aiogc.messages import KINDS, PS_TO_WORKER, WORKER_TO_PS

    assert set(ps._ACCEPTS) | {"hello"} == set(WORKER_TO_PS)
    assert set(worker._ACCEPTS) == set(PS_TO_WORKER)
    assert set(WORKER_TO_PS) | set(PS_TO_WORKER) == set(KINDS)
