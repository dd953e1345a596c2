"""Communication model of the simulators: per-worker link rates, a shared PS ingress, frame bytes.

A :class:`~aiogc.config.CommModel` is parsed once from a spec string
(:func:`~aiogc.config.parse_bandwidth`, a ``RunConfig.bandwidth`` field), e.g.
``worker=100MB/s,ps=1GB/s``. Keys: ``worker`` (upload and download), ``worker_up``,
``worker_down``, ``ps`` (the PS's shared ingress). Units ``B/s``, ``KB/s``, ``MB/s``,
``GB/s`` (decimal: 1 MB = 10**6 bytes); a key left out is an unlimited link.

Timing model (the same in the fast path and, for the per-worker links, the protocol engine;
``L`` is the engine's one-way per-frame latency, ``b`` a frame's bytes on the wire):

* **per-worker links** (upload and download, independent): each is a FIFO serialiser, one
  frame at a time at its rate. A frame handed to worker ``j``'s uplink at ``s`` leaves it at
  ``e = max(s, e_prev) + b / worker_up`` (``e_prev``: when the previous frame on that link
  left); with no PS ingress it arrives at ``e + L``. Downloads likewise (the PS has one
  download link per worker and no egress limit).
* **shared PS ingress** (``ps=``, optional): a FIFO serialiser at rate ``ps`` fed by every
  worker's uplink, store-and-forward at frame granularity: a frame enters the ingress queue
  when it has left its worker's uplink (``e``), frames are served in the order of ``e``, and
  it arrives at ``max(e, f_prev) + b / ps + L`` (``f_prev``: when the ingress finished the
  frame before). FIFO and not processor sharing because it is *exact and causal*: a frame's
  arrival is fixed by the frames that entered the queue before it, so the fast path computes
  it in one sweep per trial, vectorised over trials, with no re-scheduling; uploads that
  overlap do share the ingress (its total work is conserved, so the last of a burst arrives
  exactly when a fluid fair share would deliver it; only the order within a burst differs).
  Store-and-forward per frame over-counts a lone frame by ``b / max(worker_up, ps)`` against
  a packetised pipeline (1 % at ``worker=10MB/s,ps=1GB/s``).
* frames are counted with their real size on the wire (:class:`FrameBytes`, measured with the
  wire codec :func:`~aiogc.protocol.wire.encode_frame` on representative messages: a frame's
  head does not grow with its payload); without frame authentication (the simulators run none;
  a live authenticated frame carries :data:`~aiogc.protocol.tags.TAG_BYTES` more).

Links carry from round to round, as live and in the protocol engine, by one rule for every
scheme (:mod:`aiogc.sim.carry`): a frame handed to an uplink before the next round start
reached its worker has been sent and still occupies its uplink and the shared ingress; a
worker still computing when the round start arrives sends nothing more. For partial nothing
is in flight when the PS starts the next round; in the send-when-done schemes (original,
uncoded, ignore-stragglers) a straggler whose chunks were done in time has sent its vector,
and in stream-chunks every chunk vector a worker finished in time (duplicates included), so
the fast path walks the rounds in order for them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from aiogc.coding.base import Scheme
from aiogc.config import CommModel
from aiogc.errors import ConfigError
from aiogc.protocol.messages import (
    ChunkGradient,
    ChunkReport,
    CodedGradient,
    EncodeAndTransmit,
    RoundStart,
)
from aiogc.protocol.wire import encode_frame

__all__ = [
    "FrameBytes",
    "engine_ingress",
    "engine_latency",
    "frame_bytes",
    "link_exits",
    "ps_ingress",
]

def frame_bytes(msg: Any) -> int:
    """Bytes of ``msg`` on the wire (header + array), from the wire codec, untagged."""
    return int(sum(memoryview(p).nbytes for p in encode_frame(msg)))


@dataclass(frozen=True)
class FrameBytes:
    """Wire sizes of the frames one round moves (bytes).

    Attributes
    ----------
    round_start : ndarray of int64, shape (m,)
        The round-start broadcast (model of ``dim`` values of ``model_dtype``, the PS sends it
        in the payload dtype; the worker's ``load`` scheduled
        delays).
    report, encode : int
        A chunk report; an encode_and_transmit (state of length m).
    vector : int
        A coded vector (``payload_len(dim)`` values of the payload dtype).
    chunk_vector : int
        One chunk's gradient (``dim`` values of ``model_dtype``, the payload dtype) in its
        ``chunk_gradient`` frame (streaming schemes).
    """

    round_start: np.ndarray
    report: int
    encode: int
    vector: int
    chunk_vector: int

    @classmethod
    def of(cls, scheme: Scheme, dim: int, dtype: Any = "float64",
           model_dtype: Any = "float64") -> FrameBytes:
        """Measure every frame kind on representative messages of ``scheme`` at ``dim``
        (coded vectors of ``dtype``, the model in ``model_dtype``: ``RunConfig.payload_dtype``,
        which the PS's round_start carries; a float32 run's model is half a float64's bytes).

        A frame's head does not depend on its array's length (the payload is a bin32), so
        each kind is encoded once with a one-value array and the other ``n - 1`` values are
        added (``tests/test_comm.py`` checks this against whole frames).
        """
        dt = np.dtype(dtype)
        m, d = int(scheme.m), int(dim)
        loads = np.asarray(scheme.loads, dtype=np.int64)
        mdt = np.dtype(model_dtype)
        one = np.zeros(1, dtype=mdt)
        by_load = {int(n): frame_bytes(RoundStart(epoch=1, round=1, delays_s=(0.5,) * int(n),
                                                  net_delay_s=0.0, model=one))
                   + mdt.itemsize * (d - 1)
                   for n in np.unique(loads)}
        rs = np.array([by_load[int(n)] for n in loads], dtype=np.int64)
        rep = frame_bytes(ChunkReport(epoch=1, round=1, count=1, t_worker=1.0, elapsed_s=1.0))
        enc = frame_bytes(EncodeAndTransmit(epoch=1, round=1, attempt=0, state=(1,) * m))
        head = frame_bytes(CodedGradient(epoch=1, round=1, attempt=0, state_digest=b"\0" * 8,
                                         compute_s=1.0, payload=np.zeros(1, dtype=dt)))

        # a streamed chunk travels in the payload dtype (never a 16-bit upload type)
        chunk_head = frame_bytes(ChunkGradient(epoch=1, round=1, chunk=0, compute_s=1.0,
                                               elapsed_s=1.0, payload=one))
        return cls(rs, rep, enc, int(head + dt.itemsize * (int(scheme.payload_len(d)) - 1)),
                   int(chunk_head + mdt.itemsize * (d - 1)))


def link_exits(send: np.ndarray, nbytes: np.ndarray | float, rate: float | None) -> np.ndarray:
    """When each frame leaves a FIFO link of ``rate`` (one link per row ``(r, j)``).

    Parameters
    ----------
    send : ndarray of float64, shape (R, m, n)
        When each frame is handed to the link, in link order along the last axis; ``inf``:
        never sent (takes no link time).
    nbytes : ndarray, broadcastable to (R, m, n)
    rate : float or None
        Bytes per second; ``None``: no serialisation (exit = send).

    Returns
    -------
    exit : ndarray of float64, shape (R, m, n)
    """
    if rate is None:
        return np.array(send, dtype=np.float64)
    dur = np.broadcast_to(np.asarray(nbytes, dtype=np.float64) / rate, send.shape)
    out = np.empty_like(send, dtype=np.float64)
    free = np.zeros(send.shape[:2])
    for k in range(send.shape[2]):
        e = np.maximum(send[:, :, k], free) + dur[:, :, k]
        out[:, :, k] = e
        free = np.where(np.isfinite(e), e, free)
    return out


def ps_ingress(exits: np.ndarray, nbytes: np.ndarray | float, rate: float | None) -> np.ndarray:
    """When each frame has crossed the shared FIFO ingress (served in order of ``exits``).

    Parameters
    ----------
    exits : ndarray of float64, shape (R, m, n)
        When each frame left its worker's uplink (``inf``: never sent).
    nbytes : ndarray, broadcastable to (R, m, n)
    rate : float or None
        ``None``: no shared ingress (returns ``exits``).

    Returns
    -------
    done : ndarray of float64, shape (R, m, n)
    """
    if rate is None:
        return np.array(exits, dtype=np.float64)
    R = exits.shape[0]
    flat = exits.reshape(R, -1)
    dur = np.broadcast_to(np.asarray(nbytes, dtype=np.float64) / rate, exits.shape).reshape(R, -1)
    order = np.argsort(flat, axis=1, kind="stable")
    rows = np.arange(R)
    done = np.full_like(flat, np.inf)
    free = np.zeros(R)
    for i in range(flat.shape[1]):
        idx = order[:, i]
        e = flat[rows, idx]
        f = np.maximum(e, free) + dur[rows, idx]
        done[rows, idx] = f
        free = np.where(np.isfinite(f), f, free)
    return done.reshape(exits.shape)


def engine_latency(comm: CommModel, latency: float, clock: Callable[[], float], *,
                   ingress: bool = False) -> Callable[[int, str, Any], float]:
    """A latency function for :class:`~aiogc.sim.engine.Simulation` with the per-worker links.

    ``clock()`` must return the engine's current time (``sim.now``): the function is called
    when a frame is sent, and returns ``exit - now + latency`` with ``exit`` from the FIFO rule
    of the module docstring (the engine's own FIFO-per-link rule then changes nothing, since
    these arrivals are already in order). ``ingress``: the engine runs the shared PS ingress
    (:func:`engine_ingress`), so an upload's delay ends when it left its uplink (the latency
    follows the ingress).
    """
    if comm.ps_Bps is not None and not ingress:
        raise ConfigError("bandwidth.ps", comm.ps_Bps,
                          "ingress=True, with the engine's shared ingress (engine_ingress)")
    free: dict[tuple[int, str], float] = {}

    def fn(worker: int, direction: str, msg: Any) -> float:
        rate = comm.up_Bps if direction == "up" else comm.down_Bps
        after = 0.0 if ingress and direction == "up" else latency
        if rate is None:
            return after
        now = clock()
        key = (worker, direction)
        e = max(now, free.get(key, 0.0)) + frame_bytes(msg) / rate
        free[key] = e
        return (e - now) + after

    return fn


def engine_ingress(comm: CommModel, latency: float) -> tuple[Callable[[Any], float], float]:
    """The ``ingress`` argument of :class:`~aiogc.sim.engine.Simulation` for ``comm.ps_Bps``:
    ``(bytes / ps rate, latency)``."""
    if comm.ps_Bps is None:
        raise ConfigError("bandwidth.ps", None, "a shared ingress rate")
    rate = comm.ps_Bps
    return (lambda msg: frame_bytes(msg) / rate), latency
