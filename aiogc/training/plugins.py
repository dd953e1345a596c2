"""Load a user's code named by a task spec (``MODULE:ATTR``, ``torch:MODULE:ATTR``, ...).

Only ever for a spec from the local command line or config: a worker builds plug-in tasks only
when its own operator named them (:class:`aiogc.training.setup.TaskPolicy`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os

from aiogc.errors import ConfigError

__all__ = ["load_attr"]


def load_attr(target: str, attr: str, spec: str) -> object:
    """``ATTR`` (dotted) of the module ``target`` (a module name or a ``FILE.py``): the one
    place a task spec imports code (only from the local command line; see
    :class:`aiogc.training.setup.TaskPolicy`). Raises :class:`ConfigError` naming ``spec``."""
    try:
        if target.endswith(".py"):
            mod_name = f"_aiogc_task_{abs(hash(os.path.abspath(target)))}"
            mspec = importlib.util.spec_from_file_location(mod_name, target)
            if mspec is None or mspec.loader is None:
                raise ImportError(f"cannot load {target}")
            module = importlib.util.module_from_spec(mspec)
            mspec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except (ImportError, OSError) as exc:
        raise ConfigError(
            "task", spec, f"MODULE:ATTR with an importable MODULE or FILE.py ({exc})"
        ) from None
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError("task", spec, f"MODULE:ATTR with ATTR defined in {target}")
        obj = getattr(obj, part)
    return obj
