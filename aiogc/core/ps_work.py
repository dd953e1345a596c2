"""The application work a :class:`~aiogc.core.ParameterServer` hands to its driver.

The PS core decides *when* a round is decoded and analysed and on which rows and state; the
numbers come from outside (``aiogc.training.aggregator.Aggregator``), as a worker core's chunk
gradients come from its driver (:class:`~aiogc.core.ComputeChunks`). The driver loop::

    outgoing, events, deadline = ps.poll()      # events is None while work is queued
    item = ps.next_work()                       # a DecodeRound or an AnalyseRound
    ps.work_done(item, aggregator.run(item), now=clock())
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, Protocol

import numpy as np

from aiogc.core.common import RoundRecord
from aiogc.protocol.messages import ChunkGradient, CodedGradient


class DecodeRound(NamedTuple):
    """A round ended: decode its gradient from the ``coded`` vectors at ``state`` and take
    the step.

    The answer is a :class:`Decoded`; the PS starts the next round at the ``now`` that comes
    with it (read *after* the decode, so the decode is not billed to the next round).
    ``decode`` False: the round failed, nothing to decode (the record still goes through, so
    that every round is analysed the same way).
    """

    record: RoundRecord
    exact: bool  # the trigger state was decodable exactly
    reason: str  # the EndReason value the round ended with
    decode: bool
    state: np.ndarray  # (m,) int64: the state the coded vectors were encoded against
    attempt: int
    model: np.ndarray  # (d,) float64: the model the round computed on
    #: worker -> its accepted coded vector's frame (the vectors the state weighs); the
    #: driver side turns them into the (m, p) rows it decodes. A streaming scheme's: chunk ->
    #: the first frame that carried it
    coded: Mapping[int, CodedGradient] | Mapping[int, ChunkGradient]
    dim: int
    #: ordering="adaptive": the round's orders, flattened (as in its round_start); () = static
    orders: tuple[int, ...] = ()


class Decoded(NamedTuple):
    """The answer to a :class:`DecodeRound`."""

    model: np.ndarray  # (d,) the model after the step (the same object if none was taken)
    gradient: np.ndarray | None  # (d,) the applied gradient, None if none was applied
    counters: tuple[str, ...]  # PS statistics to bump (e.g. "rejected_norm", "failed_rounds")
    #: workers to evict (located as inconsistent often enough; the PS closes them
    #: and refuses their key for the rest of the run)
    evict: tuple[int, ...] = ()


class AnalyseRound(NamedTuple):
    """After the next round_start left: decode error, loss and oracle of an ended round,
    written into ``record``; the answer is None and the PS then emits RoundCompleted."""

    record: RoundRecord
    gradient: np.ndarray | None  # (d,) the applied gradient, if any
    w_prev: np.ndarray  # (d,) the model the round computed on
    w_new: np.ndarray  # (d,) the model after it
    oracle_live: bool  # the live counters met the oracle: ``oracle_hint`` is the answer
    oracle_hint: float | None
    orders: tuple[int, ...] = ()  # as in DecodeRound


PSWork = DecodeRound | AnalyseRound


class RoundWorker(Protocol):
    """What a PS driver runs the work items with (``aiogc.training.aggregator.Aggregator``),
    and the check every coded vector passes before the PS accepts it (``screen``: the
    reason and detail of a vector that cannot be used, else None)."""

    def run(self, item: DecodeRound | AnalyseRound) -> Decoded | None: ...

    def screen(self, msg: CodedGradient | ChunkGradient) -> tuple[str, str] | None: ...
