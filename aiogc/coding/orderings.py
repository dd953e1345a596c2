"""Chunk processing orders and the Q_max metric.

An ordering is a list of ``m`` int64 arrays; ``orders[j]`` lists worker ``j``'s chunks in the
order it processes them (a permutation of ``flatnonzero(A[:, j])``). ``p_j(i)`` is the 1-based
position of chunk ``i`` in ``orders[j]``.

``Q_max`` is the worst-case number of chunk computations (summed over workers) after which every
chunk has been processed by at least ``n_parts`` workers, whatever the worker speeds.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

from aiogc.coding.assignments import is_regular
from aiogc.errors import CodingError

__all__ = [
    "natural_order",
    "optimal_order",
    "positions",
    "q_max",
    "q_max_bruteforce",
    "q_max_per_chunk",
    "random_order",
    "validate_orders",
]

#: Largest state space q_max_bruteforce enumerates (it materialises every state vector).
MAX_BRUTEFORCE_STATES = 2_000_000


def natural_order(A: np.ndarray) -> list[np.ndarray]:
    """Natural order: worker ``j`` processes its chunks by increasing ``(i - j) mod N``.

    For the cyclic assignment this is ``j, j+1, ..., j+delta-1 (mod m)``, which is an optimal
    order: consecutive positions never repeat a chunk, a proper edge-colouring of the
    worker-chunk graph). For a general assignment it is "index
    order, rotated to start at the worker's own index".

    Parameters
    ----------
    A : ndarray of bool, shape (N, m)

    Returns
    -------
    orders : list of m int64 arrays
    """
    N, m = A.shape
    out = []
    for j in range(m):
        chunks = np.flatnonzero(A[:, j])
        out.append(chunks[np.argsort((chunks - j) % N, kind="stable")].astype(np.int64))
    return out


def random_order(A: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Uniformly random order for every worker; list of m int64 arrays."""
    return [rng.permutation(np.flatnonzero(A[:, j])).astype(np.int64) for j in range(A.shape[1])]


def validate_orders(A: np.ndarray, orders: Sequence[object]) -> list[np.ndarray]:
    """Check that ``orders[j]`` is a permutation of worker ``j``'s chunks; return int64 arrays."""
    m = A.shape[1]
    if len(orders) != m:
        raise CodingError(f"orders has {len(orders)} entries: expected one per worker (m={m})")
    out = []
    for j, o in enumerate(orders):
        arr = np.asarray(o, dtype=np.int64).reshape(-1)
        if not np.array_equal(np.sort(arr), np.flatnonzero(A[:, j])):
            raise CodingError(
                f"orders[{j}]={arr.tolist()} is not a permutation of worker {j}'s chunks "
                f"{np.flatnonzero(A[:, j]).tolist()}"
            )
        out.append(arr)
    return out


def positions(A: np.ndarray, orders: Sequence[np.ndarray]) -> np.ndarray:
    """1-based positions ``P[i, j] = p_j(i)``; 0 where worker ``j`` does not hold chunk ``i``.

    Returns
    -------
    P : ndarray of int64, shape (N, m)
    """
    P = np.zeros(A.shape, dtype=np.int64)
    for j, o in enumerate(orders):
        P[o, j] = np.arange(1, len(o) + 1)
    return P


def _check_parts(A: np.ndarray, n_parts: int) -> int:
    lo = int(np.asarray(A).sum(axis=1).min())
    if isinstance(n_parts, bool) or not isinstance(n_parts, int | np.integer):
        raise CodingError(f"n_parts={n_parts!r} must be an integer")
    if not 1 <= n_parts <= lo:
        raise CodingError(
            f"n_parts={n_parts} is out of range: expected 1 <= n_parts <= {lo} "
            "(the smallest number of holders of a chunk)"
        )
    return int(n_parts)


def q_max_per_chunk(A: np.ndarray, orders: Sequence[np.ndarray], n_parts: int = 1) -> np.ndarray:
    """The closed-form ``M_i`` for every chunk; ``Q_max = 1 + max(M)``.

    ``M_i`` is the largest total work with chunk ``i`` still covered by fewer than ``n_parts``
    holders: every non-holder finishes, ``n_parts - 1`` holders finish, the other holders stop
    just before chunk ``i``.

    Returns
    -------
    M : ndarray of int64, shape (N,)
    """
    ell = _check_parts(A, n_parts)
    P = positions(A, orders)
    loads = A.sum(axis=0).astype(np.int64)
    held = P > 0
    base = loads.sum() - (held * loads[None, :]).sum(axis=1) + np.where(held, P - 1, 0).sum(axis=1)
    if ell == 1:
        return np.asarray(base)
    gain = np.where(held, loads[None, :] - P + 1, -1)
    gain.sort(axis=1)
    return np.asarray(base + gain[:, ::-1][:, : ell - 1].sum(axis=1))


def q_max(A: np.ndarray, orders: Sequence[np.ndarray], n_parts: int = 1) -> int:
    """Worst-case chunk computations before exact decoding is guaranteed (closed form).

    Parameters
    ----------
    A : ndarray of bool, shape (N, m)
    orders : list of m int arrays
    n_parts : int
        The communication split ``ell``; ``1 <= n_parts <= min_i gamma_i``.

    Returns
    -------
    int

    Examples
    --------
    >>> from aiogc.coding import cyclic_assignment, natural_order
    >>> A = cyclic_assignment(5, 3)
    >>> [q_max(A, natural_order(A), l) for l in (1, 2, 3)]
    [10, 13, 15]
    """
    return int(1 + q_max_per_chunk(A, orders, n_parts).max())


def q_max_bruteforce(A: np.ndarray, orders: Sequence[np.ndarray], n_parts: int = 1) -> int:
    """Exhaustive ``Q_max`` over every state ``0 <= c_j <= delta_j`` (small cases only).

    Raises
    ------
    CodingError
        When the state space exceeds ``MAX_BRUTEFORCE_STATES``.
    """
    ell = _check_parts(A, n_parts)
    loads = A.sum(axis=0).astype(np.int64)
    n_states = int(np.prod(loads + 1, dtype=np.float64))
    if n_states > MAX_BRUTEFORCE_STATES:
        raise CodingError(f"{n_states} states exceed MAX_BRUTEFORCE_STATES={MAX_BRUTEFORCE_STATES}")
    P = positions(A, orders)
    ii, jj = np.nonzero(P)
    pos = P[ii, jj]
    states = np.array(list(itertools.product(*(range(int(d) + 1) for d in loads))), dtype=np.int64)
    covered = pos[None, :] <= states[:, jj]
    cov = np.zeros((states.shape[0], A.shape[0]), dtype=np.int64)
    for e in range(ii.size):
        cov[:, ii[e]] += covered[:, e]
    bad = cov.min(axis=1) < ell
    return int(1 + states[bad].sum(axis=1).max()) if bad.any() else 0


def _is_colouring(A: np.ndarray, orders: Sequence[np.ndarray]) -> bool:
    """True iff every chunk occupies each position 1..gamma_i exactly once across holders."""
    P = positions(A, orders)
    reps = A.sum(axis=1)
    srt = np.sort(np.where(P > 0, P, np.iinfo(np.int64).max), axis=1)
    for i in range(A.shape[0]):
        if not np.array_equal(srt[i, : reps[i]], np.arange(1, reps[i] + 1)):
            return False
    return True


def _colouring_order(A: np.ndarray, rng: np.random.Generator | None) -> list[np.ndarray]:
    """Orders from a proper edge colouring of a delta-regular bipartite graph (N == m).

    Peels delta successive perfect matchings (each exists by Hall/Konig); matching ``k`` gives
    every worker its chunk at position ``k + 1``.
    """
    N, m = A.shape
    delta = int(A[:, 0].sum())
    rp = rng.permutation(m) if rng is not None else np.arange(m)
    cp = rng.permutation(N) if rng is not None else np.arange(N)
    R = A.T[rp][:, cp].copy()  # workers x chunks, relabelled
    orders = np.zeros((m, delta), dtype=np.int64)
    for k in range(delta):
        match = maximum_bipartite_matching(csr_matrix(R.astype(np.int8)), perm_type="column")
        if (match < 0).any():  # cannot happen for a regular bipartite graph
            raise CodingError("no perfect matching found: assignment is not delta-regular")
        orders[rp, k] = cp[match]
        R[np.arange(m), match] = False
    return [orders[j] for j in range(m)]


def _local_search(
    A: np.ndarray, start: list[np.ndarray], n_parts: int, rng: np.random.Generator, max_iters: int
) -> list[np.ndarray]:
    """First-improvement local search on (Q_max, #chunks attaining it) by position swaps."""

    def key(o: list[np.ndarray]) -> tuple[int, int]:
        M = q_max_per_chunk(A, o, n_parts)
        top = int(M.max())
        return top, int(np.count_nonzero(np.equal(M, top)))

    best = [o.copy() for o in start]
    best_key = key(best)
    movable = [j for j in range(A.shape[1]) if best[j].size > 1]
    if not movable:
        return best
    stale = 0
    for _ in range(max_iters):
        j = movable[int(rng.integers(len(movable)))]
        a, b = rng.choice(best[j].size, size=2, replace=False)
        cand = list(best)
        cand[j] = best[j].copy()
        cand[j][[a, b]] = cand[j][[b, a]]
        k = key(cand)
        if k < best_key:
            best, best_key, stale = cand, k, 0
        else:
            stale += 1
            if stale > 20 * len(movable):
                break
    return best


def optimal_order(
    A: np.ndarray,
    n_parts: int = 1,
    rng: np.random.Generator | None = None,
    *,
    max_iters: int = 2000,
) -> list[np.ndarray]:
    """An order minimising (or, outside the regular class, heuristically lowering) ``Q_max``.

    * ``delta``-regular with ``N == m``: the natural order if it already is a proper edge
      colouring (cyclic), otherwise a colouring from ``delta`` successive perfect matchings
      (``scipy.sparse.csgraph.maximum_bipartite_matching``); position = colour. Optimal for
      every ``n_parts``: a proper colouring puts every chunk at distinct positions across
      its holders, which is what minimises the worst-case work before coverage.
    * Otherwise: first-improvement local search on ``(Q_max, #argmax chunks)`` by swapping two
      positions of one worker, from the natural order; never worse than natural.

    Parameters
    ----------
    A : ndarray of bool, shape (N, m)
    n_parts : int
        ``ell``; only used by the local search.
    rng : numpy.random.Generator, optional
        Randomises matchings / moves; ``None`` means ``default_rng(0)`` for the local search and
        unpermuted matchings.
    max_iters : int
        Local-search move budget.

    Returns
    -------
    orders : list of m int64 arrays
    """
    nat = natural_order(A)
    if is_regular(A):
        if _is_colouring(A, nat):
            return nat
        return _colouring_order(A, rng)
    _check_parts(A, n_parts)
    gen = rng if rng is not None else np.random.default_rng(0)
    return _local_search(A, nat, n_parts, gen, max_iters)

