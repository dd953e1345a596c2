"""Tiny framework models for tests/test_frameworks.py (``torch:`` / ``jax:`` task factories).

Synthetic data from the seed (no package data set): 90 samples, 5 features, 3 classes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

N_SAMPLES, N_FEATURES, N_CLASSES, HIDDEN = 90, 5, 3, 7


def data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``X`` (90, 5) float32, ``y`` (90,) int64 in 0..2: labels from a fixed linear map."""
    rng = np.random.default_rng([seed, 7])
    X = rng.standard_normal((N_SAMPLES, N_FEATURES)).astype(np.float32)
    W = rng.standard_normal((N_FEATURES, N_CLASSES))
    return X, np.argmax(X @ W, axis=1).astype(np.int64)


def torch_tiny(seed: int) -> tuple[Any, Any, tuple[np.ndarray, np.ndarray]]:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(N_FEATURES, HIDDEN), torch.nn.Tanh(),
                                torch.nn.Linear(HIDDEN, N_CLASSES))
    return model, torch.nn.CrossEntropyLoss(), data(seed)


def torch_tiny_sum(seed: int) -> tuple[Any, Any, tuple[np.ndarray, np.ndarray]]:
    """The same with a summing loss (the adapter divides by n)."""
    import torch

    model, _, xy = torch_tiny(seed)
    return model, torch.nn.CrossEntropyLoss(reduction="sum"), xy


def jax_init(seed: int) -> dict[str, Any]:
    import jax

    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {"w1": 0.5 * jax.random.normal(k1, (N_FEATURES, HIDDEN)),
            "b1": jax.numpy.zeros(HIDDEN),
            "w2": 0.5 * jax.random.normal(k2, (HIDDEN, N_CLASSES)),
            "b2": jax.numpy.zeros(N_CLASSES)}


def jax_apply(p: Any, X: Any) -> Any:
    import jax.numpy as jnp

    return jnp.tanh(X @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def jax_loss(logits: Any, y: Any) -> Any:
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def jax_tiny(seed: int) -> tuple[Any, Any, tuple[np.ndarray, np.ndarray]]:
    return (jax_apply, jax_init(seed)), jax_loss, data(seed)
