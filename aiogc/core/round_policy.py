"""How a round collects its coded vectors: one policy object, chosen once per run.

* :class:`TriggerAndBroadcast` (partial, uncoded, ...): workers report their chunks, the PS
  tracks coverage and broadcasts ``encode_and_transmit`` once the reported state decodes;
  workers then encode against that state.
* :class:`SendWhenDone` (original): a worker encodes with fixed coefficients and sends once
  its whole load is computed (no reports); the round decodes once the finished workers
  decode, optionally after a spare wait (``spare_wait``, ``spares``: the redundancy check's
  cross-check, and two spares let the aggregator locate one inconsistent worker).
* :class:`StreamWhenDone` (stream-chunks): send-when-done with one frame per chunk: a worker
  sends each chunk's gradient (``chunk_gradient``) as soon as it is computed, and the round
  decodes once every chunk arrived from some holder (the first copy of a chunk is kept, later
  copies are counted and dropped).

:func:`round_policy` picks one from the scheme's declared capability; the PS's round machine
(:mod:`aiogc.core.ps_rounds`) and the worker core ask it at every point where the two ways
differ, and branch on nothing else.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aiogc.coding.base import ProgressTracker, Scheme
from aiogc.core.ps_rules import PSPhase
from aiogc.errors import ConfigError, RemoteProtocolError
from aiogc.protocol.messages import CodedGradient
from aiogc.protocol.status import EndReason

# the round machine and its round state (aiogc.core.ps_rounds, which imports this module)
RoundMachine = Any
_RoundState = Any

__all__ = ["RoundPolicy", "SendWhenDone", "StreamWhenDone", "TriggerAndBroadcast", "round_policy"]

_INF = float("inf")


class RoundPolicy:
    """The points where the two ways of running a round differ (see the module docstring)."""

    #: the PS broadcasts encode_and_transmit (and workers report chunks for its trigger)
    broadcasts: bool = True
    #: workers send every computed chunk as a ``chunk_gradient`` frame (no coded vector)
    streams: bool = False

    def tracker(self, scheme: Scheme) -> ProgressTracker | None:
        """The round's incremental coverage tracker (None: the trigger reads no reports)."""
        raise NotImplementedError

    def fixed_coefficients(self, scheme: Scheme, worker: int) -> np.ndarray | None:
        """``worker``'s (load, ell) coefficients when they do not depend on the state."""
        return None

    def awaits(self, ps: RoundMachine, rs: _RoundState, worker: int) -> bool:
        """In this phase, may ``worker`` (not excluded, nothing received yet) send a vector?"""
        raise NotImplementedError

    def refusal(self, ps: RoundMachine, rs: _RoundState, worker: int, msg: CodedGradient
                ) -> str | None:
        """The counter of a vector the round does not wait for (dropped whatever it holds),
        or None; raises RemoteProtocolError for one encoded against another state."""
        raise NotImplementedError

    def vector_accepted(self, ps: RoundMachine, rs: _RoundState, worker: int, now: float
                        ) -> None:
        """``worker``'s vector was stored in ``rs.received``: end the round if it may."""
        raise NotImplementedError

    def chunk_accepted(self, ps: RoundMachine, rs: _RoundState, now: float) -> None:
        """A streamed chunk's first copy was stored in ``rs.chunks``: end the round if it may
        (streaming policies only)."""
        raise NotImplementedError

    def approx_deadline(self, ps: RoundMachine, rs: _RoundState, now: float) -> None:
        """The approximate deadline passed while computing."""
        raise NotImplementedError

    def round_timeout(self, ps: RoundMachine, rs: _RoundState, now: float) -> None:
        """The round timeout passed."""
        ps._end_round_failed(now, EndReason.TIMEOUT,
                             f"round timeout ({ps.config.round_timeout_s} s)")

    def decode_state(self, ps: RoundMachine, rs: _RoundState) -> np.ndarray:
        """The (m,) state the received vectors decode at."""
        raise NotImplementedError


class TriggerAndBroadcast(RoundPolicy):
    """Reports, incremental trigger, broadcast state, every expected vector."""

    broadcasts = True

    def tracker(self, scheme: Scheme) -> ProgressTracker | None:
        return scheme.progress_tracker()

    def awaits(self, ps: RoundMachine, rs: _RoundState, worker: int) -> bool:
        return ps.phase is PSPhase.COLLECTING and worker in rs.expected

    def refusal(self, ps: RoundMachine, rs: _RoundState, worker: int, msg: CodedGradient
                ) -> str | None:
        if msg.attempt != rs.attempt or not self.awaits(ps, rs, worker):
            return "stale_attempt_coded"
        if msg.state_digest != rs.digest:
            raise RemoteProtocolError("coded vector encoded against another state",
                                      code="bad_state_digest")
        return None

    def vector_accepted(self, ps: RoundMachine, rs: _RoundState, worker: int, now: float
                        ) -> None:
        if len(rs.received) >= len(rs.expected) and set(rs.received) >= rs.expected:
            ps._end_round(now, exact=not rs.approx, reason="all_expected")

    def approx_deadline(self, ps: RoundMachine, rs: _RoundState, now: float) -> None:
        if any(rs.state):
            ps._trigger(now, exact=False)
        else:
            ps._end_round_failed(now, EndReason.NOTHING_COMPUTED,
                                 "deadline with no finished chunk")

    def decode_state(self, ps: RoundMachine, rs: _RoundState) -> np.ndarray:
        assert rs.broadcast is not None
        return np.asarray(rs.broadcast, dtype=np.int64)


class _UploadsWhenDone(RoundPolicy):
    """A policy whose workers upload without a broadcast: at the approximate deadline or the
    round timeout (approximate mode) the round decodes whatever :meth:`collected` says it
    has, and fails without anything."""

    #: the failure's detail when the deadline finds nothing
    nothing = "deadline with nothing received"

    def collected(self, rs: _RoundState) -> bool:
        """Whether the round has received anything it could decode approximately."""
        raise NotImplementedError

    def approx_deadline(self, ps: RoundMachine, rs: _RoundState, now: float) -> None:
        if self.collected(rs):
            rs.record.t_trigger = now
            ps._end_round(now, exact=False, reason="deadline")
        else:
            ps._end_round_failed(now, EndReason.NOTHING_COMPUTED, self.nothing)

    def round_timeout(self, ps: RoundMachine, rs: _RoundState, now: float) -> None:
        if self.collected(rs) and ps.config.mode == "approx":
            ps._end_round(now, exact=False, reason="round_timeout")
        else:
            super().round_timeout(ps, rs, now)


class SendWhenDone(_UploadsWhenDone):
    """Fixed coefficients, a vector per finished worker, decode once the finished decode.

    Parameters
    ----------
    spare_wait : float
        Once the received vectors decode, wait up to ``spare_wait`` times the round's elapsed
        time so far (never past the round timeout or the approximate deadline) for
        ``spares`` more vectors; 0: decode at once.
    spares : int
        How many spare vectors that wait is for.
    """

    broadcasts = False

    def __init__(self, spare_wait: float = 0.0, spares: int = 1) -> None:
        self.spare_wait = float(spare_wait)
        self.spares = int(spares)

    def tracker(self, scheme: Scheme) -> ProgressTracker | None:
        return None

    def fixed_coefficients(self, scheme: Scheme, worker: int) -> np.ndarray | None:
        fixed = scheme.fixed_coefficients(worker)
        if fixed is None:
            return None
        theta = np.asarray(fixed, dtype=np.float64)
        load = int(scheme.loads[worker])
        return theta if theta.ndim == 2 and theta.shape[0] == load else None

    def awaits(self, ps: RoundMachine, rs: _RoundState, worker: int) -> bool:
        return ps.phase is PSPhase.COMPUTING

    def refusal(self, ps: RoundMachine, rs: _RoundState, worker: int, msg: CodedGradient
                ) -> str | None:
        return None if ps.phase is PSPhase.COMPUTING else "late_or_duplicate_coded"

    def vector_accepted(self, ps: RoundMachine, rs: _RoundState, worker: int, now: float
                        ) -> None:
        load = ps._loads_list[worker]
        if rs.state[worker] < load:
            rs.state[worker] = load  # it finished everything (it sent no chunk reports)
        if rs.finished is not None:
            rs.finished[worker] = load
        if rs.spare_at != _INF:
            if len(rs.received) >= rs.spare_need:
                ps._end_round(now, exact=True, reason="decodable")  # the spares arrived
        elif ps._decodable_received(rs):
            rs.record.t_trigger = now
            if not self._wait_for_spare(ps, rs, now):
                ps._end_round(now, exact=True, reason="decodable")

    def _wait_for_spare(self, ps: RoundMachine, rs: _RoundState, now: float) -> bool:
        """Decodable now: wait for a spare vector (the redundancy check's cross-check)?

        Only with ``spare_wait`` > 0 and a worker still in the round that has not sent. The
        wait is ``spare_wait`` times the round's own elapsed time (a round that took 40 ms to
        decode waits at most 40 ms * spare_wait more), capped by the round timeout and the
        approximate deadline. Returns True when waiting (``rs.spare_at`` set).
        """
        factor = self.spare_wait
        if factor <= 0:
            return False
        if not set(range(ps.m)) - rs.excluded - set(rs.received):
            return False  # nobody left to send a spare
        until = now + factor * max(0.0, now - rs.record.t_start)
        rs.spare_at = min(until, rs.timeout_at, rs.approx_at)
        rs.spare_need = len(rs.received) + self.spares
        if rs.spare_at <= now:
            rs.spare_at = _INF
            return False
        return True

    nothing = "deadline with no finished worker"

    def collected(self, rs: _RoundState) -> bool:
        return bool(rs.received)

    def decode_state(self, ps: RoundMachine, rs: _RoundState) -> np.ndarray:
        state: np.ndarray = ps._finished_state(rs.received)
        return state


class StreamWhenDone(_UploadsWhenDone):
    """One ``chunk_gradient`` frame per computed chunk; decode once every chunk arrived.

    The PS core keeps the first frame of every chunk (``_RoundState.chunks``); the state
    counts every frame a worker sent (duplicates included: its first ``c_j`` chunks arrived),
    and the decode sums the kept copies (:meth:`aiogc.training.aggregator.Aggregator`).
    """

    broadcasts = False
    streams = True

    def tracker(self, scheme: Scheme) -> ProgressTracker | None:
        return None

    def awaits(self, ps: RoundMachine, rs: _RoundState, worker: int) -> bool:
        return False  # no coded vector: chunk frames are received into fresh arrays

    def refusal(self, ps: RoundMachine, rs: _RoundState, worker: int, msg: CodedGradient
                ) -> str | None:
        raise RemoteProtocolError("coded_gradient in a streaming run (chunk_gradient only)",
                                  code="bad_kind")

    def vector_accepted(self, ps: RoundMachine, rs: _RoundState, worker: int, now: float
                        ) -> None:
        raise AssertionError("a streaming round accepts chunks, not vectors")

    def chunk_accepted(self, ps: RoundMachine, rs: _RoundState, now: float) -> None:
        """A first copy was kept in ``rs.chunks``: end the round once every chunk is there."""
        if len(rs.chunks) == ps.scheme.n_chunks:
            rs.record.t_trigger = now
            ps._end_round(now, exact=True, reason="decodable")

    nothing = "deadline with no chunk received"

    def collected(self, rs: _RoundState) -> bool:
        return bool(rs.chunks)

    def decode_state(self, ps: RoundMachine, rs: _RoundState) -> np.ndarray:
        return np.asarray(rs.state, dtype=np.int64)


def round_policy(scheme: Scheme, *, spare_wait: float = 0.0, spares: int = 1) -> RoundPolicy:
    """The policy ``scheme`` runs its rounds with (the one place that asks the scheme).

    ``spare_wait`` in [0, 100] and ``spares`` in [1, m] (send-when-done schemes only; a
    trigger scheme ignores them): :class:`SendWhenDone`'s parameters.
    """
    if not 0 <= spare_wait <= 100:
        raise ConfigError("spare_wait", spare_wait, "a number in [0, 100]")
    if type(spares) is not int or not 1 <= spares <= scheme.m:
        raise ConfigError("spares", spares, f"an integer in [1, {scheme.m}]")
    if scheme.uploads_per_chunk:
        return StreamWhenDone()
    if scheme.sends_when_done:
        return SendWhenDone(spare_wait, spares)
    return TriggerAndBroadcast()
