"""A small MLP on scikit-learn's digits (1797 8x8 images, 10 classes), for PyTorch and JAX.

The data set ships inside scikit-learn (``sklearn.datasets.load_digits`` reads a file in the
package; nothing is downloaded). Train it live with gradient coding::

    aiogc run --task torch:examples/mlp_digits.py:torch_mlp --schemes partial,original,uncoded \\
        --delay straggle:0.25,5,exp:0.02 --rounds 150
    aiogc run --task jax:examples/mlp_digits.py:jax_mlp,optimizer=adam,lr=0.01 ...

Each factory takes the run's seed and returns ``(model, loss, (X, y))``
(:mod:`aiogc.training.frameworks`). Needs ``pip install 'aiogc[torch]'`` or ``'aiogc[jax]'`` and
scikit-learn (``'aiogc[examples]'``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

HIDDEN = 32


def digits() -> tuple[np.ndarray, np.ndarray]:
    """``X`` (1797, 64) float32 pixel intensities scaled to [0, 1], ``y`` (1797,) int64 labels."""
    from sklearn.datasets import load_digits

    data = load_digits()
    return (np.asarray(data.data, dtype=np.float32) / 16.0,
            np.asarray(data.target, dtype=np.int64))


def torch_mlp(seed: int) -> tuple[Any, Any, tuple[np.ndarray, np.ndarray]]:
    """64 -> 32 (tanh) -> 10 MLP, mean cross-entropy (aiogc seeds torch with ``seed`` first)."""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, HIDDEN), torch.nn.Tanh(),
                                torch.nn.Linear(HIDDEN, 10))
    return model, torch.nn.CrossEntropyLoss(), digits()


def jax_mlp(seed: int) -> tuple[Any, Any, tuple[np.ndarray, np.ndarray]]:
    """The same MLP in JAX: ``(apply_fn, params)``, mean cross-entropy."""
    import jax
    import jax.numpy as jnp

    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))

    def dense(key: Any, n_in: int, n_out: int) -> dict[str, Any]:
        bound = 1.0 / np.sqrt(n_in)  # PyTorch's nn.Linear initialisation
        kw, kb = jax.random.split(key)
        return {"w": jax.random.uniform(kw, (n_in, n_out), minval=-bound, maxval=bound),
                "b": jax.random.uniform(kb, (n_out,), minval=-bound, maxval=bound)}

    params = {"l1": dense(k1, 64, HIDDEN), "l2": dense(k2, HIDDEN, 10)}

    def apply(p: Any, X: Any) -> Any:
        h = jnp.tanh(X @ p["l1"]["w"] + p["l1"]["b"])
        return h @ p["l2"]["w"] + p["l2"]["b"]

    def loss(logits: Any, y: Any) -> Any:
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    return (apply, params), loss, digits()


def time_to_target(run_dir: str, target: float) -> dict[str, float | None]:
    """Per scheme of a run directory: seconds from its first round's start to the end of the
    first round whose loss is <= ``target`` (None if it never got there). The seconds are the
    run's recorded ones (emulated seconds at ``--time-scale K``)."""
    import csv
    from pathlib import Path

    first: dict[str, float] = {}
    hit: dict[str, float | None] = {}
    with (Path(run_dir) / "rounds.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            name = row["scheme"]
            first.setdefault(name, float(row["start_s"]))
            hit.setdefault(name, None)
            loss = float(row["loss"]) if row["loss"] else float("nan")
            if hit[name] is None and loss <= target:
                hit[name] = float(row["end_s"]) - first[name]
    return hit


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="time to a target loss per scheme of a run")
    ap.add_argument("run_dir")
    ap.add_argument("--target", type=float, default=0.5)
    args = ap.parse_args()
    for scheme, t in time_to_target(args.run_dir, args.target).items():
        print(f"{scheme:>10}: " + ("never" if t is None else f"{t:.2f} s") +
              f" to loss <= {args.target}")
