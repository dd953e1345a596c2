"""The leave-one-out redundancy checks of liar location, one factorisation each.

:func:`aiogc.coding.consistency.redundancy_check` of a received set ``S`` decodes from
``S`` without its largest id and from ``S`` without its smallest, through the scheme's own
decoder: per decode, the decoding coefficients are solved (a least-squares solve and an SVD for
the amplification), then solved again to decode the payloads (decoding the identity would have
given them), and the system's condition number is a third SVD. Location runs that check for
every received worker left out (about ``m`` checks, ``2 m`` decodes): 131-300 ms a located round
at m=64 (``bench/bench_locate.py``).

For a fixed code (a scheme with an :meth:`~aiogc.coding.base.Scheme.encoding_tensor`) this
module does the same check with **one SVD per decoded subset** and reuses it three times: the
minimum-norm exact decoding coefficients (``lstsq``'s solution, from the same singular vectors),
the exactness residual, and the condition number; the payload norms are computed once for all
subsets, and a subset shared by two leave-one-out sets is factorised once. The decoder is the
minimum-norm one rather than the construction's (fractional repetition decodes from one worker
per group): any exact decoder gives the same decode of honest vectors, and the check only needs
two exact decodes that read a lying vector differently. Tolerance and scale are exactly
:func:`~aiogc.coding.consistency.redundancy_check`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from aiogc.coding.base import Scheme
from aiogc.coding.consistency import REDUNDANCY_SAFETY, redundancy_tolerance

__all__ = ["leave_one_out_values"]

#: relative residual below which a least-squares decode is exact (the original scheme's value)
_EXACT_RTOL = 1e-9
#: singular values below this fraction of the largest are the code's structural rank deficit
_RANK_RTOL = 1e-10

_Decoder = tuple[np.ndarray, bool, float]


def _decoder(M: np.ndarray, T: np.ndarray) -> _Decoder:
    """Minimum-norm ``D`` (ell, r) solving ``D M = T^T``, exactness, and ``cond(M)``.

    Parameters
    ----------
    M : ndarray, shape (r, N * ell)
        The encoding rows of the decoding subset.
    T : ndarray, shape (N * ell, ell)
        ``T[u::ell, u] = 1``: decode the sum of every chunk's part ``u``.
    """
    U, sv, Vt = np.linalg.svd(M, full_matrices=False)
    if sv.size == 0 or sv[0] == 0:
        return np.zeros((T.shape[1], M.shape[0])), False, 1.0
    # numpy's lstsq(M.T, T) cut-off: rcond = eps * max(M.shape)
    keep = sv > sv[0] * np.finfo(np.float64).eps * max(M.shape)
    a = U[:, keep] @ ((Vt[keep] @ T) / sv[keep, None])  # (r, ell) = pinv(M.T) @ T
    res = float(np.sqrt(np.sum((M.T @ a - T) ** 2) / T.shape[0]))
    nz = sv[sv > sv[0] * _RANK_RTOL]
    return a.T, res < _EXACT_RTOL, float(nz[0] / nz[-1])


def leave_one_out_values(scheme: Scheme, rows: np.ndarray, received: Sequence[int], dim: int,
                         *, eps: float | None = None) -> list[float] | None:
    """The redundancy check's relative discrepancy with each received worker left out.

    Parameters
    ----------
    scheme : Scheme
        A send-when-done scheme with a fixed code (``encoding_tensor()`` not None).
    rows : ndarray, shape (m, p)
        The payloads (rows of workers not received are not read); its dtype sets the
        tolerance (float64 rows with ``eps``: a compressed upload widened).
    received : sequence of int
        Sorted ids of the workers whose vectors arrived (at least 4).
    dim : int
    eps : float, optional
        As :func:`~aiogc.coding.consistency.redundancy_check`'s.

    Returns
    -------
    list of float or None
        Entry ``i``: ``||g1 - g2|| / scale`` of the set without ``received[i]``, ``inf`` when
        it fails the tolerance or is not finite. None when some set has no decodable spare
        (nothing can be located) or the scheme has no encoding tensor.
    """
    E = scheme.encoding_tensor()
    if E is None:
        return None
    ell, m = int(scheme.n_parts), int(scheme.m)
    E2 = np.asarray(E, dtype=np.float64).reshape(m, -1)
    T = np.zeros((E2.shape[1], ell))
    for u in range(ell):
        T[u::ell, u] = 1.0
    loads = np.asarray(scheme.loads, dtype=np.int64)
    V = np.asarray(rows, dtype=np.float64)
    rec = [int(w) for w in received]
    with np.errstate(over="ignore", invalid="ignore"):  # a blown-up vector: inf
        norms = {w: float(np.linalg.norm(V[w])) for w in rec}
    cache: dict[tuple[int, ...], _Decoder | None] = {}

    def decoder(F: tuple[int, ...]) -> _Decoder | None:
        if F not in cache:
            st = np.zeros(m, dtype=np.int64)
            st[list(F)] = loads[list(F)]
            cache[F] = _decoder(E2[list(F)], T) if scheme.is_decodable(st) else None
        return cache[F]

    out = []
    for j in rec:
        S = [w for w in rec if w != j]
        F1, F2 = tuple(S[:-1]), tuple(S[1:])
        d1, d2 = decoder(F1), decoder(F2)
        if d1 is None or d2 is None or not (d1[1] and d2[1]):
            return None
        out.append(_value(V, S, (F1, d1), (F2, d2), norms, dim,
                          redundancy_tolerance(rows.dtype, max(d1[2], d2[2]),
                                               REDUNDANCY_SAFETY, eps)))
    return out


def _value(V: np.ndarray, S: list[int], one: tuple[tuple[int, ...], _Decoder],
           two: tuple[tuple[int, ...], _Decoder], norms: dict[int, float], dim: int,
           tol: float) -> float:
    """``||g1 - g2|| / scale`` of one leave-one-out set ``S`` (inf beyond ``tol``)."""
    (F1, (D1, _, _)), (F2, (D2, _, _)) = one, two
    # scale: sum_j max_u (|D1[u, j]| + |D2[u, j]|) ||v_j||, as redundancy_check's
    A = np.zeros((D1.shape[0], V.shape[0]))
    A[:, list(F1)] = np.abs(D1)
    A[:, list(F2)] += np.abs(D2)
    weight = A.max(axis=0)
    with np.errstate(over="ignore", invalid="ignore"):  # inf - inf: not finite below
        g1 = (D1 @ V[list(F1)]).reshape(-1)[:dim]
        g2 = (D2 @ V[list(F2)]).reshape(-1)[:dim]
        diff = float(np.linalg.norm(g1 - g2))
        scale = sum(float(weight[w]) * norms[w] for w in S)
    if not (math.isfinite(diff) and math.isfinite(scale)):
        return math.inf
    rel = diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)
    return rel if rel <= tol else math.inf
