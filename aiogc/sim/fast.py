"""Vectorised fast path: round outcomes computed in closed form over many trials at once.

One *trial* is one round ``r`` of a materialised
:class:`~aiogc.training.delays.DelaySchedule`. Everything
here is a pure function of the scheme, the schedule and (for the MSE) a seed, and reproduces, trial
by trial, what the state-machine simulation (:mod:`aiogc.sim.protocol`) records on the same
schedule; ``tests/test_sim.py`` and the seeded property in ``tests/test_sim_property.py``
check that.

Timing model (times relative to the PS's round start ``t_start``; ``L`` = one-way per-frame
latency of the engine, ``net_j`` = the schedule's per-(round, worker) hold on frames worker ``j``
sends):

* worker ``j`` finishes its ``k``-th chunk at ``F[j, k] = cumsum(compute_s[r, j, :k+1])`` after
  its ``round_start`` arrived (``L`` after ``t_start``); its report reaches the PS at
  ``a[j, k] = L + F[j, k] + net_j + L``;
* the **exact trigger** is the scheme's own rule, ``scheme.decode_times(a)`` (the earliest time
  the state the PS holds is decodable; every scheme in the registry has one, closed-form for the
  built-in ones, a binary search over :meth:`~aiogc.coding.base.SchemeBase.is_decodable` for any
  other), so this module knows no scheme by name or type;
* **trigger schemes** (``sends_when_done`` false, e.g. partial): the round ends when the last
  contributor's vector arrives, ``trigger + max_{contributors}(L + net_j + L)`` (``= trigger``
  with zero latency);
* **send-when-done schemes** (original, uncoded, ignore-stragglers): worker ``j``'s vector
  arrives at ``a[j, load_j - 1]``; the round ends at the trigger;
* **streaming schemes** (stream-chunks): every chunk's vector is a frame, ``a[j, k]`` its
  arrival; the round ends at the trigger. Under a limited communication model a frame sent
  before the next round start reached its worker still occupies its uplink and the shared
  ingress into the next round (:mod:`aiogc.sim.carry`, one rule for every scheme), so the
  rounds of these two kinds are computed in order, each from the links the previous one
  left;
* **status**: exact when the trigger fired and ``scheme.exact_states`` says the decode from
  that state is exact (ignore-stragglers: only with every worker);
* **approximate mode** with deadline ``T``: if the exact rule fires by ``T`` the round is exact as
  above; otherwise the PS uses the state it has at ``T`` (reports / vectors arrived by ``T``);
  a state with nothing in it is a *failed* round (estimate 0, MSE 1).

Ties (two reports arriving at the same instant, or a report exactly at the deadline) are resolved
here by "arrived at or before"; the event-driven engine processes them one at a time, so for
delay laws with atoms (``const:``, ``none``, or a law built on them) the *state* at a tied
trigger can differ: :func:`tie_fraction` measures how often
that happens on a schedule, and ``aiogc simulate --engine fast`` warns when it does. Continuous
laws have no ties (almost surely). A round that can never complete (dead workers) has time
``inf``; the protocol engine fails it (early, or at ``round_timeout_s``), which
:func:`aiogc.sim.protocol.record_arrays` also reports as ``inf`` in exact mode.

MSE: chunk gradients are i.i.d. ``N(0, I_d)`` drawn by :func:`gaussian_chunk_gradients` keyed by
(seed, round), the coded vectors come from the schemes' real ``encode`` and the estimate from
their real ``decode_result`` (original GC with too few finished workers: its least-squares
optimal decoding). ``mse = ||g_hat - g||^2 / ||g||^2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aiogc.coding.adaptive import AdaptiveOrdering, policy_for
from aiogc.coding.base import Scheme
from aiogc.config import CommModel, RunConfig
from aiogc.errors import ConfigError
from aiogc.protocol.status import RoundStatus
from aiogc.sim.carry import carried_arrivals
from aiogc.sim.comm import FrameBytes, link_exits, ps_ingress
from aiogc.training.cluster import cluster_schedule
from aiogc.training.delays import materialise
from aiogc.training.schedule import DelaySchedule

__all__ = [
    "FastResult",
    "arrival_times",
    "build_schemes",
    "exact_times",
    "gaussian_chunk_gradients",
    "mse_of_states",
    "outcomes",
    "schedule_for",
    "simulate_fast",
    "states_at",
    "tie_fraction",
    "upload_counts",
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


def build_schemes(config: RunConfig, schemes: Sequence[str]) -> dict[str, Scheme]:
    """``{name: scheme}`` built deterministically from ``config`` (raises ConfigError).

    Each scheme sees :meth:`RunConfig.for_scheme` (its forced ``ell`` applied).
    """
    if not schemes:
        raise ConfigError("schemes", list(schemes), "at least one scheme name")
    return {name: config.for_scheme(name).build_scheme() for name in schemes}


def schedule_for(config: RunConfig, schemes: dict[str, Scheme]) -> DelaySchedule:
    """The schedule a comparison shares: ``config.rounds`` rounds, wide enough for every load."""
    max_load = max(int(np.max(s.loads)) for s in schemes.values())
    return materialise(config.delay, config.latency, rounds=config.rounds, m=config.workers,
                       max_chunks=max(1, max_load), seed=config.seed)


def _send_times(scheme: Scheme, schedule: DelaySchedule, latency: float,
                comm: CommModel, frames: FrameBytes) -> np.ndarray:
    """When worker ``j`` hands its ``k``-th chunk's frame to its uplink: (R, m, K).

    ``L + round_start bytes / worker_down + F[j, k] + net_j``; ``inf`` beyond the load.
    """
    loads = np.asarray(scheme.loads, dtype=np.int64)
    K = max(1, int(loads.max()))
    t_rs = latency + (frames.round_start / comm.down_Bps if comm.down_Bps is not None
                      else np.zeros(scheme.m))
    S = np.cumsum(schedule.compute_s[:, :, :K], axis=2)
    S += t_rs[None, :, None] + schedule.network_s[:, :, None]
    S[:, np.arange(K)[None, :] >= loads[:, None]] = np.inf
    return S


def _uploads(send: np.ndarray, nbytes: np.ndarray | int, comm: CommModel,
             latency: float) -> np.ndarray:
    """PS arrival of frames handed to the uplinks at ``send`` (R, m, n): FIFO uplinks, then
    the shared ingress (see :mod:`aiogc.sim.comm`)."""
    nb = np.asarray(nbytes, dtype=np.float64)
    exits = link_exits(send, nb, comm.up_Bps)
    return ps_ingress(exits, nb, comm.ps_Bps) + latency


def arrival_times(scheme: Scheme, schedule: DelaySchedule, *,
                  latency: float = 0.0, comm: CommModel | None = None,
                  frames: FrameBytes | None = None) -> np.ndarray:
    """PS arrival time of worker ``j``'s report of its ``k``-th chunk, per round.

    With a limited ``comm`` (``frames`` then required): the report frames (trigger schemes),
    the coded vector in slot ``loads[j] - 1`` (send-when-done schemes; earlier slots carry no
    frame and keep the latency-only time) or every chunk's vector (streaming schemes) cross
    the links of :mod:`aiogc.sim.comm`, after the round start's download.

    Returns
    -------
    a : ndarray of float64, shape (R, m, K)
        ``K = max load``; ``inf`` beyond a worker's load or if it is dead.
    """
    loads = np.asarray(scheme.loads, dtype=np.int64)
    K = max(1, int(loads.max()))
    if schedule.m != scheme.m or schedule.max_chunks < K:
        raise ConfigError("schedule", (schedule.m, schedule.max_chunks),
                          f"m={scheme.m} workers and >= {K} chunk positions")
    if comm is not None and comm.limited:
        if frames is None:
            raise ConfigError("frames", None, "the frame sizes (FrameBytes) with a comm model")
        return _limited_arrivals(scheme, schedule, latency, comm, frames)
    F = np.cumsum(schedule.compute_s[:, :, :K], axis=2)
    F += (2.0 * latency) + schedule.network_s[:, :, None]
    F[:, np.arange(K)[None, :] >= loads[:, None]] = np.inf
    return F


def _limited_arrivals(scheme: Scheme, schedule: DelaySchedule, latency: float,
                      comm: CommModel, frames: FrameBytes) -> np.ndarray:
    S = _send_times(scheme, schedule, latency, comm, frames)
    if scheme.uploads_per_chunk:
        return _uploads(S, frames.chunk_vector, comm, latency)
    if not scheme.sends_when_done:
        return _uploads(S, frames.report, comm, latency)
    loads = np.asarray(scheme.loads, dtype=np.int64)
    a = S + latency
    last = np.maximum(loads - 1, 0)
    js = np.arange(scheme.m)
    vec = _uploads(S[:, js, last][:, :, None], frames.vector, comm, latency)[:, :, 0]
    a[:, js, last] = np.where(loads[None, :] > 0, vec, np.inf)
    return a


def states_at(a: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Reported counts (R, m): reports arrived at or before ``t[r]`` (trigger schemes).

    For any scheme use ``scheme.states_at(a, t)``, which also knows send-when-done states.
    """
    return np.asarray((a <= np.asarray(t, dtype=np.float64)[:, None, None]).sum(axis=2),
                      dtype=np.int64)


def tie_fraction(a: np.ndarray) -> float:
    """Fraction of trials in which two finite arrival times of ``a`` (R, m, K) are equal.

    Where this is nonzero the fast path (which counts every arrival "at or before" an instant)
    and the event-driven engine (one event at a time) may decode from different states.
    """
    R = a.shape[0]
    if R == 0:
        return 0.0
    flat = np.sort(a.reshape(R, -1), axis=1)
    eq = (flat[:, 1:] == flat[:, :-1]) & np.isfinite(flat[:, 1:])
    return float(eq.any(axis=1).mean())


def _trigger_end(scheme: Scheme, trigger: np.ndarray, states: np.ndarray,
                 schedule: DelaySchedule, latency: float, comm: CommModel | None = None,
                 frames: FrameBytes | None = None) -> np.ndarray:
    """End of a triggered round: the last contributor's vector arrives (shape (R,))."""
    if comm is not None and comm.limited and frames is not None:
        return _limited_trigger_end(scheme, trigger, states, schedule, latency, comm, frames)
    if latency == 0.0 and not schedule.network_s.any():
        return trigger.copy()
    contrib = scheme.contributors(states)
    back = np.where(contrib, schedule.network_s[: states.shape[0]] + 2.0 * latency,
                    -np.inf).max(axis=1)
    return np.where(np.isfinite(trigger), trigger + back, trigger)


def _limited_trigger_end(scheme: Scheme, trigger: np.ndarray, states: np.ndarray,
                         schedule: DelaySchedule, latency: float, comm: CommModel,
                         frames: FrameBytes) -> np.ndarray:
    """:func:`_trigger_end` under a limited comm model.

    Worker ``j`` receives encode_and_transmit at ``T + L + encode bytes / worker_down``; the
    reports it emitted before that instant (it reports no more once told to encode) and then
    its coded vector (contributors only, after its hold ``net_j``) cross its uplink in that
    order and the shared ingress with every other worker's frames.
    """
    R = states.shape[0]
    sched = schedule
    S = _send_times(scheme, sched, latency, comm, frames)[:R]
    net = sched.network_s[:R]
    down = frames.encode / comm.down_Bps if comm.down_Bps is not None else 0.0
    receipt = np.asarray(trigger, dtype=np.float64)[:, None] + latency + down  # (R, 1)
    emitted = (S - net[:, :, None]) < receipt[:, :, None]
    rep = np.where(emitted, S, np.inf)
    contrib = scheme.contributors(states)
    vec = np.where(contrib, receipt + net, np.inf)
    send = np.concatenate([rep, vec[:, :, None]], axis=2)
    K = rep.shape[2]
    nb = np.array([frames.report] * K + [frames.vector], dtype=np.float64)
    arr = _uploads(send, nb, comm, latency)[:, :, K]
    end = np.where(contrib, arr, -np.inf).max(axis=1)
    return np.where(np.isfinite(trigger), end, trigger)


def exact_times(scheme: Scheme, schedule: DelaySchedule, *, latency: float = 0.0,
                comm: CommModel | None = None, frames: FrameBytes | None = None,
                ) -> tuple[np.ndarray, np.ndarray]:
    """Exact-mode (trigger, end) times relative to round start, each of shape (R,)."""
    trig, end, _, _ = outcomes(scheme, schedule, mode="exact", latency=latency, comm=comm,
                               frames=frames)
    return trig, end


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
        :class:`RoundStatus` values: ``exact`` / ``approximate`` / ``failed``.
    states : ndarray of int64 (R, m)
        The state the PS decoded with (send-when-done: finished workers' loads).
    mse : ndarray (R,) or None
        Relative squared error under i.i.d. Gaussian chunk gradients (approx mode only).
    uploads : ndarray of int64 (R,) or None
        Vector-carrying frames handed to the uplinks by the round's end (:func:`upload_counts`).
    upload_bytes : ndarray of int64 (R,) or None
        Their bytes on the wire (reports, a few dozen bytes each, not counted).
    """

    scheme: str
    mode: str
    deadline_s: float | None
    trigger_s: np.ndarray
    completion_s: np.ndarray
    status: np.ndarray
    states: np.ndarray
    mse: np.ndarray | None = None
    uploads: np.ndarray | None = None
    upload_bytes: np.ndarray | None = None


def _carried(scheme: Scheme, schedule: DelaySchedule, a: np.ndarray, mode: str,
             deadline_s: float | None, latency: float, comm: CommModel,
             frames: FrameBytes) -> np.ndarray:
    """``a`` with the vector frames' links carried from round to round (:mod:`aiogc.sim.carry`:
    a frame sent before the next round start reached its worker still occupies its uplink and
    the shared ingress when the next round starts). Send-when-done and streaming schemes."""
    T = float("inf") if mode == "exact" or deadline_s is None else float(deadline_s)

    def end_of(a_r: np.ndarray) -> float:
        return min(float(np.asarray(scheme.decode_times(a_r), dtype=np.float64)[0]), T)

    t_rs = latency + (frames.round_start / comm.down_Bps if comm.down_Bps is not None
                      else np.zeros(scheme.m))
    S = _send_times(scheme, schedule, latency, comm, frames)
    loads = np.asarray(scheme.loads, dtype=np.int64)
    k = np.arange(S.shape[2])[None, :]
    if scheme.uploads_per_chunk:
        return carried_arrivals(a, S, k < loads[:, None], schedule.network_s, t_rs,
                                frames.chunk_vector, comm, latency, end_of)
    return carried_arrivals(a, S, (k == loads[:, None] - 1) & (loads[:, None] > 0),
                            schedule.network_s, t_rs, frames.vector, comm, latency, end_of)


def outcomes(scheme: Scheme, schedule: DelaySchedule, *, mode: str = "exact",
             deadline_s: float | None = None, latency: float = 0.0,
             comm: CommModel | None = None, frames: FrameBytes | None = None,
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(trigger, end, status, states) per round in exact or approximate mode.

    Every scheme-specific fact comes from the scheme: ``decode_times`` (its waiting rule),
    ``states_at`` (what the PS holds at an instant), ``contributors`` and ``exact_states``.
    ``comm`` / ``frames``: the communication model (:mod:`aiogc.sim.comm`; ``frames`` from
    :meth:`FrameBytes.of <aiogc.sim.comm.FrameBytes.of>` for this scheme).
    """
    if mode not in ("exact", "approx"):
        raise ConfigError("mode", mode, "exact or approx")
    if mode == "approx" and deadline_s is None:
        raise ConfigError("deadline_s", None, "a positive number when mode=approx")
    a = arrival_times(scheme, schedule, latency=latency, comm=comm, frames=frames)
    if (comm is not None and comm.limited and frames is not None
            and (scheme.sends_when_done or scheme.uploads_per_chunk)):
        a = _carried(scheme, schedule, a, mode, deadline_s, latency, comm, frames)
    t_ex = np.asarray(scheme.decode_times(a), dtype=np.float64)
    if mode == "exact":
        hit = np.isfinite(t_ex)
        trig = t_ex
    else:
        assert deadline_s is not None
        hit = t_ex <= deadline_s
        trig = np.where(hit, t_ex, float(deadline_s))
    states = scheme.states_at(a, trig)
    failed = ~hit if mode == "exact" else ~hit & ~states.any(axis=1)
    if scheme.sends_when_done or scheme.uploads_per_chunk:
        end = trig.copy()  # the vectors themselves made the state decodable
    else:
        end = np.where(failed, trig, _trigger_end(scheme, trig, states, schedule, latency,
                                                  comm, frames))
    exact = hit & np.asarray(scheme.exact_states(states), dtype=bool)
    status = np.where(exact, RoundStatus.EXACT.value,
                      np.where(failed, RoundStatus.FAILED.value, RoundStatus.APPROXIMATE.value))
    return trig, end, status, states


def upload_counts(scheme: Scheme, schedule: DelaySchedule, end: np.ndarray,
                  states: np.ndarray, frames: FrameBytes, *, latency: float = 0.0,
                  comm: CommModel | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Vector frames each round puts on the uplinks by its end, and their bytes.

    Trigger schemes: one per contributor. Send-when-done schemes: one per worker whose vector
    was handed to its uplink by ``end``. Streaming schemes: every chunk vector handed over by
    ``end`` (a worker learns of the round's end only later, so this is a lower bound).

    Returns
    -------
    count, nbytes : ndarray of int64, shape (R,) each
    """
    R = states.shape[0]
    e = np.asarray(end, dtype=np.float64)[:R]
    if not scheme.sends_when_done and not scheme.uploads_per_chunk:
        n = np.asarray(scheme.contributors(states).sum(axis=1), dtype=np.int64)
        return n, n * frames.vector
    S = _send_times(scheme, schedule, latency, comm or CommModel(), frames)[:R]
    if scheme.uploads_per_chunk:
        n = (e[:, None, None] >= S).sum(axis=(1, 2)).astype(np.int64)
        return n, n * frames.chunk_vector
    loads = np.asarray(scheme.loads, dtype=np.int64)
    last = S[:, np.arange(scheme.m), np.maximum(loads - 1, 0)]
    n = ((last <= e[:, None]) & (loads[None, :] > 0)).sum(axis=1).astype(np.int64)
    return n, n * frames.vector


def mse_of_states(scheme: Scheme, states: np.ndarray, *, seed: int, dim: int = 120,
                  dtype: np.dtype | str = "float64", rounds: Sequence[int] | None = None,
                  ) -> np.ndarray:
    """``||g_hat - g||^2 / ||g||^2`` per state, with the schemes' real encode and decode.

    Parameters
    ----------
    scheme : Scheme
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
    V = np.zeros((m, p), dtype=dt)
    for t in range(R):
        c = S[t]
        G = gaussian_chunk_gradients(seed, idx[t], scheme.n_chunks, dim)
        g = G.sum(axis=0)
        if not c.any():
            out[t] = 1.0
            continue
        scheme.encode_all(c, G, V)
        est = np.asarray(scheme.decode_result(V, c, dim).gradient, dtype=np.float64)
        out[t] = float(np.sum((est - g) ** 2) / np.sum(g**2))
    return out


def adaptive_outcomes(scheme: Scheme, schedule: DelaySchedule, *, latency: float = 0.0,
                      policy: AdaptiveOrdering | None = None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Exact-mode (trigger, end, states, adopted) per round under ``ordering="adaptive"``:
    the rounds in sequence, each on the orders the PS core's own
    :class:`~aiogc.coding.adaptive.AdaptiveOrdering` chose from the reports of the rounds
    before (module docstring of :mod:`aiogc.sim.adaptive`).

    Returns
    -------
    trigger, end : ndarray of float64, shape (R,)
        Seconds from round start.
    states : ndarray of int64, shape (R, m)
        The reports the PS held at each trigger.
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
    return trig, end, states, adopted


def _adaptive_supported(config: RunConfig, comm: CommModel | None) -> None:
    """The fast path walks adaptive orders in exact mode on free links only."""
    if config.mode != "exact" or (comm is not None and comm.limited):
        raise ConfigError("ordering", "adaptive", "exact mode without --bandwidth in the fast "
                          "path (--engine protocol simulates the other cases)")


def simulate_fast(config: RunConfig, schemes: Sequence[str], *,
                  schedule: DelaySchedule | None = None, latency: float = 0.0,
                  dim: int = 120, mse: bool | None = None,
                  built: dict[str, Scheme] | None = None,
                  comm: CommModel | None = None) -> dict[str, FastResult]:
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
    comm : CommModel, optional
        Link rates (:mod:`aiogc.sim.comm`); frames are sized at ``dim`` and ``config.dtype``.

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
        frames = FrameBytes.of(s, dim, config.coded_wire_dtype, config.payload_dtype)
        sched_s = cluster_schedule(schedule, config, s)  # heterogeneous cluster
        if config.ordering == "adaptive" and policy_for(s, "adaptive") is not None:
            _adaptive_supported(config, comm)
            trig, end, states, _ = adaptive_outcomes(s, sched_s, latency=latency)
            status = np.where(np.isfinite(end), RoundStatus.EXACT.value,
                              RoundStatus.FAILED.value)
        else:
            trig, end, status, states = outcomes(s, sched_s, mode=config.mode,
                                                 deadline_s=config.deadline_s,
                                                 latency=latency, comm=comm, frames=frames)
        err = (mse_of_states(s, states, seed=config.seed, dim=dim, dtype=config.dtype)
               if want_mse else None)
        ups, nbytes = upload_counts(s, sched_s, end, states, frames, latency=latency,
                                    comm=comm)
        out[name] = FastResult(name, config.mode,
                               config.deadline_s if config.mode == "approx" else None,
                               trig, end, status, states, err, ups, nbytes)
    return out
