"""The parameter server as a sans-IO state machine.

Invariants
----------
* No clock, no sockets, no global randomness: every input carries ``now`` (seconds, any
  monotonic origin) and nonces come from an injected ``nonce_fn``.
* Phases move only along ``_TRANSITIONS``; a message kind is accepted from a worker only in the
  phases listed in ``_ACCEPTS`` (anything else from an authenticated peer closes that peer).
* The state vector ``state`` only grows within an attempt (reports are monotone); a dropped
  worker's entry is zeroed and its later reports are ignored until the round ends.
* A coded vector is decoded only if it matches (epoch, round, attempt, state digest) of the
  current broadcast; everything older is counted and dropped, never decoded.
* A gradient that is not finite is never applied: the round is recorded as failed.
* Application work leaves the machine: when a round's last vector arrives the PS records
  ``t_end`` and queues the work; :meth:`ParameterServer.run_pending` (called by the driver
  right after flushing) decodes and updates the model, starts the next round at a *fresh*
  ``now`` (so ``t_start(r+1) >= t_end(r)`` and the decode is not billed to the next round), and
  only after that round_start was flushed runs verify / loss / oracle.
* Decodability is incremental: per-chunk coverage counters and a deficit count, updated in
  O(δ) per report (trigger schemes).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Literal

import numpy as np

from aiogc.coding.base import ProgressTracker
from aiogc.coding.consistency import RoundGuard
from aiogc.config import RunConfig, scheme_digest
from aiogc.core.common import (
    AUTH_DEADLINE_S,
    DuplicateWorker,
    Endpoint,
    Event,
    Finished,
    Outgoing,
    PeerClosed,
    RoundCompleted,
    RoundRecord,
    RoundResumed,
    RoundStarted,
    Triggered,
    WorkerDropped,
    WorkerJoined,
    fast_new,
    new_outgoing,
)
from aiogc.errors import (
    CodingError,
    ConfigError,
    LocalProtocolError,
    RemoteProtocolError,
)
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
    Bye,
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
from aiogc.protocol.status import EndReason, RoundStatus

# unvalidated constructors of the frames the PS builds itself (see fast_new)
_new_round_start = fast_new(RoundStart, RoundStart._names)
_new_encode = fast_new(EncodeAndTransmit, EncodeAndTransmit._names)

#: Floor of the cap on unauthenticated connections held at once (:attr:`ParameterServer.
#: pending_cap` is ``max(MAX_PENDING_CONNECTIONS, 2 * m)``): a connection flood must not starve
#: the workers. When they are all taken, a new connection evicts the *oldest* pending one (an
#: honest worker answers its challenge within milliseconds, so holding the slots takes a flood
#: faster than that, not a handful of idle sockets).
MAX_PENDING_CONNECTIONS = 64
#: Pings answered per worker: a bucket of PING_BURST tokens refilled at
#: max(PING_MIN_RATE, 4 / heartbeat_s) per second; pings beyond it are dropped unanswered
#: (``ping_dropped``), so a ping flood cannot make the PS queue pongs without bound.
PING_BURST = 20.0
PING_MIN_RATE = 10.0
_INF = float("inf")
_NONE: tuple[()] = ()
#: ``_tuple_new(Outgoing, (peer, msg, close, reason))``: common.new_outgoing inlined in the
#: per-worker loops of a round start and a broadcast
_tuple_new = tuple.__new__


class PSPhase(enum.Enum):
    JOINING = "joining"  # waiting for enough ready workers (all m before round 0)
    COMPUTING = "computing"  # round running, workers computing and reporting
    COLLECTING = "collecting"  # encode_and_transmit broadcast, waiting for coded vectors
    FINISHED = "finished"

    # members are singletons: hash by identity (Enum's default hashes the name in Python, and
    # phase checks run on every message)
    __hash__ = object.__hash__


_TRANSITIONS: frozenset[tuple[PSPhase, PSPhase]] = frozenset(
    {
        (PSPhase.JOINING, PSPhase.COMPUTING),
        (PSPhase.JOINING, PSPhase.FINISHED),
        (PSPhase.COMPUTING, PSPhase.COLLECTING),
        (PSPhase.COMPUTING, PSPhase.COMPUTING),  # next round
        (PSPhase.COMPUTING, PSPhase.FINISHED),
        (PSPhase.COMPUTING, PSPhase.JOINING),  # next round needs workers that are not ready
        (PSPhase.COLLECTING, PSPhase.JOINING),
        (PSPhase.COLLECTING, PSPhase.COMPUTING),  # resume, or next round
        (PSPhase.COLLECTING, PSPhase.COLLECTING),  # re-broadcast with a new attempt
        (PSPhase.COLLECTING, PSPhase.FINISHED),
    }
)

#: kind -> phases in which an authenticated worker may send it
_ACCEPTS: dict[str, frozenset[PSPhase]] = {
    "ready": frozenset(PSPhase),
    "chunk_report": frozenset(PSPhase),
    "coded_gradient": frozenset(PSPhase),
    "ping": frozenset(PSPhase),
    "pong": frozenset(PSPhase),
    "bye": frozenset(PSPhase),
    "error": frozenset(PSPhase),
}


# phase members as module constants: an Enum class attribute lookup costs ~10x a
# global read, and the hot path compares phases several times per message
_P_COLLECTING = PSPhase.COLLECTING
_P_COMPUTING = PSPhase.COMPUTING
_P_FINISHED = PSPhase.FINISHED
_P_JOINING = PSPhase.JOINING


@dataclass
class _Peer:
    nonce: bytes
    worker: int | None = None
    ready: bool = False
    keys: SessionKeys | None = None


@dataclass
class _RoundState:
    """Mutable per-round bookkeeping; ``record`` is what gets published."""

    record: RoundRecord
    state: list[int]  # (m,) latest accepted counts
    #: ``record.round`` and ``record.reports``, one attribute load closer (read per report)
    round: int = -1
    reports: list[tuple[float, int, int, float]] = field(default_factory=list)
    cover: ProgressTracker | None = None  # trigger schemes only: the scheme's rule
    approx: bool = False  # an approximate trigger is pending (not a public status)
    finished: np.ndarray | None = None  # send-when-done: (m,) loads of the received workers
    attempt: int = 0
    broadcast: tuple[int, ...] | None = None
    digest: bytes = b""
    expected: set[int] = field(default_factory=set)  # workers whose vector we wait for
    received: dict[int, np.ndarray] = field(default_factory=dict)
    excluded: set[int] = field(default_factory=set)
    collect_deadline: float | None = None
    #: t_start + round_timeout_s, and t_start + deadline_s in approx mode (inf if none):
    #: next_deadline reads them after every pump
    timeout_at: float = float("inf")
    approx_at: float = float("inf")
    #: the oracle from the live counters (see ParameterServer._oracle): the elapsed stamp of
    #: the report at which the coverage deficit first reached 0; valid while the accepted
    #: reports arrived in order of their stamps and no worker's coverage was removed
    oracle_at: float | None = None
    last_elapsed: float = float("-inf")
    oracle_live: bool = True


class ParameterServer(Endpoint):
    """Parameter server core: joins workers, runs rounds, triggers, decodes, updates the model.

    Parameters
    ----------
    config : RunConfig
    model : ndarray, shape (d,)
        Initial model.
    learning_rate : float
    loss_fn, verify_fn : callable, optional
        ``loss_fn(w) -> float`` logged per round; ``verify_fn(w) -> (N, d)`` the uncoded chunk
        gradients, used to record each round's decode error (see ``_verify``).
    schedule : DelaySchedule-like, optional
        Provides ``compute_s[r, j, :]`` and ``network_s[r, j]`` sent to workers in round_start.
    secret : bytes, optional
        Master secret S; worker j authenticates with k_j = derive_worker_key(S, j). Without
        one, MACs are empty and not checked and frames carry no tags (loopback only).
    epoch : int
        This PS incarnation; messages of other epochs are stale.
    nonce_fn : callable, optional
        Fresh 16-byte nonces; drivers install one (``secrets.token_bytes``) when None.
    auth_deadline_s : float
        Seconds a new connection has to complete the handshake.
    guard : bool
        Check every decoded gradient before applying it (norm guard, two-way redundancy
        decode, the oracle when ``verify_fn`` is set, model bound; see
        :class:`aiogc.coding.consistency.RoundGuard`). A rejected round is recorded as failed
        with the reason and counted as ``rejected_<check>``; the model is left unchanged.
    """

    def __init__(
        self,
        config: RunConfig,
        *,
        model: np.ndarray,
        learning_rate: float,
        scheme: Any | None = None,
        loss_fn: Callable[[np.ndarray], float] | None = None,
        verify_fn: Callable[[np.ndarray], np.ndarray] | None = None,
        schedule: Any | None = None,
        secret: bytes | None = None,
        epoch: int = 0,
        nonce_fn: Callable[[], bytes] | None = None,
        keep_gradients: bool = False,
        auth_deadline_s: float = AUTH_DEADLINE_S,
        guard: bool = True,
    ) -> None:
        super().__init__()
        self.config = config
        self.scheme = scheme if scheme is not None else config.build_scheme()
        self.m: int = self.scheme.m
        self.model = np.array(model, dtype=np.float64, copy=True)
        self.dim = int(self.model.shape[0])
        self.payload_len: int = self.scheme.payload_len(self.dim)
        self.learning_rate = float(learning_rate)
        self.loss_fn = loss_fn
        self.verify_fn = verify_fn
        self.schedule = schedule
        self.secret = secret
        self.epoch = epoch
        self.keep_gradients = keep_gradients
        self.nonce_fn = nonce_fn
        if not 0 < auth_deadline_s <= 3600:
            raise ConfigError("auth_deadline_s", auth_deadline_s, "a number in (0, 3600]")
        self.auth_deadline_s = float(auth_deadline_s)
        self._digest = scheme_digest(self.scheme)
        self._welcome_config = {**config.to_wire(), "scheme_digest": self._digest}
        self._config_hash = config_hash(self._welcome_config)
        self._worker_keys: dict[int, bytes] = {}
        self._loads = np.asarray(self.scheme.loads, dtype=np.int64)
        self._loads_list: list[int] = [int(x) for x in self._loads]
        self._orders: list[list[int]] = [[int(c) for c in o] for o in self.scheme.orders]
        self._n_parts = int(self.scheme.n_parts)
        self._sends_when_done = bool(self.scheme.sends_when_done)
        # work queued for run_pending: stage 1 (decode, update, next round), stage 2 (analytics)
        self._stage1: tuple[RoundRecord, bool, str, bool, np.ndarray, int] | None = None
        self._stage2: list[tuple[RoundRecord, np.ndarray | None, np.ndarray, np.ndarray]] = []
        self._deferred_events: list[Event] = []
        self._analysing: int | None = None
        self._ping_bucket: dict[int, tuple[float, float]] = {}
        self._all_decodable: bool | None = None  # is_decodable with every worker finished
        #: round -> the oracle the live counters found (see _RoundState.oracle_at)
        self._oracle_hints: dict[int, float | None] = {}
        #: cond(B) * eps(payload dtype): predicted worst relative decode error (spec §2)
        self.predicted_error = self._check_conditioning()
        # verify_fn is not called here (it may read PS state that does not exist yet): with it,
        # the oracle check vouches for the first rounds; without, the norm guard's warm-up does
        self.guard: RoundGuard | None = (
            RoundGuard(self.model, predicted_error=self.predicted_error) if guard else None)

        self.phase = _P_JOINING
        self._peers: dict[Hashable, _Peer] = {}
        self._worker_peer: dict[int, Hashable] = {}
        self._last_heard: dict[int, float] = {}
        self._pending: dict[Hashable, float] = {}  # unauthenticated peer -> auth deadline
        self._sweep_at: float | None = None  # next liveness sweep
        self._round: _RoundState | None = None
        self._round_no = -1
        self._join_deadline: float | None = None
        #: True while start(join_clock=False) waits for workers_launched()
        self._join_clock_deferred = False
        self.records: list[RoundRecord] = []
        # payload buffers: one row per worker, reused across rounds (the network layer
        # receives each payload straight into its row: performance.md pitfall 4)
        self._payload_rows = np.zeros((self.m, self.payload_len), dtype=config.payload_dtype)
        #: one persistent view per row, so that "received in place" is an identity check
        self._rows: list[np.ndarray] = list(self._payload_rows)

    # ================================================================== driver contract

    def start(self, *, now: float, join_clock: bool = True) -> None:
        """The PS is listening: the join deadline runs from here, not from the first
        connection (a PS nobody connects to ends with a reason instead of waiting forever).

        ``join_clock=False``: whoever launches the workers calls :meth:`workers_launched`
        once they exist (the Ray backend when every actor registered, a test after starting
        its processes), so the first join deadline never races how fast a process starts on
        a loaded machine. Until then round 0 waits for all m workers.
        """
        self._join_clock_deferred = not join_clock
        if join_clock:
            self._arm_join_deadline(now)

    def workers_launched(self, *, now: float) -> None:
        """The launcher's workers exist: the deferred join deadline starts now (no-op when
        the clock already runs or round 0 has started)."""
        self._join_clock_deferred = False
        self._arm_join_deadline(now)

    def _arm_join_deadline(self, now: float) -> None:
        if (self._join_deadline is None and self.phase is _P_JOINING
                and not self._join_clock_deferred):
            self._join_deadline = now + self.config.join_timeout_s

    @property
    def pending_cap(self) -> int:
        """Unauthenticated connections held at once: every worker of the run may be mid-
        handshake together (m workers on one host connect in one burst, and that host answers
        the m challenges more slowly than they are sent), plus as many again of margin for a
        flood or reconnects. A fixed 64 made 1024 workers of one host evict each other and
        back off for seconds; a flood still cannot hold more than 2m slots."""
        return max(MAX_PENDING_CONNECTIONS, 2 * self.m)

    def connection_made(self, peer: Hashable, *, now: float) -> None:
        """A new connection: send it a challenge; it has ``auth_deadline_s`` to answer."""
        self._catch_up(now)
        if len(self._pending) >= self.pending_cap:
            oldest = next(iter(self._pending))  # insertion order: the oldest pending first
            self.stats["evicted_pending"] += 1
            self._close(oldest, "too_many_connections",
                        "pending connection cap reached: oldest unauthenticated evicted", now)
        if self.nonce_fn is None:
            raise LocalProtocolError("no nonce_fn: the driver must install one")
        nonce = self.nonce_fn()
        self._peers[peer] = _Peer(nonce=nonce)
        self._pending[peer] = now + self.auth_deadline_s
        self._arm_join_deadline(now)
        self._send(peer, Challenge(nonce=nonce, epoch=self.epoch))

    def connection_lost(self, peer: Hashable, *, now: float, code: str | None = None) -> None:
        """The transport closed (EOF, reset, or after we closed it).

        ``code``: the typed reason when the *transport* closed it (malformed frame, bad tag,
        slow consumer...), which the core never saw as a message; counted as ``closed_{code}``.
        """
        self._catch_up(now)
        if code is not None:
            self.stats[f"closed_{code}"] += 1
        info = self._peers.pop(peer, None)
        self._pending.pop(peer, None)
        if info is None or info.worker is None:
            return
        if self._worker_peer.get(info.worker) == peer:
            del self._worker_peer[info.worker]
            self._last_heard.pop(info.worker, None)
            self._drop_workers([info.worker], "disconnected", now)

    def receive(self, peer: Hashable, msg: Message, *, now: float) -> None:
        """Feed one decoded message from ``peer``. Garbage closes that peer only."""
        if self._stage1 is not None:
            self._catch_up(now)
        info = self._peers.get(peer)
        if info is None:
            self.stats["from_unknown_peer"] += 1
            return
        try:
            worker = info.worker
            if worker is None:
                self._handshake(peer, info, msg, now)
            else:
                self._last_heard[worker] = now
                # the two per-round kinds first (both accepted in every phase)
                if type(msg) is ChunkReport:
                    self._on_report(worker, msg, now)
                elif type(msg) is CodedGradient:
                    self._on_coded(worker, msg, now)
                else:
                    self._dispatch(worker, peer, msg, now)
        except RemoteProtocolError as exc:
            self._close(peer, exc.code, exc.reason, now)

    def receive_and_poll(self, peer: Hashable, msg: Message, *, now: float
                         ) -> tuple[Sequence[Outgoing], Sequence[Event] | None, float | None]:
        """:meth:`receive`, then :meth:`poll` (one driver call instead of two per frame)."""
        self.receive(peer, msg, now=now)
        return self.poll()

    def handle_timer(self, *, now: float) -> None:
        """Process every deadline that is due at ``now``."""
        self._catch_up(now)
        if self._pending:
            self._expire_pending(now)
        dead_after = self.config.dead_after_s
        if dead_after is not None and self._sweep_at is not None and now >= self._sweep_at:
            self._sweep_liveness(now, dead_after)
        if self.phase is _P_JOINING:
            if self._join_deadline is not None and now >= self._join_deadline:
                self._on_join_deadline(now)
            return
        rs = self._round
        if rs is not None and self.phase is not _P_FINISHED:
            self._round_deadlines(rs, now)

    def _expire_pending(self, now: float) -> None:
        for peer, deadline in list(self._pending.items()):
            if now >= deadline:
                self._close(peer, "auth_timeout", "no valid hello within the deadline", now)

    def _sweep_liveness(self, now: float, dead_after: float) -> None:
        # liveness is swept every dead_after/4 rather than tracked per worker, so that
        # next_deadline() stays O(1) per message: a silent worker is declared dead between
        # dead_after and 1.25 * dead_after after it was last heard
        self._sweep_at = now + dead_after / 4 if self._last_heard else None
        dead = [w for w, t in self._last_heard.items() if now >= t + dead_after]
        # Forget the dead workers *before* the round reacts to their loss: a round that
        # fails because of them starts the next one at once, and that round must not
        # count them as ready (it would wait for them until round_timeout_s).
        peers = []
        for worker in dead:
            peer = self._worker_peer.pop(worker, None)
            self._last_heard.pop(worker, None)
            if peer is not None:
                peers.append(peer)
                info = self._peers.get(peer)
                if info is not None:
                    info.ready = False
        if dead:
            self._drop_workers(dead, "heartbeat_timeout", now)
        for peer in peers:
            self._close(peer, "heartbeat_timeout", "silent too long", now)

    def _on_join_deadline(self, now: float) -> None:
        if self._round_no == -1 and self._ready_can_decode():
            # round 0 waits for all m only until join_timeout_s; then it starts with
            # the ready workers if they can decode (the others join later rounds)
            self._start_round(now, force=True)
        else:
            self._finish(
                f"only {len(self._ready_workers())} of {self.m} workers ready for round "
                f"{self._round_no + 1} within join_timeout_s={self.config.join_timeout_s}",
                now,
            )

    def _round_deadlines(self, rs: _RoundState, now: float) -> None:
        """The running round's timers: round timeout, collect timeout, approx deadline."""
        rec = rs.record
        if now >= rec.t_start + self.config.round_timeout_s:
            self._on_round_timeout(now)
            return
        if (
            self.phase is _P_COLLECTING
            and rs.collect_deadline is not None
            and now >= rs.collect_deadline
        ):
            self._drop_workers(sorted(rs.expected - set(rs.received)), "collect_timeout", now)
            return
        if (
            self.phase is _P_COMPUTING
            and self.config.mode == "approx"
            and self.config.deadline_s is not None
            and now >= rec.t_start + self.config.deadline_s
        ):
            self._on_approx_deadline(now)

    def has_pending(self) -> bool:
        """True while :meth:`run_pending` has work (call it after flushing the outbox)."""
        return self._stage1 is not None or bool(self._stage2)

    def run_pending(self, now_fn: Callable[[], float]) -> None:
        """Run one stage of queued application work.

        Stage 1 (a round just ended): decode, update the model, start the next round at
        ``now_fn()`` (read *after* the decode). Stage 2 (after the driver flushed that
        round_start): decode error, loss and oracle of the ended round, then its
        :class:`RoundCompleted` event. The driver calls this until :meth:`has_pending` is
        False, flushing in between.
        """
        if self._stage1 is not None:
            self._run_stage1(now_fn)
        elif self._stage2:
            self._run_stage2()

    def next_event(self) -> Event | None:
        """The next event, or None (runs queued analytics first if the driver did not)."""
        while self._stage2 and self._stage1 is None:
            self._run_stage2()
        return super().next_event()

    def drain_events(self) -> list[Event]:
        """Every queued event (runs queued analytics first if the driver did not)."""
        while self._stage2 and self._stage1 is None:
            self._run_stage2()
        return super().drain_events()

    def session_keys(self, peer: Hashable) -> SessionKeys | None:
        """GMAC keys of ``peer``'s session (set once it authenticated with a secret)."""
        info = self._peers.get(peer)
        return None if info is None else info.keys

    def next_deadline(self) -> float | None:
        """The earliest time at which ``handle_timer`` has something to do, or None."""
        # called after every pump: plain comparisons, no list and no min() over one; the
        # round's deadlines were computed when it started
        best = min(self._pending.values()) if self._pending else _INF
        sweep = self._sweep_at
        if sweep is not None and sweep < best and self.config.dead_after_s is not None:
            best = sweep
        phase = self.phase
        if phase is _P_COMPUTING or phase is _P_COLLECTING:
            rs = self._round
            if rs is not None:
                t = rs.timeout_at
                if t < best:
                    best = t
                if phase is _P_COLLECTING:
                    if rs.collect_deadline is not None and rs.collect_deadline < best:
                        best = rs.collect_deadline
                elif rs.approx_at < best:
                    best = rs.approx_at
        elif (phase is _P_JOINING and self._join_deadline is not None
              and self._join_deadline < best):
            best = self._join_deadline
        return None if best == _INF else best

    def poll(self) -> tuple[Sequence[Outgoing], Sequence[Event] | None, float | None]:
        """One driver call per pump instead of four: ``(outgoing, events, deadline)``.

        Drains the outbox; then, when :meth:`run_pending` has work, returns
        ``(outgoing, None, None)`` (the driver flushes, calls ``run_pending`` and polls
        again); otherwise also drains the events and returns :meth:`next_deadline`. Same order
        and results as ``messages_to_send``, ``has_pending``, ``drain_events``,
        ``next_deadline`` called in turn.
        """
        # an empty queue comes back as the shared empty tuple: no list per poll
        out: Sequence[Outgoing] = self._outbox
        if out:
            self._outbox = []
        else:
            out = _NONE
        if self._stage1 is not None or self._stage2:
            return out, None, None
        events: Sequence[Event] = self._events
        if events:
            self._events = []
        else:
            events = _NONE
        return out, events, self.next_deadline()

    # ================================================================== public helpers

    @property
    def round(self) -> int:
        """The current round; while ``verify_fn`` / ``loss_fn`` run (after the next round
        started), the round they analyse."""
        return self._round_no if self._analysing is None else self._analysing

    @property
    def finished(self) -> bool:
        return self.phase is _P_FINISHED

    def _ready_workers(self) -> dict[int, Hashable]:
        """Authenticated workers that said ``ready`` (they take part in the next round)."""
        return {w: p for w, p in self._worker_peer.items() if self._peers[p].ready}

    def payload_buffer(self, peer: Hashable, dtype: np.dtype, n: int) -> np.ndarray | None:
        """Destination row for a coded payload arriving from ``peer`` (zero-copy receive).

        Returns None (the network layer then allocates) when the peer is not an authenticated
        worker or the declared dtype / length is not what this run expects; the core then
        rejects the message itself, with the reason.
        """
        info = self._peers.get(peer)
        rs = self._round
        if info is None or info.worker is None or rs is None:
            return None
        if n != self.payload_len or np.dtype(dtype) != self._payload_rows.dtype:
            return None
        w = info.worker
        # only a vector we are waiting for may land in the row: a duplicate or stale one must
        # not overwrite an accepted vector
        if w in rs.received or w in rs.excluded:
            return None
        if self._sends_when_done:
            ok = self.phase is _P_COMPUTING
        else:
            ok = self.phase is _P_COLLECTING and w in rs.expected
        return self._rows[w] if ok else None

    def worker_of(self, peer: Hashable) -> int | None:
        """The worker id ``peer`` authenticated as, or None."""
        info = self._peers.get(peer)
        return None if info is None else info.worker

    def is_authenticated(self, peer: Hashable) -> bool:
        """Whether ``peer`` completed the handshake (the driver then raises its frame limits)."""
        info = self._peers.get(peer)
        return info is not None and info.worker is not None

    def stop(self, reason: str, *, now: float) -> None:
        """Abort the run (e.g. SIGTERM): tell the workers and finish."""
        if self.phase is not _P_FINISHED:
            self._finish(reason, now)

    # ================================================================== internals

    def _check_conditioning(self) -> float:
        """Refuse (or warn about) a decoding matrix B whose worst ℓ-subset condition number
        predicts more relative error than ``config.max_predicted_error`` for the payload dtype.
        """
        B = getattr(self.scheme, "B", None)
        if B is None or self.scheme.n_parts == 1:
            return float(np.finfo(self.config.payload_dtype).eps)  # B = 1ᵀ, condition 1
        from aiogc.coding import check_conditioning

        mode: Literal["raise", "warn"] = (
            "raise" if self.config.on_ill_conditioned == "raise" else "warn"
        )
        try:
            return check_conditioning(self.scheme.A, B, self.scheme.n_parts,
                                      self.config.payload_dtype,
                                      tol=self.config.max_predicted_error, on_fail=mode)
        except CodingError as exc:
            raise ConfigError("max_predicted_error", self.config.max_predicted_error,
                              f"a bound the decoding matrix meets ({exc})") from exc

    def _set_phase(self, new: PSPhase) -> None:
        if (self.phase, new) not in _TRANSITIONS:
            raise LocalProtocolError(f"illegal PS transition {self.phase.value} -> {new.value}")
        self.phase = new

    def _send(self, peer: Hashable, msg: Message) -> None:
        self._outbox.append(new_outgoing(peer, msg, False, ""))

    def _broadcast(self, msg: Message, *, ready_only: bool = False) -> None:
        """Queue ``msg`` for every authenticated worker (``ready_only``: only those that said
        ``ready``: a worker still building its task is in no round, and round messages would
        only make it fail the connection)."""
        peers = self._peers
        append = self._outbox.append
        for peer in self._worker_peer.values():
            if not ready_only or peers[peer].ready:
                append(_tuple_new(Outgoing, (peer, msg, False, "")))

    def _close(self, peer: Hashable, code: str, reason: str, now: float) -> None:
        self.stats[f"closed_{code}"] += 1
        self._outbox.append(Outgoing(peer, Error(code=code, reason=reason[:1000]), close=True,
                                     reason=code))
        self._events.append(PeerClosed(peer, code, reason, now))
        info = self._peers.pop(peer, None)
        self._pending.pop(peer, None)
        if info is not None and info.worker is not None and self._worker_peer.get(
            info.worker
        ) == peer:
            del self._worker_peer[info.worker]
            self._last_heard.pop(info.worker, None)
            self._drop_workers([info.worker], code, now)

    # ------------------------------------------------------------------ handshake

    def _worker_key(self, worker: int) -> bytes:
        assert self.secret is not None
        key = self._worker_keys.get(worker)
        if key is None:
            key = self._worker_keys[worker] = derive_worker_key(self.secret, worker)
        return key

    def _handshake(self, peer: Hashable, info: _Peer, msg: Message, now: float) -> None:
        if not isinstance(msg, Hello):
            raise RemoteProtocolError(f"expected hello, got {msg.kind}", code="unexpected_kind")
        if msg.worker >= self.m:
            raise RemoteProtocolError(
                f"worker id {msg.worker} out of range [0, {self.m})", code="bad_worker_id"
            )
        if msg.epoch != self.epoch:
            raise RemoteProtocolError(f"hello for epoch {msg.epoch}", code="stale_epoch")
        keys = None
        if self.secret is not None:
            key = self._worker_key(msg.worker)
            expect = hello_mac(key, info.nonce, msg.nonce, msg.worker, self.epoch)
            if not macs_equal(expect, msg.mac):
                raise RemoteProtocolError("bad MAC", code="auth_failed")
            mac = welcome_mac(key, info.nonce, msg.nonce, msg.worker, self.epoch,
                              self._config_hash)
            keys = session_keys(key, info.nonce, msg.nonce, self.epoch, msg.worker)
        else:
            mac = b""
        old = self._worker_peer.get(msg.worker)
        if old is not None and old != peer:
            # newest authenticated connection wins (the old one is probably half-dead); the
            # worker leaves the running round: the new connection joins at the next one. Two
            # live processes claiming one id is a misconfiguration (or an attack): count it
            self.stats["duplicate_worker"] += 1
            self._events.append(DuplicateWorker(msg.worker, peer, now))
            self._close(old, "replaced", "a newer connection authenticated as this worker", now)
        info.worker = msg.worker
        info.keys = keys
        self._pending.pop(peer, None)
        self._worker_peer[msg.worker] = peer
        self._last_heard[msg.worker] = now
        if self._sweep_at is None and self.config.dead_after_s is not None:
            self._sweep_at = now + self.config.dead_after_s / 4
        self._send(
            peer, Welcome(epoch=self.epoch, worker=msg.worker, mac=mac, config=self._welcome_config)
        )
        self._events.append(WorkerJoined(msg.worker, peer, now))
        self.stats["joined"] += 1

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, worker: int, peer: Hashable, msg: Message, now: float) -> None:
        allowed = _ACCEPTS.get(msg.kind)
        if allowed is None:
            what = "a second hello" if msg.kind == "hello" else f"{msg.kind} from a worker"
            raise RemoteProtocolError(f"{what} is not allowed", code="bad_kind")
        if self.phase not in allowed:
            raise RemoteProtocolError(f"{msg.kind} not allowed in {self.phase.value}",
                                      code="bad_kind")
        if isinstance(msg, ChunkReport):
            self._on_report(worker, msg, now)
        elif isinstance(msg, CodedGradient):
            self._on_coded(worker, msg, now)
        elif isinstance(msg, Ready):
            if msg.epoch != self.epoch:
                raise RemoteProtocolError(f"ready for epoch {msg.epoch}", code="stale_epoch")
            self._peers[peer].ready = True
            if self.phase is _P_JOINING and self._can_start(self._round_no + 1):
                self._start_round(now)
        elif isinstance(msg, Ping):
            if self._ping_allowed(worker, now):
                self._send(peer, Pong.trusted(msg.seq))
            else:
                self.stats["ping_dropped"] += 1
        elif isinstance(msg, Pong):
            pass
        elif isinstance(msg, (Bye, Error)):
            self.stats[f"peer_{msg.kind}"] += 1
            self._close(peer, "bye", getattr(msg, "reason", ""), now)

    def _ping_allowed(self, worker: int, now: float) -> bool:
        tokens, last = self._ping_bucket.get(worker, (PING_BURST, now))
        hb = self.config.heartbeat_s
        rate = max(PING_MIN_RATE, 4.0 / hb) if hb else PING_MIN_RATE
        tokens = min(PING_BURST, tokens + (now - last) * rate)
        ok = tokens >= 1.0
        self._ping_bucket[worker] = (tokens - 1.0 if ok else tokens, now)
        return ok

    def _current(self, epoch: int, rnd: int, kind: str) -> _RoundState | None:
        """The running round if (epoch, round) match it; else count and return None."""
        rs = self._round
        if epoch != self.epoch:
            self.stats[f"stale_epoch_{kind}"] += 1
            return None
        if rs is None or rnd != rs.record.round or self.phase not in (
            _P_COMPUTING,
            _P_COLLECTING,
        ):
            if rs is not None and rnd > rs.record.round:
                raise RemoteProtocolError(f"{kind} for future round {rnd}", code="future_round")
            self.stats[f"stale_round_{kind}"] += 1
            return None
        return rs

    def _on_report(self, worker: int, msg: ChunkReport, now: float) -> None:
        rs = self._round
        phase = self.phase
        if rs is None or msg.round != rs.round or msg.epoch != self.epoch or (
                phase is not _P_COMPUTING and phase is not _P_COLLECTING):
            rs = self._current(msg.epoch, msg.round, "chunk_report")  # counts it, or raises
            if rs is None:
                return
        count = msg.count
        if count > self._loads_list[worker]:
            raise RemoteProtocolError(
                f"count {count} > load {self._loads_list[worker]}", code="bad_count"
            )
        if worker in rs.excluded:
            self.stats["report_from_excluded"] += 1
            return
        state = rs.state
        old = state[worker]
        if count <= old:
            self.stats["duplicate_report" if count == old else "nonmonotone_report"] += 1
            return
        state[worker] = count
        elapsed = msg.elapsed_s
        rs.reports.append((now, worker, count, elapsed))
        cover = rs.cover
        if cover is not None:
            cover.add(worker, old, count)
            if elapsed < rs.last_elapsed:
                rs.oracle_live = False  # out of stamp order: the oracle re-sorts (stage 2)
            rs.last_elapsed = elapsed
            if cover.deficit == 0:
                if rs.oracle_at is None:
                    rs.oracle_at = float(elapsed)
                if phase is _P_COMPUTING:
                    self._trigger(now, exact=True)

    def _on_coded(self, worker: int, msg: CodedGradient, now: float) -> None:
        rs = self._round
        phase = self.phase
        if rs is None or msg.round != rs.round or msg.epoch != self.epoch or (
                phase is not _P_COMPUTING and phase is not _P_COLLECTING):
            rs = self._current(msg.epoch, msg.round, "coded_gradient")  # counts, or raises
        if rs is None or not self._awaited(rs, worker, msg):
            return
        # 2. is it usable? A bad payload is a rejected contribution, not a closed connection:
        # the worker counts as a straggler this round.
        payload = msg.payload
        problem = self._payload_problem(payload)
        if problem is not None:
            self.stats["payload_rejected"] += 1
            rs.record.dropped[worker] = f"payload_rejected: {problem}"
            self._drop_workers([worker], "payload_rejected", now)
            return
        self._accept_coded(rs, worker, msg, payload, now)

    def _awaited(self, rs: _RoundState, worker: int, msg: CodedGradient) -> bool:
        """Is this a vector we are waiting for? (stale ones are dropped whatever they hold)"""
        if worker in rs.excluded or worker in rs.received:
            self.stats["late_or_duplicate_coded"] += 1
            return False
        if self._sends_when_done:
            if self.phase is not _P_COMPUTING:
                self.stats["late_or_duplicate_coded"] += 1
                return False
            return True
        if self.phase is not _P_COLLECTING or msg.attempt != rs.attempt or (
            worker not in rs.expected
        ):
            self.stats["stale_attempt_coded"] += 1
            return False
        if msg.state_digest != rs.digest:
            raise RemoteProtocolError("coded vector encoded against another state",
                                      code="bad_state_digest")
        return True

    def _payload_problem(self, payload: np.ndarray) -> str | None:
        """Why ``payload`` cannot be used (length, dtype, non-finite values), or None."""
        if payload.shape != (self.payload_len,):
            return f"length {payload.shape[0]} != {self.payload_len}"
        dt = self._payload_rows.dtype
        if payload.dtype is not dt and payload.dtype != dt:
            return f"dtype {payload.dtype.str} != {dt.str}"
        # count_nonzero of the mask: the same test as isfinite(...).all(), without the
        # ndarray.all() wrapper that costs more than the test itself on short payloads (a
        # sum-of-squares shortcut would warn on overflow for large finite payloads)
        if np.count_nonzero(np.isfinite(payload)) != payload.size:
            return "non-finite values"
        return None

    def _accept_coded(self, rs: _RoundState, worker: int, msg: CodedGradient,
                      payload: np.ndarray, now: float) -> None:
        if self._sends_when_done and rs.state[worker] < self._loads_list[worker]:
            # it finished everything (send-when-done workers send no chunk reports)
            rs.state[worker] = self._loads_list[worker]
        if rs.finished is not None:
            rs.finished[worker] = self._loads_list[worker]
        row = self._rows[worker]
        if payload is not row:
            row[:] = payload  # not received in place (tests, simulator): copy into the row
        rs.received[worker] = row
        rs.record.arrivals[worker] = now
        rs.record.compute_s[worker] = msg.compute_s
        if self._sends_when_done:
            if self._decodable_received(rs):
                rs.record.t_trigger = now
                self._end_round(now, exact=True, reason="decodable")
        elif len(rs.received) >= len(rs.expected) and set(rs.received) >= rs.expected:
            self._end_round(now, exact=not rs.approx,
                            reason="all_expected")

    # ------------------------------------------------------------------ rounds

    def _ready_can_decode(self, ready: dict[int, Hashable] | None = None) -> bool:
        if ready is None:
            ready = self._ready_workers()
        if self.config.mode != "exact" or not ready:
            return bool(ready)
        if len(ready) == self.m:  # the usual case between rounds: the answer never changes
            if self._all_decodable is None:
                self._all_decodable = bool(self.scheme.is_decodable(self._finished_state(ready)))
            return self._all_decodable
        return bool(self.scheme.is_decodable(self._finished_state(ready)))

    def _can_start(self, r: int, ready: dict[int, Hashable] | None = None) -> bool:
        """Round 0 waits for all m workers (until join_timeout_s, see handle_timer); later
        rounds for enough ready workers to decode (exact mode) or at least one (approx mode),
        so that a round is never started hopeless and burnt while workers reconnect.
        ``ready``: :meth:`_ready_workers`, when the caller has it already."""
        if ready is None:
            ready = self._ready_workers()
        if r == 0:
            return len(ready) == self.m
        return self._ready_can_decode(ready)

    def _start_round(self, now: float, *, force: bool = False) -> None:
        r = self._round_no + 1
        if r >= self.config.rounds:
            self._round_no = r
            self._finish("all rounds done", now)
            return
        ready = self._ready_workers()
        if not force and not self._can_start(r, ready):
            # only reached when a round just ended: wait (join_timeout_s) for enough workers
            if self.phase is not _P_JOINING:
                self._set_phase(_P_JOINING)
            self._round = None
            self._join_deadline = now + self.config.join_timeout_s
            return
        self._round_no = r
        self._set_phase(_P_COMPUTING)
        rec = RoundRecord(round=r, scheme=self.scheme.name, t_start=now)
        cover = None
        if not self._sends_when_done:
            cover = self.scheme.progress_tracker()
        cfg = self.config
        self._round = _RoundState(
            record=rec, state=[0] * self.m, round=r, reports=rec.reports, cover=cover,
            timeout_at=now + cfg.round_timeout_s,
            approx_at=(now + cfg.deadline_s if cfg.mode == "approx" and cfg.deadline_s is not None
                       else _INF))
        # a copy: the transport may still read it after we update self.model
        model = self.model.astype(self.config.payload_dtype, copy=True)
        sched = self.schedule
        if sched is not None and r < sched.compute_s.shape[0]:
            # one tolist() per round rather than numpy slicing and scalars per worker
            comp = sched.compute_s[r].tolist()
            net_row = sched.network_s[r].tolist()
            loads = self._loads_list
            epoch = self.epoch
            append = self._outbox.append
            for worker, peer in sorted(ready.items()):
                append(_tuple_new(Outgoing, (peer, _new_round_start(
                    epoch, r, tuple(comp[worker][:loads[worker]]), float(net_row[worker]),
                    model), False, "")))
        else:
            # one message object for everyone: the driver encodes it once
            msg = _new_round_start(self.epoch, r, (), 0.0, model)
            for _worker, peer in sorted(ready.items()):
                self._send(peer, msg)
        # workers not connected and ready now cannot take part in this round
        if len(ready) < self.m:
            self._round.excluded.update(w for w in range(self.m) if w not in ready)
        ev = RoundStarted(r, now)
        if self._stage2:
            self._deferred_events.append(ev)  # after the previous round's RoundCompleted
        else:
            self._events.append(ev)

    def _trigger(self, now: float, *, exact: bool) -> None:
        """Broadcast encode_and_transmit with the current state (a new attempt if repeated)."""
        rs = self._round
        assert rs is not None
        if rs.broadcast is not None:
            rs.attempt += 1
        state = tuple(rs.state)
        rs.broadcast = state
        rs.digest = state_digest(state)
        # partial: worker j contributes iff c_j > 0
        rs.expected = {j for j, c in enumerate(state) if c > 0}
        rs.received = {}
        rs.collect_deadline = now + self.config.collect_timeout_s
        if rs.record.t_trigger is None:
            rs.record.t_trigger = now
        if not exact:
            rs.approx = True
        self._set_phase(_P_COLLECTING)
        self._broadcast(_new_encode(self.epoch, rs.record.round, rs.attempt,
                                                  state), ready_only=True)
        self._events.append(Triggered(rs.record.round, rs.attempt, state, now, exact))
        if not rs.expected:  # nothing to wait for (cannot happen when exact)
            self._end_round(now, exact=False, reason="no_contributors")

    def _decodable_received(self, rs: _RoundState) -> bool:
        if rs.finished is None:
            rs.finished = self._finished_state(rs.received)
        return bool(self.scheme.is_decodable(rs.finished))

    def _finished_state(self, workers: Iterable[int]) -> np.ndarray:
        """State vector in which exactly ``workers`` finished all their chunks; shape (m,)."""
        st = np.zeros(self.m, dtype=np.int64)
        idx = list(workers)
        st[idx] = self._loads[idx]
        return st

    def _drop_workers(self, workers: list[int], reason: str, now: float) -> None:
        """Take ``workers`` out of the running round, then re-broadcast or resume once."""
        rs = self._round
        if rs is None or self.phase not in (_P_COMPUTING, _P_COLLECTING):
            return
        lost_expected = False
        for worker in workers:
            if worker in rs.excluded:
                continue
            rs.excluded.add(worker)
            rs.record.dropped.setdefault(worker, reason)
            self._events.append(WorkerDropped(worker, rs.record.round, reason, now))
            self.stats["dropped"] += 1
            if self._sends_when_done:
                continue  # a vector already received stays valid: it depends on no one else
            old = rs.state[worker]
            if old > 0 and worker in rs.expected:
                lost_expected = True
            if old > 0 and rs.cover is not None:
                rs.cover.remove(worker, old)
                rs.oracle_live = False
            rs.state[worker] = 0
        if self._hopeless(rs):
            # not even every remaining worker finishing everything could decode exactly: say
            # so now instead of waiting for the round timeout (approx mode waits for its
            # deadline, which decodes what there is)
            self._end_round_failed(now, EndReason.WORKERS_GONE,
                                   f"cannot decode: workers {sorted(rs.excluded)} gone")
            return
        if self.phase is not _P_COLLECTING or not lost_expected:
            return
        assert rs.cover is not None
        if rs.cover.deficit == 0:
            self._trigger(now, exact=True)
        elif rs.approx:
            if any(rs.state):
                self._trigger(now, exact=False)
            else:
                self._end_round_failed(now, EndReason.NOTHING_COMPUTED, "nothing computed")
        else:
            rs.attempt += 1
            rs.broadcast = None
            rs.expected = set()
            rs.received = {}
            rs.collect_deadline = None
            self._set_phase(_P_COMPUTING)
            self._broadcast(Resume.trusted(self.epoch, rs.record.round, rs.attempt),
                            ready_only=True)
            self._events.append(RoundResumed(rs.record.round, rs.attempt, now))
            # rs.broadcast is None again, so the next trigger keeps this attempt number
            # (the resume itself consumed one)

    def _hopeless(self, rs: _RoundState) -> bool:
        """Exact mode, and the round cannot decode even if every worker still in it finishes."""
        if self.config.mode != "exact":
            return False
        alive = (set(range(self.m)) - rs.excluded) | set(rs.received)
        return not self.scheme.is_decodable(self._finished_state(alive))

    def _on_approx_deadline(self, now: float) -> None:
        rs = self._round
        assert rs is not None
        if self._sends_when_done:
            if rs.received:
                rs.record.t_trigger = now
                self._end_round(now, exact=False, reason="deadline")
            else:
                self._end_round_failed(now, EndReason.NOTHING_COMPUTED,
                                       "deadline with no finished worker")
        elif any(rs.state):
            self._trigger(now, exact=False)
        else:
            self._end_round_failed(now, EndReason.NOTHING_COMPUTED,
                                   "deadline with no finished chunk")

    def _on_round_timeout(self, now: float) -> None:
        rs = self._round
        assert rs is not None
        if self._sends_when_done and rs.received and self.config.mode == "approx":
            self._end_round(now, exact=False, reason="round_timeout")
        else:
            self._end_round_failed(now, EndReason.TIMEOUT,
                                   f"round timeout ({self.config.round_timeout_s} s)")

    # ------------------------------------------------------------------ end of a round

    def _catch_up(self, now: float) -> None:
        """A driver that does not call run_pending still gets the old behaviour."""
        while self._stage1 is not None:
            self._run_stage1(lambda: now)

    def _end_round(self, now: float, *, exact: bool, reason: str) -> None:
        """The round's last needed vector arrived at ``now``: queue decode and next round."""
        self._close_round(now, exact=exact, reason=reason, decode=True)

    def _end_round_failed(self, now: float, reason: EndReason, detail: str) -> None:
        rs = self._round
        assert rs is not None
        rs.record.status = RoundStatus.FAILED
        rs.record.end_reason, rs.record.end_detail = reason, detail
        self.stats["failed_rounds"] += 1
        self._close_round(now, exact=False, reason=reason, decode=False)

    def _close_round(self, now: float, *, exact: bool, reason: str, decode: bool) -> None:
        rs = self._round
        assert rs is not None
        rec = rs.record
        rec.t_end = now
        if decode and self._sends_when_done:
            state = self._finished_state(rs.received)
        elif decode:
            assert rs.broadcast is not None
            state = np.asarray(rs.broadcast, dtype=np.int64)
        else:
            state = np.asarray(rs.state, dtype=np.int64)
        rec.state = tuple(state.tolist())  # Python ints, one call rather than m int()s
        if rs.oracle_live and rs.cover is not None:
            self._oracle_hints[rec.round] = rs.oracle_at
        self._round = None
        self._set_phase(_P_JOINING)
        self._stage1 = (rec, exact, reason, decode, state, rs.attempt)

    def _run_stage1(self, now_fn: Callable[[], float]) -> None:
        assert self._stage1 is not None
        rec, exact, reason, decode, state, attempt = self._stage1
        self._stage1 = None
        w_prev = self.model
        grad: np.ndarray | None = None
        if decode:
            rec.attempts = attempt + 1
            result = self._decode(state)
            grad = np.asarray(result.gradient, dtype=np.float64)
            if not np.isfinite(grad).all():
                self.stats["nonfinite_decode"] += 1
                self.stats["failed_rounds"] += 1
                rec.status = RoundStatus.FAILED
                rec.end_reason = EndReason.NONFINITE
                rec.end_detail = "decoded gradient is not finite"
                grad = None
            else:
                rec.residual = float(result.residual)
                rec.amplification = float(result.amplification)
                rec.status = (RoundStatus.EXACT if (result.exact and exact)
                              else RoundStatus.APPROXIMATE)
                rec.end_reason = EndReason(reason)
                if self.keep_gradients:
                    rec.gradient = grad.copy()
                if self.guard is None:
                    self.model = w_prev - self.learning_rate * grad
                elif not self._guarded_step(rec, grad, w_prev, state):
                    grad = None
        self.records.append(rec)
        self._stage2.append((rec, grad, w_prev, self.model))
        # the next round starts now, after the decode: its t_start is a fresh clock reading
        now = now_fn()
        if self.phase is _P_JOINING and self._round is None:
            self._after_round(rec, now)

    def _guarded_step(self, rec: RoundRecord, grad: np.ndarray, w_prev: np.ndarray,
                      state: np.ndarray) -> bool:
        """Apply ``grad`` only if the round guard vouches for it; else fail the round."""
        assert self.guard is not None
        if self.verify_fn is not None:
            # a PS that verifies never applies an unverified step: the oracle runs here,
            # before the update, rather than with the analytics
            rec.rel_error, rec.rel_error_plain = self._verify(grad, w_prev)
        bad, new = self.guard.check(
            scheme=self.scheme, coded=self._payload_rows, received=np.flatnonzero(state > 0),
            dim=self.dim, gradient=grad, model=w_prev, learning_rate=self.learning_rate,
            exact=rec.status == "exact", rel_error=rec.rel_error)
        if bad is not None:
            self.stats[f"rejected_{bad.check}"] += 1
            self.stats["failed_rounds"] += 1
            rec.status = RoundStatus.FAILED
            rec.end_reason = EndReason.REJECTED
            rec.end_detail = f"rejected by {bad.check} check: {bad.reason}"
            return False
        assert new is not None
        self.guard.accept()
        self.model = new
        return True

    def _after_round(self, rec: RoundRecord, now: float) -> None:
        self._start_round(now)
        if self.phase is _P_JOINING:
            # no round started at once: tell the workers this one is over (when a round does
            # start, its round_start says so)
            self._broadcast(RoundEnd(epoch=self.epoch, round=rec.round, status=str(rec.status)),
                            ready_only=True)

    def _run_stage2(self) -> None:
        rec, grad, w_prev, w_new = self._stage2.pop(0)
        self._analysing = rec.round
        live = rec.round in self._oracle_hints
        hint = self._oracle_hints.pop(rec.round, None)
        try:
            if grad is not None:
                if self.verify_fn is not None and math.isnan(rec.rel_error):
                    rec.rel_error, rec.rel_error_plain = self._verify(grad, w_prev)
                rec.oracle_elapsed_s = hint if live else self._oracle(rec)
            if self.loss_fn is not None:
                rec.loss = float(self.loss_fn(w_new))
        finally:
            self._analysing = None
        rec.coverage_min = self._coverage_min(rec.state)
        self._events.append(RoundCompleted(rec))
        if not self._stage2:
            self._events.extend(self._deferred_events)
            self._deferred_events.clear()

    def _coverage_min(self, state: tuple[int, ...]) -> int:
        if not self.m:
            return 0
        cov = [0] * self.scheme.n_chunks
        for j, c in enumerate(state):
            for i in self._orders[j][:c]:
                cov[i] += 1
        return min(cov) if cov else 0

    def _decode(self, state: np.ndarray) -> Any:
        fast = getattr(self.scheme, "decode_trusted", None)
        if fast is not None:
            return fast(self._payload_rows, state, self.dim)
        return self.scheme.decode_result(self._payload_rows, state, self.dim)

    def _verify(self, grad: np.ndarray, w: np.ndarray) -> tuple[float, float]:
        """Decode error against the uncoded sum g = Σ_i g_i of this round's chunk gradients
        (at ``w``, the model the round computed on).

        Returns ``(scaled, plain)``: ``plain = ||ĝ - g|| / ||g||`` and
        ``scaled = ||ĝ - g|| / ||Σ_i |g_i| ||``. The second divides by the magnitude the
        floating-point sums work at (the classic summation-error scale): near an optimum the
        chunk gradients cancel, ``||g|| -> 0``, and ``plain`` then measures the problem's
        cancellation rather than the decoder. Both are recorded; summaries use ``scaled``.
        """
        assert self.verify_fn is not None
        G = np.asarray(self.verify_fn(w), dtype=np.float64)
        true = G.sum(axis=0)
        diff = grad - true
        absum = np.abs(G).sum(axis=0)
        # sqrt(x . x): what np.linalg.norm computes for a real vector, bit for bit, without
        # its ~2 us of argument handling (three norms per round)
        err = math.sqrt(diff.dot(diff))
        plain_den = math.sqrt(true.dot(true))
        scale_den = math.sqrt(absum.dot(absum))
        plain = err / plain_den if plain_den > 0 else err
        scaled = err / scale_den if scale_den > 0 else err
        return scaled, plain

    def _finish(self, reason: str, now: float) -> None:
        while self._stage1 is not None:
            self._run_stage1(lambda: now)
        self._set_phase(_P_FINISHED)
        self._round = None
        self._broadcast(Shutdown(reason=reason))
        for peer in list(self._worker_peer.values()):
            self._outbox.append(Outgoing(peer, None, close=True, reason="shutdown"))
        ev = Finished(len(self.records), reason, now)
        if self._stage2:
            self._deferred_events.append(ev)
        else:
            self._events.append(ev)

    def _oracle(self, rec: RoundRecord) -> float | None:
        """Earliest elapsed time (workers' own stamps) at which reported counts were decodable.

        Only reported counts are known, so this is exact when every chunk is reported
        (report_every = 1) and an upper bound otherwise. For the send-when-done schemes a
        worker's finish time is the ``compute_s`` its coded vector carries (the elapsed time of
        its last chunk on its own schedule). Computed post hoc, once per round, from the same
        coverage counters the trigger uses. (When the reports arrived in order of their stamps
        and no coverage was removed, the live counters already met this answer: the PS keeps
        it and does not call this; ``tests/test_core.py`` checks the two agree.)
        """
        if self._sends_when_done:
            # decodability only grows with the finished set: binary search over the workers
            # in order of their finish times
            fin = sorted((e, w) for w, e in rec.compute_s.items())
            order = [w for _, w in fin]
            if not fin or not self.scheme.is_decodable(self._finished_state(order)):
                return None
            lo, hi = 1, len(order)
            while lo < hi:
                mid = (lo + hi) // 2
                if self.scheme.is_decodable(self._finished_state(order[:mid])):
                    hi = mid
                else:
                    lo = mid + 1
            return float(fin[lo - 1][0])
        cover = self.scheme.progress_tracker()
        st = [0] * self.m
        for _, w, c, elapsed in sorted(rec.reports, key=itemgetter(3)):
            if c > st[w]:
                cover.add(w, st[w], c)
                st[w] = c
                if cover.deficit == 0:
                    return float(elapsed)
        return None
