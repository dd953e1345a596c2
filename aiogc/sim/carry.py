"""Late vectors that carry into the next round (the fast path's send-when-done schemes).

In a send-when-done scheme (original, uncoded, ignore-stragglers) worker ``j`` hands its coded
vector to its uplink as soon as all its chunks are done, and the PS ends the round once the
vectors it holds decode (or at the deadline T). A straggler whose chunks were done before the
next ``round_start`` reached it has already sent its vector: it keeps the worker's uplink and
the shared PS ingress busy into the next round, as it does live and in the protocol engine
(whose links persist across rounds). A straggler still computing when the ``round_start``
arrives drops the round and sends nothing. Trigger schemes (partial) leave nothing in flight:
every vector the PS asked for has arrived when the round ends.

So under a limited communication model the rounds of one schedule are no longer independent:
:func:`carried_vector_arrivals` walks them in order, with times relative to each round's start
(the previous round's end), and carries

* ``up_free[j]``: when worker ``j``'s uplink has carried its last sent vector;
* ``ps_free``: when the ingress has served every frame that left its uplink by the round's
  end (the next round's frames all leave later: FIFO by exit time, as in
  :func:`~aiogc.sim.comm.ps_ingress`);
* the sent vectors that left their uplinks *after* the round's end (still to be merged, by exit
  time, with the next round's frames at the ingress).

``tests/test_comm_carry.py`` checks it trial by trial against the protocol engine and by hand.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from aiogc.config import CommModel

__all__ = ["carried_vector_arrivals", "fifo_served"]


def fifo_served(exits: np.ndarray, service_s: float, free: float) -> np.ndarray:
    """When each frame has left a FIFO server, frames in ``exits`` order (ascending).

    ``f_n = max(f_{n-1}, e_n) + s`` from ``f_{-1} = free``, in closed form:
    ``f_n = D_n + max(free, max_{i <= n} (e_i - D_{i-1}))`` with ``D_n = (n + 1) s``.

    Parameters
    ----------
    exits : ndarray of float64, shape (n,)
        Ascending; ``inf`` entries (never sent) come last and are served at ``inf``.
    service_s : float
        Seconds each frame occupies the server.
    free : float
        When the server finished its previous frame (``-inf``: idle).

    Returns
    -------
    served : ndarray of float64, shape (n,)
    """
    d = service_s * np.arange(1, exits.size + 1, dtype=np.float64)
    return d + np.maximum(free, np.maximum.accumulate(exits - (d - service_s)))


def carried_vector_arrivals(
    a: np.ndarray,
    send: np.ndarray,
    network_s: np.ndarray,
    t_round_start: np.ndarray,
    loads: np.ndarray,
    vector_bytes: int,
    comm: CommModel,
    latency: float,
    end_of: Callable[[np.ndarray], float],
) -> np.ndarray:
    """Arrival times of a send-when-done scheme's vectors with the links carried across rounds.

    Parameters
    ----------
    a : ndarray of float64, shape (R, m, K)
        The independent-round arrivals (:func:`aiogc.sim.fast.arrival_times`); a copy is
        returned with every worker's vector slot ``loads[j] - 1`` recomputed.
    send : ndarray of float64, shape (R, m, K)
        When worker ``j`` hands its ``k``-th chunk's frame to its uplink, relative to the round
        start (``inf`` beyond its load); the vector goes at slot ``loads[j] - 1``.
    network_s : ndarray of float64, shape (R, m)
        The schedule's hold on worker ``j``'s frames (included in ``send``).
    t_round_start : ndarray of float64, shape (m,)
        When the round start reaches worker ``j`` after the PS sent it (``L`` + its download).
    loads : ndarray of int, shape (m,)
    vector_bytes : int
        A coded vector's frame size.
    comm : CommModel
    latency : float
        One-way latency ``L`` after the links.
    end_of : callable
        ``end_of(a_r)`` with ``a_r`` of shape (1, m, K): the round's end relative to its start
        (the scheme's exact trigger, or the deadline; ``inf``: never).

    Returns
    -------
    a : ndarray of float64, shape (R, m, K)
    """
    out = np.array(a, dtype=np.float64)
    R, m, _ = out.shape
    js = np.arange(m)
    loads = np.asarray(loads, dtype=np.int64)
    last = np.maximum(loads - 1, 0)
    has = loads > 0
    s_all = np.where(has[None, :], send[:, js, last], np.inf)
    d_up = vector_bytes / comm.up_Bps if comm.up_Bps is not None else None
    d_ps = vector_bytes / comm.ps_Bps if comm.ps_Bps is not None else None
    up_free = np.full(m, -np.inf)
    ps_free = -np.inf
    pend = np.empty(0)  # exits (relative) of sent vectors not yet at the ingress's turn
    for r in range(R):
        s = s_all[r]
        ex = s if d_up is None else np.maximum(s, up_free) + d_up
        if d_ps is None:
            arr = ex + latency
        else:
            e_all = np.concatenate([pend, ex])
            # earlier rounds' frames first among equal exits (they reached the ingress first)
            order = np.argsort(e_all, kind="stable")
            e_sorted = e_all[order]
            f_sorted = fifo_served(e_sorted, d_ps, ps_free)
            f_all = np.empty_like(f_sorted)
            f_all[order] = f_sorted
            arr = f_all[pend.size:] + latency
        out[r, js, last] = np.where(has, arr, np.inf)
        end = float(end_of(out[r:r + 1]))
        if not np.isfinite(end):  # the round never ends: nothing to carry that matters
            up_free, ps_free, pend = np.full(m, -np.inf), -np.inf, np.empty(0)
            continue
        # sent: its chunks were done before the next round start reached the worker
        sent = has & (s - network_s[r] < end + t_round_start)
        if d_up is not None:
            up_free = np.where(sent, ex, up_free) - end
        if d_ps is not None:
            n_done = int(np.searchsorted(e_sorted, end, side="right"))
            ps_free = (float(f_sorted[n_done - 1]) if n_done else ps_free) - end
            keep = np.concatenate([np.ones(pend.size, dtype=bool), sent])
            pend = e_all[keep & (e_all > end)] - end
    return out
