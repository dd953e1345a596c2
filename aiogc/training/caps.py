"""What a PS's configuration may make a worker allocate (the worker's side).

A worker builds its scheme and task from the configuration in ``welcome``. Each piece already
has its own bound (the scheme's setup estimate against ``SETUP_MEMORY_BUDGET``, checked when
the config parses; a task factory's :func:`~aiogc.training.memory.check_task_memory`), but
their sum was bounded by neither, so a PS could make a worker hold a full setup budget *and*
a task. :func:`check_welcome_memory` adds the pieces the configuration sizes (the scheme's
setup for ``workers`` x ``delta`` x ``n_parts``, a synthetic task's ``samples`` x ``dim`` with
its ``workers`` chunks, the round buffers that come with them) and refuses, before anything
is allocated, a configuration whose total exceeds the worker's own budget
(:func:`~aiogc.training.memory.memory_budget`: ``$AIOGC_MEMORY_BUDGET``, else half the RAM),
naming the field to shrink and the largest value that fits.

Decision: the refusal is a ``ConfigError``, so the worker answers ``bad_config`` and exits
(fatal, CLI exit 3 naming the field). The configuration arrived in an authenticated
``welcome``: reconnecting would get the same one from the same PS, so retrying cannot succeed.
(Without a secret nothing is authenticated, and any config error is as fatal as before.)
"""

from __future__ import annotations

from typing import NamedTuple

from aiogc.coding.registry import check_setup_budget, setup_bytes
from aiogc.config import RunConfig
from aiogc.errors import ConfigError
from aiogc.training.memory import check_task_memory, memory_budget, task_memory_bytes

__all__ = ["WelcomeMemory", "check_welcome_memory", "linreg_shape", "welcome_memory"]

#: ``linreg``'s defaults (aiogc.training.tasks: samples=2000, dim=50)
_LINREG_SAMPLES, _LINREG_DIM = 2000, 50


class WelcomeMemory(NamedTuple):
    """Estimated bytes a configuration makes a worker allocate, by piece."""

    scheme: int
    task: int

    @property
    def total(self) -> int:
        return self.scheme + self.task


def linreg_shape(spec: str) -> tuple[int, int] | None:
    """``(samples, dim)`` of a ``linreg[:k=v,...]`` spec, or None for another kind of task or
    a malformed spec (the task factory then refuses it with the precise message)."""
    name, _sep, rest = spec.strip().partition(":")
    if name.strip() != "linreg":
        return None
    vals = {"samples": _LINREG_SAMPLES, "dim": _LINREG_DIM}
    for token in filter(None, (t.strip() for t in rest.split(","))):
        key, eq, val = token.partition("=")
        if not eq:
            return None
        if key.strip() in vals:
            try:
                vals[key.strip()] = int(val.strip())
            except ValueError:
                return None
    return (vals["samples"], vals["dim"]) if min(vals.values()) >= 1 else None


def welcome_memory(config: RunConfig) -> WelcomeMemory:
    """Per-piece estimate for ``config`` (the task piece is 0 when its size is not in the
    configuration: a data file or a plug-in, bounded by its factory's own check)."""
    n_chunks = config.workers  # every built-in assignment has N = m chunks
    scheme = setup_bytes(config.scheme, config.workers, config.delta, config.n_parts)
    shape = linreg_shape(config.task)
    task = task_memory_bytes(shape[0], shape[1], n_chunks) if shape is not None else 0
    return WelcomeMemory(scheme, task)


def check_welcome_memory(config: RunConfig, budget: int | None = None) -> WelcomeMemory:
    """Refuse a configuration whose scheme and task together exceed the worker's budget,
    before anything is built.

    Parameters
    ----------
    config : RunConfig
        As received in ``welcome`` (already parsed and validated).
    budget : int, optional
        Bytes; default :func:`~aiogc.training.memory.memory_budget`.

    Returns
    -------
    WelcomeMemory
        The estimate, when within budget.

    Raises
    ------
    ConfigError
        Naming the field to shrink: ``task`` (the dim that fits) when the task is the larger
        piece, else ``delta`` or ``workers`` (the largest value that fits beside the task).
    """
    limit = memory_budget() if budget is None else int(budget)
    est = welcome_memory(config)
    if est.total <= limit:
        return est
    shape = linreg_shape(config.task)
    if shape is not None and est.task >= est.scheme:
        check_task_memory(shape[0], shape[1], config.workers, config.task,
                          budget=max(0, limit - est.scheme))
    elif limit > est.task:
        check_setup_budget(config.scheme, config.workers, config.delta, config.n_parts,
                           budget=limit - est.task)
    # the pieces' own checks round differently, or nothing is left beside the task
    raise ConfigError("workers", config.workers,
                      f"a configuration within this worker's memory budget of "
                      f"{limit / 2**30:.3g} GiB (scheme ~{est.scheme / 2**30:.3g} GiB + task "
                      f"~{est.task / 2**30:.3g} GiB)")
