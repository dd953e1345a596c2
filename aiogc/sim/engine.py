"""Drive the protocol core on a virtual clock.

A heap of timed actions with a deterministic tie-break (time, then insertion order) feeds the
*same* :class:`~aiogc.core.ParameterServer` and :class:`~aiogc.core.Worker` objects the asyncio
driver uses. Links are FIFO: a frame never overtakes an earlier frame on the same link.
Network latency per frame comes from ``latency`` (seconds, or a callable) plus, when
``bandwidth_Bps`` is set, the array bytes divided by the bandwidth.

Faults: :meth:`Simulation.kill` (connection reset, seen at once by the PS) or
``kill(..., silent=True)`` (a paused process: only the heartbeat notices).

Application work takes no virtual time: chunk gradients are computed inline when a worker
asks (``next_work``), scheme and task are built (once per configuration, shared by every
worker) when a worker needs them, and the PS's decode runs at the instant the round ends.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from aiogc.core import (
    PS_PEER,
    ComputeChunks,
    ConnectionFailed,
    EncodeVector,
    Event,
    Finished,
    Outgoing,
    ParameterServer,
    SetupNeeded,
    ShutdownRequested,
    Worker,
)
from aiogc.core.worker import Polled
from aiogc.errors import ConfigError
from aiogc.protocol.messages import Message
from aiogc.training.encode import encode_vector
from aiogc.training.setup import SetupCache, TaskPolicy, setup_error_code

LatencyFn = Callable[[int, str, Message], float]
#: ``(service_s(msg), latency_s)`` of a shared PS ingress: seconds a worker->PS frame occupies it,
#: and the one-way latency after it.
Ingress = tuple[Callable[[Message], float], float]

#: Seconds a worker waits before reconnecting after its connection closed (simulated backoff).
RECONNECT_DELAY_S = 0.5
#: Hard stop for runaway simulations (a bug, not a normal end).
MAX_STEPS_DEFAULT = 50_000_000


def _counter_nonces(salt: int) -> Callable[[], bytes]:
    """Deterministic, distinct 16-byte nonces (a simulation must replay exactly)."""
    counter = itertools.count(1)
    return lambda: (salt * 1_000_003 + next(counter)).to_bytes(16, "big")


@dataclass(frozen=True)
class SimNetwork:
    """How frames travel in a :class:`Simulation`; the default delivers every frame at once.

    Attributes
    ----------
    latency : float or callable
        One-way delay of each frame; a callable gets ``(worker, direction, msg)`` with
        direction ``"up"`` (worker -> PS) or ``"down"``.
    bandwidth_Bps : float, optional
        Adds ``array bytes / bandwidth`` to frames that carry an array.
    ingress : (service_s, latency_s), optional
        A shared FIFO PS ingress: the up-direction delay then means "until the frame reaches
        the ingress"; frames are served in the order they reach it (ties: in send order), each
        for ``service_s(msg)`` seconds, and arrive ``latency_s`` after their service ends.
        Frames that overlap share it; a frame's arrival is known only once it reached the
        ingress (a later send may reach it first), hence the extra action.
    """

    latency: float | LatencyFn = 0.0
    bandwidth_Bps: float | None = None
    ingress: Ingress | None = None


NO_NETWORK_DELAY: Final = SimNetwork()


class Simulation:
    """One PS and m workers wired back to back on a virtual clock.

    Parameters
    ----------
    ps : ParameterServer
    workers : list of Worker
        ``workers[j].worker_id == j``.
    network : SimNetwork, optional
        How frames travel (default: instantly; its fields are described on
        :class:`SimNetwork`).
    progress_events : bool
        Keep the workers' telemetry events (``ChunkComputed``, ``CodedSent``, ``RoundEnded``) in
        :attr:`worker_events`. Off by default: nothing in a simulation reads them, and they
        are most of the objects a worker core builds (sets ``Worker.progress_events``).
    """

    def __init__(
        self,
        ps: ParameterServer,
        workers: list[Worker],
        *,
        network: SimNetwork = NO_NETWORK_DELAY,
        start_time: float = 0.0,
        reconnect: bool = True,
        setups: SetupCache | None = None,
        progress_events: bool = False,
    ) -> None:
        if ps.aggregator is None:
            raise ConfigError("aggregator", None, "a PS built with its aggregator (make_ps)")
        self.ps = ps
        #: runs the PS's work items (``ps.aggregator``)
        self.aggregator = ps.aggregator
        self.workers = workers
        # the simulated workers run the PS's own configuration: its task is theirs to build
        self._setups = setups or SetupCache(TaskPolicy(task=ps.config.task))
        if ps.nonce_fn is None:
            ps.nonce_fn = _counter_nonces(1_000_000)
        for w in workers:
            w.progress_events = progress_events
            if w.nonce_fn is None:
                w.nonce_fn = _counter_nonces(w.worker_id)
        self.now = start_time
        self._latency = network.latency
        self._bandwidth = network.bandwidth_Bps
        self._ingress = network.ingress
        self._ingress_free = start_time
        self._reconnect = reconnect
        self._heap: list[tuple[float, int, Callable[[float], None]]] = []
        self._seq = itertools.count()
        self._ps_timer: float | None = None
        #: per worker, the (deadline, connection generation) its timer is armed for
        self._w_timer: dict[int, tuple[float, int] | None] = {}
        self._gen: dict[int, int] = {}  # connection generation per worker
        self._link_free: dict[tuple[int, str], float] = {}
        self._dead: set[int] = set()
        self._paused: set[int] = set()
        self.ps_events: list[Event] = []
        self.worker_events: dict[int, list[Event]] = {w.worker_id: [] for w in workers}
        self.finished = False
        self.frames = 0
        self._started = False

    # ------------------------------------------------------------------ public

    def start(self) -> None:
        """Start the PS (its join deadline runs from now) and open every worker's connection."""
        self._started = True
        self.ps.start(now=self.now)
        self._pump_ps(self.now)
        for w in self.workers:
            self._connect(w.worker_id, self.now)

    def run(self, *, until: float | None = None, max_steps: int = MAX_STEPS_DEFAULT) -> None:
        """Process actions until the PS finished, ``until``, or nothing is left."""
        if not self._started:
            self.start()
        steps = 0
        while self._heap and not self.finished:
            if until is not None and self._heap[0][0] > until:
                self.now = until
                return
            t, _, action = heapq.heappop(self._heap)
            if t > self.now:
                self.now = t
            action(self.now)
            steps += 1
            if steps > max_steps:
                raise RuntimeError(f"simulation exceeded {max_steps} steps")

    def kill(self, worker: int, *, at: float, silent: bool = False) -> None:
        """Worker dies at ``at``. ``silent``: no reset reaches the PS (SIGSTOP-like)."""

        def act(now: float) -> None:
            self._dead.add(worker)
            if not silent:
                self.ps.connection_lost(self._peer(worker), now=now)
                self._pump_ps(now)

        self._schedule(at, act)

    def pause(self, worker: int, *, at: float, until: float) -> None:
        """SIGSTOP at ``at``, SIGCONT at ``until``: frames to it wait; it does nothing."""

        def stop(now: float) -> None:
            self._paused.add(worker)

        def cont(now: float) -> None:
            self._paused.discard(worker)
            self._pump_worker(worker, now)

        self._schedule(at, stop)
        self._schedule(until, cont)

    # ------------------------------------------------------------------ plumbing

    def _schedule(self, t: float, action: Callable[[float], None]) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), action))

    def _peer(self, worker: int) -> Hashable:
        return (worker, self._gen.get(worker, 0))

    def _connect(self, worker: int, now: float) -> None:
        self._gen[worker] = self._gen.get(worker, -1) + 1
        self.workers[worker].connection_made(now=now)
        self.ps.connection_made(self._peer(worker), now=now)
        self._pump_ps(now)
        self._pump_worker(worker, now)

    def _delay(self, worker: int, direction: str, msg: Message | None) -> float:
        lat = self._latency
        d = lat(worker, direction, msg) if callable(lat) and msg is not None else (
            0.0 if callable(lat) else float(lat)
        )
        if self._bandwidth and msg is not None:
            arr = msg.array()
            if arr is not None:
                d += arr.nbytes / self._bandwidth
        return d

    def _arrival(self, worker: int, direction: str, now: float, msg: Message | None) -> float:
        t = now + self._delay(worker, direction, msg)
        key = (worker, direction)
        t = max(t, self._link_free.get(key, 0.0))  # FIFO per link
        self._link_free[key] = t
        return t

    def _pump_ps(self, now: float, polled: tuple[Any, ...] | None = None) -> None:
        """Flush the PS; ``polled``: the result of the poll the last core call made."""
        ps = self.ps
        while True:
            # one poll per stage: outbox, then (when no application work is queued) the
            # events and the timer deadline
            out, events, t = ps.poll() if polled is None else polled
            polled = None
            closed = False
            for o in out:
                self._route_down(o, now)
                closed = closed or o.close
            if events is None:
                # the PS's application work, answered at the same virtual instant
                item = ps.next_work()
                assert item is not None
                ps.work_done(item, self.aggregator.run(item), now=now)
                continue
            if closed:
                # routing a close told the PS the connection is lost (its events count in
                # this pump, its frames leave in the next, as before poll existed)
                events = [*events, *iter(ps.next_event, None)]
                t = ps.next_deadline()
            break
        for ev in events:
            self.ps_events.append(ev)
            if isinstance(ev, Finished):
                self.finished = True
        if t is not None and t != self._ps_timer:
            self._ps_timer = t
            self._schedule(max(t, now), self._ps_timer_fired(t))

    def _ps_timer_fired(self, armed: float) -> Callable[[float], None]:
        def act(now: float) -> None:
            if self._ps_timer != armed:
                return  # re-armed since
            self._ps_timer = None
            self.ps.handle_timer(now=now)
            self._pump_ps(now)

        return act

    def _route_down(self, out: Outgoing, now: float) -> None:
        peer = out.peer
        assert isinstance(peer, tuple)
        worker, gen = peer
        t = self._arrival(worker, "down", now, out.message)
        if out.message is not None:
            msg = out.message
            self.frames += 1

            def deliver(at: float, msg: Message = msg) -> None:
                if worker in self._dead or self._gen.get(worker) != gen:
                    return
                if worker in self._paused:
                    self._schedule(at + 1e-3, deliver)
                    return
                w = self.workers[worker]
                w.receive(PS_PEER, msg, now=at)
                self._pump_worker(worker, at, w.poll())

            self._schedule(t, deliver)
        if out.close:
            # the PS closed this connection: the PS side forgets it now, the worker sees EOF
            self.ps.connection_lost(peer, now=now)

            def eof(at: float) -> None:
                if worker in self._dead or self._gen.get(worker) != gen:
                    return
                if worker in self._paused:  # a stopped process sees the EOF when it resumes
                    self._schedule(at + 1e-3, eof)
                    return
                self._worker_lost(worker, at)

            self._schedule(t, eof)

    def _worker_lost(self, worker: int, now: float) -> None:
        w = self.workers[worker]
        w.connection_lost(now=now)
        self._pump_worker(worker, now)
        if self._reconnect and not self.finished and worker not in self._dead:
            stopped = any(isinstance(e, ShutdownRequested) for e in self.worker_events[worker])
            if not stopped:
                self._schedule(now + RECONNECT_DELAY_S, self._reconnect_action(worker))

    def _reconnect_action(self, worker: int) -> Callable[[float], None]:
        def act(at: float) -> None:
            if worker in self._dead or self.finished:
                return
            if worker in self._paused:
                self._schedule(at + 1e-3, act)
                return
            self._connect(worker, at)

        return act

    def _pump_worker(self, worker: int, now: float, polled: tuple[Any, ...] | None = None
                     ) -> None:
        """Flush worker ``worker``; ``polled``: the result of the poll the last core call
        made."""
        if worker in self._dead or worker in self._paused:
            return
        w = self.workers[worker]
        gen = self._gen[worker]
        closing = False
        failed = False
        if polled is None:
            polled = w.poll()
        while True:
            # one poll per iteration: events, work, frames and the deadline at once; answering
            # an event or a work item needs another poll (it may queue frames and moves the
            # deadline); the last work item's answer comes back with the poll after it
            evs, work, out, due = polled
            progressed = False
            if evs:
                failed_now, progressed = self._worker_events(w, evs, now)
                failed = failed or failed_now
            if out:
                closing = self._route_up(worker, gen, out, now) or closing
            if work:
                polled = self._run_work(w, work, now)
            elif progressed:
                polled = w.poll()
            else:
                break
        if closing and failed:
            self._worker_lost(worker, now)
            return
        if due is not None and (due, gen) != self._w_timer.get(worker):
            self._w_timer[worker] = (due, gen)
            self._schedule(max(due, now), self._w_timer_fired(worker, due, gen))

    def _worker_events(self, w: Worker, evs: Sequence[Event], now: float
                       ) -> tuple[bool, bool]:
        """Record a worker's events and answer a SetupNeeded; ``(failed, answered)``."""
        events = self.worker_events[w.worker_id]
        failed = answered = False
        for ev in evs:
            events.append(ev)
            if isinstance(ev, ConnectionFailed):
                failed = True
            elif isinstance(ev, SetupNeeded):
                self._setup(w, ev, now)
                answered = True
        return failed, answered

    def _run_work(self, w: Worker, work: Sequence[ComputeChunks | EncodeVector], now: float
                  ) -> Polled:
        """Compute the chunk gradients and encode the vectors asked for (no virtual time
        passes); the poll that follows the last answer."""
        setup = w.setup
        assert setup is not None
        fn = setup.chunk_gradient
        for item in work:
            try:
                if isinstance(item, EncodeVector):
                    w.encode_done(item, encode_vector(item, setup.config), now=now)
                    continue
                grads = [fn(c, item.model) for c in item.chunks]
            except Exception as exc:  # the worker closes with the reason, reconnects
                w.work_failed(exc, now=now)
            else:
                w.chunks_done(item.round, item.first, grads, now=now)
        return w.poll()

    def _route_up(self, worker: int, gen: int, outbox: Sequence[Outgoing], now: float
                  ) -> bool:
        """Schedule ``outbox`` towards the PS; True if it closes the connection."""
        closing = False
        for out in outbox:
            t = self._arrival(worker, "up", now, out.message)
            if out.message is not None:
                msg = out.message
                self.frames += 1

                def deliver(at: float, msg: Message = msg, gen: int = gen) -> None:
                    if self._gen.get(worker) != gen or worker in self._dead:
                        return
                    self.ps.receive((worker, gen), msg, now=at)
                    self._pump_ps(at, self.ps.poll())

                self._schedule(t, deliver if self._ingress is None
                               else self._through_ingress(msg, deliver))
            if out.close:
                closing = True

                def eof(at: float, gen: int = gen) -> None:
                    if self._gen.get(worker) == gen:
                        self.ps.connection_lost((worker, gen), now=at)
                        self._pump_ps(at)

                self._schedule(t, eof if self._ingress is None
                               else self._through_ingress(None, eof))
        return closing

    def _through_ingress(self, msg: Message | None, then: Callable[[float], None]
                         ) -> Callable[[float], None]:
        """The action of a frame reaching the shared ingress: queue, serve, then ``then``
        (an EOF, ``msg`` None, takes no service but keeps its place behind the frames)."""
        assert self._ingress is not None
        service, lat = self._ingress

        def enter(at: float) -> None:
            start = max(at, self._ingress_free)
            self._ingress_free = start + (service(msg) if msg is not None else 0.0)
            self._schedule(self._ingress_free + lat, then)

        return enter

    def _w_timer_fired(self, worker: int, armed: float, gen: int) -> Callable[[float], None]:
        def act(now: float) -> None:
            if self._w_timer.get(worker) != (armed, gen) or self._gen.get(worker) != gen:
                return
            if worker in self._dead:
                return
            if worker in self._paused:
                self._schedule(now + 1e-3, act)
                return
            self._w_timer[worker] = None
            w = self.workers[worker]
            w.handle_timer(now=now)
            self._pump_worker(worker, now, w.poll())

        return act

    def _setup(self, w: Worker, ev: SetupNeeded, now: float) -> None:
        try:
            setup = w.setup_fn(ev.config) if w.setup_fn is not None else self._setups.get(
                ev.config)
        except Exception as exc:  # the worker reports it and closes
            code, reason = setup_error_code(exc)
            w.setup_failed(code, reason, now=now)
            return
        w.setup_ready(setup, now=now)

    # ------------------------------------------------------------------ results

    @property
    def records(self) -> list[Any]:
        return self.ps.records
