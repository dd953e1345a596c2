"""The oracle's tolerance allows for its own evaluation: a worker's chunk gradients need not
equal the PS's bit for bit (another BLAS thread count, another CPU sums in another order), and
near an optimum, where the chunk gradients cancel, that difference is far above the decode's
rounding. The bound of :func:`aiogc.training.tasks.evaluation_error_fn` holds against an
exactly rounded evaluation, and the guard accepts an honest round within it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aiogc.coding.consistency import DecodedStep, RoundGuard, scheme_oracle_tolerance
from aiogc.config import RunConfig
from aiogc.training.tasks import (
    FunctionTask,
    chunk_gradients,
    evaluation_error_fn,
    make_task,
)


def _exact_chunk_gradients(task, w: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Every chunk gradient with each sum exactly rounded (math.fsum): an evaluation in
    another order than BLAS's, as close to the truth as float64 allows."""
    out = np.empty((task.n_chunks, task.dim))
    n = task.n_samples
    for i in range(task.n_chunks):
        rows = task.chunk_rows(i)
        X, y = task.X[rows], task.y[rows]
        if task.name == "linreg":
            r = [math.fsum([*(X[t] * w), -y[t]]) for t in range(X.shape[0])]
            out[i] = [math.fsum(X[:, k] * r) / n for k in range(task.dim)]
        else:
            z = [math.fsum(X[t] * w) for t in range(X.shape[0])]
            r = np.array([1.0 / (1.0 + math.exp(-v)) for v in z]) - y
            share = (rows.stop - rows.start) / n
            out[i] = [math.fsum(X[:, k] * r) / n + share * task.reg * w[k]
                      for k in range(task.dim)]
    return out


@pytest.mark.parametrize("spec", ["linreg:samples=96,dim=40", "logreg:breast-cancer"])
def test_two_evaluations_differ_by_no_more_than_the_bound(spec: str) -> None:
    task = make_task(spec, 6, 3)
    fn = evaluation_error_fn(task)
    assert fn is not None
    rng = np.random.default_rng(0)
    w_star = getattr(task, "w_star", None)
    models = [rng.standard_normal(task.dim)]
    if w_star is not None:  # near the optimum the chunk gradients cancel
        models.append(w_star + 1e-9 * rng.standard_normal(task.dim))
    for w in models:
        blas = chunk_gradients(task, range(task.n_chunks), w).sum(axis=0)
        exact = _exact_chunk_gradients(task, w).sum(axis=0)
        assert np.linalg.norm(blas - exact) <= fn(w) / 2  # one evaluation's share


def test_plug_ins_have_no_evaluation_bound() -> None:
    task = FunctionTask(lambda i, w: np.asarray(w, dtype=np.float64), dim=3, n_chunks=4)
    assert evaluation_error_fn(task) is None


def test_the_guard_accepts_an_honest_round_within_the_evaluation_bound() -> None:
    cfg = RunConfig(workers=8, delta=3, seed=1, task="linreg:samples=96,dim=40")
    scheme = cfg.build_scheme()
    tight = scheme_oracle_tolerance(scheme, "float64", 1e-15)
    assert tight is not None
    w0 = np.zeros(40)
    grad = np.full(40, 1e-3)
    coded = np.zeros((8, 40))

    def check(rel_error: float, evaluation: float | None) -> str:
        guard = RoundGuard(w0, predicted_error=1e-15)
        bad, _ = guard.check(scheme=scheme, coded=coded, received=range(8), dim=40,
                             decoded=DecodedStep(grad, True, rel_error, 0.0, evaluation),
                             model=w0, learning_rate=0.1)
        return "applied" if bad is None else bad.check

    assert check(0.5 * tight, 0.0) == "applied"
    # an evaluation difference beyond the decode's rounding: rejected when the two
    # evaluations are taken to be equal bit for bit, applied within the task's bound
    assert check(3.0 * tight, 0.0) == "oracle"
    assert check(3.0 * tight, 5.0 * tight) == "applied"
    assert check(10.0 * tight, 5.0 * tight) == "oracle"
    # no bound known: the default tolerance (max(1e-6, 1000 x predicted error))
    assert check(1e-7, None) == "applied" and check(1e-5, None) == "oracle"
