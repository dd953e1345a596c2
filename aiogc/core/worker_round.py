"""The worker's round half: round_start -> chunks due -> chunk reports -> coded vectors, then
resume or round_end (the base class of :class:`aiogc.core.worker.Worker`, which adds the
connection: handshake, setup, liveness and the driver's calls).

Every phase change goes through :meth:`WorkerRounds._set_phase`, checked against
``worker_rules.TRANSITIONS`` before anything changes.
"""

from __future__ import annotations

import operator
from collections import deque
from itertools import accumulate
from typing import Any

import numpy as np

from aiogc.coding.adaptive import unflatten_orders
from aiogc.coding.base import Scheme, TrustedEncoder
from aiogc.core.common import (
    ComputeChunks,
    EncodeVector,
    Endpoint,
    RoundEnded,
    fast_new,
    handles,
    new_chunk_computed,
    new_coded_sent,
    new_compute_chunks,
    new_encode_vector,
    new_outgoing,
)
from aiogc.core.round_policy import RoundPolicy, TriggerAndBroadcast
from aiogc.core.worker_rules import NEXT, PS_PEER, RUNNING, WorkerPhase
from aiogc.core.worker_setup import SchemeFacts, Setup
from aiogc.errors import CodingError, LocalProtocolError, RemoteProtocolError
from aiogc.protocol.messages import (
    ChunkGradient,
    ChunkReport,
    CodedGradient,
    EncodeAndTransmit,
    Message,
    Resume,
    RoundEnd,
    RoundStart,
    state_digest,
)

__all__ = ["WorkerRounds"]

_F8 = np.dtype(np.float64)

# unvalidated constructors of the frames this worker builds itself (see fast_new)
_new_report = fast_new(ChunkReport, ChunkReport._names)
_new_coded = fast_new(CodedGradient, CodedGradient._names)
_new_chunk = fast_new(ChunkGradient, ChunkGradient._names)

# Phase members as module constants, as in worker.py (the one micro-idiom kept: a module
# global is found in one dict lookup, an Enum class attribute goes through the class's
# descriptor machinery, and phase checks run on every message)
_W_IDLE = WorkerPhase.IDLE
_W_COMPUTING = WorkerPhase.COMPUTING
_W_WAITING = WorkerPhase.WAITING


class WorkerRounds(Endpoint):
    """The per-round state machine of one worker (see :class:`aiogc.core.worker.Worker`).

    Parameters
    ----------
    worker_id : int
    progress_events : bool
        Emit the per-chunk, per-vector and per-round telemetry events.
    """

    #: the current phase: CLOSED until the driver's first ``connection_made``; changed only
    #: by :meth:`_set_phase` (checked against ``worker_rules.TRANSITIONS``)
    phase: WorkerPhase = WorkerPhase.CLOSED

    def __init__(self, worker_id: int, progress_events: bool) -> None:
        super().__init__()
        self.worker_id = worker_id
        self.progress_events = progress_events
        self.setup: Setup | None = None
        self._facts = SchemeFacts()  # the current setup's, shared through the WorkerCache
        self._work: list[ComputeChunks | EncodeVector] = []
        self._delayed: deque[tuple[float, Message]] = deque()
        self._epoch = 0
        self._last_sent = 0.0
        # round state
        self._round = -1
        #: rounds this worker saw end (round_end, or one folded into round_start): a driver
        #: resets its reconnect backoff when a connection got one further
        self.rounds_ended = 0
        self._model: np.ndarray | None = None
        #: the chunk gradients of this round, positions 0, 1, ...: the driver's arrays, held
        #: (never read) until an EncodeVector hands them back
        self._grads: list[np.ndarray] = []
        self._count = 0
        self._requested = 0  # positions handed to the driver as work
        self._reported = 0
        self._t0 = 0.0
        self._deadline_list: list[float] = []
        self._net_delay = 0.0
        self._compute_s = 0.0
        #: streaming schemes: chunk -> (the scheduled compute time up to it, the time since
        #: round_start when it was computed), this round
        self._chunk_compute: dict[int, tuple[float, float]] = {}
        #: a streamed chunk's coefficients (the gradient itself), shape (1, 1), and its column
        self._unit = np.ones((1, 1))
        self._unit_coef = np.ones(1)
        self._attempt_sent: int | None = None
        self._loads: list[int] = []
        self._order: list[int] = []
        # hot-path copies of setup/config values (set in Worker._setup_ready)
        self._report_every = 1
        #: how rounds run (the setup's scheme's: round_policy); no chunk reports without a
        #: broadcast trigger
        self._policy: RoundPolicy = TriggerAndBroadcast()
        self._fixed_theta: np.ndarray | None = None
        self._fixed_coef: np.ndarray | None = None  # (load,) when ell == 1
        self._fixed_digest = b""
        self._encode_fast: TrustedEncoder | None = None
        #: ordering="adaptive": the scheme with this round's orders (None: the static one)
        self._round_scheme: Scheme | None = None

    @property
    def round(self) -> int:
        return self._round

    def _set_phase(self, new: WorkerPhase) -> None:
        """The one place the phase changes: an edge outside ``worker_rules.TRANSITIONS``
        raises LocalProtocolError before anything changes."""
        if new not in NEXT[self.phase]:
            raise LocalProtocolError(
                f"illegal worker transition {self.phase.value} -> {new.value}"
            )
        self.phase = new

    def _emit(self, msg: Message, now: float, *, delay: bool = True) -> None:
        """Queue ``msg``, held back by this round's artificial network delay."""
        self._last_sent = now
        if self._delayed or (delay and self._net_delay > 0):
            # keep frame order: once something is held, everything queues behind it
            self._delayed.append((now + (self._net_delay if delay else 0.0), msg))
            self._release(now)
        else:
            self._outbox.append(new_outgoing(PS_PEER, msg, False, ""))

    def _release(self, now: float) -> None:
        while self._delayed and self._delayed[0][0] <= now:
            self._outbox.append(new_outgoing(PS_PEER, self._delayed.popleft()[1], False, ""))

    def _check_epoch(self, epoch: int, kind: str) -> bool:
        if epoch != self._epoch:
            self.stats[f"stale_epoch_{kind}"] += 1
            return False
        return True

    @handles("round_start", RUNNING)
    def _on_round_start(self, msg: RoundStart, now: float) -> None:
        if msg.epoch != self._epoch:
            self._check_epoch(msg.epoch, msg.kind)  # counts it
            return
        assert self.setup is not None
        if msg.round <= self._round:
            raise RemoteProtocolError(f"round_start {msg.round} not after {self._round}",
                                      code="bad_round")
        if self._round >= 0 and self.phase is not _W_IDLE:
            # round_end is folded into the next round_start: the previous round is over
            self.rounds_ended += 1
            if self.progress_events:
                self._events.append(RoundEnded(self._round, "", now))
        if msg.orders or self._round_scheme is not None:
            self._use_round_orders(msg.orders)
        load = self._loads[self.worker_id]
        if msg.delays_s and len(msg.delays_s) < load:
            raise RemoteProtocolError("delays_s shorter than the load", code="bad_field")
        self._round = msg.round
        model = msg.model
        self._model = model if model.dtype is _F8 else np.asarray(model, dtype=np.float64)
        self._grads = []
        self._count = 0
        self._requested = 0
        self._reported = 0
        self._compute_s = 0.0
        self._chunk_compute = {}
        self._attempt_sent = None
        self._work.clear()
        self._t0 = now
        self._net_delay = msg.net_delay_s
        # absolute deadlines now + (d_0 + ... + d_k), summed left to right (as np.cumsum does)
        delays = msg.delays_s
        # (map over the bound add: the same float additions without a comprehension's frame)
        dl = (list(map(now.__add__, accumulate(delays[:load]))) if delays
              else [now] * load)
        self._deadline_list = dl
        self._set_phase(_W_COMPUTING)
        if load == 0:
            self._after_all_computed(now)
        elif dl[0] <= now:
            self._request_due(now)

    def _use_round_orders(self, flat: tuple[int, ...]) -> None:
        """ordering="adaptive": compute and encode with the orders of this round_start
        (``()``: back to the static ones). Shared by the workers of a process."""
        assert self.setup is not None
        base = self.setup.scheme
        facts = self._facts
        if not flat:
            self._round_scheme = None
            assert facts.orders is not None
            self._order = facts.orders[self.worker_id]
            self._encode_fast = base.trusted_encoder()
            return
        hit = facts.round_orders
        if hit is None or hit[0] != flat:
            try:
                orders = unflatten_orders(base.A, flat)
            except CodingError as exc:
                raise RemoteProtocolError(f"round_start.orders: {exc}", code="bad_field") \
                    from None
            sch = base.with_orders(orders)
            if self.setup.config.ordering != "adaptive" or sch is None:
                raise RemoteProtocolError("round_start.orders in a run without adaptive "
                                          "ordering", code="bad_field")
            hit = facts.round_orders = (tuple(flat), sch, [o.tolist() for o in orders])
        self._round_scheme = hit[1]
        self._order = hit[2][self.worker_id]
        self._encode_fast = hit[1].trusted_encoder()

    def _request_due(self, now: float) -> None:
        """Hand every chunk due by ``now`` to the driver as one work item."""
        assert self.setup is not None and self._model is not None
        dl = self._deadline_list
        k = self._count
        due = k
        while due < len(dl) and dl[due] <= now:
            due += 1
        if due == k:
            return
        chunks = tuple(self._order[k:due])
        self._requested = due
        self._work.append(new_compute_chunks(self._round, k, chunks, self._model))

    def _chunks_done(self, rnd: int, first: int, grads: Any, now: float) -> None:
        phase = self.phase
        if rnd != self._round or first != self._count or (
                phase is not _W_COMPUTING and phase is not _W_WAITING):
            self.stats["stale_work"] += 1
            return
        n = len(grads)
        count = first + n
        if count > self._requested:
            raise LocalProtocolError(f"chunks_done for {n} chunks, {self._requested - first} "
                                     "were requested")
        dl = self._deadline_list
        prev = dl[first - 1] if first > 0 else self._t0
        if self.progress_events:
            self._chunk_events(first, n, prev, now)
        # compute_s: the scheduled (injected) duration of the chunks done so far, summed chunk
        # by chunk (the same floats as the ChunkComputed durations add up to)
        compute_s = self._compute_s
        self._grads.extend(grads)
        streams = self._policy.streams
        for k in range(first, count):
            t = dl[k]
            compute_s += t - prev
            prev = t
            if streams:  # every chunk leaves as soon as it is computed
                self._stream_chunk(k, compute_s, now)
        self._compute_s = compute_s
        self._count = count
        if phase is not _W_COMPUTING:
            return  # told to encode meanwhile: these gradients only matter after a resume
        load = len(dl)
        if count == load or count // self._report_every > self._reported // self._report_every:
            self._reported = count
            # send-when-done schemes need no reports: the coded vector itself says "finished"
            # (and carries compute_s, the finish time on the worker's schedule)
            if self._policy.broadcasts:
                t0 = self._t0
                msg = _new_report(self._epoch, rnd, count, now if now > 0.0 else 0.0,
                                  now - t0 if now > t0 else 0.0)
                self._emit(msg, now)
        if count == load:
            self._after_all_computed(now)

    def _stream_chunk(self, position: int, compute_s: float, now: float) -> None:
        """Queue the :class:`EncodeVector` of one streamed chunk (its gradient alone, in the
        upload type): ``encode_done`` sends it as a ``chunk_gradient``."""
        assert self.setup is not None
        scheme = self._round_scheme if self._round_scheme is not None else self.setup.scheme
        chunk = self._order[position]
        t0 = self._t0
        self._chunk_compute[chunk] = (compute_s, now - t0 if now > t0 else 0.0)
        self._work.append(new_encode_vector(
            self._round, 0, self.worker_id, (), b"", (self._grads[position],), scheme,
            self._unit, self._unit_coef, None, chunk))

    def _chunk_events(self, first: int, n: int, prev: float, now: float) -> None:
        order, dl, rnd, append = self._order, self._deadline_list, self._round, self._events.append
        for k in range(first, first + n):
            t = dl[k]
            append(new_chunk_computed(rnd, k, order[k], now, t - prev))
            prev = t

    def _after_all_computed(self, now: float) -> None:
        assert self.setup is not None
        scheme = self.setup.scheme
        self._set_phase(_W_WAITING)
        if not self._policy.broadcasts and not self._policy.streams:
            state = [0] * scheme.m
            state[self.worker_id] = self._count
            self._encode(state, attempt=0)

    def _encode(self, state: list[int] | tuple[int, ...], *, attempt: int,
                digest: bytes | None = None) -> None:
        """Decide whether this worker sends for ``state`` and with which coefficients; if it
        does, queue the :class:`EncodeVector` its driver runs (answered by ``encode_done``)."""
        assert self.setup is not None
        scheme = self._round_scheme if self._round_scheme is not None else self.setup.scheme
        c = state[self.worker_id]
        fast = self._encode_fast
        if self._fixed_theta is not None:
            # send-when-done: the coefficients do not depend on the state (computed once)
            if c != self._loads[self.worker_id] or c == 0:
                return
            fast = None
            if digest is None:
                digest = self._fixed_digest
        elif fast is not None:
            if c == 0:  # trigger schemes: worker j contributes iff c_j > 0
                return
        elif not scheme.contributes(self.worker_id, np.asarray(state, dtype=np.int64)):
            return
        self._attempt_sent = attempt
        self._work.append(new_encode_vector(
            self._round, attempt, self.worker_id, state,
            digest if digest is not None else state_digest(state), self._grads[:c], scheme,
            self._fixed_theta, self._fixed_coef, fast, -1))

    def _encode_done(self, item: EncodeVector, vector: np.ndarray, now: float) -> None:
        if item.chunk >= 0:  # a streamed chunk
            if item.round != self._round or (
                    self.phase is not _W_COMPUTING and self.phase is not _W_WAITING):
                self.stats["stale_work"] += 1
                return
            compute_s, elapsed = self._chunk_compute[item.chunk]
            self._emit(_new_chunk(self._epoch, item.round, item.chunk, compute_s, elapsed,
                                  vector), now)
            if self.progress_events:
                self._events.append(new_coded_sent(item.round, 0, 1, now))
            return
        if item.round != self._round or item.attempt != self._attempt_sent or (
                self.phase is not _W_WAITING):
            self.stats["stale_work"] += 1
            return
        self._emit(_new_coded(self._epoch, item.round, item.attempt, item.digest,
                              self._compute_s, vector), now)
        if self.progress_events:
            self._events.append(new_coded_sent(item.round, item.attempt, len(item.grads), now))

    @handles("encode_and_transmit", RUNNING)
    def _on_encode(self, msg: EncodeAndTransmit, now: float) -> None:
        if msg.epoch != self._epoch:
            self._check_epoch(msg.epoch, msg.kind)  # counts it
            return
        if msg.round != self._round or self.phase is _W_IDLE:
            self.stats["stale_encode"] += 1
            return
        assert self.setup is not None
        scheme = self.setup.scheme
        if not self._policy.broadcasts:
            raise RemoteProtocolError("encode_and_transmit for a send-when-done scheme",
                                      code="bad_kind")
        state = msg.state
        if len(state) != scheme.m:
            raise RemoteProtocolError(f"state of length {len(state)} != m={scheme.m}",
                                      code="bad_state")
        if state[self.worker_id] > self._reported:
            raise RemoteProtocolError(
                f"state asks for {state[self.worker_id]} chunks, {self._reported} reported",
                code="bad_state",
            )
        facts = self._facts
        checked = facts.checked_state
        if checked is not None and (checked[0] is state or checked[0] == state):
            digest = checked[1]  # the same state passed the bound check below (same loads)
        else:
            loads = self._loads
            if any(map(operator.gt, state, loads)):
                j = next(i for i, (c, n) in enumerate(zip(state, loads, strict=True)) if c > n)
                raise RemoteProtocolError(f"state[{j}]={state[j]} exceeds load {loads[j]}",
                                          code="bad_state")
            digest = state_digest(state)
            facts.checked_state = (tuple(state), digest)
        if self._attempt_sent is not None and msg.attempt <= self._attempt_sent:
            self.stats["stale_encode"] += 1
            return
        self._set_phase(_W_WAITING)
        self._encode(state, attempt=msg.attempt, digest=digest)

    @handles("resume", RUNNING)
    def _on_resume(self, msg: Resume, now: float) -> None:
        if not self._check_epoch(msg.epoch, msg.kind):
            return
        if msg.round != self._round or self.phase is not _W_WAITING:
            self.stats["stale_resume"] += 1
            return
        self._attempt_sent = None
        dl = self._deadline_list
        if self._count < len(dl):
            # restart the chunk that was in flight: its full duration counts again from now
            starts = [self._t0, *dl[:-1]]
            acc = 0.0
            for k in range(self._count, len(dl)):
                acc += dl[k] - starts[k]
                dl[k] = now + acc
            self._requested = self._count
            self._work.clear()
            self._set_phase(_W_COMPUTING)
            if self._deadline_list[self._count] <= now:
                self._request_due(now)

    @handles("round_end", RUNNING)
    def _on_round_end(self, msg: RoundEnd, now: float) -> None:
        if not self._check_epoch(msg.epoch, msg.kind):
            return
        if msg.round != self._round:
            self.stats["stale_round_end"] += 1
            return
        self._deadline_list = []
        self._work.clear()
        self._set_phase(_W_IDLE)
        self.rounds_ended += 1
        if self.progress_events:
            self._events.append(RoundEnded(msg.round, msg.status, now))
