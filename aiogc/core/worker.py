"""The worker as a sans-IO state machine.

Invariants
----------
* Chunk k (0-based position in this worker's order) of round r completes no earlier than
  ``t0 + sum(delays_s[:k+1])``, where ``t0`` is when round_start arrived: the injected delays
  are absolute deadlines, so real compute time is absorbed into them (and only shows when it is
  longer). A ``resume`` restarts the chunk that was in flight when computing stopped.
* Application work stays out of the machine: when chunks are due the worker queues one
  :class:`ComputeChunks` work item (``next_work()``); the driver computes the gradients and
  calls :meth:`Worker.chunks_done` with a fresh ``now``. Scheme and task are built by the
  driver too (event :class:`SetupNeeded`, answered by :meth:`Worker.setup_ready`).
* One cumulative report per wake-up: a report carries the count of every gradient stored so
  far, so reports are monotone.
* The encoding uses the *broadcast* state, never the worker's newer progress.
* Every frame the worker sends in round r is held back ``net_delay_s`` (artificial one-way
  latency); frames leave in order.
* No exception escapes a driver call: one that is not a protocol error closes the connection
  with code ``worker_error`` (the driver reconnects), so the worker's timer never dies.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from itertools import accumulate
from types import MappingProxyType
from typing import Any

import numpy as np

from aiogc.coding.base import encode_rows
from aiogc.config import RunConfig
from aiogc.core.common import (
    FATAL_CODES,
    ComputeChunks,
    ConnectionFailed,
    Endpoint,
    Event,
    Outgoing,
    RoundEnded,
    SetupNeeded,
    ShutdownRequested,
    Welcomed,
    fast_new,
    new_chunk_computed,
    new_coded_sent,
    new_compute_chunks,
    new_outgoing,
)
from aiogc.core.worker_rules import ACCEPTS, HANDSHAKING, NEXT, WorkerPhase
from aiogc.core.worker_setup import ChunkGradientFn, SchemeFacts, Setup, WorkerCache
from aiogc.errors import ConfigError, LocalProtocolError, RemoteProtocolError
from aiogc.protocol.auth import (
    SessionKeys,
    config_hash,
    derive_worker_key,
    hello_mac,
    macs_equal,
    session_keys,
    welcome_mac,
)
from aiogc.protocol.messages import (
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

__all__ = ["HANDSHAKE_TIMEOUT_S", "PS_PEER", "ChunkGradientFn", "Polled", "Setup", "Worker",
           "WorkerCache", "WorkerPhase"]

PS_PEER = "ps"
_F8 = np.dtype(np.float64)

# unvalidated constructors of the frames this worker builds itself (see fast_new)
_new_report = fast_new(ChunkReport, ChunkReport._names)
_new_coded = fast_new(CodedGradient, CodedGradient._names)

#: Seconds a worker waits for the PS's challenge and welcome on a new connection before it
#: gives up on that connection and reconnects.
HANDSHAKE_TIMEOUT_S = 10.0

_INF = float("inf")
_NONE: tuple[()] = ()  # what poll returns for an empty queue

#: what :meth:`Worker.poll` returns: ``(events, work, outgoing, deadline)``
Polled = tuple[Sequence[Event], Sequence[ComputeChunks], Sequence[Outgoing], float | None]



# Phase members as module constants: the one micro-idiom kept, because the replay shows it
# (bench/core_replay.py's recorded calls, worker calls only, m=64, 30 rounds, median of 7
# interleaved runs, us per worker-round): with these 15.6 partial / 15.1 original, with
# ``WorkerPhase.X`` at each use 18.6 / 18.4 (an Enum class attribute is ~60 ns on 3.11, a
# global ~8 ns, and every poll, timer and message compares phases). Hand-inlined helpers and
# a private tuple constructor measured no difference and are gone.
_W_CONNECTING = WorkerPhase.CONNECTING
_W_AUTHENTICATING = WorkerPhase.AUTHENTICATING
_W_SETTING_UP = WorkerPhase.SETTING_UP
_W_IDLE = WorkerPhase.IDLE
_W_COMPUTING = WorkerPhase.COMPUTING
_W_WAITING = WorkerPhase.WAITING
_W_CLOSED = WorkerPhase.CLOSED


def _fixed_coefficients(scheme: Any, worker: int) -> np.ndarray | None:
    """A send-when-done scheme's (load, ell) encoding coefficients of ``worker`` (they do not
    depend on the state), or None when the scheme does not expose them."""
    if not scheme.sends_when_done:
        return None
    coef = getattr(scheme, "coefficients", None)
    if coef is None:
        return None
    try:
        theta = np.asarray(coef(worker), dtype=np.float64)
    except TypeError:
        return None
    load = int(scheme.loads[worker])
    return theta if theta.ndim == 2 and theta.shape[0] == load else None


class Worker(Endpoint):
    """Worker core.

    Parameters
    ----------
    worker_id : int
    secret : bytes, optional
        The master secret S (the worker derives its own key k_j from it).
    worker_key : bytes, optional
        This worker's key k_j (``derive_worker_key(S, j)``), given instead of S so that the
        worker cannot authenticate as any other id.
    setup : callable, optional
        ``setup(config) -> Setup`` for drivers that build synchronously (the simulator); the
        core itself never calls it (see :class:`SetupNeeded`).
    nonce_fn : callable, optional
        Fresh 16-byte nonces for the handshake; drivers install one (``secrets.token_bytes``,
        or a deterministic counter on the virtual clock) when None.
    progress_events : bool
        Emit the per-chunk :class:`ChunkComputed`, per-vector :class:`CodedSent` and
        per-round :class:`RoundEnded` events (telemetry only: no driver decision depends on
        them). Drivers with no event sink turn them off (attribute ``progress_events``): they
        are ~6 objects per worker-round.
    cache : WorkerCache, optional
        What the workers of this process share (validated configs, scheme facts): a driver
        that runs several workers in one process passes them one; None keeps a private one.
    """

    #: the current phase: CLOSED until the driver's first ``connection_made``; changed only
    #: by :meth:`_set_phase` (checked against ``worker_rules.TRANSITIONS``)
    phase: WorkerPhase = WorkerPhase.CLOSED

    def __init__(
        self,
        worker_id: int,
        *,
        secret: bytes | None = None,
        worker_key: bytes | None = None,
        setup: Callable[[RunConfig], Setup] | None = None,
        nonce_fn: Callable[[], bytes] | None = None,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
        progress_events: bool = True,
        cache: WorkerCache | None = None,
    ) -> None:
        super().__init__()
        if secret is not None and worker_key is not None:
            raise LocalProtocolError("give either secret or worker_key, not both")
        self.worker_id = worker_id
        self.secret = secret
        self.key: bytes | None = (
            derive_worker_key(secret, worker_id) if secret is not None else worker_key
        )
        self.setup_fn = setup
        self.nonce_fn = nonce_fn
        self.handshake_timeout_s = float(handshake_timeout_s)
        self.progress_events = progress_events
        self._connected_at = 0.0
        self.cache = cache if cache is not None else WorkerCache()
        self.setup: Setup | None = None
        self._facts = SchemeFacts()  # the current setup's, shared through ``cache``
        #: keys of the current session (after a verified welcome), or None without a secret
        self.session: SessionKeys | None = None
        self._pending_config: RunConfig | None = None
        self._pending_digest: object = None
        self._work: list[ComputeChunks] = []
        self._delayed: deque[tuple[float, Message]] = deque()
        self._epoch = 0
        self._nonce = b""
        self._ps_nonce = b""
        self._last_sent = 0.0
        self._last_heard = 0.0
        self._ping_seq = 0
        # round state
        self._round = -1
        self._model: np.ndarray | None = None
        self._grads: np.ndarray | None = None  # (load, d) stored chunk gradients
        self._count = 0
        self._requested = 0  # positions handed to the driver as work
        self._reported = 0
        self._t0 = 0.0
        self._deadline_list: list[float] = []
        self._net_delay = 0.0
        self._compute_s = 0.0
        self._attempt_sent: int | None = None
        self._loads: list[int] = []
        self._order: list[int] = []
        self._fixed_theta: np.ndarray | None = None
        # hot-path copies of setup/config values (set in _on_welcome / _setup_ready)
        self._dead_after: float | None = None
        self._heartbeat: float | None = None
        self._report_every = 1
        self._swd = False  # scheme sends when done
        self._payload_dtype: np.dtype = np.dtype("<f8")
        self._fixed_coef: np.ndarray | None = None  # (load,) when ell == 1
        self._fixed_digest = b""
        self._encode_fast: Callable[[int, Any, np.ndarray], np.ndarray] | None = None

    # ================================================================== driver contract

    def connection_made(self, *, now: float) -> None:
        """A fresh transport to the PS is up (first connect or a reconnect)."""
        self._set_phase(_W_CONNECTING)
        self._delayed.clear()
        self._work.clear()
        self.session = None
        self._last_heard = now
        self._last_sent = now
        self._connected_at = now
        self._round = -1

    def connection_lost(self, *, now: float) -> None:
        """The transport is gone; the driver reconnects (with backoff) unless shut down."""
        if self.phase is not _W_CLOSED:
            self._set_phase(_W_CLOSED)
        self._delayed.clear()
        self._work.clear()
        self._deadline_list = []
        self.session = None

    def receive(self, peer: Hashable, msg: Message, *, now: float) -> None:
        if self.phase is _W_CLOSED:
            # we closed this connection (frames still in flight, e.g. the PS's answer to
            # our Error): nothing on it matters any more
            self.stats["after_close"] += 1
            return
        try:
            self._receive(msg, now)
        except RemoteProtocolError as exc:
            self._fail(exc.code, exc.reason, now, send_error=True)
        except Exception as exc:  # the worker must survive its own errors
            self._internal_error(exc, now)

    def handle_timer(self, *, now: float) -> None:
        """Release delayed frames, queue the chunks due by ``now``, send pings, detect a
        silent PS."""
        try:
            self._handle_timer(now)
        except Exception as exc:
            self._internal_error(exc, now)

    def next_work(self) -> ComputeChunks | None:
        """The next work item for the driver, or None."""
        return self._work.pop(0) if self._work else None

    def drain_work(self) -> list[ComputeChunks]:
        """Every queued work item, in order."""
        if not self._work:
            return []
        out, self._work = self._work, []
        return out

    def poll(self) -> Polled:
        """One driver call per pump instead of four: ``(events, work, outgoing, deadline)``.

        Drains the event, work and outgoing queues and returns :meth:`next_deadline`. A driver
        that answers an event or work item (``setup_ready``, ``chunks_done``) polls again: that
        poll carries what the answer produced and the deadline that then holds. While work
        items are returned the deadline is None (as the PS's poll does while it has pending
        work): the answer's poll gives it.
        """
        # a queue that is empty is returned as the shared empty tuple: no list per poll
        events: Sequence[Event] = self._events
        if events:
            self._events = []
        else:
            events = _NONE
        out: Sequence[Outgoing] = self._outbox
        if out:
            self._outbox = []
        else:
            out = _NONE
        work: Sequence[ComputeChunks] = self._work
        if work:
            self._work = []
            return events, work, out, None
        return events, _NONE, out, self.next_deadline()

    def chunks_done(self, rnd: int, first: int, grads: Any, *, now: float) -> None:
        """The driver computed the gradients of a :class:`ComputeChunks` item.

        ``grads``: sequence (or 2-D array) of chunk gradients, one per requested chunk, each
        of shape (d,). A result for a round that is over is dropped.
        """
        try:
            self._chunks_done(rnd, first, grads, now)
        except Exception as exc:
            self._internal_error(exc, now)

    def receive_and_poll(self, peer: Hashable, msg: Message, *, now: float
                         ) -> Polled:
        """:meth:`receive`, then :meth:`poll` (one driver call instead of two)."""
        self.receive(peer, msg, now=now)
        return self.poll()

    def handle_timer_and_poll(self, *, now: float
                              ) -> Polled:
        """:meth:`handle_timer`, then :meth:`poll` (one driver call instead of two)."""
        self.handle_timer(now=now)
        return self.poll()

    def finish_chunks(self, rnd: int, first: int, grads: Any, *, now: float
                      ) -> Polled:
        """:meth:`chunks_done`, then :meth:`poll` (one driver call instead of two)."""
        self.chunks_done(rnd, first, grads, now=now)
        return self.poll()

    def work_failed(self, exc: Exception, *, now: float) -> None:
        """The driver's gradient computation raised: close with the reason (and reconnect)."""
        self._internal_error(exc, now)

    def has_output(self) -> bool:
        """Anything queued for the driver (frames, events, work)?"""
        return bool(self._outbox or self._events or self._work)

    def setup_ready(self, setup: Setup, *, now: float) -> None:
        """The driver built scheme and task for the config of :class:`SetupNeeded`."""
        try:
            self._setup_ready(setup, now)
        except RemoteProtocolError as exc:
            self._fail(exc.code, exc.reason, now, send_error=True)
        except Exception as exc:
            self._internal_error(exc, now)

    def setup_failed(self, code: str, reason: str, *, now: float) -> None:
        """The driver could not (or may not) build the configured task: close with ``code``
        (``task_not_allowed`` is fatal: reconnecting cannot help)."""
        if self.phase is _W_SETTING_UP:
            self._fail(code, reason, now, send_error=True)

    def next_deadline(self) -> float | None:
        # called after every poll: plain comparisons, the common phases first
        phase = self.phase
        if phase is _W_COMPUTING:
            k = self._count
            dl = self._deadline_list
            # the next chunk's deadline, unless it was handed to the driver already
            best = dl[k] if self._requested == k and k < len(dl) else _INF
        elif phase is _W_CLOSED:
            return self._delayed[0][0] if self._delayed else None
        elif phase is _W_CONNECTING or phase is _W_AUTHENTICATING:
            best = self._connected_at + self.handshake_timeout_s
        else:
            best = _INF
        if self._delayed:
            t = self._delayed[0][0]
            if t < best:
                best = t
        if self._dead_after is not None:
            t = self._last_heard + self._dead_after
            if t < best:
                best = t
        if self._heartbeat is not None:
            t = self._last_sent + self._heartbeat
            if t < best:
                best = t
        return None if best == _INF else best

    # ================================================================== helpers

    @property
    def round(self) -> int:
        return self._round

    @property
    def count(self) -> int:
        """Chunk gradients computed and stored in the current round."""
        return self._count

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

    def _fail(self, code: str, reason: str, now: float, *, send_error: bool) -> None:
        self.stats[f"failed_{code}"] += 1
        msg = Error(code=code, reason=reason[:1000]) if send_error else None
        self._outbox.append(Outgoing(PS_PEER, msg, close=True, reason=code))
        self._events.append(ConnectionFailed(code, reason, now, fatal=code in FATAL_CODES))
        self._set_phase(_W_CLOSED)
        self._delayed.clear()
        self._work.clear()
        self._deadline_list = []

    def _internal_error(self, exc: Exception, now: float) -> None:
        if self.phase is _W_CLOSED:
            self.stats["error_while_closed"] += 1
            return
        self._fail("worker_error", f"{type(exc).__name__}: {exc}", now, send_error=True)

    def _handle_timer(self, now: float) -> None:
        if self._delayed:
            self._release(now)
        phase = self.phase
        if phase is _W_COMPUTING:
            if self._requested == self._count:  # else the due chunks are with the driver
                self._request_due(now)
        elif phase is _W_CLOSED:
            return
        elif phase in HANDSHAKING and now >= self._connected_at + self.handshake_timeout_s:
            # e.g. a connection the PS's kernel completed but its accept queue dropped: the
            # PS will never speak on it, and without a config there is no liveness timer yet
            self._fail("handshake_timeout", "no challenge/welcome from the PS in time", now,
                       send_error=False)
            return
        dead_after, heartbeat = self._dead_after, self._heartbeat
        if dead_after is not None and now >= self._last_heard + dead_after:
            self._fail("ps_timeout", "no frame from the PS in time", now, send_error=False)
            return
        if heartbeat is not None and now >= self._last_sent + heartbeat:
            self._ping_seq += 1
            self._emit(Ping.trusted(self._ping_seq), now, delay=False)

    # ================================================================== receive

    def _receive(self, msg: Message, now: float) -> None:
        # one dict lookup by exact type gives the phases and the handler (an isinstance
        # chain cost up to nine checks per message)
        entry = _DISPATCH.get(type(msg))
        if entry is None:
            raise RemoteProtocolError(f"{msg.kind} is not a PS message", code="bad_kind")
        allowed, handler = entry
        if self.phase not in allowed:
            raise RemoteProtocolError(f"{msg.kind} not allowed in {self.phase.value}",
                                      code="bad_kind")
        self._last_heard = now
        handler(self, msg, now)

    def _on_ping(self, msg: Ping, now: float) -> None:
        self._emit(Pong.trusted(msg.seq), now, delay=False)

    def _on_shutdown(self, msg: Shutdown, now: float) -> None:
        self._events.append(ShutdownRequested(msg.reason, now))
        self._set_phase(_W_CLOSED)
        self._outbox.append(Outgoing(PS_PEER, None, close=True, reason="shutdown"))

    def _on_error(self, msg: Error, now: float) -> None:
        self._fail(msg.code, f"PS closed the connection: {msg.reason}", now, send_error=False)

    def _on_pong(self, msg: Pong, now: float) -> None:
        pass  # hearing it refreshed _last_heard

    def _on_challenge(self, msg: Challenge, now: float) -> None:
        if self.nonce_fn is None:
            raise LocalProtocolError("no nonce_fn: the driver must install one")
        self._epoch = msg.epoch
        self._ps_nonce = msg.nonce
        self._nonce = self.nonce_fn()
        mac = (
            hello_mac(self.key, msg.nonce, self._nonce, self.worker_id, msg.epoch)
            if self.key is not None
            else b""
        )
        self._set_phase(_W_AUTHENTICATING)
        self._emit(Hello(worker=self.worker_id, nonce=self._nonce, mac=mac, epoch=msg.epoch),
                   now, delay=False)

    def _on_welcome(self, msg: Welcome, now: float) -> None:
        if msg.worker != self.worker_id or msg.epoch != self._epoch:
            raise RemoteProtocolError("welcome for another worker or epoch", code="bad_welcome")
        chash = config_hash(msg.config)
        if self.key is not None:
            expect = welcome_mac(self.key, self._ps_nonce, self._nonce, self.worker_id,
                                 self._epoch, chash)
            if not macs_equal(expect, msg.mac):
                raise RemoteProtocolError("PS failed authentication (or the config was altered)",
                                          code="auth_failed")
            self.session = session_keys(self.key, self._ps_nonce, self._nonce, self._epoch,
                                        self.worker_id)
        digest = msg.config.get("scheme_digest")
        try:
            config = self.cache.config(chash, msg.config)
        except ConfigError as exc:
            raise RemoteProtocolError(f"unusable config: {exc}", code="bad_config") from exc
        if self.worker_id >= config.workers:
            raise RemoteProtocolError("worker id out of range for this run", code="bad_welcome")
        self._pending_digest = digest
        self._set_phase(_W_SETTING_UP)
        if self.setup is not None and self.setup.config == config:
            self._setup_ready(self.setup, now)
            return
        self._pending_config = config
        if self.setup is None:  # liveness follows the setup's config once there is one
            self._dead_after, self._heartbeat = config.dead_after_s, config.heartbeat_s
        self._events.append(SetupNeeded(config, now))

    def _setup_ready(self, setup: Setup, now: float) -> None:
        if self.phase is not _W_SETTING_UP:
            return  # the connection closed while the driver was building: keep nothing
        if self._pending_digest != setup.digest:
            raise RemoteProtocolError("scheme digest mismatch", code="config_mismatch")
        self.setup = setup
        cfg = setup.config
        self._dead_after, self._heartbeat = cfg.dead_after_s, cfg.heartbeat_s
        self._report_every = cfg.report_every
        self._swd = bool(setup.scheme.sends_when_done)
        self._payload_dtype = cfg.payload_dtype
        self._fixed_theta = _fixed_coefficients(setup.scheme, self.worker_id)
        self._fixed_coef = (
            np.ascontiguousarray(self._fixed_theta[:, 0])
            if self._fixed_theta is not None and self._fixed_theta.shape[1] == 1 else None)
        if self._swd:
            # a send-when-done vector is always encoded with "only me, all my chunks"
            st = [0] * setup.scheme.m
            st[self.worker_id] = int(setup.scheme.loads[self.worker_id])
            self._fixed_digest = state_digest(st)
        self._encode_fast = getattr(setup.scheme, "encode_trusted", None)
        facts = self._facts = self.cache.facts(setup)
        if facts.loads is None or facts.orders is None:
            facts.loads = [int(x) for x in setup.scheme.loads]
            facts.orders = [[int(x) for x in o] for o in setup.scheme.orders]
        self._loads = facts.loads  # shared, never modified
        self._order = facts.orders[self.worker_id]
        self._pending_config = None
        self._set_phase(_W_IDLE)
        self._events.append(Welcomed(self.worker_id, self._epoch, now))
        self._emit(Ready.trusted(self._epoch), now, delay=False)

    def _check_epoch(self, epoch: int, kind: str) -> bool:
        if epoch != self._epoch:
            self.stats[f"stale_epoch_{kind}"] += 1
            return False
        return True

    def _on_round_start(self, msg: RoundStart, now: float) -> None:
        if msg.epoch != self._epoch:
            self._check_epoch(msg.epoch, msg.kind)  # counts it
            return
        assert self.setup is not None
        if msg.round <= self._round:
            raise RemoteProtocolError(f"round_start {msg.round} not after {self._round}",
                                      code="bad_round")
        if self._round >= 0 and self.phase is not _W_IDLE and self.progress_events:
            # round_end is folded into the next round_start: the previous round is over
            self._events.append(RoundEnded(self._round, "", now))
        load = self._loads[self.worker_id]
        dim = int(msg.model.shape[0])
        if msg.delays_s and len(msg.delays_s) < load:
            raise RemoteProtocolError("delays_s shorter than the load", code="bad_field")
        self._round = msg.round
        model = msg.model
        self._model = model if model.dtype is _F8 else np.asarray(model, dtype=np.float64)
        if self._grads is None or self._grads.shape != (load, dim):
            self._grads = np.empty((load, dim), dtype=np.float64)
        self._count = 0
        self._requested = 0
        self._reported = 0
        self._compute_s = 0.0
        self._attempt_sent = None
        self._work.clear()
        self._t0 = now
        self._net_delay = msg.net_delay_s
        # absolute deadlines now + (d_0 + ... + d_k), summed left to right (as np.cumsum does)
        delays = msg.delays_s
        dl = ([now + acc for acc in accumulate(delays[:load])] if delays
              else [now] * load)
        self._deadline_list = dl
        self._set_phase(_W_COMPUTING)
        if load == 0:
            self._after_all_computed(now)
        elif dl[0] <= now:
            self._request_due(now)

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
        store = self._grads
        phase = self.phase
        if rnd != self._round or first != self._count or store is None or (
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
        for k in range(first, count):
            store[k] = grads[k - first]  # row by row: a slice assignment converts the list
            t = dl[k]
            compute_s += t - prev
            prev = t
        self._compute_s = compute_s
        self._count = count
        if phase is not _W_COMPUTING:
            return  # told to encode meanwhile: these gradients only matter after a resume
        load = len(dl)
        if count == load or count // self._report_every > self._reported // self._report_every:
            self._reported = count
            # send-when-done schemes need no reports: the coded vector itself says "finished"
            # (and carries compute_s, the finish time on the worker's schedule)
            if not self._swd:
                t0 = self._t0
                msg = _new_report(self._epoch, rnd, count, now if now > 0.0 else 0.0,
                                  now - t0 if now > t0 else 0.0)
                self._emit(msg, now)
        if count == load:
            self._after_all_computed(now)

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
        if scheme.sends_when_done:
            state = [0] * scheme.m
            state[self.worker_id] = self._count
            self._send_coded(state, attempt=0, now=now)

    def _send_coded(self, state: list[int] | tuple[int, ...], *, attempt: int, now: float,
                    digest: bytes | None = None) -> None:
        assert self.setup is not None and self._grads is not None
        scheme = self.setup.scheme
        c = state[self.worker_id]
        fast = self._encode_fast
        if self._fixed_theta is not None:
            # send-when-done: the coefficients do not depend on the state (computed once)
            if c != self._loads[self.worker_id] or c == 0:
                return
            X = self._grads[:c]
            if self._fixed_coef is not None and X.dtype == np.float64:
                vec = self._fixed_coef.dot(X)  # encode_rows' product for ell = 1, no checks
            else:
                vec = encode_rows(self._fixed_theta, X, scheme.n_parts)
            if digest is None:
                digest = self._fixed_digest
        elif fast is not None:
            if c == 0:  # trigger schemes: worker j contributes iff c_j > 0
                return
            vec = fast(self.worker_id, state, self._grads[:c])
        else:
            arr = np.asarray(state, dtype=np.int64)
            if not scheme.contributes(self.worker_id, arr):
                return
            vec = scheme.encode(self.worker_id, arr, self._grads[:c])
        dt = self._payload_dtype
        # the encoders' products are fresh, contiguous float64 vectors: converting them only
        # when the payload dtype differs saves a numpy call per vector
        payload = vec if vec.dtype is dt and vec.flags.c_contiguous else (
            np.ascontiguousarray(vec, dtype=dt))
        self._attempt_sent = attempt
        msg = _new_coded(self._epoch, self._round, attempt,
                         digest if digest is not None else state_digest(state),
                         self._compute_s, payload)
        self._emit(msg, now)
        if self.progress_events:
            self._events.append(new_coded_sent(self._round, attempt, c, now))

    def _on_encode(self, msg: EncodeAndTransmit, now: float) -> None:
        if msg.epoch != self._epoch:
            self._check_epoch(msg.epoch, msg.kind)  # counts it
            return
        if msg.round != self._round or self.phase is _W_IDLE:
            self.stats["stale_encode"] += 1
            return
        assert self.setup is not None
        scheme = self.setup.scheme
        if scheme.sends_when_done:
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
        self._send_coded(state, attempt=msg.attempt, now=now, digest=digest)

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

    def _on_round_end(self, msg: RoundEnd, now: float) -> None:
        if not self._check_epoch(msg.epoch, msg.kind):
            return
        if msg.round != self._round:
            self.stats["stale_round_end"] += 1
            return
        self._deadline_list = []
        self._work.clear()
        self._set_phase(_W_IDLE)
        if self.progress_events:
            self._events.append(RoundEnded(msg.round, msg.status, now))


#: exact message type -> (phases in which the worker accepts it, handler); built from
#: ``worker_rules.ACCEPTS`` so the two cannot disagree (frames from the network are built as
#: their exact class, never a subclass)
_DISPATCH: Mapping[type[Message], tuple[frozenset[WorkerPhase],
                                        Callable[[Worker, Any, float], None]]] = MappingProxyType({
    cls: (ACCEPTS[cls.kind], fn) for cls, fn in (
        (RoundStart, Worker._on_round_start),
        (EncodeAndTransmit, Worker._on_encode),
        (Ping, Worker._on_ping),
        (Pong, Worker._on_pong),
        (Challenge, Worker._on_challenge),
        (Welcome, Worker._on_welcome),
        (Resume, Worker._on_resume),
        (RoundEnd, Worker._on_round_end),
        (Shutdown, Worker._on_shutdown),
        (Error, Worker._on_error),
    )
})
assert set(ACCEPTS) == {cls.kind for cls in _DISPATCH}
#: kind -> phases in which the worker accepts it from the PS (``worker_rules.ACCEPTS``)
_ACCEPTS = ACCEPTS
