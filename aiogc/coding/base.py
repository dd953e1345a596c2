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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from aiogc.errors import CodingError

__all__ = ["DecodeResult", "ProgressTracker", "Scheme", "SchemeBase", "TrustedDecoder",
           "TrustedEncoder", "combine", "encode_rows", "runs", "used_columns"]


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
    weights : ndarray, shape (ell, m), optional
        The decoding coefficients applied to the coded vectors (per-round attribution):
        ``gradient == (weights @ coded).reshape(-1)[:d]``, i.e. part ``k`` of the estimate is
        ``sum_j weights[k, j] * v_j``; a zero column is a vector the decode did not read.
        None when the scheme does not say (``aiogc.training.attribution`` then probes it).
    """

    gradient: np.ndarray
    exact: bool
    residual: float
    amplification: float
    n_contributions: int
    weights: np.ndarray | None = None


class ProgressTracker(Protocol):
    """Incremental waiting rule of a trigger scheme, for the PS's per-report hot path.

    Holds the reported counts of one round; ``deficit == 0`` iff the state is decodable
    (:meth:`Scheme.is_decodable`). The PS calls :meth:`add` when a worker's count grows from
    ``old`` to ``new`` and :meth:`remove` when a worker with count ``old`` drops out (its
    count becomes 0).
    """

    deficit: int

    def add(self, worker: int, old: int, new: int) -> None: ...
    def remove(self, worker: int, old: int) -> None: ...


class _StateTracker:
    """Generic :class:`ProgressTracker`: keeps the counts and asks ``is_decodable``."""

    __slots__ = ("_scheme", "_state", "deficit")

    def __init__(self, scheme: SchemeBase) -> None:
        self._scheme = scheme
        self._state = np.zeros(scheme.m, dtype=np.int64)
        self.deficit = 1
        self._update()

    def _update(self) -> None:
        self.deficit = 0 if self._scheme.is_decodable(self._state) else 1

    def add(self, worker: int, old: int, new: int) -> None:
        self._state[worker] = new
        self._update()

    def remove(self, worker: int, old: int) -> None:
        self._state[worker] = 0
        self._update()


#: Fast encoder for callers whose state the process validated itself:
#: ``(worker, c as a sequence of ints, chunk_grads (>= c_j, d) in processing order) -> (p,)``.
TrustedEncoder = Callable[[int, Sequence[int], np.ndarray], np.ndarray]
#: Fast decoder for callers whose state the process built itself:
#: ``(coded (m, p), c (m,) int64, dim) -> DecodeResult``.
TrustedDecoder = Callable[[np.ndarray, np.ndarray, int], DecodeResult]


@runtime_checkable
class Scheme(Protocol):
    """The interface the protocol core uses (and nothing else).

    Besides the numerics, a scheme declares its *capabilities* (defaults in
    :class:`SchemeBase`; nobody probes a scheme with ``getattr``):

    * :attr:`sends_when_done`: workers send once after all their chunks (else the PS triggers);
    * :meth:`digest_arrays`: every array drawn from the seed, hashed into ``scheme_digest`` so
      a worker that drew differently fails the PS-worker check;
    * :meth:`trusted_encoder` / :meth:`trusted_decoder`: fast paths without re-validation;
    * :meth:`fixed_coefficients`: a worker's state-independent encoding rows;
    * :meth:`conditioning_matrix`: the decoding matrix whose ell-subsets the PS checks;
    * :meth:`encoding_tensor`: the fixed code ``E`` the redundancy check solves against;
    * :meth:`manifest_extras`: scheme-specific entries of a run manifest;
    * ``setup_bytes(m, delta, n_parts)`` (static, carried by the registry entry): the setup
      memory model, usable before the scheme is built.
    """

    name: str
    A: np.ndarray
    m: int
    n_chunks: int
    n_parts: int
    orders: list[np.ndarray]
    loads: np.ndarray
    sends_when_done: bool
    uploads_per_chunk: bool

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
    def states_at(self, arrivals: np.ndarray, t: np.ndarray) -> np.ndarray: ...
    def decode_times(self, arrivals: np.ndarray) -> np.ndarray: ...
    def contributors(self, states: np.ndarray) -> np.ndarray: ...
    def encode_all(self, state: object, chunk_grads: np.ndarray, out: np.ndarray) -> None: ...
    def progress_tracker(self) -> ProgressTracker: ...
    def exact_states(self, states: np.ndarray) -> np.ndarray: ...
    def digest_arrays(self) -> Sequence[tuple[str, np.ndarray]]: ...
    def trusted_encoder(self) -> TrustedEncoder | None: ...
    def trusted_decoder(self) -> TrustedDecoder | None: ...
    def fixed_coefficients(self, worker: int) -> np.ndarray | None: ...
    def conditioning_matrix(self) -> np.ndarray | None: ...
    def encoding_tensor(self) -> np.ndarray | None: ...
    def manifest_extras(self) -> dict[str, Any]: ...
    def with_orders(self, orders: Sequence[Any]) -> Scheme | None: ...


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
        return np.asarray(th.reshape(-1) @ Xc.reshape(c * n_parts, p))
    for k in range(n_parts):
        lo, hi = k * p, min((k + 1) * p, d)
        if hi > lo:
            v[: hi - lo] += th[:, k] @ Xc[:, lo:hi]
    return v


def used_columns(D: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``D`` with every column outside ``rows`` zeroed: the weights :func:`combine` applies.

    Parameters
    ----------
    D : ndarray, shape (ell, m)
    rows : ndarray of int, shape (r,)

    Returns
    -------
    ndarray of float64, shape (ell, m)
    """
    W = np.zeros(D.shape, dtype=np.float64)
    W[:, rows] = D[:, rows]
    return W


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
        if rows.size * p <= _GATHER_MAX:
            # small payloads: one gathered product. Below this size the copy of the rows costs
            # less than a matmul call per contiguous run plus finding the runs (fixed costs
            # that dominate small products): the per-round decode of the PS at d ~ 10^2..10^4
            if rows.size == 0:
                return np.zeros(dim, dtype=dt)
            return np.asarray((Dc.take(rows, axis=1) @ coded.take(rows, axis=0))
                              .reshape(-1)[:dim])
        rr = runs(rows)
        if not rr:
            return np.zeros(dim, dtype=dt)
        a, b = rr[0]
        out = Dc[:, a:b] @ coded[a:b]
        if len(rr) > 1:
            # a fresh payload-sized temporary per decode costs a page fault per 4 KiB (~40 %
            # of the products at d = 10^6, m = 64): reuse a pooled one
            tmp = _scratch(out.shape, dt)
            for a, b in rr[1:]:
                np.matmul(Dc[:, a:b], coded[a:b], out=tmp)
                out += tmp
            _SCRATCH.append(tmp.base if tmp.base is not None else tmp)
        return np.asarray(out.reshape(-1)[:dim])
    return _combine_mapping(D, rows, coded, dim, p)


#: Largest gathered copy (rows x payload length, elements) :func:`combine` makes instead of a
#: product per contiguous run of rows: 2^16 float64 = 512 KiB, far below where the copy's page
#: faults matter (d = 10^6 payloads keep the zero-copy path).
_GATHER_MAX = 1 << 16

#: Spare payload-sized buffers for :func:`combine`. A caller takes one with ``list.pop`` and
#: gives it back with ``append`` (both atomic under the GIL), so concurrent decodes never share
#: a buffer: one that finds the pool empty allocates its own.
_SCRATCH: list[np.ndarray] = []


def _scratch(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A ``shape`` array of ``dtype`` from the pool (contents undefined); give it back with
    ``_SCRATCH.append(buf.base)`` once done."""
    n = int(np.prod(shape))
    try:
        buf = _SCRATCH.pop()
    except IndexError:
        buf = np.empty(n, dtype=dtype)
    if buf.dtype != dtype or buf.size < n:
        buf = np.empty(n, dtype=dtype)
    return buf[:n].reshape(shape)


def _combine_mapping(D: np.ndarray, rows: np.ndarray, coded: Mapping[int, np.ndarray], dim: int,
                     p: int) -> np.ndarray:
    """:func:`combine` for payloads given as ``{worker: (p,) array}``."""
    ell = D.shape[0]
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
    """Shared state handling; subclasses set ``name``, ``sends_when_done`` and the numerics.

    The capability methods (see :class:`Scheme`) default to "not offered"; a scheme overrides
    those that apply.
    """

    name: str = ""
    sends_when_done: bool = True
    #: Workers upload every finished chunk's gradient as its own frame (streaming schemes):
    #: ``arrivals[r, j, k]`` is then that vector's arrival and the round ends at the trigger.
    #: The cores run it with the ``StreamWhenDone`` round policy (``chunk_gradient`` frames).
    uploads_per_chunk: bool = False

    # ---- capabilities (defaults) ---------------------------------------------------------
    def digest_arrays(self) -> Sequence[tuple[str, np.ndarray]]:
        """Every array drawn from the seed, as ``(name, array)`` pairs in a fixed order.

        ``scheme_digest`` hashes each name and its float64 little-endian bytes after ``A`` and
        the orders (which it always covers). A scheme drawing a matrix from ``rng`` must list
        it here: a worker that drew it differently must not pass the PS-worker check.
        Default: none.
        """
        return ()

    def trusted_encoder(self) -> TrustedEncoder | None:
        """A faster :meth:`encode` skipping state validation (see :data:`TrustedEncoder`), or
        None (default) when the scheme has none."""
        return None

    def trusted_decoder(self) -> TrustedDecoder | None:
        """A faster :meth:`decode_result` skipping state validation (see
        :data:`TrustedDecoder`), or None (default)."""
        return None

    def fixed_coefficients(self, worker: int) -> np.ndarray | None:
        """Encoding rows of ``worker`` when they do not depend on the state, shape
        ``(loads[worker], ell)`` in processing order; None (default) when they do."""
        return None

    def conditioning_matrix(self) -> np.ndarray | None:
        """The decoding matrix ``B`` (ell, m) whose ell-subset conditioning the PS checks
        before a run, or None (default: nothing to check)."""
        return None

    def encoding_tensor(self) -> np.ndarray | None:
        """The fixed encoding tensor ``E`` (m, N, ell) the redundancy check's decoders solve
        against (its conditioning bounds their error), or None (default)."""
        return None

    def manifest_extras(self) -> dict[str, Any]:
        """Scheme-specific entries of a run manifest (JSON-ready); default none."""
        return {}

    def with_orders(self, orders: Sequence[Any]) -> Scheme | None:
        """This scheme with other processing orders (``ordering="adaptive"``, a round's
        orders), or None (default) when it cannot take them."""
        return None

    @staticmethod
    def setup_bytes(m: int, delta: int, n_parts: int) -> int:
        """Estimated peak bytes of building the scheme and decoding one round (model
        excluded), for ``N = m`` chunks: default the assignment ``A`` only (``N * m``).

        The registry entry (:attr:`SchemeSpec.setup_bytes`) carries this so a configuration
        is checked before anything is built.
        """
        return m * m

    # ---- state handling ------------------------------------------------------------------

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
        return self.decode_result(coded, state, dim).gradient

    # ---- what every scheme defines ----------------------------------------------------------

    def is_decodable(self, state: object) -> bool:
        """The waiting rule: whether the PS can decode from ``state`` (exact trigger)."""
        raise NotImplementedError

    def contributes(self, worker: int, state: object) -> bool:
        """Whether ``worker`` sends a coded vector for ``state``."""
        raise NotImplementedError

    def encode(self, worker: int, state: object, chunk_grads: np.ndarray) -> np.ndarray:
        """Coded vector of ``worker`` for ``state``; shape (payload_len(d),)."""
        raise NotImplementedError

    def decode_result(
        self, coded: Mapping[int, np.ndarray] | np.ndarray, state: object, dim: int
    ) -> DecodeResult:
        """Decode the contributing workers' payloads for ``state``."""
        raise NotImplementedError

    def q_max(self) -> int:
        """Worst-case chunk computations before the PS can decode."""
        raise NotImplementedError

    def _finished_count_rule(self, state: object, need: int) -> bool:
        c = self.check_state(state)
        return int(((c == self.loads) & (self.loads > 0)).sum()) >= need

    def progress_tracker(self) -> ProgressTracker:
        """A fresh :class:`ProgressTracker` of this scheme's waiting rule (all counts 0).

        Generic: re-evaluates :meth:`is_decodable` on every update; schemes with an
        incremental form of their rule override it.
        """
        return _StateTracker(self)

    # ---- vectorised rules (the fast path asks these instead of re-deriving them) ----------
    #
    # ``arrivals`` has shape (R, m, K), K >= max load: ``arrivals[r, j, k]`` is when the PS
    # learns, in trial ``r``, that worker ``j`` finished its ``(k+1)``-th chunk (``inf`` beyond
    # ``loads[j]`` or never). For a send-when-done scheme ``arrivals[r, j, loads[j] - 1]`` is
    # when worker ``j``'s vector arrives.

    def _check_arrivals(self, arrivals: np.ndarray) -> np.ndarray:
        a = np.asarray(arrivals, dtype=np.float64)
        K = int(self.loads.max()) if self.m else 0
        if a.ndim != 3 or a.shape[1] != self.m or a.shape[2] < K:
            raise CodingError(f"arrivals has shape {a.shape}: expected (R, {self.m}, >= {K})")
        return a

    def done_times(self, arrivals: np.ndarray) -> np.ndarray:
        """When each worker's last chunk is known to the PS: shape (R, m); ``inf`` if no load."""
        a = self._check_arrivals(arrivals)
        idx = np.maximum(self.loads - 1, 0)
        done = a[:, np.arange(self.m), idx]
        return np.where(self.loads[None, :] > 0, done, np.inf)

    def states_at(self, arrivals: np.ndarray, t: np.ndarray) -> np.ndarray:
        """The state the PS holds at time ``t[r]`` (arrivals at or before ``t`` count).

        Parameters
        ----------
        arrivals : ndarray, shape (R, m, K)
        t : ndarray, shape (R,)

        Returns
        -------
        states : ndarray of int64, shape (R, m)
            Reported counts (trigger schemes) or ``loads`` of the workers whose vector
            arrived (send-when-done schemes).
        """
        a = self._check_arrivals(arrivals)
        tt = np.asarray(t, dtype=np.float64)[:, None]
        if self.sends_when_done:
            return np.where(self.done_times(a) <= tt, self.loads[None, :], 0).astype(np.int64)
        K = int(self.loads.max()) if self.m else 0
        return np.asarray((a[:, :, :K] <= tt[:, :, None]).sum(axis=2), dtype=np.int64)

    def decode_times(self, arrivals: np.ndarray) -> np.ndarray:
        """Earliest time the state the PS holds is decodable (:meth:`is_decodable`), per trial.

        Generic rule for any scheme: a binary search over the trial's arrival times (the
        state only grows with time, so decodability is monotone). Schemes override it with a
        closed form.

        Parameters
        ----------
        arrivals : ndarray, shape (R, m, K)

        Returns
        -------
        t : ndarray of float64, shape (R,); ``inf`` where never decodable
        """
        a = self._check_arrivals(arrivals)
        R = a.shape[0]
        cand = self.done_times(a) if self.sends_when_done else a.reshape(R, -1)
        out = np.full(R, np.inf)
        for r in range(R):
            ts = np.unique(cand[r][np.isfinite(cand[r])])
            lo, hi = 0, ts.size  # first index whose state is decodable; ts.size = never
            while lo < hi:
                mid = (lo + hi) // 2
                st = self.states_at(a[r : r + 1], ts[mid : mid + 1])[0]
                if self.is_decodable(st):
                    hi = mid
                else:
                    lo = mid + 1
            if lo < ts.size:
                out[r] = ts[lo]
        return out

    def contributors(self, states: np.ndarray) -> np.ndarray:
        """:meth:`contributes` of every worker for each state: bool, shape (R, m)."""
        S = np.asarray(states, dtype=np.int64)
        return np.array([[self.contributes(j, c) for j in range(self.m)] for c in S],
                        dtype=bool).reshape(S.shape)

    def encode_all(self, state: object, chunk_grads: np.ndarray, out: np.ndarray) -> None:
        """Coded vectors of every contributing worker into ``out[j]``.

        Parameters
        ----------
        state : array_like of int, shape (m,)
        chunk_grads : ndarray, shape (N, d)
            Chunk gradients by chunk index (not processing order).
        out : ndarray, shape (m, ceil(d / ell))
            Rows of non-contributing workers are left untouched.
        """
        c = self.check_state(state)
        for j in range(self.m):
            if self.contributes(j, c):
                out[j] = self.encode(j, c, chunk_grads[self.orders[j]])

    def exact_states(self, states: np.ndarray) -> np.ndarray:
        """Whether decoding from each (decodable) state is algebraically exact: shape (R,).

        Default: a decodable state decodes exactly. Schemes that decode approximately even
        when their waiting rule is met (ignore-stragglers) override this.
        """
        S = np.asarray(states, dtype=np.int64)
        return np.array([bool(self.is_decodable(c)) for c in S], dtype=bool)
