"""JAX models as aiogc tasks (``--task jax:MODULE:ATTR``; :mod:`aiogc.training.frameworks`).

The model is ``(apply_fn, params)``; gradients are ``jax.grad`` of the chunk's weighted loss
with respect to the flat parameter vector (``jax.flatten_util.ravel_pytree``), jit-compiled once
per chunk shape (chunk sizes differ by at most one: at most two compilations). The PS steps with
optax (``optax.sgd`` / ``optax.adam``) when it is installed (the extra ``aiogc[jax]`` installs
it); without optax, ``optimizer=sgd`` falls back to plain ``w - lr g`` in the model's dtype
(:class:`aiogc.training.frameworks.PlainSGD`) and ``optimizer=adam`` is refused.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from aiogc.errors import ConfigError
from aiogc.training.frameworks import (
    FrameworkSpec,
    PlainSGD,
    Stepper,
    call_factory,
    chunk_bounds,
    shuffle_order,
)

__all__ = ["JaxTask", "OptaxStepper"]


class JaxTask:
    """A JAX ``(apply_fn, params)`` model and a mean loss over a data set, split into chunks.

    Parameters
    ----------
    fs : FrameworkSpec
    factory : callable
        ``factory(seed) -> ((apply_fn, params), loss, (X, y))``.
    n_chunks, seed : int

    Attributes
    ----------
    dim : int
        Entries of the flat parameter vector (``ravel_pytree(params)``).
    unravel : callable
        Flat vector (d,) -> the params pytree.
    """

    def __init__(self, fs: FrameworkSpec, factory: object, n_chunks: int, seed: int) -> None:
        model, loss, (X, y) = call_factory(factory, seed, fs.spec)
        if not (isinstance(model, tuple | list) and len(model) == 2 and callable(model[0])):
            raise ConfigError("task", fs.spec, "a JAX model (apply_fn, params)")
        apply_fn, params = model
        flat, self.unravel = ravel_pytree(params)
        if flat.size == 0 or not jnp.issubdtype(flat.dtype, jnp.floating):
            raise ConfigError("task", fs.spec, "params: a pytree of float arrays")
        self.dtype = flat.dtype
        X_j, y_j = jnp.asarray(X), jnp.asarray(y)
        if jnp.issubdtype(X_j.dtype, jnp.floating):
            X_j = X_j.astype(self.dtype)
        n = int(X_j.shape[0])
        if int(y_j.shape[0]) != n:
            raise ConfigError("task", fs.spec, f"X and y with the same number of rows "
                              f"({n} != {int(y_j.shape[0])})")
        perm = jnp.asarray(shuffle_order(n, seed))
        self.X, self.y = X_j[perm], y_j[perm]
        self.n_samples = n
        self.n_chunks = int(n_chunks)
        self.bounds = chunk_bounds(n, n_chunks, fs.spec)
        # each chunk sliced once: a jitted function sees at most two shapes
        self._chunks = [(self.X[int(a):int(b)], self.y[int(a):int(b)])
                        for a, b in zip(self.bounds[:-1], self.bounds[1:], strict=True)]
        unravel = self.unravel

        def weighted(wf: Any, Xb: Any, yb: Any, weight: Any) -> Any:
            return loss(apply_fn(unravel(wf), Xb), yb) * weight

        self._grad = jax.jit(jax.grad(weighted))
        self._loss = jax.jit(lambda wf, Xb, yb: loss(apply_fn(unravel(wf), Xb), yb))
        self._apply = jax.jit(lambda wf, Xb: apply_fn(unravel(wf), Xb))
        self.dim = int(flat.size)
        self.name = "jax"
        self.spec = fs.spec
        self.optimizer = fs.optimizer
        self.learning_rate = fs.lr
        self._initial = np.asarray(flat, dtype=np.float64)

    def _w(self, w: np.ndarray) -> Any:
        w = np.asarray(w)
        if w.shape != (self.dim,):
            raise ValueError(f"model has shape {w.shape}, expected ({self.dim},)")
        return jnp.asarray(w, dtype=self.dtype)

    def initial_model(self) -> np.ndarray:
        """The factory's params, flattened: shape (d,) float64."""
        return self._initial.copy()

    def chunk_gradient(self, chunk: int, w: np.ndarray) -> np.ndarray:
        """``jax.grad`` of chunk ``chunk``'s share ``(n_i/n) loss(chunk)``: shape (d,) float64."""
        if not 0 <= chunk < self.n_chunks:
            raise IndexError(f"chunk {chunk} out of range 0..{self.n_chunks - 1}")
        Xb, yb = self._chunks[chunk]
        weight = (int(self.bounds[chunk + 1]) - int(self.bounds[chunk])) / self.n_samples
        g = self._grad(self._w(w), Xb, yb, jnp.asarray(weight, dtype=self.dtype))
        return np.asarray(g, dtype=np.float64)

    def full_gradient(self, w: np.ndarray) -> np.ndarray:
        """Full-batch ``jax.grad`` of :meth:`loss`: shape (d,) float64."""
        g = self._grad(self._w(w), self.X, self.y, jnp.asarray(1.0, dtype=self.dtype))
        return np.asarray(g, dtype=np.float64)

    def loss(self, w: np.ndarray) -> float:
        """The mean loss over all samples at ``w``."""
        return float(self._loss(self._w(w), self.X, self.y))

    def accuracy(self, w: np.ndarray) -> float:
        """Fraction of samples whose arg-max output is the label (classification models)."""
        pred = jnp.argmax(self._apply(self._w(w), self.X), axis=-1)
        return float(jnp.mean(pred == self.y))

    def make_stepper(self, learning_rate: float) -> Stepper:
        """optax's ``sgd`` / ``adam``; :class:`PlainSGD` for sgd without optax."""
        try:
            import optax
        except ImportError:
            if self.optimizer != "sgd":
                raise ConfigError("task", self.spec, "optax installed for optimizer="
                                  f"{self.optimizer} (pip install 'aiogc[jax]')") from None
            return PlainSGD(learning_rate, self.dtype)
        tx = optax.adam(learning_rate) if self.optimizer == "adam" else optax.sgd(learning_rate)
        return OptaxStepper(tx, self._w(self._initial))

    def __repr__(self) -> str:
        return f"JaxTask(spec={self.spec!r}, dim={self.dim}, n_chunks={self.n_chunks})"


class OptaxStepper:
    """An optax gradient transformation over the flat parameter vector (Adam and SGD act
    entry by entry, so the flat vector is the same optimizer as the pytree).

    Implements :class:`aiogc.training.frameworks.Stepper`: optax's state is a value, so a
    step keeps its new state aside until :meth:`commit`.
    """

    def __init__(self, tx: Any, w0: Any) -> None:
        self.tx = tx
        self.dtype = w0.dtype
        self.state = tx.init(w0)
        self._pending: Any = None
        self._update = jax.jit(self._raw_update)

    def _raw_update(self, w: Any, g: Any, state: Any) -> tuple[Any, Any]:
        import optax

        updates, new_state = self.tx.update(g, state, w)
        return optax.apply_updates(w, updates), new_state

    def step(self, w: np.ndarray, g: np.ndarray) -> np.ndarray:
        """One optax step from ``w`` along ``g`` (shape (d,)): the new model, float64."""
        new, self._pending = self._update(jnp.asarray(w, dtype=self.dtype),
                                          jnp.asarray(g, dtype=self.dtype), self.state)
        return np.asarray(new, dtype=np.float64)

    def commit(self) -> None:
        """Keep the state the last step produced."""
        if self._pending is not None:
            self.state, self._pending = self._pending, None
