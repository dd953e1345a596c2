"""One framed connection over an asyncio transport: bytes <-> messages, nothing more.

Invariants
----------
* Receive is zero-copy for array bodies: :class:`FramedConnection` is an
  ``asyncio.BufferedProtocol`` whose ``get_buffer`` is the
  :class:`~aiogc.protocol.wire.FrameDecoder`'s,
  so a payload is received straight into the array ``alloc`` chose (e.g. the PS's row for this
  worker).
* Send never copies the array on uvloop: the header and a memoryview of the array are written
  separately. Consequence: **the sender must not mutate an array it has sent until
  :meth:`FramedConnection.drain` returned** (the transport may still be reading it).
* ``on_close(conn, exc)`` is called exactly once, from ``connection_lost``; ``exc`` is the
  :class:`~aiogc.errors.RemoteProtocolError` that made us close (MalformedFrame, slow consumer,
  an error raised by ``on_message``...), else the transport's error, else None (a clean EOF
  from the peer, or our own :meth:`FramedConnection.close`).
* After a close decision no further message is delivered and ``send`` is a no-op.
* Writes are bounded: once the transport's write buffer exceeds ``max_pending_bytes`` the peer
  is a slow consumer and the connection is aborted (no Error frame: it would not be read).
  A close is a lingering close: half-close (FIN after the buffered bytes), then discard what
  the peer still sends until its EOF, so that our last frames (Shutdown, Error) are not
  destroyed by an RST; a closing connection whose peer does not drain or does not close
  within ``close_timeout_s`` is aborted.

* Frame tags (since protocol v2): once :meth:`FramedConnection.set_auth` gave a direction a session
  key, every frame sent is tagged and every frame received must carry a valid tag; a bad tag
  closes the connection (``bad_tag``) before the message is delivered.
* :meth:`FramedConnection.queue` + :meth:`FramedConnection.flush`: everything queued for the
  peer in one pump leaves in one write (small parts joined; large arrays written from their
  memoryview, never copied).

No protocol logic here: the core decides what messages mean (and derives the keys).

Known imperfections: the Error frame before a close is best effort (a peer that neither reads
nor closes within ``close_timeout_s`` is aborted, and the abort's RST may destroy it). The 3.11
default loop copies the unsent rest of every large write (into its bytearray write buffer):
prefer uvloop for big payloads. A per-frame read deadline (slowloris) and write deadlines are
the caller's timers: see ``FrameDecoder.at_frame_boundary`` and :meth:`FramedConnection.drain`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, cast

from aiogc.errors import MalformedFrame, RemoteProtocolError
from aiogc.protocol.headers import DEFAULT_LIMITS, FrameLimits
from aiogc.protocol.messages import Error, Message
from aiogc.protocol.tags import ONESHOT_BELOW, TAG_BYTES, FrameAuth
from aiogc.protocol.wire import AllocFn, FrameDecoder, HostPreamble, encode_frame

__all__ = ["FramedConnection", "WriteFlow"]

#: Default slow-consumer cut-off: a little more than two of the largest default frames may be
#: queued (a broadcast still draining while the next one is sent); beyond that the peer is not
#: reading and the PS must not buffer for it without bound.
MAX_PENDING_BYTES: Final = 2 * DEFAULT_LIMITS.max_array_bytes + (1 << 20)
#: Frames up to this size are joined into one write (header + array): a copy of a few KiB
#: is cheaper than a second syscall and wake-up; larger payloads are written from a memoryview.
JOIN_BELOW_BYTES: Final = 64 * 1024
#: Frames up to this size are queued as one buffer and tagged in one call.
_SMALL_FRAME: Final = min(JOIN_BELOW_BYTES, ONESHOT_BELOW)
#: Write-buffer high-water mark: pause_writing above it (drain() then waits).
WRITE_HIGH_WATER: Final = 256 * 1024
#: Low-water mark: drain() returns once the buffer is at or below it.
WRITE_LOW_WATER: Final = 64 * 1024
#: A closing connection whose peer does not take our last bytes is aborted after this long.
CLOSE_TIMEOUT_S: Final = 1.0


@dataclass(frozen=True, slots=True)
class WriteFlow:
    """Write-side flow control of one connection: the transport's write-buffer marks
    (``pause_writing`` above ``high_water``; ``drain()`` returns at or below ``low_water``) and
    how long a closing connection waits for the peer to take its last bytes before aborting.
    """

    high_water: int = WRITE_HIGH_WATER
    low_water: int = WRITE_LOW_WATER
    close_timeout_s: float = CLOSE_TIMEOUT_S


#: Longest reason text put into an Error frame (messages.MAX_TEXT is the hard bound).
_MAX_REASON: Final = 200

OnMessage = Callable[["FramedConnection", Message], None]
OnClose = Callable[["FramedConnection", "BaseException | None"], None]
OnMade = Callable[["FramedConnection"], None]
#: ``on_host(conn, rest)``: the peer opened with a worker host's preamble (``rest``: the bytes
#: buffered from it on); the callee takes the connection over with :meth:`FramedConnection.adopt`
OnHost = Callable[["FramedConnection", bytes], None]
#: ``alloc(conn, kind, header_fields, dtype, n)``: like :data:`~aiogc.protocol.wire.AllocFn`,
#: with the
#: connection passed in (so that no per-connection closure is needed)
ConnAllocFn = Callable[["FramedConnection", str, dict[str, Any], Any, int], Any]


class FramedConnection(asyncio.BufferedProtocol):
    r"""Protocol for one TCP connection carrying aiogc frames.

    Parameters
    ----------
    on_message : called as ``on_message(conn, msg)`` for every decoded message, in order. If it
        raises :class:`RemoteProtocolError`, the connection is closed with that error's code.
    on_close : called once as ``on_close(conn, exc)`` when the connection is gone.
    limits : frame limits; raise them with :meth:`set_limits` after authentication.
    alloc : destination allocator for array bodies (see :data:`aiogc.protocol.wire.AllocFn`).
    max_pending_bytes : slow-consumer cut-off on the write buffer.
    on_made : called as ``on_made(conn)`` once the transport is up (no subclass needed).
    conn_alloc : like ``alloc``, called with the connection first.
    flow : write-buffer marks and close timeout (default :class:`WriteFlow`\ ``()``).
    on_host : called as ``on_host(conn, rest)`` when the peer's first bytes are a worker host's
        preamble (aiogc.protocol.hostmux); None: such bytes are ``header_too_large``.

    Memory: one instance per connection, no class per connection, and every reference cycle
    through the connection (decoder -> allocator -> connection) is broken when it is lost, so
    a closed connection is freed by reference counting, without waiting for the cyclic GC;
    its 64 KiB header buffer is released at once.
    """

    def __init__(
        self,
        on_message: OnMessage,
        on_close: OnClose,
        limits: FrameLimits = DEFAULT_LIMITS,
        alloc: AllocFn | None = None,
        *,
        max_pending_bytes: int = MAX_PENDING_BYTES,
        on_made: OnMade | None = None,
        conn_alloc: ConnAllocFn | None = None,
        flow: WriteFlow | None = None,
        on_host: OnHost | None = None,
    ) -> None:
        self._on_message = on_message
        self._on_close = on_close
        self._on_made = on_made
        if conn_alloc is not None:
            ca = conn_alloc

            def alloc(kind: str, header: dict[str, Any], dtype: Any, n: int) -> Any:
                return ca(self, kind, header, dtype, n)  # cycle broken in connection_lost

        self._decoder = FrameDecoder(limits, alloc)
        self._on_host = on_host
        self._decoder.accept_host = on_host is not None
        #: called at the end of every read (a host link writes what the read's frames caused)
        self._after_read: Callable[[], None] | None = None
        #: written before the Error frame of a close (a host connection's host slot)
        self._error_prefix = b""
        self._max_pending = max_pending_bytes
        flow = flow if flow is not None else WriteFlow()
        self._high, self._low = flow.high_water, flow.low_water
        self._close_timeout_s = flow.close_timeout_s
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False  # a close decision was taken (or the transport is gone)
        self._lost = False
        self._close_exc: BaseException | None = None
        self._abort_handle: asyncio.TimerHandle | None = None
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._scratch = bytearray(4096)  # sink for bytes that arrive after a close decision
        self._send_auth: FrameAuth | None = None
        self._wq: list[bytes | memoryview] = []  # queued, not yet written
        self.peername: Any = None
        self.sockname: Any = None
        #: wire capture (``aiogc.net.pcap``): ``tap(conn, outgoing, data)`` sees every byte
        #: read and written, before decoding / as written; None (default): no capture
        self.tap: Callable[[Any, bool, bytes], None] | None = None
        self._tap_view: memoryview | None = None
        self.frames_in = self.frames_out = 0
        self.bytes_in = self.bytes_out = 0

    # -- asyncio.BufferedProtocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass, but has the same API
        self._transport = cast(asyncio.Transport, transport)
        self._loop = asyncio.get_running_loop()  # connection_made runs as a loop callback
        self.peername = transport.get_extra_info("peername")
        self.sockname = transport.get_extra_info("sockname")
        self._transport.set_write_buffer_limits(high=self._high, low=self._low)
        if self._on_made is not None:
            self._on_made(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._closing:
            buf = memoryview(self._scratch)
        else:
            try:
                buf = self._decoder.get_buffer(sizehint)
            except MalformedFrame:  # poisoned; the close is already under way
                buf = memoryview(self._scratch)
        if self.tap is not None:
            self._tap_view = buf
        return buf

    def buffer_updated(self, nbytes: int) -> None:
        if self.tap is not None and self._tap_view is not None:
            self.tap(self, False, bytes(self._tap_view[:nbytes]))
        if self._closing:
            return
        self.bytes_in += nbytes
        dec = self._decoder
        on_message = self._on_message
        try:
            # One message at a time: each is delivered before the next frame is even parsed,
            # so limits raised or rows allocated by on_message apply to the very next frame.
            batch = dec.buffer_updated(nbytes, max_messages=1)
            msg = batch[0] if batch else None
            while msg is not None:
                self.frames_in += 1
                try:
                    on_message(self, msg)
                except RemoteProtocolError as exc:
                    self._fail(exc)
                    return
                if self._closing:
                    return
                msg = dec.next_message()
        except HostPreamble as exc:
            on_host, self._on_host = self._on_host, None
            assert on_host is not None  # the decoder raises it only with on_host set
            on_host(self, exc.rest)
        except MalformedFrame as exc:
            self._fail(exc)
        if self._after_read is not None:
            self._after_read()

    def eof_received(self) -> bool:
        if not self._closing and not self._decoder.at_frame_boundary():
            self._fail(MalformedFrame("connection closed inside a frame", code="truncated"))
        else:
            self._closing = True
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._closing = True
        if self._abort_handle is not None:
            self._abort_handle.cancel()
            self._abort_handle = None
        self._wake_drainers()
        cause = self._close_exc if self._close_exc is not None else exc
        self._on_close(self, cause)
        # break the cycles through this connection and free its buffers now (the close
        # exception's traceback references this connection's frames)
        self._close_exc = None
        self._decoder.release()
        self._wq = []
        self._on_made = None
        self._transport = None

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_drainers()

    # -- public API ---------------------------------------------------------------------------

    def send(self, msg: Message, parts: list[bytes | memoryview] | None = None) -> int:
        """Send ``msg`` now (:meth:`queue` + :meth:`flush`); returns its wire size."""
        n = self.queue(msg, parts)
        self.flush()
        return n

    def queue(self, msg: Message, parts: list[bytes | memoryview] | None = None) -> int:
        """Queue ``msg`` for the next :meth:`flush`; a no-op once closing. ``parts``: its
        ``encode_frame`` output when the caller already encoded it (a broadcast is encoded
        once for every peer; only the tag differs). Returns the frame's wire size. Do not
        mutate a sent array until :meth:`drain` returned."""
        return self.queue_record(b"", encode_frame(msg) if parts is None else parts,
                                 self._send_auth)

    def queue_record(self, prefix: bytes, parts: list[bytes | memoryview],
                     auth: FrameAuth | None) -> int:
        """Queue ``prefix`` then one frame tagged by ``auth`` (its own session's: the tag covers
        the frame, not the prefix), for a worker host's slot; returns the frame's wire size
        (without the prefix). A no-op once closing.

        A small tagged frame is queued as one buffer (its parts joined: the copy flush makes
        anyway) and tagged in one call; a large one as its parts (the array written from its
        memoryview, the tag streamed over it)."""
        t = self._transport
        if self._closing or t is None or t.is_closing():
            return 0
        self.frames_out += 1
        wq = self._wq
        if prefix:
            wq.append(prefix)
        if auth is None:
            wq += parts
            return len(parts[0]) if len(parts) == 1 else sum(map(len, parts))
        frame: bytes | memoryview | None
        if len(parts) == 1:
            frame = parts[0]
            n = len(frame)
        else:
            n = sum(map(len, parts))
            frame = b"".join(parts) if n <= _SMALL_FRAME else None
        if frame is None or n > _SMALL_FRAME:
            wq += parts
            wq.append(auth.tag(parts))
        else:
            wq.append(frame)
            wq.append(auth.tag_one(frame))
        return n + TAG_BYTES

    def queue_raw(self, data: bytes) -> None:
        """Queue bytes that are not a frame (a host connection's preamble, control records)."""
        if not self._closing and self._transport is not None:
            self._wq.append(data)

    def adopt(self, decoder: FrameDecoder, on_message: OnMessage, on_close: OnClose, *,
              rest: bytes = b"", after_read: Callable[[], None] | None = None,
              error_prefix: bytes = b"") -> None:
        """Take this connection over (a worker host's link): decode with ``decoder`` from
        now on, deliver to ``on_message`` / ``on_close``, call ``after_read`` after every read,
        put ``error_prefix`` before the Error frame of a close; then decode ``rest`` (bytes
        already received), one message at a time as any read."""
        self._decoder = decoder
        self._on_message = on_message
        self._on_close = on_close
        self._after_read = after_read
        self._error_prefix = error_prefix
        src = memoryview(rest)
        while src and not self._closing:
            buf = self.get_buffer(len(src))
            self._tap_view = None  # the capture saw these bytes when they arrived
            k = min(len(buf), len(src))
            buf[:k] = src[:k]
            del buf
            self.bytes_in -= k  # counted when they arrived
            self.buffer_updated(k)
            src = src[k:]

    def set_max_pending_bytes(self, n: int) -> None:
        """Replace the slow-consumer cut-off (a host connection carries many workers' frames)."""
        self._max_pending = n

    def set_error_prefix(self, prefix: bytes) -> None:
        self._error_prefix = prefix

    @property
    def decoder(self) -> FrameDecoder:
        return self._decoder

    def flush(self) -> None:
        """Write everything queued: small parts joined into one write, each large array part
        written from its memoryview (one write per part, not writelines: on the 3.11 default
        loop writelines joins the parts into a new bytes object, i.e. copies the payload)."""
        wq = self._wq
        if not wq:
            return
        self._wq = []
        t = self._transport
        # is_closing: a write that failed (peer reset) closed uvloop's handle before the loop
        # delivers connection_lost, and every later write raises RuntimeError; what was
        # queued for a closing connection is dropped, as queue() drops what comes after
        if t is None or self._lost or t.is_closing():
            return
        total = sum(map(len, wq))
        self.bytes_out += total
        if self.tap is not None:
            self.tap(self, True, b"".join(wq))
        if total <= JOIN_BELOW_BYTES:  # the common case: a few small frames, one write
            t.write(wq[0] if len(wq) == 1 else b"".join(wq))
        else:
            self._write_runs(t, wq)
        pending = t.get_write_buffer_size()
        if pending > self._max_pending:
            exc = RemoteProtocolError(
                f"{pending} bytes unsent exceed {self._max_pending}", code="slow_consumer")
            self._close(exc, abort=True)

    @staticmethod
    def _write_runs(t: asyncio.Transport, wq: list[bytes | memoryview]) -> None:
        run: list[bytes | memoryview] = []
        for part in wq:
            if len(part) <= JOIN_BELOW_BYTES:
                run.append(part)
                continue
            if run:
                t.write(run[0] if len(run) == 1 else b"".join(run))
                run = []
            if t.is_closing():  # the previous write failed and closed it (see flush)
                return
            t.write(part)
        if run and not t.is_closing():
            t.write(run[0] if len(run) == 1 else b"".join(run))

    async def drain(self) -> None:
        """Wait until the write buffer is at or below the low-water mark, or the connection is
        gone (check :meth:`is_closing`). Callers waiting on a peer wrap it in a timeout."""
        if self._lost or not self._paused:
            return
        fut = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(fut)
        try:
            await fut
        finally:
            if fut in self._drain_waiters:
                self._drain_waiters.remove(fut)

    def close(self, code: str | None = None, reason: str = "") -> None:
        """Close gracefully (flush, then FIN), first sending ``Error(code, reason)`` when
        ``code`` is given (best effort). A close we initiate reaches ``on_close`` as None: the
        caller already knows why."""
        self._close(None, error=None if code is None else (code, reason))

    def abort(self) -> None:
        """Drop the connection at once, discarding unsent bytes."""
        self._closing = True
        if self._transport is not None:
            self._transport.abort()

    def set_auth(self, *, send: bytes | None = None, recv: bytes | None = None) -> None:
        """Start tagging frames sent (key ``send``) and/or verifying frames received (key
        ``recv``) from the next frame on in that direction (sequence numbers from 0)."""
        if send is not None:
            self._send_auth = FrameAuth(send)
        if recv is not None:
            self._decoder.auth = FrameAuth(recv)

    @property
    def authenticated(self) -> bool:
        """True once frames sent are tagged."""
        return self._send_auth is not None

    @property
    def last_frame_nbytes(self) -> int:
        """Wire size of the frame most recently delivered to ``on_message``."""
        return self._decoder.last_frame_nbytes

    def set_limits(self, limits: FrameLimits) -> None:
        """Replace the frame limits (e.g. after authentication); applies from the next frame."""
        self._decoder.limits = limits

    @property
    def limits(self) -> FrameLimits:
        return self._decoder.limits

    def is_closing(self) -> bool:
        return self._closing or self._transport is None or self._transport.is_closing()

    def statistics(self) -> dict[str, Any]:
        t = self._transport
        return {
            "frames_in": self.frames_in,
            "frames_out": self.frames_out,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "write_buffer_bytes": t.get_write_buffer_size() if t is not None else 0,
            "writing_paused": self._paused,
            "closing": self.is_closing(),
        }

    # -- internals ----------------------------------------------------------------------------

    def _fail(self, exc: RemoteProtocolError) -> None:
        self._close(exc, error=(exc.code, exc.reason))

    def _close(self, exc: BaseException | None, *, error: tuple[str, str] | None = None,
               abort: bool = False) -> None:
        if self._closing:
            return
        self._closing = True
        self._close_exc = exc
        t = self._transport
        if t is None or self._loop is None:
            return
        if abort or t.get_write_buffer_size() > self._max_pending:
            t.abort()  # unsent bytes are dropped: the peer is not reading them anyway
            return
        if error is not None:
            with contextlib.suppress(Exception):  # best effort: must not prevent the close
                code, reason = error
                parts: list[Any] = encode_frame(Error(code=code[:_MAX_REASON],
                                                      reason=reason[:_MAX_REASON]))
                if self._send_auth is not None:
                    parts.append(self._send_auth.tag(parts))
                if self._error_prefix:
                    self._wq.append(self._error_prefix)
                self._wq.extend(parts)
                self.frames_out += 1
        self._flush_quietly(t)
        if t.can_write_eof():
            # Lingering close: half-close (FIN after what is buffered) and keep reading, into
            # the scratch buffer, until the peer's EOF (eof_received then closes the transport).
            # Closing the socket outright while the peer is still sending makes our kernel
            # answer its bytes with RST, and the peer's next write then fails before it has
            # read our last frames (Shutdown, Error): they were lost.
            t.write_eof()
        else:
            t.close()  # flushes what is buffered, then connection_lost
        # ... but a peer that does not read or does not close must not keep the connection.
        self._abort_handle = self._loop.call_later(
            self._close_timeout_s, t.abort)

    def _flush_quietly(self, t: asyncio.Transport) -> None:
        wq, self._wq = self._wq, []
        if self.tap is not None and wq and not t.is_closing():
            self.tap(self, True, b"".join(wq))
        for part in wq:
            with contextlib.suppress(Exception):
                t.write(part)

    def _wake_drainers(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
