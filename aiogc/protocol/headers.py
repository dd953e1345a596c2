"""Frame heads: the length prefix, the header of every kind (compact layouts, msgpack maps),
the limits checked on them, and one encoder and one validating decoder per kind. Sans-IO.

:mod:`aiogc.protocol.wire` (the frame format, in its docstring) drives these per frame: it
reads the prefix, hands the header to :func:`parse_header` and the body to the destination
array. docs/protocol.md §2 is generated from :data:`KIND_CODES` and :data:`COMPACT_LAYOUTS`.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Final

import msgpack
import numpy as np

from aiogc.errors import FrameTooLarge, LocalProtocolError, MalformedFrame
from aiogc.protocol.messages import (
    KINDS,
    MAX_BLOB,
    MAX_INT,
    MAX_ORDER_ENTRIES,
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
    "MAX_STR_BYTES",
    "PREAUTH_LIMITS",
    "PREFIX",
    "PREFIX_BYTES",
    "CompactLayout",
    "Decoded",
    "FrameLimits",
    "encode_head",
    "parse_header",
]

PREFIX: Final = struct.Struct(">I")
#: Size of the length prefix in bytes.
PREFIX_BYTES: Final = PREFIX.size
#: Largest value the u32 prefix can carry.
MAX_U32: Final = 2**32 - 1
#: Bytes before a header's fields: version, kind code.
PREAMBLE_BYTES: Final = 2

#: The kind byte of every header (docs/protocol.md §2.1). Never reuse a code.
#: Declared with each kind (``@_kind(..., kind_code=N)`` in messages.py).
KIND_CODES: Final = {kind: cls.kind_code for kind, cls in KINDS.items()}
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

#: ``0.0 <= x <= _FMAX`` is False for NaN, negative values and both infinities.
_FMAX: Final = sys.float_info.max


@dataclass(frozen=True, slots=True)
class FrameLimits:
    """Per-connection bounds, checked before anything is buffered or allocated.

    ``max_header_bytes``: largest accepted ``H``. ``max_array_bytes``: largest accepted
    ``n * itemsize``; 0 forbids array kinds. ``half_payloads``: coded_gradient may carry the
    16-bit payloads of a run with ``coded_dtype`` float16 / bfloat16 (issue 21; off: only
    ``<f4`` / ``<f8``, as on every connection of a default run).
    """

    max_header_bytes: int
    max_array_bytes: int
    half_payloads: bool = False

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
    #: an optional extension after the tail, ``(field, wire type of one entry)``: present only
    #: when the field is non-empty, as a u32 entry count then the entries (round_start's
    #: ``orders``, sent only under ordering="adaptive"; docs/protocol.md §2.1)
    extension: tuple[str, str] | None = None

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
                  ("delays_s", "f64"), ("orders", "u32")),
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
#: coded_gradient also carries the 16-bit payloads of ``coded_dtype`` (issue 21): byte 2 is
#: IEEE float16, byte 0x82 (2 with the high bit set) bfloat16 as ``<u2`` words, the upper
#: halves of float32 (aiogc.coding.compress); a default run never sends either
_CODED_DTYPES: Final[dict[int, np.dtype]] = {**_DTYPES, 2: np.dtype("<f2"),
                                             0x82: np.dtype("<u2")}
_ITEMSIZE: Final = {"<f4": 4, "<f8": 8, "<f2": 2, "<u2": 0x82}


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


def _array_dtype(kind: str, itemsize: int, n: int, limits: FrameLimits,
                 table: dict[int, np.dtype] = _DTYPES) -> np.dtype:
    dtype = table.get(itemsize)
    if dtype is None:
        raise MalformedFrame(f"{kind}.itemsize={itemsize}: expected 4 (<f4) or 8 (<f8)"
                             + (", 2 (<f2) or 0x82 (bfloat16)" if table is _CODED_DTYPES
                                else ""), code="bad_dtype")
    if n * dtype.itemsize > limits.max_array_bytes:
        raise FrameTooLarge(f"{kind}: array of {n * dtype.itemsize} bytes exceeds "
                            f"{limits.max_array_bytes}", code="array_too_large")
    return dtype


def _no_arrays(kind: str) -> FrameTooLarge:
    return FrameTooLarge(f"{kind}: arrays not allowed in this connection state",
                         code="array_too_large")


def _placeholder(dtype: np.dtype, n: int) -> np.ndarray | None:
    # an empty array is delivered as is; a non-empty one is attached once the body is in
    return np.empty(0, dtype) if n == 0 else None


#: the usual payload dtypes, by dtype object (no ``dtype.str`` per frame); a dtype not here
#: takes the general lookup of :func:`_array_parts`
_SEND_ITEMSIZE: Final = {np.dtype("<f4"): 4, np.dtype("<f8"): 8}


def _array_parts(kind: str, arr: np.ndarray) -> tuple[int, int, memoryview | None]:
    """(itemsize byte, n, byte view or None) of an array to send; never copies a contiguous
    1-D array (a strided one is copied once)."""
    itemsize = _SEND_ITEMSIZE.get(arr.dtype)
    if itemsize is None:
        itemsize = _ITEMSIZE.get(arr.dtype.str)
        if itemsize is not None and itemsize not in _DTYPES and kind != "coded_gradient":
            itemsize = None  # the 16-bit types travel in coded_gradient only
    if itemsize is None or arr.ndim != 1:
        raise LocalProtocolError(f"{kind}: array of dtype {arr.dtype.str} and shape {arr.shape} "
                                 "cannot be sent (1-D <f4 or <f8 only)")
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return itemsize, arr.shape[0], (arr.data.cast("B") if arr.nbytes else None)


#: ``k`` -> unpack_from of ``k`` big-endian entries of one struct code (the tails of the hot
#: kinds: a run sends the same few lengths every round); small ``k`` only, so a peer cannot
#: grow it without bound
_TAILS: Final[dict[tuple[str, int], struct.Struct]] = {}


def _tail_struct(code: str, k: int) -> struct.Struct:
    st = _TAILS.get((code, k))
    if st is None:
        st = struct.Struct(f">{k}{code}")
        if k <= 256:
            _TAILS[code, k] = st
    return st


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
    return head + _tail_struct("I", k).pack(*state), None


def _dec_encode(buf: bytearray, pos: int, h: int, limits: FrameLimits) -> Decoded:
    if h < _ET_H:
        raise _length_error("encode_and_transmit", h, _ET_H, "at least ")
    e, r, a, k = _ET_UNPACK(buf, pos + PREAMBLE_BYTES)
    if k > MAX_WORKERS:
        raise _too_many("encode_and_transmit", "state", k, MAX_WORKERS)
    if h != _ET_H + 4 * k:
        raise _tail_error("encode_and_transmit", "state", k, _ET_H + 4 * k, h)
    state = _tail_struct("I", k).unpack_from(buf, pos + _ET_H)
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


def _rs_head(k: int) -> struct.Struct:
    """prefix + preamble + fixed part + ``k`` delays, for one pack call."""
    st = _RS_HEADS.get(k)
    if st is None:
        st = struct.Struct(_RS_PACK_FMT + f"{k}d")
        if k <= 256:
            _RS_HEADS[k] = st
    return st


_RS_PACK_FMT: Final = _head_struct("round_start").format
_RS_HEADS: Final[dict[int, struct.Struct]] = {}


def _enc_round_start(msg: Message) -> tuple[bytes, memoryview | None]:
    assert isinstance(msg, RoundStart)
    itemsize, n, view = _array_parts("round_start", msg.model)
    delays = msg.delays_s
    k = len(delays)
    orders = msg.orders
    extra = 4 + 4 * len(orders) if orders else 0  # the adaptive-order extension (§2.1)
    head = _rs_head(k).pack(_RS_H + 8 * k + extra, _V, _RS_CODE, msg.epoch, msg.round,
                            msg.net_delay_s, itemsize, n, k, *delays)
    if orders:
        head += struct.pack(f">I{len(orders)}I", len(orders), *orders)
    return head, view


def _dec_rs_orders(buf: bytearray, pos: int, h: int, end: int) -> tuple[int, ...]:
    """The optional ``orders`` extension after ``delays_s`` (``end``: where it starts)."""
    if h < end + 4:
        raise _tail_error("round_start", "orders", 0, end + 4, h)
    (n,) = struct.unpack_from(">I", buf, pos + end)
    if n == 0 or n > MAX_ORDER_ENTRIES:
        raise _too_many("round_start", "orders", n, MAX_ORDER_ENTRIES)
    if h != end + 4 + 4 * n:
        raise _tail_error("round_start", "orders", n, end + 4 + 4 * n, h)
    orders = struct.unpack_from(f">{n}I", buf, pos + end + 4)
    if max(orders) >= MAX_WORKERS:
        raise MalformedFrame(f"round_start.orders={max(orders)}: expected ints in "
                             f"[0, {MAX_WORKERS - 1}]", code="bad_field")
    return orders


def _dec_round_start(buf: bytearray, pos: int, h: int, limits: FrameLimits) -> Decoded:
    if limits.max_array_bytes == 0:
        raise _no_arrays("round_start")
    if h < _RS_H:
        raise _length_error("round_start", h, _RS_H, "at least ")
    e, r, net, itemsize, n, k = _RS_UNPACK(buf, pos + PREAMBLE_BYTES)
    dtype = _DTYPES.get(itemsize)
    if dtype is None or n * itemsize > limits.max_array_bytes:
        dtype = _array_dtype("round_start", itemsize, n, limits)  # raises
    if k > MAX_WORKERS:
        raise _too_many("round_start", "delays_s", k, MAX_WORKERS)
    end = _RS_H + 8 * k
    if h < end or end < h < end + 4:
        raise _tail_error("round_start", "delays_s", k, end, h)
    orders = () if h == end else _dec_rs_orders(buf, pos, h, end)
    delays = _tail_struct("d", k).unpack_from(buf, pos + _RS_H) if k else ()
    # every delay >= 0: +inf (scheduled dead) is allowed, negatives fail the min, and a NaN
    # anywhere makes the sum NaN (min() may skip one; a sum of values >= 0 is never NaN)
    if (e <= MAX_INT and r <= MAX_INT and 0.0 <= net <= _FMAX
            and (not k or (min(delays) >= 0.0 and (total := sum(delays)) == total))):
        return _new_round_start(e, r, delays, net, None if n else np.empty(0, dtype),
                                orders), dtype, n
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
    dtype = _DTYPES.get(itemsize)  # <f4 / <f8: itemsize byte == itemsize
    if dtype is None or n * itemsize > limits.max_array_bytes:
        dtype = _array_dtype("coded_gradient", itemsize, n, limits,
                             _CODED_DTYPES if limits.half_payloads else _DTYPES)
    if k > MAX_BLOB:
        raise _too_many("coded_gradient", "state_digest", k, MAX_BLOB)
    if h != _CG_H + k:
        raise _tail_error("coded_gradient", "state_digest", k, _CG_H + k, h)
    digest = bytes(buf[pos + _CG_H:pos + h])
    if e <= MAX_INT and r <= MAX_INT and a <= MAX_INT and 0.0 <= cs <= _FMAX:
        return _new_coded(e, r, a, digest, cs, None if n else np.empty(0, dtype)), dtype, n
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
        return PREFIX.pack(h) + preamble + packed, None

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
              and not n.startswith("len(")} | ({_layout.tail[0]} if _layout.tail else set()) \
        | ({_layout.extension[0]} if _layout.extension else set())
    assert _named == KINDS[_kind]._header_names, _kind


def parse_header(buf: bytearray, pos: int, h: int, limits: FrameLimits) -> Decoded:
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


def encode_head(msg: Message) -> tuple[bytes, memoryview | None]:
    """``(prefix + header, byte view of the array or None)`` of ``msg``."""
    try:
        return _ENCODERS[msg.__class__](msg)
    except struct.error as exc:  # a value outside its wire type: a bug in the sender
        raise LocalProtocolError(f"{msg.kind}: cannot encode: {exc}") from exc
