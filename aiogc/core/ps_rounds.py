"""The parameter server's round machine: start, trigger, collect, drop, end, hand out work.

:class:`RoundMachine` is the half of :class:`~aiogc.core.ParameterServer` that runs rounds
(the other half, :mod:`aiogc.core.ps`, runs connections, the handshake and the driver
contract). It holds the peers registry both halves read, moves phases only through
:meth:`RoundMachine._set_phase` (along :data:`aiogc.core.ps_rules.TRANSITIONS`), and does no
numerical work: a round's end queues a :class:`~aiogc.core.ps_work.DecodeRound` for the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from aiogc.coding.adaptive import flatten_orders, policy_for
from aiogc.coding.base import ProgressTracker, Scheme
from aiogc.config import RunConfig
from aiogc.core.common import (
    INF,
    Endpoint,
    Event,
    Finished,
    Outgoing,
    RoundCompleted,
    RoundRecord,
    RoundResumed,
    RoundStarted,
    Triggered,
    WorkerDropped,
    fast_new,
    handles,
)
from aiogc.core.ps_rules import IN_ROUND, TRANSITIONS, PSPhase, rules_of
from aiogc.core.ps_work import AnalyseRound, Decoded, DecodeRound
from aiogc.core.round_policy import RoundPolicy
from aiogc.errors import LocalProtocolError, RemoteProtocolError
from aiogc.protocol.auth import SessionKeys
from aiogc.protocol.messages import (
    ChunkGradient,
    ChunkReport,
    CodedGradient,
    EncodeAndTransmit,
    Message,
    Resume,
    RoundEnd,
    RoundStart,
    Shutdown,
    state_digest,
)
from aiogc.protocol.status import EndReason, RoundStatus

# Unvalidated constructors of what the PS builds itself, m per round each. Measured with
# bench/run.py --only core_us_per_worker_round (m=64; medians of 7 interleaved runs on the
# shared 2-core machine): 24.2 us with fast_new, 25.7 us with Outgoing(...) and
# Message.trusted instead. The other idioms the PS once had showed nothing and are gone:
# phase members copied into module globals 23.8 us (vs 24.2, within the runs' spread), a
# shared empty tuple for an empty poll 23.9 us vs 24.0 us without it.
_new_out = fast_new(Outgoing)
_new_round_start = fast_new(RoundStart)
_new_encode = fast_new(EncodeAndTransmit)


_INF_T = float("inf")

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
    #: ``record.round`` and ``record.reports`` (fixed for the round; read on every report)
    round: int = -1
    reports: list[tuple[float, int, int, float]] = field(default_factory=list)
    cover: ProgressTracker | None = None  # trigger schemes only: the scheme's rule
    approx: bool = False  # an approximate trigger is pending (not a public status)
    finished: np.ndarray | None = None  # send-when-done: (m,) loads of the received workers
    attempt: int = 0
    broadcast: tuple[int, ...] | None = None
    digest: bytes = b""
    expected: set[int] = field(default_factory=set)  # workers whose vector we wait for
    received: dict[int, CodedGradient] = field(default_factory=dict)  # accepted vectors
    #: streaming schemes: chunk -> the first frame that carried it (later copies dropped)
    chunks: dict[int, ChunkGradient] = field(default_factory=dict)
    excluded: set[int] = field(default_factory=set)
    collect_deadline: float | None = None
    #: t_start + round_timeout_s, and t_start + deadline_s in approx mode (inf if none):
    #: next_deadline reads them after every pump
    timeout_at: float = float("inf")
    approx_at: float = float("inf")
    #: send-when-done with a spare wait: when the round decodes without a spare (inf: not
    #: waiting; see ParameterServer's ``spare_wait``)
    spare_at: float = float("inf")
    #: vectors received at which the spare wait ends (the trigger's count plus ``spares``)
    spare_need: int = 0
    #: the oracle from the live counters: the elapsed stamp of the report at which the
    #: coverage deficit first reached 0; valid while the accepted reports arrived in order of
    #: their stamps and no worker's coverage was removed (else the aggregator recomputes it)
    oracle_at: float | None = None
    last_elapsed: float = float("-inf")
    oracle_live: bool = True


@dataclass(frozen=True)
class RoundSetup:
    """What the round machine runs on (the run's constants, fixed at construction)."""

    config: RunConfig
    scheme: Scheme
    model: np.ndarray  # (d,) the initial model
    schedule: Any | None  # DelaySchedule-like: compute_s[r, j, :] and network_s[r, j]
    epoch: int
    #: how rounds collect their vectors (:func:`~aiogc.core.round_policy.round_policy`)
    policy: RoundPolicy
    #: ``screen(msg) -> (reason, detail) | None``: why a coded vector cannot be used (the
    #: aggregator side's check, ``CodedRows.screen``); None accepts every vector
    screen: Callable[[CodedGradient | ChunkGradient], tuple[str, str] | None] | None = None


#: The drop reason of a worker lost while the PS caught up with its own stall.
PS_STALL_DROP = "ps_stall"


class RoundMachine(Endpoint):
    """Rounds of the parameter server (see the module docstring)."""

    phase: PSPhase = PSPhase.JOINING  # class default: only _set_phase assigns the attribute

    #: phase -> kind -> handler name: the rows its handlers declare (``@handles``), built once
    #: per class by :func:`~aiogc.core.ps_rules.rules_of` (read-only)
    _RULES: ClassVar[Mapping[PSPhase, Mapping[str, str]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._RULES = rules_of(cls)

    def __init__(self, setup: RoundSetup) -> None:
        super().__init__()
        config, scheme = setup.config, setup.scheme
        self.config = config
        self.scheme = scheme
        self.m: int = scheme.m
        self.model = np.array(setup.model, dtype=np.float64, copy=True)
        self.dim = int(self.model.shape[0])
        self._screen = setup.screen
        self.schedule = setup.schedule
        self.epoch = setup.epoch
        self._loads = np.asarray(scheme.loads, dtype=np.int64)
        self._loads_list: list[int] = [int(x) for x in self._loads]
        self._policy = setup.policy
        #: ordering="adaptive": the speed-aware order policy (coding/adaptive.py); the round's
        #: orders (flattened, sent in its round_start) and the scheme with them
        self._order_policy = policy_for(scheme, config.ordering)
        self._round_orders: tuple[int, ...] = ()
        self._round_scheme: Scheme = scheme
        self._all_decodable: bool | None = None  # is_decodable with every worker finished
        #: round -> the oracle the live counters found (see _RoundState.oracle_at)
        self._oracle_hints: dict[int, float | None] = {}
        # work for the driver: at most one decode, then the analyses in round order
        self._decode_item: DecodeRound | None = None
        self._analyses: list[AnalyseRound] = []
        #: events held back until the analyses before them are done (RoundStarted, Finished)
        self._deferred_events: list[Event] = []
        #: losses before this time happened while the PS caught up with a stall of its own
        #: (:meth:`ParameterServer.stalled`): they are the PS's, not the workers'
        self._stall_until = -INF
        self._stall_s = 0.0
        self._peers: dict[Hashable, _Peer] = {}
        self._worker_peer: dict[int, Hashable] = {}
        self._round: _RoundState | None = None
        self._round_no = -1
        self._join_deadline: float | None = None
        self.records: list[RoundRecord] = []
        #: phase -> kind -> bound handler (RULES with the names resolved once)
        self._rules: dict[PSPhase, dict[str, Callable[..., None]]] = {
            ph: {kind: getattr(self, "_on_" + name) for kind, name in self._RULES[ph].items()}
            for ph in PSPhase}
        self._handlers = self._rules[PSPhase.JOINING]

    # ------------------------------------------------------------------ phases and output

    def _set_phase(self, new: PSPhase) -> None:
        """The one place the phase changes: along TRANSITIONS, else LocalProtocolError
        (raised before anything changes; callers change the phase before anything else)."""
        if new not in TRANSITIONS[self.phase]:
            raise LocalProtocolError(f"illegal PS transition {self.phase.value} -> {new.value}")
        self.phase = new
        self._handlers = self._rules[new]

    def _send(self, peer: Hashable, msg: Message) -> None:
        self._outbox.append(_new_out(peer, msg, False, ""))

    def _broadcast(self, msg: Message, *, ready_only: bool = False) -> None:
        """Queue ``msg`` for every authenticated worker (``ready_only``: only those that said
        ``ready``: a worker still building its task is in no round, and round messages would
        only make it fail the connection)."""
        peers = self._peers
        append = self._outbox.append
        for peer in self._worker_peer.values():
            if not ready_only or peers[peer].ready:
                append(_new_out(peer, msg, False, ""))

    def _ready_workers(self) -> dict[int, Hashable]:
        """Authenticated workers that said ``ready`` (they take part in the next round)."""
        return {w: p for w, p in self._worker_peer.items() if self._peers[p].ready}

    def _emit_after_analyses(self, ev: Event) -> None:
        """Queue ``ev``, after the RoundCompleted events of the rounds still being analysed."""
        if self._analyses or self._decode_item is not None:
            self._deferred_events.append(ev)
        else:
            self._events.append(ev)

    # ------------------------------------------------------------------ starting rounds

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

    def _start_round(self, now: float, *, force: bool = False) -> PSPhase:
        """Start the next round, or wait for workers, or finish; returns the phase entered."""
        r = self._round_no + 1
        if r >= self.config.rounds:
            self._round_no = r
            self._finish("all rounds done", now)
            return PSPhase.FINISHED
        ready = self._ready_workers()
        if not force and not self._can_start(r, ready):
            # only reached when a round just ended: wait (join_timeout_s) for enough workers
            self._set_phase(PSPhase.JOINING)
            self._join_deadline = now + self.config.join_timeout_s
            return PSPhase.JOINING
        self._set_phase(PSPhase.COMPUTING)
        self._round_no = r
        rec = RoundRecord(round=r, scheme=self.scheme.name, t_start=now)
        if self._order_policy is not None:
            orders = self._order_policy.orders()
            # the static order goes without `orders`: the static ordering's round_start frame,
            # and workers and aggregator stay on their static path
            static = orders is self._order_policy.base
            sch = self.scheme if static else self.scheme.with_orders(orders)
            assert sch is not None  # policy_for checked the capability
            self._round_scheme = sch
            self._round_orders = () if static else flatten_orders(orders)
        cover = self._policy.tracker(self._round_scheme)
        cfg = self.config
        rs = self._round = _RoundState(
            record=rec, state=[0] * self.m, round=r, reports=rec.reports, cover=cover,
            timeout_at=now + cfg.round_timeout_s,
            approx_at=(now + cfg.deadline_s if cfg.mode == "approx" and cfg.deadline_s is not None
                       else INF))
        self._send_round_start(r, ready)
        # workers not connected and ready now cannot take part in this round
        if len(ready) < self.m:
            rs.excluded.update(w for w in range(self.m) if w not in ready)
        self._emit_after_analyses(RoundStarted(r, now))
        return PSPhase.COMPUTING

    def _send_round_start(self, r: int, ready: dict[int, Hashable]) -> None:
        # a copy: the transport may still read it after we update self.model
        model = self.model.astype(self.config.dtype, copy=True)
        orders = self._round_orders  # () unless ordering="adaptive"
        sched = self.schedule
        append = self._outbox.append
        if sched is not None and r < sched.compute_s.shape[0]:
            # one tolist() per round rather than numpy slicing and scalars per worker
            comp = sched.compute_s[r].tolist()
            net_row = sched.network_s[r].tolist()
            loads = self._loads_list
            epoch = self.epoch
            for worker, peer in sorted(ready.items()):
                append(_new_out(peer, _new_round_start(
                    epoch, r, tuple(comp[worker][:loads[worker]]), float(net_row[worker]),
                    model, orders), False, ""))
        else:
            # one message object for everyone: the driver encodes it once
            msg = _new_round_start(self.epoch, r, (), 0.0, model, orders)
            for _worker, peer in sorted(ready.items()):
                append(_new_out(peer, msg, False, ""))

    # ------------------------------------------------------------------ reports and vectors

    def _current(self, epoch: int, rnd: int, kind: str) -> _RoundState | None:
        """The running round if (epoch, round) match it; else count and return None.
        (Only reached in a round phase: RULES sends these kinds to ``_on_stale`` otherwise.)"""
        rs = self._round
        if epoch != self.epoch:
            self.stats[f"stale_epoch_{kind}"] += 1
            return None
        assert rs is not None
        if rnd != rs.round:
            if rnd > rs.round:
                raise RemoteProtocolError(f"{kind} for future round {rnd}", code="future_round")
            self.stats[f"stale_round_{kind}"] += 1
            return None
        return rs

    def _on_stale(self, worker: int, peer: Hashable, msg: Any, now: float) -> None:
        """A round's frame between rounds: counted and dropped, whatever it holds."""
        kind = msg.kind
        self.stats[("stale_epoch_" if msg.epoch != self.epoch else "stale_round_") + kind] += 1

    @handles("chunk_report", IN_ROUND, otherwise="stale")
    def _on_report(self, worker: int, peer: Hashable, msg: ChunkReport, now: float) -> None:
        rs = self._round
        assert rs is not None  # RULES: only in COMPUTING and COLLECTING
        if msg.round != rs.round or msg.epoch != self.epoch:
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
                rs.oracle_live = False  # out of stamp order: the aggregator re-sorts
            rs.last_elapsed = elapsed
            if cover.deficit == 0:
                if rs.oracle_at is None:
                    rs.oracle_at = float(elapsed)
                if self.phase is PSPhase.COMPUTING:
                    self._trigger(now, exact=True)

    @handles("coded_gradient", IN_ROUND, otherwise="stale")
    def _on_coded(self, worker: int, peer: Hashable, msg: CodedGradient, now: float) -> None:
        rs = self._round
        assert rs is not None  # RULES: only in COMPUTING and COLLECTING
        if msg.round != rs.round or msg.epoch != self.epoch:
            rs = self._current(msg.epoch, msg.round, "coded_gradient")  # counts, or raises
        if rs is None or not self._awaited(rs, worker, msg):
            return
        if not self._screened_out(rs, worker, msg, now):
            self._accept_coded(rs, worker, msg, now)

    @handles("chunk_gradient", IN_ROUND, otherwise="stale")
    def _on_chunk(self, worker: int, peer: Hashable, msg: ChunkGradient, now: float) -> None:
        """A streamed chunk: the worker's next chunk in its order; the first copy is kept."""
        rs = self._round
        assert rs is not None  # RULES: only in COMPUTING and COLLECTING
        if not self._policy.streams:
            raise RemoteProtocolError("chunk_gradient in a run that does not stream",
                                      code="bad_kind")
        if msg.round != rs.round or msg.epoch != self.epoch:
            rs = self._current(msg.epoch, msg.round, "chunk_gradient")  # counts, or raises
            if rs is None:
                return
        if worker in rs.excluded:
            self.stats["chunk_from_excluded"] += 1
            return
        k = rs.state[worker]
        order = self._round_scheme.orders[worker]
        if k >= len(order) or msg.chunk != order[k]:
            raise RemoteProtocolError(
                f"chunk {msg.chunk} is not worker {worker}'s next chunk (position {k})",
                code="bad_chunk")
        if self._screened_out(rs, worker, msg, now):
            return
        rs.state[worker] = k + 1
        rs.reports.append((now, worker, k + 1, msg.elapsed_s))
        rs.record.arrivals[worker] = now
        rs.record.compute_s[worker] = msg.compute_s
        if msg.chunk in rs.chunks:
            self.stats["duplicate_chunk"] += 1
            return
        rs.chunks[msg.chunk] = msg
        self._policy.chunk_accepted(self, rs, now)

    def _screened_out(self, rs: _RoundState, worker: int, msg: CodedGradient | ChunkGradient,
                      now: float) -> bool:
        """Is the frame unusable (``RoundSetup.screen``)? A bad vector or chunk is a rejected
        contribution, not a closed connection: the worker is dropped and counts as a
        straggler this round."""
        problem = self._screen(msg) if self._screen is not None else None
        if problem is None:
            return False
        reason, detail = problem
        self.stats[reason] += 1
        rs.record.dropped[worker] = f"{reason}: {detail}"
        self._drop_workers([worker], reason, now)
        return True

    def _awaited(self, rs: _RoundState, worker: int, msg: CodedGradient) -> bool:
        """Is this a vector we are waiting for? (stale ones are dropped whatever they hold)"""
        if worker in rs.excluded or worker in rs.received:
            self.stats["late_or_duplicate_coded"] += 1
            return False
        refused = self._policy.refusal(self, rs, worker, msg)
        if refused is not None:
            self.stats[refused] += 1
            return False
        return True

    def _accept_coded(self, rs: _RoundState, worker: int, msg: CodedGradient, now: float
                      ) -> None:
        rs.received[worker] = msg
        rs.record.arrivals[worker] = now
        rs.record.compute_s[worker] = msg.compute_s
        self._policy.vector_accepted(self, rs, worker, now)

    def _evict_workers(self, workers: tuple[int, ...], round_: int, now: float) -> None:
        """Close ``workers`` and refuse their keys (ParameterServer)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ trigger and drops

    def _trigger(self, now: float, *, exact: bool) -> None:
        """Broadcast encode_and_transmit with the current state (a new attempt if repeated)."""
        rs = self._round
        assert rs is not None
        self._set_phase(PSPhase.COLLECTING)
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
        self._broadcast(_new_encode(self.epoch, rs.round, rs.attempt, state), ready_only=True)
        self._events.append(Triggered(rs.round, rs.attempt, state, now, exact))
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
        if rs is None:  # between rounds: the next round starts without them
            return
        lost_expected = False
        if now < self._stall_until:
            reason = PS_STALL_DROP
        for worker in workers:
            if worker in rs.excluded:
                continue
            rs.excluded.add(worker)
            rs.record.dropped.setdefault(worker, reason)
            self._events.append(WorkerDropped(worker, rs.round, reason, now))
            self.stats["dropped"] += 1
            if not self._policy.broadcasts:
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
            stall = sorted(w for w in rs.excluded if rs.record.dropped.get(w) == PS_STALL_DROP)
            if stall:
                self._end_round_failed(now, EndReason.PS_STALL, (
                    f"cannot decode: the PS stalled for {self._stall_s:.1f} s and lost "
                    f"workers {stall} meanwhile"))
            else:
                self._end_round_failed(now, EndReason.WORKERS_GONE,
                                       f"cannot decode: workers {sorted(rs.excluded)} gone")
        elif self.phase is PSPhase.COLLECTING and lost_expected:
            self._after_lost_vector(rs, now)

    def _after_lost_vector(self, rs: _RoundState, now: float) -> None:
        """A vector we waited for will not come: re-trigger, decode what there is, or resume."""
        assert rs.cover is not None
        if rs.cover.deficit == 0:
            self._trigger(now, exact=True)
        elif rs.approx:
            if any(rs.state):
                self._trigger(now, exact=False)
            else:
                self._end_round_failed(now, EndReason.NOTHING_COMPUTED, "nothing computed")
        else:
            self._set_phase(PSPhase.COMPUTING)
            rs.attempt += 1
            rs.broadcast = None
            rs.expected = set()
            rs.received = {}
            rs.collect_deadline = None
            self._broadcast(Resume(epoch=self.epoch, round=rs.round, attempt=rs.attempt),
                            ready_only=True)
            self._events.append(RoundResumed(rs.round, rs.attempt, now))
            # rs.broadcast is None again, so the next trigger keeps this attempt number
            # (the resume itself consumed one)

    def _hopeless(self, rs: _RoundState) -> bool:
        """Exact mode, and the round cannot decode even if every worker still in it finishes."""
        if self.config.mode != "exact":
            return False
        alive = (set(range(self.m)) - rs.excluded) | set(rs.received)
        state = self._finished_state(alive)
        if self._policy.streams:  # the chunks a dropped worker streamed still count
            state = np.maximum(state, rs.state)
        return not self.scheme.is_decodable(state)

    # ------------------------------------------------------------------ round deadlines

    def _round_deadlines(self, rs: _RoundState, now: float) -> None:
        """The running round's timers: round timeout, collect timeout, approx deadline."""
        rec = rs.record
        if now >= rs.spare_at:
            self._end_round(now, exact=True, reason="decodable")  # no spare in time
            return
        if now >= rec.t_start + self.config.round_timeout_s:
            self._on_round_timeout(now)
            return
        if (
            self.phase is PSPhase.COLLECTING
            and rs.collect_deadline is not None
            and now >= rs.collect_deadline
        ):
            self._drop_workers(sorted(rs.expected - set(rs.received)), "collect_timeout", now)
            return
        if (
            self.phase is PSPhase.COMPUTING
            and self.config.mode == "approx"
            and self.config.deadline_s is not None
            and now >= rec.t_start + self.config.deadline_s
        ):
            self._on_approx_deadline(now)

    def _on_approx_deadline(self, now: float) -> None:
        rs = self._round
        assert rs is not None
        self._policy.approx_deadline(self, rs, now)

    def _on_round_timeout(self, now: float) -> None:
        rs = self._round
        assert rs is not None
        self._policy.round_timeout(self, rs, now)

    # ------------------------------------------------------------------ end of a round

    def _end_round(self, now: float, *, exact: bool, reason: str) -> None:
        """The round's last needed vector arrived at ``now``: queue decode and next round."""
        self._close_round(now, exact=exact, reason=reason, decode=True)

    def _end_round_failed(self, now: float, reason: EndReason, detail: str) -> None:
        rs = self._round
        assert rs is not None
        self._set_phase(PSPhase.DECODING)
        rs.record.status = RoundStatus.FAILED
        rs.record.end_reason, rs.record.end_detail = reason, detail
        self.stats["failed_rounds"] += 1
        self._close_round(now, exact=False, reason=reason, decode=False)

    def _close_round(self, now: float, *, exact: bool, reason: str, decode: bool) -> None:
        rs = self._round
        assert rs is not None
        if self.phase is not PSPhase.DECODING:
            self._set_phase(PSPhase.DECODING)
        rec = rs.record
        rec.t_end = now
        if decode:
            state = self._policy.decode_state(self, rs)
        else:
            state = np.asarray(rs.state, dtype=np.int64)
        rec.state = tuple(state.tolist())  # Python ints, one call rather than m int()s
        if rs.oracle_live and rs.cover is not None:
            self._oracle_hints[rec.round] = rs.oracle_at
        if self._order_policy is not None:
            t_stop = rec.t_trigger if rec.t_trigger is not None else now
            self._order_policy.observe(rec.reports, rec.t_start, t_stop,
                                       set(range(self.m)) - rs.excluded)
        self._round = None
        self._decode_item = DecodeRound(rec, exact, str(reason), decode, state, rs.attempt,
                                        self.model,
                                        rs.chunks if self._policy.streams else rs.received,
                                        self.dim, self._round_orders)

    # ------------------------------------------------------------------ the driver's work

    def next_work(self) -> DecodeRound | AnalyseRound | None:
        """The next work item (the same one until :meth:`work_done` answers it), or None.

        A :class:`DecodeRound` (a round ended: decode, step, then the next round starts at the
        ``now`` of its answer) comes before the :class:`AnalyseRound` items (decode error, loss
        and oracle of an ended round, run after the next round_start was flushed).
        """
        if self._decode_item is not None:
            return self._decode_item
        return self._analyses[0] if self._analyses else None

    def work_done(self, item: DecodeRound | AnalyseRound, answer: Decoded | None, *,
                  now: float) -> None:
        """The answer to ``item`` (``aggregator.run(item)``); ``now`` read after it ran."""
        if type(item) is DecodeRound:
            if item is not self._decode_item or not isinstance(answer, Decoded):
                raise LocalProtocolError("work_done: not the queued DecodeRound, or no answer")
            self._decode_item = None
            self._round_decoded(item, answer, now)
        else:
            if not self._analyses or item is not self._analyses[0]:
                raise LocalProtocolError("work_done: not the next queued AnalyseRound")
            self._analyses.pop(0)
            self._events.append(RoundCompleted(item.record))
            if not self._analyses and self._decode_item is None:
                self._events.extend(self._deferred_events)
                self._deferred_events.clear()

    def _round_decoded(self, item: DecodeRound, answer: Decoded, now: float) -> None:
        rec = item.record
        for key in answer.counters:
            self.stats[key] += 1
        self.model = answer.model
        self.records.append(rec)
        if answer.evict:  # before the next round starts, so it is not in it
            self._evict_workers(answer.evict, rec.round, now)
        live = rec.round in self._oracle_hints
        hint = self._oracle_hints.pop(rec.round, None)
        self._analyses.append(AnalyseRound(rec, answer.gradient, item.model, answer.model,
                                           live, hint, item.orders))
        # (no next round when stop() came while the decode was out)
        if self.phase is PSPhase.DECODING and self._start_round(now) is PSPhase.JOINING:
            # no round started at once: tell the workers this one is over (when a round
            # does start, its round_start says so)
            self._broadcast(RoundEnd(epoch=self.epoch, round=rec.round,
                                     status=str(rec.status)), ready_only=True)

    def _finish(self, reason: str, now: float) -> None:
        self._set_phase(PSPhase.FINISHED)
        self._round = None
        self._broadcast(Shutdown(reason=reason))
        for peer in list(self._worker_peer.values()):
            self._outbox.append(Outgoing(peer, None, close=True, reason="shutdown"))
        # a decode still out with the driver is a round completed too
        done = len(self.records) + (self._decode_item is not None)
        self._emit_after_analyses(Finished(done, reason, now))
