"""Adaptive, speed-aware chunk orders (``ordering="adaptive"``).

The static optimal order (:func:`~aiogc.coding.orderings.optimal_order`) minimises the worst
case over *all* speeds. A real cluster has persistent partial stragglers: the same slow workers
round after round. The PS already sees every worker's chunk-count reports; this module turns
them into per-worker speed estimates and, between rounds, into orders that minimise the trigger
time under those estimates.

**Estimator** (:func:`round_samples`, :class:`SpeedEstimator`). From one round's accepted
reports ``(ps_time, worker, count, elapsed_s)`` and the instant ``t_stop`` the round stopped
computing (its trigger, else its end), worker ``j`` that last reported ``c`` chunks at
``elapsed_s = e`` gives one sample of its per-chunk time::

    tau_j = max(e / c, E_j / (c + 1))        (the first term only when c = load_j)

where ``E_j = (t_stop - t_start) - L_j`` is how long it had been computing when the round
stopped, ``L_j`` the smallest ``(ps_time - t_start) - elapsed_s`` of its reports (the
round-trip latency its reports saw; 0 without reports). The second term is a *censored* lower
bound: a worker that finished ``c`` chunks in ``E_j`` seconds takes at least ``E_j / (c+1)`` per
chunk, so a worker that reported nothing (``c = 0``) still gets the sample ``E_j``. The
estimate is the **median of the last** :data:`WINDOW` **samples** of each worker (3: one
outlier round moves no estimate); a worker never observed gets the median of the others.

**Orders** (:func:`speed_orders`). Under the plug-in model "worker ``j`` finishes its ``p``-th
chunk at ``p * tau_j``", the trigger time of orders ``pi`` is
``T(pi) = max_i (ell-th smallest p_j(i) tau_j over the holders j of chunk i)``.
The minimum over all orders is found **exactly** at any size: ``T`` is feasible iff every chunk
can get ``ell`` distinct holders among the first ``k_j(T) = min(load_j, floor(T / tau_j))``
positions of each worker, a bipartite b-matching decided by one max-flow (source -> worker
``k_j``, worker -> held chunk 1, chunk -> sink ``ell``); bisection over the candidate values
``p * tau_j`` finds the smallest feasible one. Worker ``j`` then processes its matched chunks
first, the rest after, each group in the static order's relative sequence. What is heuristic is
the model: the expectation of the trigger time under noise is replaced by its value at the
median speeds, and a worker whose median is within a factor :data:`DISTINCT` (2.5) of the
cluster's median is planned at the cluster's median. The new orders are adopted only if
they beat the static order's plug-in time by more than :data:`MARGIN` (15 %); otherwise the
static optimal order is kept, so that equal workers (i.i.d. delays), whose estimates differ
only by noise, keep the worst-case optimum.

**Change points.** The 3-round median needs two rounds to follow a slow set that moves, and
orders planned for the old set can be worse than the static ones under the new (measured:
+0.5 % under the moving fail-slow trace). So adopted orders must also not lose to the static
order under the newest round's samples alone (:meth:`SpeedEstimator.latest`, threshold
:data:`CONFIRM`); when they do (a moved set, or one outlier round) the round runs the static
optimum, and the estimates themselves are unchanged (one outlier still moves no median).

**Cost.** The search runs between a round's decode and the next round_start. It is warm
started: when no time below the last chosen orders' plug-in time is feasible, they are still
optimal (one max-flow); candidates above the adoption cap ``(1 - MARGIN) T_static`` are never
searched. At m = 24, δ = 6, ℓ = 3 this is 2.0 max-flows per round under persistent
stragglers (5.9 for the plain bisection) and 0.3 under i.i.d. delays (1.25), ~0.25 ms each.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from statistics import median

import numpy as np
from scipy.sparse import csr_array
from scipy.sparse.csgraph import maximum_flow

from aiogc.coding.base import Scheme
from aiogc.coding.orderings import positions, validate_orders
from aiogc.errors import CodingError

__all__ = [
    "MARGIN",
    "WINDOW",
    "AdaptiveOrdering",
    "SpeedEstimator",
    "flatten_orders",
    "plugin_trigger_time",
    "policy_for",
    "round_samples",
    "speed_orders",
    "unflatten_orders",
]

#: Samples per worker whose median is its speed estimate (3: robust to one outlier round).
WINDOW = 3
#: New orders are used only when their plug-in trigger time is below (1 - MARGIN) times the
#: static order's: noise in the estimates of equal workers must not move the order.
MARGIN = 0.15
#: A worker's estimate counts as different from the cluster's median only beyond this ratio
#: (either way); within it, the worker is planned at the median (the estimates of equal
#: workers under i.i.d. delays differ by noise, and planning on noise loses, measured).
DISTINCT = 2.5
#: The change-point check: adopted orders must also gain this much under the newest round's
#: samples alone (0: merely not lose).
CONFIRM = 0.0


def flatten_orders(orders: Sequence[Sequence[int]] | Sequence[np.ndarray]) -> tuple[int, ...]:
    """``orders[0] + orders[1] + ...`` as one tuple of ints (the wire form)."""
    return tuple(int(i) for o in orders for i in o)


def unflatten_orders(A: np.ndarray, flat: Sequence[int]) -> list[np.ndarray]:
    """Inverse of :func:`flatten_orders` for assignment ``A`` (N, m): split by the loads and
    validate every worker's part (a permutation of its chunks), else :class:`CodingError`."""
    loads = np.asarray(A, dtype=bool).sum(axis=0)
    if len(flat) != int(loads.sum()):
        raise CodingError(f"orders of {len(flat)} entries: expected sum of loads "
                          f"{int(loads.sum())}")
    arr = np.asarray(flat, dtype=np.int64)
    cuts = np.cumsum(loads)[:-1]
    return validate_orders(A, np.split(arr, cuts))


def plugin_trigger_time(A: np.ndarray, orders: Sequence[np.ndarray], tau: np.ndarray,
                        n_parts: int = 1) -> float:
    """Trigger time of ``orders`` when worker ``j`` finishes its ``p``-th chunk at ``p tau_j``.

    Parameters
    ----------
    A : ndarray of bool, shape (N, m)
    orders : list of m int arrays
    tau : ndarray of float, shape (m,)
        Per-chunk time of each worker (``inf``: never).
    n_parts : int
        ``ell``.

    Returns
    -------
    float
        ``max_i`` of the ``ell``-th smallest ``p_j(i) tau_j`` over the holders of chunk ``i``.
    """
    P = positions(A, orders).astype(np.float64)
    T = np.where(P > 0, P * np.asarray(tau, dtype=np.float64)[None, :], np.inf)
    kth = np.partition(T, n_parts - 1, axis=1)[:, n_parts - 1]
    return float(kth.max())


def _cover(A: np.ndarray, k: np.ndarray, n_parts: int) -> np.ndarray | None:
    """A (N, m) bool choice: every chunk ``n_parts`` holders, worker ``j`` at most ``k[j]``
    chunks; None if impossible (max-flow on source -> workers -> chunks -> sink)."""
    N, m = A.shape
    ii, jj = np.nonzero(A)
    s, t = 0, m + N + 1
    rows = np.concatenate([np.zeros(m, np.int64), 1 + jj, 1 + m + np.arange(N)])
    cols = np.concatenate([1 + np.arange(m), 1 + m + ii, np.full(N, t)])
    caps = np.concatenate([k, np.ones(ii.size, np.int64), np.full(N, n_parts)]).astype(np.int32)
    G = csr_array((caps, (rows, cols)), shape=(t + 1, t + 1))
    res = maximum_flow(G, s, t)
    if res.flow_value < N * n_parts:
        return None
    F = csr_array(res.flow)
    used = np.asarray(F[1 + jj, 1 + m + ii]).reshape(-1) > 0
    out = np.zeros((N, m), dtype=bool)
    out[ii[used], jj[used]] = True
    return out


def _slots(tau: np.ndarray, loads: np.ndarray, T: float) -> np.ndarray:
    """``k_j(T) = min(load_j, floor(T / tau_j))`` (with a relative tolerance), shape (m,)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(np.isfinite(tau) & (tau > 0), T / tau * (1 + 1e-12), np.inf)
    q = np.where(tau == 0, np.inf, q)
    return np.asarray(np.minimum(loads, np.floor(np.minimum(q, 1e9))), dtype=np.int64)


def speed_orders(A: np.ndarray, base: Sequence[np.ndarray], tau: np.ndarray,
                 n_parts: int = 1, *, prev: Sequence[np.ndarray] | None = None,
                 cap: float = math.inf) -> tuple[list[np.ndarray], float]:
    """Orders minimising :func:`plugin_trigger_time` under speeds ``tau`` (exact, module
    docstring), ties kept in ``base``'s relative order.

    Parameters
    ----------
    A : ndarray of bool, shape (N, m)
    base : list of m int arrays
        The static order (the fallback, and the tie-break inside each group).
    tau : ndarray of float, shape (m,)
    n_parts : int
    prev : list of m int arrays, optional
        A warm start (the last orders chosen): when no time below theirs is feasible they are
        optimal and returned as they are, after one max-flow instead of a bisection.
    cap : float
        Only plug-in times ``<= cap`` are of interest: when none is feasible, ``base`` and its
        own plug-in time are returned (one max-flow).

    Returns
    -------
    orders : list of m int64 arrays
    t_plugin : float
        Their plug-in trigger time (``inf`` if no order covers every chunk in finite time).
    """
    A = np.asarray(A, dtype=bool)
    tau = np.asarray(tau, dtype=np.float64)
    loads = A.sum(axis=0).astype(np.int64)
    cand = np.unique((np.arange(1, int(loads.max()) + 1)[None, :] * tau[:, None])[
        (np.arange(1, int(loads.max()) + 1)[None, :] <= loads[:, None]) & np.isfinite(tau)[:, None]
    ])
    keep = [np.asarray(o, dtype=np.int64).copy() for o in base]
    hi = int(np.searchsorted(cand, cap * (1 + 1e-12), side="right")) - 1
    if hi < 0:
        return keep, plugin_trigger_time(A, keep, tau, n_parts)
    if prev is not None:
        t_prev = plugin_trigger_time(A, prev, tau, n_parts)
        below = int(np.searchsorted(cand, t_prev * (1 - 1e-12), side="left")) - 1
        if t_prev <= cand[hi] * (1 + 1e-12) and (
                below < 0 or _cover(A, _slots(tau, loads, float(cand[below])), n_parts) is None):
            return [np.asarray(o, dtype=np.int64) for o in prev], t_prev
        hi = min(hi, max(below, 0))
    best = _cover(A, _slots(tau, loads, float(cand[hi])), n_parts)
    if best is None:
        return keep, (plugin_trigger_time(A, keep, tau, n_parts) if math.isfinite(cap)
                      else math.inf)
    lo = 0
    while lo < hi:  # smallest feasible candidate: feasibility is monotone in T
        mid = (lo + hi) // 2
        got = _cover(A, _slots(tau, loads, float(cand[mid])), n_parts)
        if got is None:
            lo = mid + 1
        else:
            best, hi = got, mid
    out = []
    for j, o in enumerate(base):
        o = np.asarray(o, dtype=np.int64)
        first = best[o, j]
        out.append(np.concatenate([o[first], o[~first]]))
    return out, plugin_trigger_time(A, out, tau, n_parts)


def round_samples(m: int, loads: Sequence[int], reports: Iterable[tuple[float, int, int, float]],
                  t_start: float, t_stop: float, present: Iterable[int]) -> np.ndarray:
    """One round's per-chunk time sample of every worker (module docstring); shape (m,),
    NaN for the workers not in ``present`` (not in the round, or dropped)."""
    last_c = [0] * m
    last_e = [0.0] * m
    lat = [math.inf] * m
    for ps_time, w, c, e in reports:
        if c > last_c[w]:
            last_c[w], last_e[w] = c, e
        lat[w] = min(lat[w], max(0.0, (ps_time - t_start) - e))
    out = np.full(m, np.nan)
    span = max(0.0, t_stop - t_start)
    for j in present:
        c, e = last_c[j], last_e[j]
        if c and c >= loads[j]:
            out[j] = e / c
            continue
        run = max(e, span - (lat[j] if math.isfinite(lat[j]) else 0.0))
        out[j] = max(e / c if c else 0.0, run / (c + 1))
    return out


class SpeedEstimator:
    """Per-worker per-chunk time: the median of its last ``window`` samples; the newest
    round's samples are kept as well (:meth:`latest`, the change-point check of
    :class:`AdaptiveOrdering`)."""

    def __init__(self, m: int, window: int = WINDOW, distinct: float = DISTINCT) -> None:
        self.m = m
        self.distinct = float(distinct)
        self._hist: list[deque[float]] = [deque(maxlen=window) for _ in range(m)]
        self._last = np.full(m, np.nan)

    def observe(self, samples: np.ndarray) -> None:
        """Add one round's samples (shape (m,); NaN = no sample for that worker)."""
        x = np.asarray(samples, dtype=np.float64)
        self._last = x.copy()
        for j, v in enumerate(x.tolist()):
            if not math.isnan(v):
                self._hist[j].append(v)

    def estimate(self, distinct: float | None = None) -> np.ndarray | None:
        """Shape (m,) per-chunk times, or None before any sample.

        Each worker's median; those within a factor ``distinct`` (default: the estimator's)
        of the median of all workers (and the workers never observed) are set to that median.
        """
        # statistics.median of <= WINDOW floats: np.median's value, without numpy's dispatch,
        # which dominates on so few floats (m calls per round on the critical path between
        # decode and round_start)
        med = np.array([median(h) if h else np.nan for h in self._hist], dtype=np.float64)
        return self._snap(med, self.distinct if distinct is None else distinct)

    def latest(self) -> np.ndarray | None:
        """The newest round's samples alone, snapped as :meth:`estimate` (a worker without a
        sample in it keeps its estimate); None before any sample. Shape (m,)."""
        est = self.estimate()
        if est is None:
            return None
        x = np.where(np.isnan(self._last), est, self._last)
        return self._snap(x, self.distinct)

    @staticmethod
    def _snap(med: np.ndarray, distinct: float) -> np.ndarray | None:
        seen = ~np.isnan(med)
        if not seen.any():
            return None
        mid = float(np.median(med[seen]))
        with np.errstate(divide="ignore", invalid="ignore"):
            near = ~seen | ((med <= mid * distinct) & (med * distinct >= mid))
        med = med.copy()
        med[near] = mid
        return med


class AdaptiveOrdering:
    """The PS's order policy: estimates from each ended round, orders for the next one.

    Parameters
    ----------
    A : ndarray of bool, shape (N, m)
    base : list of m int arrays
        The static optimal order (used until there is evidence, and whenever the speed-aware
        orders do not gain more than ``margin``).
    n_parts : int
    window, margin : see :data:`WINDOW`, :data:`MARGIN`.
    """

    def __init__(self, A: np.ndarray, base: Sequence[np.ndarray], n_parts: int = 1, *,
                 window: int = WINDOW, margin: float = MARGIN) -> None:
        self.A = np.asarray(A, dtype=bool)
        self.base = [np.asarray(o, dtype=np.int64) for o in base]
        self.n_parts = int(n_parts)
        self.margin = float(margin)
        self.loads = [int(x) for x in self.A.sum(axis=0)]
        self.estimator = SpeedEstimator(self.A.shape[1], window)
        #: the last decision: (plug-in time of the chosen orders, of the static ones, adopted)
        self.last: tuple[float, float, bool] | None = None
        self.confirm = CONFIRM
        #: the last adopted orders: the warm start of the next search (:func:`speed_orders`)
        self._prev: list[np.ndarray] | None = None

    def observe(self, reports: Iterable[tuple[float, int, int, float]], t_start: float,
                t_stop: float, present: Iterable[int]) -> None:
        """One ended round (its accepted reports, start, stop-computing instant, workers)."""
        self.estimator.observe(round_samples(self.A.shape[1], self.loads, reports, t_start,
                                             t_stop, present))

    def orders(self) -> list[np.ndarray]:
        """The orders for the next round (list of m int64 arrays)."""
        tau = self.estimator.estimate()
        if tau is None or not (tau != tau[0]).any():
            self.last = None  # no evidence, or no worker distinct from the others: static
            return self.base
        t_base = plugin_trigger_time(self.A, self.base, tau, self.n_parts)
        cap = (1.0 - self.margin) * t_base
        new, t_new = speed_orders(self.A, self.base, tau, self.n_parts, prev=self._prev,
                                  cap=cap)
        adopt = t_new < cap
        if adopt:
            # the change-point check: the newest round alone must not contradict the plan
            # (a moved slow set, or one outlier round: the worst-case optimum for this round)
            now = self.estimator.latest()
            assert now is not None
            adopt = (plugin_trigger_time(self.A, new, now, self.n_parts)
                     < (1.0 - self.confirm) * plugin_trigger_time(self.A, self.base, now,
                                                                   self.n_parts))
        self.last = (t_new if adopt else t_base, t_base, bool(adopt))
        if not adopt:
            return self.base
        self._prev = new
        return new


def policy_for(scheme: Scheme, ordering: str) -> AdaptiveOrdering | None:
    """The order policy of a run: an :class:`AdaptiveOrdering` when ``ordering`` is
    ``"adaptive"`` and ``scheme`` triggers on reports and can take other orders
    (its ``with_orders`` capability: the partial scheme); None otherwise (the static order
    throughout)."""
    if ordering != "adaptive" or scheme.sends_when_done or scheme.with_orders(
            scheme.orders) is None:
        return None
    return AdaptiveOrdering(scheme.A, scheme.orders, scheme.n_parts)
