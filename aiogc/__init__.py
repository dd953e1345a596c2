"""aiogc: gradient coding that leverages partial stragglers.

This module is the package's facade: the top wing of docs/architecture.md. It re-exports a
few public names for users, importing their modules lazily (on first access) so that
``import aiogc`` stays light. No module of aiogc imports it (tests/test_layering.py); the
version every wing reads lives in :mod:`aiogc._version`.
"""

from typing import Any

from aiogc._version import __version__

__all__ = ["__version__", "load_run"]


def __getattr__(name: str) -> Any:
    """``aiogc.load_run(DIR)``: :func:`aiogc.harness.records.load_run_tables` (the run as
    tables: rounds, workers, reports, frames, delays; pandas DataFrames when pandas is
    installed)."""
    if name == "load_run":
        from aiogc.harness.records import load_run_tables

        globals()[name] = load_run_tables
        return load_run_tables
    raise AttributeError(f"module 'aiogc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "load_run"])
