"""Plug-in task for big-d benchmark rounds: cheap, deterministic chunk gradients of length d.

Spec strings (``--task`` / ``RunConfig.task``)::

    /abs/path/bench/bulk_task.py:factory        d = 1_000_000
    /abs/path/bench/bulk_task.py:bulk_4096      d = 4096 (any positive integer after ``bulk_``)

``chunk_gradient(i, w)`` ignores ``w`` and returns ``base[i : i + d]``, a read-only *view* of one
random vector ``base`` of length ``d + n_chunks`` drawn once from the seed. So every chunk has its
own (shifted) random vector, the call costs nothing (no copy: ``FunctionTask`` keeps a float64
array as is), and the memory per process is one ``(d + n_chunks)`` float64 vector (8 MB at
d = 10^6) however many chunks there are. The loss is unknown (``nan``). The values are small
(N(0, 1) * 1e-3), so the model stays finite over any benchmark's rounds.
"""

from __future__ import annotations

import numpy as np

from aiogc.training.tasks import FunctionTask

DEFAULT_DIM = 1_000_000
_PREFIX = "bulk_"


def make(n_chunks: int, seed: int, dim: int = DEFAULT_DIM) -> FunctionTask:
    """A :class:`~aiogc.training.tasks.FunctionTask`: dimension ``dim``, ``n_chunks`` chunks."""
    rng = np.random.default_rng([int(seed), 0xB01C])
    base = rng.standard_normal(dim + n_chunks, dtype=np.float32).astype(np.float64)
    base *= 1e-3
    base.setflags(write=False)

    def chunk_gradient(chunk: int, w: np.ndarray) -> np.ndarray:
        return base[chunk:chunk + dim]

    return FunctionTask(chunk_gradient, dim=dim, n_chunks=n_chunks, learning_rate=0.1,
                        name=f"bulk_{dim}")


def factory(n_chunks: int, seed: int) -> FunctionTask:
    """d = 10^6."""
    return make(n_chunks, seed)


def __getattr__(name: str) -> object:  # PEP 562: ``bulk_<d>`` factories for any d
    if name.startswith(_PREFIX) and name[len(_PREFIX):].isdigit():
        dim = int(name[len(_PREFIX):])
        if dim >= 1:
            def _factory(n_chunks: int, seed: int) -> FunctionTask:
                return make(n_chunks, seed, dim)

            _factory.__name__ = name
            return _factory
    raise AttributeError(name)


def spec(dim: int = DEFAULT_DIM) -> str:
    """The ``task`` spec string for dimension ``dim`` (absolute path, so workers find it)."""
    import os

    return f"{os.path.abspath(__file__)}:{_PREFIX}{int(dim)}"
