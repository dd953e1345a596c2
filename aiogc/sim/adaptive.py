"""Fast path of ``ordering="adaptive"``: round after round, the same order policy as the PS core.

The static fast path (:mod:`aiogc.sim.fast`) computes every round at once because the orders
never change. Under ``ordering="adaptive"`` round ``r``'s orders depend on what the PS saw in
rounds ``< r``, so this module walks the rounds in sequence with the *same*
:class:`~aiogc.coding.adaptive.AdaptiveOrdering` the PS core uses
(:mod:`aiogc.core.ps_rounds`), fed with the reports the PS would have accepted: worker ``j``'s
report of its ``k``-th chunk reaches the PS at ``a[r, j, k]`` (:func:`aiogc.sim.fast.
arrival_times`; arrivals depend on positions, not on which chunk sits there) with
``elapsed_s = cumsum(compute_s[r, j, :k+1])``, and the reports up to the trigger are those
the PS accepted. Exact mode; the trigger is the round scheme's ``decode_times``, the end
:func:`aiogc.sim.fast._trigger_end` (the same formulas as the static path).
``tests/test_adaptive.py`` checks it against the protocol engine round by round.
"""

from __future__ import annotations

import numpy as np

from aiogc.coding.adaptive import AdaptiveOrdering, policy_for
from aiogc.coding.base import Scheme
from aiogc.errors import ConfigError
from aiogc.sim.fast import _trigger_end, arrival_times
from aiogc.training.schedule import DelaySchedule

__all__ = ["adaptive_times"]


def adaptive_times(scheme: Scheme, schedule: DelaySchedule, *, latency: float = 0.0,
                   policy: AdaptiveOrdering | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact-mode (trigger, end, adopted) per round under the adaptive order policy.

    Parameters
    ----------
    scheme : Scheme
        A trigger scheme with ``with_orders`` (partial), built with its static orders.
    schedule : DelaySchedule
    latency : float
        One-way per-frame latency.
    policy : AdaptiveOrdering, optional
        Default: a fresh one for ``scheme`` (:func:`~aiogc.coding.adaptive.policy_for`).

    Returns
    -------
    trigger, end : ndarray of float64, shape (R,)
        Seconds from round start.
    adopted : ndarray of bool, shape (R,)
        Whether round ``r`` ran on speed-aware orders (else the static ones).
    """
    pol = policy if policy is not None else policy_for(scheme, "adaptive")
    if pol is None:
        raise ConfigError("scheme", scheme.name, "a trigger scheme that can take other orders")
    a = arrival_times(scheme, schedule, latency=latency)  # (R, m, K)
    R, m, K = a.shape
    elapsed = np.cumsum(schedule.compute_s[:, :, :K], axis=2)
    trig = np.empty(R)
    states = np.zeros((R, m), dtype=np.int64)
    adopted = np.zeros(R, dtype=bool)
    everyone = range(m)
    for r in range(R):
        sch = scheme.with_orders(pol.orders())
        assert sch is not None  # policy_for checked the capability
        adopted[r] = pol.last is not None and pol.last[2]
        t = float(sch.decode_times(a[r:r + 1])[0])
        trig[r] = t
        got = a[r] <= t  # (m, K): the reports the PS holds at the trigger
        states[r] = got.sum(axis=1)
        jj, kk = np.nonzero(got)
        reports = zip(a[r, jj, kk].tolist(), jj.tolist(), (kk + 1).tolist(),
                      elapsed[r, jj, kk].tolist(), strict=True)
        pol.observe(sorted(reports), 0.0, t if np.isfinite(t) else float(a[r][np.isfinite(
            a[r])].max(initial=0.0)), everyone)
    end = _trigger_end(scheme, trig, states, schedule, latency)
    return trig, end, adopted
