"""Message <-> bytes: length prefix, version, limits, ndarray codec, frame tags. Sans-IO.

Frame format (version 2)
------------------------
A frame is up to four consecutive parts, with nothing between frames::

    +-------------------+----------------------------+-----------------------------+---------+
    | H: u32 big-endian | header: H bytes of msgpack | body: n * itemsize raw bytes | tag: T  |
    +-------------------+----------------------------+-----------------------------+---------+

* ``T`` is 16 on an authenticated connection after the handshake, else 0 (no tag): the tag
  is AES-256-GCM with an empty plaintext over ``prefix || header || body`` as associated data
  (GMAC), key = this direction's session key, nonce = 4 zero bytes || u64be(seq), where
  ``seq`` counts the tagged frames sent in this direction from 0 (implicit, never sent). See
  :class:`FrameAuth`. A wrong tag is ``bad_tag``; the message is never delivered.

* ``H`` is the length of the header in bytes, ``1 <= H <= limits.max_header_bytes``.
  ``H == 0`` is malformed. ``H`` is checked before a single header byte is buffered.
* The header is exactly one msgpack object (no trailing bytes), a **map with str keys**::

      {"v": 1, "kind": <str>, <the fields of Message.header_fields()>}

  and, only for kinds that carry an array (``cls.array_field is not None``), two more keys:
  ``"dtype"`` (``"<f4"`` or ``"<f8"``, the keys of ``messages.ARRAY_DTYPES``) and ``"n"``
  (the element count, an int ``>= 0``). Kinds without an array must not have these keys.
  Key order is irrelevant. Packed with ``packb(use_bin_type=True)``: ``bytes`` fields are msgpack
  ``bin``, text is ``str`` (UTF-8). Decoded with ``raw=False, strict_map_key=True``, every
  container/string length bounded (``max_*_len`` below), no ext types (including the timestamp
  ext -1), never pickle.
* The body is present only for array kinds: exactly ``n * dtype.itemsize`` bytes, the array's
  little-endian elements in order (C order, 1-D). ``n * itemsize`` is checked against
  ``limits.max_array_bytes`` before anything is allocated; ``max_array_bytes == 0`` forbids
  array kinds altogether (before authentication). ``n == 0`` means an empty body.

Validation, in order: ``H`` (``empty_header`` / ``header_too_large``), msgpack
(``bad_msgpack`` / ``trailing_bytes`` / ``ext_type``), top-level type (``bad_header``),
``"v"`` (missing or not an int: ``bad_header``; an int other than 1: ``bad_version``),
``"kind"`` (``unknown_kind``), ``"dtype"``/``"n"`` (``bad_dtype`` / ``bad_schema`` /
``array_too_large``), then the exact per-kind schema of :meth:`Message.from_fields`
(``bad_schema`` / ``bad_field``). All header checks happen before the body is received, so
``alloc`` only ever sees validated headers.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Final

import msgpack
import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .errors import FrameTooLarge, LocalProtocolError, MalformedFrame
from .messages import (
    ARRAY_DTYPES,
    KINDS,
    MAX_BLOB,
    MAX_TEXT,
    MAX_WORKERS,
    PROTOCOL_VERSION,
    Message,
)

__all__ = [
    "DEFAULT_LIMITS",
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

#: Keys the wire adds to the header; no message field may use them (asserted below).
_RESERVED_KEYS: Final = frozenset({"v", "kind", "dtype", "n"})

# msgpack bounds: each caps one length the unpacker would otherwise trust from the peer.
#: Longest str in a header: MAX_TEXT characters of up to 4 UTF-8 bytes each.
MAX_STR_BYTES: Final = 4 * MAX_TEXT
#: Longest bin in a header: nonces, MACs and digests only (the array travels after the header).
MAX_BIN_BYTES: Final = MAX_BLOB
#: Longest msgpack array in a header: a state vector / delay row has at most MAX_WORKERS entries.
MAX_ARRAY_LEN: Final = MAX_WORKERS
#: Most keys in one msgpack map: ~10 wire keys + fields, and welcome's config (64 entries).
MAX_MAP_LEN: Final = 128

#: Initial size of the decoder's header buffer: many small frames per read, one page-ish alloc.
_READ_CHUNK: Final = 64 * 1024


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
#: After authentication: 1 MiB fits a header with a full 65536-entry state vector / delay row
#: (<= 9 bytes per entry ~ 590 KiB). 256 MiB of array = d <= 3.3e7 float64; the core should
#: tighten it to the exact expected payload size once d is known.
DEFAULT_LIMITS: Final = FrameLimits(max_header_bytes=1 << 20, max_array_bytes=256 << 20)

#: ``alloc(kind, header_fields, dtype, n)`` -> destination array of shape (n,) and that dtype,
#: C-contiguous and writable, or None for a fresh ``np.empty``. It may raise MalformedFrame to
#: refuse the frame (the decoder is then poisoned and the connection must close).
AllocFn = Callable[[str, dict[str, Any], np.dtype, int], "np.ndarray | None"]

for _cls in KINDS.values():
    assert not _RESERVED_KEYS & {f.name for f in fields(_cls)}, _cls.kind  # wire keys are ours


# ------------------------------------------------------------------------------- frame tags

#: Length of a frame tag (GCM's full 128-bit tag).
TAG_BYTES: Final = 16
#: Frames up to this many bytes are tagged with one one-shot AESGCM call (~1 us); larger ones
#: stream their parts through a GCM context (~6.5 us setup, then ~6 GB/s, no copy).
_ONESHOT_BELOW: Final = 64 * 1024
_ZERO4: Final = b"\x00" * 4


class FrameAuth:
    """Tags (or verifies) the frames of one direction of one connection.

    ``tag(parts)`` returns AES-256-GCM(key, nonce = 0^4 || u64be(seq), plaintext = empty,
    aad = concatenation of ``parts``).tag and advances ``seq``; ``verify(parts, tag)`` does the
    same for a received frame and compares in constant time. Sequence numbers are implicit, so
    a dropped, replayed, reordered or spliced frame fails to verify.
    """

    __slots__ = ("_aead", "_key", "seq")

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise LocalProtocolError(f"session key of {len(key)} bytes, expected 32")
        self._key = key
        self._aead = AESGCM(key)
        self.seq = 0

    def _nonce(self) -> bytes:
        return _ZERO4 + self.seq.to_bytes(8, "big")

    def tag(self, parts: Sequence[bytes | bytearray | memoryview]) -> bytes:
        """Tag of the frame made of ``parts`` (in order); advances the sequence number."""
        nonce = self._nonce()
        self.seq += 1
        total = sum(len(p) for p in parts)
        if total <= _ONESHOT_BELOW:
            aad = parts[0] if len(parts) == 1 else b"".join(parts)
            return self._aead.encrypt(nonce, b"", bytes(aad) if not isinstance(aad, bytes)
                                      else aad)
        enc = Cipher(algorithms.AES(self._key), modes.GCM(nonce)).encryptor()
        for p in parts:
            if len(p):
                enc.authenticate_additional_data(p)
        enc.finalize()
        return enc.tag

    def verify(self, parts: Sequence[bytes | bytearray | memoryview], tag: bytes) -> bool:
        """True iff ``tag`` is the tag of ``parts`` at the current sequence number (which
        advances either way: after a failure the connection must close)."""
        return hmac.compare_digest(self.tag(parts), tag)


# ------------------------------------------------------------------------------- encoding


def _header_bytes(msg: Message) -> tuple[bytes, memoryview | None]:
    header: dict[str, Any] = {"v": PROTOCOL_VERSION, "kind": msg.kind}
    header.update(msg.header_fields())
    arr = msg.array()
    view: memoryview | None = None
    if arr is not None:
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)  # 1-D non-contiguous (strided slice): one copy
        header["dtype"] = arr.dtype.str
        header["n"] = int(arr.shape[0])
        if arr.nbytes:
            view = arr.data.cast("B")  # byte-length view: len() is the byte count
    packed = msgpack.packb(header, use_bin_type=True)
    if len(packed) > MAX_U32:
        raise LocalProtocolError(f"{msg.kind}: header of {len(packed)} bytes exceeds u32")
    return _PREFIX.pack(len(packed)) + packed, view


def encode_frame(msg: Message) -> list[bytes | memoryview]:
    """Frame ``msg`` for ``transport.writelines`` / successive ``write`` calls.

    Returns ``[prefix + header]`` or, for a non-empty array, ``[prefix + header, view]`` where
    ``view`` is a byte memoryview of the message's array (no copy: do not mutate the array until
    it has been sent).
    """
    head, view = _header_bytes(msg)
    return [head] if view is None else [head, view]


def encode_frame_bytes(msg: Message, auth: FrameAuth | None = None) -> bytes:
    """The whole frame as one ``bytes`` (copies the array; for tests and small messages),
    tagged by ``auth`` (which advances its sequence number) if given."""
    head, view = _header_bytes(msg)
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


class _ExtRejected(Exception):
    pass


def _no_ext(code: int, data: bytes) -> Any:
    raise _ExtRejected(f"ext type {code} not allowed")


def _unpack_header(raw: memoryview, max_header_bytes: int) -> Any:
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
        raise MalformedFrame("trailing bytes after the header object", code="trailing_bytes") \
            from exc
    except _ExtRejected as exc:
        raise MalformedFrame(str(exc), code="ext_type") from exc
    except Exception as exc:  # msgpack's whole error surface: ValueError, StackError, ...
        if "max_ext_len" in str(exc):  # the ext bound tripped (best-effort finer code)
            raise MalformedFrame("ext types are not allowed", code="ext_type") from exc
        raise MalformedFrame(f"{type(exc).__name__}: {str(exc)[:80]}", code="bad_msgpack") \
            from exc


def _parse_header(
    raw: memoryview, limits: FrameLimits
) -> tuple[Message, dict[str, Any], np.dtype | None, int]:
    """Validate a header. Returns (message, fields, dtype, n); for array kinds ``message``
    carries an empty placeholder array that the decoder replaces once the body is in."""
    obj = _unpack_header(raw, limits.max_header_bytes)
    if type(obj) is not dict:
        raise MalformedFrame(f"header is {type(obj).__name__}, not a map", code="bad_header")
    version = obj.pop("v", None)
    if type(version) is not int:
        raise MalformedFrame("header lacks an int 'v'", code="bad_header")
    if version != PROTOCOL_VERSION:
        raise MalformedFrame(f"wire version {version}, expected {PROTOCOL_VERSION}",
                             code="bad_version")
    kind = obj.pop("kind", None)
    cls = KINDS.get(kind) if type(kind) is str else None
    if cls is None:
        shown = repr(kind)[:40]
        raise MalformedFrame(f"unknown kind {shown}", code="unknown_kind")
    dtype: np.dtype | None = None
    n = 0
    placeholder = None
    if cls.array_field is not None:
        if limits.max_array_bytes == 0:
            raise FrameTooLarge(f"{kind}: arrays not allowed in this connection state",
                                code="array_too_large")
        dtype_str = obj.pop("dtype", None)
        n_obj = obj.pop("n", None)
        if type(dtype_str) is not str or dtype_str not in ARRAY_DTYPES:
            raise MalformedFrame(f"{kind}: dtype {repr(dtype_str)[:20]} not in "
                                 f"{sorted(ARRAY_DTYPES)}", code="bad_dtype")
        if type(n_obj) is not int or n_obj < 0:
            raise MalformedFrame(f"{kind}: n={repr(n_obj)[:30]} is not an int >= 0",
                                 code="bad_schema")
        dtype = np.dtype(dtype_str)  # whitelisted just above
        n = n_obj
        if n * dtype.itemsize > limits.max_array_bytes:
            raise FrameTooLarge(f"{kind}: array of {n * dtype.itemsize} bytes exceeds "
                                f"{limits.max_array_bytes}", code="array_too_large")
        placeholder = np.empty(0, dtype)
    try:
        msg = cls.from_fields(obj, placeholder)
    except MalformedFrame:
        raise
    except (TypeError, ValueError, OverflowError) as exc:  # defence in depth: schema is exact
        raise MalformedFrame(f"{kind}: {type(exc).__name__}: {str(exc)[:80]}",
                             code="bad_field") from exc
    return msg, obj, dtype, n


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
        self._need = PREFIX_BYTES  # bytes still missing for the current prefix/header
        self._hlen = 0  # H of the header being read
        # body state
        self._msg: Message | None = None
        self._dest: np.ndarray | None = None
        self._dest_view: memoryview | None = None
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
        self._check_poisoned()
        try:
            return self._advance(nbytes, max_messages)
        except MalformedFrame as exc:
            self._poison(exc)
            raise

    def next_message(self) -> Message | None:
        """Parse the next frame from bytes already buffered; None if none is complete."""
        self._check_poisoned()
        if self._state == _BODY_STATE:
            return None
        try:
            out = self._advance(0, 1)
        except MalformedFrame as exc:
            self._poison(exc)
            raise
        return out[0] if out else None

    # -- internals ----------------------------------------------------------------------------

    def _check_poisoned(self) -> None:
        if self._error is not None:
            raise self._error

    def _poison(self, exc: MalformedFrame) -> None:
        self._error = exc
        self._buf = bytearray(0)
        self._dest = self._dest_view = None
        self._msg = None

    def _advance(self, nbytes: int, limit: int | None) -> list[Message]:
        out: list[Message] = []
        if nbytes < 0:
            raise LocalProtocolError(f"buffer_updated({nbytes})")
        if self._state == _BODY_STATE:
            if nbytes == 0:
                return out
            self._body_pos += nbytes
            if self._body_pos >= len(self._dest_view):  # type: ignore[arg-type]
                done = self._finish_body()
                if done is not None:
                    out.append(done)
            return out
        self._end += nbytes
        buf = self._buf
        while limit is None or len(out) < limit:
            avail = self._end - self._start
            if self._state == _TAG_STATE:
                if avail < TAG_BYTES:
                    self._need = TAG_BYTES - avail
                    break
                tag = bytes(buf[self._start:self._start + TAG_BYTES])
                self._start += TAG_BYTES
                out.append(self._check_tag(tag))
                continue
            if self._state == _PREFIX_STATE:
                if avail < PREFIX_BYTES:
                    self._need = PREFIX_BYTES - avail
                    break
                (h,) = _PREFIX.unpack_from(buf, self._start)
                if h == 0:
                    raise MalformedFrame("zero-length header", code="empty_header")
                if h > self.limits.max_header_bytes:
                    raise FrameTooLarge(f"header of {h} bytes exceeds "
                                        f"{self.limits.max_header_bytes}", code="header_too_large")
                self._start += PREFIX_BYTES
                self._state = _HEADER_STATE
                self._hlen = h
                avail -= PREFIX_BYTES
            h = self._hlen
            if avail < h:
                # the next get_buffer must make room for the rest of this header
                self._need = h - avail
                break
            raw = memoryview(buf)[self._start:self._start + h]
            try:
                msg, fields_, dtype, n = _parse_header(raw, self.limits)
                if self.auth is not None:
                    self._head = _PREFIX.pack(h) + bytes(raw)
            finally:
                raw.release()
            self._start += h
            self.last_frame_nbytes = PREFIX_BYTES + h
            if dtype is None or n == 0:  # no body (an empty array keeps its (0,) placeholder)
                if self.auth is not None:
                    self._await_tag(msg)
                    continue
                out.append(self._complete(msg))
                continue
            self._begin_body(msg, fields_, dtype, n)
            # body bytes that arrived with the header: copy them into the destination
            take = min(self._end - self._start, len(self._dest_view))  # type: ignore[arg-type]
            if take:
                self._dest_view[:take] = buf[self._start:self._start + take]  # type: ignore[index]
                self._start += take
                self._body_pos = take
            if self._body_pos < len(self._dest_view):  # type: ignore[arg-type]
                break  # rest of the body goes straight into the array via get_buffer
            done = self._finish_body()
            if done is not None:
                out.append(done)
        if self._start == self._end:
            self._start = self._end = 0
        return out

    def _complete(self, msg: Message) -> Message:
        self._state = _PREFIX_STATE
        self._need = PREFIX_BYTES
        self.frames_decoded += 1
        return msg

    def _begin_body(self, msg: Message, fields_: dict[str, Any], dtype: np.dtype, n: int) -> None:
        dest = None
        if self._alloc is not None:
            dest = self._alloc(msg.kind, fields_, dtype, n)
        if dest is None:
            dest = np.empty(n, dtype)
        elif (not isinstance(dest, np.ndarray) or dest.dtype != dtype or dest.shape != (n,)
              or not dest.flags.c_contiguous or not dest.flags.writeable):
            raise LocalProtocolError(f"alloc returned an unusable destination for {msg.kind}")
        self._msg = msg
        self._dest = dest
        self._dest_view = dest.data.cast("B")
        self._body_pos = 0
        self._state = _BODY_STATE

    def _finish_body(self) -> Message | None:
        msg, dest = self._msg, self._dest
        assert msg is not None and msg.array_field is not None and dest is not None
        # The placeholder message was built (and validated) from the header before the body
        # arrived and has never left the decoder; give it its real array (same dtype, 1-D).
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

    def _check_tag(self, tag: bytes) -> Message:
        msg = self._tagged
        assert msg is not None and self.auth is not None
        arr = msg.array()
        parts: list[Any] = [self._head]
        if arr is not None and arr.nbytes:
            parts.append(arr.data.cast("B"))
        self._tagged = None
        self._head = b""
        if not self.auth.verify(parts, tag):
            raise MalformedFrame(f"{msg.kind}: frame tag does not verify (forged, replayed, "
                                 "reordered or corrupted)", code="bad_tag")
        self.last_frame_nbytes += TAG_BYTES
        return self._complete(msg)
