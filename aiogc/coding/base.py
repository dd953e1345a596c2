"""Common scheme interface: :class:`Scheme`, :class:`DecodeResult` and shared numerics.

Every scheme exposes the same calls so the protocol core stays scheme-agnostic. A *state*
``c`` is an ``(m,)`` int vector, ``0 <= c[j] <= loads[j]``: worker ``j`` has finished the first
``c[j]`` chunks of ``orders[j]``. Payloads have length ``payload_len(d) = ceil(d / ell)``; a
gradient whose length is not a multiple of ``ell`` is zero-padded to ``ell * payload_len(d)``
and decode returns its first ``d`` entries.

Decode performance contract: a pre-stacked ``(m, payload_len)`` array is combined with one BLAS
product per contiguous run of contributing rows, never copied or stacked; rows of
non-contributing workers are never read (they may hold garbage).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from aiogc.errors import CodingError

__all__ = ["DecodeResult", "Scheme", "combine", "encode_rows", "runs"]


@dataclass(frozen=True)
class DecodeResult:
    """What a decode produced.

    Attributes
    ----------
    gradient : ndarray, shape (d,)
        The estimate of ``sum_i g_i`` (dtype of the payloads).
    exact : bool
        True iff the recovery is algebraically exact.
    residual : float
        Square root of the expected relative MSE under i.i.d. isotropic chunk gradients
        (``0.0`` when exact); see each scheme for its formula.
    amplification : float
        Numerical error amplification: ``error_estimate ~ amplification * eps(payload dtype)``.
    n_contributions : int
        Number of coded vectors used.
    """

    gradient: np.ndarray
    exact: bool
    residual: float
    amplification: float
    n_contributions: int


@runtime_checkable
class Scheme(Protocol):
    """The interface the protocol core uses (and nothing else)."""

    name: str
    A: np.ndarray
    m: int
    n_chunks: int
    n_parts: int
    orders: list[np.ndarray]
    loads: np.ndarray
    sends_when_done: bool

    def coverage(self, state: object) -> np.ndarray: ...
    def is_decodable(self, state: object) -> bool: ...
    def contributes(self, worker: int, state: object) -> bool: ...
    def payload_len(self, dim: int) -> int: ...
    def encode(self, worker: int, state: object, chunk_grads: np.ndarray) -> np.ndarray: ...
    def decode(
        self, coded: Mapping[int, np.ndarray] | np.ndarray, state: object, dim: int
    ) -> np.ndarray: ...
    def decode_result(
        self, coded: Mapping[int, np.ndarray] | np.ndarray, state: object, dim: int
    ) -> DecodeResult: ...
    def q_max(self) -> int: ...


def _float_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype == np.float32 else np.dtype(np.float64)


def encode_rows(theta: np.ndarray, chunk_grads: np.ndarray, n_parts: int) -> np.ndarray:
    """``v = sum_c sum_k theta[c, k] * g_c^(k)`` over the first ``len(theta)`` rows.

    Parameters
    ----------
    theta : ndarray, shape (c, ell)
    chunk_grads : ndarray, shape (>= c, d)
        Only rows ``0 .. c-1`` are read.
    n_parts : int
        ``ell``.

    Returns
    -------
    v : ndarray, shape (ceil(d / ell),), float32 if ``chunk_grads`` is float32 else float64
    """
    X = np.asarray(chunk_grads)
    c = theta.shape[0]
    if X.ndim != 2 or X.shape[0] < c:
        raise CodingError(
            f"chunk_grads has shape {X.shape}: expected 2-D with at least {c} rows (one per "
            "processed chunk, in processing order)"
        )
    dt = _float_dtype(X.dtype)
    d = X.shape[1]
    p = -(-d // n_parts)
    Xc = X[:c]
    if Xc.dtype != dt:
        Xc = Xc.astype(dt)
    th = theta.astype(dt)
    v = np.zeros(p, dtype=dt)
    if c == 0:
        return v
    if d == p * n_parts and Xc.flags.c_contiguous:
        return th.reshape(-1) @ Xc.reshape(c * n_parts, p)
    for k in range(n_parts):
        lo, hi = k * p, min((k + 1) * p, d)
        if hi > lo:
            v[: hi - lo] += th[:, k] @ Xc[:, lo:hi]
    return v


def runs(idx: np.ndarray) -> list[tuple[int, int]]:
    """Contiguous runs ``[(start, stop), ...]`` of a sorted index array."""
    if idx.size == 0:
        return []
    cut = np.flatnonzero(np.diff(idx) != 1) + 1
    starts = np.concatenate(([0], cut))
    stops = np.concatenate((cut, [idx.size]))
    return [(int(idx[a]), int(idx[b - 1]) + 1) for a, b in zip(starts, stops, strict=True)]


def combine(
    D: np.ndarray, rows: np.ndarray, coded: Mapping[int, np.ndarray] | np.ndarray, dim: int
) -> np.ndarray:
    """``g = (D[:, rows] @ V[rows]).reshape(-1)[:dim]`` without copying the payloads.

    Parameters
    ----------
    D : ndarray, shape (ell, m)
        Decoding coefficients; only columns in ``rows`` are used.
    rows : ndarray of int, sorted, shape (r,)
        Contributing workers.
    coded : Mapping[int, ndarray (p,)] or ndarray (m, p)
        Payloads; rows/keys of other workers are ignored.
    dim : int
        Gradient length ``d``; ``p`` must equal ``ceil(d / ell)``.

    Returns
    -------
    g : ndarray, shape (dim,)
    """
    ell, m = D.shape
    p = -(-dim // ell)
    if isinstance(coded, np.ndarray):
        if coded.ndim != 2 or coded.shape != (m, p):
            raise CodingError(f"coded has shape {coded.shape}: expected ({m}, {p})")
        dt = _float_dtype(coded.dtype)
        if coded.dtype != dt:
            raise CodingError(f"coded dtype {coded.dtype} not in (float32, float64)")
        Dc = D.astype(dt)
        rr = runs(rows)
        if not rr:
            return np.zeros(dim, dtype=dt)
        a, b = rr[0]
        out = Dc[:, a:b] @ coded[a:b]
        if len(rr) > 1:
            tmp = np.empty_like(out)
            for a, b in rr[1:]:
                np.matmul(Dc[:, a:b], coded[a:b], out=tmp)
                out += tmp
        return out.reshape(-1)[:dim]
    out_m: np.ndarray | None = None
    for j in rows.tolist():
        if j not in coded:
            raise CodingError(f"no coded vector from worker {j}, which contributes in this state")
        v = np.asarray(coded[j])
        if v.shape != (p,):
            raise CodingError(f"coded[{j}] has shape {v.shape}: expected ({p},)")
        if out_m is None:
            out_m = np.zeros((ell, p), dtype=_float_dtype(v.dtype))
        out_m += D[:, j : j + 1].astype(out_m.dtype) * v[None, :]
    if out_m is None:
        dt = np.dtype(np.float64)
        for v in coded.values():
            dt = _float_dtype(np.asarray(v).dtype)
            break
        return np.zeros(dim, dtype=dt)
    return out_m.reshape(-1)[:dim]


class SchemeBase:
    """Shared state handling; subclasses set ``name``, ``sends_when_done`` and the numerics."""

    name: str = ""
    sends_when_done: bool = True

    def __init__(self, A: np.ndarray, n_parts: int, orders: list[np.ndarray]) -> None:
        self.A = A
        self.n_chunks, self.m = (int(x) for x in A.shape)
        self.n_parts = int(n_parts)
        self.orders = orders
        self.loads = A.sum(axis=0).astype(np.int64)
        e_w = np.concatenate([np.full(len(o), j, dtype=np.int64) for j, o in enumerate(orders)])
        e_c = np.concatenate([np.asarray(o, dtype=np.int64) for o in orders])
        e_p = np.concatenate([np.arange(1, len(o) + 1, dtype=np.int64) for o in orders])
        self._e_worker, self._e_chunk, self._e_pos = e_w, e_c, e_p

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(m={self.m}, n_chunks={self.n_chunks}, n_parts={self.n_parts})"
        )

    def check_state(self, state: object) -> np.ndarray:
        """Validate a state vector; returns it as an ``(m,)`` int64 array."""
        c = np.asarray(state)
        if c.shape != (self.m,):
            raise CodingError(f"state has shape {c.shape}: expected ({self.m},)")
        if c.dtype.kind not in "iuf" or (
            c.dtype.kind == "f" and not np.array_equal(c, np.round(c))
        ):
            raise CodingError(f"state dtype {c.dtype} is not an integer type")
        c = c.astype(np.int64, copy=False)
        bad = (c < 0) | (c > self.loads)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise CodingError(
                f"state[{j}]={int(c[j])} is out of range: expected 0..{self.loads[j]}"
            )
        return c

    def _check_worker(self, worker: int) -> int:
        if isinstance(worker, bool) or not isinstance(worker, int | np.integer):
            raise CodingError(f"worker={worker!r} must be an integer")
        if not 0 <= worker < self.m:
            raise CodingError(f"worker={worker} is out of range: expected 0..{self.m - 1}")
        return int(worker)

    def _check_dim(self, dim: int) -> int:
        if isinstance(dim, bool) or not isinstance(dim, int | np.integer) or dim < 1:
            raise CodingError(f"dim={dim!r} must be a positive integer")
        return int(dim)

    def coverage(self, state: object) -> np.ndarray:
        """``|U_i(c)|`` for every chunk: ndarray of int64, shape (N,)."""
        c = self.check_state(state)
        cov = self._e_pos <= c[self._e_worker]
        return np.bincount(self._e_chunk[cov], minlength=self.n_chunks)

    def payload_len(self, dim: int) -> int:
        """``ceil(dim / n_parts)``."""
        return -(-self._check_dim(dim) // self.n_parts)

    def decode(
        self, coded: Mapping[int, np.ndarray] | np.ndarray, state: object, dim: int
    ) -> np.ndarray:
        """``decode_result(coded, state, dim).gradient``; shape (dim,)."""
        return self.decode_result(coded, state, dim).gradient  # type: ignore[attr-defined]

    def _finished_count_rule(self, state: object, need: int) -> bool:
        c = self.check_state(state)
        return int((c == self.loads).sum()) >= need

    def finished_count_needed(self) -> int | None:
        """Fast-path hint for internal callers that track finished workers themselves.

        Returns k when ``is_decodable(state)`` is exactly "at least k workers have
        ``state[j] == loads[j]``" (the schemes whose rule is ``_finished_count_rule`` with their
        ``_need()``), else None (ask :meth:`is_decodable`).
        """
        need = getattr(self, "_need", None)
        return int(need()) if callable(need) else None
