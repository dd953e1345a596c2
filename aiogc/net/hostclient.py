"""A worker host: a block of workers over one TCP connection, one timer heap, one write per wake.

:class:`HostClient` runs the :class:`~aiogc.core.Worker` cores of the contiguous ids
``first .. first + count - 1`` in one process. They share one connection to the PS
(docs/protocol.md §2.6: a preamble, then ``slot | frame`` records and ``OPEN`` / ``CLOSE``
control records), one loop timer driven by a heap of the workers' deadlines
(:class:`HostScheduler`), and one write per wake-up: every frame the workers produce while
handling one read of the connection, or the timers due at one wake-up, leaves in one
``transport.write`` (unless the batch runs longer than
:data:`~aiogc.net.hostlink.BATCH_WINDOW_S`: then every such window's frames leave together, so
that batching never delays a frame by more than that).

Each worker keeps its own core, keys, handshake and reconnect backoff: a worker's session is
driven by a :class:`~aiogc.net.drivers.WorkerClient` whose connection is a :class:`HostSlot`
(this module drives its connection callbacks). A session the PS ends (or the worker ends) is
reopened on the same host connection after that worker's backoff; a lost host connection ends
every session, and the host reconnects with backoff and reopens them all.
"""

from __future__ import annotations

import asyncio
import enum
import heapq
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from aiogc.core import Worker
from aiogc.core.common import Backoff
from aiogc.errors import ConfigError, MalformedFrame, RemoteProtocolError
from aiogc.net.drivers import (
    DEFAULT_CLIENT_OPTIONS,
    ClientOptions,
    EventSink,
    WorkerClient,
    fatal_error,
)
from aiogc.net.framing import FramedConnection
from aiogc.net.hostlink import BATCH_WINDOW_S
from aiogc.net.loops import MONOTONIC, Clock, _tick_bias, _Timer
from aiogc.protocol.headers import DEFAULT_LIMITS
from aiogc.protocol.hostmux import (
    CLOSE,
    HOST_SLOT,
    MAX_SLOTS,
    ROLE_HOST,
    ROLE_PS,
    Control,
    MuxFrameDecoder,
    Preamble,
    encode_control,
    encode_preamble,
    slot_prefix,
)
from aiogc.protocol.messages import Message
from aiogc.protocol.tags import SessionAuth
from aiogc.protocol.wire import encode_frame
from aiogc.training.setup import SetupCache, TaskPolicy

__all__ = ["HostClient", "HostScheduler"]


class HostScheduler:
    """One loop timer for many deadlines: a heap of ``(when, slot)``, lazily invalidated.

    ``arm(slot, when)`` replaces ``slot``'s deadline (None: none). At a wake-up every slot
    whose deadline is due is handed to ``on_wake(slots)`` in one call (the host writes what
    they produce at once); the loop timer is then set for the earliest remaining deadline.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, n: int,
                 on_wake: Any, clock: Clock = MONOTONIC) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int]] = []
        self._when: list[float | None] = [None] * n
        self._on_wake = on_wake
        # a chunk's deadline met to within the loop's resolution, early or late alike (mean
        # error ~0; a timer that never fires early is on average 0.5 ms late on uvloop)
        self._early = _tick_bias(loop)
        self._timer = _Timer(loop, self._fire, early_s=self._early, clock=clock)
        #: per slot, the time its last wake-up counts as: its deadline if the loop woke up to
        #: ``_early`` before it, else the clock
        self.due_at: list[float] = [0.0] * n
        #: wake-ups so far, and slots handled by them (a test and a bench look)
        self.wakes = 0
        self.fired = 0

    def arm(self, slot: int, when: float | None) -> None:
        if self._when[slot] == when:
            return  # the usual re-arm after a pump: nothing moved
        self._when[slot] = when
        if when is not None:
            heap = self._heap
            heapq.heappush(heap, (when, slot))
            if heap[0][1] == slot and heap[0][0] == when:
                self._timer.arm(when)

    def _fire(self) -> None:
        heap, wanted = self._heap, self._when
        now = self._clock()
        limit = now + self._early
        due: list[int] = []
        at = self.due_at
        while heap and heap[0][0] <= limit:
            when, slot = heapq.heappop(heap)
            if wanted[slot] == when:
                wanted[slot] = None
                due.append(slot)
                at[slot] = when if when > now else now
        if due:
            self.wakes += 1
            self.fired += len(due)
            self._on_wake(due)
        self._rearm()

    def _rearm(self) -> None:
        heap, wanted = self._heap, self._when
        while heap and wanted[heap[0][1]] != heap[0][0]:
            heapq.heappop(heap)  # stale: that slot's deadline moved
        self._timer.arm(heap[0][0] if heap else None)

    def cancel(self) -> None:
        self._timer.cancel()
        self._heap.clear()
        self._when = [None] * len(self._when)


class _SlotTimer:
    """What a :class:`WorkerClient` arms: its slot's entry in the host's heap.

    ``arm`` is a :func:`functools.partial` of the scheduler's, not a method: a worker re-arms
    after every pump, and the partial saves a Python frame each time.
    """

    __slots__ = ("_sched", "_slot", "arm")

    def __init__(self, sched: HostScheduler, slot: int) -> None:
        self._sched, self._slot = sched, slot
        self.arm: Callable[[float | None], None] = partial(sched.arm, slot)

    def cancel(self) -> None:
        self._sched.arm(self._slot, None)


class _State(enum.Enum):
    CLOSED = 0  # no session (free to OPEN)
    OPEN = 1
    CLOSING = 2  # we sent CLOSE; the PS's CLOSE is awaited before the slot is free


_OPEN = _State.OPEN  # a module constant: HostSlot.queue compares it for every frame


@dataclass
class _Slot:
    client: WorkerClient
    state: _State = _State.CLOSED
    ep: HostSlot | None = None
    last_ok: float = 0.0
    rounds_before: int = 0
    done: bool = False
    result: BaseException | None = None
    reopen: asyncio.TimerHandle | None = field(default=None, repr=False)


class HostSlot(SessionAuth):
    """One worker session on the host connection: the connection its WorkerClient sees."""

    __slots__ = ("_host", "_prefix", "_st", "flush", "slot")

    def __init__(self, host: HostClient, slot: int) -> None:
        self._host = host
        self.slot = slot
        self._st = host.slots[slot]  # the host's record of this slot (one per slot, for good)
        self._prefix = slot_prefix(slot)
        super().__init__()
        #: the host's flush itself (one write per read or wake-up), not a method calling it:
        #: a worker flushes after every pump that produced frames
        self.flush: Callable[[], None] = host.flush

    def queue(self, msg: Message, parts: list[bytes | memoryview] | None = None) -> int:
        host = self._host
        conn = host.conn
        st = self._st
        if conn is None or st.ep is not self or st.state is not _OPEN:
            return 0
        host.frames_out += 1
        return conn.queue_record(self._prefix, parts or encode_frame(msg), self.send_auth)

    def close(self, code: str | None = None, reason: str = "") -> None:
        self._host.close_slot(self)

    def abort(self) -> None:
        self.close()


class HostClient:
    """Run the workers ``workers`` (ids ``first .. first + count - 1``, in order) over one
    connection to the PS at ``host:port``.

    ``run()`` returns, per worker, None (the PS said shutdown) or the exception that ended it
    (``ConnectionError``: no authenticated session for ``give_up_after_s``, or a fatal
    handshake error), like ``asyncio.gather(..., return_exceptions=True)`` over one
    :class:`WorkerClient` per worker. ``on_events[i]`` receives worker ``i``'s events.
    """

    def __init__(self, workers: Sequence[Worker], host: str, port: int, *,
                 on_events: Sequence[EventSink | None] | None = None,
                 give_up_after_s: float = 30.0, setups: SetupCache | None = None,
                 policy: TaskPolicy | None = None,
                 options: ClientOptions = DEFAULT_CLIENT_OPTIONS) -> None:
        ids = [w.worker_id for w in workers]
        if not ids or ids != list(range(ids[0], ids[0] + len(ids))) or len(ids) > MAX_SLOTS:
            raise ConfigError("worker_ids", ids, f"1..{MAX_SLOTS} contiguous ids in order")
        self.first, self.count = ids[0], len(ids)
        self.host, self.port = host, port
        self._clock = options.clock
        self._give_up = give_up_after_s
        self._connect_timeout = options.connect_timeout_s
        setups = setups if setups is not None else SetupCache(policy)
        sinks = list(on_events) if on_events is not None else [None] * len(ids)
        self.slots = [_Slot(WorkerClient(w, host, port, on_event=sink, setups=setups,
                                         give_up_after_s=give_up_after_s, options=options))
                      for w, sink in zip(workers, sinks, strict=True)]
        rng = options.rng
        if rng is None:
            import random

            rng = random.Random(secrets.randbits(64))
        self.backoff = Backoff(options.backoff_s[0], options.backoff_s[1], rng)
        self._sleep = options.sleep if options.sleep is not None else asyncio.sleep
        self._live = len(self.slots)  # workers not done
        self.conn: FramedConnection | None = None
        self._closed: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.sched: HostScheduler | None = None
        self._accepted = False
        self._in_batch = False
        self._read_at = 0.0  # when the read being handled arrived (the clock's time)
        self._dirty = False
        self._dirty_since = 0.0
        #: host connections made; reason of the last refusal by the PS (an error frame)
        self.connections = 0
        self.last_refusal: str | None = None
        #: writes to the host connection (one per read or wake-up that produced frames, or per
        #: BATCH_WINDOW_S of a long one), and the workers' frames they carried
        self.writes = 0
        self.frames_out = 0

    # -- lifetime ---------------------------------------------------------------------------

    async def run(self) -> list[BaseException | None]:
        loop = self._loop = asyncio.get_running_loop()
        sched = self.sched = HostScheduler(loop, self.count, self._on_wake, self._clock)
        start = time.monotonic()
        for i, st in enumerate(self.slots):
            st.last_ok = start
            st.client._loop = loop
            st.client._timer = _SlotTimer(sched, i)  # type: ignore[assignment]
        try:
            while self._live:
                try:
                    async with asyncio.timeout(self._connect_timeout):
                        await loop.create_connection(self._protocol, self.host, self.port)
                except (OSError, TimeoutError) as exc:
                    self._give_up_slots(str(exc), exc)
                    if self._live:
                        await self._backoff_sleep()
                    continue
                self.connections += 1
                rounds = sum(st.client.worker.rounds_ended for st in self.slots)
                assert self._closed is not None
                await self._closed
                if sum(st.client.worker.rounds_ended for st in self.slots) > rounds:
                    self.backoff.reset()  # a round completed on it: start over from the base
                self._give_up_slots("host connection closed", None)
                if self._live:
                    await self._backoff_sleep()
        finally:
            sched.cancel()
            for st in self.slots:
                if st.reopen is not None:
                    st.reopen.cancel()
            if self.conn is not None:
                self.conn.abort()
        return [st.result for st in self.slots]

    async def _backoff_sleep(self) -> None:
        await self._sleep(self.backoff.next_delay())

    def _give_up_slots(self, why: str, exc: BaseException | None) -> None:
        """End every live worker without an authenticated session for ``give_up_after_s``."""
        now = time.monotonic()
        for st in self.slots:
            if st.done or now - st.last_ok <= self._give_up:
                continue
            w = st.client.worker
            pre = w.last_preauth or self.last_refusal
            detail = f"; last unauthenticated answer: {pre}" if pre else ""
            err = ConnectionError(
                f"worker {w.worker_id}: PS {self.host}:{self.port} unreachable or refusing "
                f"authentication for {self._give_up} s ({why}{detail})")
            err.__cause__ = exc
            self._finish_slot(st, err)

    def _finish_slot(self, st: _Slot, result: BaseException | None) -> None:
        st.done, st.result = True, result
        self._live -= 1
        if not self._live and self.conn is not None:
            self.conn.close()

    # -- the host connection ----------------------------------------------------------------

    def _protocol(self) -> FramedConnection:
        return FramedConnection(self._on_message, self._on_conn_close, limits=DEFAULT_LIMITS,
                                on_made=self._conn_made)

    def _conn_made(self, conn: FramedConnection) -> None:
        assert self._loop is not None
        self.conn = conn
        self._closed = self._loop.create_future()
        self._accepted = False
        conn.adopt(MuxFrameDecoder(self._select, plain_first=True), self._on_message,
                   self._on_conn_close, after_read=self._end_batch,
                   error_prefix=slot_prefix(HOST_SLOT))
        conn.queue_raw(encode_preamble(ROLE_HOST, self.first, self.count))
        self._in_batch = True
        for i, st in enumerate(self.slots):
            if not st.done:
                self._open(i)
        self._end_batch()

    def _open(self, i: int) -> None:
        st = self.slots[i]
        st.reopen = None
        conn = self.conn
        if st.done or st.state is not _State.CLOSED or conn is None or conn.is_closing():
            return
        ep = st.ep = HostSlot(self, i)
        st.state = _State.OPEN
        st.rounds_before = st.client.worker.rounds_ended
        conn.queue_raw(encode_control(1, i))  # OPEN
        st.client.connections += 1
        st.client._conn_made(ep)  # type: ignore[arg-type]
        self.flush()

    def _select(self, dec: MuxFrameDecoder, slot: int) -> None:
        dec.limits = DEFAULT_LIMITS
        if slot == HOST_SLOT:
            dec.auth = None
            return
        st = self.slots[slot] if slot < self.count else None
        if st is None or st.state is _State.CLOSED or st.ep is None:
            raise MalformedFrame(f"frame on slot {slot}, which is not open", code="slot_closed")
        dec.auth = st.ep.recv_auth

    def _on_message(self, conn: FramedConnection, msg: Any) -> None:
        if conn is not self.conn:
            return
        if not self._in_batch:
            # the read's arrival: every frame of it reached its worker then. On separate
            # machines the workers would handle their frames in parallel; here one loop handles
            # them one after another, and a worker's clock (its round's chunk deadlines) must
            # not start later for being the 64th in the batch (the emulation's cost, not the
            # protocol's: docs/design.md, "Worker hosts")
            self._read_at = self._clock()
        self._in_batch = True
        # _window's test inlined: this runs for every frame read
        if self._dirty and self._clock() - self._dirty_since > BATCH_WINDOW_S:
            self._window()
        kind = type(msg)
        if kind is not Preamble and kind is not Control:  # a worker's frame: the common case
            dec = conn.decoder
            slot = dec.slot if type(dec) is MuxFrameDecoder else None
            if slot is not None and slot != HOST_SLOT:
                st = self.slots[slot]
                if st.state is _OPEN:
                    st.client._on_message(st.ep, msg, self._read_at)  # type: ignore[arg-type]
                # CLOSING: in flight before the PS saw our CLOSE; dropped
                return
        self._on_other(conn, msg)

    def _on_other(self, conn: FramedConnection, msg: Any) -> None:
        """:meth:`_on_message` for what is not a worker's frame on an open slot (the
        general path: preamble, controls, plain frames)."""
        kind = type(msg)
        if kind is Preamble:
            if msg.role != ROLE_PS or (msg.first, msg.count) != (self.first, self.count):
                raise RemoteProtocolError("the PS's preamble does not accept our block",
                                          code="bad_preamble")
            self._accepted = True
            return
        if kind is Control:
            self._on_control(msg)
            return
        dec = conn.decoder
        slot = dec.slot if isinstance(dec, MuxFrameDecoder) else None
        if slot is None or slot == HOST_SLOT:
            # the accept-time challenge (ignored), or the PS refusing the host connection
            code = getattr(msg, "code", None)
            if code is not None:
                self.last_refusal = f"{code}: {getattr(msg, 'reason', '')}"
            elif self._accepted:
                raise RemoteProtocolError(f"plain {msg.kind} frame after the preamble",
                                          code="bad_record")
            return
        st = self.slots[slot]
        if st.state is _State.OPEN:
            st.client._on_message(st.ep, msg)  # type: ignore[arg-type]
        # CLOSING: in flight before the PS saw our CLOSE; dropped

    def _on_control(self, c: Control) -> None:
        st = self.slots[c.slot] if 0 <= c.slot < self.count else None
        if st is None or c.op != CLOSE or st.state is _State.CLOSED:
            raise RemoteProtocolError(f"control op {c.op} on slot {c.slot}", code="bad_control")
        if st.state is _State.OPEN:  # the PS ended the session: answer
            assert self.conn is not None
            self.conn.queue_raw(encode_control(CLOSE, c.slot))
            self.flush()
            ep, st.state = st.ep, _State.CLOSED
            st.client._on_close(ep, None)  # type: ignore[arg-type]
        st.state, st.ep = _State.CLOSED, None
        self._session_ended(c.slot, reopen=True)

    def close_slot(self, ep: HostSlot) -> None:
        """The worker closed its session: CLOSE, and its client hears of it next iteration."""
        st = self.slots[ep.slot]
        if st.ep is not ep or st.state is not _State.OPEN:
            return
        st.state = _State.CLOSING
        if self.conn is not None:
            self.conn.queue_raw(encode_control(CLOSE, ep.slot))
            self.flush()
        assert self._loop is not None
        self._loop.call_soon(st.client._on_close, ep, None)  # type: ignore[arg-type]

    def _session_ended(self, i: int, *, reopen: bool) -> None:
        """Worker ``i``'s session is over: is the worker done? else reopen after its backoff."""
        st = self.slots[i]
        c = st.client
        if c._welcomed:
            st.last_ok = time.monotonic()
            c._welcomed = False
        if c.worker.rounds_ended > st.rounds_before:
            c.backoff.reset()
        if st.done:
            return
        if c._shutdown:
            self._finish_slot(st, None)
        elif c._fatal is not None:
            self._finish_slot(st, fatal_error(c.worker.worker_id, c._fatal))
        elif reopen:
            self._give_up_slots("sessions closed before authentication", None)
            if not st.done:
                delay = c.backoff.next_delay()
                c.delays.append(delay)
                assert self._loop is not None
                st.reopen = self._loop.call_later(delay, self._open, i)

    def _on_conn_close(self, conn: FramedConnection, exc: BaseException | None) -> None:
        if conn is not self.conn:
            return
        self.conn = None
        for i, st in enumerate(self.slots):
            if st.reopen is not None:
                st.reopen.cancel()
                st.reopen = None
            if st.state is _State.OPEN:
                st.client._on_close(st.ep, exc)  # type: ignore[arg-type]
            st.state, st.ep = _State.CLOSED, None
            self._session_ended(i, reopen=False)
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    # -- writing: one write per read or wake-up -----------------------------------------------

    def flush(self) -> None:
        if self._in_batch:
            if not self._dirty:
                self._dirty = True
                self._dirty_since = self._clock()
        elif self.conn is not None:
            self.writes += 1
            self.conn.flush()

    def _end_batch(self) -> None:
        self._in_batch = False
        if self._dirty:
            self._dirty = False
            self.flush()

    def _on_wake(self, due: list[int]) -> None:
        self._in_batch = True
        slots = self.slots
        assert self.sched is not None
        at = self.sched.due_at
        for i in due:
            slots[i].client._on_timer(at[i])
            if self._dirty and self._clock() - self._dirty_since > BATCH_WINDOW_S:
                self._window()
        self._end_batch()

    def _window(self) -> None:
        """Write what the batch queued once its first frame waited ``BATCH_WINDOW_S``."""
        if self._dirty and self._clock() - self._dirty_since > BATCH_WINDOW_S \
                and self.conn is not None:
            self._dirty = False
            self.writes += 1
            self.conn.flush()
