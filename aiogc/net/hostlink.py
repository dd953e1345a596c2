"""The PS's side of a worker host's connection: one TCP connection, many worker peers.

A :class:`HostLink` takes over a :class:`~aiogc.net.framing.FramedConnection` whose first bytes
were a host preamble (docs/protocol.md §2.6) and demultiplexes it into one
:class:`SlotEndpoint` per open slot. An endpoint is what the PS core sees as a peer: it has the
connection's API the :class:`~aiogc.net.drivers.PSServer` uses (``queue``, ``flush``, ``close``,
``set_auth``, ``set_limits``...), its own limits, its own session keys and tag sequence numbers,
so the core and the server treat it exactly as a worker's own connection. The host only
multiplexes: a frame on slot ``s`` verifies only with worker ``first + s``'s session key, and
before authentication a message naming another worker closes the whole host connection
(``slot_mismatch``).

Batching: the frames of one read are delivered one by one (the core may change a slot's limits
or keys between two frames), but everything they cause the PS to send to this host leaves in
one write at the end of the read, or once the first of them has waited :data:`BATCH_WINDOW_S`
(a read of a thousand reports takes the PS milliseconds; a trigger's broadcast must not wait
for the end of it).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import numpy as np

from aiogc.errors import MalformedFrame, RemoteProtocolError
from aiogc.net.framing import FramedConnection
from aiogc.protocol.headers import PREAUTH_LIMITS, FrameLimits
from aiogc.protocol.hostmux import (
    CLOSE,
    HOST_SLOT,
    OPEN,
    ROLE_HOST,
    ROLE_PS,
    Control,
    MuxFrameDecoder,
    Preamble,
    encode_control,
    encode_preamble,
    slot_prefix,
)
from aiogc.protocol.messages import Error, Message
from aiogc.protocol.tags import SessionAuth
from aiogc.protocol.wire import encode_frame

log = logging.getLogger("aiogc.net")

#: Longest a frame waits in a batch (a read, a host's timer wake-up) for the batch's other
#: frames before it is written anyway: coalescing writes must not add more latency than this.
BATCH_WINDOW_S = 0.0002

__all__ = ["HostLink", "SlotEndpoint"]


class _Server(Protocol):
    """What a link needs of :class:`~aiogc.net.drivers.PSServer`."""

    ps: Any
    _loop: Any
    _max_pending: int
    _admission: Any

    def clock(self) -> float: ...

    def _conn_made(self, conn: Any) -> None: ...
    def _on_message(self, conn: Any, msg: Message) -> None: ...
    def _on_close(self, conn: Any, exc: BaseException | None) -> None: ...
    def _read_done(self) -> None: ...
    def _alloc(self, conn: Any, kind: str, header: dict[str, Any], dtype: np.dtype,
               n: int) -> Any: ...


class SlotEndpoint(SessionAuth):
    """One worker session on a host connection: a peer of the PS core."""

    __slots__ = ("_conn", "_link", "_prefix", "alloc", "closed", "limits", "peername", "slot",
                 "worker_id")

    def __init__(self, link: HostLink, slot: int, worker_id: int) -> None:
        self._link = link
        self._conn = link.conn  # read per frame sent: no attribute chain
        self.slot = slot
        self.worker_id = worker_id
        self._prefix = slot_prefix(slot)
        super().__init__()
        self.limits: FrameLimits = PREAUTH_LIMITS
        #: the PS closed it (CLOSE sent): frames still in flight are decoded and dropped
        self.closed = False
        self.peername = (link.conn.peername, slot)
        server = link.server

        def alloc(kind: str, header: dict[str, Any], dtype: Any, n: int) -> Any:
            return server._alloc(self, kind, header, dtype, n)

        self.alloc = alloc

    # -- the connection API PSServer uses ---------------------------------------------------

    def queue(self, msg: Message, parts: list[bytes | memoryview] | None = None) -> int:
        if self.closed:
            return 0
        if parts is None:
            parts = encode_frame(msg)
        return self._conn.queue_record(self._prefix, parts, self.send_auth)

    def flush(self) -> None:
        self._link.flush()

    def flush_now(self) -> None:
        """Write the host connection's queue now, even within a read (the PS's late poll)."""
        link = self._link
        link._dirty = False
        link.conn.flush()

    def close(self, code: str | None = None, reason: str = "") -> None:
        """End this session (the host connection stays): an optional Error frame, then CLOSE;
        the server hears of it at the next loop iteration (not inside its own outbox write)."""
        if self.closed:
            return
        if code is not None:
            self.queue(Error(code=code[:200], reason=reason[:200]))
        self.closed = True
        self._link.slot_closed_by_ps(self)

    def abort(self) -> None:
        self.close()

    async def drain(self) -> None:
        await self._link.conn.drain()

    def set_limits(self, limits: FrameLimits) -> None:
        self.limits = limits

    @property
    def last_frame_nbytes(self) -> int:
        return self._link.conn.last_frame_nbytes

    def is_closing(self) -> bool:
        return self.closed or self._link.conn.is_closing()


class HostLink:
    """Demultiplex one worker host's connection into :class:`SlotEndpoint` peers.

    ``m``: the run's worker count (a preamble claiming ids beyond it is refused).
    """

    def __init__(self, server: _Server, conn: FramedConnection, m: int) -> None:
        self.server = server
        self.conn = conn
        self.m = m
        self.first = 0
        self.count = 0
        self._slots: list[SlotEndpoint | None] = []
        #: the connection's decoder once adopted (read per frame: no property, no isinstance)
        self._dec = MuxFrameDecoder(self._select)
        self._in_read = False
        self._dirty = False
        self._dirty_since = 0.0

    @classmethod
    def adopt(cls, server: _Server, conn: FramedConnection, rest: bytes, m: int) -> HostLink:
        """Take ``conn`` over: the PS core forgets it as a pending peer (its challenge is
        discarded by the host), the rest of the stream is decoded as a host's."""
        server.ps.connection_lost(conn, now=server.clock())
        link = cls(server, conn, m)
        conn.adopt(link._dec, link._on_message, link._on_close, rest=rest,
                   after_read=link._after_read)
        return link

    # -- decoding ---------------------------------------------------------------------------

    def _select(self, dec: MuxFrameDecoder, slot: int) -> None:
        if slot == HOST_SLOT:
            dec.auth = None
            dec.limits = PREAUTH_LIMITS
            dec.set_alloc(None)
            return
        ep = self._slots[slot] if slot < self.count else None
        if ep is None:
            raise MalformedFrame(f"frame on slot {slot}, which is not open", code="slot_closed")
        dec.auth = ep.recv_auth
        dec.limits = ep.limits
        dec._alloc = ep.alloc  # set_alloc(), without a call per frame

    def _on_message(self, conn: FramedConnection, msg: Any) -> None:
        self._in_read = True
        if self._dirty and self.server.clock() - self._dirty_since > BATCH_WINDOW_S:
            self._dirty = False
            conn.flush()  # the frames queued by this read's first messages waited long enough
        kind = type(msg)
        if kind is Preamble:
            self._on_preamble(msg)
            return
        if kind is Control:
            self._on_control(msg)
            return
        slot = self._dec.slot
        if slot is None or slot == HOST_SLOT:
            # the host reports a problem with the connection itself: it is ending it
            log.debug("worker host %s: %s", conn.peername, getattr(msg, "reason", msg))
            conn.close()
            return
        ep = self._slots[slot]
        assert ep is not None  # _select refused frames of slots that are not open
        if ep.closed:
            return  # in flight when the PS closed the slot
        if ep.recv_auth is None:
            named = getattr(msg, "worker", None)
            if named is not None and named != ep.worker_id:
                raise RemoteProtocolError(
                    f"slot {slot} carries worker {ep.worker_id}, not {named}",
                    code="slot_mismatch")
        self.server._on_message(ep, msg)

    def _on_preamble(self, pre: Preamble) -> None:
        if pre.role != ROLE_HOST:
            raise RemoteProtocolError("a host preamble must have role 0", code="bad_preamble")
        if pre.first + pre.count > self.m:
            raise RemoteProtocolError(
                f"block {pre.first}..{pre.first + pre.count - 1} outside [0, {self.m})",
                code="bad_block")
        self.first, self.count = pre.first, pre.count
        self._slots = [None] * pre.count
        self.conn.set_error_prefix(slot_prefix(HOST_SLOT))
        # the slow-consumer cut-off of one worker's connection, for each worker it carries
        self.conn.set_max_pending_bytes(pre.count * self.server._max_pending)
        self.conn.queue_raw(encode_preamble(ROLE_PS, pre.first, pre.count))
        self.flush()

    def _on_control(self, c: Control) -> None:
        if not 0 <= c.slot < self.count:
            raise RemoteProtocolError(f"control on slot {c.slot} outside the host's "
                                      f"{self.count} slots", code="bad_slot")
        ep = self._slots[c.slot]
        if c.op == OPEN:
            if ep is not None:
                raise RemoteProtocolError(f"OPEN on slot {c.slot}, which is open or closing",
                                          code="slot_busy")
            adm = self.server._admission
            if adm is not None and not adm.may_open(self.conn, self.count):
                raise RemoteProtocolError("too many OPENs before a slot authenticated",
                                          code="open_flood")
            ep = self._slots[c.slot] = SlotEndpoint(self, c.slot, self.first + c.slot)
            self.server._conn_made(ep)
        elif c.op == CLOSE:
            if ep is None:
                raise RemoteProtocolError(f"CLOSE on slot {c.slot}, which is not open",
                                          code="slot_closed")
            self._slots[c.slot] = None
            if not ep.closed:  # the host ended the session: answer, tell the PS
                ep.closed = True
                self.conn.queue_raw(encode_control(CLOSE, c.slot))
                self.flush()
                self.server._on_close(ep, None)
            # else: the answer to our own CLOSE; the slot is free again
        else:
            raise RemoteProtocolError(f"unknown control operation {c.op}", code="bad_control")

    def _after_read(self) -> None:
        self.server._read_done()  # the PS polls once per read; its frames join this write
        self._in_read = False
        if self._dirty:
            self._dirty = False
            self.conn.flush()

    def _on_close(self, conn: FramedConnection, exc: BaseException | None) -> None:
        """The host connection is gone: every session on it is lost."""
        slots, self._slots = self._slots, []
        for ep in slots:
            if ep is not None and not ep.closed:
                ep.closed = True
                self.server._on_close(ep, exc)
        self.server._on_close(conn, exc)

    # -- writing ----------------------------------------------------------------------------

    def flush(self) -> None:
        if self._in_read:
            if not self._dirty:  # the end of the read writes it all at once
                self._dirty = True
                self._dirty_since = self.server.clock()
        else:
            self.conn.flush()

    def slot_closed_by_ps(self, ep: SlotEndpoint) -> None:
        self.conn.queue_raw(encode_control(CLOSE, ep.slot))
        self.flush()
        loop = self.server._loop
        if loop is not None:
            loop.call_soon(self.server._on_close, ep, None)
