"""aiogc: gradient coding that leverages partial stragglers.

This module is the package's facade: the top wing of docs/architecture.md. It re-exports a
few public names for users, importing their modules lazily (on first access) so that
``import aiogc`` stays light. No module of aiogc imports it (tests/test_layering.py); the
version every wing reads lives in :mod:`aiogc._version`.
"""

from typing import Any

from aiogc._version import __version__

#: The public names (:mod:`aiogc.api`), imported on first access.
_API = ("simulate", "run", "run_async", "sweep", "experiment", "load_run", "RunStop",
        "SimResult", "RunResult", "SweepResult", "ExperimentResult")

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    """``aiogc.simulate``, ``aiogc.run``, ``aiogc.sweep``, ``aiogc.load_run``...: the names of
    :mod:`aiogc.api`, which is imported (with numpy) on the first access, not by ``import
    aiogc``."""
    if name in _API:
        from aiogc import api

        value = getattr(api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'aiogc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
