"""Build what a worker needs for a configuration (scheme + task), once per process.

The worker state machine never builds anything itself (it emits ``SetupNeeded``); drivers ask
a :class:`SetupCache`, which builds each configuration once and shares the result among every
worker of the process (64 coroutine workers used to rebuild scheme and task 64 times on one
event loop). Building is also where "no code from the wire" is enforced: a configuration comes
from the PS, and a worker builds only tasks its own operator allowed (:class:`TaskPolicy`).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np

from aiogc.coding.consistency import all_finite
from aiogc.config import RunConfig
from aiogc.core import Setup
from aiogc.core.worker_setup import ChunkGradientFn
from aiogc.errors import ConfigError
from aiogc.training.caps import check_welcome_memory

__all__ = ["NonFiniteGradient", "SetupCache", "TaskNotAllowed", "TaskPolicy", "build_setup",
           "finite_gradients"]


class NonFiniteGradient(ValueError):
    """A task's chunk gradient has NaN or infinite values."""


def finite_gradients(fn: ChunkGradientFn) -> ChunkGradientFn:
    """``fn`` (a plug-in task's ``chunk_gradient(chunk, w) -> (dim,)``), raising
    :class:`NonFiniteGradient` (naming the chunk) for a gradient with NaN or inf values: the
    worker reports it as its task's failure instead of sending it."""

    def chunk_gradient(chunk: int, w: np.ndarray) -> np.ndarray:
        g = fn(chunk, w)
        if not all_finite(g):
            bad = np.asarray(g).ravel()[~np.isfinite(np.asarray(g).ravel())][0]
            raise NonFiniteGradient(f"chunk {chunk}: the gradient has non-finite values "
                                    f"({float(bad)})")
        return g

    return chunk_gradient


class TaskNotAllowed(ConfigError):
    """The PS asked for a task this worker's operator did not allow."""


@dataclass(frozen=True)
class TaskPolicy:
    """What a worker may build from a configuration it received.

    * built-in tasks, whose code and data ship in the package (``linreg[...]``,
      ``logreg:builtin``; every registered task that reads no file,
      :func:`aiogc.training.tasks.task_kind`): always;
    * a task reading a data file (``logreg:PATH``): only if the spec is the worker's own
      ``task`` or PATH lies inside one of ``data_dirs`` (directories the operator named);
    * plug-in tasks (``MODULE:ATTR``, ``FILE.py:ATTR``, ``torch:...``, ``jax:...``): only if
      the spec is exactly the worker's own ``task`` (the operator's command line), never
      because the PS said so.
    """

    task: str | None = None
    data_dirs: tuple[str, ...] = ()

    def check(self, spec: str) -> None:
        """Raise :class:`TaskNotAllowed` unless ``spec`` may be built here."""
        from aiogc.training.tasks import task_kind

        if self.task is not None and spec.strip() == self.task.strip():
            return
        kind, path = task_kind(spec)
        if kind != "plugin" and path is None:
            return
        if kind != "plugin" and path is not None:
            real = os.path.realpath(os.path.expanduser(path))
            for d in self.data_dirs:
                root = os.path.realpath(os.path.expanduser(d))
                if os.path.commonpath([root, real]) == root:
                    return
            raise TaskNotAllowed("task", spec, "a data file this worker's operator allowed "
                                 "(its own --task, or a file inside one of its --data-dir)")
        raise TaskNotAllowed("task", spec, "a built-in task, or a plug-in named by this "
                             "worker's own --task (plug-in code is never taken from the PS)")


def build_setup(config: RunConfig, policy: TaskPolicy | None = None) -> Setup:
    """Scheme and task for ``config`` (same seed -> same scheme as the PS)."""
    from aiogc.training.tasks import make_task

    (policy or TaskPolicy()).check(config.task)
    check_welcome_memory(config)  # scheme + task within this process's budget, before building
    scheme = config.build_scheme()
    task = make_task(config.task, scheme.n_chunks, config.seed, chunk_sizes=config.sizes)
    from aiogc.training.tasks import task_kind

    fn: ChunkGradientFn = task.chunk_gradient
    if task_kind(config.task)[0] == "plugin":  # user code: its values are checked
        fn = finite_gradients(fn)
    return Setup(config, scheme, fn)


class SetupCache:
    """Configuration -> :class:`Setup`, each built once (thread-safe: drivers build in an
    executor thread so that a slow build never blocks the event loop).

    Failures are cached too (a task that is not allowed stays not allowed).
    """

    def __init__(self, policy: TaskPolicy | None = None) -> None:
        self.policy = policy or TaskPolicy()
        self._lock = threading.Lock()
        self._done: dict[RunConfig, Setup | BaseException] = {}
        self._building: dict[RunConfig, threading.Lock] = {}
        self.builds = 0

    def peek(self, config: RunConfig) -> Setup | BaseException | None:
        """The cached result for ``config`` (a Setup or the error it raised), or None."""
        return self._done.get(config)

    def get(self, config: RunConfig) -> Setup:
        """Build (or return the cached) setup; raises what the build raised."""
        hit = self._done.get(config)
        if hit is None:
            with self._lock:
                lock = self._building.setdefault(config, threading.Lock())
            with lock:
                hit = self._done.get(config)
                if hit is None:
                    try:
                        hit = build_setup(config, self.policy)
                    except Exception as exc:  # cached and re-raised below
                        hit = exc
                    self.builds += 1
                    self._done[config] = hit
        if isinstance(hit, BaseException):
            raise hit
        return hit


def setup_error_code(exc: BaseException) -> tuple[str, str]:
    """(close code, reason) for a failed build."""
    if isinstance(exc, TaskNotAllowed):
        return "task_not_allowed", str(exc)
    return "bad_config", f"{type(exc).__name__}: {exc}"
