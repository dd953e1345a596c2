"""The PS side's coded vectors: the receive rows, the check of each vector, the decode input.

The PS core (:class:`aiogc.core.ParameterServer`) decides which worker's vector it awaits and
which ones a round decodes; it never reads their numbers. This module holds them: one row per
worker of the upload type (``RunConfig.coded_wire_dtype``), reused across rounds, that the
network layer receives each vector straight into (zero-copy: docs/performance.md, pitfall 4);
the check a vector passes before the core accepts it (:meth:`CodedRows.screen`: length, dtype,
finite values, 16-bit formats included); and the (m, p) matrix a ``DecodeRound`` decodes
(:meth:`CodedRows.fill`). The :class:`~aiogc.training.aggregator.Aggregator` owns one.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from aiogc.coding.consistency import all_finite
from aiogc.protocol.messages import ChunkGradient, CodedGradient

__all__ = ["REJECTED", "CodedRows"]

#: the drop reason (and PS counter) of a vector that fails :meth:`CodedRows.screen`
REJECTED = "payload_rejected"


class CodedRows:
    """The (m, p) rows of the coded vectors a PS receives.

    Parameters
    ----------
    m : int
        Workers (one row each).
    length : int
        p, the length of a coded vector (``scheme.payload_len(d)``).
    dtype : numpy dtype
        The upload type: the run's payload dtype, or the bits of its 16-bit ``coded_dtype``.
    """

    def __init__(self, m: int, length: int, dtype: np.dtype) -> None:
        self.length = int(length)
        self.dtype = np.dtype(dtype)
        self.array = np.zeros((m, self.length), dtype=self.dtype)
        #: one persistent view per row, so that "received in place" is an identity check
        self._rows: list[np.ndarray] = list(self.array)

    def row(self, worker: int, dtype: np.dtype, n: int) -> np.ndarray | None:
        """Destination of worker ``worker``'s vector of ``n`` elements of ``dtype`` (zero-copy
        receive), or None (the network layer then allocates and :meth:`screen` names what is
        wrong) when the dtype or length is not this run's."""
        if n != self.length or np.dtype(dtype) != self.dtype:
            return None
        return self._rows[worker]

    def screen(self, msg: CodedGradient | ChunkGradient) -> tuple[str, str] | None:
        """Why ``msg``'s vector cannot be used, as ``(REJECTED, detail)`` (its length, dtype,
        or non-finite values), or None when it can."""
        vec = msg.payload
        if vec.shape != (self.length,):
            return REJECTED, f"length {vec.shape[0]} != {self.length}"
        dt = self.dtype
        if vec.dtype is not dt and vec.dtype != dt:
            return REJECTED, f"dtype {vec.dtype.str} != {dt.str}"
        if dt.kind == "u":  # bfloat16 bits (coded_dtype): exponent all ones is inf or NaN
            if np.count_nonzero((vec & 0x7F80) == 0x7F80):
                return REJECTED, "non-finite values"
        elif not all_finite(vec):
            return REJECTED, "non-finite values"
        return None

    def fill(self, coded: Mapping[int, CodedGradient]) -> np.ndarray:
        """The (m, p) rows with each accepted vector of ``coded`` (worker -> its frame) in its
        worker's row (copied unless it was received in place); the other rows hold older
        vectors, which the round's state gives no weight."""
        rows = self._rows
        for worker, msg in coded.items():
            row = rows[worker]
            vec = msg.payload
            if vec is not row:
                row[:] = vec  # not received in place (tests, simulator): copy into the row
        return self.array

    def streamed(self, chunks: Mapping[int, ChunkGradient], owner: np.ndarray,
                 orders: list[list[int]]) -> np.ndarray:
        """The (m, p) rows of a streaming scheme's round: row ``j`` is the sum, in ``j``'s
        processing order, of the kept copies of the chunks the decode state assigns to ``j``
        (``owner[i]``, -1: chunk ``i`` never arrived), the vector ``j`` would have sent in the
        scheme's one-shot form; the other rows are zero.

        Parameters
        ----------
        chunks : mapping of int to ChunkGradient
            Chunk -> the first frame that carried it (payloads of shape (p,)).
        owner : ndarray of int64, shape (N,)
        orders : list of m lists of int
            Every worker's processing order.
        """
        out = self.array
        out[:] = 0
        for j in np.unique(owner[owner >= 0]).tolist():
            mine = [chunks[i].payload for i in orders[j] if owner[i] == j]
            out[j] = np.array(mine).sum(axis=0)
        return out

