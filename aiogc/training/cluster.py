"""A heterogeneous cluster's delays: the schedule one scheme runs on.

A materialised schedule (:func:`aiogc.training.delays.materialise`) holds the delay model's
draws for a *unit* chunk on a worker of speed 1, indexed by (round, worker, position). On a
cluster with worker speeds ``s_j`` and chunk sizes ``z_i`` (normalised to mean 1,
:mod:`aiogc.coding.hetero`), worker ``j``'s ``k``-th chunk is chunk ``orders[j][k]`` of the
scheme it runs, so its delay is the draw times ``z_{orders[j][k]} / s_j``.
:func:`cluster_schedule` applies that per scheme; every driver calls it where a schedule
meets a scheme (the live PS in :func:`aiogc.harness.kit.make_ps`, the fast path and the
protocol engine), so a comparison's schemes share the draws (the same cluster, the same
luck) and each sees its own chunks' sizes. ``delays.csv`` records the shared draws.
A uniform cluster returns the schedule itself.
"""

from __future__ import annotations

import numpy as np

from aiogc.coding.base import Scheme
from aiogc.config import RunConfig
from aiogc.training.schedule import DelaySchedule

__all__ = ["chunk_factors", "cluster_schedule", "slowdown"]


def slowdown(config: RunConfig) -> float:
    """Largest factor a chunk's delay is scaled by (largest normalised size over the
    slowest speed): a bound the workload timeouts multiply the unit schedule's rounds by."""
    s, z = config.speeds, config.sizes
    f = 1.0 if s is None else 1.0 / float(s.min())
    return f if z is None else f * float(z.max() * z.size / z.sum())


def chunk_factors(config: RunConfig, scheme: Scheme) -> np.ndarray | None:
    """Per-position delay factors ``z_{orders[j][k]} / s_j``: shape (m, K) with K the largest
    load (1 beyond a worker's load); None on a uniform cluster."""
    speeds, sizes = config.speeds, config.sizes
    if speeds is None and sizes is None:
        return None
    loads = np.asarray(scheme.loads, dtype=np.int64)
    m, K = scheme.m, max(1, int(loads.max()))
    s = np.ones(m) if speeds is None else speeds
    n = scheme.n_chunks
    z = np.ones(n) if sizes is None or sizes.size != n else sizes * (n / sizes.sum())
    F = np.ones((m, K))
    for j, o in enumerate(scheme.orders):
        o = np.asarray(o, dtype=np.int64)
        F[j, : o.size] = z[o] / s[j]
    return F


def cluster_schedule(schedule: DelaySchedule, config: RunConfig,
                     scheme: Scheme) -> DelaySchedule:
    """The schedule ``scheme`` runs on, on ``config``'s cluster (module docstring).

    Parameters
    ----------
    schedule : DelaySchedule
        Unit-chunk draws, ``compute_s`` of shape (R, m, K') with K' >= the largest load.
    config : RunConfig
        Its ``worker_speeds`` / ``chunk_sizes``.
    scheme : Scheme
        Its orders say which chunk each position is.

    Returns
    -------
    DelaySchedule
        ``schedule`` itself on a uniform cluster; else compute delays scaled, network kept.
    """
    F = chunk_factors(config, scheme)
    if F is None:
        return schedule
    comp = np.array(schedule.compute_s, dtype=np.float64)
    K = min(F.shape[1], comp.shape[2])
    comp[:, :, :K] *= F[None, :, :K]  # inf stays inf: factors are finite and > 0
    return DelaySchedule(compute_s=comp, network_s=schedule.network_s, seed=schedule.seed,
                         compute_spec=f"cluster:{schedule.compute_spec}",
                         network_spec=schedule.network_spec)
