"""The thin asyncio layer: drive the sans-IO cores over TCP.

A driver only (1) feeds ``receive`` / ``connection_made`` / ``connection_lost`` /
``handle_timer`` with ``now = time.monotonic()``, (2) flushes ``messages_to_send()`` to the
right connection (a message sent to many peers is encoded once; everything for one peer leaves
in one write; an outbox larger than :data:`OUTBOX_SLICE` frames leaves one slice per loop
iteration, so that reads are served during a broadcast to a thousand workers), (3) runs the
application work the cores queue (the PS's ``next_work``: decode and analytics, run by its
``aggregator`` and answered with ``work_done``; the worker's
``next_work``: chunk gradients; ``SetupNeeded``: scheme and task, built once per configuration
in an executor thread), (4) switches a connection to tagged frames once the core derived its
session keys, and (5) keeps one timer at ``next_deadline()`` (re-armed only when the deadline
moves earlier, see :class:`_Timer`). Protocol
decisions live in ``aiogc.core``; framing, tags and bounded decoding in
:mod:`aiogc.net.framing` and :mod:`aiogc.protocol.wire`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Final

import numpy as np

from aiogc.core import (
    ComputeChunks,
    ConnectionFailed,
    DecodeRound,
    EncodeVector,
    Event,
    Finished,
    Outgoing,
    ParameterServer,
    SetupNeeded,
    ShutdownRequested,
    Welcomed,
    Worker,
)
from aiogc.core.common import Backoff
from aiogc.core.ps import pending_cap
from aiogc.core.worker import Polled
from aiogc.errors import ConfigError, EvictedError, RemoteProtocolError
from aiogc.net.admission import Admission
from aiogc.net.framing import FramedConnection
from aiogc.net.hostlink import BATCH_WINDOW_S, HostLink, SlotEndpoint
from aiogc.net.limits import (
    OUTBOX_SLICE,
    WORKER_MAX_HEADER,
    _nonce16,
    frame_nbytes,
    is_loopback,
    send_queue_cap,
)
from aiogc.net.loops import MONOTONIC, Clock, _tick_bias, _Timer
from aiogc.net.shaping import ShapedQueue, ShapedSend, ingress_queue, release_all, shaped_send
from aiogc.net.stall import StallWatch
from aiogc.protocol.headers import DEFAULT_LIMITS, PREAUTH_LIMITS, FrameLimits
from aiogc.protocol.messages import Message, Welcome
from aiogc.protocol.wire import encode_frame
from aiogc.training.aggregator import Aggregator
from aiogc.training.encode import ChunkRows, encode_vector
from aiogc.training.setup import SetupCache, TaskPolicy, setup_error_code

log = logging.getLogger("aiogc.net")
_INF = float("inf")

FrameLog = Callable[[str, Any, Message, int], None]  # (direction, peer, msg, nbytes)
EventSink = Callable[[Event], None]


#: The end reason's prefix of a run stopped because the PS's own work (decode, loss, the
#: oracle: the task's code run on the PS) raised.
PS_TASK_FAILED = "task failed on the PS"


class PSServer:
    """Serve one :class:`ParameterServer` on TCP until it finishes.

    Parameters
    ----------
    ps : ParameterServer
    host, port : where to listen (port 0 picks a free port; see :attr:`port` after start).
    frame_log : callable, optional
        ``frame_log(direction, peer, msg, nbytes)`` for every frame in ("in") and out ("out").
    on_event : callable, optional
        Receives every core event (records, progress bars).
    join_clock : bool
        False: the first join deadline starts at :meth:`workers_launched`, not at listen
        (:meth:`ParameterServer.start`).
    clock : callable
        ``clock() -> seconds``, the ``now`` of every core call and the timer's time line
        (default :data:`~aiogc.net.loops.MONOTONIC`; a test passes a fake one).
    """

    def __init__(
        self,
        ps: ParameterServer,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        frame_log: FrameLog | None = None,
        on_event: EventSink | None = None,
        join_clock: bool = True,
        clock: Clock = MONOTONIC,
    ) -> None:
        if not is_loopback(host) and ps.secret is None:
            raise ConfigError("secret", None, f"a shared secret when binding non-loopback {host}")
        if not isinstance(ps.aggregator, Aggregator):
            raise ConfigError("aggregator", None, "a PS built with its aggregator (make_ps)")
        self.ps = ps
        #: the driver's clock (hostlink's endpoints read it too)
        self.clock = self._clock = clock
        self._aggregator = ps.aggregator
        self._rows = ps.aggregator.rows  # the coded vectors' rows (zero-copy receive)
        self.host = host
        self.port = port
        self._frame_log = frame_log
        self._on_event = on_event
        self._join_clock = join_clock
        self._conns: set[FramedConnection] = set()
        #: wire capture: set on every connection the PS accepts (``aiogc.net.pcap``)
        self.tap: Callable[[Any, bool, bytes], None] | None = None
        self._conns_changed = asyncio.Event()  # set on every connection opened or closed
        self._done: asyncio.Future[None] | None = None
        self._timer: _Timer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        itemsize = ps.config.payload_dtype.itemsize
        self._post_auth = FrameLimits(WORKER_MAX_HEADER, max(
            1, self._rows.length * ps.config.coded_wire_dtype.itemsize),
            half_payloads=ps.config.coded_dtype != "same")
        # the largest frame the PS sends is a round_start: the model plus a header whose delay
        # row has at most max(loads) entries (9 bytes each)
        model_bytes = ps.dim * itemsize + 9 * int(max(ps.scheme.loads)) + 4096
        self._max_pending = send_queue_cap(model_bytes)
        # the rest of an outbox larger than OUTBOX_SLICE, written one slice per loop iteration
        # (in order: a later outbox queues behind it, so every peer sees its frames in order),
        # and the frames of the broadcasts in it, encoded once for every slice
        self._outq: deque[Outgoing] = deque()
        self._outq_encoded: dict[int, tuple[Message, list[Any]]] = {}
        # the core's queued work (analytics after a round_start) waits until the frames queued
        # before it have all left, as it did when every outbox was written at once
        self._run_after_outq = False
        # the frames of a host link's read are received one by one but polled once, at the
        # end of the read (_read_done) or once the first of them has waited BATCH_WINDOW_S:
        # when that first frame arrived, None when nothing is waiting for a poll
        self._poll_due: float | None = None
        if ps.nonce_fn is None:
            ps.nonce_fn = _nonce16
        self.started = asyncio.Event()
        # traffic shaping (config.bandwidth, aiogc.net.shaping): the connections past their
        # welcome -> their shaped downlink (None: unlimited), and the shared ingress
        self._shaped: dict[FramedConnection, ShapedSend | None] = {}
        self._ingress: ShapedQueue[tuple[FramedConnection, Message]] | None = None
        #: notices this process not running (its silence is then the PS's, not the workers')
        self._stall: StallWatch | None = None
        #: a decode raised: the run is stopped and the decode never answered
        self._work_failed = False
        #: deadlines and caps on the connections without an authenticated worker
        self._admission: Admission | None = None

    # ------------------------------------------------------------------ lifetime

    async def serve(self) -> None:
        """Listen, run the PS to completion, close every connection."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._done = loop.create_future()
        self._timer = _Timer(loop, self._on_timer, clock=self._clock)
        self._ingress = ingress_queue(self.ps.config, self._ingress_done, loop, self._clock)
        self._admission = Admission.for_ps(loop, self.ps.m, pending_cap(self.ps.m),
                                           self.ps.auth_deadline_s)
        self._stall = StallWatch(loop, self._on_stall, clock=self._clock)
        self._stall.start()
        # a backlog for every worker connecting at once: when the accept queue overflows,
        # Linux completes the client's handshake but drops the connection server-side, and
        # that worker waits for a challenge that never comes (HANDSHAKE_TIMEOUT_S)
        backlog = min(4096, max(128, self.ps.m + pending_cap(self.ps.m)))
        server = await loop.create_server(self._protocol, self.host, self.port,
                                          backlog=backlog)
        self.port = server.sockets[0].getsockname()[1]
        self.ps.start(now=self._now(), join_clock=self._join_clock)
        self.started.set()
        self._pump()
        try:
            await self._done
        finally:
            server.close()
            self._timer.cancel()
            self._admission.close_all()
            self._stall.stop()
            self._write_outq(len(self._outq))  # the last frames (shutdown) before closing
            release_all(self._shaped.values())  # ... without waiting for an emulated link
            await self._flush_and_close()
            await server.wait_closed()

    def workers_launched(self) -> None:
        """The launcher's workers exist: start the deferred join deadline."""
        if self._loop is None:
            return
        self.ps.start(now=self._now())  # the deferred join deadline starts now
        self._pump()

    def stop(self, reason: str = "stopped") -> None:
        """Abort the run (SIGTERM, Ctrl-C): workers are told to shut down."""
        if self._loop is None:
            return
        self.ps.stop(reason, now=self._clock())
        self._pump()

    async def _flush_and_close(self) -> None:
        # give the shutdown frames a bounded moment to leave, then drop everything
        conns = list(self._conns)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                for c in conns:
                    await c.drain()
        for c in conns:
            c.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                await self.wait_connections(lambda: not self._conns)
        for c in list(self._conns):
            c.abort()

    async def wait_connections(self, pred: Callable[[], bool]) -> None:
        """Return once ``pred()`` holds; it is re-checked whenever a connection opens or
        closes (no polling). Bound the wait with ``asyncio.timeout`` at the call site."""
        while not pred():
            self._conns_changed.clear()
            await self._conns_changed.wait()

    # ------------------------------------------------------------------ protocol plumbing

    def _protocol(self) -> FramedConnection:
        conn = FramedConnection(self._on_message, self._on_close, limits=PREAUTH_LIMITS,
                                on_made=self._conn_made, conn_alloc=self._alloc,
                                max_pending_bytes=self._max_pending, on_host=self._on_host)
        conn.tap = self.tap
        return conn

    def _on_host(self, conn: FramedConnection, rest: bytes) -> None:
        # a worker host: its workers' sessions are peers of their own (net/hostlink.py)
        HostLink.adopt(self, conn, rest, self.ps.m)

    def _alloc(self, conn: FramedConnection, kind: str, header: dict[str, Any],
               dtype: np.dtype, n: int) -> Any:
        # zero-copy receive: a vector the PS awaits lands in its worker's row
        w = self.ps.awaits(conn)
        return None if w is None else self._rows.row(w, dtype, n)

    def _now(self) -> float:
        return self._clock()

    def _conn_made(self, conn: FramedConnection) -> None:
        if self._admission is not None and type(conn) is FramedConnection:
            self._admission.admit(conn)
        self._conns.add(conn)
        self.ps.connection_made(conn, now=self._now())
        self._pump()
        self._conns_changed.set()

    def _on_message(self, conn: FramedConnection | SlotEndpoint, msg: Message) -> None:
        if self._frame_log is not None:
            self._frame_log("in", conn, msg, conn.last_frame_nbytes)
        if self._ingress is not None and conn in self._shaped:
            self._ingress.put((conn, msg), frame_nbytes(msg))  # the shared PS ingress
            return
        if type(conn) is SlotEndpoint:
            # within a host link's read: the link calls _read_done at its end
            now = self._clock()
            self.ps.receive(conn, msg, now=now)  # as _receive does, without its pump
            if conn.limits is PREAUTH_LIMITS:
                self._authenticated(conn)
            due = self._poll_due
            if due is None:
                self._poll_due = now
            elif now - due > BATCH_WINDOW_S:
                self._pump()
                conn.flush_now()  # they waited long enough already: not another window
            return
        self._receive(conn, msg)

    def _read_done(self) -> None:
        """A host link's read ended: poll the core once for all of its frames."""
        if self._poll_due is not None:
            self._pump()

    def _ingress_done(self, item: tuple[FramedConnection, Message]) -> None:
        if item[0] in self._conns:  # a frame of a closed connection is dropped with it
            self._receive(*item)

    def _receive(self, conn: Any, msg: Message) -> None:
        # feed the core; limits and keys change before the connection's next frame is parsed
        self.ps.receive(conn, msg, now=self._clock())
        if conn.limits is PREAUTH_LIMITS:
            self._authenticated(conn)
        self._pump()

    def _authenticated(self, conn: Any) -> None:
        # a peer past its handshake: raised limits, and tagged frames from it when keyed
        ps = self.ps
        if ps.worker_of(conn) is not None:
            conn.set_limits(self._post_auth)
            if self._admission is not None:
                self._admission.authenticated(conn)
            keys = ps.session_keys(conn)
            if keys is not None:
                # every frame after hello is tagged (the welcome we send is not: see _pump)
                conn.set_auth(recv=keys.worker_to_ps)

    def _on_stall(self, seconds: float) -> None:
        log.warning("the PS did not run for %.1f s (stopped, or its loop blocked): workers "
                    "lost meanwhile are not blamed", seconds)
        self.ps.handle_timer(now=self._clock(), stalled_s=seconds)
        if self._loop is not None:
            self._loop.call_soon(self._pump)  # what the deadlines queued goes out

    def _on_close(self, conn: FramedConnection, exc: BaseException | None) -> None:
        if self._stall is not None:
            self._stall.check()  # a connection the peer closed while we were stopped
        self._conns.discard(conn)
        if self._admission is not None:
            self._admission.closed(conn)
        shaped = self._shaped.pop(conn, None)
        if shaped is not None:
            shaped.cancel()
        if exc is not None:
            log.debug("connection %s closed: %r", conn.peername, exc)
        code = exc.code if isinstance(exc, RemoteProtocolError) else None
        self.ps.connection_lost(conn, now=self._now(), code=code)
        self._pump()
        self._conns_changed.set()

    def _on_timer(self) -> None:
        if self._stall is not None:
            self._stall.check()  # before the liveness sweep judges the workers' silence
        self.ps.handle_timer(now=self._clock())
        self._pump()

    def _flush_outbox(self, outbox: Sequence[Outgoing]) -> None:
        if not outbox:
            return
        q = self._outq
        if q:  # a large outbox is still going out: this one follows it
            q.extend(outbox)
        elif len(outbox) <= OUTBOX_SLICE:
            self._write_outbox(outbox, {})
        else:
            q.extend(outbox)
            self._write_outq(OUTBOX_SLICE)

    def _write_outq(self, n: int) -> None:
        """Write the next ``n`` deferred frames; schedule the rest for the next iteration."""
        q = self._outq
        if not q:
            return
        self._write_outbox([q.popleft() for _ in range(min(n, len(q)))], self._outq_encoded)
        if q:
            assert self._loop is not None
            self._loop.call_soon(self._write_outq, OUTBOX_SLICE)
            return
        self._outq_encoded.clear()
        if self._run_after_outq:
            self._run_after_outq = False
            self._pump()

    def _write_outbox(self, outbox: Sequence[Outgoing],
                      encoded: dict[int, tuple[Message, list[Any]]]) -> None:
        """Queue every frame (a message sent to many peers is encoded once: ``encoded`` maps
        its id to its frame and keeps it alive), then one write per peer."""
        ps = self.ps
        touched: dict[int, Any] = {}
        frame_log = self._frame_log
        for out in outbox:
            conn: Any = out.peer  # a FramedConnection or a host's SlotEndpoint
            msg = out.message
            shaped = self._shaped.get(conn) if self._shaped else None
            if msg is not None:
                hit = encoded.get(id(msg))
                if hit is None:
                    hit = encoded[id(msg)] = (msg, encode_frame(msg))
                n = (conn if shaped is None else shaped).queue(msg, hit[1])
                touched[id(conn)] = conn
                if frame_log is not None:
                    frame_log("out", conn, msg, n)
                if type(msg) is Welcome:
                    keys = ps.session_keys(conn)
                    if keys is not None:
                        conn.set_auth(send=keys.ps_to_worker)  # tags start after welcome
                    if ps.config.bandwidth:  # and shaping (aiogc.net.shaping)
                        self._shaped[conn] = shaped_send(conn, ps.config, "down", self._loop,
                                                         self._clock)
            if out.close:
                (conn if shaped is None else shaped).close()  # shaped: after earlier frames
                touched.pop(id(conn), None)
        for conn in touched.values():
            conn.flush()

    def _pump(self) -> None:
        ps = self.ps
        self._poll_due = None
        while True:
            # one poll per stage; decode / analytics run after the frames above left (the next
            # round_start first), then the events and the timer deadline come with the poll
            outbox, events, when = ps.poll()
            self._flush_outbox(outbox)
            if events is None and self._work_failed:
                # the run stopped on a decode that raised: it is never answered
                events, when = list(iter(ps.next_event, None)), None
            if events is None:
                if self._outq and (outbox or self._run_after_outq):
                    # frames just queued (a broadcast) are still going out slice by slice:
                    # the work runs once they have left (_write_outq pumps again); the timer
                    # keeps its deadline meanwhile
                    self._run_after_outq = True
                    return
                item = ps.next_work()
                assert item is not None and self._aggregator is not None
                try:
                    done = self._aggregator.run(item)
                except Exception as exc:  # the task's code on the PS (loss, oracle...)
                    log.debug("the PS's work failed", exc_info=True)
                    ps.stop(f"{PS_TASK_FAILED}: round {item.record.round}: "
                            f"{type(exc).__name__}: {exc}", now=self._clock())
                    if type(item) is DecodeRound:
                        self._work_failed = True
                        continue
                    done = None  # an analysis: its round completes without it
                ps.work_done(item, done, now=self._clock())
                continue
            break
        if events:
            sink = self._on_event
            for ev in events:
                if sink is not None:
                    sink(ev)
                if type(ev) is Finished and self._done is not None and not self._done.done():
                    self._done.set_result(None)
        if self._timer is not None:
            self._timer.arm(when)


@dataclass(frozen=True)
class ClientOptions:
    """How a :class:`WorkerClient` reconnects, and its test hooks.

    Parameters
    ----------
    backoff_s : (float, float)
        Base and cap of the exponential, fully jittered reconnect backoff (seconds).
    connect_timeout_s : float
        Give up one connection attempt after this long.
    progress_events : bool, optional
        Sets ``worker.progress_events`` (per-chunk telemetry events); default: on iff the client
        has an ``on_event`` sink.
    rng : object with ``random()``, optional
        Jitter of the reconnect backoff (:class:`~aiogc.core.common.Backoff`); default a
        ``random.Random`` seeded from the OS. Tests pass a seeded one.
    sleep : coroutine function, optional
        ``await sleep(seconds)`` between reconnects (default ``asyncio.sleep``); tests record
        the delays through it.
    clock : callable
        ``clock() -> seconds``, the ``now`` of every worker core call and the timers' time
        line (default :data:`~aiogc.net.loops.MONOTONIC`; a test passes a fake one).
    """

    backoff_s: tuple[float, float] = (0.05, 2.0)
    connect_timeout_s: float = 5.0
    progress_events: bool | None = None
    rng: Any = None
    sleep: Callable[[float], Any] | None = None
    clock: Clock = MONOTONIC


DEFAULT_CLIENT_OPTIONS: Final = ClientOptions()


def fatal_error(worker_id: int, ev: ConnectionFailed) -> ConnectionError:
    """The exception a worker ends with after the fatal close ``ev``: :class:`EvictedError`
    for ``evicted`` (exit 4), else ``ConnectionError`` (exit 3)."""
    cls = EvictedError if ev.code == "evicted" else ConnectionError
    return cls(f"worker {worker_id}: {ev.code}: {ev.reason}")


class WorkerClient:
    """Run one :class:`Worker` against a PS: connect, reconnect with backoff, stop on shutdown.

    ``run()`` returns when the PS said shutdown; it raises ``ConnectionError`` when the PS
    cannot be reached for ``give_up_after_s`` or a fatal handshake error occurred.

    Parameters
    ----------
    setups : SetupCache, optional
        Where scheme and task come from; pass one cache to every client of a process so that
        each configuration is built once (in an executor thread: the loop never blocks on it).
    policy : TaskPolicy, optional
        What this worker may build (used when ``setups`` is None): built-in tasks only by
        default; no code is ever taken from the wire.
    options : ClientOptions, optional
        Reconnect backoff, connect timeout, per-chunk telemetry, and the test hooks (rng,
        sleep); the defaults suit a real run.

    Reconnects back off exponentially with full jitter from ``options.backoff_s[0]`` up to
    ``options.backoff_s[1]``; the backoff resets only after a connection on which a round
    ended (a PS that welcomes and then keeps failing the worker no longer gets ~13 reconnects a
    second).
    ``give_up_after_s`` counts from the last *authenticated* connection: a port squatter that
    accepts and answers with forged frames cannot keep the worker alive forever, nor end it
    early (pre-handshake ``error``/``shutdown`` frames only close the connection).
    """

    def __init__(
        self,
        worker: Worker,
        host: str,
        port: int,
        *,
        on_event: EventSink | None = None,
        give_up_after_s: float = 30.0,
        setups: SetupCache | None = None,
        policy: TaskPolicy | None = None,
        options: ClientOptions = DEFAULT_CLIENT_OPTIONS,
    ) -> None:
        if not is_loopback(host) and worker.key is None:
            raise ConfigError("secret", None,
                              f"a secret (or worker key) to reach a non-loopback PS at {host}")
        self.worker = worker
        self.host = host
        self.port = port
        self._on_event = on_event
        self._clock = options.clock
        backoff_s = self._backoff = options.backoff_s
        rng = options.rng
        if rng is None:
            import random

            rng = random.Random(secrets.randbits(64))
        self.backoff = Backoff(backoff_s[0], backoff_s[1], rng)
        self._sleep = options.sleep if options.sleep is not None else asyncio.sleep
        #: every reconnect delay taken, in order (seconds)
        self.delays: list[float] = []
        self._give_up = give_up_after_s
        self._connect_timeout = options.connect_timeout_s
        progress_events = options.progress_events
        self.setups = setups if setups is not None else SetupCache(policy)
        if worker.nonce_fn is None:
            worker.nonce_fn = _nonce16
        # per-chunk telemetry only for a sink that may want it
        worker.progress_events = on_event is not None if progress_events is None \
            else progress_events
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: FramedConnection | None = None
        #: the connection whose auth was set from the session (set_auth is once per connection)
        self._tagged: FramedConnection | None = None
        self._closed: asyncio.Future[None] | None = None
        self._timer: _Timer | None = None
        self._shutdown = False
        self._fatal: ConnectionFailed | None = None
        self._welcomed = False
        self._preauth_said = False
        self.connections = 0
        self._uplink: ShapedSend | None = None  # config.bandwidth's worker_up, once welcomed
        #: the round's chunk gradients, in one array reused every round (encoded in place)
        self._rows = ChunkRows()

    def _now(self) -> float:
        return self._clock()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        # early-tolerant, as a worker host's scheduler: a chunk finishes within the loop's
        # resolution of its deadline, early or late alike (aiogc.net.loops._Timer)
        self._timer = _Timer(loop, self._on_loop_timer, early_s=_tick_bias(loop),
                             clock=self._clock)
        last_ok = time.monotonic()
        try:
            while not self._shutdown:
                try:
                    async with asyncio.timeout(self._connect_timeout):
                        await loop.create_connection(self._protocol, self.host, self.port)
                except (OSError, TimeoutError) as exc:
                    self._check_give_up(last_ok, str(exc), exc)
                    await self._backoff_sleep()
                    continue
                self.connections += 1
                rounds_before = self.worker.rounds_ended
                assert self._closed is not None
                await self._closed
                if self._welcomed:
                    last_ok = time.monotonic()  # an authenticated session
                    self._welcomed = False
                if self.worker.rounds_ended > rounds_before:
                    self.backoff.reset()  # a round completed: start over from the base
                if self._fatal is not None:
                    raise fatal_error(self.worker.worker_id, self._fatal)
                if not self._shutdown:
                    self._check_give_up(last_ok, "connections closed before authentication",
                                        None)
                    await self._backoff_sleep()
        finally:
            self._timer.cancel()
            if self._conn is not None:
                self._conn.abort()

    async def _backoff_sleep(self) -> None:
        delay = self.backoff.next_delay()
        self.delays.append(delay)
        await self._sleep(delay)

    def _check_give_up(self, last_ok: float, why: str, exc: BaseException | None) -> None:
        """Raise ``ConnectionError`` when no authenticated session for ``give_up_after_s``,
        naming the last unauthenticated close reason if there was one."""
        if time.monotonic() - last_ok <= self._give_up:
            return
        pre = self.worker.last_preauth
        detail = f"; last unauthenticated answer: {pre}" if pre else ""
        raise ConnectionError(
            f"worker {self.worker.worker_id}: PS {self.host}:{self.port} unreachable or "
            f"refusing authentication for {self._give_up} s ({why}{detail})"
        ) from exc

    def _protocol(self) -> FramedConnection:
        # frames from the PS: arrays are models of bounded size; the PS is who we chose to
        # trust, but a confused PS still must not make us allocate without bound
        return FramedConnection(self._on_message, self._on_close, limits=DEFAULT_LIMITS,
                                on_made=self._conn_made)

    def _conn_made(self, conn: FramedConnection) -> None:
        assert self._loop is not None
        self._conn = conn
        self._closed = self._loop.create_future()
        self.worker.connection_made(now=self._now())
        self._pump()

    def _on_message(self, conn: FramedConnection, msg: Message,
                    now: float | None = None) -> None:
        """A frame from the PS; ``now``: when it arrived, if earlier than now (a worker host
        handing on the frames of one read)."""
        if conn is not self._conn:
            return
        w = self.worker
        w.receive("ps", msg, now=self._clock() if now is None else now)
        polled = w.poll()
        if w.session is not None and conn is not self._tagged and not conn.authenticated:
            # a verified welcome: every frame after it, both ways, is tagged
            conn.set_auth(send=w.session.worker_to_ps, recv=w.session.ps_to_worker)
            self._tagged = conn  # asked once per connection, not per frame (a property)
        self._pump(polled)

    def _on_close(self, conn: FramedConnection, exc: BaseException | None) -> None:
        if conn is not self._conn:
            return
        if self._uplink is not None:
            self._uplink.cancel()
            self._uplink = None
        self.worker.connection_lost(now=self._now())
        self._pump()
        self._conn = None
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def _on_loop_timer(self) -> None:
        assert isinstance(self._timer, _Timer)
        self._on_timer(self._timer.due_at)

    def _on_timer(self, now: float | None = None) -> None:
        """The loop timer (or a host's scheduler, with the time the wake-up counts as)."""
        self.worker.handle_timer(now=self._clock() if now is None else now)
        self._pump()

    def _setup(self, ev: SetupNeeded) -> None:
        """Scheme and task for ``ev.config``: from the cache at once, else built in an
        executor thread (a slow build never blocks the loop, the timers or other workers)."""
        w = self.worker
        if w.setup_fn is not None:
            self._setup_done(ev, lambda: w.setup_fn(ev.config))  # type: ignore[misc]
            return
        hit = self.setups.peek(ev.config)
        if hit is not None:
            self._setup_done(ev, lambda: self.setups.get(ev.config))
            return
        assert self._loop is not None
        fut = self._loop.run_in_executor(None, self.setups.get, ev.config)
        conn = self._conn

        def done(f: asyncio.Future[Any]) -> None:
            if self._conn is not conn or f.cancelled():
                return  # that connection is gone; the next welcome asks again (cached)
            self._setup_done(ev, f.result)
            self._pump()

        fut.add_done_callback(done)

    def _setup_done(self, ev: SetupNeeded, get: Callable[[], Any]) -> None:
        w = self.worker
        try:
            setup = get()
        except Exception as exc:  # reported to the PS, fatal for this worker
            code, reason = setup_error_code(exc)
            w.setup_failed(code, reason, now=self._now())
            return
        w.setup_ready(setup, now=self._now())

    def _pump(self, polled: Polled | None = None) -> None:
        """Flush, answer events and work until the worker core is quiet; ``polled``: the
        result of the poll the last core call made (``*_and_poll``)."""
        w = self.worker
        if polled is None:
            polled = w.poll()
        while True:
            # one poll per iteration: frames, events, work and the deadline at once
            events, work, outbox, when = polled
            if outbox:
                conn, out = self._conn, outbox[0]
                if len(outbox) == 1 and conn is not None and self._uplink is None \
                        and out.message is not None and not out.close:
                    conn.queue(out.message)  # _flush's common case (one frame), inlined
                    conn.flush()
                else:
                    self._flush(outbox)
            progressed = self._on_events(events) if events else False
            if work:
                # the answer to the last item comes back with the poll that follows it
                polled = self._run_work(work)
                continue
            # nothing answered since the poll that drained every queue: nothing new
            if not progressed:
                break
            polled = w.poll()
        if self._timer is not None:
            self._timer.arm(when if self._conn is not None else None)

    def _flush(self, outbox: Sequence[Outgoing]) -> None:
        conn = self._conn
        if conn is None:
            return
        sink = conn if self._uplink is None else self._uplink  # shaped: aiogc.net.shaping
        for out in outbox:
            if out.message is not None:
                sink.queue(out.message)
            if out.close:
                sink.close()
        conn.flush()

    def _on_events(self, events: Sequence[Event]) -> bool:
        """Act on the worker's events; True if one was answered (the core has news)."""
        progressed = False
        for ev in events:
            if isinstance(ev, ShutdownRequested):
                self._shutdown = True
            elif isinstance(ev, Welcomed):
                self._welcomed = True
                setup = self.worker.setup
                self._uplink = shaped_send(self._conn, None if setup is None else setup.config,
                                           "up", self._loop, self._clock)
            elif isinstance(ev, ConnectionFailed):
                if ev.fatal:
                    self._fatal = ev
                elif ev.code.startswith("preauth_") and not self._preauth_said:
                    # once per client: a squatter (or a PS refusing our key) answers every
                    # retry the same way; the count is in worker.stats["preauth_close"]
                    self._preauth_said = True
                    log.warning("worker %d: %s; retrying with backoff (give up after %g s "
                                "without an authenticated session)", self.worker.worker_id,
                                ev.reason, self._give_up)
            elif isinstance(ev, SetupNeeded):
                self._setup(ev)
                progressed = True
            if self._on_event is not None:
                self._on_event(ev)
        return progressed

    def _run_work(self, work: Sequence[ComputeChunks | EncodeVector]) -> Polled:
        """Compute the gradients and encode the vectors the core asked for (a fresh ``now``
        after each item); returns the poll that follows the last answer."""
        w = self.worker
        setup = w.setup
        assert setup is not None
        fn = setup.chunk_gradient
        rows = self._rows
        for item in work:
            try:
                if isinstance(item, EncodeVector):
                    w.encode_done(item, encode_vector(item, setup.config, rows),
                                  now=self._clock())
                    continue
                # map, not a comprehension: the same calls without a frame per item
                grads = rows.store(item.first, list(map(fn, item.chunks, repeat(item.model))))
            except Exception as exc:  # the core closes with the reason
                w.work_failed(exc, now=self._clock())
            else:
                w.chunks_done(item.round, item.first, grads, now=self._clock())
        return w.poll()
