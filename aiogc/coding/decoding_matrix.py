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

from aiogc.errors import CodingError

__all__ = [
    "check_conditioning",
    "colour_workers",
    "decoding_matrix",
    "subset_conditions",
    "worst_condition_number",
]

#: Colour subsets scored per frame candidate at most (bounds the frame search cost).
MAX_FRAME_SUBSETS = 5000
#: Candidate budget of the frame search, in scored subsets (~ 0.5 s of batched SVDs).
FRAME_SEARCH_BUDGET = 400_000


def subset_conditions(mats: np.ndarray) -> np.ndarray:
    """2-norm condition numbers of square matrices: (n, l, l) -> (n,); inf where singular."""
    if mats.shape[0] == 0:
        return np.zeros(0)
    sv = np.linalg.svd(mats, compute_uv=False)
    with np.errstate(divide="ignore", invalid="ignore"):
        c = sv[:, 0] / sv[:, -1]
    return np.where(sv[:, -1] > 0, c, np.inf)


def _conflict_lists(A: np.ndarray) -> list[np.ndarray]:
    Ai = A.astype(np.int32)
    C = (Ai.T @ Ai) > 0
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


def _colour_subsets(
    A: np.ndarray, colours: np.ndarray, ell: int, rng: np.random.Generator
) -> np.ndarray:
    """Distinct sorted colour ell-subsets occurring among some chunk's holders; (n, ell)."""
    seen: set[tuple[int, ...]] = set()
    for cs in {tuple(sorted(colours[A[i]].tolist())) for i in range(A.shape[0])}:
        seen.update(itertools.combinations(cs, ell))
    subs = np.array(sorted(seen), dtype=np.int64).reshape(-1, ell)
    if subs.shape[0] > MAX_FRAME_SUBSETS:
        subs = subs[rng.choice(subs.shape[0], MAX_FRAME_SUBSETS, replace=False)]
    return subs


def _frame_score(F: np.ndarray, subs: np.ndarray) -> np.ndarray:
    return subset_conditions(np.transpose(F[:, subs], (1, 0, 2)))


def _best_frame(ell: int, K: int, subs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Best-of-T random unit-column frames, then hill climbing on the worst colour subset."""
    if ell == K:
        return np.eye(ell)
    n = max(subs.shape[0], 1)
    n_cand = int(np.clip(FRAME_SEARCH_BUDGET // (2 * n), 10, 200))
    n_climb = int(np.clip(FRAME_SEARCH_BUDGET // (2 * n), 10, 300))
    best, best_s = None, np.inf
    for _ in range(n_cand):
        F = rng.standard_normal((ell, K))
        F /= np.linalg.norm(F, axis=0)
        s = float(_frame_score(F, subs).max())
        if s < best_s:
            best, best_s = F, s
    assert best is not None
    step = 0.3
    for _ in range(n_climb):
        conds = _frame_score(best, subs)
        worst = subs[int(np.argmax(conds))]
        F = best.copy()
        c = int(rng.choice(worst))
        F[:, c] += step * rng.standard_normal(ell)
        F[:, c] /= np.linalg.norm(F[:, c])
        s = float(_frame_score(F, subs).max())
        if s < best_s:
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
        idx = np.array(
            [gen.choice(np.array(groups[w]), size=ell, replace=False) for w in which],
            dtype=np.int64,
        )
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
