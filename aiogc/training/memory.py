"""How much memory a task may plan for: the per-process budget (:func:`memory_budget`,
``$AIOGC_MEMORY_BUDGET``), the estimate of a task's peak bytes (:func:`task_memory_bytes`) and
the check every task factory of :mod:`aiogc.training.tasks` runs before allocating
(:func:`check_task_memory`), so a typo in ``dim`` is a configuration error, not an OOM kill.
"""

from __future__ import annotations

import os
import re
from typing import Final

from aiogc.errors import ConfigError

#: Share of the machine's physical memory one process may plan to hold for a task and its
#: round buffers (:func:`memory_budget`); the rest is left to the other processes of a local run.
MEMORY_FRACTION: Final = 0.5
#: Environment variable overriding :func:`memory_budget`: bytes, or a number with a binary
#: suffix K, M, G or T (``AIOGC_MEMORY_BUDGET=4G``).
MEMORY_BUDGET_ENV: Final = "AIOGC_MEMORY_BUDGET"
#: Budget when the machine's memory cannot be read (``os.sysconf`` unavailable).
_FALLBACK_BUDGET: Final = 8 << 30
#: Largest dim whose Gram matrix ``X^T X`` (dim x dim) is formed even when there are fewer
#: samples than features (128 MiB): below it the Lipschitz constant is computed exactly as it
#: always was (bit-identical learning rates); above it from the smaller ``X X^T`` (samples x
#: samples), which has the same nonzero eigenvalues.
GRAM_MAX_DIM: Final = 4096
_SUFFIX: Final = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def memory_budget() -> int:
    """Bytes one process may plan to allocate for a task and its round buffers.

    ``$AIOGC_MEMORY_BUDGET`` when set (bytes, or e.g. ``512M`` / ``4G``), else
    :data:`MEMORY_FRACTION` of the machine's physical memory.

    Raises
    ------
    ConfigError
        ``AIOGC_MEMORY_BUDGET`` is set but not a positive size.
    """
    text = os.environ.get(MEMORY_BUDGET_ENV, "").strip()
    if text:
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?", text, flags=re.IGNORECASE)
        if m is None or float(m.group(1)) <= 0:
            raise ConfigError(MEMORY_BUDGET_ENV, text, "a positive size in bytes or with a "
                              "K/M/G/T suffix, e.g. 4G")
        return int(float(m.group(1)) * _SUFFIX[m.group(2).upper()])
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return _FALLBACK_BUDGET
    return int(phys * MEMORY_FRACTION) if phys > 0 else _FALLBACK_BUDGET


def _gram_side(samples: int, dim: int) -> int:
    """Side of the Gram matrix the Lipschitz constant is computed from (see GRAM_MAX_DIM)."""
    return dim if dim <= samples or dim <= GRAM_MAX_DIM else samples


def task_memory_bytes(samples: int, dim: int, n_chunks: int) -> int:
    """Estimated peak bytes of one process holding a data task and running rounds with it.

    Every term is float64 and counted on the side that allocates the most (the PS):

    * data: ``3 n d`` (the drawn or loaded matrix, its shuffled copy, one temporary);
    * Lipschitz constant: ``3 k^2`` for the ``k x k`` Gram matrix, its scaled copy and the
      eigen-solver's work copy (``k = d``, or ``n`` when ``d > max(n, GRAM_MAX_DIM)``);
    * per-chunk gradients: ``2 N d`` (the oracle's stacked chunk gradients and their absolute
      values; a worker's own chunk gradients are at most ``N d``);
    * round buffers: ``2 N d`` (the PS's payload rows, at most one full-length row per worker
      since N = m for every built-in assignment, and the decode's work rows);
    * model, gradient and step temporaries: ``8 d``.

    Parameters
    ----------
    samples, dim, n_chunks : int
        n, d and N (n = 0 for a plug-in task: no data matrix or Gram matrix of ours).

    Returns
    -------
    int
    """
    n, d, N = int(samples), int(dim), int(n_chunks)
    k = _gram_side(n, d) if n > 0 else 0  # n = 0: a plug-in, no data matrix of ours
    return 8 * (3 * n * d + 3 * k * k + 4 * N * d + 8 * d)


def check_task_memory(samples: int, dim: int, n_chunks: int, spec: str,
                      budget: int | None = None) -> int:
    """Refuse a task whose :func:`task_memory_bytes` exceed the budget, before allocating it.

    Parameters
    ----------
    samples, dim, n_chunks : int
    spec : str
        The task spec, named in the error.
    budget : int, optional
        Default :func:`memory_budget`.

    Returns
    -------
    int
        The estimate, when within budget.

    Raises
    ------
    ConfigError
        Field ``task``: the message names the dim range that fits for these samples and chunks.
    """
    limit = memory_budget() if budget is None else int(budget)
    need = task_memory_bytes(samples, dim, n_chunks)
    if need <= limit:
        return need
    lo, hi = 0, dim  # task_memory_bytes grows with dim: the largest dim that fits
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if task_memory_bytes(samples, mid, n_chunks) <= limit:
            lo = mid
        else:
            hi = mid
    where = "$" + MEMORY_BUDGET_ENV if os.environ.get(MEMORY_BUDGET_ENV, "").strip() else (
        f"{MEMORY_FRACTION:g} of this machine's RAM; ${MEMORY_BUDGET_ENV} overrides it")
    shape = (f"samples={samples}, " if samples > 0 else "") + f"n_chunks={n_chunks}"
    fits = (f"dim in [1, {lo}] for {shape}" if lo >= 1 else
            f"fewer samples or chunks ({shape} do not fit even at dim=1)")
    raise ConfigError(
        "task", spec,
        f"{fits} (dim={dim} needs ~{need / 2**30:.3g} GiB, over the memory budget of "
        f"{limit / 2**30:.3g} GiB: {where})")
