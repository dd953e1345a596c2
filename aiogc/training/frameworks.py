"""Tasks from autodiff frameworks: ``torch:MODULE:ATTR`` and ``jax:MODULE:ATTR``.

Spec (CLI flag ``--task``)
--------------------------
``torch:MODULE:ATTR[,optimizer=sgd|adam][,lr=F]`` (extra ``aiogc[torch]``)
``jax:MODULE:ATTR[,optimizer=sgd|adam][,lr=F]`` (extra ``aiogc[jax]``)
    ``MODULE`` is a module name or a ``FILE.py`` path, as for a ``MODULE:ATTR`` plug-in.
    ``ATTR`` is a factory called as ``ATTR(seed)`` (or ``ATTR()`` if it takes no argument;
    PyTorch's global RNG is seeded with ``seed`` first) that returns ``(model, loss, (X, y))``:

    * PyTorch: ``model`` a ``torch.nn.Module``; ``loss(model(X_batch), y_batch)`` a scalar
      tensor, the *mean* over the batch (``reduction="sum"`` on a loss module is detected and
      divided by n);
    * JAX: ``model`` a pair ``(apply_fn, params)`` with ``params`` any pytree of float arrays;
      ``loss(apply_fn(params, X_batch), y_batch)`` a scalar, the mean over the batch;
    * ``X``, ``y``: arrays (numpy or the framework's) whose first axis indexes the n samples.

    ``optimizer`` (default ``sgd``) is the framework's own: ``torch.optim.SGD`` /
    ``torch.optim.Adam``, ``optax.sgd`` / ``optax.adam``; ``lr`` its step size (default 0.1 for
    sgd, 0.01 for adam; ``--lr`` overrides it).

How it maps onto gradient coding: the samples are shuffled once with the seed and split into
``n_chunks`` contiguous near-equal chunks, like the built-in tasks. Chunk ``i``'s gradient is the
framework's autodiff gradient of ``(n_i / n) * loss(chunk i)`` with respect to every trainable
parameter, flattened (PyTorch: in ``model.parameters()`` order; JAX: ``ravel_pytree`` order) and
cast to float64, so the chunk gradients add up to the full-batch gradient (up to the model
dtype's rounding). The PS decodes the coded payloads to that flat vector and steps with the
framework's optimizer (:class:`Stepper`): the gradient is written back into the parameters'
``.grad`` (PyTorch) or unravelled into the optimizer's update (optax).

Trust boundary: these specs are code, exactly like ``MODULE:ATTR``
(:func:`aiogc.training.tasks.task_kind` says ``"plugin"``): a worker builds one only when it is
its own operator's ``--task``, never because the PS named it.

Determinism: a chunk's gradient must be the same number in the PS's oracle and in every worker
process, so PyTorch runs on one intra-op thread (``torch.set_num_threads(1)``) in a process that
builds a torch task; its CPU kernels are then deterministic.
"""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

import numpy as np

from aiogc.errors import ConfigError

__all__ = [
    "FRAMEWORKS",
    "OPTIMIZERS",
    "FrameworkSpec",
    "OptimizerTask",
    "PlainSGD",
    "Stepper",
    "parse_framework_spec",
    "task_stepper",
]

FRAMEWORKS: Final = ("torch", "jax")
OPTIMIZERS: Final = ("sgd", "adam")
_DEFAULT_LR: Final = {"sgd": 0.1, "adam": 0.01}
_OPTION_KEYS: Final = frozenset({"optimizer", "lr"})
_SYNTAX: Final = "torch|jax:MODULE:ATTR[,optimizer=sgd|adam][,lr=F]"


class Stepper(Protocol):
    """The PS's optimizer: turns a decoded gradient into the next model.

    :meth:`step` proposes; the state it advanced (momenta, Adam's moments, its step count)
    becomes the optimizer's only at :meth:`commit`, which the aggregator calls once the
    round's guard accepted the new model. A step that is not committed is undone by the
    next :meth:`step` (a rejected round leaves the optimizer as it was).
    """

    def step(self, w: np.ndarray, g: np.ndarray) -> np.ndarray:
        """The model after one step from ``w`` along ``g`` (both shape (d,)): shape (d,) float64."""
        ...

    def commit(self) -> None:
        """Keep the state the last :meth:`step` advanced."""
        ...


@runtime_checkable
class OptimizerTask(Protocol):
    """A task that brings its own optimizer (the PS steps with it instead of plain SGD)."""

    def make_stepper(self, learning_rate: float) -> Stepper:
        """A fresh optimizer with step size ``learning_rate``."""
        ...


def task_stepper(task: object, learning_rate: float) -> Stepper | None:
    """``task.make_stepper(learning_rate)`` for an :class:`OptimizerTask`, else None (plain
    SGD in the aggregator)."""
    return task.make_stepper(learning_rate) if isinstance(task, OptimizerTask) else None


class PlainSGD:
    """``w - lr * g``, rounded to the model's dtype: the stated fallback for a JAX task with
    ``optimizer=sgd`` when optax is not installed (it holds no state)."""

    def __init__(self, learning_rate: float, dtype: Any = np.float64) -> None:
        self.learning_rate = float(learning_rate)
        self.dtype = np.dtype(dtype)

    def step(self, w: np.ndarray, g: np.ndarray) -> np.ndarray:
        """``fl(w - lr g)``: shape (d,) float64."""
        new = np.asarray(w, dtype=self.dtype) - self.dtype.type(self.learning_rate) * np.asarray(
            g, dtype=self.dtype)
        return np.asarray(new, dtype=np.float64)

    def commit(self) -> None:
        """Nothing to keep."""


@dataclass(frozen=True)
class FrameworkSpec:
    """A parsed ``torch:`` / ``jax:`` task spec."""

    framework: str
    target: str
    attr: str
    optimizer: str
    lr: float
    spec: str


def parse_framework_spec(framework: str, rest: str, spec: str) -> FrameworkSpec:
    """Parse ``MODULE:ATTR[,optimizer=..][,lr=..]`` (the part after ``torch:`` / ``jax:``).

    Raises
    ------
    ConfigError
        Naming ``spec`` and the syntax.
    """
    if framework not in FRAMEWORKS:
        raise ConfigError("task", spec, _SYNTAX)
    tokens = rest.split(",")
    cut = len(tokens)
    while cut > 1 and tokens[cut - 1].partition("=")[0].strip() in _OPTION_KEYS:
        cut -= 1
    body = ",".join(tokens[:cut]).strip()
    opts: dict[str, str] = {}
    for tok in tokens[cut:]:
        key, _eq, val = (t.strip() for t in tok.partition("="))
        if key in opts or not val:
            raise ConfigError("task", spec, f"{_SYNTAX} (each option once, with a value)")
        opts[key] = val
    target, _sep, attr = body.rpartition(":")
    if not target.strip() or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", attr.strip()):
        raise ConfigError("task", spec, _SYNTAX)
    optimizer = opts.get("optimizer", "sgd").lower()
    if optimizer not in OPTIMIZERS:
        raise ConfigError("task", spec, f"optimizer= one of {', '.join(OPTIMIZERS)}")
    lr = _DEFAULT_LR[optimizer]
    if "lr" in opts:
        try:
            lr = float(opts["lr"])
        except ValueError:
            raise ConfigError("task", spec, f"lr= a number, got {opts['lr']!r}") from None
    if not (math.isfinite(lr) and lr > 0):
        raise ConfigError("task", spec, f"lr= a finite number > 0, got {lr!r}")
    return FrameworkSpec(framework, target.strip(), attr.strip(), optimizer, lr, spec)


def call_factory(factory: object, seed: int, spec: str) -> tuple[Any, Any, tuple[Any, Any]]:
    """``factory(seed)`` (or ``factory()``), checked to be ``(model, loss, (X, y))``."""
    if not callable(factory):
        raise ConfigError("task", spec, "ATTR a callable returning (model, loss, (X, y))")
    try:
        inspect.signature(factory).bind(seed)
        takes_seed = True
    except TypeError:
        takes_seed = False
    except ValueError:  # no introspectable signature: try the seed
        takes_seed = True
    out = factory(seed) if takes_seed else factory()
    if not (isinstance(out, tuple | list) and len(out) == 3 and isinstance(out[2], tuple | list)
            and len(out[2]) == 2 and callable(out[1])):
        raise ConfigError("task", spec, "a factory returning (model, loss, (X, y)), got "
                          f"{type(out).__name__}")
    return out[0], out[1], (out[2][0], out[2][1])


def chunk_bounds(n: int, n_chunks: int, spec: str) -> np.ndarray:
    """``n_chunks + 1`` boundaries of contiguous near-equal chunks of ``range(n)``."""
    if n_chunks > n:
        raise ConfigError("n_chunks", n_chunks, f"<= {n}, the number of samples of {spec}")
    return (np.arange(n_chunks + 1) * n) // n_chunks


def shuffle_order(n: int, seed: int) -> np.ndarray:
    """The one row shuffle of a framework task's samples (the built-in tasks' seed stream)."""
    shuffle_seed = int(np.random.SeedSequence(seed).spawn(2)[1].generate_state(1)[0])
    perm: np.ndarray = np.random.default_rng(shuffle_seed).permutation(n)
    return perm
