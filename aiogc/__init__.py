"""aiogc: gradient coding that leverages partial stragglers.

Layers (each imports only those below it): ``coding`` (numpy/scipy math) -> ``core`` (sans-IO
state machines) and ``messages``/``wire`` -> ``sim`` (virtual clock) and ``net`` (asyncio TCP)
-> ``runner`` / ``cli``.
"""

from typing import Any

__version__ = "0.1.0"

#: Public names re-exported lazily from higher wings for users (``import aiogc`` stays light:
#: the module is imported on first access only). name -> (module, attribute). No aiogc module
#: may use these names: through this table the top package would depend on a higher wing
#: (tests/test_layering.py sees literal imports only, so this is a rule, not a checked one).
_LAZY = {"load_run": ("aiogc.harness.records", "load_run_tables")}


def __getattr__(name: str) -> Any:
    """``aiogc.load_run(DIR)``: :func:`aiogc.harness.records.load_run_tables` (the run as
    tables: rounds, workers, reports, frames, delays; pandas DataFrames when pandas is
    installed)."""
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'aiogc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
