"""Checks a parameter server runs before applying a decoded gradient it cannot otherwise vouch for.

An authenticated worker can still send any finite vector. None of these checks needs the
worker's data; each returns a :class:`Verdict` (``ok`` or the reason to reject the round):

* :func:`redundancy_check` -- when more workers answered than the code needs, decode from two
  different decodable subsets and compare. Applies to fixed codes (the original scheme), whose
  coded vectors do not depend on who else answered; a lying worker then makes the two decodes
  disagree far beyond rounding. The tolerance (:func:`redundancy_tolerance`) is relative to the
  magnitude the decodes' sums work at (decoding coefficients times payload norms) and follows
  the payload dtype and the conditioning of the code. The partial-straggler scheme's vectors
  are encoded for the broadcast state, so a subset of them decodes nothing: there the check
  returns ``None`` (not applicable).
* :class:`NormGuard` -- the decoded gradient's norm against recent accepted rounds: at most
  ``factor`` times the median of the last ``window`` accepted nonzero norms; before
  ``min_history`` such rounds, at most ``warmup_factor`` times the initial gradient scale (the
  norm of the gradient at the initial model when the PS can compute it, else the first
  accepted norm is bounded only by ``absolute_max``). Full-batch gradient descent shrinks the
  norm smoothly, so an honest run stays far below these multiples; a scaled, replayed or
  blown-up vector that leaves them is rejected.
* :func:`oracle_check` -- when the PS computes the uncoded gradient anyway (``--verify``), a
  round the decoder calls exact must match it within the predicted decode error (times a
  safety factor). This catches everything, at the price of the PS computing the gradient.
* :func:`model_check` -- the model after the step must be finite and within
  :func:`model_bound` of the initial one; otherwise the step is not applied.

What they cannot catch is documented in ``docs/security.md``: in the partial scheme without the
oracle, a worker can bias a round by anything the norm guard lets through.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from aiogc.coding.base import Scheme
from aiogc.errors import ConfigError

__all__ = [
    "DecodedStep",
    "NormGuard",
    "RoundGuard",
    "Verdict",
    "all_finite",
    "estimate_check",
    "model_bound",
    "model_check",
    "norm_floor",
    "oracle_check",
    "oracle_tolerance",
    "redundancy_check",
    "redundancy_tolerance",
    "scheme_oracle_tolerance",
]

#: Safety factor of :func:`redundancy_tolerance`. Honest payloads (m 8..32, ell 1..2, float32 and
#: float64, 12 seeds each) measured at most 0.41 ``eps32`` and 0.14 ``eps64 * kappa``, i.e. below
#: 1/100 of the tolerance; tests/test_trust_consistency.py asserts < 1/20.
REDUNDANCY_SAFETY = 100.0
#: Safety factor of :func:`redundancy_tolerance` over a compressed upload's rounding unit.
COMPRESSED_SAFETY = 4.0
#: Safety factor over the predicted decode error for the oracle comparison.
ORACLE_SAFETY = 1000.0
#: Smallest oracle tolerance (a predicted error of eps would otherwise leave no room for the
#: encode-side rounding of a float32 payload).
ORACLE_MIN_TOL = 1e-6
#: Safety factor of :func:`oracle_tolerance` over its worst-case rounding bound (the bound is
#: already a worst case; the factor covers the few terms of order eps64 it rounds up).
ORACLE_FP_SAFETY = 4.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """Outcome of one check: ``ok``, or ``check`` / ``reason`` naming why not.

    ``value`` is the measured quantity and ``bound`` the limit it was held to (NaN when the
    check has no numeric bound).
    """

    ok: bool
    check: str
    reason: str = ""
    value: float = float("nan")
    bound: float = float("nan")

    @staticmethod
    def passed(check: str, value: float = float("nan"), bound: float = float("nan")) -> Verdict:
        return Verdict(True, check, "", value, bound)


# ------------------------------------------------------------------------------ redundancy


def redundancy_tolerance(dtype: object, kappa: float = 1.0,
                         safety: float = REDUNDANCY_SAFETY, eps: float | None = None) -> float:
    """``safety * (eps(dtype) + eps(float64) * kappa)``: the largest honest discrepancy,
    relative to the decode scale.

    The first term is the rounding of the payloads and of the decode sums in the payload dtype;
    the second the error of the decoding coefficients themselves, which the scheme solves for in
    float64 from a system of condition number ``kappa``.

    ``eps``: the rounding unit of a compressed upload
    (:attr:`aiogc.config.RunConfig.coded_eps`), whose rows are decoded widened to float64.
    Each decode's sums are then exact to float64, so the payload rounding moves either decode
    by at most ``u = eps / 2`` of the scale and the two by ``eps``: the first term is
    ``COMPRESSED_SAFETY * eps`` (a rigorous bound, times 4), not ``safety * eps``, which at
    eps = 2^-10 would let a lie of 10 % of the decode scale through.
    """
    k = kappa if math.isfinite(kappa) else math.inf
    e64 = float(np.finfo(np.float64).eps)
    if eps is not None:
        return COMPRESSED_SAFETY * eps + safety * e64 * max(1.0, k)
    eps = float(np.finfo(np.dtype(dtype)).eps)  # type: ignore[call-overload]
    k = kappa if math.isfinite(kappa) else math.inf
    return safety * (eps + float(np.finfo(np.float64).eps) * max(1.0, k))


def _system_condition(scheme: Scheme, workers: list[int]) -> float:
    """Condition number of the encoding rows of ``workers`` (rank-limited), or 1 without ``E``
    (:meth:`~aiogc.coding.base.Scheme.encoding_tensor`).

    The decoder solves ``D E_S = T`` for these rows; singular values below 1e-10 of the largest
    are the structural rank deficit of a code with redundancy, not conditioning.
    """
    E = scheme.encoding_tensor()
    if E is None:
        return 1.0
    M = np.asarray(E, dtype=np.float64)[workers].reshape(len(workers), -1)
    sv = np.linalg.svd(M, compute_uv=False)
    if sv.size == 0 or sv[0] == 0:
        return 1.0
    nz = sv[sv > sv[0] * 1e-10]
    return float(nz[0] / nz[-1])


def _finished_state(loads: np.ndarray, workers: Iterable[int]) -> np.ndarray:
    st = np.zeros(loads.shape[0], dtype=np.int64)
    idx = list(workers)
    st[idx] = loads[idx]
    return st


def _decoder(scheme: Scheme, state: np.ndarray) -> tuple[np.ndarray, bool]:
    """The decoding coefficients ``D`` (ell, m) the scheme uses in ``state``, and exactness.

    Decoding is linear in the payloads, so decoding the identity (payload length m, one column
    per worker) returns ``D`` itself: one decode, no access to the scheme's internals.
    """
    m = int(scheme.m)
    ell = int(scheme.n_parts)
    r = scheme.decode_result(np.eye(m), state, ell * m)
    return np.asarray(r.gradient, dtype=np.float64).reshape(ell, m), bool(r.exact)


def redundancy_check(
    scheme: Scheme,
    coded: np.ndarray | Mapping[int, np.ndarray],
    received: Iterable[int],
    dim: int,
    *,
    safety: float = REDUNDANCY_SAFETY,
    eps: float | None = None,
) -> Verdict | None:
    """Decode from two different decodable subsets of ``received`` and compare.

    The subsets are ``received`` without its largest id and without its smallest id: a single
    corrupted vector is either left out of one of them (that decode is right, the other is not)
    or enters both with different decoding coefficients, so the two differ either way.

    The discrepancy is measured against the magnitude the two decodes' sums work at,
    ``scale = sum_j max_u (|D1[u, j]| + |D2[u, j]|) * ||v_j||`` (rounding in the payloads and in
    the sums is a few eps of that), and must stay within :func:`redundancy_tolerance`, which adds
    the error of the decoding coefficients (``eps(float64)`` times the condition number of the
    system they are solved from).

    Parameters
    ----------
    scheme : Scheme
        A send-when-done scheme (``sends_when_done``) with a fixed code; others return None.
    coded : ndarray (m, p) or mapping of worker to ndarray (p,)
        The received payloads (rows of other workers are not read).
    received : iterable of int
        Workers whose vectors arrived.
    dim : int
        Gradient length ``d``.
    safety : float
        Multiple of the rounding scale tolerated (see :func:`redundancy_tolerance`).
    eps : float, optional
        The payloads' rounding unit when not their dtype's (compressed uploads widened).

    Returns
    -------
    Verdict or None
        None when the check does not apply (partial scheme, no spare vector, or the subsets do
        not decode exactly, as in ignore-stragglers). Otherwise ``value`` is
        ``||g1 - g2|| / scale`` and ``bound`` the tolerance.
    """
    if not scheme.sends_when_done:
        return None
    rec = sorted({int(w) for w in received})
    if len(rec) < 3:
        return None
    loads = np.asarray(scheme.loads, dtype=np.int64)
    st1, st2 = _finished_state(loads, rec[:-1]), _finished_state(loads, rec[1:])
    if not (scheme.is_decodable(st1) and scheme.is_decodable(st2)):
        return None
    D1, exact1 = _decoder(scheme, st1)
    D2, exact2 = _decoder(scheme, st2)
    if not (exact1 and exact2):
        return None
    g1 = np.asarray(scheme.decode_result(coded, st1, dim).gradient, dtype=np.float64)
    g2 = np.asarray(scheme.decode_result(coded, st2, dim).gradient, dtype=np.float64)
    dtype = coded.dtype if isinstance(coded, np.ndarray) else np.asarray(coded[rec[0]]).dtype
    kappa = max(_system_condition(scheme, rec[:-1]), _system_condition(scheme, rec[1:]))
    tol = redundancy_tolerance(dtype, kappa, safety, eps)
    weight = (np.abs(D1) + np.abs(D2)).max(axis=0)
    scale = sum(float(weight[w]) * float(np.linalg.norm(np.asarray(coded[w], dtype=np.float64)))
                for w in rec)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: reported below
        diff = float(np.linalg.norm(g1 - g2))
    if not (math.isfinite(diff) and math.isfinite(scale)):
        return Verdict(False, "redundancy", "non-finite two-way decode", diff, tol)
    rel = diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)
    if rel > tol:
        return Verdict(False, "redundancy",
                       f"decodes without worker {rec[-1]} and without worker {rec[0]} differ by "
                       f"{rel:.3g} of the decode scale (tolerance {tol:.3g})", rel, tol)
    return Verdict.passed("redundancy", rel, tol)


# ------------------------------------------------------------------------------ norm guard


def _median(xs: list[float]) -> float:
    """``float(np.median(xs))`` of a short non-empty list, bit for bit (the middle element,
    or the mean ``(a + b) / 2`` of the two middle ones), without numpy's dispatch, which costs
    far more than sorting a window of 16 floats: the PS bounds every round's norm with it."""
    s = sorted(xs)
    n = len(s)
    h = n // 2
    return float(s[h]) if n % 2 else (s[h - 1] + s[h]) / 2.0


class NormGuard:
    """Bound each round's decoded-gradient norm by recent accepted rounds.

    Parameters
    ----------
    window : int
        Accepted norms remembered (the median of these is the reference).
    factor : float
        A norm above ``factor * median(last window accepted)`` is rejected.
    min_history : int
        Rounds accepted before the median is used; until then the warm-up bound applies.
    warmup_factor : float
        Warm-up bound: ``warmup_factor * initial_scale``.
    initial_scale : float, optional
        Norm of the gradient at the initial model, when the PS can compute it. Without it the
        warm-up bound is the median of what was accepted so far times ``warmup_factor`` (the
        first round is bounded by ``absolute_max`` only).
    absolute_max : float
        Norms above this are always rejected (and non-finite ones).
    floor : float
        Norms at or below this carry no scale: a round decoded from round-off
        (one finished worker, an estimate ~1e-16) is applied but never becomes the reference
        that later honest rounds are measured against. :func:`norm_floor` derives it from the
        payload dtype, ``d`` and a data scale; 0 keeps only exact zeros out.
    """

    def __init__(
        self,
        *,
        window: int = 16,
        factor: float = 10.0,
        min_history: int = 3,
        warmup_factor: float = 100.0,
        initial_scale: float | None = None,
        absolute_max: float = 1e100,
        floor: float = 0.0,
    ) -> None:
        if type(window) is not int or window < 1:
            raise ConfigError("window", window, "an integer >= 1")
        if type(min_history) is not int or not 1 <= min_history <= window:
            raise ConfigError("min_history", min_history, f"an integer in [1, {window}]")
        for name, v in (("factor", factor), ("warmup_factor", warmup_factor)):
            if not (math.isfinite(v) and v > 1.0):
                raise ConfigError(name, v, "a finite number > 1")
        if not (math.isfinite(absolute_max) and absolute_max > 0):
            raise ConfigError("absolute_max", absolute_max, "a finite number > 0")
        if initial_scale is not None and not (math.isfinite(initial_scale)
                                              and initial_scale >= 0):
            raise ConfigError("initial_scale", initial_scale, "a finite number >= 0 or None")
        self.window = window
        self.factor = factor
        self.min_history = min_history
        self.warmup_factor = warmup_factor
        self.initial_scale = initial_scale
        self.absolute_max = absolute_max
        if not (math.isfinite(floor) and floor >= 0):
            raise ConfigError("floor", floor, "a finite number >= 0")
        self.floor = float(floor)
        self._accepted: deque[float] = deque(maxlen=window)

    @property
    def history(self) -> tuple[float, ...]:
        """Accepted norms, oldest first (at most ``window``)."""
        return tuple(self._accepted)

    def _scale_history(self) -> list[float]:
        # a zero gradient carries no scale: a converged (or idle) stretch must not make the
        # next nonzero gradient look infinitely large
        # (and neither does a round-off-sized one, below the dtype-relative floor)
        fl = self.floor
        return [x for x in self._accepted if x > fl]

    def bound(self) -> float:
        """The largest norm the next round may have."""
        hist = self._scale_history()
        if len(hist) >= self.min_history:
            b = self.factor * _median(hist)
        elif self.initial_scale is not None and self.initial_scale > 0:
            b = self.warmup_factor * self.initial_scale
            if hist:
                b = max(b, self.warmup_factor * _median(hist))
        elif hist:
            b = self.warmup_factor * _median(hist)
        else:
            b = self.absolute_max
        return min(b, self.absolute_max)

    def check(self, norm: float) -> Verdict:
        """Whether a gradient of this norm may be applied (does not record it)."""
        b = self.bound()
        if not math.isfinite(norm):
            return Verdict(False, "norm", f"gradient norm {norm} is not finite", norm, b)
        if norm <= self.floor:
            return Verdict.passed("norm", norm, b)  # round-off sized: harmless, no scale
        if norm > b:
            return Verdict(False, "norm",
                           f"gradient norm {norm:.3g} exceeds {b:.3g} "
                           f"({self._describe()})", norm, b)
        return Verdict.passed("norm", norm, b)

    def accept(self, norm: float) -> None:
        """Record the norm of a gradient that was applied."""
        self._accepted.append(float(norm))

    def _describe(self) -> str:
        hist = self._scale_history()
        if len(hist) >= self.min_history:
            return f"{self.factor:g} x median of the last {len(hist)} accepted nonzero norms"
        if (self.initial_scale is not None and self.initial_scale > 0) or hist:
            return f"{self.warmup_factor:g} x the initial gradient scale"
        return "absolute maximum"


def norm_floor(dtype: object, dim: int, scale: float = 1.0, safety: float = 64.0) -> float:
    """``safety * eps(dtype) * sqrt(dim) * scale``: gradient norms at or below this are
    round-off of a sum whose terms are of size ``scale`` (per entry), not a gradient.

    ``scale`` is a data scale (per-entry magnitude of the chunk gradients; 1 when unknown).
    In float64 with ``dim`` 12 and scale 1 this is ~5e-14: the ~1e-16 estimate of a round
    decoded from one finished worker falls below it, any honest gradient of a learning run
    far above it.
    """
    eps = float(np.finfo(np.dtype(dtype)).eps)  # type: ignore[call-overload]
    return float(safety * eps * math.sqrt(max(1, int(dim))) * max(0.0, float(scale)))


# ------------------------------------------------------------------------------ oracle, model


def oracle_check(rel_error: float, predicted_error: float, *, exact: bool,
                 safety: float = ORACLE_SAFETY, tol: float | None = None) -> Verdict | None:
    """A round decoded as exact must match the PS's own uncoded gradient.

    ``rel_error`` is the PS's ``||g_hat - g|| / ||sum_i |g_i| ||`` (see the PS's verify);
    the tolerance is ``tol`` when given (:func:`scheme_oracle_tolerance`), else
    ``max(ORACLE_MIN_TOL, safety * predicted_error)``. Approximate rounds differ from the
    oracle by design: None (not applicable); so is a NaN ``rel_error`` (no oracle this round).
    """
    if not exact or math.isnan(rel_error):
        return None
    if tol is None:
        tol = max(ORACLE_MIN_TOL, safety * predicted_error)
    if not rel_error <= tol:  # also catches inf
        return Verdict(False, "oracle",
                       f"decoded gradient differs from the PS's own by {rel_error:.3g} "
                       f"(tolerance {tol:.3g})", rel_error, tol)
    return Verdict.passed("oracle", rel_error, tol)


def oracle_tolerance(dtype: object, *, kappa: float, n_parts: int, max_load: int,
                     n_chunks: int, solve_condition: float = 1.0,
                     safety: float = ORACLE_FP_SAFETY) -> float:
    """Largest ``rel_error`` an honest exact round can show, from floating-point error alone.

    ``rel_error = ||g_hat - g|| / || sum_i |g_i| ||`` with the oracle's chunk gradients ``g_i``
    evaluated **at the model the workers were sent** (the model rounded to the payload dtype;
    against the float64 model the difference of the two gradients adds a term no rounding
    bound covers). Derivation (docs/security.md, "The oracle's tolerance"): each payload entry
    is rounded once to the payload dtype, ``|delta| <= u |p|`` with ``u = eps(dtype) / 2``;
    each of the ``ceil(d / ell)`` positions is decoded from an ``ell x ell`` system of
    condition ``kappa``, so its error is at most ``u * sqrt(ell) * kappa`` times the magnitude of
    the ``ell`` parts, i.e. of ``sum_i |g_i|`` there; the float64 sums of at most ``max_load``
    terms in the encoder add ``max_load * eps64`` to ``u``, decoding coefficients solved in
    float64 from a system of condition ``solve_condition`` add ``solve_condition * eps64``,
    and the oracle's own sum over ``n_chunks`` chunks ``n_chunks * eps64``. Summed over
    positions (a norm of per-position bounds), ``dim`` does not enter.

    Parameters
    ----------
    dtype : numpy dtype or str
        The payload dtype.
    kappa : float
        Error amplification of the decode: the partial scheme's worst ``B_U`` condition
        number (the PS's ``predicted_error / eps(dtype)``); 1 for uncoded and
        ignore-stragglers; for a fixed code ``sqrt(ell) * max_u sum_j |D_uj| max|E_j|``.
    n_parts, max_load, n_chunks : int
        ``ell``, the largest number of chunks a worker sums, ``N``.
    solve_condition : float
        Condition number of the system the decoding coefficients are solved from (1 when
        they are exact constants; the fixed codes' encoding rows, ``_system_condition``).
    safety : float

    Returns
    -------
    float
        ``safety * (kappa * sqrt(ell) * (u + (max_load + solve_condition) * eps64)
        + n_chunks * eps64)``.
    """
    u = float(np.finfo(np.dtype(dtype)).eps) / 2  # type: ignore[call-overload]
    e64 = float(np.finfo(np.float64).eps)
    k = kappa if math.isfinite(kappa) else math.inf
    sc = solve_condition if math.isfinite(solve_condition) else math.inf
    return safety * (k * math.sqrt(max(1, int(n_parts)))
                     * (u + (max(1, int(max_load)) + max(1.0, sc)) * e64)
                     + max(1, int(n_chunks)) * e64)


def scheme_oracle_tolerance(scheme: Scheme, dtype: object, predicted_error: float) -> float | None:
    """:func:`oracle_tolerance` for ``scheme``, or None where it is not the better bound.

    ``kappa = predicted_error / eps(dtype)`` (the PS's worst condition number of the partial
    scheme's ``B``). Fixed codes (a scheme with an
    :meth:`~aiogc.coding.base.Scheme.encoding_tensor`: original, uncoded, ignore-stragglers)
    return None and keep the default tolerance: their ``kappa`` is the decoder's coefficient
    amplification, not the PS's ``predicted_error`` (10^3..10^4 for the original scheme's
    decoders measured, which makes the worst-case bound looser than the default; for uncoded
    and ignore-stragglers it is 1, but the PS does not say so yet).

    Valid only when the oracle evaluates the chunk gradients at the model the workers were sent
    (``chunk_grads_fn(task, payload_dtype)``); in float64 that is the PS's own model.
    """
    if scheme.encoding_tensor() is not None:
        return None
    eps = float(np.finfo(np.dtype(dtype)).eps)  # type: ignore[call-overload]
    return oracle_tolerance(dtype, kappa=max(1.0, predicted_error / eps),
                            n_parts=int(scheme.n_parts),
                            max_load=int(np.max(np.asarray(scheme.loads))),
                            n_chunks=int(scheme.n_chunks))


def estimate_check(gradient: np.ndarray, honest: np.ndarray, scale: float,
                   predicted_error: float, amplification: float = 1.0, *,
                   safety: float = ORACLE_SAFETY, rounding: float = 0.0) -> Verdict:
    """An approximate round against the estimate honest workers would have produced.

    ``honest`` is the decoder's output on payloads the PS re-encoded from its own uncoded
    chunk gradients for the same state (the oracle projected onto what finished): an honest
    round differs from it only by rounding, so the tolerance is the oracle's,
    ``max(ORACLE_MIN_TOL, safety * predicted_error * max(1, amplification))``, relative to
    ``scale = ||sum_i |g_i| ||``. Any lie that moves the decode by more is rejected, whatever
    its form (scale, sign, blow-up, bias), so an applied approximate step is within
    ``tol * scale`` of the honest approximate step.

    Parameters
    ----------
    gradient, honest : ndarray, shape (d,)
    scale : float
    predicted_error : float
        ``cond(B) * eps(payload dtype)``.
    amplification : float
        The decode's error amplification (condition of the system it solved; NaN -> 1).
    rounding : float
        A compressed upload's rounding bound relative to ``scale``
        (:func:`aiogc.coding.compress.rounding_bound`), added twice to the tolerance.
    """
    amp = amplification if math.isfinite(amplification) and amplification > 1 else 1.0
    tol = max(ORACLE_MIN_TOL, safety * predicted_error * amp) + 2.0 * rounding
    with np.errstate(over="ignore", invalid="ignore"):
        d = np.asarray(gradient, dtype=np.float64) - np.asarray(honest, dtype=np.float64)
        err = float(math.sqrt(d.dot(d)))
    rel = err / scale if scale > 0 else (0.0 if err == 0 else math.inf)
    if not rel <= tol:
        return Verdict(False, "estimate",
                       f"approximate decode differs from the honest estimate of the same "
                       f"finished chunks by {rel:.3g} (tolerance {tol:.3g})", rel, tol)
    return Verdict.passed("estimate", rel, tol)


def model_bound(initial_model: np.ndarray, *, factor: float = 1e6, floor: float = 1e6) -> float:
    """``max(floor, factor * ||w0||_inf)``: the largest entry a model may reach.

    A learning run that moves a weight a million times past the initial scale has diverged; a
    model past this bound is not applied (the round fails) rather than propagated to workers.
    """
    w0 = np.asarray(initial_model, dtype=np.float64)
    scale = float(np.max(np.abs(w0))) if w0.size else 0.0
    if not math.isfinite(scale):
        raise ConfigError("initial_model", "non-finite", "a finite initial model")
    return max(floor, factor * scale)


def all_finite(x: np.ndarray) -> bool:
    """``np.isfinite(x).all()``, in one read of ``x`` and no temporary for a float32/float64
    vector.

    The vector's sum of squares (a BLAS dot) is finite unless some entry is NaN or infinite
    (NaN propagates, the squares of infinities add up to inf, no term is negative) or the sum
    overflows (entries above ~1e154 in float64, ~1e19 in float32). A finite sum therefore
    proves every entry finite; only a non-finite one falls back to the entrywise test.

    Parameters
    ----------
    x : ndarray, any shape

    Returns
    -------
    bool
    """
    a = np.asarray(x)
    if a.ndim == 1 and (a.dtype == np.float64 or a.dtype == np.float32):
        with np.errstate(over="ignore", invalid="ignore"):
            if math.isfinite(a.dot(a)):
                return True
    return bool(np.isfinite(a).all())


def model_check(model: np.ndarray, bound: float) -> Verdict:
    """The model after a step must be finite and ``||w||_inf <= bound``."""
    w = np.asarray(model)
    # max |w| from the two extremes (no |w| temporary): NaN or inf iff some entry is (max
    # and min propagate NaN)
    hi, lo = (float(w.max()), float(w.min())) if w.size else (0.0, 0.0)
    top = max(abs(hi), abs(lo)) if math.isfinite(hi) and math.isfinite(lo) else math.inf
    if not math.isfinite(top):
        bad = int(np.flatnonzero(~np.isfinite(w))[0])
        return Verdict(False, "model", f"model entry {bad} would be {w[bad]!r}",
                       float("inf"), bound)
    if top > bound:
        return Verdict(False, "model", f"model max |w| would be {top:.3g} > bound {bound:.3g}",
                       top, bound)
    return Verdict.passed("model", top, bound)


# ------------------------------------------------------------------------------ all together


@dataclass(frozen=True)
class DecodedStep:
    """What the decoder made of a round, as :meth:`RoundGuard.check` judges it.

    Attributes
    ----------
    gradient : ndarray, shape (d,)
        The decoded gradient.
    exact : bool
        Whether the decoder reports the round as exact.
    rel_error : float
        The PS's decode error against its own uncoded gradient (NaN: not verified).
    rounding : float
        A compressed upload's rounding bound (:func:`aiogc.coding.compress.rounding_bound`)
        relative to the oracle's scale ``||sum_i |g_i| ||``; twice it is added to the oracle's
        tolerance (0: uncompressed).
    evaluation : float or None
        How far the oracle's own chunk gradients may be from the workers' (two float64
        evaluations summing in different orders: another BLAS thread count, another CPU;
        :func:`aiogc.training.tasks.evaluation_error_fn`), relative to the same scale, added
        to the tolerance derived from the payload dtype; 0: the two are equal bit for bit;
        None: unknown, so that tolerance does not apply and the default one does.
    """

    gradient: np.ndarray
    exact: bool
    rel_error: float = float("nan")
    rounding: float = 0.0
    evaluation: float | None = 0.0


class RoundGuard:
    """The checks above in the order a PS runs them on each decoded gradient.

    One instance per run. :meth:`check` returns the first failing :class:`Verdict` (the round
    is then recorded as rejected and the model left unchanged) or None with the model the step
    would produce; :meth:`accept` records an applied step. ``rejected`` counts rejections by
    check, for the PS's statistics.

    Parameters
    ----------
    initial_model : ndarray, shape (d,)
        Sets :func:`model_bound`.
    predicted_error : float
        The PS's predicted worst relative decode error (``cond(B) * eps``), for the oracle.
    initial_scale : float, optional
        Norm of the true gradient at the initial model, when known (see :class:`NormGuard`).
    norm_guard : NormGuard, optional
        Default ``NormGuard(initial_scale=initial_scale)``.
    coded_eps : float, optional
        A compressed upload's rounding unit (the coded rows arrive widened to float64), for
        the redundancy check's tolerance.
    """

    def __init__(
        self,
        initial_model: np.ndarray,
        *,
        predicted_error: float,
        initial_scale: float | None = None,
        norm_guard: NormGuard | None = None,
        coded_eps: float | None = None,
    ) -> None:
        self.coded_eps = coded_eps
        self.bound = model_bound(initial_model)
        self.predicted_error = float(predicted_error)
        self.norms = norm_guard if norm_guard is not None else NormGuard(
            initial_scale=initial_scale)
        self.rejected: dict[str, int] = {}
        self.checked = 0
        self.last_norm = float("nan")
        #: the checks that passed (not "not applicable") in the last :meth:`check`
        self.last_passed: tuple[str, ...] = ()

    def check(
        self,
        *,
        scheme: Scheme,
        coded: np.ndarray | Mapping[int, np.ndarray],
        received: Iterable[int],
        dim: int,
        decoded: DecodedStep,
        model: np.ndarray,
        learning_rate: float,
        step: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    ) -> tuple[Verdict | None, np.ndarray | None]:
        """Run every applicable check; ``(failure, None)`` or ``(None, new_model)``.

        Parameters
        ----------
        scheme, coded, received, dim
            As for :func:`redundancy_check` (``received``: workers whose vectors were used or
            arrived in this round).
        decoded : DecodedStep
            The decoded gradient, shape (d,), whether the decoder reports the round as exact,
            and the PS's decode error against its own uncoded gradient (NaN: not verified).
        model : ndarray, shape (d,)
            The model before the step (not modified).
        learning_rate : float
        step : callable ``(model, gradient) -> new model``, optional
            The task's optimizer (its state is the caller's to commit); default plain SGD
            ``model - learning_rate * gradient``. The model bound applies to its result.
        """
        self.checked += 1
        exact, rel_error = decoded.exact, decoded.rel_error
        g = np.asarray(decoded.gradient, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            norm = float(np.linalg.norm(g))
        self.last_norm = norm
        verdicts: list[Verdict | None] = [self.norms.check(norm)]
        if verdicts[0] is not None and verdicts[0].ok:
            verdicts.append(redundancy_check(scheme, coded, received, dim, eps=self.coded_eps))
            # the tolerance derived from the payload dtype's own error where it is the better
            # bound (valid because the oracle's gradients are taken at the model the workers
            # were sent: training.tasks.chunk_grads_fn(task, payload_dtype))
            tol = scheme_oracle_tolerance(scheme, _payload_dtype(coded), self.predicted_error)
            if tol is not None:  # valid only beside the oracle's own evaluation difference
                tol = None if decoded.evaluation is None else tol + decoded.evaluation
            if decoded.rounding > 0:  # a compressed upload: its rounding, bounded per round
                tol = (tol if tol is not None else max(
                    ORACLE_MIN_TOL, ORACLE_SAFETY * self.predicted_error)) + 2 * decoded.rounding
            verdicts.append(oracle_check(rel_error, self.predicted_error, exact=exact, tol=tol))
        self.last_passed = ()
        for v in verdicts:
            if v is not None and not v.ok:
                self.rejected[v.check] = self.rejected.get(v.check, 0) + 1
                return v, None
        self.last_passed = tuple(v.check for v in verdicts if v is not None)
        with np.errstate(over="ignore", invalid="ignore"):
            if step is None:
                # model - learning_rate * g bit for bit (a - b is a + (-b)), in one fresh
                # array instead of a temporary and the result
                new = np.multiply(g, -learning_rate)
                new += np.asarray(model, dtype=np.float64)
            else:
                new = np.asarray(step(model, g), dtype=np.float64)
        mv = model_check(new, self.bound)
        if not mv.ok:
            self.rejected[mv.check] = self.rejected.get(mv.check, 0) + 1
            return mv, None
        return None, new

    def accept(self, gradient_norm: float | None = None) -> None:
        """The step was applied: its norm (default: the last checked) joins the history."""
        self.norms.accept(self.last_norm if gradient_norm is None else gradient_norm)


def _payload_dtype(coded: Mapping[int, np.ndarray] | np.ndarray) -> np.dtype:
    """The dtype the coded vectors arrived in (float64 when there are none)."""
    if isinstance(coded, np.ndarray):
        return coded.dtype
    for v in coded.values():
        return np.asarray(v).dtype
    return np.dtype(np.float64)
