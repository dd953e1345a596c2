"""Wire capture: the PS's TCP byte streams as a pcap file (``aiogc run --pcap FILE``).

What is captured: the bytes each of the PS's connections reads and writes, exactly as the
framing layer (:class:`aiogc.net.framing.FramedConnection`) hands them to / takes them from
the transport -- prefixes, headers, array bodies and frame tags, before any decoding. Nothing
is sniffed from a network interface (no privileges, no interface), so the capture holds the
run's frames and nothing else, on any platform and any loop.

File format: classic libpcap, nanosecond timestamps (magic ``a1b23c4d``), link type
``LINKTYPE_RAW`` (101: each record starts with an IPv4 header). Each connection becomes one
synthetic TCP flow between its real addresses (the worker's ``peername``, the PS's listening
``sockname``; a non-IPv4 address is mapped to 127.0.0.2 / 127.0.0.1), opened by a synthetic
three-way handshake, with sequence numbers counting the bytes of each direction, so Wireshark
reassembles the streams as it would a real capture. A write is one or more segments (at most
:data:`MAX_SEGMENT` payload bytes each: an IPv4 packet holds at most 64 KiB); a read is one
segment per ``buffer_updated`` call. Segment boundaries are therefore those of the socket
calls, not of the kernel's packets, and the timestamps are the PS's wall clock at the call.
IP and TCP checksums are correct. A flow ends with a FIN pair once its connection object is
gone (written before the capture's next packet; a later connection is a new flow, even on
the same ports) or at :meth:`PcapWriter.close`.

Decode with the Wireshark dissector shipped in the package
(``tshark -X lua_script:"$(python -m aiogc.protocol.dissector --path)" -r FILE``).
"""

from __future__ import annotations

import ipaddress
import os
import struct
import time
import weakref
from collections.abc import Callable
from typing import IO, Any, Final

import numpy as np

__all__ = ["LINKTYPE_RAW", "MAX_SEGMENT", "PcapWriter", "WireTap"]

#: ``tap(conn, outgoing, data)``: ``outgoing`` True for bytes the PS wrote, False for bytes
#: it read; ``conn`` has ``peername`` and ``sockname`` attributes.
WireTap = Callable[[Any, bool, bytes], None]

LINKTYPE_RAW: Final = 101
#: Largest TCP payload per synthetic segment (IPv4 total length <= 65535: 20 + 20 header bytes).
MAX_SEGMENT: Final = 65_495
_NS_MAGIC: Final = 0xA1B23C4D
_SNAPLEN: Final = 65_535
_FIN, _SYN, _PSH, _ACK = 0x01, 0x02, 0x08, 0x10


def _checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of ``data``."""
    if len(data) % 2:
        data += b"\0"
    s = int(np.frombuffer(data, dtype=">u2").sum(dtype=np.uint64))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def _ipv4(addr: Any, fallback: str) -> tuple[bytes, int]:
    """``(4 address bytes, port)`` of a socket address; ``fallback`` for anything not IPv4."""
    host, port = (addr[0], addr[1]) if isinstance(addr, tuple) and len(addr) >= 2 else ("", 0)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = ipaddress.ip_address(fallback)
    if ip.version != 4:
        ip = ipaddress.ip_address(fallback)
    return ip.packed, int(port)


class _Flow:
    """One connection's synthetic TCP state: the two endpoints and next sequence numbers."""

    __slots__ = ("client", "ended", "seq_c", "seq_s", "server")

    def __init__(self, client: tuple[bytes, int], server: tuple[bytes, int]) -> None:
        self.client, self.server = client, server
        self.seq_c, self.seq_s = 1000, 5000  # initial sequence numbers (arbitrary, fixed)
        self.ended = False


class PcapWriter:
    """A pcap file of the PS's connections; :meth:`tap` is the framing layer's wire tap.

    Parameters
    ----------
    path : path
        Appended to (a new or empty file gets the pcap header first), so several schemes of
        one run share one file: each has its own PS port, hence its own flows.
    clock : callable
        Nanoseconds since the epoch, the records' timestamps (default ``time.time_ns``).
    """

    def __init__(self, path: str | os.PathLike[str], *,
                 clock: Callable[[], int] = time.time_ns) -> None:
        self._f: IO[bytes] = open(path, "ab")  # noqa: SIM115 -- closed by close()
        if self._f.tell() == 0:
            self._f.write(struct.pack("<IHHiIII", _NS_MAGIC, 2, 4, 0, 0, _SNAPLEN, LINKTYPE_RAW))
        self._clock = clock
        # by connection object, weakly: a connection gone ends its flow, and the next one is a
        # new flow even where it reuses the old one's id() or its ports
        self._flows: weakref.WeakKeyDictionary[Any, _Flow] = weakref.WeakKeyDictionary()
        # flows whose connection is gone, their FINs not yet written: a finalizer only notes
        # them (it may run inside the garbage collector, in the middle of another packet)
        self._gone: list[_Flow] = []
        self._ip_id = 0
        self.packets = 0

    def __enter__(self) -> PcapWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tap(self, conn: Any, outgoing: bool, data: bytes) -> None:
        """Record ``data`` as sent by the PS (``outgoing``) or received by it on ``conn``."""
        if self._f.closed or not data:
            return
        if self._gone:
            self._end_gone()
        flow = self._flows.get(conn)
        if flow is None:
            flow = self._open(conn)
        mv = memoryview(data)
        for lo in range(0, len(mv), MAX_SEGMENT):
            self._segment(flow, outgoing, _PSH | _ACK, bytes(mv[lo:lo + MAX_SEGMENT]))

    def close(self) -> None:
        """End every flow (FIN from the PS, FIN from the worker) and close the file."""
        if self._f.closed:
            return
        self._end_gone()
        for flow in list(self._flows.values()):
            self._end(flow)
        self._flows.clear()
        self._f.close()

    def _end_gone(self) -> None:
        while self._gone:  # in place: the finalizers hold this list
            self._end(self._gone.pop(0))

    def _end(self, flow: _Flow) -> None:
        """The flow's FIN from the PS, then the worker's (once)."""
        if flow.ended:
            return
        flow.ended = True
        self._segment(flow, True, _FIN | _ACK, b"", advance=1)
        self._segment(flow, False, _FIN | _ACK, b"", advance=1)

    # ------------------------------------------------------------------ packets

    def _open(self, conn: Any) -> _Flow:
        flow = _Flow(_ipv4(getattr(conn, "peername", None), "127.0.0.2"),
                     _ipv4(getattr(conn, "sockname", None), "127.0.0.1"))
        self._flows[conn] = flow
        weakref.finalize(conn, self._gone.append, flow)
        # the three-way handshake: SYN, SYN/ACK, ACK (a SYN counts as one sequence number)
        self._segment(flow, False, _SYN, b"", advance=1, ack=False)
        self._segment(flow, True, _SYN | _ACK, b"", advance=1)
        self._segment(flow, False, _ACK, b"")
        return flow

    def _segment(self, flow: _Flow, from_server: bool, flags: int, payload: bytes, *,
                 advance: int | None = None, ack: bool = True) -> None:
        src, dst = (flow.server, flow.client) if from_server else (flow.client, flow.server)
        seq, ack_no = (flow.seq_s, flow.seq_c) if from_server else (flow.seq_c, flow.seq_s)
        step = len(payload) if advance is None else advance
        if from_server:
            flow.seq_s = (flow.seq_s + step) & 0xFFFFFFFF
        else:
            flow.seq_c = (flow.seq_c + step) & 0xFFFFFFFF
        tcp = struct.pack(">HHIIBBHHH", src[1], dst[1], seq, ack_no if ack else 0, 5 << 4, flags,
                          65535, 0, 0)
        pseudo = src[0] + dst[0] + struct.pack(">BBH", 0, 6, len(tcp) + len(payload))
        csum = _checksum(pseudo + tcp + payload)
        tcp = tcp[:16] + struct.pack(">H", csum) + tcp[18:]
        total = 20 + len(tcp) + len(payload)
        self._ip_id = (self._ip_id + 1) & 0xFFFF
        ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, total, self._ip_id, 0x4000, 64, 6, 0,
                         src[0], dst[0])
        ip = ip[:10] + struct.pack(">H", _checksum(ip)) + ip[12:]
        t = self._clock()
        n = min(total, _SNAPLEN)
        self._f.write(struct.pack("<IIII", t // 1_000_000_000, t % 1_000_000_000, n, total))
        self._f.write(ip + tcp + payload)
        self.packets += 1
