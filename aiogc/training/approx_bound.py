"""A bound for approximate rounds that exists from round 0, without the PS's oracle.

Under ``--no-verify`` the PS does not compute the uncoded chunk gradients, so an approximate
round (decoded at the deadline) had only the norm guard, which has no reference before its
first accepted rounds. This module gives it one from two cheap quantities:

* ``B(w) >= sum_i ||g_i(w)|| >= || sum_i |g_i(w)| ||``: a bound on the chunk gradients from the
  data alone (:func:`gradient_bound_fn`; per chunk, ``||X_i^T (X_i w - y_i)|| / n <= (s_i^2
  ||w|| + ||X_i^T y_i||) / n`` for least squares with ``s_i = ||X_i||_2``, and ``s_i sqrt(n_i) /
  n + (n_i / n) reg ||w||`` for logistic regression), one norm of ``w`` per round;
* the decode's gain ``Γ(state)`` (:func:`decode_gain`): the decoder is linear in the chunk
  gradients, part ``k`` of the decode at in-part position ``t`` being ``sum_{k', c} C[k, k', c]
  g_c^(k')[t]``; with ``M[k, k'] = max_c |C[k, k', c]|``, ``||decode|| <= ||M||_2 || sum_c
  |g_c| ||`` for *every* honest input. ``C`` is read off ``ell`` probe decodes (one per part),
  each the PS's own re-encoding of unit chunk gradients for the round's state.

Honest rounds therefore satisfy ``||ĝ|| <= Γ B``, and a decode above it is rejected
(``approx_bound``). The bound this states (docs/security.md): an applied approximate step is
within ``(1 + Γ) B`` of the true gradient, the same bound an honest approximate round satisfies
(``||ĝ_honest - g|| <= ||ĝ_honest|| + ||g|| <= (Γ + 1) B``); a lie can make the step no worse
than the worst honest approximate step. It does not make a lie *visible* (that is the oracle's
job, ``--verify``): rounds keep their ``unverified`` marker.

**Exact rounds** get the same data bound with gain 1 (:func:`exact_bound_check`): an honest
exact decode is the true gradient ``g = sum_i g_i``, whose norm is at most ``sum_i ||g_i|| <=
B``, up to the decode's rounding (the oracle's own tolerance relative to ``||sum_i |g_i| ||
<= B``, plus a compressed upload's rounding bound). So under ``--no-verify`` a lie in an exact
round that passes the redundancy check (or meets none: the partial scheme, the original one
without a spare) moves the step at most ``2 B`` from the truth.

Both bounds take ``B`` at the model the workers were *sent* (rounded to the payload dtype):
their chunk gradients are taken there (:func:`model_sent`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from aiogc.coding.consistency import Verdict
from aiogc.training.tasks import LinearRegression, LogisticRegression, Task

__all__ = ["APPROX_BOUND_SLACK", "approx_bound_check", "decode_gain", "exact_bound_check",
           "gradient_bound_fn", "model_sent"]

#: relative slack on ``Γ B`` for the rounding of the decode and of the bound itself
APPROX_BOUND_SLACK = 1e-6

#: ``(state, G (N, d), d) -> decode of G's honest re-encoding``, shape (d,)
EstimateFn = Callable[[np.ndarray, np.ndarray, int], np.ndarray]


def _sq_spectral(Xi: np.ndarray) -> float:
    """``||X_i||_2^2`` from the smaller Gram matrix (``min(n_i, d)`` square)."""
    gram = Xi.T @ Xi if Xi.shape[1] <= Xi.shape[0] else Xi @ Xi.T
    return float(np.linalg.eigvalsh(gram)[-1]) if gram.size else 0.0


def gradient_bound_fn(task: Task) -> Callable[[np.ndarray], float] | None:
    """``w -> B(w)``, an upper bound on ``sum_i ||g_i(w)||`` from the task's data, or None
    when the task has no such bound (a plug-in: its approximate rounds keep the norm guard).

    The per-chunk constants (one Gram eigenvalue per chunk) are computed on the first call,
    i.e. only if an approximate round needs them.
    """
    if not isinstance(task, LinearRegression | LogisticRegression):
        return None
    consts: list[float] = []

    def bound(w: np.ndarray) -> float:
        if not consts:
            consts.extend(_constants(task))
        a, b = consts
        return a * float(np.linalg.norm(w)) + b

    return bound


def _constants(task: LinearRegression | LogisticRegression) -> tuple[float, float]:
    """``(a, b)`` with ``B(w) = a ||w|| + b``."""
    n = task.n_samples
    rows = [task.chunk_rows(i) for i in range(task.n_chunks)]
    sq = np.array([_sq_spectral(task.X[r]) for r in rows])
    if isinstance(task, LinearRegression):
        # ||X_i^T (X_i w - y_i)|| / n <= (s_i^2 ||w|| + ||X_i^T y_i||) / n
        b = float(sum(np.linalg.norm(task.X[r].T @ task.y[r]) for r in rows)) / n
        return float(sq.sum()) / n, b
    # ||X_i^T (sigma - y_i)|| / n <= s_i sqrt(n_i) / n (each residual in [-1, 1]); the
    # penalty's shares n_i / n sum to 1
    counts = np.array([r.stop - r.start for r in rows], dtype=np.float64)
    return task.reg, float(np.sum(np.sqrt(sq * counts))) / n


def decode_gain(estimate: EstimateFn, state: np.ndarray, n_chunks: int, n_parts: int
                ) -> float:
    """``Γ = ||M||_2``: the largest factor by which the decode at ``state`` can exceed
    ``|| sum_c |g_c| ||`` for honest payloads (see the module docstring).

    Parameters
    ----------
    estimate : callable
        ``(state, G, d) -> decode``, the PS's honest re-encode-and-decode
        (``Aggregator.honest_estimate``).
    state : ndarray of int64, shape (m,)
    n_chunks, n_parts : int
        ``N`` and ``ell`` (the payload is ``ell`` contiguous parts of ``ceil(d / ell)``).

    Returns
    -------
    float
    """
    N, ell = int(n_chunks), int(n_parts)
    d = ell * N  # each part holds exactly N positions: position t of part k' probes chunk t
    M = np.zeros((ell, ell))
    eye = np.eye(N)
    for kp in range(ell):
        G = np.zeros((N, d))
        G[:, kp * N:(kp + 1) * N] = eye
        out = np.asarray(estimate(state, G, d), dtype=np.float64).reshape(ell, N)
        M[:, kp] = np.abs(out).max(axis=1)
    return float(np.linalg.norm(M, 2))


def model_sent(model: np.ndarray, payload_dtype: object) -> np.ndarray:
    """The model the workers computed on: ``model`` rounded to the payload dtype, as float64.

    ``B`` is evaluated there (the PS broadcasts ``model.astype(payload_dtype)``): in float32,
    ``||fl32(w)||`` may exceed ``||w||`` by a relative ``2^-24``, which a tight bound must not
    miss. Shape (d,) in, (d,) out.
    """
    w = np.asarray(model)
    dt = np.dtype(payload_dtype)  # type: ignore[call-overload]
    return w.astype(dt).astype(np.float64) if dt != np.float64 else w.astype(np.float64)


def approx_bound_check(gradient: np.ndarray, gain: float, bound: float, *,
                       floor: float = 0.0, rel_tol: float = 0.0, abs_tol: float = 0.0,
                       check: str = "approx_bound") -> Verdict:
    """Reject a decode whose norm exceeds ``(gain + rel_tol) B + abs_tol`` (with slack and
    ``floor``).

    Parameters
    ----------
    gradient : ndarray, shape (d,)
    gain, bound : float
        ``Γ`` (:func:`decode_gain`; 1 for an exact round) and ``B(w)``
        (:func:`gradient_bound_fn`).
    floor : float
        Norms at or below it pass (the round-off floor of the norm guard).
    rel_tol : float
        The decode's rounding relative to ``||sum_i |g_i| || <= B`` (the oracle's tolerance
        for exact rounds, the honest-estimate check's for approximate ones).
    abs_tol : float
        A compressed upload's rounding, absolute (:func:`aiogc.coding.compress.rounding_bound`).
    check : str
        The verdict's name (``approx_bound``; ``data_bound`` for exact rounds).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        norm = float(np.linalg.norm(np.asarray(gradient, dtype=np.float64)))
    limit = max(floor, (gain + rel_tol) * bound * (1 + APPROX_BOUND_SLACK) + abs_tol)
    if not (math.isfinite(norm) and norm <= limit):
        what = "exact" if check == "data_bound" else "approximate"
        return Verdict(False, check,
                       f"{what} decode norm {norm:.3g} above what the finished chunks can "
                       f"justify (gain {gain:.3g} x data bound {bound:.3g})", norm, limit)
    return Verdict.passed(check, norm, limit)


def exact_bound_check(gradient: np.ndarray, bound: float, *, rel_tol: float,
                      floor: float = 0.0, abs_tol: float = 0.0) -> Verdict:
    """An exact round: ``||ĝ|| <= (1 + rel_tol) B + abs_tol`` (``data_bound``; see the module
    docstring). Parameters as :func:`approx_bound_check` with gain 1; ``gradient`` shape (d,).
    """
    return approx_bound_check(gradient, 1.0, bound, floor=floor, rel_tol=rel_tol,
                              abs_tol=abs_tol, check="data_bound")
