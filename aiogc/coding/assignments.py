"""Data assignments: which worker holds which chunk.

An assignment is a boolean matrix ``A`` of shape ``(N, m)``: ``A[i, j]`` is True iff worker ``j``
holds chunk ``i``. Invariants of every array returned here: dtype ``bool``, 2-D, every chunk held
by at least one worker. A worker with no chunk is allowed (it never contributes) but warned about.
"""

from __future__ import annotations

import warnings

import numpy as np

from aiogc.errors import CodingError

__all__ = [
    "assignment_from_matrix",
    "cyclic_assignment",
    "fractional_repetition_assignment",
    "is_cyclic",
    "is_fractional_repetition",
    "is_regular",
    "regular_assignment",
    "validate_assignment",
]


def _check_int(name: str, value: object, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise CodingError(f"{name}={value!r} must be an integer")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        allowed = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise CodingError(f"{name}={v} is out of range: expected {allowed}")
    return v


def cyclic_assignment(m: int, delta: int) -> np.ndarray:
    """Cyclic assignment: worker ``j`` holds chunks ``j, j+1, ..., j+delta-1 (mod m)``.

    Parameters
    ----------
    m : int
        Number of workers (= number of chunks), ``m >= 1``.
    delta : int
        Load of every worker and replication of every chunk, ``1 <= delta <= m``.

    Returns
    -------
    A : ndarray of bool, shape (m, m)

    Examples
    --------
    >>> cyclic_assignment(4, 2).astype(int)
    array([[1, 0, 0, 1],
           [1, 1, 0, 0],
           [0, 1, 1, 0],
           [0, 0, 1, 1]])
    """
    m = _check_int("m", m, 1)
    delta = _check_int("delta", delta, 1, m)
    A = np.zeros((m, m), dtype=bool)
    j = np.arange(m)
    for k in range(delta):
        A[(j + k) % m, j] = True
    return A


def fractional_repetition_assignment(m: int, s: int) -> np.ndarray:
    """Fractional repetition (Tandon et al. 2017): groups of ``s+1`` workers share ``s+1`` chunks.

    Group ``g`` is workers ``g(s+1) .. g(s+1)+s``; all of them hold chunks ``g(s+1) .. g(s+1)+s``.

    Parameters
    ----------
    m : int
        Number of workers (= chunks); must be divisible by ``s + 1``.
    s : int
        Number of stragglers tolerated, ``0 <= s <= m - 1``.

    Returns
    -------
    A : ndarray of bool, shape (m, m)
        Block diagonal with ``m / (s+1)`` all-ones blocks of size ``s+1``.
    """
    m = _check_int("m", m, 1)
    s = _check_int("s", s, 0, m - 1)
    if m % (s + 1):
        raise CodingError(
            f"fractional repetition needs (s+1) | m: s+1={s + 1} does not divide m={m}"
        )
    g = np.arange(m) // (s + 1)
    return np.asarray(g[:, None] == g[None, :])


def regular_assignment(m: int, delta: int, rng: np.random.Generator) -> np.ndarray:
    """Random ``delta``-regular bipartite assignment with ``N = m``.

    Every worker holds ``delta`` chunks and every chunk has ``delta`` holders. Built from the
    cyclic assignment by many random degree-preserving double-edge swaps (a Markov chain on
    simple regular bipartite graphs) followed by random row and column permutations, so it works
    for every ``1 <= delta <= m`` (rejection sampling of permutation unions does not).

    Parameters
    ----------
    m, delta : int
        ``1 <= delta <= m``.
    rng : numpy.random.Generator
        Source of randomness (the result is a deterministic function of its state).

    Returns
    -------
    A : ndarray of bool, shape (m, m)
    """
    A = cyclic_assignment(m, delta)
    rows, cols = np.nonzero(A)
    n_edges = rows.size
    if 0 < delta < m:
        n_swaps = 10 * n_edges
        picks = rng.integers(0, n_edges, size=(n_swaps, 2))
        for a, b in picks:
            i1, j1, i2, j2 = rows[a], cols[a], rows[b], cols[b]
            if i1 == i2 or j1 == j2 or A[i1, j2] or A[i2, j1]:
                continue
            A[i1, j1] = A[i2, j2] = False
            A[i1, j2] = A[i2, j1] = True
            cols[a], cols[b] = j2, j1
    A = A[rng.permutation(m)][:, rng.permutation(m)]
    return np.ascontiguousarray(A)


def validate_assignment(A: object) -> np.ndarray:
    """Validate an assignment matrix and return it as a bool array.

    Parameters
    ----------
    A : array_like, shape (N, m)
        Entries 0/1 (ints, floats equal to 0 or 1, or bools).

    Returns
    -------
    A : ndarray of bool, shape (N, m)

    Raises
    ------
    CodingError
        Wrong ndim, empty, non-binary entries, or a chunk held by no worker.

    Warns
    -----
    UserWarning
        When a worker holds no chunk (it can never contribute).
    """
    arr = np.asarray(A)
    if arr.ndim != 2:
        raise CodingError(f"assignment must be 2-D (N chunks x m workers), got ndim={arr.ndim}")
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise CodingError(f"assignment shape {arr.shape} is empty: expected N >= 1 and m >= 1")
    if arr.dtype != bool:
        if not np.issubdtype(arr.dtype, np.number):
            raise CodingError(f"assignment dtype {arr.dtype} is not numeric or bool")
        bad = ~np.isin(arr, (0, 1))
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise CodingError(f"assignment entry A[{i},{j}]={arr[i, j]!r} is not 0 or 1")
        arr = arr != 0
    holders = arr.sum(axis=1)
    if (holders == 0).any():
        i = int(np.flatnonzero(holders == 0)[0])
        raise CodingError(f"chunk {i} is held by no worker: every chunk needs >= 1 holder")
    loads = arr.sum(axis=0)
    if (loads == 0).any():
        idle = np.flatnonzero(loads == 0).tolist()
        warnings.warn(f"workers {idle} hold no chunk and will never contribute", stacklevel=2)
    return np.ascontiguousarray(arr)


def assignment_from_matrix(M: object) -> np.ndarray:
    """Validate a user-given 0/1 matrix (see :func:`validate_assignment`); shape (N, m) bool."""
    return validate_assignment(M)


def is_regular(A: np.ndarray) -> bool:
    """True iff ``N == m`` and every worker load and chunk replication equal the same delta."""
    N, m = A.shape
    if m != N:
        return False
    loads = A.sum(axis=0)
    reps = A.sum(axis=1)
    return bool((loads == loads[0]).all() and (reps == loads[0]).all())


def is_cyclic(A: np.ndarray) -> int | None:
    """Return delta if ``A`` equals :func:`cyclic_assignment` ``(m, delta)``, else None."""
    N, m = A.shape
    if m != N:
        return None
    delta = int(A[:, 0].sum())
    if delta < 1 or not np.array_equal(A, cyclic_assignment(m, delta)):
        return None
    return delta


def is_fractional_repetition(A: np.ndarray) -> int | None:
    """Return the group size if workers split into groups with identical, disjoint chunk sets.

    Returns None unless every group of workers sharing a chunk set has the same size ``g`` and
    the chunk sets of different groups are disjoint.
    """
    cols: dict[bytes, list[int]] = {}
    for j in range(A.shape[1]):
        cols.setdefault(A[:, j].tobytes(), []).append(j)
    sizes = {len(v) for v in cols.values()}
    if len(sizes) != 1:
        return None
    supports = np.array([A[:, v[0]] for v in cols.values()])
    if (supports.sum(axis=0) != 1).any():
        return None
    return sizes.pop()
