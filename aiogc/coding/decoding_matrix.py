"""The decoding matrix ``B`` (ell x m) of the partial-straggler scheme and its conditioning.

At the exact trigger the worst case is a chunk covered by exactly ``ell`` holders, so every
``ell``-subset of every chunk's holders must give a well-conditioned ``ell x ell`` submatrix of
``B``. The "frame" construction colours the workers so that holders of a common chunk get
distinct colours and gives every colour one column of a small frame ``F`` (ell x K) optimised for
the colour subsets that actually occur; a worker's column of ``B`` is its colour's column of
``F``. Known imperfection: the frame search is random search plus hill climbing, not an optimum.
"""

from __future__ import annotations

import itertools
import math
import warnings
from typing import Literal

import numpy as np

from aiogc.coding.portable import column_norms
from aiogc.coding.registry import SETUP_MEMORY_BUDGET, check_setup_budget, setup_bytes
from aiogc.errors import CodingError

__all__ = [
    "SETUP_MEMORY_BUDGET",
    "check_conditioning",
    "check_setup_budget",
    "colour_workers",
    "count_colour_subsets",
    "decoding_matrix",
    "setup_bytes",
    "subset_conditions",
    "worst_condition_number",
]

#: Colour subsets scored per frame candidate at most (bounds the frame search cost).
MAX_FRAME_SUBSETS = 5000
#: Distinct colour ell-subsets enumerated at most; above this they are sampled instead, so
#: setup never materialises C(gamma, ell) tuples (C(64, 8) = 4.4e9 took 3.2 GB and minutes).
MAX_ENUMERATED_SUBSETS = 200_000
#: Draws of the sampler per wanted subset (duplicates are dropped, so a few draws more).
_SAMPLE_OVERDRAW = 2
#: Candidate budget of the frame search, in scored subsets of size ell <= 3 (~ 0.5 s of batched
#: SVDs). A larger ell costs ~ell^3 per SVD, so the subset counts shrink by (ell/3)^3: the
#: search then takes the same time whatever ell (unscaled, ell = 8 would take ten times as long).
FRAME_SEARCH_BUDGET = 400_000
#: Fewest colour subsets a frame candidate is scored on, however large ell.
MIN_FRAME_SUBSETS = 500
#: Relative margin by which the frame search compares condition numbers. The PS and every
#: worker run the search on their own CPUs, whose SVDs differ in the last bits (~1e-15
#: relative): a candidate wins only by more than this, and the worst subset is the first within
#: it of the maximum, so every machine makes the same choices and draws the same ``B``.
#: (Two scores within ~1e-15 of this margin's edge could still split machines: ~1e-6 a choice.)
SCORE_MARGIN = 1e-9


def subset_conditions(mats: np.ndarray) -> np.ndarray:
    """2-norm condition numbers of square matrices: (n, l, l) -> (n,); inf where singular."""
    if mats.shape[0] == 0:
        return np.zeros(0)
    sv = np.linalg.svd(mats, compute_uv=False)
    with np.errstate(divide="ignore", invalid="ignore"):
        c = sv[:, 0] / sv[:, -1]
    return np.where(sv[:, -1] > 0, c, np.inf)


def _conflict_lists(A: np.ndarray) -> list[np.ndarray]:
    """Per worker, the other workers sharing a chunk with it (ascending indices).

    The co-holding counts ``A^T A`` go through BLAS in float32: they are integers <= N, exact
    in float32 up to 2^24 (float64 beyond), so ``> 0`` is the same boolean matrix an integer
    product gives. numpy's integer matmul has no BLAS path: at m = 1024 it was most of
    ``aiogc ps -m 1024 --delta 64 --ell 8``'s set-up.
    """
    Af: np.ndarray = A.astype(np.float32 if A.shape[0] < 2**24 else np.float64)
    C: np.ndarray = (Af.T @ Af) > 0
    np.fill_diagonal(C, False)
    return [np.flatnonzero(C[j]) for j in range(A.shape[1])]


def _greedy(nbrs: list[np.ndarray], order: np.ndarray) -> np.ndarray:
    col = np.full(len(nbrs), -1, dtype=np.int64)
    for v in order:
        used = set(col[nbrs[v]].tolist())
        c = 0
        while c in used:
            c += 1
        col[v] = c
    return col


def colour_workers(
    A: np.ndarray, rng: np.random.Generator | None = None, trials: int = 20
) -> np.ndarray:
    """Colour workers so that any two holders of a common chunk differ; few colours.

    Greedy colouring in index order, by decreasing degree, and in ``trials`` random orders;
    the result with fewest colours wins.

    Returns
    -------
    colours : ndarray of int64, shape (m,), values ``0 .. K-1``
    """
    nbrs = _conflict_lists(A)
    m = A.shape[1]
    deg = np.array([len(n) for n in nbrs])
    cands = [np.arange(m), np.argsort(-deg, kind="stable")]
    if rng is not None:
        cands += [rng.permutation(m) for _ in range(trials)]
    best = None
    for order in cands:
        col = _greedy(nbrs, order)
        if best is None or col.max() < best.max():
            best = col
    assert best is not None
    return best


def _subset_groups(A: np.ndarray, colours: np.ndarray, ell: int) -> list[tuple[int, ...]]:
    """Distinct sorted colour tuples of the chunks' holder sets with at least ell entries."""
    groups = {tuple(sorted(colours[A[i]].tolist())) for i in range(A.shape[0])}
    return sorted(g for g in groups if len(g) >= ell)


def count_colour_subsets(A: np.ndarray, colours: np.ndarray, ell: int) -> int:
    """Upper bound on the distinct colour ell-subsets :func:`_colour_subsets` would enumerate.

    Counts ``sum_g C(|g|, ell)`` over the distinct colour groups without enumerating them
    (subsets shared by two groups are counted twice, hence an upper bound).
    """
    return sum(math.comb(len(g), ell) for g in _subset_groups(A, colours, ell))


def _svd_cost(ell: int) -> float:
    """Cost of one ell x ell SVD relative to the ell <= 3 the budgets were calibrated on."""
    return max(1.0, ell**3 / 27.0)


def _max_frame_subsets(ell: int) -> int:
    return max(MIN_FRAME_SUBSETS, int(MAX_FRAME_SUBSETS / _svd_cost(ell)))


def _colour_subsets(
    A: np.ndarray, colours: np.ndarray, ell: int, rng: np.random.Generator
) -> np.ndarray:
    """Distinct sorted colour ell-subsets occurring among some chunk's holders; (n, ell).

    At most ``_max_frame_subsets(ell)`` rows (:data:`MAX_FRAME_SUBSETS` for ell <= 3). When
    the groups hold more than :data:`MAX_ENUMERATED_SUBSETS` subsets in total they are
    *sampled* (a group with
    probability proportional to its subset count, then a uniform ell-subset of it), never
    enumerated: memory O(MAX_FRAME_SUBSETS * gamma) and time independent of C(gamma, ell).
    """
    groups = _subset_groups(A, colours, ell)
    counts = np.array([math.comb(len(g), ell) for g in groups], dtype=np.float64)
    if counts.sum() <= MAX_ENUMERATED_SUBSETS:
        seen: set[tuple[int, ...]] = set()
        for cs in groups:
            seen.update(itertools.combinations(cs, ell))
        subs = np.array(sorted(seen), dtype=np.int64).reshape(-1, ell)
        cap = _max_frame_subsets(ell)
        if subs.shape[0] > cap:
            subs = subs[rng.choice(subs.shape[0], cap, replace=False)]
        return subs
    return _sample_subsets(groups, counts, ell, _max_frame_subsets(ell), rng)


def _sample_subsets(
    groups: list[tuple[int, ...]],
    counts: np.ndarray,
    ell: int,
    n: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Up to ``n`` distinct sorted ell-subsets drawn from ``groups``; shape (<= n, ell).

    ``_SAMPLE_OVERDRAW * n`` draws in total, one batched argsort per group drawn from (a random
    ell-subset of ``g`` is the first ell entries of a random permutation of ``g``).
    """
    draws = _SAMPLE_OVERDRAW * n
    which = rng.choice(len(groups), size=draws, p=counts / counts.sum())
    parts = []
    for w in np.unique(which):
        g = np.asarray(groups[int(w)], dtype=np.int64)
        k = int((which == w).sum())
        pick = np.argsort(rng.random((k, g.size)), axis=1)[:, :ell]
        parts.append(np.sort(g[pick], axis=1))
    subs = np.unique(np.concatenate(parts, axis=0), axis=0)
    if subs.shape[0] > n:
        subs = subs[np.sort(rng.choice(subs.shape[0], n, replace=False))]
    return subs


def _frame_score(F: np.ndarray, subs: np.ndarray) -> np.ndarray:
    return subset_conditions(np.transpose(F[:, subs], (1, 0, 2)))


def _best_frame(ell: int, K: int, subs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Best-of-T random unit-column frames, then hill climbing on the worst colour subset."""
    if ell == K:
        return np.eye(ell)
    n = max(subs.shape[0], 1)
    per_step = int(FRAME_SEARCH_BUDGET / _svd_cost(ell)) // (2 * n)
    n_cand = int(np.clip(per_step, 10, 200))
    n_climb = int(np.clip(per_step, 10, 300))
    best, best_s = None, np.inf
    for _ in range(n_cand):
        F = rng.standard_normal((ell, K))
        F /= column_norms(F)
        s = float(_frame_score(F, subs).max())
        if s < best_s * (1 - SCORE_MARGIN):
            best, best_s = F, s
    assert best is not None
    step = 0.3
    for _ in range(n_climb):
        conds = _frame_score(best, subs)
        worst = subs[int(np.argmax(conds >= conds.max() * (1 - SCORE_MARGIN)))]
        F = best.copy()
        c = int(rng.choice(worst))
        F[:, c] += step * rng.standard_normal(ell)
        F[:, c] /= column_norms(F[:, c:c + 1])
        s = float(_frame_score(F, subs).max())
        if s < best_s * (1 - SCORE_MARGIN):
            best, best_s = F, s
        else:
            step = max(step * 0.97, 0.01)
    return best


def decoding_matrix(
    A: np.ndarray,
    n_parts: int,
    method: Literal["frame", "gaussian", "ones"] = "frame",
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """The decoding matrix ``B`` known to the PS and every worker.

    Parameters
    ----------
    A : ndarray of bool, shape (N, m)
    n_parts : int
        ``ell``, ``1 <= ell <= min_i gamma_i``.
    method : {"frame", "gaussian", "ones"}
        ``ell == 1`` always gives all ones. ``"frame"``: colour-class frame (module docstring);
        ``"gaussian"``: i.i.d. standard normal entries; ``"ones"`` is only valid for ``ell == 1``.
    rng : numpy.random.Generator, optional
        ``None`` means ``default_rng(0)``.

    Returns
    -------
    B : ndarray of float64, shape (ell, m)

    Examples
    --------
    >>> from aiogc.coding import cyclic_assignment
    >>> decoding_matrix(cyclic_assignment(4, 2), 1)
    array([[1., 1., 1., 1.]])
    """
    if method not in ("frame", "gaussian", "ones"):
        raise CodingError(f"method={method!r} not in ('frame', 'gaussian', 'ones')")
    m = A.shape[1]
    lo = int(A.sum(axis=1).min())
    if (
        isinstance(n_parts, bool)
        or not isinstance(n_parts, int | np.integer)
        or not (1 <= n_parts <= lo)
    ):
        raise CodingError(f"n_parts={n_parts!r} is out of range: expected an int in [1, {lo}]")
    ell = int(n_parts)
    if ell == 1:
        return np.ones((1, m))
    if method == "ones":
        raise CodingError(f"method='ones' needs n_parts=1, got n_parts={ell}")
    gen = rng if rng is not None else np.random.default_rng(0)
    if method == "gaussian":
        return gen.standard_normal((ell, m))
    colours = colour_workers(A, gen)
    K = int(colours.max()) + 1
    subs = _colour_subsets(A, colours, ell, gen)
    F = _best_frame(ell, K, subs, gen)
    return np.ascontiguousarray(F[:, colours])


def worst_condition_number(
    A: np.ndarray,
    B: np.ndarray,
    n_parts: int,
    max_subsets: int = 20000,
    rng: np.random.Generator | None = None,
) -> float:
    """Worst 2-norm condition number of ``B[:, S]`` over all ``ell``-subsets S of chunk holders.

    Workers with identical columns of ``B`` are merged first and chunks whose holders carry the
    same multiset of columns are evaluated once, so the count ``n`` of distinct subsets is often
    small. The result is **exact** when ``n <= max_subsets``; otherwise it is the maximum over
    ``max_subsets`` subsets sampled uniformly (with replacement) and may underestimate.

    Parameters
    ----------
    A : ndarray of bool, shape (N, m)
    B : ndarray, shape (ell, m)
    n_parts : int
        ``ell``.
    max_subsets : int
    rng : numpy.random.Generator, optional
        Used only when sampling; ``None`` means ``default_rng(0)``.

    Returns
    -------
    float
        ``>= 1``; ``inf`` if some subset is singular.
    """
    B = np.asarray(B, dtype=np.float64)
    ell = int(n_parts)
    if B.shape != (ell, A.shape[1]):
        raise CodingError(f"B has shape {B.shape}: expected ({ell}, {A.shape[1]})")
    _, col_id = np.unique(B.T, axis=0, return_inverse=True)
    col_id = col_id.reshape(-1)
    groups = sorted({tuple(sorted(col_id[A[i]].tolist())) for i in range(A.shape[0])})
    groups = [g for g in groups if len(g) >= ell]
    counts = np.array([math.comb(len(g), ell) for g in groups], dtype=np.float64)
    rep = np.array([np.flatnonzero(col_id == c)[0] for c in range(col_id.max() + 1)])
    if counts.sum() <= max_subsets:
        subs = [c for g in groups for c in itertools.combinations(g, ell)]
        idx = np.array(subs, dtype=np.int64).reshape(-1, ell)
    else:
        gen = rng if rng is not None else np.random.default_rng(0)
        which = gen.choice(len(groups), size=max_subsets, p=counts / counts.sum())
        # one batched draw per group (a Python call per subset is slow at tens of thousands)
        parts = []
        for w in np.unique(which):
            g = np.asarray(groups[int(w)], dtype=np.int64)
            k = int((which == w).sum())
            parts.append(g[np.argsort(gen.random((k, g.size)), axis=1)[:, :ell]])
        idx = np.concatenate(parts, axis=0)
    if idx.shape[0] == 0:
        return 1.0
    mats = np.transpose(B[:, rep[idx]], (1, 0, 2))
    return float(subset_conditions(mats).max())


def check_conditioning(
    A: np.ndarray,
    B: np.ndarray,
    n_parts: int,
    dtype: object = np.float32,
    tol: float = 1e-3,
    on_fail: Literal["raise", "warn"] = "raise",
) -> float:
    """Predicted worst relative decode error ``cond * eps(dtype)``; act when it exceeds ``tol``.

    Returns
    -------
    float
        The predicted relative error.

    Raises
    ------
    CodingError
        If the prediction exceeds ``tol`` and ``on_fail == "raise"`` (``"warn"`` warns instead).
    """
    if on_fail not in ("raise", "warn"):
        raise CodingError(f"on_fail={on_fail!r} not in ('raise', 'warn')")
    cond = worst_condition_number(A, B, n_parts)
    dt = np.dtype(dtype)  # type: ignore[call-overload]
    pred = cond * float(np.finfo(dt).eps)
    if pred > tol:
        msg = (
            f"decoding matrix too ill-conditioned for {dt.name}: worst condition "
            f"number {cond:.3g} predicts relative error {pred:.3g} > tol={tol:g}"
        )
        if on_fail == "raise":
            raise CodingError(msg)
        warnings.warn(msg, stacklevel=2)
    return pred
