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
``tests/test_adaptive.py`` checks it against the protocol engine round by round. The walk
itself is :func:`aiogc.sim.fast.adaptive_outcomes` (which :func:`~aiogc.sim.fast.simulate_fast`
runs for ``ordering="adaptive"``); this module keeps the times-only view.
"""

from __future__ import annotations

import numpy as np

from aiogc.coding.adaptive import AdaptiveOrdering
from aiogc.coding.base import Scheme
from aiogc.sim.fast import adaptive_outcomes
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
    trig, end, _, adopted = adaptive_outcomes(scheme, schedule, latency=latency, policy=policy)
    return trig, end, adopted
