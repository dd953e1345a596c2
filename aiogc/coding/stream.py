"""Chunk streaming: every worker uploads each finished chunk's gradient as it finishes.

The natural competitor of the partial scheme: no coding, the same replicated
assignment (any construction, ``speed-aware`` included: streaming only needs every chunk on
some holder) and processing orders (partial's ``optimal`` ordering at ``ell = 1``, drawn from the
same seed, so with free communication its completion time equals partial's ``ell = 1``
trigger, trial by trial). The PS completes as soon as every chunk has arrived from *some*
holder; the decode is exact (the sum of one copy of every chunk). The price is traffic: up to
``delta`` uploads of ``d`` values per worker, against one upload of ``d / ell`` for partial.

Where it runs: everywhere. :attr:`uploads_per_chunk` makes the cores run it with the
:class:`~aiogc.core.round_policy.StreamWhenDone` policy: a worker sends each chunk's gradient
as a ``chunk_gradient`` frame as soon as it is computed, and the PS keeps the first copy of
every chunk and decodes once every chunk arrived (docs/protocol.md §1.5), in the protocol
engine and live. The fast path (:mod:`aiogc.sim.fast`) models the same: ``arrivals[r, j, k]``
is the arrival of worker ``j``'s ``k``-th chunk frame (``d`` values, sized by the wire codec
under a communication model) and the round ends at the trigger. The decode uses the scheme's
one-shot form: at a state ``c`` every chunk is *designated* to its first covering holder
(lowest worker index), worker ``j``'s row is the sum of its designated chunks, and the PS adds
the rows; with the kept copies in those rows that is the sum of one copy of every chunk (what
the fast path's MSE uses, checked against brute force in ``tests/test_stream.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from aiogc.coding.assignments import validate_assignment
from aiogc.coding.base import DecodeResult, SchemeBase, combine
from aiogc.coding.ordering_registry import build_orders, ordering_names
from aiogc.coding.orderings import q_max
from aiogc.coding.partial import CoverageTracker
from aiogc.coding.registry import (
    ASSIGNMENTS,
    SchemeParams,
    SchemeSpec,
    build_assignment,
    register_scheme,
)
from aiogc.errors import CodingError

__all__ = ["StreamChunksScheme"]


class StreamChunksScheme(SchemeBase):
    """Workers stream every finished chunk gradient; exact once every chunk arrived once.

    Parameters
    ----------
    A : array_like of bool, shape (N, m)
        The assignment (replication as for the coded schemes).
    orders : list of m int arrays
        Processing order of each worker's chunks.
    """

    name = "stream-chunks"
    sends_when_done = False
    uploads_per_chunk = True

    def __init__(self, A: object, orders: list[np.ndarray]) -> None:
        Av = validate_assignment(A)
        if len(orders) != Av.shape[1]:
            raise CodingError(f"{len(orders)} orders for m={Av.shape[1]} workers")
        super().__init__(Av, 1, [np.asarray(o, dtype=np.int64) for o in orders])
        # the edge list of SchemeBase sorted by chunk, for the closed-form decode time
        self._by_chunk = np.argsort(self._e_chunk, kind="stable")
        self._chunk_starts = np.searchsorted(self._e_chunk[self._by_chunk],
                                             np.arange(self.n_chunks))

    # ---- the waiting rule ---------------------------------------------------------------

    def is_decodable(self, state: object) -> bool:
        """Every chunk arrived from at least one holder (``min_i |U_i(c)| >= 1``)."""
        return bool(self.coverage(state).min() >= 1) if self.n_chunks else True

    def decode_times(self, arrivals: np.ndarray) -> np.ndarray:
        """``max_i min_{j holds i} arrivals[r, j, pos_j(i) - 1]``: shape (R,); ``inf`` if never.

        Parameters
        ----------
        arrivals : ndarray, shape (R, m, K)
            ``arrivals[r, j, k]``: when worker ``j``'s ``(k+1)``-th chunk vector arrives.
        """
        a = self._check_arrivals(arrivals)
        per_edge = a[:, self._e_worker, self._e_pos - 1][:, self._by_chunk]  # (R, E)
        if per_edge.shape[1] == 0:
            return np.zeros(a.shape[0])
        first = np.minimum.reduceat(per_edge, self._chunk_starts, axis=1)  # (R, N)
        return np.asarray(first.max(axis=1))

    def progress_tracker(self) -> CoverageTracker:
        """Incremental form of :meth:`is_decodable`: partial's coverage counters at ell = 1."""
        return CoverageTracker([o.tolist() for o in self.orders], self.n_chunks, 1)

    def q_max(self) -> int:
        """Worst-case chunk computations before every chunk is covered (partial at ell = 1)."""
        return q_max(self.A, self.orders, 1)

    # ---- the one-shot form (core interface, MSE) ------------------------------------------

    def designated(self, state: object) -> np.ndarray:
        """The worker each chunk is taken from at ``state``: its lowest-index covering holder,
        ``-1`` if uncovered. Shape (N,), int64."""
        c = self.check_state(state)
        cov = self._e_pos <= c[self._e_worker]
        out = np.full(self.n_chunks, -1, dtype=np.int64)
        # edges are in worker order: keep the first covering worker of every chunk
        for w, i in zip(self._e_worker[cov][::-1], self._e_chunk[cov][::-1], strict=True):
            out[i] = w
        return out

    def contributes(self, worker: int, state: object) -> bool:
        """Whether ``worker`` is the designated holder of some chunk at ``state``."""
        j = self._check_worker(worker)
        return bool((self.designated(state) == j).any())

    def encode(self, worker: int, state: object, chunk_grads: np.ndarray) -> np.ndarray:
        """Sum of the worker's designated chunks; shape (d,).

        ``chunk_grads`` holds the worker's chunk gradients in processing order (at least
        ``state[worker]`` rows).
        """
        j = self._check_worker(worker)
        c = self.check_state(state)
        G = np.asarray(chunk_grads)
        if G.ndim != 2 or G.shape[0] < c[j]:
            raise CodingError(f"chunk_grads has shape {G.shape}: expected ({c[j]}, d) or more")
        mine = np.flatnonzero(self.designated(c) == j)
        rows = np.flatnonzero(np.isin(self.orders[j][: c[j]], mine))
        return np.asarray(G[rows].sum(axis=0))

    def decode_result(
        self, coded: Mapping[int, np.ndarray] | np.ndarray, state: object, dim: int
    ) -> DecodeResult:
        """Sum of the designated holders' vectors: exact iff every chunk is covered;
        otherwise the sum of the covered chunks, ``residual = sqrt(#uncovered / N)``."""
        c = self.check_state(state)
        dim = self._check_dim(dim)
        des = self.designated(c)
        used = np.unique(des[des >= 0])
        full = np.zeros((1, self.m))
        full[:, used] = 1.0
        grad = combine(full, used, coded, dim)
        missing = int((des < 0).sum())
        exact = missing == 0
        res = 0.0 if exact else float(np.sqrt(missing / self.n_chunks))
        return DecodeResult(grad, exact, res, 1.0, int(used.size), full)


def _build_stream(p: SchemeParams) -> StreamChunksScheme:
    A = build_assignment(p)
    # partial's ell = 1 orders (optimal: the static optimum on a uniform cluster, bit for bit)
    orders = build_orders(p.ordering, A, 1, p.rng, p.speeds, p.sizes)
    return StreamChunksScheme(A, orders)


register_scheme(SchemeSpec(
    name="stream-chunks", build=_build_stream, sends_when_done=False, uploads_per_chunk=True,
    waiting="every chunk's gradient arrived from some holder (streamed as each finishes)",
    exactness="exact once every chunk arrived; the covered chunks' sum before",
    decoder="sum of one streamed copy of every chunk", forced_n_parts=1,
    assignments=ASSIGNMENTS, orderings=ordering_names(static=True)))
