"""Frames that carry into the next round: one rule for every scheme.

**The rule.** A frame a worker handed to its uplink before the next ``round_start`` reached it
has been sent: it keeps the worker's uplink and the shared PS ingress busy into the next round
until they have carried it, as it does live and in the protocol engine (whose links persist
across rounds). A worker still computing when the ``round_start`` arrives drops the rest of
the round and sends nothing more. What that leaves in flight depends on when a scheme sends:

* send-when-done schemes (original, uncoded, ignore-stragglers): worker ``j`` hands its one
  coded vector (slot ``loads[j] - 1``) to its uplink once all its chunks are done, and the PS
  ends the round once the vectors it holds decode (or at the deadline T); a straggler whose
  chunks were done before the next ``round_start`` reached it has sent its vector;
* streaming schemes (stream-chunks): every finished chunk's gradient is a vector frame, and
  the PS ends the round once every chunk arrived from some holder; every frame a worker
  finished before the next ``round_start`` reached it has been sent, duplicates included;
* trigger schemes (partial): the small reports go as chunks finish and the coded vectors only
  when the PS asks, after the trigger; the round ends when the last asked vector arrived,
  and every frame handed over before the trigger has exited its uplink before that vector
  (FIFO, earlier and smaller), so their rounds are independent. The one exception is not
  modelled: a report that a network hold (``network_s``) keeps on the wire past the last
  vector (a few dozen bytes, beside vectors of ``8 d``).

So under a limited communication model the rounds of one schedule are no longer independent:
:func:`carried_arrivals` walks them in order, with times relative to each round's start
(the previous round's end), and carries

* ``up_free[j]``: when worker ``j``'s uplink has carried its last sent frame;
* ``ps_free``: when the ingress has served every frame that left its uplink by the round's
  end (the next round's frames all leave later: FIFO by exit time, as in
  :func:`~aiogc.sim.comm.ps_ingress`);
* the sent frames that left their uplinks *after* the round's end (still to be merged, by exit
  time, with the next round's frames at the ingress).

``tests/test_comm_carry.py`` checks it trial by trial against the protocol engine (the
schemes it runs) and by hand, and stream-chunks against a frame-by-frame event reference.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from aiogc.config import CommModel

__all__ = ["carried_arrivals", "fifo_served"]


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


def carried_arrivals(
    a: np.ndarray,
    send: np.ndarray,
    frame_slots: np.ndarray,
    network_s: np.ndarray,
    t_round_start: np.ndarray,
    frame_bytes: int,
    comm: CommModel,
    latency: float,
    end_of: Callable[[np.ndarray], float],
) -> np.ndarray:
    """Arrival times of the vector frames of a scheme with the links carried across rounds.

    Parameters
    ----------
    a : ndarray of float64, shape (R, m, K)
        The independent-round arrivals (:func:`aiogc.sim.fast.arrival_times`); a copy is
        returned with every slot of ``frame_slots`` recomputed.
    send : ndarray of float64, shape (R, m, K)
        When worker ``j`` hands its ``k``-th chunk's frame to its uplink, relative to the round
        start (``inf`` beyond its load); ascending in ``k``.
    frame_slots : ndarray of bool, shape (m, K)
        The slots that carry a vector frame: ``loads[j] - 1`` for a send-when-done scheme,
        every slot below the load for a streaming one.
    network_s : ndarray of float64, shape (R, m)
        The schedule's hold on worker ``j``'s frames (included in ``send``).
    t_round_start : ndarray of float64, shape (m,)
        When the round start reaches worker ``j`` after the PS sent it (``L`` + its download).
    frame_bytes : int
        A vector frame's size.
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
    R, m, K = out.shape
    slots = np.asarray(frame_slots, dtype=bool)
    jj, kk = np.nonzero(slots)  # worker by worker, each worker's frames in slot order
    d_up = frame_bytes / comm.up_Bps if comm.up_Bps is not None else None
    d_ps = frame_bytes / comm.ps_Bps if comm.ps_Bps is not None else None
    up_free = np.full(m, -np.inf)
    ps_free = -np.inf
    pend = np.empty(0)  # exits (relative) of sent frames not yet at the ingress's turn
    for r in range(R):
        s = send[r, jj, kk]
        if d_up is None:
            ex = s
        else:  # each uplink a FIFO over its worker's frames, from where the last round left it
            E = np.full((m, K), np.inf)
            prev = up_free.copy()
            for k in range(K):
                e_k = np.maximum(send[r, :, k], prev) + d_up
                use = slots[:, k] & np.isfinite(send[r, :, k])
                E[use, k] = e_k[use]
                prev = np.where(use, e_k, prev)
            ex = E[jj, kk]
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
        out[r, jj, kk] = np.where(np.isfinite(s), arr, np.inf)
        end = float(end_of(out[r:r + 1]))
        if not np.isfinite(end):  # the round never ends: nothing to carry that matters
            up_free, ps_free, pend = np.full(m, -np.inf), -np.inf, np.empty(0)
            continue
        # sent: handed to the uplink before the next round start reached the worker
        sent = np.isfinite(s) & (s - network_s[r, jj] < end + t_round_start[jj])
        if d_up is not None:
            last = np.full(m, -np.inf)
            np.maximum.at(last, jj[sent], ex[sent])
            up_free = np.maximum(up_free, last) - end
        if d_ps is not None:
            n_done = int(np.searchsorted(e_sorted, end, side="right"))
            ps_free = (float(f_sorted[n_done - 1]) if n_done else ps_free) - end
            keep = np.concatenate([np.ones(pend.size, dtype=bool), sent])
            pend = e_all[keep & (e_all > end)] - end
    return out
