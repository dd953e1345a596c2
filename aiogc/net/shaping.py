"""Live traffic shaping: the communication model of :mod:`aiogc.sim.comm`, on real sends.

A live run with ``RunConfig.bandwidth`` (``aiogc run --bandwidth worker=10MB/s,ps=1GB/s``)
holds every frame back until an emulated link has carried it, with the timing rule of the
simulators, so that ``aiogc simulate --delay replay:RUN/delays.csv --bandwidth SPEC`` (and the
run's own fidelity section) predicts the live round times:

* **per-worker uplink** (``worker_up``): shaped by the *worker* on its own send path. A frame
  of ``b`` bytes handed over at ``now`` leaves at ``e = max(now, e_prev) + b K / rate`` and is
  written to the socket then (FIFO: a frame waits for the ones before it).
* **per-worker downlink** (``worker_down``): shaped likewise by the PS, one link per worker
  connection (the PS has no egress limit of its own, as in the model).
* **shared PS ingress** (``ps``): one FIFO serialiser on the PS's receive path fed by every
  worker's frames in order of arrival (store-and-forward at frame granularity, as in the
  fast path); a frame reaches the PS core once the ingress has carried it.

``K`` is the run's time scale (``--time-scale``): rates are bytes per *emulated* second, so a
dilated run's frames take K times longer in wall time and its records (emulated seconds,
wall / K) carry exactly the model's wire time. Frames are charged their untagged size (the
wire codec's bytes, as :class:`~aiogc.sim.comm.FrameBytes` counts them; a tag adds 16 bytes
that neither simulator charges). Shaping starts after the handshake (the worker once
welcomed, the PS once its welcome is queued), so authentication is never delayed and the
frames the model charges (round start, reports, encode request, coded vectors) all cross it.

Timer granularity: uvloop's timers have millisecond resolution, so a frame due less than
:data:`SLACK_S` (wall) from now is written at once instead of costing a loop timer that would
fire up to a millisecond late; the link's clock still advances by the frame's whole
serialisation time, so later frames are charged exactly. Choose ``--time-scale`` so that a
millisecond is small against the emulated round (the fidelity section says when it is not).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Generic, Protocol, TypeVar

from aiogc.config import RunConfig
from aiogc.errors import ConfigError
from aiogc.net.loops import MONOTONIC, Clock, _Timer
from aiogc.protocol.messages import Message
from aiogc.protocol.wire import encode_frame

__all__ = ["SLACK_S", "Link", "ShapedQueue", "ShapedSend", "ingress_queue", "link_for",
           "release_all", "shaped_send"]

#: A frame due this close to now (wall seconds) is released at once (see the module docstring).
SLACK_S = 5e-4

T = TypeVar("T")


class TimerLike(Protocol):
    """What :class:`ShapedQueue` needs of a timer: ``arm(when)`` on the queue's clock
    (``None``: disarm) and ``cancel()``; :class:`~aiogc.net.loops._Timer` in the drivers."""

    def arm(self, when: float | None) -> None: ...

    def cancel(self) -> None: ...


class Link:
    """A FIFO serialiser of ``rate_Bps`` bytes per emulated second at time scale ``K``.

    Parameters
    ----------
    rate_Bps : float
        Bytes per emulated second (> 0).
    time_scale : float
        K >= 1: one emulated second lasts K wall seconds.
    """

    __slots__ = ("free", "sec_per_byte")

    def __init__(self, rate_Bps: float, time_scale: float = 1.0) -> None:
        if not rate_Bps > 0 or not time_scale >= 1.0:
            raise ConfigError("bandwidth", (rate_Bps, time_scale), "a rate > 0 and K >= 1")
        #: wall seconds per byte
        self.sec_per_byte = float(time_scale) / float(rate_Bps)
        #: when the link finished its last frame (wall clock); -inf: idle since creation
        self.free = float("-inf")

    def exit(self, now: float, nbytes: int) -> float:
        """When a frame of ``nbytes`` handed over at ``now`` has left the link (and take it)."""
        e = max(now, self.free) + nbytes * self.sec_per_byte
        self.free = e
        return e


def link_for(rate_Bps: float | None, time_scale: float) -> Link | None:
    """A :class:`Link` for a finite rate, ``None`` for an unlimited one."""
    return None if rate_Bps is None else Link(rate_Bps, time_scale)


class ShapedQueue(Generic[T]):
    """Items released in FIFO order, each once its link has carried it.

    Parameters
    ----------
    link : Link
    deliver : callable
        ``deliver(item)`` when the item has crossed the link.
    make_timer : callable
        ``make_timer(fire)`` returns a :class:`TimerLike` that calls ``fire()`` once its armed
        time has come (the drivers pass ``lambda f: _Timer(loop, f)``; tests a fake).
    clock : callable
        The timer's time line (the driver's clock).
    after : callable, optional
        Called once after each batch of deliveries (the drivers flush the socket there).
    """

    def __init__(self, link: Link, deliver: Callable[[T], None],
                 make_timer: Callable[[Callable[[], None]], TimerLike],
                 clock: Callable[[], float], after: Callable[[], None] | None = None) -> None:
        self.link = link
        self._deliver = deliver
        self._after = after
        self._clock = clock
        self._q: deque[tuple[float, T]] = deque()
        self._timer = make_timer(self._fire)
        #: frames and bytes that crossed the link (and the wall seconds they waited in it)
        self.frames = 0
        self.bytes = 0
        self.held_s = 0.0

    def __len__(self) -> int:
        return len(self._q)

    def put(self, item: T, nbytes: int, now: float | None = None) -> bool:
        """Hand ``item`` (``nbytes`` on the wire) to the link at ``now`` (default: the clock).

        Returns True if it was delivered at once (the caller then completes the batch, e.g.
        flushes), False if it waits for the link.
        """
        t = self._clock() if now is None else now
        e = self.link.exit(t, nbytes)
        self.frames += 1
        self.bytes += nbytes
        self.held_s += e - t
        if not self._q and e <= t + SLACK_S:
            self._deliver(item)
            return True
        self._q.append((e, item))
        if len(self._q) == 1:
            self._timer.arm(e)
        return False

    def _fire(self) -> None:
        q = self._q
        due = self._clock() + SLACK_S
        n = 0
        while q and q[0][0] <= due:
            self._deliver(q.popleft()[1])
            n += 1
        if n and self._after is not None:
            self._after()
        self._timer.arm(q[0][0] if q else None)

    def release_all(self) -> None:
        """Deliver every waiting item now, in order (the run is ending: its last frames, e.g.
        shutdown, must not wait for a link whose timer will not fire again)."""
        n = len(self._q)
        while self._q:
            self._deliver(self._q.popleft()[1])
        self._timer.cancel()
        if n and self._after is not None:
            self._after()

    def cancel(self) -> list[T]:
        """Stop: drop the waiting items (returned) and the timer (a closed connection)."""
        items = [it for _, it in self._q]
        self._q.clear()
        self._timer.cancel()
        return items

    def stats(self) -> dict[str, Any]:
        """``frames``, ``bytes`` and ``held_s`` (wall seconds frames spent in the link)."""
        return {"frames": self.frames, "bytes": self.bytes, "held_s": self.held_s}


class ShapedSend:
    """One connection's send path through a :class:`Link`: ``queue`` / ``close`` as on the
    ``FramedConnection`` it wraps, but frames and a close leave in the order given, each once
    the link has carried it. The caller flushes after its batch as before (frames released
    later are flushed by the queue itself).

    Parameters
    ----------
    conn : FramedConnection
    link : Link
    loop : asyncio event loop (for the link's timer)
    clock : callable
        The driver's clock.
    """

    def __init__(self, conn: Any, link: Link, loop: Any, clock: Clock = MONOTONIC) -> None:
        self.conn = conn
        self.link_queue: ShapedQueue[tuple[Message | None, Any]] = ShapedQueue(
            link, self._deliver, lambda fire: _Timer(loop, fire, clock=clock), clock,
            after=conn.flush)

    def _deliver(self, item: tuple[Message | None, Any]) -> None:
        msg, parts = item
        if msg is None:
            self.conn.close()
        else:
            self.conn.queue(msg, parts)

    def queue(self, msg: Message, parts: list[Any] | None = None) -> int:
        """Hand ``msg`` (``parts``: its ``encode_frame`` output, if already encoded) to the
        link, as ``FramedConnection.queue``; returns its untagged size in bytes."""
        if parts is None:
            parts = encode_frame(msg)
        nbytes = sum(len(p) if isinstance(p, bytes) else memoryview(p).nbytes for p in parts)
        self.link_queue.put((msg, parts), nbytes)
        return nbytes

    def close(self) -> None:
        """Close the connection once every frame handed over before has left."""
        self.link_queue.put((None, None), 0)

    def release_all(self) -> None:
        self.link_queue.release_all()

    def cancel(self) -> None:
        self.link_queue.cancel()


def shaped_send(conn: Any, config: RunConfig | None, direction: str,
                loop: Any, clock: Clock = MONOTONIC) -> ShapedSend | None:
    """The shaped send path of ``conn`` for ``direction`` ``"up"`` (a worker's) or
    ``"down"`` (the PS's to one worker) under ``config.bandwidth``; ``None`` when that link is
    unlimited (the connection is then used directly, byte-identical to an unshaped run)."""
    if config is None or not config.bandwidth:
        return None
    comm = config.comm
    link = link_for(comm.up_Bps if direction == "up" else comm.down_Bps, config.time_scale)
    return None if link is None else ShapedSend(conn, link, loop, clock)


def ingress_queue(config: RunConfig, deliver: Callable[[T], None],
                  loop: Any, clock: Clock = MONOTONIC) -> ShapedQueue[T] | None:
    """The PS's shared ingress under ``config.bandwidth`` (``ps=``): frames go to
    ``deliver`` once it has carried them; ``None`` without one."""
    link = link_for(config.comm.ps_Bps, config.time_scale) if config.bandwidth else None
    return None if link is None else ShapedQueue(
        link, deliver, lambda f: _Timer(loop, f, clock=clock), clock)


def release_all(sends: Iterable[ShapedSend | None]) -> None:
    """:meth:`ShapedSend.release_all` on every shaped connection (the run is ending)."""
    for s in sends:
        if s is not None:
            s.release_all()
