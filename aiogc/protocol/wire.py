"""Message <-> bytes: length prefix, version, per-kind header codecs, limits, frame tags. Sans-IO.

Frame format (version 3)
------------------------
A frame is up to four consecutive parts, with nothing between frames::

    +-------------------+----------------------+------------------------------+---------+
    | H: u32 big-endian | header: H bytes      | body: n * itemsize raw bytes | tag: T  |
    +-------------------+----------------------+------------------------------+---------+

* ``T`` is 16 on an authenticated connection after the handshake, else 0 (no tag): the tag
  is AES-256-GCM with an empty plaintext over ``prefix || header || body`` as associated data
  (GMAC), key = this direction's session key, nonce = 4 zero bytes || u64be(seq), where
  ``seq`` counts the tagged frames sent in this direction from 0 (implicit, never sent). See
  :class:`FrameAuth`. A wrong tag is ``bad_tag``; the message is never delivered.
* ``H`` is the length of the header in bytes, ``2 <= H <= limits.max_header_bytes`` (``H == 0``:
  ``empty_header``; ``H == 1``: ``bad_header``), checked before a single header byte is buffered.
* The header starts with two bytes, the version (``PROTOCOL_VERSION`` = 3, else
  ``bad_version``) and the kind's code (:data:`KIND_CODES`, else ``unknown_kind``); the rest
  depends on the kind:

  - **compact kinds** (:data:`COMPACT_LAYOUTS`: the kinds sent every round, and ``ready``,
    ``ping``, ``pong``): the kind's fields in order as fixed-size **big-endian** values
    (``u53`` and ``n`` as u64, counts and list lengths as u32, seconds as IEEE float64,
    the array's itemsize as u8), then a variable tail whose length the fixed part gives (the
    entries of ``delays_s`` as float64, of ``state`` as u32, the bytes of ``state_digest``).
    ``H`` must be exactly the length this implies (``bad_schema``, naming the field).
  - **msgpack kinds** (the handshake, ``round_end``, ``bye``, ``error``, ``shutdown``): one
    msgpack map with exactly the kind's fields as str keys (``bad_schema``), packed with
    ``packb(use_bin_type=True)``, unpacked with ``raw=False, strict_map_key=True``, every
    container/string length bounded (``max_*_len`` below), no ext types (``ext_type``), never
    pickle, nothing after the map (``trailing_bytes``).

* Array kinds (``round_start``, ``coded_gradient``; compact) carry the itemsize (4: ``"<f4"``,
  8: ``"<f8"``, else ``bad_dtype``) and the element count ``n`` in the header; the body is
  exactly ``n * itemsize`` bytes, the little-endian elements in order. ``n * itemsize`` is checked
  against ``limits.max_array_bytes`` before anything is allocated (``array_too_large``);
  ``max_array_bytes == 0`` forbids array kinds altogether (before authentication).

Every field from the network is checked here, once, against the schema of ``messages`` (type
and context-free range; a failure is ``bad_field`` naming ``kind.field``), before the message
is built with an unvalidated constructor. All header checks happen before the body is
received, so ``alloc`` only ever sees validated headers. docs/protocol.md gives the byte
layouts and test vectors.

Invariants
----------
* Every failure to decode raises :class:`~aiogc.errors.MalformedFrame` (or its subclass
  :class:`~aiogc.errors.FrameTooLarge`) carrying a short ``code``; nothing else escapes from
  decoding peer bytes. A :class:`FrameDecoder` that raised is poisoned: every later call raises
  the same exception (the connection must be closed; there is no resynchronisation).
* With a tag, nothing is delivered before the tag verified (the body may already sit in the
  destination ``alloc`` chose: a caller must not use it unless the message is delivered).
* Memory is bounded by the limits: the header buffer never exceeds ``max_header_bytes + 64 KiB``
  (read slack), and each frame allocates at most one array of ``max_array_bytes``.
* Frames are parsed in order and, with ``max_messages=1`` + :meth:`FrameDecoder.next_message`,
  one at a time: a caller can change ``limits`` or the state ``alloc`` reads between frames.
* Encoding never copies the array: :func:`encode_frame` returns a memoryview of it. The caller
  must not mutate the array until the transport has flushed it (see ``net.framing``).

Known imperfection: the decoder copies into the array the (at most one read's worth of) body
bytes that arrived in the same read as the header; the rest lands directly in the array.
"""

from __future__ import annotations

import hmac
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Final

import msgpack
import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from aiogc.errors import FrameTooLarge, LocalProtocolError, MalformedFrame
from aiogc.protocol.messages import (
    KINDS,
    MAX_BLOB,
    MAX_INT,
    MAX_TEXT,
    MAX_WORKERS,
    PROTOCOL_VERSION,
    ChunkReport,
    CodedGradient,
    EncodeAndTransmit,
    Message,
    Ping,
    Pong,
    Ready,
    Resume,
    RoundStart,
    slot_constructor,
)

__all__ = [
    "COMPACT_LAYOUTS",
    "DEFAULT_LIMITS",
    "KIND_CODES",
    "PREAUTH_LIMITS",
    "TAG_BYTES",
    "AllocFn",
    "FrameAuth",
    "FrameDecoder",
    "FrameLimits",
    "decode_frame_bytes",
    "encode_frame",
    "encode_frame_bytes",
]

_PREFIX: Final = struct.Struct(">I")
#: Size of the length prefix in bytes.
PREFIX_BYTES: Final = _PREFIX.size
#: Largest value the u32 prefix can carry.
MAX_U32: Final = 2**32 - 1
#: Bytes before a header's fields: version, kind code.
PREAMBLE_BYTES: Final = 2

#: The kind byte of every header (docs/protocol.md §2.1). Never reuse a code.
KIND_CODES: Final = {
    "challenge": 1, "hello": 2, "welcome": 3, "ready": 4, "round_start": 5, "chunk_report": 6,
    "encode_and_transmit": 7, "coded_gradient": 8, "resume": 9, "round_end": 10, "bye": 11,
    "error": 12, "shutdown": 13, "ping": 14, "pong": 15,
}
assert set(KIND_CODES) == set(KINDS) and len(set(KIND_CODES.values())) == len(KINDS)

# msgpack bounds: each caps one length the unpacker would otherwise trust from the peer.
#: Longest str in a header: MAX_TEXT characters of up to 4 UTF-8 bytes each.
MAX_STR_BYTES: Final = 4 * MAX_TEXT
#: Longest bin in a header: nonces, MACs and digests only (arrays travel after the header).
MAX_BIN_BYTES: Final = MAX_BLOB
#: Longest msgpack array in a header (no msgpack kind carries a list; kept as a bound).
MAX_ARRAY_LEN: Final = MAX_WORKERS
#: Most keys in one msgpack map: welcome's config (64 entries) with room.
MAX_MAP_LEN: Final = 128

#: Initial size of the decoder's header buffer: many small frames per read, one page-ish alloc.
_READ_CHUNK: Final = 64 * 1024
#: ``0.0 <= x <= _FMAX`` is False for NaN, negative values and both infinities.
_FMAX: Final = sys.float_info.max


@dataclass(frozen=True, slots=True)
class FrameLimits:
    """Per-connection bounds, checked before anything is buffered or allocated.

    ``max_header_bytes``: largest accepted ``H``. ``max_array_bytes``: largest accepted
    ``n * itemsize``; 0 forbids array kinds.
    """

    max_header_bytes: int
    max_array_bytes: int

    def __post_init__(self) -> None:
        if type(self.max_header_bytes) is not int or not 1 <= self.max_header_bytes <= MAX_U32:
            raise LocalProtocolError(f"max_header_bytes={self.max_header_bytes!r} not in [1, 2^32)")
        if type(self.max_array_bytes) is not int or self.max_array_bytes < 0:
            raise LocalProtocolError(f"max_array_bytes={self.max_array_bytes!r} must be >= 0")


#: Before authentication: a hello (worker id, two 32-byte blobs, epoch) packs to ~100 bytes;
#: 512 leaves room and keeps a flood of unauthenticated connections cheap. No arrays.
PREAUTH_LIMITS: Final = FrameLimits(max_header_bytes=512, max_array_bytes=0)
#: After authentication: 1 MiB fits a header with a full 65536-entry delay row (8 bytes per
#: entry = 512 KiB). 256 MiB of array = d <= 3.3e7 float64; the core should tighten it to the
#: exact expected payload size once d is known.
DEFAULT_LIMITS: Final = FrameLimits(max_header_bytes=1 << 20, max_array_bytes=256 << 20)

#: ``alloc(kind, header_fields, dtype, n)`` -> destination array of shape (n,) and that dtype,
#: C-contiguous and writable, or None for a fresh ``np.empty``. It may raise MalformedFrame to
#: refuse the frame (the decoder is then poisoned and the connection must close).
AllocFn = Callable[[str, dict[str, Any], np.dtype, int], "np.ndarray | None"]


# ------------------------------------------------------------------------------- frame tags

#: Length of a frame tag (GCM's full 128-bit tag).
TAG_BYTES: Final = 16
#: Frames up to this many bytes are tagged with one one-shot AESGCM call (~1 us); larger ones
#: stream their parts through a GCM context (~6.5 us setup, then ~6 GB/s, no copy).
_ONESHOT_BELOW: Final = 64 * 1024
#: nonce = 4 zero bytes || u64be(seq)
_NONCE: Final = struct.Struct(">4xQ")


class FrameAuth:
    """Tags (or verifies) the frames of one direction of one connection.

    ``tag(parts)`` returns AES-256-GCM(key, nonce = 0^4 || u64be(seq), plaintext = empty,
    aad = concatenation of ``parts``).tag and advances ``seq``; ``verify(parts, tag)`` does the
    same for a received frame, checking the tag in constant time (GCM decryption of an empty
    ciphertext). Sequence numbers are implicit, so a dropped, replayed, reordered or spliced
    frame fails to verify.
    """

    __slots__ = ("_aead", "_key", "seq")

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise LocalProtocolError(f"session key of {len(key)} bytes, expected 32")
        self._key = key
        self._aead = AESGCM(key)
        self.seq = 0

    def tag(self, parts: Sequence[bytes | bytearray | memoryview]) -> bytes:
        """Tag of the frame made of ``parts`` (in order); advances the sequence number."""
        nonce = _NONCE.pack(self.seq)
        self.seq += 1
        if len(parts) == 1:
            aad = parts[0]
            if len(aad) <= _ONESHOT_BELOW:
                return self._aead.encrypt(nonce, b"", aad)  # takes any buffer: no copy
        elif sum(map(len, parts)) <= _ONESHOT_BELOW:
            return self._aead.encrypt(nonce, b"", b"".join(parts))
        return self._stream(nonce, parts)

    def verify(self, parts: Sequence[bytes | bytearray | memoryview],
               tag: bytes | bytearray | memoryview) -> bool:
        """True iff ``tag`` is the tag of ``parts`` at the current sequence number (which
        advances either way: after a failure the connection must close)."""
        nonce = _NONCE.pack(self.seq)
        self.seq += 1
        aad: Any = None
        if len(parts) == 1:
            if len(parts[0]) <= _ONESHOT_BELOW:
                aad = parts[0]
        elif sum(map(len, parts)) <= _ONESHOT_BELOW:
            aad = b"".join(parts)
        if aad is None:
            return hmac.compare_digest(self._stream(nonce, parts), bytes(tag))
        try:
            self._aead.decrypt(nonce, tag, aad)  # constant-time check inside OpenSSL
        except InvalidTag:
            return False
        return True

    def verify_one(self, frame: bytes | bytearray | memoryview,
                   tag: bytes | bytearray | memoryview) -> bool:
        """:meth:`verify` of a frame given as one buffer, in one one-shot call (the decoder's
        fast path: prefix, header and body read in one go)."""
        nonce = _NONCE.pack(self.seq)
        self.seq += 1
        try:
            self._aead.decrypt(nonce, tag, frame)
        except InvalidTag:
            return False
        return True

    def _stream(self, nonce: bytes, parts: Sequence[bytes | bytearray | memoryview]) -> bytes:
        enc = Cipher(algorithms.AES(self._key), modes.GCM(nonce)).encryptor()
        for p in parts:
            if len(p):
                enc.authenticate_additional_data(p)
        enc.finalize()
        return enc.tag


# ------------------------------------------------------------------------------- layouts

#: struct code of each fixed-size wire type of the compact layouts (all big-endian)
WIRE_TYPES: Final = {"u64": "Q", "u32": "I", "u8": "B", "f64": "d"}


@dataclass(frozen=True, slots=True)
class CompactLayout:
    """Byte layout of a compact kind's header after the two preamble bytes.

    ``fixed``: ``(name, wire type)`` in order; a name is a message field, ``itemsize`` / ``n``
    (array kinds), or ``len(<field>)``, the entry count of the tail. ``tail``: ``(field, wire
    type of one entry)`` of the variable part that follows, or None.
    """

    kind: str
    fixed: tuple[tuple[str, str], ...]
    tail: tuple[str, str] | None = None

    @property
    def fixed_struct(self) -> struct.Struct:
        return struct.Struct(">" + "".join(WIRE_TYPES[t] for _, t in self.fixed))

    @property
    def fixed_bytes(self) -> int:
        """Header length without the tail: preamble + fixed part."""
        return PREAMBLE_BYTES + self.fixed_struct.size


def _layouts(*items: CompactLayout) -> dict[str, CompactLayout]:
    return {x.kind: x for x in items}


_U53 = "u64"  # a u53 field travels as a u64 and is checked <= MAX_INT
#: The compact kinds and their layouts (docs/protocol.md §2.1 is generated from this table).
COMPACT_LAYOUTS: Final = _layouts(
    CompactLayout("ready", (("epoch", _U53),)),
    CompactLayout("ping", (("seq", _U53),)),
    CompactLayout("pong", (("seq", _U53),)),
    CompactLayout("resume", (("epoch", _U53), ("round", _U53), ("attempt", _U53))),
    CompactLayout("chunk_report", (("epoch", _U53), ("round", _U53), ("count", "u32"),
                                   ("t_worker", "f64"), ("elapsed_s", "f64"))),
    CompactLayout("encode_and_transmit", (("epoch", _U53), ("round", _U53), ("attempt", _U53),
                                          ("len(state)", "u32")), ("state", "u32")),
    CompactLayout("round_start", (("epoch", _U53), ("round", _U53), ("net_delay_s", "f64"),
                                  ("itemsize", "u8"), ("n", "u64"), ("len(delays_s)", "u32")),
                  ("delays_s", "f64")),
    CompactLayout("coded_gradient", (("epoch", _U53), ("round", _U53), ("attempt", _U53),
                                     ("compute_s", "f64"), ("itemsize", "u8"), ("n", "u64"),
                                     ("len(state_digest)", "u8")), ("state_digest", "u8")),
)


# ------------------------------------------------------------------------------- codecs
# One encoder and one decoder per kind. A decoder gets the buffer, the offset of the header
# (its preamble) and H, checks every field, and returns (message, dtype, n); an array kind's
# message has no array yet when n > 0 (the decoder attaches the body before delivery).

_V: Final = PROTOCOL_VERSION
Decoded = tuple[Message, "np.dtype | None", int]
Decoder = Callable[[bytearray, int, int, FrameLimits], Decoded]
Encoder = Callable[[Message], "tuple[bytes, memoryview | None]"]
#: the array kinds' itemsize byte -> dtype (messages.ARRAY_DTYPES, by itemsize)
_DTYPES: Final[dict[int, np.dtype]] = {4: np.dtype("<f4"), 8: np.dtype("<f8")}
_ITEMSIZE: Final = {"<f4": 4, "<f8": 8}


def _length_error(kind: str, h: int, expected: int, what: str = "") -> MalformedFrame:
    return MalformedFrame(f"{kind}: header of {h} bytes, expected {what}{expected}",
                          code="bad_schema")


def _tail_error(kind: str, field: str, k: int, expected: int, h: int) -> MalformedFrame:
    return MalformedFrame(f"{kind}.{field}: {k} entries need a header of {expected} bytes, "
                          f"got {h}", code="bad_schema")


def _too_many(kind: str, field: str, k: int, most: int) -> MalformedFrame:
    return MalformedFrame(f"{kind}.{field}: {k} entries, at most {most}", code="bad_field")


def _field_error(cls: type[Message], values: dict[str, Any]) -> MalformedFrame:
    """The error for the first of ``values`` outside the schema, worded by its checker (the
    fast paths inline the same bounds; this names the field at fault)."""
    for name, v in values.items():
        try:
            cls._checks[name](cls.kind, name, v)
        except MalformedFrame as exc:
            return exc
    return MalformedFrame(f"{cls.kind}: a field is out of range", code="bad_field")


def _array_dtype(kind: str, itemsize: int, n: int, limits: FrameLimits) -> np.dtype:
    dtype = _DTYPES.get(itemsize)
    if dtype is None:
        raise MalformedFrame(f"{kind}.itemsize={itemsize}: expected 4 (<f4) or 8 (<f8)",
                             code="bad_dtype")
    if n * itemsize > limits.max_array_bytes:
        raise FrameTooLarge(f"{kind}: array of {n * itemsize} bytes exceeds "
                            f"{limits.max_array_bytes}", code="array_too_large")
    return dtype


def _no_arrays(kind: str) -> FrameTooLarge:
    return FrameTooLarge(f"{kind}: arrays not allowed in this connection state",
                         code="array_too_large")


def _placeholder(dtype: np.dtype, n: int) -> np.ndarray | None:
    # an empty array is delivered as is; a non-empty one is attached once the body is in
    return np.empty(0, dtype) if n == 0 else None


def _array_parts(kind: str, arr: np.ndarray) -> tuple[int, int, memoryview | None]:
    """(itemsize byte, n, byte view or None) of an array to send; never copies a contiguous
    1-D array (a strided one is copied once)."""
    itemsize = _ITEMSIZE.get(arr.dtype.str)
    if itemsize is None or arr.ndim != 1:
        raise LocalProtocolError(f"{kind}: array of dtype {arr.dtype.str} and shape {arr.shape} "
                                 "cannot be sent (1-D <f4 or <f8 only)")
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return itemsize, arr.shape[0], (arr.data.cast("B") if arr.nbytes else None)


def _head_struct(kind: str) -> struct.Struct:
    """prefix (u32) + version + kind code + the fixed part, for one pack call."""
    return struct.Struct(">IBB" + COMPACT_LAYOUTS[kind].fixed_struct.format[1:])


# -- compact kinds with fixed fields only: ready, ping, pong (one u53), resume (three u53)


def _u53_codec(cls: type[Message]) -> tuple[Encoder, Decoder]:
    layout = COMPACT_LAYOUTS[cls.kind]
    kind, code, names = cls.kind, KIND_CODES[cls.kind], cls._names
    size = layout.fixed_bytes
    pack, unpack = _head_struct(kind).pack, layout.fixed_struct.unpack_from
    get = attrgetter(*names)
    new = slot_constructor(cls)
    one = len(names) == 1

    def encode(msg: Message) -> tuple[bytes, None]:
        return (pack(size, _V, code, get(msg)) if one else pack(size, _V, code, *get(msg))), None

    def decode(buf: bytearray, pos: int, h: int, limits: FrameLimits) -> Decoded:
        if h != size:
            raise _length_error(kind, h, size)
        values = unpack(buf, pos + PREAMBLE_BYTES)
        if max(values) <= MAX_INT:
            return new(*values), None, 0
        raise _field_error(cls, dict(zip(names, values, strict=True)))

    return encode, decode


# -- chunk_report

_CR: Final = COMPACT_LAYOUTS["chunk_report"]
_CR_H: Final = _CR.fixed_bytes
_CR_UNPACK: Final = _CR.fixed_struct.unpack_from
_CR_PACK: Final = _head_struct("chunk_report").pack
_CR_GET: Final = attrgetter(*ChunkReport._names)
_CR_CODE: Final = KIND_CODES["chunk_report"]
_new_report: Final = slot_constructor(ChunkReport)


def _enc_chunk_report(msg: Message) -> tuple[bytes, None]:
    return _CR_PACK(_CR_H, _V, _CR_CODE, *_CR_GET(msg)), None


def _dec_chunk_report(buf: bytearray, pos: int, h: int, limits: FrameLimits) -> Decoded:
    if h != _CR_H:
        raise _length_error("chunk_report", h, _CR_H)
    e, r, c, t, el = _CR_UNPACK(buf, pos + PREAMBLE_BYTES)
    if (e <= MAX_INT and r <= MAX_INT and c <= MAX_WORKERS and 0.0 <= t <= _FMAX
            and 0.0 <= el <= _FMAX):
        return _new_report(e, r, c, t, el), None, 0
    raise _field_error(ChunkReport, {"epoch": e, "round": r, "count": c, "t_worker": t,
                                     "elapsed_s": el})


# -- encode_and_transmit

_ET: Final = COMPACT_LAYOUTS["encode_and_transmit"]
_ET_H: Final = _ET.fixed_bytes
_ET_UNPACK: Final = _ET.fixed_struct.unpack_from
_ET_PACK: Final = _head_struct("encode_and_transmit").pack
_ET_CODE: Final = KIND_CODES["encode_and_transmit"]
_new_encode: Final = slot_constructor(EncodeAndTransmit)


def _enc_encode(msg: Message) -> tuple[bytes, None]:
    assert isinstance(msg, EncodeAndTransmit)
    state = msg.state
    k = len(state)
    head = _ET_PACK(_ET_H + 4 * k, _V, _ET_CODE, msg.epoch, msg.round, msg.attempt, k)
    return head + struct.pack(f">{k}I", *state), None


def _dec_encode(buf: bytearray, pos: int, h: int, limits: FrameLimits) -> Decoded:
    if h < _ET_H:
        raise _length_error("encode_and_transmit", h, _ET_H, "at least ")
    e, r, a, k = _ET_UNPACK(buf, pos + PREAMBLE_BYTES)
    if k > MAX_WORKERS:
        raise _too_many("encode_and_transmit", "state", k, MAX_WORKERS)
    if h != _ET_H + 4 * k:
        raise _tail_error("encode_and_transmit", "state", k, _ET_H + 4 * k, h)
    state = struct.unpack_from(f">{k}I", buf, pos + _ET_H)
    if e <= MAX_INT and r <= MAX_INT and a <= MAX_INT and (not k or max(state) <= MAX_WORKERS):
        return _new_encode(e, r, a, state), None, 0
    raise _field_error(EncodeAndTransmit, {"epoch": e, "round": r, "attempt": a, "state": state})


# -- round_start

_RS: Final = COMPACT_LAYOUTS["round_start"]
_RS_H: Final = _RS.fixed_bytes
_RS_UNPACK: Final = _RS.fixed_struct.unpack_from
_RS_PACK: Final = _head_struct("round_start").pack
_RS_CODE: Final = KIND_CODES["round_start"]
_new_round_start: Final = slot_constructor(RoundStart)


def _enc_round_start(msg: Message) -> tuple[bytes, memoryview | None]:
    assert isinstance(msg, RoundStart)
    itemsize, n, view = _array_parts("round_start", msg.model)
    delays = msg.delays_s
    k = len(delays)
    head = _RS_PACK(_RS_H + 8 * k, _V, _RS_CODE, msg.epoch, msg.round, msg.net_delay_s,
                    itemsize, n, k)
    return (head + struct.pack(f">{k}d", *delays) if k else head), view


def _dec_round_start(buf: bytearray, pos: int, h: int, limits: FrameLimits) -> Decoded:
    if limits.max_array_bytes == 0:
        raise _no_arrays("round_start")
    if h < _RS_H:
        raise _length_error("round_start", h, _RS_H, "at least ")
    e, r, net, itemsize, n, k = _RS_UNPACK(buf, pos + PREAMBLE_BYTES)
    dtype = _array_dtype("round_start", itemsize, n, limits)
    if k > MAX_WORKERS:
        raise _too_many("round_start", "delays_s", k, MAX_WORKERS)
    if h != _RS_H + 8 * k:
        raise _tail_error("round_start", "delays_s", k, _RS_H + 8 * k, h)
    delays = struct.unpack_from(f">{k}d", buf, pos + _RS_H) if k else ()
    ok = e <= MAX_INT and r <= MAX_INT and 0.0 <= net <= _FMAX
    for x in delays:
        if not x >= 0.0:  # NaN and negatives fail; +inf (scheduled dead) is allowed
            ok = False
            break
    if ok:
        return _new_round_start(e, r, delays, net, _placeholder(dtype, n)), dtype, n
    raise _field_error(RoundStart, {"epoch": e, "round": r, "delays_s": delays,
                                    "net_delay_s": net})


# -- coded_gradient

_CG: Final = COMPACT_LAYOUTS["coded_gradient"]
_CG_H: Final = _CG.fixed_bytes
_CG_UNPACK: Final = _CG.fixed_struct.unpack_from
_CG_PACK: Final = _head_struct("coded_gradient").pack
_CG_CODE: Final = KIND_CODES["coded_gradient"]
_new_coded: Final = slot_constructor(CodedGradient)


def _enc_coded(msg: Message) -> tuple[bytes, memoryview | None]:
    assert isinstance(msg, CodedGradient)
    itemsize, n, view = _array_parts("coded_gradient", msg.payload)
    digest = msg.state_digest
    head = _CG_PACK(_CG_H + len(digest), _V, _CG_CODE, msg.epoch, msg.round, msg.attempt,
                    msg.compute_s, itemsize, n, len(digest))
    return head + digest, view


def _dec_coded(buf: bytearray, pos: int, h: int, limits: FrameLimits) -> Decoded:
    if limits.max_array_bytes == 0:
        raise _no_arrays("coded_gradient")
    if h < _CG_H:
        raise _length_error("coded_gradient", h, _CG_H, "at least ")
    e, r, a, cs, itemsize, n, k = _CG_UNPACK(buf, pos + PREAMBLE_BYTES)
    dtype = _array_dtype("coded_gradient", itemsize, n, limits)
    if k > MAX_BLOB:
        raise _too_many("coded_gradient", "state_digest", k, MAX_BLOB)
    if h != _CG_H + k:
        raise _tail_error("coded_gradient", "state_digest", k, _CG_H + k, h)
    digest = bytes(buf[pos + _CG_H:pos + h])
    if e <= MAX_INT and r <= MAX_INT and a <= MAX_INT and 0.0 <= cs <= _FMAX:
        return _new_coded(e, r, a, digest, cs, _placeholder(dtype, n)), dtype, n
    raise _field_error(CodedGradient, {"epoch": e, "round": r, "attempt": a, "compute_s": cs})


# -- msgpack kinds


class _ExtRejected(Exception):
    pass


def _no_ext(code: int, data: bytes) -> Any:
    raise _ExtRejected(f"ext type {code} not allowed")


def _unpack_map(raw: bytes, max_header_bytes: int) -> Any:
    try:
        return msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=_no_ext,
            max_ext_len=0,  # also rejects the timestamp ext (-1), which bypasses ext_hook
            max_str_len=min(MAX_STR_BYTES, max_header_bytes),
            max_bin_len=MAX_BIN_BYTES,
            max_array_len=MAX_ARRAY_LEN,
            max_map_len=MAX_MAP_LEN,
        )
    except msgpack.ExtraData as exc:
        raise MalformedFrame("trailing bytes after the header map", code="trailing_bytes") \
            from exc
    except _ExtRejected as exc:
        raise MalformedFrame(str(exc), code="ext_type") from exc
    except Exception as exc:  # msgpack's whole error surface: ValueError, StackError, ...
        if "max_ext_len" in str(exc):  # the ext bound tripped (best-effort finer code)
            raise MalformedFrame("ext types are not allowed", code="ext_type") from exc
        raise MalformedFrame(f"{type(exc).__name__}: {str(exc)[:80]}", code="bad_msgpack") \
            from exc


def _msgpack_codec(cls: type[Message]) -> tuple[Encoder, Decoder]:
    kind = cls.kind
    preamble = bytes([_V, KIND_CODES[kind]])
    assert cls.array_field is None, kind  # array kinds are compact

    def encode(msg: Message) -> tuple[bytes, None]:
        packed = msgpack.packb(msg.header_fields(), use_bin_type=True)
        h = PREAMBLE_BYTES + len(packed)
        if h > MAX_U32:
            raise LocalProtocolError(f"{kind}: header of {h} bytes exceeds u32")
        return _PREFIX.pack(h) + preamble + packed, None

    def decode(buf: bytearray, pos: int, h: int, limits: FrameLimits) -> Decoded:
        # a copy of the (rare, small) map: no view of the decoder's buffer outlives the call
        obj = _unpack_map(bytes(buf[pos + PREAMBLE_BYTES:pos + h]), limits.max_header_bytes)
        if type(obj) is not dict:
            raise MalformedFrame(f"{kind}: header is {type(obj).__name__}, not a map",
                                 code="bad_header")
        try:
            return cls.from_fields(obj), None, 0
        except MalformedFrame:
            raise
        except (TypeError, ValueError, OverflowError) as exc:  # defence in depth
            raise MalformedFrame(f"{kind}: {type(exc).__name__}: {str(exc)[:80]}",
                                 code="bad_field") from exc

    return encode, decode


def _codecs() -> tuple[dict[type, Encoder], list[Decoder | None]]:
    enc: dict[type, Encoder] = {}
    dec: list[Decoder | None] = [None] * 256
    hand: dict[type[Message], tuple[Encoder, Decoder]] = {
        ChunkReport: (_enc_chunk_report, _dec_chunk_report),
        EncodeAndTransmit: (_enc_encode, _dec_encode),
        RoundStart: (_enc_round_start, _dec_round_start),
        CodedGradient: (_enc_coded, _dec_coded),
    }
    for u53_cls in (Ready, Ping, Pong, Resume):
        hand[u53_cls] = _u53_codec(u53_cls)
    assert {c.kind for c in hand} == set(COMPACT_LAYOUTS)
    for kind, cls in KINDS.items():
        e, d = hand[cls] if cls in hand else _msgpack_codec(cls)
        enc[cls] = e
        dec[KIND_CODES[kind]] = d
    return enc, dec


_ENCODERS, _DECODERS = _codecs()
for _kind, _layout in COMPACT_LAYOUTS.items():  # the layouts name exactly the kinds' fields
    _named = {n for n, _ in _layout.fixed if n not in ("itemsize", "n")
              and not n.startswith("len(")} | ({_layout.tail[0]} if _layout.tail else set())
    assert _named == KINDS[_kind]._header_names, _kind


def _parse_header(buf: bytearray, pos: int, h: int, limits: FrameLimits) -> Decoded:
    """Validate the header of ``h`` bytes at ``buf[pos:]``; returns (message, dtype, n)."""
    if h < PREAMBLE_BYTES:
        raise MalformedFrame("header of 1 byte: no kind", code="bad_header")
    version = buf[pos]
    if version != _V:
        hint = " (a msgpack map: a version 1/2 header?)" if 0x80 <= version <= 0x8F else ""
        raise MalformedFrame(f"wire version {version}, expected {_V}{hint}", code="bad_version")
    decode = _DECODERS[buf[pos + 1]]
    if decode is None:
        raise MalformedFrame(f"unknown kind code {buf[pos + 1]}", code="unknown_kind")
    return decode(buf, pos, h, limits)


# ------------------------------------------------------------------------------- encoding


def _encode(msg: Message) -> tuple[bytes, memoryview | None]:
    try:
        return _ENCODERS[msg.__class__](msg)
    except struct.error as exc:  # a value outside its wire type: a bug in the sender
        raise LocalProtocolError(f"{msg.kind}: cannot encode: {exc}") from exc


def encode_frame(msg: Message) -> list[bytes | memoryview]:
    """Frame ``msg`` for ``transport.writelines`` / successive ``write`` calls.

    Returns ``[prefix + header]`` or, for a non-empty array, ``[prefix + header, view]`` where
    ``view`` is a byte memoryview of the message's array (no copy: do not mutate the array until
    it has been sent).
    """
    head, view = _encode(msg)
    return [head] if view is None else [head, view]


def encode_frame_bytes(msg: Message, auth: FrameAuth | None = None) -> bytes:
    """The whole frame as one ``bytes`` (copies the array; for tests and small messages),
    tagged by ``auth`` (which advances its sequence number) if given."""
    head, view = _encode(msg)
    out = head if view is None else head + bytes(view)
    return out if auth is None else out + auth.tag([out])


def decode_frame_bytes(data: bytes | bytearray | memoryview,
                       limits: FrameLimits = DEFAULT_LIMITS) -> Message:
    """Decode exactly one frame; a partial frame or extra bytes are MalformedFrame."""
    decoder = FrameDecoder(limits)
    msgs = decoder.feed(data)
    if not decoder.at_frame_boundary():
        raise MalformedFrame("data ends inside a frame", code="truncated")
    if len(msgs) != 1:
        raise MalformedFrame(f"expected exactly one frame, got {len(msgs)}", code="frame_count")
    return msgs[0]


# ------------------------------------------------------------------------------- decoding

# decoder states
_PREFIX_STATE: Final = 0
_HEADER_STATE: Final = 1
_BODY_STATE: Final = 2
_TAG_STATE: Final = 3


class FrameDecoder:
    """Incremental, sans-IO frame decoder.

    Two ways to drive it (do not mix them within one frame):

    * ``feed(data)``: copy-in; any split of the byte stream works, down to one byte at a time.
    * ``get_buffer(sizehint)`` / ``buffer_updated(nbytes)``: the ``asyncio.BufferedProtocol``
      contract. While a prefix/header is expected the buffer is internal; while an array body is
      expected it is a view *into the destination array* (from ``alloc``), so the socket writes
      the payload where it will be used, with no intermediate copy.

    Both return the messages completed by the new bytes, in order. ``limits`` may be replaced at
    any time (e.g. raised after authentication); it applies from the next frame's checks.

    A frame's prefix and header stay in the buffer, at ``_start``, until the header is parsed,
    so that a tag can be checked over them in place when the whole frame arrived in one read
    (the common case for small frames: no copy).
    """

    def __init__(self, limits: FrameLimits = DEFAULT_LIMITS, alloc: AllocFn | None = None) -> None:
        self.limits = limits
        #: verifies the tag of every frame from the next one on (None: frames carry no tag)
        self.auth: FrameAuth | None = None
        self._alloc = alloc
        self._head = b""  # prefix + header of the frame waiting for its tag
        self._tagged: Message | None = None  # message waiting for its tag
        #: wire size of the last frame delivered (prefix + header + body + tag)
        self.last_frame_nbytes = 0
        # header buffer: valid unparsed bytes are _buf[_start:_end]
        self._buf = bytearray(_READ_CHUNK)
        self._start = 0
        self._end = 0
        self._state = _PREFIX_STATE
        self._need = PREFIX_BYTES  # bytes still missing for the current prefix/header/tag
        self._hlen = 0  # H of the frame whose prefix was read
        # body state
        self._msg: Message | None = None
        self._dest: np.ndarray | None = None
        self._dest_view: memoryview | None = None
        #: the last alloc result found usable, with its n and dtype
        self._checked_dest: tuple[np.ndarray, int, np.dtype] | None = None
        self._body_pos = 0
        self._error: MalformedFrame | None = None
        self.frames_decoded = 0

    # -- public API ---------------------------------------------------------------------------

    def at_frame_boundary(self) -> bool:
        """True when no partial frame is buffered (EOF now would be clean)."""
        self._check_poisoned()
        return self._state == _PREFIX_STATE and self._start == self._end

    def feed(self, data: bytes | bytearray | memoryview) -> list[Message]:
        """Consume ``data`` (copied); return the completed messages."""
        self._check_poisoned()
        src = memoryview(data).cast("B")
        out: list[Message] = []
        while src:
            buf = self.get_buffer(len(src))
            k = min(len(buf), len(src))
            buf[:k] = src[:k]
            del buf
            out.extend(self.buffer_updated(k))
            src = src[k:]
        return out

    def release(self) -> None:
        """Drop the allocator and the buffers (the connection is gone); later calls raise."""
        self._alloc = None
        # a fresh error: the one that poisoned us holds a traceback whose frames reference
        # the connection (a cycle)
        self._poison(MalformedFrame("decoder released", code="closed"))

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Writable memoryview where the next received bytes must be placed (non-empty)."""
        self._check_poisoned()
        if self._state == _BODY_STATE:
            assert self._dest_view is not None
            return self._dest_view[self._body_pos:]
        # Make room for at least the rest of the current prefix/header, and for a sizeable read.
        pending = self._end - self._start
        want = max(self._need, min(max(sizehint, 0), _READ_CHUNK), 4096)
        if len(self._buf) - self._end < want:
            if pending + want <= len(self._buf) and self._start > 0:
                # compact (copy through a temporary: source and target may overlap)
                self._buf[:pending] = bytes(self._buf[self._start:self._end])
            else:
                # never resize in place: the transport may still hold a view of the old buffer
                new = bytearray(max(len(self._buf), pending + want))
                new[:pending] = self._buf[self._start:self._end]
                self._buf = new
            self._start, self._end = 0, pending
        return memoryview(self._buf)[self._end:]

    def buffer_updated(self, nbytes: int, *, max_messages: int | None = None) -> list[Message]:
        """``nbytes`` were written at the start of the last :meth:`get_buffer` view.

        Returns the completed messages, at most ``max_messages`` of them: complete frames beyond
        that stay buffered, unparsed, until :meth:`next_message`. A connection that must act on
        each message before the next one is even parsed (new limits after a handshake, ``alloc``
        depending on state the previous message changed) passes ``max_messages=1`` and then
        calls :meth:`next_message` until it returns None.
        """
        if self._error is not None:
            raise self._error
        try:
            return self._advance(nbytes, max_messages)
        except MalformedFrame as exc:
            self._poison(exc)
            raise

    def next_message(self) -> Message | None:
        """Parse the next frame from bytes already buffered; None if none is complete."""
        if self._error is not None:
            raise self._error
        if self._state == _BODY_STATE:
            return None
        try:
            msg = self._next_frame()
        except MalformedFrame as exc:
            self._poison(exc)
            raise
        if self._start == self._end:
            self._start = self._end = 0
        return msg

    # -- internals ----------------------------------------------------------------------------

    def _check_poisoned(self) -> None:
        if self._error is not None:
            raise self._error

    def _poison(self, exc: MalformedFrame) -> None:
        self._error = exc
        self._buf = bytearray(0)
        self._dest = self._dest_view = self._checked_dest = None
        self._msg = None

    def _advance(self, nbytes: int, limit: int | None) -> list[Message]:
        if nbytes < 0:
            raise LocalProtocolError(f"buffer_updated({nbytes})")
        if self._state == _BODY_STATE:
            return self._body_received(nbytes)
        self._end += nbytes
        out: list[Message] = []
        while limit is None or len(out) < limit:
            msg = self._next_frame()
            if msg is None:
                break
            out.append(msg)
        if self._start == self._end:
            self._start = self._end = 0
        return out

    def _body_received(self, nbytes: int) -> list[Message]:
        """``nbytes`` more of the body landed in the destination array."""
        if nbytes:
            self._body_pos += nbytes
            if self._body_pos >= len(self._dest_view):  # type: ignore[arg-type]
                done = self._finish_body()
                if done is not None:
                    return [done]
        return []

    def _next_frame(self) -> Message | None:
        """Parse buffered bytes until one message is complete (returned) or more bytes are
        needed, or the body of an array goes straight into its destination (None)."""
        while True:
            state = self._state
            if state == _TAG_STATE:
                return self._tag_from_buffer()
            avail = self._end - self._start
            if state == _PREFIX_STATE:
                if avail < PREFIX_BYTES:
                    self._need = PREFIX_BYTES - avail
                    return None
                self._read_prefix()
            total = PREFIX_BYTES + self._hlen
            if avail < total:
                self._need = total - avail  # the next get_buffer makes room for the rest
                return None
            msg = self._read_header()
            if msg is not None or self._state == _BODY_STATE:
                return msg
            # else a tag is awaited and not yet buffered (_TAG_STATE): loop to check

    def _read_prefix(self) -> None:
        (h,) = _PREFIX.unpack_from(self._buf, self._start)
        if h == 0:
            raise MalformedFrame("zero-length header", code="empty_header")
        if h > self.limits.max_header_bytes:
            raise FrameTooLarge(f"header of {h} bytes exceeds {self.limits.max_header_bytes}",
                                code="header_too_large")
        self._hlen = h
        self._state = _HEADER_STATE

    def _read_header(self) -> Message | None:
        """The whole prefix + header is buffered at ``_start``: validate it, then deliver the
        message (no body, no tag), check its tag in place, or start its body / tag."""
        buf, start, h = self._buf, self._start, self._hlen
        msg, dtype, n = _parse_header(buf, start + PREFIX_BYTES, h, self.limits)
        end = start + PREFIX_BYTES + h
        self.last_frame_nbytes = end - start
        auth = self.auth
        if dtype is None or n == 0:  # no body (an empty array keeps its (0,) placeholder)
            if auth is None:
                self._start = end
                return self._complete(msg)
            if self._end - end >= TAG_BYTES:  # the whole frame is here: verify in place
                self._start = end + TAG_BYTES
                if not auth.verify_one(buf[start:end], buf[end:end + TAG_BYTES]):
                    raise _bad_tag(msg)
                self.last_frame_nbytes += TAG_BYTES
                return self._complete(msg)
            self._head = bytes(buf[start:end])
            self._start = end
            self._await_tag(msg)
            return None
        self._start = end
        done = self._begin_body(msg, dtype, n)
        if auth is None:
            return done
        t = self._start
        if (self._state == _TAG_STATE and self._end - t >= TAG_BYTES
                and t - start <= _ONESHOT_BELOW):
            # prefix, header and body arrived in one read: verify them in place
            self._start = t + TAG_BYTES
            self._tagged = None
            if not auth.verify_one(buf[start:t], buf[t:t + TAG_BYTES]):
                raise _bad_tag(msg)
            self.last_frame_nbytes += TAG_BYTES
            return self._complete(msg)
        self._head = bytes(buf[start:end])  # for the tag, after the body or the tag arrived
        return None

    def _complete(self, msg: Message) -> Message:
        self._state = _PREFIX_STATE
        self._need = PREFIX_BYTES
        self.frames_decoded += 1
        return msg

    def _begin_body(self, msg: Message, dtype: np.dtype, n: int) -> Message | None:
        """Point the body at its destination, copy in what arrived with the header; the
        message if the body (and tag) completed from the buffer, else None."""
        dest = None
        if self._alloc is not None:
            fields_ = {name: getattr(msg, name) for name in msg._names
                       if name != msg.array_field}
            dest = self._alloc(msg.kind, fields_, dtype, n)
        if dest is None:
            dest = np.empty(n, dtype)
        else:
            checked = self._checked_dest  # alloc usually hands out the same row again
            if checked is None or checked[0] is not dest or checked[1] != n or checked[2] != dtype:
                if (not isinstance(dest, np.ndarray) or dest.dtype != dtype
                        or dest.shape != (n,) or not dest.flags.c_contiguous
                        or not dest.flags.writeable):
                    raise LocalProtocolError(
                        f"alloc returned an unusable destination for {msg.kind}")
                self._checked_dest = (dest, n, dtype)
        self._msg = msg
        self._dest = dest
        view = self._dest_view = dest.data.cast("B")
        self._state = _BODY_STATE
        # body bytes that arrived with the header: copy them into the destination
        take = min(self._end - self._start, len(view))
        if take:
            with memoryview(self._buf) as src:  # one copy, straight from the read buffer
                view[:take] = src[self._start:self._start + take]
            self._start += take
        self._body_pos = take
        if take < len(view):
            return None  # the rest of the body goes straight into the array via get_buffer
        return self._finish_body()  # None while its tag is awaited (_next_frame goes on)

    def _finish_body(self) -> Message | None:
        msg, dest = self._msg, self._dest
        assert msg is not None and msg.array_field is not None and dest is not None
        # The message was built (and validated) from the header before the body arrived and
        # has never left the decoder; give it its real array (same dtype, 1-D).
        object.__setattr__(msg, msg.array_field, dest)
        self.last_frame_nbytes += dest.nbytes
        self._msg = self._dest = self._dest_view = None
        self._body_pos = 0
        if self.auth is not None:
            self._await_tag(msg)
            return None
        return self._complete(msg)

    def _await_tag(self, msg: Message) -> None:
        self._tagged = msg
        self._state = _TAG_STATE
        self._need = TAG_BYTES

    def _tag_from_buffer(self) -> Message | None:
        """The awaited tag, if buffered: verify it over the saved head and the body."""
        avail = self._end - self._start
        if avail < TAG_BYTES:
            self._need = TAG_BYTES - avail
            return None
        tag = bytes(self._buf[self._start:self._start + TAG_BYTES])
        self._start += TAG_BYTES
        msg = self._tagged
        assert msg is not None and self.auth is not None
        arr = msg.array()
        parts: list[Any] = [self._head]
        if arr is not None and arr.nbytes:
            parts.append(arr.data.cast("B"))
        self._tagged = None
        self._head = b""
        if not self.auth.verify(parts, tag):
            raise _bad_tag(msg)
        self.last_frame_nbytes += TAG_BYTES
        return self._complete(msg)


def _bad_tag(msg: Message) -> MalformedFrame:
    return MalformedFrame(f"{msg.kind}: frame tag does not verify (forged, replayed, reordered "
                          "or corrupted)", code="bad_tag")
