"""The layering rule of architecture.md, enforced: the math and the protocol core are pure."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "aiogc"
PURE = [*sorted((ROOT / "coding").glob("*.py")), *sorted((ROOT / "core").glob("*.py")),
        ROOT / "messages.py", ROOT / "wire.py"]
FORBIDDEN = {"asyncio", "socket", "time", "random", "multiprocessing", "threading", "selectors",
             "uvloop"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("path", PURE, ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_modules_import_no_io_clock_or_global_randomness(path: Path) -> None:
    bad = _imports(path) & FORBIDDEN
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_core_does_not_import_drivers() -> None:
    for path in (ROOT / "core").glob("*.py"):
        src = path.read_text()
        assert "from ..net" not in src and "from ..sim" not in src, path.name


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
