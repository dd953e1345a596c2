"""The one way a PS's :class:`~aiogc.training.aggregator.Aggregator` is built for a task.

Live runs (``harness/kit.make_ps``, both runners) and the protocol engine
(``sim/protocol.py``) call :func:`task_aggregator`, so the guard a simulated PS runs is the
guard a live one runs and the two cannot drift: the oracle at the model the workers were sent
(``--verify``), or, without it, the data bound of every decode mode
(:mod:`aiogc.training.approx_bound`), the norm guard's round-off floor, the conditioning check.
"""

from __future__ import annotations

import numpy as np

from aiogc.coding.base import Scheme
from aiogc.config import RunConfig
from aiogc.training.aggregator import Aggregator
from aiogc.training.approx_bound import gradient_bound_fn
from aiogc.training.frameworks import task_stepper
from aiogc.training.tasks import Task, chunk_grads_fn, evaluation_error_fn

__all__ = ["task_aggregator"]


def task_aggregator(config: RunConfig, scheme: Scheme, task: Task, *,
                    model: np.ndarray | None = None, verify: bool = True,
                    keep_gradients: bool = False, guard: bool = True) -> Aggregator:
    """The PS's aggregator for ``task``.

    Parameters
    ----------
    config : RunConfig
        The configuration the PS runs (dilated, at a time scale K > 1).
    scheme : Scheme
    task : Task
        Its initial model, learning rate (unless ``config.learning_rate``), loss and, with
        ``verify``, the uncoded chunk gradients at the model the workers were sent (the
        oracle); without, its data bound ``B(w)`` (None for a task that has none: plug-ins,
        ``torch:``/``jax:`` adapters keep the norm and model guards only).
    model : ndarray, shape (d,), optional
        The initial model, when the caller already drew it (default ``task.initial_model()``).
    verify, keep_gradients, guard : bool
        As :class:`~aiogc.training.aggregator.Aggregator` (``verify``: the oracle is on).
    """
    w0 = task.initial_model() if model is None else model
    lr = config.learning_rate or task.learning_rate
    return Aggregator(
        config, scheme, model=w0,
        learning_rate=lr,
        loss_fn=task.loss,
        # a torch:/jax: task steps with its framework's optimizer (None: plain SGD)
        stepper=task_stepper(task, lr),
        verify_fn=chunk_grads_fn(task, config.payload_dtype) if verify else None,
        # the oracle's evaluation and the workers' may sum in different orders
        evaluation_fn=evaluation_error_fn(task) if verify else None,
        keep_gradients=keep_gradients, guard=guard,
        # no oracle: every decode is bounded by the data instead
        grad_bound_fn=None if verify else gradient_bound_fn(task))
