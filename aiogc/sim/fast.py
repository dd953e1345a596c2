"""Vectorised fast path: round outcomes computed in closed form over many trials at once.

One *trial* is one round ``r`` of a materialised :class:`~aiogc.delays.DelaySchedule`. Everything
here is a pure function of the scheme, the schedule and (for the MSE) a seed, and reproduces, trial
by trial, what the state-machine simulation (:mod:`aiogc.sim.protocol`) records on the same
schedule; ``tests/test_sim.py`` checks that.

Timing model (times relative to the PS's round start ``t_start``; ``L`` = one-way per-frame
latency of the engine, ``net_j`` = the schedule's per-(round, worker) hold on frames worker ``j``
sends):

* worker ``j`` finishes its ``k``-th chunk at ``F[j, k] = cumsum(compute_s[r, j, :k+1])`` after
  its ``round_start`` arrived (``L`` after ``t_start``); its report reaches the PS at
  ``a[j, k] = L + F[j, k] + net_j + L``;
* **partial, exact**: trigger = ``max_i`` of the ``ell``-th smallest ``a[j, p_j(i)-1]`` over the
  holders ``j`` of chunk ``i`` (the earliest time every chunk has ``ell`` reported holders); the
  round ends when the last contributor's vector arrives, ``trigger + max_{c_j>0}(L + net_j + L)``
  (``= trigger`` with zero latency);
* **send-when-done schemes** (original, uncoded, ignore-stragglers): worker ``j``'s vector
  arrives at ``a[j, load_j - 1]``; the round ends at the ``need``-th smallest (``m - s``,
  ``m``, ``k``);
* **approximate mode** with deadline ``T``: if the exact rule fires by ``T`` the round is exact as
  above; otherwise the PS uses the state it has at ``T`` (reports / vectors arrived by ``T``);
  a state with nothing in it is a *failed* round (estimate 0, MSE 1).

Ties (two reports arriving at the same instant, or a report exactly at the deadline) are resolved
here by "arrived at or before"; the event-driven engine processes them one at a time, so for
delay laws with atoms (``const:``) the *state* at a tied trigger can differ. Continuous laws have
no ties (almost surely). A round that can never complete (dead workers) has time ``inf``; the
protocol engine instead fails it at ``round_timeout_s``.

MSE: chunk gradients are i.i.d. ``N(0, I_d)`` drawn by :func:`gaussian_chunk_gradients` keyed by
(seed, round), the coded vectors come from the schemes' real ``encode`` and the estimate from
their real ``decode_result`` (original GC with too few finished workers: its least-squares
optimal decoding). ``mse = ||g_hat - g||^2 / ||g||^2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..coding import IgnoreStragglersScheme, OriginalScheme, PartialScheme, UncodedScheme
from ..coding.base import encode_rows
from ..config import RunConfig
from ..delays import DelaySchedule, materialise
from ..errors import ConfigError

__all__ = [
    "FastResult",
    "arrival_times",
    "build_schemes",
    "exact_times",
    "gaussian_chunk_gradients",
    "mse_of_states",
    "need_of",
    "outcomes",
    "schedule_for",
    "scheme_config",
    "simulate_fast",
    "states_at",
]

#: Salt of the gradient stream, so it never coincides with the delay or scheme streams.
_GRAD_SALT = 0x6A5D_9E11


def gaussian_chunk_gradients(seed: int, rnd: int, n_chunks: int, dim: int) -> np.ndarray:
    """I.i.d. ``N(0, I_dim)`` chunk gradients of round ``rnd``: shape ``(n_chunks, dim)``.

    Keyed by ``(seed, rnd)`` only, so every worker computing chunk ``i`` in round ``rnd`` sees the
    same ``g_i`` (row ``i``), and the fast path and the protocol engine see the same gradients.
    """
    rng = np.random.default_rng([int(seed), _GRAD_SALT, int(rnd)])
    return rng.standard_normal((int(n_chunks), int(dim)))


def scheme_config(config: RunConfig, name: str) -> RunConfig:
    """``config`` for one scheme of a comparison (uncoded / ignore-stragglers force ``ell = 1``)."""
    if name in ("uncoded", "ignore-stragglers"):
        return config.replace(scheme=name, n_parts=1)
    return config.replace(scheme=name)


def build_schemes(config: RunConfig, schemes: Sequence[str]) -> dict[str, Any]:
    """``{name: scheme}`` built deterministically from ``config`` (raises ConfigError)."""
    if not schemes:
        raise ConfigError("schemes", list(schemes), "at least one scheme name")
    return {name: scheme_config(config, name).build_scheme() for name in schemes}


def schedule_for(config: RunConfig, schemes: dict[str, Any]) -> DelaySchedule:
    """The schedule a comparison shares: ``config.rounds`` rounds, wide enough for every load."""
    max_load = max(int(np.max(s.loads)) for s in schemes.values())
    return materialise(config.delay, config.latency, rounds=config.rounds, m=config.workers,
                       max_chunks=max(1, max_load), seed=config.seed)


def need_of(scheme: Any) -> int | None:
    """Finished workers a send-when-done scheme waits for; ``None`` for the partial scheme."""
    if isinstance(scheme, PartialScheme):
        return None
    if isinstance(scheme, IgnoreStragglersScheme):
        return scheme.k
    if isinstance(scheme, UncodedScheme):
        return scheme.m
    if isinstance(scheme, OriginalScheme):
        return scheme.m - scheme.s
    raise TypeError(f"unsupported scheme {type(scheme).__name__}")


def arrival_times(scheme: Any, schedule: DelaySchedule, *, latency: float = 0.0) -> np.ndarray:
    """PS arrival time of worker ``j``'s report of its ``k``-th chunk, per round.

    Returns
    -------
    a : ndarray of float64, shape (R, m, K)
        ``K = max load``; ``inf`` beyond a worker's load (never happens) or if it is dead.
    """
    loads = np.asarray(scheme.loads, dtype=np.int64)
    K = int(loads.max())
    if schedule.m != scheme.m or schedule.max_chunks < K:
        raise ConfigError("schedule", (schedule.m, schedule.max_chunks),
                          f"m={scheme.m} workers and >= {K} chunk positions")
    F = np.cumsum(schedule.compute_s[:, :, :K], axis=2)
    F += (2.0 * latency) + schedule.network_s[:, :, None]
    F[:, np.arange(K)[None, :] >= loads[:, None]] = np.inf
    return F


def _holder_tables(scheme: Any) -> tuple[np.ndarray, np.ndarray]:
    """(H, P): holders of each chunk padded with -1, 0-based positions (N, gmax)."""
    A = np.asarray(scheme.A, dtype=bool)
    N = A.shape[0]
    g = int(A.sum(axis=1).max())
    H = np.full((N, g), -1, dtype=np.int64)
    P = np.zeros((N, g), dtype=np.int64)
    pos = np.zeros(A.shape, dtype=np.int64)
    for j, o in enumerate(scheme.orders):
        pos[np.asarray(o, dtype=np.int64), j] = np.arange(len(o))
    for i in range(N):
        h = np.flatnonzero(A[i])
        H[i, : h.size] = h
        P[i, : h.size] = pos[i, h]
    return H, P


def _partial_trigger(scheme: Any, a: np.ndarray) -> np.ndarray:
    """Earliest PS time every chunk has ``ell`` reported holders: shape (R,)."""
    H, P = _holder_tables(scheme)
    T = a[:, np.maximum(H, 0), P]  # (R, N, gmax)
    T[:, H < 0] = np.inf
    ell = int(scheme.n_parts)
    kth = np.partition(T, ell - 1, axis=2)[:, :, ell - 1]
    return np.asarray(kth.max(axis=1))


def states_at(a: np.ndarray, t: np.ndarray) -> np.ndarray:
    """State vectors (R, m): reports arrived at or before ``t[r]``."""
    return np.asarray((a <= np.asarray(t, dtype=np.float64)[:, None, None]).sum(axis=2),
                      dtype=np.int64)


def _partial_end(trigger: np.ndarray, states: np.ndarray, schedule: DelaySchedule,
                 latency: float) -> np.ndarray:
    if latency == 0.0 and not schedule.network_s.any():
        return trigger.copy()
    back = np.where(states > 0, schedule.network_s + 2.0 * latency, -np.inf).max(axis=1)
    return np.where(np.isfinite(trigger), trigger + back, trigger)


def exact_times(scheme: Any, schedule: DelaySchedule, *,
                latency: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Exact-mode (trigger, end) times relative to round start, each of shape (R,)."""
    a = arrival_times(scheme, schedule, latency=latency)
    need = need_of(scheme)
    if need is None:
        trig = _partial_trigger(scheme, a)
        st = states_at(a, trig)
        return trig, _partial_end(trig, st, schedule, latency)
    done = _done_times(scheme, a)
    t = np.partition(done, need - 1, axis=1)[:, need - 1]
    return t, t.copy()


def _done_times(scheme: Any, a: np.ndarray) -> np.ndarray:
    loads = np.asarray(scheme.loads, dtype=np.int64)
    return np.asarray(a[:, np.arange(scheme.m), loads - 1])


@dataclass(frozen=True)
class FastResult:
    """Per-trial outcome of one scheme (one entry per round of the schedule).

    Attributes
    ----------
    scheme, mode : str
    deadline_s : float or None
    trigger_s, completion_s : ndarray (R,)
        Seconds from round start to the trigger / to the round's end.
    status : ndarray of str (R,)
        ``exact`` / ``approximate`` / ``failed``.
    states : ndarray of int64 (R, m)
        The state the PS decoded with (send-when-done: finished workers' loads).
    mse : ndarray (R,) or None
        Relative squared error under i.i.d. Gaussian chunk gradients (approx mode only).
    """

    scheme: str
    mode: str
    deadline_s: float | None
    trigger_s: np.ndarray
    completion_s: np.ndarray
    status: np.ndarray
    states: np.ndarray
    mse: np.ndarray | None = None


def outcomes(scheme: Any, schedule: DelaySchedule, *, mode: str = "exact",
             deadline_s: float | None = None,
             latency: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(trigger, end, status, states) per round in exact or approximate mode."""
    a = arrival_times(scheme, schedule, latency=latency)
    need = need_of(scheme)
    R = a.shape[0]
    if need is None:
        t_ex = _partial_trigger(scheme, a)
    else:
        done = _done_times(scheme, a)
        t_ex = np.partition(done, need - 1, axis=1)[:, need - 1]
    if mode == "exact":
        hit = np.ones(R, dtype=bool)
        trig = t_ex
    else:
        if deadline_s is None:
            raise ConfigError("deadline_s", None, "a positive number when mode=approx")
        hit = t_ex <= deadline_s
        trig = np.where(hit, t_ex, float(deadline_s))
    if need is None:
        states = states_at(a, trig)
        failed = ~states.any(axis=1)
        end = _partial_end(trig, states, schedule, latency)
        end = np.where(failed, trig, end)
    else:
        done = _done_times(scheme, a)
        fin = done <= trig[:, None]
        states = np.where(fin, np.asarray(scheme.loads, dtype=np.int64)[None, :], 0)
        failed = ~fin.any(axis=1)
        end = trig.copy()
    status = np.where(hit, "exact", np.where(failed, "failed", "approximate"))
    if mode == "exact":
        status = np.where(np.isfinite(trig), "exact", "failed")
    if isinstance(scheme, IgnoreStragglersScheme):
        status = np.where(status == "exact", np.where(states.all(axis=1), "exact", "approximate"),
                          status)
    return trig, end, status, states


def mse_of_states(scheme: Any, states: np.ndarray, *, seed: int, dim: int = 120,
                  dtype: np.dtype | str = "float64", rounds: Sequence[int] | None = None,
                  ) -> np.ndarray:
    """``||g_hat - g||^2 / ||g||^2`` per state, with the schemes' real encode and decode.

    Parameters
    ----------
    scheme : a coding scheme
    states : ndarray of int, shape (R, m)
        The state decoded with in each trial (an all-zero state gives the estimate 0: MSE 1).
    seed : int
        Gradient seed (see :func:`gaussian_chunk_gradients`); trial ``r`` uses round ``r``
        (or ``rounds[r]``).
    dim : int
        Gradient length ``d``.
    dtype : payload dtype ("float64" or "float32"); the coded vectors are cast to it.

    Returns
    -------
    mse : ndarray of float64, shape (R,)
    """
    dt = np.dtype(dtype)
    S = np.asarray(states, dtype=np.int64)
    R, m = S.shape
    p = scheme.payload_len(dim)
    out = np.empty(R)
    idx = list(range(R)) if rounds is None else [int(x) for x in rounds]
    partial = isinstance(scheme, PartialScheme)
    V = np.zeros((m, p), dtype=dt)
    for t in range(R):
        c = S[t]
        G = gaussian_chunk_gradients(seed, idx[t], scheme.n_chunks, dim)
        g = G.sum(axis=0)
        if not c.any():
            out[t] = 1.0
            continue
        if partial:
            thetas = scheme.all_coefficients(c)
            for j in np.flatnonzero(c > 0):
                V[j] = encode_rows(thetas[j], G[scheme.orders[j][: c[j]]], scheme.n_parts)
        else:
            for j in np.flatnonzero(c > 0):
                V[j] = scheme.encode(int(j), c, G[scheme.orders[j]])
        est = np.asarray(scheme.decode_result(V, c, dim).gradient, dtype=np.float64)
        out[t] = float(np.sum((est - g) ** 2) / np.sum(g**2))
    return out


def simulate_fast(config: RunConfig, schemes: Sequence[str], *,
                  schedule: DelaySchedule | None = None, latency: float = 0.0,
                  dim: int = 120, mse: bool | None = None,
                  built: dict[str, Any] | None = None) -> dict[str, FastResult]:
    """Fast-path counterpart of :func:`aiogc.sim.protocol.simulate_protocol`.

    Parameters
    ----------
    config : RunConfig
        ``mode`` / ``deadline_s`` select exact or approximate rounds; ``rounds`` = trials.
    schemes : sequence of scheme names
    schedule : DelaySchedule, optional
        Default: :func:`schedule_for` (``config.delay``, ``config.latency``, ``config.seed``).
    latency : float
        One-way per-frame latency (both directions), as in :class:`~aiogc.sim.engine.Simulation`.
    dim : int
        Gradient length of the MSE computation.
    mse : bool, optional
        Compute the MSE (default: in approx mode only).
    built : dict, optional
        Pre-built ``{name: scheme}`` (must match ``config``).

    Returns
    -------
    dict name -> FastResult
    """
    sch = built if built is not None else build_schemes(config, schemes)
    if schedule is None:
        schedule = schedule_for(config, sch)
    want_mse = config.mode == "approx" if mse is None else mse
    out: dict[str, FastResult] = {}
    for name in schemes:
        s = sch[name]
        trig, end, status, states = outcomes(s, schedule, mode=config.mode,
                                             deadline_s=config.deadline_s, latency=latency)
        err = (mse_of_states(s, states, seed=config.seed, dim=dim, dtype=config.dtype)
               if want_mse else None)
        out[name] = FastResult(name, config.mode,
                               config.deadline_s if config.mode == "approx" else None,
                               trig, end, status, states, err)
    return out
