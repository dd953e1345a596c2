"""PyTorch models as aiogc tasks (``--task torch:MODULE:ATTR``; :mod:`aiogc.training.frameworks`).

Imports torch at module level: only :func:`aiogc.training.frameworks.make_framework_task` imports
this module, and only for a ``torch:`` spec.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from aiogc.errors import ConfigError
from aiogc.training.frameworks import (
    FrameworkSpec,
    call_factory,
    chunk_bounds,
    shuffle_order,
)

__all__ = ["TorchStepper", "TorchTask"]


class TorchTask:
    """A ``torch.nn.Module`` and a mean loss over a data set, split into chunks.

    Parameters
    ----------
    fs : FrameworkSpec
    factory : callable
        ``factory(seed) -> (model, loss, (X, y))`` (see :mod:`aiogc.training.frameworks`).
    n_chunks, seed : int

    Attributes
    ----------
    params : list of torch.nn.Parameter
        The trainable parameters, in ``model.parameters()`` order: the flat vector's layout.
    dim : int
        Their total number of entries d.
    """

    def __init__(self, fs: FrameworkSpec, factory: object, n_chunks: int, seed: int) -> None:
        # one intra-op thread: deterministic kernels, so a chunk's gradient is the same number
        # in every process (the PS's oracle compares them to the decoder's rounding)
        torch.set_num_threads(1)
        torch.manual_seed(seed)
        model, loss, (X, y) = call_factory(factory, seed, fs.spec)
        if not isinstance(model, torch.nn.Module):
            raise ConfigError("task", fs.spec,
                              f"a torch.nn.Module model, got {type(model).__name__}")
        self.model = model
        self.loss_fn = loss
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ConfigError("task", fs.spec, "a model with trainable parameters")
        self.dtype = self.params[0].dtype
        X_t, y_t = torch.as_tensor(X), torch.as_tensor(y)
        if X_t.is_floating_point():
            X_t = X_t.to(self.dtype)
        n = int(X_t.shape[0])
        if int(y_t.shape[0]) != n:
            raise ConfigError("task", fs.spec, f"X and y with the same number of rows "
                              f"({n} != {int(y_t.shape[0])})")
        perm = torch.from_numpy(shuffle_order(n, seed))
        self.X, self.y = X_t[perm].contiguous(), y_t[perm].contiguous()
        self.n_samples = n
        self.n_chunks = int(n_chunks)
        self.bounds = chunk_bounds(n, n_chunks, fs.spec)
        # a loss module summing over the batch is divided by n; a mean loss is weighted by the
        # chunk's share n_i / n: either way the chunk gradients add up to the full gradient
        self._sum_loss = getattr(loss, "reduction", "mean") == "sum"
        self.dim = int(sum(p.numel() for p in self.params))
        self.name = "torch"
        self.spec = fs.spec
        self.optimizer = fs.optimizer
        self.learning_rate = fs.lr
        self._initial = self._flat_params()

    # ------------------------------------------------------------------ flat <-> parameters

    def _flat_params(self) -> np.ndarray:
        with torch.no_grad():
            flat = torch.nn.utils.parameters_to_vector(self.params)
        return np.asarray(flat.detach().cpu().numpy(), dtype=np.float64)

    def load(self, w: np.ndarray) -> None:
        """Write the flat model ``w`` (shape (d,)) into the parameters (in their dtype)."""
        w = np.asarray(w)
        if w.shape != (self.dim,):
            raise ValueError(f"model has shape {w.shape}, expected ({self.dim},)")
        vec = torch.from_numpy(np.ascontiguousarray(w)).to(self.dtype)
        with torch.no_grad():
            at = 0
            for p in self.params:
                k = p.numel()
                p.copy_(vec[at:at + k].view_as(p))
                at += k

    def _gradient(self, X: torch.Tensor, y: torch.Tensor, weight: float) -> np.ndarray:
        """Flat autograd gradient of ``weight * loss(model(X), y)``: shape (d,) float64."""
        value = self.loss_fn(self.model(X), y) * weight
        grads = torch.autograd.grad(value, self.params, allow_unused=True)
        flat = torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1)
                          for g, p in zip(grads, self.params, strict=True)])
        return np.asarray(flat.detach().cpu().numpy(), dtype=np.float64)

    # ------------------------------------------------------------------ the Task protocol

    def initial_model(self) -> np.ndarray:
        """The factory's initial parameters, flattened: shape (d,) float64."""
        return self._initial.copy()

    def chunk_gradient(self, chunk: int, w: np.ndarray) -> np.ndarray:
        """Autograd gradient of chunk ``chunk``'s share ``(n_i/n) loss(chunk)``: shape (d,)."""
        if not 0 <= chunk < self.n_chunks:
            raise IndexError(f"chunk {chunk} out of range 0..{self.n_chunks - 1}")
        a, b = int(self.bounds[chunk]), int(self.bounds[chunk + 1])
        self.load(w)
        weight = 1.0 / self.n_samples if self._sum_loss else (b - a) / self.n_samples
        return self._gradient(self.X[a:b], self.y[a:b], weight)

    def full_gradient(self, w: np.ndarray) -> np.ndarray:
        """Full-batch autograd gradient of :meth:`loss` (one backward pass): shape (d,)."""
        self.load(w)
        return self._gradient(self.X, self.y, 1.0 / self.n_samples if self._sum_loss else 1.0)

    def loss(self, w: np.ndarray) -> float:
        """The mean loss over all samples at ``w``."""
        self.load(w)
        with torch.no_grad():
            value = self.loss_fn(self.model(self.X), self.y)
        return float(value) / (self.n_samples if self._sum_loss else 1)

    def accuracy(self, w: np.ndarray) -> float:
        """Fraction of samples whose arg-max output is the label (classification models)."""
        self.load(w)
        with torch.no_grad():
            pred = self.model(self.X).argmax(dim=-1)
        return float((pred == self.y).float().mean())

    def make_stepper(self, learning_rate: float) -> TorchStepper:
        """The spec's ``torch.optim`` optimizer over this model's parameters."""
        return TorchStepper(self, learning_rate)

    def __repr__(self) -> str:
        return f"TorchTask(spec={self.spec!r}, dim={self.dim}, n_chunks={self.n_chunks})"


class TorchStepper:
    """``torch.optim.SGD`` / ``torch.optim.Adam`` fed the decoded gradient through ``.grad``.

    Implements :class:`aiogc.training.frameworks.Stepper`: each :meth:`step` snapshots the
    optimizer's state first, and the next step restores it unless :meth:`commit` came between.
    """

    def __init__(self, task: TorchTask, learning_rate: float) -> None:
        self.task = task
        cls: Any = torch.optim.Adam if task.optimizer == "adam" else torch.optim.SGD
        self.optimizer: torch.optim.Optimizer = cls(task.params, lr=float(learning_rate))
        self._saved: dict[str, Any] | None = None

    def step(self, w: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Load ``w``, set every parameter's ``.grad`` from ``g`` (shape (d,)), take one
        optimizer step; the new flat model, shape (d,) float64."""
        if self._saved is not None:  # the last step was not committed: undo its state
            self.optimizer.load_state_dict(self._saved)
        self._saved = copy.deepcopy(self.optimizer.state_dict())
        task = self.task
        task.load(w)
        vec = torch.from_numpy(np.ascontiguousarray(g, dtype=np.float64)).to(task.dtype)
        at = 0
        for p in task.params:
            k = p.numel()
            p.grad = vec[at:at + k].view_as(p).clone()
            at += k
        self.optimizer.step()
        return task._flat_params()

    def commit(self) -> None:
        """Keep the state the last step advanced."""
        self._saved = None
