"""A worker host's connection: many workers' frames over one TCP connection. Sans-IO.

docs/protocol.md §2.6 is the contract; in short:

* The host opens with a 12-byte **preamble** ``"AGCH" | version u8 | role u8 = 0 | first u32 |
  count u16`` claiming the block of worker ids ``first .. first + count - 1`` (slot ``s`` is
  worker ``first + s``). The PS has already sent the connection a plain ``challenge`` frame
  (every connection gets one at accept; the host discards it), then answers with the same
  preamble, ``role = 1``, or with a plain ``error`` frame and a close.
* After the preambles the stream is **records**: ``slot u16 | frame`` where ``frame`` is an
  ordinary frame of that slot's worker session (its own handshake, limits, session keys and
  tag sequence numbers: the tag covers the frame only, exactly as on a worker's own
  connection), or ``0xFFFF | op u16 | slot u16`` (a **control** record: ``OPEN`` from the host
  starts a session on a closed slot, ``CLOSE`` from either side ends one and is answered by a
  ``CLOSE`` from the other side unless it already sent its own; a slot is reopened only after
  both were seen), or ``0xFFFE | frame``: an untagged ``error`` about the host connection
  itself, sent before closing it.

:class:`MuxFrameDecoder` parses that stream with the ordinary frame decoder: before each
frame it asks ``select(slot)`` for that slot's limits, tag verifier and allocator.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from aiogc.errors import MalformedFrame
from aiogc.protocol.headers import PREFIX, PREFIX_BYTES
from aiogc.protocol.messages import MAX_WORKERS, PROTOCOL_VERSION
from aiogc.protocol.wire import _HEADER_STATE, HOST_MAGIC, FrameDecoder

__all__ = [
    "CLOSE",
    "CTRL_SLOT",
    "HOST_SLOT",
    "MAX_SLOTS",
    "OPEN",
    "PREAMBLE_BYTES",
    "Control",
    "MuxFrameDecoder",
    "Preamble",
    "encode_control",
    "encode_preamble",
    "slot_prefix",
]

#: ``"AGCH" | version u8 | role u8 | first u32 | count u16``
_PREAMBLE: Final = struct.Struct(">IBBIH")
PREAMBLE_BYTES: Final = _PREAMBLE.size
#: ``slot u16`` before every frame
_SLOT: Final = struct.Struct(">H")
#: ``slot u16`` and the frame's own ``u32`` length prefix, read together
_RECORD: Final = struct.Struct(">HI")
#: ``0xFFFF | op u16 | slot u16``
_CTRL: Final = struct.Struct(">HHH")
#: Slot number of a control record.
CTRL_SLOT: Final = 0xFFFF
#: Slot number of a frame about the host connection itself (an untagged ``error``).
HOST_SLOT: Final = 0xFFFE
#: Most workers one host connection carries (slots ``0 .. MAX_SLOTS - 1``).
MAX_SLOTS: Final = 0xFFFE
#: Control operations.
OPEN: Final = 1
CLOSE: Final = 2
#: Preamble roles.
ROLE_HOST: Final = 0
ROLE_PS: Final = 1


@dataclass(frozen=True, slots=True)
class Preamble:
    """A host connection's preamble (``role`` 0: the host's claim, 1: the PS's acceptance)."""

    role: int
    first: int
    count: int


@dataclass(frozen=True, slots=True)
class Control:
    """A control record: ``op`` (:data:`OPEN` or :data:`CLOSE`) on ``slot``."""

    op: int
    slot: int


def encode_preamble(role: int, first: int, count: int) -> bytes:
    """The 12-byte preamble; ``first + count <= MAX_WORKERS``, ``1 <= count <= MAX_SLOTS``."""
    return _PREAMBLE.pack(HOST_MAGIC, PROTOCOL_VERSION, role, first, count)


def encode_control(op: int, slot: int) -> bytes:
    return _CTRL.pack(CTRL_SLOT, op, slot)


def slot_prefix(slot: int) -> bytes:
    """The two bytes before every frame of ``slot``."""
    return _SLOT.pack(slot)


def parse_preamble(buf: Any, start: int) -> Preamble:
    """Validate the 12 bytes at ``buf[start:]`` (MalformedFrame ``bad_preamble`` /
    ``bad_version``)."""
    magic, version, role, first, count = _PREAMBLE.unpack_from(buf, start)
    if magic != HOST_MAGIC:
        raise MalformedFrame("a host connection must start with the AGCH preamble",
                             code="bad_preamble")
    if version != PROTOCOL_VERSION:
        raise MalformedFrame(f"host preamble of protocol version {version}, expected "
                             f"{PROTOCOL_VERSION}", code="bad_version")
    if role not in (ROLE_HOST, ROLE_PS) or not 1 <= count <= MAX_SLOTS \
            or first + count > MAX_WORKERS:
        raise MalformedFrame(f"host preamble role={role} first={first} count={count}",
                             code="bad_preamble")
    return Preamble(role, first, count)


#: ``select(decoder, slot)``: point ``decoder.limits``, ``decoder.auth`` and its allocator at
#: that slot's session, or raise MalformedFrame (a slot that is not open)
SelectFn = Callable[["MuxFrameDecoder", int], None]


class MuxFrameDecoder(FrameDecoder):
    """Decoder of a host connection (either side): the preamble, then records.

    ``plain_first``: the host's side, where plain frames (the accept-time ``challenge``, or a
    plain ``error`` rejecting the preamble) may precede the PS's preamble; they are delivered
    with :attr:`slot` None. Every other frame is delivered with :attr:`slot` set to its slot;
    preambles and control records are delivered as :class:`Preamble` / :class:`Control`.
    """

    def __init__(self, select: SelectFn, *, plain_first: bool = False) -> None:
        super().__init__()
        self._select = select
        self._plain_first = plain_first
        self._greeting = True  # the peer's preamble is still to come
        self._prefix_need = PREAMBLE_BYTES
        #: slot of the frame being (or last) delivered; None for a plain frame
        self.slot: int | None = None

    def set_alloc(self, alloc: Any) -> None:
        """The allocator of the frame being decoded (from ``select``)."""
        self._alloc = alloc

    def _read_prefix(self) -> Any:
        buf, start = self._buf, self._start
        if self._greeting:
            (magic,) = PREFIX.unpack_from(buf, start)
            if magic == HOST_MAGIC or not self._plain_first:
                pre = parse_preamble(buf, start)
                self._start = start + PREAMBLE_BYTES
                self._greeting = False
                self._prefix_need = _SLOT.size + PREFIX_BYTES
                return pre
            self.slot = None
            self._select(self, HOST_SLOT)
            return FrameDecoder._read_prefix(self)
        slot, h = _RECORD.unpack_from(buf, start)  # needs the 6 bytes _prefix_need asks for
        if slot == CTRL_SLOT:
            _, op, arg = _CTRL.unpack_from(buf, start)
            self._start = start + _CTRL.size
            return Control(op, arg)
        self._start = start + _SLOT.size
        self.slot = slot
        self._select(self, slot)
        # FrameDecoder._read_prefix's checks, inlined (no second call per frame)
        if h == 0 or h > self.limits.max_body_bytes:
            return FrameDecoder._read_prefix(self)  # raises the precise error
        self._hlen = h
        self._state = _HEADER_STATE
        return None
