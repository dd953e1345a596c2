"""The worker as a sans-IO state machine.

Invariants
----------
* Chunk k (0-based position in this worker's order) of round r completes no earlier than
  ``t0 + sum(delays_s[:k+1])``, where ``t0`` is when round_start arrived: the injected delays
  are absolute deadlines, so real compute time is absorbed into them (and only shows when it is
  longer). A ``resume`` restarts the chunk that was in flight when computing stopped.
* A count is reported only for gradients already stored, so reports are monotone.
* The encoding uses the *broadcast* state, never the worker's newer progress.
* Every frame the worker sends in round r is held back ``net_delay_s`` (artificial one-way
  latency); frames leave in order.
* The gradient computation is injected (``chunk_gradient(chunk, w)``); this module does no I/O.
"""

from __future__ import annotations

import enum
import os
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..config import RunConfig, scheme_digest
from ..errors import ConfigError, LocalProtocolError, RemoteProtocolError
from ..messages import (
    Challenge,
    ChunkReport,
    CodedGradient,
    EncodeAndTransmit,
    Error,
    Hello,
    Message,
    Ping,
    Pong,
    Ready,
    Resume,
    RoundEnd,
    RoundStart,
    Shutdown,
    Welcome,
    state_digest,
)
from .common import (
    FATAL_CODES,
    ChunkComputed,
    CodedSent,
    ConnectionFailed,
    Endpoint,
    Outgoing,
    RoundEnded,
    ShutdownRequested,
    Welcomed,
    macs_equal,
    ps_mac,
    worker_mac,
)

PS_PEER = "ps"


class WorkerPhase(enum.Enum):
    CONNECTING = "connecting"  # transport up, waiting for challenge
    AUTHENTICATING = "authenticating"  # hello sent, waiting for welcome
    IDLE = "idle"  # welcomed, between rounds
    COMPUTING = "computing"
    WAITING = "waiting"  # stopped computing (all done, or told to encode), round not over
    CLOSED = "closed"


_TRANSITIONS = frozenset(
    {
        (WorkerPhase.CONNECTING, WorkerPhase.AUTHENTICATING),
        (WorkerPhase.AUTHENTICATING, WorkerPhase.IDLE),
        (WorkerPhase.IDLE, WorkerPhase.COMPUTING),
        (WorkerPhase.COMPUTING, WorkerPhase.WAITING),
        (WorkerPhase.WAITING, WorkerPhase.COMPUTING),  # resume
        (WorkerPhase.WAITING, WorkerPhase.WAITING),  # re-broadcast
        (WorkerPhase.COMPUTING, WorkerPhase.IDLE),  # round ended while computing
        (WorkerPhase.WAITING, WorkerPhase.IDLE),
        (WorkerPhase.COMPUTING, WorkerPhase.COMPUTING),  # next round_start without round_end
        (WorkerPhase.WAITING, WorkerPhase.COMPUTING),
        (WorkerPhase.IDLE, WorkerPhase.IDLE),
    }
    | {(p, WorkerPhase.CLOSED) for p in WorkerPhase}
)

#: kind -> phases in which the worker accepts it from the PS
_ACCEPTS: dict[str, frozenset[WorkerPhase]] = {
    "challenge": frozenset({WorkerPhase.CONNECTING}),
    "welcome": frozenset({WorkerPhase.AUTHENTICATING}),
    "round_start": frozenset({WorkerPhase.IDLE, WorkerPhase.COMPUTING, WorkerPhase.WAITING}),
    "encode_and_transmit": frozenset({WorkerPhase.IDLE, WorkerPhase.COMPUTING,
                                      WorkerPhase.WAITING}),
    "resume": frozenset({WorkerPhase.IDLE, WorkerPhase.COMPUTING, WorkerPhase.WAITING}),
    "round_end": frozenset({WorkerPhase.IDLE, WorkerPhase.COMPUTING, WorkerPhase.WAITING}),
    "shutdown": frozenset(WorkerPhase),
    "error": frozenset(WorkerPhase),
    "ping": frozenset(WorkerPhase),
    "pong": frozenset(WorkerPhase),
}


class ChunkGradientFn(Protocol):
    def __call__(self, chunk: int, w: np.ndarray) -> np.ndarray: ...


@dataclass
class Setup:
    """What a worker builds from the PS's ``welcome``: the scheme and its gradient function."""

    config: RunConfig
    scheme: Any
    chunk_gradient: ChunkGradientFn


def default_setup(config: RunConfig) -> Setup:
    """Rebuild scheme and task from the configuration (same seed -> same scheme as the PS)."""
    from ..tasks import make_task

    scheme = config.build_scheme()
    task = make_task(config.task, scheme.n_chunks, config.seed)
    return Setup(config, scheme, task.chunk_gradient)


class Worker(Endpoint):
    """Worker core.

    Parameters
    ----------
    worker_id : int
    secret : bytes, optional
        Shared HMAC secret (must match the PS's).
    setup : callable
        ``setup(config) -> Setup``; the default rebuilds the configured scheme and task.
    nonce_fn : callable
        Fresh 16-byte nonces for the handshake.
    """

    def __init__(
        self,
        worker_id: int,
        *,
        secret: bytes | None = None,
        setup: Callable[[RunConfig], Setup] = default_setup,
        nonce_fn: Callable[[], bytes] = lambda: os.urandom(16),
    ) -> None:
        super().__init__()
        self.worker_id = worker_id
        self.secret = secret
        self._setup_fn = setup
        self._nonce_fn = nonce_fn
        self.phase = WorkerPhase.CLOSED
        self.setup: Setup | None = None
        self._delayed: deque[tuple[float, Message]] = deque()
        self._epoch = 0
        self._nonce = b""
        self._last_sent = 0.0
        self._last_heard = 0.0
        self._ping_seq = 0
        # round state
        self._round = -1
        self._model: np.ndarray | None = None
        self._grads: np.ndarray | None = None  # (load, d) stored chunk gradients
        self._count = 0
        self._reported = 0
        self._t0 = 0.0
        self._deadlines: np.ndarray | None = None  # absolute completion times per position
        self._net_delay = 0.0
        self._compute_s = 0.0
        self._attempt_sent: int | None = None

    # ================================================================== driver contract

    def connection_made(self, *, now: float) -> None:
        """A fresh transport to the PS is up (first connect or a reconnect)."""
        self.phase = WorkerPhase.CONNECTING
        self._delayed.clear()
        self._last_heard = now
        self._last_sent = now
        self._round = -1

    def connection_lost(self, *, now: float) -> None:
        """The transport is gone; the driver reconnects (with backoff) unless shut down."""
        if self.phase is not WorkerPhase.CLOSED:
            self.phase = WorkerPhase.CLOSED
        self._delayed.clear()
        self._deadlines = None

    def receive(self, peer: Hashable, msg: Message, *, now: float) -> None:
        try:
            self._receive(msg, now)
        except RemoteProtocolError as exc:
            self._fail(exc.code, exc.reason, now, send_error=True)

    def handle_timer(self, *, now: float) -> None:
        """Release delayed frames, finish due chunks (one per call), send pings, detect a
        silent PS."""
        self._release(now)
        if (
            self.phase is WorkerPhase.COMPUTING
            and self._deadlines is not None
            and self._count < len(self._deadlines)
            and now >= self._deadlines[self._count]
        ):
            self._compute_next(now)
        cfg = self.setup.config if self.setup else None
        if cfg is not None and self.phase not in (WorkerPhase.CLOSED,):
            if cfg.dead_after_s is not None and now >= self._last_heard + cfg.dead_after_s:
                self._fail("ps_timeout", "no frame from the PS in time", now, send_error=False)
                return
            if cfg.heartbeat_s is not None and now >= self._last_sent + cfg.heartbeat_s:
                self._ping_seq += 1
                self._emit(Ping(seq=self._ping_seq), now, delay=False)

    def next_deadline(self) -> float | None:
        times: list[float] = []
        if self._delayed:
            times.append(self._delayed[0][0])
        if (
            self.phase is WorkerPhase.COMPUTING
            and self._deadlines is not None
            and self._count < len(self._deadlines)
        ):
            t = float(self._deadlines[self._count])
            if np.isfinite(t):
                times.append(t)
        cfg = self.setup.config if self.setup else None
        if cfg is not None and self.phase is not WorkerPhase.CLOSED:
            if cfg.dead_after_s is not None:
                times.append(self._last_heard + cfg.dead_after_s)
            if cfg.heartbeat_s is not None:
                times.append(self._last_sent + cfg.heartbeat_s)
        return min(times) if times else None

    # ================================================================== helpers

    @property
    def round(self) -> int:
        return self._round

    @property
    def count(self) -> int:
        """Chunk gradients computed and stored in the current round."""
        return self._count

    def _set_phase(self, new: WorkerPhase) -> None:
        if (self.phase, new) not in _TRANSITIONS:
            raise LocalProtocolError(
                f"illegal worker transition {self.phase.value} -> {new.value}"
            )
        self.phase = new

    def _emit(self, msg: Message, now: float, *, delay: bool = True) -> None:
        """Queue ``msg``, held back by this round's artificial network delay."""
        self._last_sent = now
        hold = self._net_delay if delay else 0.0
        if hold > 0 or self._delayed:
            # keep frame order: once something is held, everything queues behind it
            self._delayed.append((now + hold, msg))
            self._release(now)
        else:
            self._outbox.append(Outgoing(PS_PEER, msg))

    def _release(self, now: float) -> None:
        while self._delayed and self._delayed[0][0] <= now:
            self._outbox.append(Outgoing(PS_PEER, self._delayed.popleft()[1]))

    def _fail(self, code: str, reason: str, now: float, *, send_error: bool) -> None:
        self.stats[f"failed_{code}"] += 1
        msg = Error(code=code, reason=reason[:1000]) if send_error else None
        self._outbox.append(Outgoing(PS_PEER, msg, close=True, reason=code))
        self._events.append(ConnectionFailed(code, reason, now, fatal=code in FATAL_CODES))
        self.phase = WorkerPhase.CLOSED
        self._delayed.clear()
        self._deadlines = None

    # ================================================================== receive

    def _receive(self, msg: Message, now: float) -> None:
        allowed = _ACCEPTS.get(msg.kind)
        if allowed is None:
            raise RemoteProtocolError(f"{msg.kind} is not a PS message", code="bad_kind")
        if self.phase not in allowed:
            raise RemoteProtocolError(f"{msg.kind} not allowed in {self.phase.value}",
                                      code="bad_kind")
        self._last_heard = now
        if isinstance(msg, Challenge):
            self._epoch = msg.epoch
            self._nonce = self._nonce_fn()
            mac = (
                worker_mac(self.secret, msg.nonce, self.worker_id, msg.epoch)
                if self.secret is not None
                else b""
            )
            self._set_phase(WorkerPhase.AUTHENTICATING)
            self._emit(Hello(worker=self.worker_id, nonce=self._nonce, mac=mac, epoch=msg.epoch),
                       now, delay=False)
        elif isinstance(msg, Welcome):
            self._on_welcome(msg, now)
        elif isinstance(msg, RoundStart):
            self._on_round_start(msg, now)
        elif isinstance(msg, EncodeAndTransmit):
            self._on_encode(msg, now)
        elif isinstance(msg, Resume):
            self._on_resume(msg, now)
        elif isinstance(msg, RoundEnd):
            self._on_round_end(msg, now)
        elif isinstance(msg, Shutdown):
            self._events.append(ShutdownRequested(msg.reason, now))
            self.phase = WorkerPhase.CLOSED
            self._outbox.append(Outgoing(PS_PEER, None, close=True, reason="shutdown"))
        elif isinstance(msg, Error):
            self._fail(msg.code, f"PS closed the connection: {msg.reason}", now, send_error=False)
        elif isinstance(msg, Ping):
            self._emit(Pong(seq=msg.seq), now, delay=False)

    def _on_welcome(self, msg: Welcome, now: float) -> None:
        if msg.worker != self.worker_id or msg.epoch != self._epoch:
            raise RemoteProtocolError("welcome for another worker or epoch", code="bad_welcome")
        if self.secret is not None:
            expect = ps_mac(self.secret, self._nonce, self.worker_id, self._epoch)
            if not macs_equal(expect, msg.mac):
                raise RemoteProtocolError("PS failed authentication", code="auth_failed")
        digest = msg.config.get("scheme_digest")
        try:
            config = RunConfig.from_wire(msg.config)
        except ConfigError as exc:
            raise RemoteProtocolError(f"unusable config: {exc}", code="bad_config") from exc
        if self.setup is None or self.setup.config != config:
            self.setup = self._setup_fn(config)
        if digest != scheme_digest(self.setup.scheme):
            raise RemoteProtocolError("scheme digest mismatch", code="config_mismatch")
        if self.worker_id >= self.setup.scheme.m:
            raise RemoteProtocolError("worker id out of range for this run", code="bad_welcome")
        self._set_phase(WorkerPhase.IDLE)
        self._events.append(Welcomed(self.worker_id, self._epoch, now))
        self._emit(Ready(epoch=self._epoch), now, delay=False)

    def _check_epoch(self, epoch: int, kind: str) -> bool:
        if epoch != self._epoch:
            self.stats[f"stale_epoch_{kind}"] += 1
            return False
        return True

    def _on_round_start(self, msg: RoundStart, now: float) -> None:
        if not self._check_epoch(msg.epoch, msg.kind):
            return
        assert self.setup is not None
        scheme = self.setup.scheme
        if msg.round <= self._round:
            raise RemoteProtocolError(f"round_start {msg.round} not after {self._round}",
                                      code="bad_round")
        load = int(scheme.loads[self.worker_id])
        dim = int(msg.model.shape[0])
        if msg.delays_s and len(msg.delays_s) < load:
            raise RemoteProtocolError("delays_s shorter than the load", code="bad_field")
        self._round = msg.round
        self._model = np.asarray(msg.model, dtype=np.float64)
        if self._grads is None or self._grads.shape != (load, dim):
            self._grads = np.empty((load, dim), dtype=np.float64)
        self._count = 0
        self._reported = 0
        self._compute_s = 0.0
        self._attempt_sent = None
        self._t0 = now
        self._net_delay = msg.net_delay_s
        delays = (
            np.asarray(msg.delays_s[:load], dtype=np.float64) if msg.delays_s else np.zeros(load)
        )
        self._deadlines = now + np.cumsum(delays)
        self._set_phase(WorkerPhase.COMPUTING)
        if load == 0:
            self._after_all_computed(now)

    def _compute_next(self, now: float) -> None:
        assert self.setup is not None and self._grads is not None and self._model is not None
        k = self._count
        chunk = int(self.setup.scheme.orders[self.worker_id][k])
        g = self.setup.chunk_gradient(chunk, self._model)
        self._grads[k] = g
        self._count = k + 1
        # compute_s: the scheduled (injected) duration of this chunk
        assert self._deadlines is not None
        prev = self._deadlines[k - 1] if k > 0 else self._t0
        dur = float(self._deadlines[k] - prev)
        self._compute_s += dur
        self._events.append(ChunkComputed(self._round, k, chunk, now, dur))
        cfg = self.setup.config
        load = len(self._deadlines)
        if self._count % cfg.report_every == 0 or self._count == load:
            self._reported = self._count
            self._emit(
                ChunkReport(epoch=self._epoch, round=self._round, count=self._count,
                            t_worker=max(now, 0.0), elapsed_s=max(now - self._t0, 0.0)),
                now,
            )
        if self._count == load:
            self._after_all_computed(now)

    def _after_all_computed(self, now: float) -> None:
        assert self.setup is not None
        scheme = self.setup.scheme
        self._set_phase(WorkerPhase.WAITING)
        if scheme.sends_when_done:
            state = np.zeros(scheme.m, dtype=np.int64)
            state[self.worker_id] = self._count
            self._send_coded(state, attempt=0, now=now)

    def _send_coded(self, state: np.ndarray, *, attempt: int, now: float) -> None:
        assert self.setup is not None and self._grads is not None
        scheme = self.setup.scheme
        c = int(state[self.worker_id])
        if not scheme.contributes(self.worker_id, state):
            return
        vec = scheme.encode(self.worker_id, state, self._grads[:c])
        payload = np.ascontiguousarray(vec, dtype=self.setup.config.payload_dtype)
        self._attempt_sent = attempt
        self._emit(
            CodedGradient(epoch=self._epoch, round=self._round, attempt=attempt,
                          state_digest=state_digest(state), compute_s=self._compute_s,
                          payload=payload),
            now,
        )
        self._events.append(CodedSent(self._round, attempt, c, now))

    def _on_encode(self, msg: EncodeAndTransmit, now: float) -> None:
        if not self._check_epoch(msg.epoch, msg.kind):
            return
        if msg.round != self._round or self.phase is WorkerPhase.IDLE:
            self.stats["stale_encode"] += 1
            return
        assert self.setup is not None
        scheme = self.setup.scheme
        if scheme.sends_when_done:
            raise RemoteProtocolError("encode_and_transmit for a send-when-done scheme",
                                      code="bad_kind")
        if len(msg.state) != scheme.m:
            raise RemoteProtocolError(f"state of length {len(msg.state)} != m={scheme.m}",
                                      code="bad_state")
        state = np.asarray(msg.state, dtype=np.int64)
        if state[self.worker_id] > self._reported:
            raise RemoteProtocolError(
                f"state asks for {state[self.worker_id]} chunks, {self._reported} reported",
                code="bad_state",
            )
        if np.any(state > np.asarray(scheme.loads)):
            raise RemoteProtocolError("state exceeds loads", code="bad_state")
        if self._attempt_sent is not None and msg.attempt <= self._attempt_sent:
            self.stats["stale_encode"] += 1
            return
        self._set_phase(WorkerPhase.WAITING)
        self._send_coded(state, attempt=msg.attempt, now=now)

    def _on_resume(self, msg: Resume, now: float) -> None:
        if not self._check_epoch(msg.epoch, msg.kind):
            return
        if msg.round != self._round or self.phase is not WorkerPhase.WAITING:
            self.stats["stale_resume"] += 1
            return
        assert self._deadlines is not None
        self._attempt_sent = None
        if self._count < len(self._deadlines):
            # restart the chunk that was in flight: its full duration counts again from now
            starts = np.concatenate(([self._t0], self._deadlines[:-1]))
            durations = self._deadlines - starts
            rest = durations[self._count:]
            self._deadlines[self._count:] = now + np.cumsum(rest)
            self._set_phase(WorkerPhase.COMPUTING)

    def _on_round_end(self, msg: RoundEnd, now: float) -> None:
        if not self._check_epoch(msg.epoch, msg.kind):
            return
        if msg.round != self._round:
            self.stats["stale_round_end"] += 1
            return
        self._deadlines = None
        self._set_phase(WorkerPhase.IDLE)
        self._events.append(RoundEnded(msg.round, msg.status, now))
