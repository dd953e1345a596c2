"""The partial-straggler gradient coding scheme (Ramamoorthy, Meng and Girimaji, NeurIPS 2024).

Given the broadcast state ``c``, chunk ``i`` is covered by ``U_i(c)``; its coefficient matrix is
``Theta_i = pinv(B_U)`` (|U| x ell), the min-norm least-squares solution of ``B_U Theta = I``.
Worker ``j`` sends ``v_j = sum_i sum_k Theta_i[j, k] g_i^(k)`` over its first ``c_j`` chunks and
the PS computes ``g^(k) = sum_j B[k, j] v_j``. Chunk ``i`` enters through the projector
``B_U pinv(B_U)``: the identity iff ``rank(B_U) = ell`` (exact), a projection otherwise.

Determinism: every holder of chunk ``i`` builds the *same* padded matrix (holders sorted by
index, uncovered holders zeroed, padded to the global maximum replication) and factorises it with
the same code path, so all holders derive bit-identical ``Theta_i`` independently.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from aiogc.coding.assignments import validate_assignment
from aiogc.coding.base import (
    DecodeResult,
    SchemeBase,
    TrustedDecoder,
    TrustedEncoder,
    combine,
    encode_rows,
    used_columns,
)
from aiogc.coding.decoding_matrix import decoding_matrix, worst_condition_number
from aiogc.coding.ordering_registry import build_orders, ordering_names
from aiogc.coding.orderings import optimal_order, q_max, validate_orders
from aiogc.coding.registry import (
    ASSIGNMENTS,
    DECODINGS,
    SchemeParams,
    SchemeSpec,
    build_assignment,
    register_scheme,
)
from aiogc.errors import CodingError

__all__ = ["CoverageTracker", "PartialScheme"]

_F8 = np.dtype(np.float64)

#: Relative singular-value / R-diagonal threshold below which B_U counts as rank deficient.
RANK_RTOL = 1e-12


class CoverageTracker:
    """Incremental exact trigger of the partial scheme (a :class:`ProgressTracker`).

    ``cov[i]`` counts the holders of chunk ``i`` whose reported count covers it; ``deficit``
    the chunks with ``cov < ell``, so the state is decodable iff ``deficit == 0``. Each update
    costs O(chunks moved), against O(N * gamma) for :meth:`PartialScheme.is_decodable`.
    """

    __slots__ = ("_ell", "_orders", "cov", "deficit")

    def __init__(self, orders: list[list[int]], n_chunks: int, ell: int) -> None:
        self._orders = orders
        self._ell = ell
        self.cov = [0] * n_chunks
        self.deficit = n_chunks

    def add(self, worker: int, old: int, new: int) -> None:
        cov, ell = self.cov, self._ell
        # the deficit is counted locally and stored once: one attribute write per report
        deficit = self.deficit
        for i in self._orders[worker][old:new]:
            c = cov[i] + 1
            cov[i] = c
            if c == ell:
                deficit -= 1
        self.deficit = deficit

    def remove(self, worker: int, old: int) -> None:
        cov, ell = self.cov, self._ell
        for i in self._orders[worker][:old]:
            if cov[i] == ell:
                self.deficit += 1
            cov[i] -= 1


class PartialScheme(SchemeBase):
    """Partial-straggler scheme: workers send ``ceil(d/ell)`` vectors on the PS's signal.

    Parameters
    ----------
    A : array_like, shape (N, m)
        Assignment.
    n_parts : int
        ``ell``, ``1 <= ell <= min_i gamma_i``.
    orders : list of m int arrays, optional
        Processing orders; ``None`` means :func:`optimal_order` ``(A, n_parts, rng)``.
    B : ndarray, shape (ell, m), optional
        Decoding matrix; ``None`` means :func:`decoding_matrix` ``(A, n_parts, "frame", rng)``.
    rng : numpy.random.Generator, optional
        ``None`` means ``default_rng(0)``.

    Examples
    --------
    >>> import numpy as np
    >>> from aiogc.coding import cyclic_assignment
    >>> s = PartialScheme(cyclic_assignment(4, 2))
    >>> state = np.array([1, 1, 1, 1])
    >>> s.is_decodable(state)
    True
    >>> g = np.arange(8.0).reshape(4, 2)       # 4 chunk gradients, d = 2
    >>> coded = {j: s.encode(j, state, g[s.orders[j]]) for j in range(4)}
    >>> s.decode(coded, state, 2)
    array([12., 16.])
    """

    name = "partial"
    sends_when_done = False

    def __init__(
        self,
        A: object,
        n_parts: int = 1,
        orders: Sequence[object] | None = None,
        B: np.ndarray | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        Av = validate_assignment(A)
        gen = rng if rng is not None else np.random.default_rng(0)
        reps = Av.sum(axis=1)
        if isinstance(n_parts, bool) or not isinstance(n_parts, int | np.integer):
            raise CodingError(f"n_parts={n_parts!r} must be an integer")
        if not 1 <= n_parts <= int(reps.min()):
            raise CodingError(
                f"n_parts={n_parts} is out of range: expected 1..{int(reps.min())} "
                "(smallest number of holders of a chunk)"
            )
        ords = (
            optimal_order(Av, int(n_parts), gen) if orders is None else validate_orders(Av, orders)
        )
        super().__init__(Av, int(n_parts), ords)
        ell = self.n_parts
        if B is None:
            B = decoding_matrix(Av, ell, "frame", gen)
        Bv = np.array(B, dtype=np.float64)
        if Bv.shape != (ell, self.m) or not np.isfinite(Bv).all():
            raise CodingError(f"B has shape {Bv.shape}: expected finite ({ell}, {self.m})")
        self.B = Bv
        self._BT = np.ascontiguousarray(Bv.T)
        # Holder table: H[i, :gamma_i] = holders of chunk i (sorted), padded with worker 0 whose
        # padded position is "never covered".
        g = int(reps.max())
        self._gmax = g
        N = self.n_chunks
        H = np.zeros((N, g), dtype=np.int64)
        HP = np.full((N, g), np.iinfo(np.int64).max, dtype=np.int64)
        pos = np.zeros((N, self.m), dtype=np.int64)
        for j, o in enumerate(self.orders):
            pos[o, j] = np.arange(1, len(o) + 1)
        for i in range(N):
            h = np.flatnonzero(Av[i])
            H[i, : h.size] = h
            HP[i, : h.size] = pos[i, h]
        self._H, self._HP = H, HP

    # ---- capabilities -------------------------------------------------------------------
    def digest_arrays(self) -> Sequence[tuple[str, np.ndarray]]:
        """The decoding matrix ``B``, drawn from the seed by the frame search."""
        return (("B", self.B),)

    def trusted_encoder(self) -> TrustedEncoder:
        """:meth:`encode_trusted`."""
        return self.encode_trusted

    def trusted_decoder(self) -> TrustedDecoder:
        """:meth:`decode_trusted`."""
        return self.decode_trusted

    def conditioning_matrix(self) -> np.ndarray:
        """``B`` (ell, m): its ell-subsets of a chunk's holders are what the decode inverts."""
        return self.B

    def manifest_extras(self) -> dict[str, Any]:
        """``B``, its worst ell-subset condition number (seeded sample) and ``q_max``."""
        return {
            "B": np.asarray(self.B).tolist(),
            "worst_condition_number": float(worst_condition_number(
                self.A, self.B, self.n_parts, rng=np.random.default_rng(0))),
            "q_max": int(self.q_max()),
        }

    @staticmethod
    def setup_bytes(m: int, delta: int, n_parts: int) -> int:
        """Estimated peak bytes of building the scheme and decoding one round, ``N = m``.

        The assignment (N x m bytes), the worker-conflict product (m x m int32 + bool), the
        holder tables (two N x delta int64, one N x m int64) and a decode's stacked ``B_U``
        with its QR / SVD work (~3 arrays of N x delta x ell float64), plus the conditioning
        check's sampled ell x ell matrices (at most 20000, with their SVD work).
        """
        N, ell = m, n_parts
        total = N * m + m * m * 5 + N * delta * 16 + N * m * 8 + 3 * N * delta * ell * 8
        n_check = min(20_000, N * math.comb(delta, ell))  # worst_condition_number's subsets
        return total + 3 * n_check * ell * ell * 8

    # ---- trigger ------------------------------------------------------------------------
    def is_decodable(self, state: object) -> bool:
        """Exact trigger: ``min_i |U_i(c)| >= ell``."""
        return bool(self.coverage(state).min() >= self.n_parts)

    def contributes(self, worker: int, state: object) -> bool:
        """Worker ``j`` sends iff ``c_j > 0``."""
        c = self.check_state(state)
        return bool(c[self._check_worker(worker)] > 0)

    def with_orders(self, orders: Sequence[object]) -> PartialScheme:
        """This scheme (same A, ell and B) with other processing orders: the round's scheme
        under ``ordering="adaptive"`` (the orders came in its round_start). The last few are
        kept, keyed by the orders, so that the workers of a process share one.

        Raises
        ------
        CodingError
            When ``orders`` is not a permutation of every worker's chunks.
        """
        key = tuple(tuple(int(i) for i in o) for o in orders)  # type: ignore[attr-defined]
        own = self.__dict__.get("_own_key")
        if own is None:
            own = self.__dict__["_own_key"] = tuple(tuple(o.tolist()) for o in self.orders)
        if key == own:
            return self
        cache: dict[Any, PartialScheme] = self.__dict__.setdefault("_variants", {})
        hit = cache.get(key)
        if hit is None:
            hit = PartialScheme(self.A, self.n_parts, list(key), self.B)
            hit.__dict__["_own_key"] = key
            if len(cache) >= 4:
                cache.pop(next(iter(cache)))
            cache[key] = hit
        return hit

    def q_max(self) -> int:
        """Closed-form ``Q_max`` of this scheme's assignment, orders and ``ell``."""
        return q_max(self.A, self.orders, self.n_parts)

    def progress_tracker(self) -> CoverageTracker:
        """Incremental form of :meth:`is_decodable` (see :class:`CoverageTracker`)."""
        orders = self.__dict__.get("_order_lists")
        if orders is None:
            orders = [o.tolist() for o in self.orders]
            self.__dict__["_order_lists"] = orders
        return CoverageTracker(orders, self.n_chunks, self.n_parts)

    def exact_states(self, states: np.ndarray) -> np.ndarray:
        """:meth:`is_decodable` of each state (every chunk has ``ell`` covering holders),
        vectorised: shape (R,)."""
        S = np.asarray(states, dtype=np.int64)
        T = self._HP[None, :, :] <= S[:, self._H]  # (R, N, gmax); padding never covers
        return np.asarray(T.sum(axis=2).min(axis=1) >= self.n_parts)

    def contributors(self, states: np.ndarray) -> np.ndarray:
        """Workers with ``c_j > 0``: bool, shape (R, m)."""
        return np.asarray(states) > 0

    def encode_all(self, state: object, chunk_grads: np.ndarray, out: np.ndarray) -> None:
        """Every contributing worker's vector into ``out[j]``, each chunk factorised once.

        ``chunk_grads`` is (N, d) by chunk index; ``out`` is (m, ceil(d / ell)).
        """
        c = self.check_state(state)
        thetas = self.all_coefficients(c)
        for j in np.flatnonzero(c > 0).tolist():
            out[j] = encode_rows(thetas[j], chunk_grads[self.orders[j][: c[j]]], self.n_parts)

    def decode_times(self, arrivals: np.ndarray) -> np.ndarray:
        """Earliest time every chunk has ``ell`` reported holders, per trial.

        ``max_i`` of the ``ell``-th smallest ``arrivals[r, j, p_j(i) - 1]`` over the holders
        ``j`` of chunk ``i`` (``p_j(i)``: 1-based position of ``i`` in ``orders[j]``); shapes
        as :meth:`SchemeBase.decode_times` (``(R, m, K)`` -> ``(R,)``).
        """
        a = self._check_arrivals(arrivals)
        pad = np.iinfo(np.int64).max == self._HP
        T = a[:, self._H, np.where(pad, 1, self._HP) - 1]  # (R, N, gmax)
        T[:, pad] = np.inf
        ell = self.n_parts
        kth = np.partition(T, ell - 1, axis=2)[:, :, ell - 1]
        return np.asarray(kth.max(axis=1))

    # ---- coefficients -------------------------------------------------------------------
    def _masked(self, chunks: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Padded ``B_U^T`` stacks, shape (len(chunks), gmax, ell), and coverage masks."""
        Hc = self._H[chunks]
        mask = self._HP[chunks] <= c[Hc]
        X = self._BT[Hc] * mask[..., None]
        return X, mask

    def _theta(self, X: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """``pinv(B_U)`` for each padded stack: shape (n, gmax, ell); zero rows where uncovered."""
        n, g, ell = X.shape
        out = np.zeros((n, g, ell))
        if n == 0:
            return out
        u = mask.sum(axis=1)
        if ell == 1:
            nrm = np.einsum("ngk,ngk->n", X, X)
            ok = nrm > 0
            out[ok] = X[ok] / nrm[ok, None, None]
            return out
        full = u >= ell
        bad = ~full
        if full.any():
            Q, R = np.linalg.qr(X[full])
            diag = np.abs(np.diagonal(R, axis1=1, axis2=2))
            good = diag.min(axis=1) > RANK_RTOL * diag.max(axis=1)
            idx = np.flatnonzero(full)
            if good.any():
                # pinv(B_U) = Q R^{-T}  (B_U^T = QR with R invertible)
                sol = np.linalg.solve(R[good], np.transpose(Q[good], (0, 2, 1)))
                out[idx[good]] = np.transpose(sol, (0, 2, 1))
            bad[idx[~good]] = True
        bad &= u > 0
        if bad.any():
            out[bad] = np.linalg.pinv(np.transpose(X[bad], (0, 2, 1)), rcond=RANK_RTOL)
        return out

    def coefficients(self, worker: int, state: object) -> np.ndarray:
        """Rows ``theta_ij`` of worker ``j``'s first ``c_j`` chunks, in processing order.

        Returns
        -------
        theta : ndarray of float64, shape (c_j, ell)
        """
        j = self._check_worker(worker)
        c = self.check_state(state)
        chunks = self.orders[j][: c[j]]
        X, mask = self._masked(chunks, c)
        th = self._theta(X, mask)
        own = np.argmax(self._H[chunks] == j, axis=1)
        return np.asarray(th[np.arange(chunks.size), own])

    def all_coefficients(self, state: object) -> list[np.ndarray]:
        """:meth:`coefficients` of every worker, each chunk factorised once; list of (c_j, ell)."""
        c = self.check_state(state)
        chunks = np.arange(self.n_chunks)
        X, mask = self._masked(chunks, c)
        th = self._theta(X, mask)
        out = []
        for j, o in enumerate(self.orders):
            oc = o[: c[j]]
            own = np.argmax(self._H[oc] == j, axis=1)
            out.append(th[oc, own])
        return out

    # ---- encode / decode ----------------------------------------------------------------
    def encode(self, worker: int, state: object, chunk_grads: np.ndarray) -> np.ndarray:
        """Coded vector of ``worker``; reads only rows ``0 .. c_j - 1`` of ``chunk_grads``.

        Parameters
        ----------
        worker : int
        state : array_like of int, shape (m,)
            The broadcast state.
        chunk_grads : ndarray, shape (>= c_j, d)
            Chunk gradients in processing order (``orders[worker]``).

        Returns
        -------
        v : ndarray, shape (ceil(d / ell),), float32 for float32 input else float64
        """
        theta = self.coefficients(worker, state)
        return encode_rows(theta, chunk_grads, self.n_parts)

    def projectors_rank(self, state: object) -> tuple[np.ndarray, np.ndarray]:
        """Per chunk ``rank(B_U)`` and condition number of ``B_U`` (its nonzero singular values).

        Returns
        -------
        rank : ndarray of int64, shape (N,)
        cond : ndarray of float64, shape (N,); 1.0 for uncovered chunks
        """
        c = self.check_state(state)
        X, _ = self._masked(np.arange(self.n_chunks), c)
        sv = np.linalg.svd(X, compute_uv=False)
        smax = sv[:, 0]
        nz = sv > RANK_RTOL * smax[:, None]
        nz &= smax[:, None] > 0
        rank = nz.sum(axis=1)
        smin = np.where(nz, sv, np.inf).min(axis=1)
        cond = np.where(rank > 0, smax / np.where(rank > 0, smin, 1.0), 1.0)
        return rank, cond

    def decode_result(
        self, coded: Mapping[int, np.ndarray] | np.ndarray, state: object, dim: int
    ) -> DecodeResult:
        """Decode ``g^(k) = sum_j B[k, j] v_j`` and report exactness and error measures.

        Parameters
        ----------
        coded : Mapping[int, ndarray (p,)] or ndarray (m, p)
            Payloads of the contributing workers (``c_j > 0``); other rows/keys are ignored.
        state : array_like of int, shape (m,)
        dim : int
            Gradient length ``d``; ``p = ceil(d / ell)``.

        Returns
        -------
        DecodeResult
            ``residual = sqrt(sum_i ||B_U pinv(B_U) - I||_F^2 / (N ell))`` where
            ``||P - I||_F^2 = ell - rank(B_U)`` (an uncovered chunk contributes ``ell``);
            ``amplification`` = worst condition number of the ``B_U`` in use.
        """
        c = self.check_state(state)
        dim = self._check_dim(dim)
        rows = np.flatnonzero(c > 0)
        grad = combine(self.B, rows, coded, dim)
        rank, cond = self.projectors_rank(c)
        deficit = int((self.n_parts - rank).sum())
        exact = deficit == 0
        residual = 0.0 if exact else float(np.sqrt(deficit / (self.n_chunks * self.n_parts)))
        return DecodeResult(grad, exact, residual, float(cond.max()), int(rows.size),
                            used_columns(self.B, rows))

    def decode_trusted(self, coded: np.ndarray, c: np.ndarray, dim: int) -> DecodeResult:
        """:meth:`decode_result` for internal callers whose state the process built itself.

        Skips re-validating ``c`` (an ``(m,)`` int64 array already within ``0..loads``) and,
        for ``ell == 1``, replaces the per-chunk SVD by its closed form: ``B_U`` is a row
        vector, of rank 1 (condition number 1) iff some covered holder has a nonzero ``B``
        entry, else 0.

        Parameters
        ----------
        coded : ndarray, shape (m, ceil(dim / ell))
        c : ndarray of int64, shape (m,)
        dim : int

        Returns
        -------
        DecodeResult
        """
        if self.n_parts != 1:
            return self.decode_result(coded, c, dim)
        rows = c.nonzero()[0]  # == flatnonzero(c > 0): c >= 0
        grad = combine(self.B, rows, coded, dim)
        # holder h covers chunk i with a usable coefficient iff c[h] >= HP[i, h] and
        # B[h] != 0: the second condition is folded into the positions once (a holder with
        # B[h] == 0 gets the "never" position), leaving one gather and one compare per round
        HPb = self.__dict__.get("_HP_live")
        if HPb is None:
            never = np.iinfo(np.int64).max
            HPb = np.where(self.B[0][self._H] != 0, self._HP, never)
            self.__dict__["_HP_live"] = HPb
        live = c[self._H] >= HPb
        deficit = int(self.n_chunks - np.count_nonzero(live.any(axis=1)))
        exact = deficit == 0
        residual = 0.0 if exact else float(np.sqrt(deficit / self.n_chunks))
        return DecodeResult(grad, exact, residual, 1.0, int(rows.size), used_columns(self.B, rows))

    def _closed_form_dens(self, c: Sequence[int]) -> list[float]:
        """Per chunk ``i``: ``sum_{h in U_i(c)} B_h^2`` (``ell == 1``), summed over the holders
        in index order; shape (N,) as a list.

        Every worker of a process encodes against the same broadcast state in a round, so the
        last state's sums are kept: the first worker pays O(N * gamma), the others a tuple
        comparison.
        """
        key = c if type(c) is tuple else tuple(c)
        cached = self.__dict__.get("_dens_cache")
        if cached is not None and (cached[0] is key or cached[0] == key):
            return cast(list[float], cached[1])
        table = self.__dict__.get("_den_table")
        if table is None:
            b = self.B[0].tolist()
            never = np.iinfo(np.int64).max
            table = [[(h, p, b[h] * b[h]) for h, p in zip(self._H[i].tolist(),
                                                          self._HP[i].tolist(), strict=True)
                      if p != never] for i in range(self.n_chunks)]
            self.__dict__["_den_table"] = table
            self.__dict__["_b_list"] = b
            if "_order_lists" not in self.__dict__:
                self.__dict__["_order_lists"] = [[int(i) for i in o] for o in self.orders]
        dens = []
        for hold in table:
            den = 0.0
            for h, p, b2 in hold:
                if p <= key[h]:
                    den += b2
            dens.append(den)
        self.__dict__["_dens_cache"] = (key, dens)
        return dens

    def encode_trusted(self, worker: int, c: Sequence[int], chunk_grads: np.ndarray
                       ) -> np.ndarray:
        """:meth:`encode` for internal callers with an already validated state.

        ``c`` is the broadcast state as a list of ints (``0 <= c[j] <= loads[j]``, checked by
        the caller where it entered). For ``ell == 1`` the coefficients come from their closed
        form ``theta_ij = B_j / sum_{h in U_i} B_h^2`` (``pinv`` of a row vector), summed over
        the holders in the same order as :meth:`_theta` (holders sorted by index).

        Returns
        -------
        v : ndarray, shape (ceil(d / ell),)
        """
        cj = c[worker]
        if self.n_parts != 1:
            th = self.coefficients(worker, np.asarray(c, dtype=np.int64))
            return encode_rows(th, chunk_grads, self.n_parts)
        dens = self._closed_form_dens(c)  # also builds _b_list and _order_lists
        d = self.__dict__
        bj = d["_b_list"][worker]
        coef = []
        for i in d["_order_lists"][worker][:cj]:
            den = dens[i]
            coef.append(bj / den if den > 0 else 0.0)
        X = chunk_grads if len(chunk_grads) == cj else chunk_grads[:cj]
        if X.dtype is _F8 and X.ndim == 2 and X.flags.c_contiguous:
            # encode_rows' product for ell = 1, unchecked; ndarray.dot rather than ``@``: the
            # same gemv and bits, without the matmul ufunc's overhead on short vectors
            return np.array(coef).dot(X)  # type: ignore[no-any-return]
        return encode_rows(np.array(coef)[:, None], chunk_grads, 1)


def _build_partial(p: SchemeParams) -> PartialScheme:
    A = build_assignment(p)
    orders = build_orders(p.ordering, A, p.n_parts, p.rng, p.speeds, p.sizes)
    B = decoding_matrix(A, p.n_parts, p.decoding, p.rng)  # type: ignore[arg-type]
    return PartialScheme(A, p.n_parts, orders, B, p.rng)


register_scheme(SchemeSpec(
    name="partial", build=_build_partial, sends_when_done=False,
    waiting="every chunk has ell reported holders (min_i |U_i(c)| >= ell)",
    exactness="exact at the trigger; approximate (projection) at an approx deadline",
    decoder="g^(k) = sum_j B[k, j] v_j with per-chunk pinv(B_U) encoding",
    assignments=ASSIGNMENTS, orderings=ordering_names(), decodings=DECODINGS,
    setup_bytes=PartialScheme.setup_bytes))
