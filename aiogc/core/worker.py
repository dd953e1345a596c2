"""The worker as a sans-IO state machine.

Invariants
----------
* Chunk k (0-based position in this worker's order) of round r completes no earlier than
  ``t0 + sum(delays_s[:k+1])``, where ``t0`` is when round_start arrived: the injected delays
  are absolute deadlines, so real compute time is absorbed into them (and only shows when it is
  longer). A ``resume`` restarts the chunk that was in flight when computing stopped.
* Application work stays out of the machine: when chunks are due the worker queues one
  :class:`ComputeChunks` work item (``next_work()``); the driver computes the gradients and
  calls :meth:`Worker.chunks_done` with a fresh ``now``. When a vector is due the worker
  decides with which coefficients and queues an :class:`EncodeVector` (the PS's
  ``DecodeRound`` mirrored); the driver encodes (``aiogc.training.encode``, the upload type
  included) and answers with :meth:`Worker.encode_done`. The core holds the driver's gradient
  arrays but never reads them. Scheme and task are built by the driver too (event
  :class:`SetupNeeded`, answered by :meth:`Worker.setup_ready`).
* One cumulative report per wake-up: a report carries the count of every gradient stored so
  far, so reports are monotone.
* The encoding uses the *broadcast* state, never the worker's newer progress.
* Every frame the worker sends in round r is held back ``net_delay_s`` (artificial one-way
  latency); frames leave in order.
* No exception escapes a driver call: one that is not a protocol error closes the connection
  with code ``worker_error`` (the driver reconnects), so the worker's timer never dies.
* Every phase change goes through one checked ``_set_phase`` (``worker_rules.TRANSITIONS``).
* No process-global state: what workers of one process share (validated configs, scheme
  facts) is a :class:`WorkerCache` their driver creates and passes in.

Layout: this module holds the connection (handshake, setup, liveness, the driver's calls);
the round half is the base class in ``worker_round.py``; phases and tables are in
``worker_rules.py``; :class:`Setup` and :class:`WorkerCache` in ``worker_setup.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from aiogc.config import RunConfig
from aiogc.core.common import (
    FATAL_CODES,
    ComputeChunks,
    ConnectionFailed,
    EncodeVector,
    Event,
    Outgoing,
    SetupNeeded,
    ShutdownRequested,
    Welcomed,
    handles,
)
from aiogc.core.round_policy import round_policy
from aiogc.core.worker_round import WorkerRounds
from aiogc.core.worker_rules import HANDSHAKING, OPEN, PS_PEER, WorkerPhase, dispatch_of
from aiogc.core.worker_setup import ChunkGradientFn, Setup, WorkerCache
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
    Error,
    Hello,
    Message,
    Ping,
    Pong,
    Ready,
    Shutdown,
    Welcome,
    state_digest,
)

__all__ = ["ACCEPTS", "HANDSHAKE_TIMEOUT_S", "PS_PEER", "ChunkGradientFn", "Polled", "Setup",
           "Worker", "WorkerCache", "WorkerPhase"]

#: Seconds a worker waits for the PS's challenge and welcome on a new connection before it
#: gives up on that connection and reconnects.
HANDSHAKE_TIMEOUT_S = 10.0

_INF = float("inf")
_NONE: tuple[()] = ()  # what poll returns for an empty queue

#: what :meth:`Worker.poll` returns: ``(events, work, outgoing, deadline)``
Polled = tuple[Sequence[Event], Sequence[ComputeChunks | EncodeVector], Sequence[Outgoing],
               float | None]

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
_W_CLOSED = WorkerPhase.CLOSED


class Worker(WorkerRounds):
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
        if secret is not None and worker_key is not None:
            raise LocalProtocolError("give either secret or worker_key, not both")
        super().__init__(worker_id, progress_events)
        self.secret = secret
        self.key: bytes | None = (
            derive_worker_key(secret, worker_id) if secret is not None else worker_key
        )
        self.setup_fn = setup
        self.nonce_fn = nonce_fn
        self.handshake_timeout_s = float(handshake_timeout_s)
        self._connected_at = 0.0
        self.cache = cache if cache is not None else WorkerCache()
        #: keys of the current session (after a verified welcome), or None without a secret
        self.session: SessionKeys | None = None
        self._pending_config: RunConfig | None = None
        self._pending_digest: object = None
        self._nonce = b""
        self._ps_nonce = b""
        self._last_heard = 0.0
        self._ping_seq = 0
        # liveness, from the config (set in _on_welcome / _setup_ready)
        self._dead_after: float | None = None
        self._heartbeat: float | None = None
        #: the last unauthenticated close reason (``"code: reason"``), "" if none yet
        self.last_preauth = ""

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

    def next_work(self) -> ComputeChunks | EncodeVector | None:
        """The next work item for the driver, or None."""
        return self._work.pop(0) if self._work else None

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
        work: Sequence[ComputeChunks | EncodeVector] = self._work
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

    def encode_done(self, item: EncodeVector, vector: np.ndarray, *, now: float) -> None:
        """The driver encoded an :class:`EncodeVector` item: ``vector`` (shape (p,), the
        upload type) leaves as the coded vector of its attempt. A stale answer is dropped."""
        try:
            self._encode_done(item, vector, now)
        except Exception as exc:
            self._internal_error(exc, now)

    def work_failed(self, exc: Exception, *, now: float) -> None:
        """The driver's gradient computation raised (the task's code, or a non-finite
        gradient): close with ``task_failed``, naming the round and the exception; the PS
        ends the run with it."""
        if self.phase is _W_CLOSED:
            self.stats["error_while_closed"] += 1
            return
        self._fail("task_failed", f"round {self._round}: {type(exc).__name__}: {exc}", now,
                   send_error=True)

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

    def _fail(self, code: str, reason: str, now: float, *, send_error: bool,
              fatal: bool | None = None) -> None:
        self.stats[f"failed_{code}"] += 1
        msg = Error(code=code, reason=reason[:1000]) if send_error else None
        self._outbox.append(Outgoing(PS_PEER, msg, close=True, reason=code))
        if fatal is None:
            # unauthenticated frames (pre-auth error/shutdown, a welcome whose MAC fails) go
            # through _preauth_close with fatal=False: only authenticated codes end a worker
            fatal = code in FATAL_CODES
        self._events.append(ConnectionFailed(code, reason, now, fatal=fatal))
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

    @handles("ping", OPEN)
    def _on_ping(self, msg: Ping, now: float) -> None:
        self._emit(Pong.trusted(msg.seq), now, delay=False)

    @handles("shutdown", OPEN)
    def _on_shutdown(self, msg: Shutdown, now: float) -> None:
        if self.phase in HANDSHAKING:
            # before a verified welcome nothing is authenticated: anyone on the PS's port can
            # send this frame. At most a reason to close and retry (with backoff)
            self._preauth_close("shutdown", msg.reason, now)
            return
        self._events.append(ShutdownRequested(msg.reason, now))
        self._set_phase(_W_CLOSED)
        self._outbox.append(Outgoing(PS_PEER, None, close=True, reason="shutdown"))

    @handles("error", OPEN)
    def _on_error(self, msg: Error, now: float) -> None:
        if self.phase in HANDSHAKING:
            self._preauth_close(msg.code, msg.reason, now)
            return
        self._fail(msg.code, f"PS closed the connection: {msg.reason}", now, send_error=False)

    def _preauth_close(self, code: str, reason: str, now: float) -> None:
        """An unauthenticated ``error``/``shutdown`` (before the handshake completed), or a
        ``welcome`` whose MAC fails (``auth_failed``): close
        this connection and let the driver retry; never fatal, never an end of the run. Only
        authenticated frames, or the driver's own limits (``give_up_after_s``), end a worker.
        A real PS refusing a wrong key looks exactly like this too: the worker then retries
        until it gives up, naming the last pre-auth reason (``last_preauth``)."""
        self.stats["preauth_close"] += 1
        self.stats[f"preauth_{code}"] += 1
        self.last_preauth = f"{code}: {reason[:200]}"
        self._fail("preauth_" + code, f"unauthenticated {code} before the handshake "
                   f"completed (retrying): {reason[:200]}", now, send_error=False,
                   fatal=False)

    @handles("pong", OPEN)
    def _on_pong(self, msg: Pong, now: float) -> None:
        pass  # hearing it refreshed _last_heard

    @handles("challenge", {WorkerPhase.CONNECTING})
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

    @handles("welcome", {WorkerPhase.AUTHENTICATING})
    def _on_welcome(self, msg: Welcome, now: float) -> None:
        if msg.worker != self.worker_id or msg.epoch != self._epoch:
            raise RemoteProtocolError("welcome for another worker or epoch", code="bad_welcome")
        chash = config_hash(msg.config)
        if self.key is not None:
            expect = welcome_mac(self.key, self._ps_nonce, self._nonce, self.worker_id,
                                 self._epoch, chash)
            if not macs_equal(expect, msg.mac):
                # rejected: the config is not used. But a welcome that fails its MAC is itself
                # unauthenticated (a port squatter or a relay can send it), so, like a pre-auth
                # error or shutdown, it only closes this connection: the worker retries with
                # backoff and gives up after give_up_after_s without an authenticated session
                self._preauth_close("auth_failed", "welcome failed authentication (a PS "
                                    "without the key, or an altered config)", now)
                return
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
        policy = self._policy = round_policy(setup.scheme)
        self._fixed_theta = policy.fixed_coefficients(setup.scheme, self.worker_id)
        self._fixed_coef = (
            np.ascontiguousarray(self._fixed_theta[:, 0])
            if self._fixed_theta is not None and self._fixed_theta.shape[1] == 1 else None)
        if not policy.broadcasts:
            # a send-when-done vector is always encoded with "only me, all my chunks"
            st = [0] * setup.scheme.m
            st[self.worker_id] = int(setup.scheme.loads[self.worker_id])
            self._fixed_digest = state_digest(st)
        self._encode_fast = setup.scheme.trusted_encoder()
        facts = self._facts = self.cache.facts(setup)
        if facts.loads is None or facts.orders is None:
            facts.loads = [int(x) for x in setup.scheme.loads]
            facts.orders = [[int(x) for x in o] for o in setup.scheme.orders]
        self._loads = facts.loads  # shared, never modified
        self._order = facts.orders[self.worker_id]
        self._round_scheme = None  # the static order until a round_start says otherwise
        self._pending_config = None
        self._set_phase(_W_IDLE)
        self._events.append(Welcomed(self.worker_id, self._epoch, now))
        self._emit(Ready.trusted(self._epoch), now, delay=False)


#: exact message type -> (phases in which the worker accepts it, handler): the rows the
#: handlers declare (``@handles``), built once (frames from the network are built as their
#: exact class, never a subclass)
_DISPATCH: Mapping[type[Message], tuple[frozenset[WorkerPhase],
                                        Callable[[Worker, Any, float], None]]] = \
    dispatch_of(Worker)
#: kind -> phases in which the worker accepts it from the PS
ACCEPTS: Mapping[str, frozenset[WorkerPhase]] = MappingProxyType(
    {cls.kind: phases for cls, (phases, _fn) in _DISPATCH.items()})
_ACCEPTS = ACCEPTS
