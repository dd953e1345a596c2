"""Arithmetic that gives the same bits on every IEEE-754 machine.

The PS and every worker build the scheme from the seed on their own machines and compare a
digest of it (:func:`aiogc.config.scheme_digest`), so every float the digest covers must be
computed identically on a CPU with other BLAS / LAPACK kernels (FMA or not, another blocking):
LAPACK's ``gesv`` and BLAS dot products are not. The routines here use only numpy's elementwise
ufuncs (one correctly rounded operation per element, no contraction across ufuncs) and exact
comparisons, so their results depend on the inputs alone.
"""

from __future__ import annotations

import numpy as np

__all__ = ["column_norms", "poly", "solve"]


def solve(M: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Solve ``M x = b`` for a batch of small square systems, bit-identically everywhere.

    Gaussian elimination with partial pivoting (the first row of largest magnitude), then back
    substitution, written with elementwise operations only.

    Parameters
    ----------
    M : ndarray of float64, shape (n, k, k)
        Nonsingular matrices.
    b : ndarray of float64, shape (n, k)
        Right-hand sides.

    Returns
    -------
    x : ndarray of float64, shape (n, k)

    Raises
    ------
    numpy.linalg.LinAlgError
        If a matrix is singular (a zero pivot).

    Examples
    --------
    >>> solve(np.array([[[2.0, 0.0], [0.0, 4.0]]]), np.array([[1.0, 1.0]]))
    array([[0.5 , 0.25]])
    """
    A = np.array(M, dtype=np.float64)  # a copy: eliminated in place
    x = np.array(b, dtype=np.float64)
    n, k = x.shape
    if A.shape != (n, k, k):
        raise ValueError(f"M has shape {A.shape}, expected ({n}, {k}, {k})")
    rows = np.arange(n)
    for c in range(k):
        p = c + np.argmax(np.abs(A[:, c:, c]), axis=1)  # exact comparisons: the same pivot
        if not np.all(A[rows, p, c]):
            raise np.linalg.LinAlgError("singular matrix")
        A[rows, c], A[rows, p] = A[rows, p].copy(), A[rows, c].copy()
        x[rows, c], x[rows, p] = x[rows, p].copy(), x[rows, c].copy()
        f = A[:, c + 1:, c] / A[:, c:c + 1, c]  # (n, k-c-1)
        A[:, c + 1:, c:] -= f[:, :, None] * A[:, None, c, c:]
        x[:, c + 1:] -= f * x[:, c:c + 1]
    for c in range(k - 1, -1, -1):
        # the row's known terms subtracted one at a time, in a fixed order (no reduction)
        acc = x[:, c].copy()
        for t in range(c + 1, k):
            acc -= A[:, c, t] * x[:, t]
        x[:, c] = acc / A[:, c, c]
    return x


def column_norms(F: np.ndarray) -> np.ndarray:
    """2-norms of the columns of ``F`` (r, K) -> (K,), summed row by row in a fixed order."""
    acc = np.zeros(F.shape[1])
    for row in F:
        acc += row * row
    return np.asarray(np.sqrt(acc))


def poly(roots: np.ndarray) -> np.ndarray:
    """Coefficients of ``prod_r (x - r)``, highest power first: (n,) -> (n+1,), as
    ``numpy.poly`` (whose convolution may use BLAS) but one root at a time, elementwise."""
    z = np.ones(1)
    for r in np.asarray(roots, dtype=np.float64):
        z = np.concatenate([z, [0.0]]) - r * np.concatenate([[0.0], z])
    return z
