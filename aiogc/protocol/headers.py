"""The frame codec: the length prefix, one msgpack array per frame, its limits, and the
encoder and validating decoder of every kind, all built from one field table. Sans-IO.

:mod:`aiogc.protocol.wire` (the frame format, in its docstring) drives these per frame: it
reads the prefix, hands the buffered bytes to :func:`parse_head` and the payload to the
destination array. :data:`WIRE_FIELDS` is the table: each kind's fields in wire order, each
with the checker of :mod:`aiogc.protocol.messages` that carries its msgpack form (``.wire``,
a msgspec type with the checker's bounds; ``.tag``). docs/protocol.md §2.1 and the Wireshark
dissector (:mod:`aiogc.protocol.dissector`) are generated from it.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any, Final, Literal

import msgpack
import msgspec
import numpy as np

from aiogc.errors import FrameTooLarge, LocalProtocolError, MalformedFrame
from aiogc.protocol.messages import (
    KINDS,
    MAX_BLOB,
    MAX_ORDER_ENTRIES,
    MAX_TEXT,
    PROTOCOL_VERSION,
    Message,
    _wire,
)

__all__ = [
    "DEFAULT_LIMITS",
    "DTYPE_CODES",
    "KIND_CODES",
    "MAX_STR_BYTES",
    "PAYLOAD_HEAD_BYTES",
    "PREAUTH_LIMITS",
    "PREFIX",
    "PREFIX_BYTES",
    "WIRE_FIELDS",
    "Decoded",
    "FrameLimits",
    "encode_head",
    "parse_head",
]

PREFIX: Final = struct.Struct(">I")
#: Size of the length prefix in bytes.
PREFIX_BYTES: Final = PREFIX.size
#: Largest value the u32 prefix can carry.
MAX_U32: Final = 2**32 - 1
#: The first bytes of every body: a fixarray header, the version, the kind code (fixints).
PREAMBLE_BYTES: Final = 3
#: A payload travels as a msgpack bin32: ``0xc6`` and a big-endian u32 byte count.
PAYLOAD_HEAD_BYTES: Final = 5
_BIN32: Final = struct.Struct(">BI")

#: The kind code of every frame (docs/protocol.md §2.1). Never reuse a code.
#: Declared with each kind (``@_kind(..., kind_code=N)`` in messages.py).
KIND_CODES: Final = {kind: cls.kind_code for kind, cls in KINDS.items()}
assert set(KIND_CODES) == set(KINDS) and len(set(KIND_CODES.values())) == len(KINDS)
assert max(KIND_CODES.values()) < 128  # a positive fixint

#: Longest str in a frame: MAX_TEXT characters of up to 4 UTF-8 bytes each.
MAX_STR_BYTES: Final = 4 * MAX_TEXT


@dataclass(frozen=True, slots=True)
class FrameLimits:
    """Per-connection bounds, checked before anything is buffered or allocated.

    ``max_header_bytes``: largest accepted head (the body without its payload bytes).
    ``max_array_bytes``: largest accepted payload; 0 forbids array kinds. ``half_payloads``:
    coded_gradient may carry the 16-bit payloads of a run with ``coded_dtype`` float16 /
    bfloat16 (off: only ``<f4`` / ``<f8``, as on every connection of a default run).
    """

    max_header_bytes: int
    max_array_bytes: int
    half_payloads: bool = False

    def __post_init__(self) -> None:
        if type(self.max_header_bytes) is not int or not 1 <= self.max_header_bytes <= MAX_U32:
            raise LocalProtocolError(f"max_header_bytes={self.max_header_bytes!r} not in [1, 2^32)")
        if type(self.max_array_bytes) is not int or self.max_array_bytes < 0:
            raise LocalProtocolError(f"max_array_bytes={self.max_array_bytes!r} must be >= 0")

    @property
    def max_body_bytes(self) -> int:
        """Largest accepted length prefix."""
        if self.max_array_bytes == 0:
            return self.max_header_bytes
        return self.max_header_bytes + self.max_array_bytes


#: Before authentication: a hello (worker id, two 32-byte blobs, epoch) packs to ~90 bytes;
#: 512 leaves room and keeps a flood of unauthenticated connections cheap. No arrays.
PREAUTH_LIMITS: Final = FrameLimits(max_header_bytes=512, max_array_bytes=0)
#: After authentication: 1 MiB fits a head with a full 65536-entry delay row (9 bytes per
#: entry = 576 KiB). 256 MiB of array = d <= 3.3e7 float64; the core should tighten it to the
#: exact expected payload size once d is known.
DEFAULT_LIMITS: Final = FrameLimits(max_header_bytes=1 << 20, max_array_bytes=256 << 20)


# ------------------------------------------------------------------------------- the table

#: The dtype code before an array kind's payload -> the payload's dtype: 4 ``<f4``, 8 ``<f8``;
#: coded_gradient also carries the 16-bit payloads of ``coded_dtype``: 2 IEEE float16, 0x82
#: bfloat16 as ``<u2`` words, the upper halves of float32 (aiogc.coding.compress); a default
#: run never sends either.
DTYPE_CODES: Final[dict[int, np.dtype]] = {4: np.dtype("<f4"), 8: np.dtype("<f8"),
                                           2: np.dtype("<f2"), 0x82: np.dtype("<u2")}
_FULL_DTYPES: Final = {k: v for k, v in DTYPE_CODES.items() if k in (4, 8)}
_CODE_OF: Final = {dt: code for code, dt in DTYPE_CODES.items()}
#: the field naming an array kind's payload dtype, just before the payload
DTYPE_FIELD: Final = "dtype"


def _dtype_code(kind: str, name: str, v: object) -> int:
    if type(v) is not int or v not in DTYPE_CODES:
        raise MalformedFrame(f"{kind}.{name}={v!r}: expected 4 (<f4) or 8 (<f8)"
                             + (", 2 (<f2) or 0x82 (bfloat16)" if kind == "coded_gradient"
                                else ""), code="bad_dtype")
    return v


_LITERAL: Any = Literal
_wire(_dtype_code, _LITERAL[tuple(DTYPE_CODES)], "dtype")


def _wire_fields(cls: type[Message]) -> tuple[tuple[str, Any], ...]:
    head = tuple((n, cls._checks[n]) for n in cls._names if n != cls.array_field)
    if cls.array_field is None:
        return head
    return (*head, (DTYPE_FIELD, _dtype_code),
            (cls.array_field, cls._checks[cls.array_field]))


#: kind -> ``(field name, checker)`` in wire order: the message's fields in declaration
#: order, an array kind's payload moved last with its dtype code before it. A frame's body
#: is the msgpack array ``[PROTOCOL_VERSION, kind code, *fields]``.
WIRE_FIELDS: Final = {kind: _wire_fields(cls) for kind, cls in KINDS.items()}


# ------------------------------------------------------------------------------- codecs

_V: Final = PROTOCOL_VERSION
#: (message, payload dtype or None, payload element count, head bytes of the body)
Decoded = tuple[Message, "np.dtype | None", int, int]
#: ``decode(buf, pos, avail, size, limits)``: the body of ``size`` bytes starts at
#: ``buf[pos]``, ``avail`` of them (or more) are buffered; returns :data:`Decoded`, or the
#: number of bytes still needed before it can
Decoder = Callable[[bytearray, int, int, int, "FrameLimits"], "Decoded | int"]
Encoder = Callable[[Message], "tuple[bytes, memoryview | None]"]

_ENC: Final = msgspec.msgpack.Encoder()
_PATH: Final = re.compile(r"at `\$\[(\d+)\]")


def _head_constructor(cls: type[Message], names: tuple[str, ...]) -> Any:
    """``make(version, kind, *fields)``: the message from a decoded tuple, unvalidated (the
    first two arguments are ignored; as :func:`~aiogc.protocol.messages.slot_constructor`)."""
    ns: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    for i, name in enumerate(names):
        ns[f"_s{i}"] = getattr(cls, name).__set__  # the slot's member descriptor
    args = ", ".join(f"a{i}" for i in range(len(names)))
    body = "".join(f"    _s{i}(o, a{i})\n" for i in range(len(names)))
    exec(f"def make(_v, _k, {args}):\n    o = _new(_cls)\n{body}    return o\n", ns)
    return ns["make"]


class _ExtRejected(Exception):
    pass


def _no_ext(code: int, data: bytes) -> Any:
    raise _ExtRejected(f"ext type {code} not allowed")


# msgpack bounds of the error path's second look at a body (:func:`_decode_error`): each caps
# one length the unpacker would otherwise trust from the peer
#: Longest bin in a head: nonces, MACs and digests only (payloads are not decoded here).
MAX_BIN_BYTES: Final = MAX_BLOB
#: Longest msgpack array in a head: a round's ``orders``.
MAX_ARRAY_LEN: Final = MAX_ORDER_ENTRIES
#: Most keys in one msgpack map: welcome's config (64 entries) with room.
MAX_MAP_LEN: Final = 128


def _plain_msgpack(kind: str, raw: Any) -> Any:
    """``raw`` decoded by msgpack-python under the protocol's msgpack rules (bounded lengths,
    str map keys, no ext types, nothing after the value), or the MalformedFrame naming the
    rule it breaks."""
    try:
        return msgpack.unpackb(
            raw, raw=False, strict_map_key=True, use_list=True, ext_hook=_no_ext,
            max_ext_len=0,  # also rejects the timestamp ext (-1), which bypasses ext_hook
            max_str_len=MAX_STR_BYTES, max_bin_len=MAX_BIN_BYTES,
            max_array_len=MAX_ARRAY_LEN, max_map_len=MAX_MAP_LEN)
    except msgpack.ExtraData as exc:
        raise MalformedFrame(f"{kind}: trailing bytes after the msgpack array",
                             code="trailing_bytes") from exc
    except _ExtRejected as exc:
        raise MalformedFrame(f"{kind}: {exc}", code="ext_type") from exc
    except Exception as exc:  # msgpack's whole error surface: ValueError, StackError, ...
        if "max_ext_len" in str(exc):  # the ext bound tripped
            raise MalformedFrame(f"{kind}: ext types are not allowed", code="ext_type") from exc
        raise MalformedFrame(f"{kind}: {type(exc).__name__}: {str(exc)[:80]}",
                             code="bad_msgpack") from exc


def _decode_error(cls: type[Message], names: tuple[str, ...], exc: Exception,
                  raw: Any) -> MalformedFrame:
    """The MalformedFrame for msgspec's error on a body (or an array kind's head) of ``cls``:
    the msgpack rule it breaks if any, else the field at fault worded by its checker, else
    the field count. Error path only: the body is bounded, so is this second look."""
    kind = cls.kind
    try:
        values = _plain_msgpack(kind, raw)
    except MalformedFrame as err:
        return err
    if type(values) is not list or len(values) != len(names) + 2:
        return MalformedFrame(f"{kind}: {len(values)} values, expected {len(names) + 2}: "
                              f"[version, kind, {', '.join(names)}]", code="bad_schema")
    if values[0] != _V:
        return MalformedFrame(f"wire version {values[0]!r}, expected {_V}", code="bad_version")
    for name, value, (_, checker) in zip(names, values[2:], WIRE_FIELDS[kind], strict=False):
        if checker.wire is None:  # the payload: checked by the caller
            continue
        try:
            checker(kind, name, value)
        except MalformedFrame as err:
            return err
    text = str(exc)
    match = _PATH.search(text)
    name = names[int(match.group(1)) - 2] if match and int(match.group(1)) >= 2 else ""
    return MalformedFrame(f"{kind}.{name}: {text[:80]}", code="bad_field")


def _numbers(fields: tuple[tuple[str, Any], ...]) -> Any:
    """A getter of the number fields' values from the tuple of the head's values (every
    number on the wire is >= 0: a negative one is a bug in the sender), or None."""
    idx = [i for i, (_, c) in enumerate(fields) if c.tag in ("uint", "float")]
    if not idx:
        return None
    return (lambda v: (v[idx[0]],)) if len(idx) == 1 else itemgetter(*idx)


def _negative(msg: Message, names: tuple[str, ...], values: tuple[Any, ...]) -> Exception:
    bad = [f"{n}={v!r}" for n, v in zip(names, values, strict=False)
           if isinstance(v, int | float) and v < 0]
    return LocalProtocolError(f"{msg.kind}: cannot encode {', '.join(bad)} (negative)")


def _plain_codec(cls: type[Message]) -> tuple[Encoder, Decoder]:
    """A kind without a payload: the whole body is decoded once buffered."""
    kind, code = cls.kind, cls.kind_code
    fields = WIRE_FIELDS[kind]
    names = tuple(n for n, _ in fields)
    pre = (_V, code)
    get = attrgetter(*names)
    one = len(names) == 1
    encode_msgpack = _ENC.encode
    pack = PREFIX.pack
    dec = msgspec.msgpack.Decoder(_body_type(code, (c.wire for _, c in fields)))
    decode_msgpack = dec.decode
    new = _head_constructor(cls, names)
    numbers = _numbers(fields)

    def encode(msg: Message) -> tuple[bytes, None]:
        values = (get(msg),) if one else get(msg)
        if numbers and min(numbers(values)) < 0:
            raise _negative(msg, names, values)
        body = encode_msgpack(pre + values)
        return pack(len(body)) + body, None

    def decode(buf: bytearray, pos: int, avail: int, size: int,
               limits: FrameLimits) -> Decoded | int:
        if size > limits.max_header_bytes:
            raise _too_large(kind, size, limits)
        if avail < size:
            return size - avail
        raw = buf[pos:pos + size]  # a copy of a small body: no view of the buffer outlives
        try:
            return new(*decode_msgpack(raw)), None, 0, size
        except Exception as exc:  # msgspec's errors, UnicodeDecodeError, RecursionError, ...
            raise _decode_error(cls, names, exc, raw) from None

    return encode, decode


def _too_large(kind: str, size: int, limits: FrameLimits) -> FrameTooLarge:
    return FrameTooLarge(f"{kind}: body of {size} bytes exceeds {limits.max_header_bytes}",
                         code="header_too_large")


def _no_arrays(kind: str) -> FrameTooLarge:
    return FrameTooLarge(f"{kind}: arrays not allowed in this connection state",
                         code="array_too_large")


#: the usual payload dtypes, by dtype object (no ``dtype.str`` per frame)
_SEND_CODE: Final = {np.dtype("<f4"): 4, np.dtype("<f8"): 8}


def _array_parts(kind: str, arr: np.ndarray) -> tuple[int, int, memoryview | None]:
    """(dtype code, byte count, byte view or None) of an array to send; never copies a
    contiguous 1-D array (a strided one is copied once)."""
    code = _SEND_CODE.get(arr.dtype)
    if code is None:
        code = _CODE_OF.get(arr.dtype)
        if code is not None and code not in _FULL_DTYPES and kind != "coded_gradient":
            code = None  # the 16-bit types travel in coded_gradient only
    if code is None or arr.ndim != 1:
        raise LocalProtocolError(f"{kind}: array of dtype {arr.dtype.str} and shape {arr.shape} "
                                 "cannot be sent (1-D <f4 or <f8 only)")
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return code, arr.nbytes, (arr.data.cast("B") if arr.nbytes else None)


# Skipping msgpack values without decoding them (an array kind's head, to find where its
# payload starts). _SIZE[b]: bytes of a value whose first byte is b when that byte fixes it,
# else 0: _LEN[b] = (bytes of the length field, bytes before the data) for str/bin, _CONT[b]
# = (bytes of the count field, values per entry) for array/map; ext and 0xc1 are neither.
_SIZE: Final = [0] * 256
for _b in range(0x00, 0x80):
    _SIZE[_b] = 1
for _b in range(0xE0, 0x100):
    _SIZE[_b] = 1
for _b in range(0xA0, 0xC0):
    _SIZE[_b] = 1 + (_b & 0x1F)
for _b, _n in ((0xC0, 1), (0xC2, 1), (0xC3, 1), (0xCA, 5), (0xCB, 9), (0xCC, 2), (0xCD, 3),
               (0xCE, 5), (0xCF, 9), (0xD0, 2), (0xD1, 3), (0xD2, 5), (0xD3, 9)):
    _SIZE[_b] = _n
_BIN_LEN: Final = {0xC4: 1, 0xC5: 2, 0xC6: 4}
_LEN: Final = {**_BIN_LEN, 0xD9: 1, 0xDA: 2, 0xDB: 4}
_CONT: Final = {**{b: (0, 1) for b in range(0x90, 0xA0)}, **{b: (0, 2) for b in range(0x80, 0x90)},
                0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}
_UNSIGNED: Final = {1: struct.Struct(">B"), 2: struct.Struct(">H"), 4: struct.Struct(">I")}


def _skip(kind: str, buf: bytearray, p: int, end: int, count: int) -> int:
    """Offset just past ``count`` msgpack values at ``buf[p:]``, or -1 if they do not all
    end before ``end``."""
    size, lens, cont = _SIZE, _LEN, _CONT
    while count:
        if p >= end:
            return -1
        b = buf[p]
        s = size[b]
        if s:
            p += s
            count -= 1
            continue
        if b in lens:
            w = lens[b]
            if p + 1 + w > end:
                return -1
            p += 1 + w + _UNSIGNED[w].unpack_from(buf, p + 1)[0]
            count -= 1
            continue
        if b in cont:
            w, per = cont[b]
            if p + 1 + w > end:
                return -1
            k = (b & 0x0F) if w == 0 else _UNSIGNED[w].unpack_from(buf, p + 1)[0]
            p += 1 + w
            count += k * per - 1
            continue
        code = "ext_type" if b in (0xC7, 0xC8, 0xC9) or 0xD4 <= b <= 0xD8 else "bad_msgpack"
        raise MalformedFrame(f"{kind}: byte 0x{b:02x} is not an allowed msgpack value",
                             code=code)
    return p


def _head_end(kind: str, array_field: str, buf: bytearray, pos: int, avail: int, size: int,
              limits: FrameLimits, nhead: int) -> int:
    """Offset of the payload's bin header in the body at ``buf[pos:]`` (``avail`` bytes
    buffered), once the head up to and including it is buffered; else minus the number of
    bytes to wait for."""
    got = min(avail, size)
    p = _skip(kind, buf, pos + PREAMBLE_BYTES, pos + got, nhead)
    head = -1
    if 0 <= p < pos + got:
        lens = _BIN_LEN.get(buf[p])
        if lens is None:
            raise MalformedFrame(f"{kind}.{array_field}: expected a msgpack bin, got "
                                 f"byte 0x{buf[p]:02x}", code="bad_schema")
        head = p + 1 + lens - pos
    if not 0 <= head <= got:  # the head is not all buffered yet
        if got >= size:
            raise MalformedFrame(f"{kind}: the values before the payload run past the "
                                 f"body's {size} bytes", code="bad_schema")
        if got >= limits.max_header_bytes:
            raise _too_large(kind, got, limits)
        # geometric: a long head is rescanned O(log) times
        return -min(size - avail, max(avail, 64), max(limits.max_header_bytes - avail, 1))
    if head > limits.max_header_bytes:
        raise _too_large(kind, head, limits)
    return p


def _payload_shape(kind: str, array_field: str, dcode: int, nbytes: int, head: int, size: int,
                   limits: FrameLimits) -> tuple[np.dtype, int]:
    """(dtype, element count) of a payload of ``nbytes`` after a head of ``head`` bytes in a
    body of ``size``, checked against the limits."""
    dtype = DTYPE_CODES[dcode]
    if dcode not in _FULL_DTYPES and not (kind == "coded_gradient" and limits.half_payloads):
        raise MalformedFrame(f"{kind}.{DTYPE_FIELD}={dcode}: expected 4 (<f4) or 8 (<f8)",
                             code="bad_dtype")
    if nbytes > limits.max_array_bytes:
        raise FrameTooLarge(f"{kind}: array of {nbytes} bytes exceeds "
                            f"{limits.max_array_bytes}", code="array_too_large")
    if head + nbytes != size:
        raise MalformedFrame(f"{kind}: head of {head} bytes and a payload of {nbytes} "
                             f"bytes, in a body of {size}", code="bad_schema")
    n, rest = divmod(nbytes, dtype.itemsize)
    if rest:
        raise MalformedFrame(f"{kind}.{array_field}: {nbytes} bytes is not a whole "
                             f"number of {dtype.str} values", code="bad_schema")
    return dtype, n


class _ArrayCodec:
    """An array kind: the head (everything before the payload bin) is decoded as soon as it
    is buffered; the payload's bytes go to their destination."""

    def __init__(self, cls: type[Message]) -> None:
        self.cls, self.kind = cls, cls.kind
        fields = WIRE_FIELDS[cls.kind]
        self.names = tuple(n for n, _ in fields)
        self.array_field = self.names[-1]
        self.head_names = self.names[:-2]  # without the dtype code and the payload
        self.nhead = len(self.names) - 1  # values between the kind code and the payload
        self.get = attrgetter(*self.head_names)
        self.pre = (_V, cls.kind_code)
        self.fixarray = 0x90 | (len(self.names) + 2)
        self.decode_head = msgspec.msgpack.Decoder(
            _body_type(cls.kind_code, (c.wire for _, c in fields[:-1]))).decode
        # the whole body at once, its payload a view of the buffer (when it is all buffered)
        self.decode_whole = msgspec.msgpack.Decoder(
            _body_type(cls.kind_code, (*(c.wire for _, c in fields[:-1]), memoryview))).decode
        self.new = _head_constructor(cls, (*self.head_names, self.array_field))
        self.numbers = _numbers(fields)

    def encode(self, msg: Message) -> tuple[bytes, memoryview | None]:
        values = self.get(msg)
        if min(self.numbers(values)) < 0:
            raise _negative(msg, self.head_names, values)
        dcode, nbytes, view = _array_parts(self.kind, getattr(msg, self.array_field))
        # the last value encodes as an empty bin8 (c4 00): its two bytes give way to the
        # payload's bin32 header
        body = _ENC.encode((*self.pre, *values, dcode, b""))
        size = len(body) - 2 + PAYLOAD_HEAD_BYTES + nbytes
        if size > MAX_U32:
            raise LocalProtocolError(f"{self.kind}: body of {size} bytes exceeds u32")
        return PREFIX.pack(size) + body[:-2] + _BIN32.pack(0xC6, nbytes), view

    def whole(self, buf: bytearray, pos: int, size: int, limits: FrameLimits) -> Decoded | None:
        """The body, all buffered, in one typed decode (its payload a view, released);
        None: not a plainly valid body (the scan words any error)."""
        with memoryview(buf) as view, view[pos:pos + size] as raw:
            try:
                values = self.decode_whole(raw)
            except Exception:  # the scan words the error
                return None
            nbytes = len(values[-1])
            values[-1].release()
        dtype = _FULL_DTYPES.get(values[-2])
        if (dtype is None or nbytes > limits.max_array_bytes
                or size - nbytes > limits.max_header_bytes or nbytes % dtype.itemsize):
            return None
        n = nbytes // dtype.itemsize
        msg = self.new(*values[:-2], np.empty(0, dtype) if n == 0 else None)
        return msg, dtype, n, size - nbytes

    def decode(self, buf: bytearray, pos: int, avail: int, size: int,
               limits: FrameLimits) -> Decoded | int:
        kind = self.kind
        if limits.max_array_bytes == 0:
            raise _no_arrays(kind)
        if buf[pos] != self.fixarray:
            raise MalformedFrame(f"{kind}: a fixarray of {len(self.names) + 2} values expected, "
                                 f"got byte 0x{buf[pos]:02x}", code="bad_schema")
        if avail >= size:  # all buffered: one typed decode, no scan (the common case)
            done = self.whole(buf, pos, size, limits)
            if done is not None:
                return done
        p = _head_end(kind, self.array_field, buf, pos, avail, size, limits, self.nhead)
        if p < 0:
            return -p
        lens = _BIN_LEN[buf[p]]
        head = p + 1 + lens - pos
        nbytes = _UNSIGNED[lens].unpack_from(buf, p + 1)[0]
        raw = bytes([self.fixarray - 1]) + bytes(buf[pos + 1:p])
        try:
            values = self.decode_head(raw)
        except Exception as exc:  # msgspec's errors, UnicodeDecodeError, RecursionError, ...
            raise _decode_error(self.cls, self.names[:-1], exc, raw) from None
        dtype, n = _payload_shape(kind, self.array_field, values[-1], nbytes, head, size, limits)
        return self.new(*values[:-1], np.empty(0, dtype) if n == 0 else None), dtype, n, head


def _body_type(code: int, types: Any) -> Any:
    """The msgspec type of a body ``[PROTOCOL_VERSION, code, *types]``."""
    literal: Any = Literal
    fixed: Any = tuple
    return fixed[(literal[_V], literal[code], *types)]


def _array_codec(cls: type[Message]) -> tuple[Encoder, Decoder]:
    codec = _ArrayCodec(cls)
    return codec.encode, codec.decode


def _codecs() -> tuple[dict[type, Encoder], list[Decoder | None]]:
    enc: dict[type, Encoder] = {}
    dec: list[Decoder | None] = [None] * 256
    for kind, cls in KINDS.items():
        e, d = (_plain_codec if cls.array_field is None else _array_codec)(cls)
        enc[cls] = e
        dec[KIND_CODES[kind]] = d
    return enc, dec


_ENCODERS, _DECODERS = _codecs()


def parse_head(buf: bytearray, pos: int, avail: int, size: int,
               limits: FrameLimits) -> Decoded | int:
    """Validate the body of ``size`` bytes at ``buf[pos:]`` (``avail`` of them buffered) as
    far as it must be before its payload: returns (message, dtype, n, head bytes), or the
    number of bytes still needed."""
    if avail < PREAMBLE_BYTES or size < PREAMBLE_BYTES:
        if avail and buf[pos] & 0xF0 != 0x90:
            _not_an_array(buf[pos])
        if size < PREAMBLE_BYTES:
            raise MalformedFrame(f"body of {size} bytes: no kind", code="bad_header")
        return PREAMBLE_BYTES - avail
    b0, version, code = buf[pos], buf[pos + 1], buf[pos + 2]
    if b0 & 0xF0 != 0x90:
        _not_an_array(b0)
    if version != _V:
        raise MalformedFrame(f"wire version {version}, expected {_V}", code="bad_version")
    decode = _DECODERS[code]
    if decode is None:
        raise MalformedFrame(f"unknown kind code {code}", code="unknown_kind")
    return decode(buf, pos, avail, size, limits)


def _not_an_array(b0: int) -> None:
    """Raise the error for a body whose first byte ``b0`` does not start a fixarray."""
    if 1 <= b0 < _V or 0x80 <= b0 <= 0x8F:
        hint = "a msgpack map: a version 1/2 frame?" if b0 >= 0x80 else \
            f"byte {b0}: a version {b0} frame?"
        raise MalformedFrame(f"body is not a version {_V} msgpack array ({hint})",
                             code="bad_version")
    raise MalformedFrame(f"body starts with byte 0x{b0:02x}, not a msgpack array",
                         code="bad_header")


# ------------------------------------------------------------------------------- encoding


def encode_head(msg: Message) -> tuple[bytes, memoryview | None]:
    """``(prefix + body up to its payload, byte view of the payload or None)`` of ``msg``."""
    try:
        return _ENCODERS[msg.__class__](msg)
    except (OverflowError, TypeError, msgspec.EncodeError) as exc:  # a bug in the sender
        raise LocalProtocolError(f"{msg.kind}: cannot encode: {exc}") from exc


assert MAX_BLOB < 256  # a blob's bin8 header
