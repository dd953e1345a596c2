"""Baseline schemes run through the same interface: original gradient coding, uncoded,
ignore-stragglers, each registered here (the partial scheme registers in its own module).

Original gradient coding keeps a fixed encoding tensor ``E`` of shape ``(m, N, ell)``:
worker ``j`` sends ``sum_{i,k} E[j, i, k] g_i^(k)`` once it finished *all* its chunks. Any
``m - s`` finished workers decode exactly; with fewer, the PS uses least-squares optimal
decoding coefficients (Glasgow and Wootters), which are exact whenever the target lies in the
span of what arrived. Every baseline waits for its *earliest* exact moment, so comparisons do
not flatter the partial scheme (``tests/test_coding_baselines.py`` checks this against brute
force over arrival orders):

* fractional repetition (``"fr"``, and ``"polynomial"`` on a fractional-repetition assignment
  with groups of exactly ``s + ell``): decodable as soon as every group has ``ell`` finished
  workers (``ell = 1``: one per group), since a group's workers all send functions of the same
  chunks; the ``"fr"`` decoder adds one finished worker's vector per group.
* Tandon's cyclic code and the polynomial code otherwise: any ``m - s`` finished workers (no
  smaller set spans the all-ones target for a generic ``H`` / distinct ``alpha``).
* uncoded: all ``m``; ignore-stragglers: ``k`` finished workers (approximate unless all).

Constructions:

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

from collections.abc import Mapping, Sequence

import numpy as np

from aiogc.coding.assignments import (
    is_cyclic,
    is_fractional_repetition,
    validate_assignment,
)
from aiogc.coding.base import DecodeResult, SchemeBase, combine, encode_rows
from aiogc.coding.orderings import natural_order
from aiogc.coding.portable import poly, solve
from aiogc.coding.registry import (
    SchemeParams,
    SchemeSpec,
    build_assignment,
    register_scheme,
)
from aiogc.errors import CodingError

__all__ = [
    "IgnoreStragglersScheme",
    "OriginalScheme",
    "UncodedScheme",
]

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

    # ---- capabilities -------------------------------------------------------------------
    def digest_arrays(self) -> Sequence[tuple[str, np.ndarray]]:
        """The encoding tensor ``E`` (Tandon's construction draws it from the seed)."""
        return (("E", self.E),)

    def fixed_coefficients(self, worker: int) -> np.ndarray:
        """:meth:`coefficients`: the code is fixed, rows (loads[worker], ell)."""
        return self.coefficients(worker)

    def encoding_tensor(self) -> np.ndarray:
        """``E`` (m, N, ell)."""
        return self.E

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

    def exact_states(self, states: np.ndarray) -> np.ndarray:
        """:meth:`is_decodable` of each state, vectorised: shape (R,)."""
        S = np.asarray(states, dtype=np.int64)
        fin = (self.loads[None, :] == S) & (self.loads[None, :] > 0)
        return np.asarray(fin.sum(axis=1) >= self._need())

    def decode_times(self, arrivals: np.ndarray) -> np.ndarray:
        """The ``need``-th smallest vector arrival per trial: shape (R,); ``inf`` if never."""
        done = self.done_times(arrivals)
        need = self._need()
        return np.asarray(np.partition(done, need - 1, axis=1)[:, need - 1])

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
        if self.is_decodable(c):
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
        return DecodeResult(grad, exact, res, self._amplification(D, used), int(used.size),
                            full)


def _check_original_args(Av: np.ndarray, s: object, n_parts: object, construction: str) -> int:
    """Validate OriginalScheme's arguments; returns ``ell``."""
    m = Av.shape[1]
    if isinstance(s, bool) or not isinstance(s, int | np.integer) or not 0 <= s < m:
        raise CodingError(f"s={s!r} is out of range: expected an int in [0, {m - 1}]")
    if isinstance(n_parts, bool) or not isinstance(n_parts, int | np.integer) or n_parts < 1:
        raise CodingError(f"n_parts={n_parts!r} must be an int >= 1")
    if construction not in CONSTRUCTIONS:
        raise CodingError(f"construction={construction!r} not in {CONSTRUCTIONS}")
    return int(n_parts)


def _auto_construction(Av: np.ndarray, s: int, ell: int) -> str:
    """"fr" / "tandon" when the assignment is that structure with groups / delta of s + 1."""
    if ell == 1 and is_fractional_repetition(Av) == s + 1:
        return "fr"
    if ell == 1 and is_cyclic(Av) == s + 1:
        return "tandon"
    return "polynomial"


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
        ell = _check_original_args(Av, s, n_parts, construction)
        self.s = int(s)
        if construction == "auto":
            construction = _auto_construction(Av, self.s, ell)
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
        # Groups of a fractional-repetition assignment decode independently when every chunk of
        # a group has the same encoding polynomial up to the group's own vectors: always for
        # "fr"; for "polynomial" when the group size is s + ell (no extra roots among holders).
        g = is_fractional_repetition(Av)
        self.groups: list[np.ndarray] | None = None
        self._group_of = np.zeros(self.m, dtype=np.int64)
        if g is not None and (construction == "fr" or g == self.s + ell):
            first: dict[bytes, list[int]] = {}
            for j in range(self.m):
                first.setdefault(Av[:, j].tobytes(), []).append(j)
            self.groups = [np.asarray(v, dtype=np.int64) for v in first.values()]
            for gi, members in enumerate(self.groups):
                self._group_of[members] = gi

    def _need(self) -> int:
        return self.m - self.s

    @staticmethod
    def setup_bytes(m: int, delta: int, n_parts: int) -> int:
        """Estimated peak bytes of building the scheme and decoding one round, ``N = m``: the
        assignment (N x m bytes), the encoding tensor ``E`` (m x N x ell float64) and the
        least-squares decoder's system and work space (~3 more of that size)."""
        N = m
        return N * m + 4 * m * N * n_parts * 8

    def is_decodable(self, state: object) -> bool:
        """Any ``m - s`` finished workers; with groups, ``ell`` finished workers per group."""
        if self.groups is None:
            return self._finished_count_rule(state, self._need())
        F = self.finished(state)
        per_group = np.bincount(self._group_of[F], minlength=len(self.groups))
        return bool(per_group.min() >= self.n_parts)

    def exact_states(self, states: np.ndarray) -> np.ndarray:
        """:meth:`is_decodable` of each state, vectorised: shape (R,)."""
        if self.groups is None:
            return super().exact_states(states)
        S = np.asarray(states, dtype=np.int64)
        fin = (self.loads[None, :] == S) & (self.loads[None, :] > 0)
        per_group = np.stack([fin[:, g].sum(axis=1) for g in self.groups], axis=1)
        return np.asarray(per_group.min(axis=1) >= self.n_parts)

    def decode_times(self, arrivals: np.ndarray) -> np.ndarray:
        """Closed form of :meth:`is_decodable` per trial: shape (R,); ``inf`` if never.

        With groups: the latest over groups of the group's ``ell``-th vector arrival;
        otherwise the ``(m - s)``-th arrival.
        """
        if self.groups is None:
            return super().decode_times(arrivals)
        done = self.done_times(arrivals)
        ell = self.n_parts
        per_group = [np.partition(done[:, g], ell - 1, axis=1)[:, ell - 1] for g in self.groups]
        return np.asarray(np.max(np.stack(per_group, axis=1), axis=1))

    def _tandon(self, rng: np.random.Generator) -> np.ndarray:
        m, s = self.m, self.s
        H = rng.standard_normal((s, m))
        if s > 0:
            H[:, -1] = -H[:, :-1].sum(axis=1)
        E = np.zeros((m, m, 1))
        supp = (np.arange(m)[:, None] + np.arange(s + 1)) % m  # (m, s+1): worker j's chunks
        rows = np.ones((m, s + 1))
        if s > 0:
            # portable: the PS and workers on other CPUs must get the bits the digest covers
            mats = np.transpose(H[:, supp[:, 1:]], (1, 0, 2))  # (m, s, s)
            rows[:, 1:] = solve(mats, -H[:, supp[:, 0]].T)
        E[np.arange(m)[:, None], supp, 0] = rows
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
            z = poly(a[roots])  # descending, z[0] = 1
            T = np.zeros((ell, ell))
            for v in range(ell):
                for t in range(v + 1):
                    T[v, t] = z[v - t] if v - t < z.size else 0.0
            # column u: r_iu, descending coefficients (T^-1, one column per system)
            Rcoef = solve(np.broadcast_to(T, (ell, ell, ell)), np.eye(ell)).T
            zv = np.polyval(z, a[hold])
            for u in range(ell):
                E[hold, i, u] = zv * np.polyval(Rcoef[:, u], a[hold])
        return E

    def _exact_decoder(self, F: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.construction == "fr" and self.groups is not None:
            # one finished worker per group sends the plain sum of that group's chunks
            used = np.sort(np.array([F[self._group_of[F] == gi][0]
                                     for gi in range(len(self.groups))], dtype=np.int64))
            return np.ones((1, used.size)), used
        k = self.m - self.s
        if self.construction != "polynomial" or F.size < k:
            return self._ls_decoder(F)[0], F
        assert self.alphas is not None
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

    def exact_states(self, states: np.ndarray) -> np.ndarray:
        """Exact only when every worker finished: shape (R,)."""
        S = np.asarray(states, dtype=np.int64)
        return np.asarray((self.loads[None, :] == S).all(axis=1))

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
        return DecodeResult(grad, exact, 0.0 if exact else res, amp, int(F.size), full)


def _build_original(p: SchemeParams) -> OriginalScheme:
    return OriginalScheme(build_assignment(p), p.delta - p.n_parts, p.n_parts, p.rng)


def _build_uncoded(p: SchemeParams) -> UncodedScheme:
    return UncodedScheme(p.m)


def _ignore_k(p: SchemeParams) -> int:
    return max(1, p.m - (p.delta - p.n_parts)) if p.k is None else p.k


def _build_ignore(p: SchemeParams) -> IgnoreStragglersScheme:
    return IgnoreStragglersScheme(p.m, _ignore_k(p))


register_scheme(SchemeSpec(
    name="original", build=_build_original, sends_when_done=True,
    waiting="any m - s finished workers; fractional repetition: ell finished per group",
    exactness="exact once decodable; least-squares optimal (Glasgow-Wootters) before",
    decoder="fr: one finished worker per group; tandon / polynomial: the construction's "
    "decoder from m - s workers, least squares from fewer",
    min_redundancy=1, setup_bytes=OriginalScheme.setup_bytes,
    assignment_refusals=(("speed-aware", (
        "original is built here for equal loads (Tandon's code needs the cyclic assignment, "
        "fr the fractional-repetition one); unequal loads would leave only its polynomial "
        "construction, not enabled for speed-aware: use partial or stream-chunks")),)))
register_scheme(SchemeSpec(
    name="uncoded", build=_build_uncoded, sends_when_done=True,
    waiting="all m workers finished", exactness="exact only with every worker",
    decoder="sum of the vectors that arrived", forced_n_parts=1, assignments=(),
    min_finished=lambda p: p.m))
register_scheme(SchemeSpec(
    name="ignore-stragglers", build=_build_ignore, sends_when_done=True,
    waiting="k finished workers (default m - (delta - 1))",
    exactness="approximate unless all m finished",
    decoder="(N / r) times the sum of the r vectors that arrived", forced_n_parts=1,
    assignments=(), uses_k=True, min_finished=_ignore_k))
