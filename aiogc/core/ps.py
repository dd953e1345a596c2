"""The parameter server as a sans-IO state machine.

Invariants
----------
* No clock, no sockets, no global randomness: every input carries ``now`` (seconds, any
  monotonic origin) and nonces come from an injected ``nonce_fn``.
* The rules are data (:mod:`aiogc.core.ps_rules`): phases move only along ``TRANSITIONS``
  (through one ``_set_phase``), and what a frame from an authenticated worker does is
  ``RULES[phase][kind]`` (dropped and counted, a closed connection, or its handler).
* The state vector ``state`` only grows within an attempt (reports are monotone); a dropped
  worker's entry is zeroed and its later reports are ignored until the round ends.
* A coded vector is decoded only if it matches (epoch, round, attempt, state digest) of the
  current broadcast; everything older is counted and dropped, never decoded. A streamed chunk
  (``chunk_gradient``) counts only as its worker's next chunk in the round's order, and only
  the first copy of each chunk is decoded.
* The PS does no application work (:mod:`aiogc.core.ps_work`): when a round's last vector
  arrives it records ``t_end``, enters DECODING and hands its driver a ``DecodeRound``; the
  driver runs it (``aiogc.training.aggregator``) and answers with :meth:`work_done` at a
  *fresh* ``now``, at which the next round starts (so ``t_start(r+1) >= t_end(r)`` and the
  decode is not billed to the next round); only after that round_start was flushed does the
  ``AnalyseRound`` (verify / loss / oracle) come out. A gradient that is not finite is never
  applied: the round is recorded as failed.
* Decodability is incremental: per-chunk coverage counters and a deficit count, updated in
  O(δ) per report (trigger schemes).

The round machine lives in :mod:`aiogc.core.ps_rounds`; this module holds connections, the
handshake, timers and the driver contract.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from aiogc.coding.base import Scheme
from aiogc.config import RunConfig, scheme_digest
from aiogc.core.common import (
    AUTH_DEADLINE_S,
    INF,
    DuplicateWorker,
    Event,
    Outgoing,
    PeerClosed,
    WorkerEvicted,
    WorkerJoined,
    handles,
)
from aiogc.core.ps_rounds import RoundMachine, RoundSetup, _Peer
from aiogc.core.ps_rules import ALL, TRANSITIONS, PSPhase, accepts_of
from aiogc.core.ps_work import AnalyseRound, Decoded, DecodeRound, RoundWorker
from aiogc.core.round_policy import round_policy
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
    Welcome,
)

__all__ = [
    "MAX_PENDING_CONNECTIONS",
    "RULES",
    "TRANSITIONS",
    "_ACCEPTS",
    "AnalyseRound",
    "DecodeRound",
    "Decoded",
    "PSPhase",
    "ParameterServer",
    "pending_cap",
]

#: Floor of the cap on unauthenticated connections held at once (:func:`pending_cap` is
#: ``max(MAX_PENDING_CONNECTIONS, 2 * m)``): a connection flood must not starve
#: the workers. When they are all taken, a new connection evicts the *oldest* pending one (an
#: honest worker answers its challenge within milliseconds, so holding the slots takes a flood
#: faster than that, not a handful of idle sockets).
MAX_PENDING_CONNECTIONS = 64
#: Pings answered per worker: a bucket of PING_BURST tokens refilled at
#: max(PING_MIN_RATE, 4 / heartbeat_s) per second; pings beyond it are dropped unanswered
#: (``ping_dropped``), so a ping flood cannot make the PS queue pongs without bound.
PING_BURST = 20.0
#: Seconds after a stall of the PS (:meth:`ParameterServer.stalled`) during which a lost
#: worker is the stall's doing: its EOF or reset, sent while the PS was silent, is read then.
PS_STALL_GRACE_S = 1.0
PING_MIN_RATE = 10.0


def pending_cap(m: int) -> int:
    """Unauthenticated connections a PS of ``m`` workers holds at once: every worker of the
    run may be mid-handshake together (m workers on one host connect in one burst, and that
    host answers the m challenges more slowly than they are sent), plus as many again of
    margin for a flood or reconnects. A fixed 64 made 1024 workers of one host evict each
    other and back off for seconds; a flood still cannot hold more than 2m slots."""
    return max(MAX_PENDING_CONNECTIONS, 2 * m)


@dataclass(frozen=True)
class PSOptions:
    """The :class:`ParameterServer`'s handshake deadline, spare wait and nonce source.

    Attributes
    ----------
    auth_deadline_s : float, optional
        Seconds a new connection has to complete the handshake (None:
        :data:`~aiogc.core.common.AUTH_DEADLINE_S`).
    spare_wait : float
        Send-when-done schemes (original): once the received vectors decode, wait up to
        ``spare_wait`` times the round's elapsed time so far (never past the round timeout or
        the approximate deadline) for one more vector, so that the redundancy check has a
        spare to cross-check with. 0 (default): decode at once.
    nonce_fn : callable, optional
        Fresh 16-byte nonces; drivers install one (``secrets.token_bytes``) when None.
    spares : int
        How many spare vectors that wait is for (default 1; 2 lets the aggregator locate one
        inconsistent worker, :mod:`aiogc.training.locate`).
    """

    auth_deadline_s: float | None = None
    spare_wait: float = 0.0
    nonce_fn: Any | None = None
    spares: int = 1


DEFAULT_PS_OPTIONS: Final = PSOptions()


class ParameterServer(RoundMachine):
    """Parameter server core: joins workers, runs rounds, triggers, hands out the decodes.

    Parameters
    ----------
    config : RunConfig
    model : ndarray, shape (d,)
        Initial model.
    aggregator : RoundWorker, optional
        What the driver runs this PS's work items with (``aggregator.run(item)``, see
        :mod:`aiogc.core.ps_work`); the PS itself calls only its ``screen``, the check of
        every coded vector before it is accepted (without an aggregator every vector is
        accepted). ``harness.kit.make_ps`` builds an
        :class:`aiogc.training.aggregator.Aggregator`.
    scheme : Scheme, optional
        Default: ``config.build_scheme()``.
    schedule : DelaySchedule-like, optional
        Provides ``compute_s[r, j, :]`` and ``network_s[r, j]`` sent to workers in round_start.
    secret : bytes, optional
        Master secret S; worker j authenticates with k_j = derive_worker_key(S, j). Without
        one, MACs are empty and not checked and frames carry no tags (loopback only).
    epoch : int
        This PS incarnation; messages of other epochs are stale.
    options : PSOptions, optional
        Handshake deadline, spare wait and nonce source (defaults: as for a real run;
        the fields are described in :class:`PSOptions`).
    """

    def __init__(
        self,
        config: RunConfig,
        *,
        model: np.ndarray,
        aggregator: RoundWorker | None = None,
        scheme: Scheme | None = None,
        schedule: Any | None = None,
        secret: bytes | None = None,
        epoch: int = 0,
        options: PSOptions = DEFAULT_PS_OPTIONS,
    ) -> None:
        nonce_fn = options.nonce_fn
        auth_deadline_s = (AUTH_DEADLINE_S if options.auth_deadline_s is None
                           else options.auth_deadline_s)
        scheme = scheme if scheme is not None else config.build_scheme()
        policy = round_policy(scheme, spare_wait=options.spare_wait, spares=options.spares)
        super().__init__(RoundSetup(config, scheme, model, schedule, epoch, policy,
                                    aggregator.screen if aggregator is not None else None))
        #: evicted workers -> why (their key is refused for the rest of the run)
        self.evicted: dict[int, str] = {}
        self.aggregator = aggregator
        self.secret = secret
        self.nonce_fn = nonce_fn
        if not 0 < auth_deadline_s <= 3600:
            raise ConfigError("auth_deadline_s", auth_deadline_s, "a number in (0, 3600]")
        self.auth_deadline_s = float(auth_deadline_s)
        self._digest = scheme_digest(scheme)
        self._welcome_config = {**config.to_wire(), "scheme_digest": self._digest}
        self._config_hash = config_hash(self._welcome_config)
        self._worker_keys: dict[int, bytes] = {}
        self._ping_bucket: dict[int, tuple[float, float]] = {}
        self._last_heard: dict[int, float] = {}
        self._pending: dict[Hashable, float] = {}  # unauthenticated peer -> auth deadline
        self._sweep_at: float | None = None  # next liveness sweep
        #: True while start(join_clock=False) waits for the launcher's start(join_clock=True)
        self._join_clock_deferred = False

    # ================================================================== driver contract

    def start(self, *, now: float, join_clock: bool = True) -> None:
        """The PS is listening: the join deadline runs from here, not from the first
        connection (a PS nobody connects to ends with a reason instead of waiting forever).

        ``join_clock=False``: whoever launches the workers calls ``start(now=...)`` again once
        they exist (the Ray backend when every actor registered, a test after starting its
        processes), so the first join deadline never races how fast a process starts on a
        loaded machine. Until then round 0 waits for all m workers. A later call with
        ``join_clock=True`` starts the deferred join deadline (a no-op when the clock already
        runs or round 0 has started).
        """
        self._join_clock_deferred = not join_clock
        if join_clock:
            self._arm_join_deadline(now)

    def _arm_join_deadline(self, now: float) -> None:
        if (self._join_deadline is None and self.phase is PSPhase.JOINING
                and not self._join_clock_deferred):
            self._join_deadline = now + self.config.join_timeout_s

    def connection_made(self, peer: Hashable, *, now: float) -> None:
        """A new connection: send it a challenge; it has ``auth_deadline_s`` to answer."""
        if len(self._pending) >= pending_cap(self.m):
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
                # RULES[phase][kind]: the handler table of the current phase (_set_phase)
                handler = self._handlers.get(msg.kind)
                if handler is None:
                    raise RemoteProtocolError(f"{msg.kind} from a worker is not allowed",
                                              code="bad_kind")
                handler(worker, peer, msg, now)
        except RemoteProtocolError as exc:
            self._close(peer, exc.code, exc.reason, now)

    def handle_timer(self, *, now: float, stalled_s: float = 0.0) -> None:
        """Process every deadline that is due at ``now``.

        ``stalled_s``: the driver saw this process not run for that long just before ``now``
        (SIGSTOP, a long GC or decode, a blocked loop), so the workers' silence during it is
        the PS's. Their liveness clocks move forward by the stall. If the stall was long
        enough to make workers give up on the PS, a worker lost in the next
        :data:`PS_STALL_GRACE_S` (a connection it closed because the PS went silent) is
        dropped as ``ps_stall``; a round that fails for it ends as ``EndReason.PS_STALL``.
        """
        if stalled_s > 0:
            self._note_stall(stalled_s, now)
        if self._pending:
            self._expire_pending(now)
        dead_after = self.config.dead_after_s
        if dead_after is not None and self._sweep_at is not None and now >= self._sweep_at:
            self._sweep_liveness(now, dead_after)
        if self.phase is PSPhase.JOINING:
            if self._join_deadline is not None and now >= self._join_deadline:
                self._on_join_deadline(now)
            return
        rs = self._round  # None outside COMPUTING and COLLECTING
        if rs is not None:
            self._round_deadlines(rs, now)

    def _note_stall(self, seconds: float, now: float) -> None:
        self.stats["ps_stalls"] += 1
        if self._stall_can_lose_workers(seconds):
            self._stall_s = max(self._stall_s, seconds) if now < self._stall_until else seconds
            self._stall_until = now + PS_STALL_GRACE_S
        for w, t in self._last_heard.items():
            self._last_heard[w] = min(now, t + seconds)
        if self._sweep_at is not None:
            self._sweep_at = max(self._sweep_at, now)

    def _stall_can_lose_workers(self, seconds: float) -> bool:
        """Whether a stall of ``seconds`` can have made honest workers give up on the PS.

        A worker closes its connection after ``dead_after_s`` without a frame from the PS
        (the welcome's config). Before the stall it had heard the PS at most about one
        ``heartbeat_s`` earlier (its ping's pong), so a stall shorter than ``dead_after_s``
        less two heartbeats cannot have made it leave: a loss then (a killed process's reset)
        is the worker's own. Without liveness no worker ever gives up on the PS.
        """
        dead_after = self.config.dead_after_s
        if dead_after is None:
            return False
        return seconds + 2 * (self.config.heartbeat_s or 0.0) >= dead_after

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

    def session_keys(self, peer: Hashable) -> SessionKeys | None:
        """GMAC keys of ``peer``'s session (set once it authenticated with a secret)."""
        info = self._peers.get(peer)
        return None if info is None else info.keys

    def next_deadline(self) -> float | None:
        """The earliest time at which ``handle_timer`` has something to do, or None."""
        # called after every pump: plain comparisons, no list and no min() over one; the
        # round's deadlines were computed when it started
        best = min(self._pending.values()) if self._pending else INF
        sweep = self._sweep_at
        if sweep is not None and sweep < best and self.config.dead_after_s is not None:
            best = sweep
        rs = self._round  # None outside COMPUTING and COLLECTING
        if rs is not None:
            t = rs.timeout_at
            if t < best:
                best = t
            if self.phase is PSPhase.COLLECTING:
                if rs.collect_deadline is not None and rs.collect_deadline < best:
                    best = rs.collect_deadline
            else:
                if rs.approx_at < best:
                    best = rs.approx_at
                if rs.spare_at < best:
                    best = rs.spare_at
        elif (self.phase is PSPhase.JOINING and self._join_deadline is not None
              and self._join_deadline < best):
            best = self._join_deadline
        return None if best == INF else best

    def poll(self) -> tuple[Sequence[Outgoing], Sequence[Event] | None, float | None]:
        """One driver call per pump instead of four: ``(outgoing, events, deadline)``.

        Drains the outbox; then, when :meth:`next_work` has an item, returns
        ``(outgoing, None, None)`` (the driver flushes, runs the item, answers with
        :meth:`work_done` and polls again); otherwise also drains the events and returns
        :meth:`next_deadline`. Same order and results as ``messages_to_send``, then (when
        ``next_work`` is None) ``next_event`` until None and ``next_deadline``.
        """
        out, self._outbox = self._outbox, []
        if self._decode_item is not None or self._analyses:
            return out, None, None
        events, self._events = self._events, []
        return out, events, self.next_deadline()

    # ================================================================== public helpers

    def awaits(self, peer: Hashable) -> int | None:
        """The worker whose coded vector ``peer`` may deliver now, or None: a driver receives
        that vector straight into the worker's row (``CodedRows.row``, zero-copy); anything
        else it allocates for, and the core rejects or drops it itself, with the reason."""
        info = self._peers.get(peer)
        rs = self._round
        if info is None or info.worker is None or rs is None:
            return None
        w = info.worker
        # only a vector we are waiting for may land in the row: a duplicate or stale one must
        # not overwrite an accepted vector
        if w in rs.received or w in rs.excluded:
            return None
        return w if self._policy.awaits(self, rs, w) else None

    def worker_of(self, peer: Hashable) -> int | None:
        """The worker id ``peer`` authenticated as, or None."""
        info = self._peers.get(peer)
        return None if info is None else info.worker

    def stop(self, reason: str, *, now: float) -> None:
        """Abort the run (e.g. SIGTERM): tell the workers and finish."""
        if self.phase is not PSPhase.FINISHED:
            self._finish(reason, now)

    def _evict_workers(self, workers: tuple[int, ...], round_: int, now: float) -> None:
        for w in workers:
            if w in self.evicted:
                continue
            why = f"its vectors were located as inconsistent (round {round_})"
            self.evicted[w] = why
            self.stats["evicted"] += 1
            self._events.append(WorkerEvicted(w, round_, why, now))
            peer = self._worker_peer.get(w)
            if peer is not None:
                self._close(peer, "evicted", why, now)

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
        if msg.worker in self.evicted:  # its key is refused for the run
            raise RemoteProtocolError(f"worker {msg.worker} was evicted: "
                                      f"{self.evicted[msg.worker]}", code="evicted")
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

    def _ping_allowed(self, worker: int, now: float) -> bool:
        tokens, last = self._ping_bucket.get(worker, (PING_BURST, now))
        hb = self.config.heartbeat_s
        rate = max(PING_MIN_RATE, 4.0 / hb) if hb else PING_MIN_RATE
        tokens = min(PING_BURST, tokens + (now - last) * rate)
        ok = tokens >= 1.0
        self._ping_bucket[worker] = (tokens - 1.0 if ok else tokens, now)
        return ok

    # ------------------------------------------------------------------ handlers (RULES)

    @handles("hello", ALL)
    def _on_second_hello(self, worker: int, peer: Hashable, msg: Message, now: float) -> None:
        raise RemoteProtocolError("a second hello is not allowed", code="bad_kind")

    @handles("ready", ALL - {PSPhase.JOINING})
    def _on_ready(self, worker: int, peer: Hashable, msg: Ready, now: float) -> None:
        """The worker built its task: it takes part in the next round that starts."""
        if msg.epoch != self.epoch:
            raise RemoteProtocolError(f"ready for epoch {msg.epoch}", code="stale_epoch")
        self._peers[peer].ready = True

    @handles("ready", {PSPhase.JOINING})  # ready may start a round
    def _on_ready_and_start(self, worker: int, peer: Hashable, msg: Ready, now: float) -> None:
        """JOINING: a ready worker may complete the set the next round waits for."""
        self._on_ready(worker, peer, msg, now)
        if self._can_start(self._round_no + 1):
            self._start_round(now)

    @handles("ping", ALL)
    def _on_ping(self, worker: int, peer: Hashable, msg: Ping, now: float) -> None:
        if self._ping_allowed(worker, now):
            self._send(peer, Pong(seq=msg.seq))
        else:
            self.stats["ping_dropped"] += 1

    @handles("pong", ALL)
    def _on_ignore(self, worker: int, peer: Hashable, msg: Message, now: float) -> None:
        """A pong: the worker is alive (``_last_heard`` was set on receipt); nothing else."""

    @handles("bye", ALL)
    @handles("error", ALL)
    def _on_bye(self, worker: int, peer: Hashable, msg: Message, now: float) -> None:
        self.stats[f"peer_{msg.kind}"] += 1
        reason = getattr(msg, "reason", "")
        if getattr(msg, "code", None) == "task_failed":  # its task raised: named, per worker
            self._close(peer, "task_failed", f"worker {worker}: {reason}", now)
            return
        self._close(peer, "bye", reason, now)


#: phase -> kind -> handler name (``ParameterServer._on_<name>``), from the handlers' rows
RULES: Final = ParameterServer._RULES
#: kind -> phases in which an authenticated worker's frame of that kind is acted on
_ACCEPTS: Final = accepts_of(RULES)
