"""The PS's admission of transport connections: a deadline and caps until authentication.

The PS core gives every *peer* it challenges ``auth_deadline_s`` to answer (a plain connection,
or one slot of a worker host's connection). This module bounds the *sockets* the same way, so
that no connection outlives the login deadline without an authenticated worker on it, whatever
it sends (a host preamble and nothing else, OPEN records, OPEN/CLOSE churn):

* every connection the PS accepts is *pending* until a worker on it authenticates; a pending
  connection is closed at its deadline (accept time + ``deadline_s``);
* a worker host's connection whose last authenticated slot closes is pending again, with a
  fresh deadline (a host keeps its connection only while it carries a worker);
* pending connections are capped in total and per source address, and both caps fit the PS's
  file budget (:func:`unauthenticated_cap`): the file limit minus the descriptors already open,
  one per worker and a reserve. When a cap is reached, the oldest pending connection of the
  source holding the most pending connections is closed (a flood evicts itself first; an
  honest worker answers its challenge within milliseconds and leaves the pending set). The
  per-source cap applies to remote addresses: every loopback connection comes from this
  machine (the local runner's own workers), which only the total cap bounds;
* a worker host's connection with no authenticated slot may OPEN at most
  :data:`OPENS_PER_SLOT` times per slot it declared (OPEN/CLOSE churn is refused).

Closing here is an abort after a best-effort Error frame: the descriptor is freed at once,
even from a peer that never reads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
from collections.abc import Hashable
from typing import Any

from aiogc.net.hostlink import SlotEndpoint
from aiogc.net.limits import is_loopback
from aiogc.protocol.hostmux import MuxFrameDecoder

log = logging.getLogger("aiogc.net")

__all__ = [
    "BACKSTOP_S",
    "FD_RESERVE",
    "MIN_UNAUTHENTICATED",
    "OPENS_PER_SLOT",
    "Admission",
    "fd_budget",
    "unauthenticated_cap",
]

#: Descriptors kept free beyond the ones open when the PS starts listening and one per worker:
#: the records files opened later, a log rotation, the event loop's own (self-pipe, epoll).
FD_RESERVE = 32
#: Floor of the cap on pending connections: below it honest workers starting together would
#: evict each other. A file limit this tight is reported (a warning) rather than refused.
MIN_UNAUTHENTICATED = 8
#: OPEN records allowed per declared slot on a worker host's connection before one of its
#: slots authenticates (an honest host opens each slot once, again after a refused handshake).
OPENS_PER_SLOT = 2
#: After the deadline, the PS core closes a plain connection itself (it challenged it, with the
#: same deadline); this module closes it this much later if it is still open.
BACKSTOP_S = 0.25


def fd_budget() -> tuple[int, int]:
    """The process's soft file limit and the descriptors open now (``/proc/self/fd``; 0 when
    it cannot be read)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft < 0:
        soft = 1 << 20
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_now = 0
    return int(soft), open_now


def unauthenticated_cap(m: int, core_cap: int, soft_limit: int, open_now: int
                        ) -> tuple[int, int]:
    """Caps on pending connections ``(total, per_source)`` for a run of ``m`` workers.

    ``total``: ``core_cap`` (the PS core's pending cap), lowered to what the file limit leaves
    after the descriptors open now, one per worker (each may hold its own connection) and
    :data:`FD_RESERVE`; never below :data:`MIN_UNAUTHENTICATED`. ``per_source``: half of it,
    but at least ``m + MIN_UNAUTHENTICATED`` (every worker of a single-address cluster may be
    mid-handshake at once), never above ``total``.
    """
    free = soft_limit - open_now - m - FD_RESERVE
    total = max(MIN_UNAUTHENTICATED, min(core_cap, free))
    per_source = min(total, max(total // 2, m + MIN_UNAUTHENTICATED))
    return total, per_source


def _source(conn: Any) -> Hashable:
    peer = getattr(conn, "peername", None)
    if isinstance(peer, tuple) and peer:
        addr: Hashable = peer[0]  # the address, without the port
        return addr
    return peer if isinstance(peer, str | int) else None


def _is_remote(src: Hashable) -> bool:
    return isinstance(src, str) and src != "" and not is_loopback(src)


class Admission:
    """Deadlines and caps on the PS's unauthenticated transport connections.

    The server calls :meth:`admit` when it accepts a connection, :meth:`authenticated` when a
    peer (a connection or a host's slot) passes its handshake, :meth:`closed` when a peer is
    gone, and :meth:`may_open` when a host's connection OPENs a slot.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, deadline_s: float, total_cap: int,
                 per_source_cap: int) -> None:
        self._loop = loop
        self.deadline_s = deadline_s
        self.total_cap = total_cap
        self.per_source_cap = per_source_cap
        #: pending connection -> its source and deadline timer (insertion order: oldest first)
        self._pending: dict[Any, tuple[Hashable, asyncio.TimerHandle]] = {}
        self._by_source: dict[Hashable, dict[Any, None]] = {}
        #: a host connection -> its authenticated slots
        self._slots: dict[Any, set[SlotEndpoint]] = {}
        #: OPENs left to a host connection until one of its slots authenticates
        self._opens: dict[Any, int] = {}
        self.stats: dict[str, int] = {"expired": 0, "evicted_total": 0, "evicted_source": 0,
                                      "open_flood": 0}

    @classmethod
    def for_ps(cls, loop: asyncio.AbstractEventLoop, m: int, core_cap: int,
               deadline_s: float) -> Admission:
        """The admission of a PS of ``m`` workers, its caps fitted to this process's files."""
        soft, open_now = fd_budget()
        total, per_source = unauthenticated_cap(m, core_cap, soft, open_now)
        if soft - open_now - m - FD_RESERVE < MIN_UNAUTHENTICATED:
            log.warning("file limit %d leaves little room for %d workers (%d files open): "
                        "raise it (ulimit -n)", soft, m, open_now)
        return cls(loop, deadline_s, total, per_source)

    # -- the server's calls -------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Connections without an authenticated worker, now."""
        return len(self._pending)

    def admit(self, conn: Any) -> None:
        """A new connection: make room under the caps, then start its deadline."""
        src = _source(conn)
        same = self._by_source.get(src)
        if same is not None and len(same) >= self.per_source_cap and _is_remote(src):
            self.stats["evicted_source"] += 1
            self._evict(next(iter(same)), "too_many_connections",
                        "unauthenticated connections from this address at their cap")
        if len(self._pending) >= self.total_cap:
            busiest = max(self._by_source.values(), key=len)
            self.stats["evicted_total"] += 1
            self._evict(next(iter(busiest)), "too_many_connections",
                        "unauthenticated connections at their cap")
        self._add(conn, src)

    def authenticated(self, peer: Any) -> None:
        """``peer`` passed its handshake: its connection is no longer pending."""
        conn = peer
        if type(peer) is SlotEndpoint:
            conn = peer._link.conn
            self._slots.setdefault(conn, set()).add(peer)
            self._opens.pop(conn, None)
        self._remove(conn)

    def closed(self, peer: Any) -> None:
        """``peer`` is gone. A host connection that loses its last authenticated slot is
        pending again, with a fresh deadline."""
        if type(peer) is SlotEndpoint:
            conn = peer._link.conn
            slots = self._slots.get(conn)
            if slots is not None and peer in slots:
                slots.discard(peer)
                if not slots:
                    del self._slots[conn]
                    if not conn.is_closing():
                        self._opens[conn] = OPENS_PER_SLOT * max(1, peer._link.count)
                        self._add(conn, _source(conn))
            return
        self._remove(peer)
        self._slots.pop(peer, None)
        self._opens.pop(peer, None)

    def may_open(self, conn: Any, slots: int) -> bool:
        """A host connection declaring ``slots`` slots OPENs one; False (and counted) when it
        has no authenticated slot and has used its OPENs."""
        if conn in self._slots:
            return True
        left = self._opens.get(conn, OPENS_PER_SLOT * max(1, slots))
        if left <= 0:
            self.stats["open_flood"] += 1
            return False
        self._opens[conn] = left - 1
        return True

    def close_all(self) -> None:
        """Cancel every deadline (the server is closing every connection itself)."""
        for _src, handle in self._pending.values():
            handle.cancel()
        self._pending.clear()
        self._by_source.clear()

    # -- internals ----------------------------------------------------------------------------

    def _add(self, conn: Any, src: Hashable) -> None:
        if conn in self._pending:
            return
        handle = self._loop.call_later(self.deadline_s, self._expire, conn)
        self._pending[conn] = (src, handle)
        self._by_source.setdefault(src, {})[conn] = None

    def _remove(self, conn: Any) -> None:
        entry = self._pending.pop(conn, None)
        if entry is None:
            return
        src, handle = entry
        handle.cancel()
        same = self._by_source.get(src)
        if same is not None:
            same.pop(conn, None)
            if not same:
                del self._by_source[src]

    def _expire(self, conn: Any, backstop: bool = False) -> None:
        if conn not in self._pending:
            return
        if not backstop and not isinstance(conn.decoder, MuxFrameDecoder):
            # a plain connection is a peer of the PS core, which closes it at this same
            # deadline with its own reason: this is only the backstop
            src, _ = self._pending[conn]
            handle = self._loop.call_later(BACKSTOP_S, self._expire, conn, True)
            self._pending[conn] = (src, handle)
            return
        self.stats["expired"] += 1
        self._evict(conn, "auth_timeout", "no authenticated worker within the deadline")

    def _evict(self, conn: Any, code: str, reason: str) -> None:
        self._remove(conn)
        self._opens.pop(conn, None)
        conn.close(code, reason)  # the Error frame, best effort ...
        conn.abort()  # ... and the descriptor freed now
