"""Baseline schemes run through the same interface: original gradient coding, uncoded,
ignore-stragglers, and the :func:`make_scheme` factory.

Original gradient coding keeps a fixed encoding tensor ``E`` of shape ``(m, N, ell)``:
worker ``j`` sends ``sum_{i,k} E[j, i, k] g_i^(k)`` once it finished *all* its chunks. Exact
decoding needs any ``m - s`` finished workers; with fewer, the PS uses least-squares optimal
decoding coefficients (Glasgow and Wootters). Constructions:

* ``"tandon"`` (ell = 1, cyclic with delta = s+1): Tandon et al. ICML 2017, Algorithm 2. A random
  ``H`` (s x m) with ``H 1 = 0``; row ``j`` of ``E`` has cyclic support ``j..j+s``, a leading 1 and
  the rest solving ``H b = 0``, so every row lies in ``null(H)``, which contains ``1``.
* ``"fr"`` (ell = 1, fractional repetition): every worker sends the plain sum of its chunks.
* ``"polynomial"`` (Ye and Abbe ICML 2018, any ell, every chunk with >= s + ell holders): distinct
  real points ``alpha_j`` (default equispaced in [-1, 1]); for chunk ``i`` and block ``u`` the
  polynomial ``q_iu = Z_i r_iu`` of degree ``m-s-1`` vanishes at the ``alpha`` of non-holders
  (``Z_i`` monic, degree ``m-s-ell``) and has top-``ell`` coefficients ``e_u``; worker ``j``
  sends ``P(alpha_j) = sum_{i,u} q_iu(alpha_j) g_i^(u)``. The PS interpolates ``P`` from any
  ``m-s`` evaluations (a Vandermonde solve) and reads the top ``ell`` coefficients
  ``sum_i g_i^(u)``. Its conditioning degrades quickly with ``m``: that is measured, not fixed.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from aiogc.coding.assignments import (
    cyclic_assignment,
    fractional_repetition_assignment,
    is_cyclic,
    is_fractional_repetition,
    regular_assignment,
    validate_assignment,
)
from aiogc.coding.base import DecodeResult, SchemeBase, combine, encode_rows
from aiogc.coding.decoding_matrix import decoding_matrix
from aiogc.coding.orderings import natural_order, optimal_order, random_order
from aiogc.coding.partial import PartialScheme
from aiogc.errors import CodingError, ConfigError

__all__ = [
    "SCHEME_NAMES",
    "IgnoreStragglersScheme",
    "OriginalScheme",
    "UncodedScheme",
    "make_scheme",
]

SCHEME_NAMES: tuple[str, ...] = ("partial", "original", "uncoded", "ignore-stragglers")
CONSTRUCTIONS: tuple[str, ...] = ("auto", "tandon", "fr", "polynomial")
#: Residual below which a least-squares decode counts as algebraically exact.
EXACT_RTOL = 1e-9


class _FixedCodeScheme(SchemeBase):
    """A scheme with a fixed encoding tensor ``E`` (m, N, ell); workers send when done."""

    sends_when_done = True
    E: np.ndarray

    def contributes(self, worker: int, state: object) -> bool:
        """A worker sends iff it finished all its chunks (``c_j == loads[j]``)."""
        c = self.check_state(state)
        j = self._check_worker(worker)
        return bool(c[j] == self.loads[j] and self.loads[j] > 0)

    def finished(self, state: object) -> np.ndarray:
        """Sorted indices of workers that finished all their chunks; shape (r,)."""
        c = self.check_state(state)
        return np.flatnonzero((c == self.loads) & (self.loads > 0))

    def coefficients(self, worker: int, state: object | None = None) -> np.ndarray:
        """Encoding rows of ``worker`` for its chunks in processing order; (loads[j], ell)."""
        j = self._check_worker(worker)
        return self.E[j, self.orders[j], :]

    def encode(self, worker: int, state: object, chunk_grads: np.ndarray) -> np.ndarray:
        """Coded vector ``(ceil(d/ell),)``; reads rows ``0 .. loads[j]-1`` (all chunks).

        Raises
        ------
        CodingError
            If the worker has not finished all its chunks in ``state``.
        """
        if not self.contributes(worker, state):
            raise CodingError(f"worker {worker} has not finished its chunks: it does not send")
        return encode_rows(self.coefficients(worker), chunk_grads, self.n_parts)

    def _ls_decoder(self, F: np.ndarray) -> tuple[np.ndarray, float]:
        """Least-squares decoding coefficients (ell, |F|) and the relative residual."""
        ell, N = self.n_parts, self.n_chunks
        M = self.E[F].reshape(F.size, N * ell)  # rows: finished workers
        T = np.zeros((N * ell, ell))
        for u in range(ell):
            T[u::ell, u] = 1.0
        if F.size == 0:
            return np.zeros((ell, 0)), 1.0
        a, *_ = np.linalg.lstsq(M.T, T, rcond=None)
        res = float(np.sqrt(np.sum((M.T @ a - T) ** 2) / (N * ell)))
        return a.T, res

    def _exact_decoder(self, F: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exact decoding coefficients (ell, |used|) and the workers ``used`` (subset of F)."""
        return self._ls_decoder(F)[0], F

    def _need(self) -> int:
        raise NotImplementedError

    def is_decodable(self, state: object) -> bool:
        """True iff at least the required number of workers finished all their chunks."""
        return self._finished_count_rule(state, self._need())

    def q_max(self) -> int:
        """Worst-case chunk computations before enough workers finished.

        ``sum(loads) - (m - need)`` where ``need`` is the number of finished workers required.
        """
        return int(self.loads.sum()) - (self.m - self._need())

    def _amplification(self, D: np.ndarray, F: np.ndarray) -> float:
        """Error amplification of decoding from ``F``: the larger of the coefficient bound
        ``max_u sum_j |D[u, j]| * ||E_j||_1 / N`` and the condition number of the system the
        decoder solves (the stacked encoding rows of ``F``, nonzero singular values).

        The coefficient bound alone misses that ``D`` itself is computed from that system: for
        the polynomial (Vandermonde) code it understated the observed error by ~10 orders of
        magnitude at m = 48, while ``cond * eps`` tracks it.
        """
        if F.size == 0:
            return 1.0
        e1 = np.abs(self.E[F]).sum(axis=(1, 2))
        bound = max(1.0, float((np.abs(D) @ e1).max() / self.n_chunks))
        M = self.E[F].reshape(F.size, -1)
        sv = np.linalg.svd(M, compute_uv=False)
        nz = sv[sv > sv[0] * 1e-300] if sv.size and sv[0] > 0 else sv[:0]
        cond = float(nz[0] / nz[-1]) if nz.size else 1.0
        return max(bound, cond)

    def decode_result(
        self, coded: Mapping[int, np.ndarray] | np.ndarray, state: object, dim: int
    ) -> DecodeResult:
        """Decode from the finished workers.

        With at least the required number finished: the construction's exact decoder. Fewer:
        least-squares optimal coefficients ``a_u = argmin ||E_F^T a - t_u||`` and
        ``residual = sqrt(sum_u ||E_F^T a_u - t_u||^2 / (N ell))``.
        """
        c = self.check_state(state)
        dim = self._check_dim(dim)
        F = self.finished(c)
        if F.size >= self._need():
            D, used = self._exact_decoder(F)
            res, exact = 0.0, True
        else:
            D, res = self._ls_decoder(F)
            used = F
            exact = res < EXACT_RTOL
            if exact:
                res = 0.0
        full = np.zeros((self.n_parts, self.m))
        full[:, used] = D
        grad = combine(full, used, coded, dim)
        return DecodeResult(grad, exact, res, self._amplification(D, used), int(used.size))


class OriginalScheme(_FixedCodeScheme):
    """Original gradient coding (Tandon et al. 2017; Ye and Abbe 2018 for ell > 1).

    Parameters
    ----------
    A : array_like, shape (N, m)
    s : int
        Stragglers tolerated; any ``m - s`` finished workers decode exactly.
    n_parts : int
        ``ell``; the payload is ``ceil(d / ell)``.
    rng : numpy.random.Generator, optional
        For Tandon's random ``H``; ``None`` means ``default_rng(0)``.
    construction : {"auto", "tandon", "fr", "polynomial"}
        ``"auto"``: ``"fr"`` if ``ell == 1`` and ``A`` is fractional repetition with groups of
        ``s+1``, ``"tandon"`` if ``ell == 1`` and ``A`` is cyclic with ``delta = s+1``,
        else ``"polynomial"``.
    alphas : array_like, shape (m,), optional
        Evaluation points of the polynomial construction (default ``linspace(-1, 1, m)``).
    """

    name = "original"

    def __init__(
        self,
        A: object,
        s: int,
        n_parts: int = 1,
        rng: np.random.Generator | None = None,
        *,
        construction: str = "auto",
        alphas: np.ndarray | None = None,
    ) -> None:
        Av = validate_assignment(A)
        m = Av.shape[1]
        if isinstance(s, bool) or not isinstance(s, int | np.integer) or not 0 <= s < m:
            raise CodingError(f"s={s!r} is out of range: expected an int in [0, {m - 1}]")
        if isinstance(n_parts, bool) or not isinstance(n_parts, int | np.integer) or n_parts < 1:
            raise CodingError(f"n_parts={n_parts!r} must be an int >= 1")
        if construction not in CONSTRUCTIONS:
            raise CodingError(f"construction={construction!r} not in {CONSTRUCTIONS}")
        ell = int(n_parts)
        self.s = int(s)
        if construction == "auto":
            if ell == 1 and is_fractional_repetition(Av) == self.s + 1:
                construction = "fr"
            elif ell == 1 and is_cyclic(Av) == self.s + 1:
                construction = "tandon"
            else:
                construction = "polynomial"
        self.construction = construction
        super().__init__(Av, ell, natural_order(Av))
        gen = rng if rng is not None else np.random.default_rng(0)
        self.alphas: np.ndarray | None = None
        if construction == "fr":
            if ell != 1 or is_fractional_repetition(Av) != self.s + 1:
                raise CodingError(
                    f"construction='fr' needs n_parts=1 and groups of s+1={self.s + 1} workers"
                )
            self.E = Av.T[:, :, None].astype(np.float64)
        elif construction == "tandon":
            if ell != 1 or is_cyclic(Av) != self.s + 1:
                raise CodingError(
                    f"construction='tandon' needs n_parts=1 and a cyclic assignment with "
                    f"delta=s+1={self.s + 1}"
                )
            self.E = self._tandon(gen)
        else:
            self.E = self._polynomial(alphas)

    def _need(self) -> int:
        return self.m - self.s

    def _tandon(self, rng: np.random.Generator) -> np.ndarray:
        m, s = self.m, self.s
        H = rng.standard_normal((s, m))
        if s > 0:
            H[:, -1] = -H[:, :-1].sum(axis=1)
        E = np.zeros((m, m, 1))
        for j in range(m):
            supp = (j + np.arange(s + 1)) % m
            row = np.ones(s + 1)
            if s > 0:
                row[1:] = np.linalg.solve(H[:, supp[1:]], -H[:, supp[0]])
            E[j, supp, 0] = row
        return E

    def _polynomial(self, alphas: np.ndarray | None) -> np.ndarray:
        Av, m, s, ell, N = self.A, self.m, self.s, self.n_parts, self.n_chunks
        deg = m - s - ell  # degree of Z_i
        reps = Av.sum(axis=1)
        if deg < 0 or (reps < s + ell).any():
            raise CodingError(
                f"polynomial construction needs every chunk held by >= s+n_parts={s + ell} "
                f"workers (min is {int(reps.min())}) and s+n_parts <= m={m}"
            )
        a = np.linspace(-1.0, 1.0, m) if alphas is None else np.asarray(alphas, dtype=np.float64)
        if a.shape != (m,) or np.unique(a).size != m:
            raise CodingError(f"alphas must be {m} distinct reals, got shape {a.shape}")
        self.alphas = a
        E = np.zeros((m, N, ell))
        for i in range(N):
            non = np.flatnonzero(~Av[i])
            hold = np.flatnonzero(Av[i])
            # extra roots (only when chunk i has more than s+ell holders): its last holders
            roots = np.concatenate([non, hold[::-1][: deg - non.size]])
            z = np.poly(a[roots]) if roots.size else np.ones(1)  # descending, z[0] = 1
            T = np.zeros((ell, ell))
            for v in range(ell):
                for t in range(v + 1):
                    T[v, t] = z[v - t] if v - t < z.size else 0.0
            Rcoef = np.linalg.solve(T, np.eye(ell))  # column u: r_iu, descending coefficients
            zv = np.polyval(z, a[hold])
            for u in range(ell):
                E[hold, i, u] = zv * np.polyval(Rcoef[:, u], a[hold])
        return E

    def _exact_decoder(self, F: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.construction != "polynomial":
            return self._ls_decoder(F)[0], F
        assert self.alphas is not None
        k = self.m - self.s
        used = F[:k]
        V = np.vander(self.alphas[used], k)  # column t <-> x^(k-1-t)
        D = np.linalg.solve(V.T, np.eye(k)[:, : self.n_parts]).T  # top ell rows of V^{-1}
        return D, used


class UncodedScheme(_FixedCodeScheme):
    """Uncoded: ``A = I``, each worker one chunk; exact only when all finished.

    Approximate decode: the sum of what arrived; ``residual = sqrt(#missing / N)``.
    """

    name = "uncoded"

    def __init__(self, m: int) -> None:
        if isinstance(m, bool) or not isinstance(m, int | np.integer) or m < 1:
            raise CodingError(f"m={m!r} must be an int >= 1")
        A = np.eye(int(m), dtype=bool)
        super().__init__(A, 1, natural_order(A))
        self.E = np.eye(int(m))[:, :, None]

    def _need(self) -> int:
        return self.m

    def _ls_decoder(self, F: np.ndarray) -> tuple[np.ndarray, float]:
        return np.ones((1, F.size)), float(np.sqrt((self.m - F.size) / self.m))

    def _exact_decoder(self, F: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.ones((1, F.size)), F


class IgnoreStragglersScheme(UncodedScheme):
    """Uncoded, but decode once ``k`` workers finished, scaling the sum by ``N / r``.

    With ``r`` received chunk gradients the estimate is ``(N / r) * sum_received g_i`` (unbiased
    for exchangeable chunks); under i.i.d. isotropic zero-mean chunk gradients its relative
    ``residual = sqrt(((N/r - 1)^2 r + (N - r)) / N)``; exact only when ``r == N``.
    """

    name = "ignore-stragglers"

    def __init__(self, m: int, k: int) -> None:
        super().__init__(m)
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k <= self.m:
            raise CodingError(f"k={k!r} is out of range: expected an int in [1, {self.m}]")
        self.k = int(k)

    def _need(self) -> int:
        return self.k

    def _ls_decoder(self, F: np.ndarray) -> tuple[np.ndarray, float]:
        N, r = self.m, F.size
        if r == 0:
            return np.zeros((1, 0)), 1.0
        res = np.sqrt(((N / r - 1) ** 2 * r + (N - r)) / N)
        return np.full((1, r), N / r), float(res)

    def decode_result(
        self, coded: Mapping[int, np.ndarray] | np.ndarray, state: object, dim: int
    ) -> DecodeResult:
        """Scaled sum of the finished workers' chunk gradients (see class docstring)."""
        c = self.check_state(state)
        dim = self._check_dim(dim)
        F = self.finished(c)
        D, res = self._ls_decoder(F)
        full = np.zeros((1, self.m))
        full[:, F] = D
        grad = combine(full, F, coded, dim)
        exact = F.size == self.m
        amp = float(D.max()) if F.size else 1.0
        return DecodeResult(grad, exact, 0.0 if exact else res, amp, int(F.size))


def _int_field(field: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not lo <= value <= hi:
        raise ConfigError(field, value, f"an integer in [{lo}, {hi}]")
    return int(value)


def make_scheme(
    name: str,
    *,
    m: int,
    delta: int,
    n_parts: int = 1,
    assignment: str = "cyclic",
    ordering: str = "optimal",
    decoding: str = "frame",
    k: int | None = None,
    rng: np.random.Generator | None = None,
    A: np.ndarray | None = None,
) -> SchemeBase:
    """Build a scheme from configuration values.

    Parameters
    ----------
    name : {"partial", "original", "uncoded", "ignore-stragglers"}
    m : int
        Workers.
    delta : int
        Load per worker (ignored by "uncoded" / "ignore-stragglers" except for the default k).
    n_parts : int
        ``ell``; for "original", ``s = delta - n_parts``.
    assignment : {"cyclic", "fr", "regular"}
        Ignored when ``A`` is given. "fr" uses groups of ``delta`` workers (``s = delta - 1``).
    ordering : {"optimal", "natural", "random"}
        Partial scheme only.
    decoding : {"frame", "gaussian", "ones"}
        Partial scheme only.
    k : int, optional
        "ignore-stragglers": workers to wait for; default ``m - (delta - n_parts)``.
    rng : numpy.random.Generator, optional
        ``None`` means ``default_rng(0)``.
    A : ndarray, shape (N, m), optional
        Explicit assignment.

    Raises
    ------
    ConfigError
        Unknown names or out-of-range values.
    """
    if name not in SCHEME_NAMES:
        raise ConfigError("scheme", name, f"one of {SCHEME_NAMES}")
    m = _int_field("m", m, 1, 1 << 20)
    delta = _int_field("delta", delta, 1, m)
    n_parts = _int_field("n_parts", n_parts, 1, delta)
    gen = rng if rng is not None else np.random.default_rng(0)
    if name == "uncoded":
        return UncodedScheme(m)
    if name == "ignore-stragglers":
        kk = max(1, m - (delta - n_parts)) if k is None else k
        return IgnoreStragglersScheme(m, _int_field("k", kk, 1, m))
    if assignment not in ("cyclic", "fr", "regular"):
        raise ConfigError("assignment", assignment, "one of ('cyclic', 'fr', 'regular')")
    try:
        if A is not None:
            Av = validate_assignment(A)
            if Av.shape[1] != m:
                raise ConfigError("A", Av.shape, f"an (N, m={m}) 0/1 matrix")
        elif assignment == "cyclic":
            Av = cyclic_assignment(m, delta)
        elif assignment == "fr":
            if m % delta:
                raise ConfigError("delta", delta, f"a divisor of m={m} for assignment='fr'")
            Av = fractional_repetition_assignment(m, delta - 1)
        else:
            Av = regular_assignment(m, delta, gen)
        if name == "original":
            return OriginalScheme(Av, delta - n_parts, n_parts, gen)
        if ordering not in ("optimal", "natural", "random"):
            raise ConfigError("ordering", ordering, "one of ('optimal', 'natural', 'random')")
        if decoding not in ("frame", "gaussian", "ones"):
            raise ConfigError("decoding", decoding, "one of ('frame', 'gaussian', 'ones')")
        if ordering == "optimal":
            orders = optimal_order(Av, n_parts, gen)
        elif ordering == "natural":
            orders = natural_order(Av)
        else:
            orders = random_order(Av, gen)
        B = decoding_matrix(Av, n_parts, decoding, gen)  # type: ignore[arg-type]
        return PartialScheme(Av, n_parts, orders, B, gen)
    except CodingError as exc:
        raise ConfigError(name, {"m": m, "delta": delta, "n_parts": n_parts}, str(exc)) from exc
