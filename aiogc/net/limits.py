"""What the asyncio drivers bound and check per connection (:mod:`aiogc.net.drivers`).

Header limits of an authenticated worker's frames, the PS's outbox slice and slow-consumer
cut-off, the size of a frame on the wire, the loopback test that decides whether a secret is
required, and the handshake nonces. No state: constants and small functions.
"""

from __future__ import annotations

import ipaddress
import secrets

from aiogc.protocol.headers import MAX_STR_BYTES
from aiogc.protocol.messages import Message
from aiogc.protocol.wire import encode_frame

#: Header bound after authentication: the largest header is round_start with a delay row or
#: encode_and_transmit with a state vector (<= 9 bytes per entry); 1 MiB covers 65536 entries.
POSTAUTH_MAX_HEADER = 1 << 20

#: Header bound for frames *from* an authenticated worker: the largest legal worker header is
#: an ``error`` / ``bye`` with a reason of MAX_TEXT characters (4 UTF-8 bytes each) plus a
#: code; a coded_gradient header is ~150 bytes. Anything larger is refused unparsed: parsing
#: costs CPU in proportion to its size, and a peer must not be able to buy PS time with bytes.
WORKER_MAX_HEADER = 2 * MAX_STR_BYTES + 512


#: Frames the PS writes per slice of a large outbox (a round_start or encode_and_transmit
#: broadcast to m peers). Between slices the loop polls its sockets, so a chunk report that
#: arrives during a broadcast to 1024 workers waits for one slice of writes and tags, not for
#: the whole broadcast (16 times as long); outboxes up to this size are written at once.
OUTBOX_SLICE = 64


def send_queue_cap(frame_bytes: int) -> int:
    """Slow-consumer cut-off for a connection whose largest frame is ``frame_bytes``: two of
    them (one still draining while the next is queued) plus 1 MiB of small frames."""
    return 2 * frame_bytes + (1 << 20)


def frame_nbytes(msg: Message) -> int:
    """Bytes the frame occupies on the wire without tag (prefix + header + array); encodes
    it (the drivers report the size of frames they actually sent or received instead)."""
    return sum(len(p) if isinstance(p, bytes) else p.nbytes for p in encode_frame(msg))


def _nonce16() -> bytes:
    return secrets.token_bytes(16)


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
