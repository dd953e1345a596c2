"""Message <-> bytes: length prefix, one msgpack array per body, limits, frame tags. Sans-IO.

Frame format (version 5)
------------------------
A frame is up to three consecutive parts, with nothing between frames::

    +-------------------+----------------------------------------------+---------+
    | L: u32 big-endian | body: L bytes, one msgpack array              | tag: T  |
    |                   | [version, kind code, fields..., (payload)]    |         |
    +-------------------+----------------------------------------------+---------+

* ``T`` is 16 on an authenticated connection after the handshake, else 0 (no tag): the tag
  is AES-256-GCM with an empty plaintext over ``prefix || body`` as associated data
  (GMAC), key = this direction's session key, nonce = 4 zero bytes || u64be(seq), where
  ``seq`` counts the tagged frames sent in this direction from 0 (implicit, never sent). See
  :class:`~aiogc.protocol.tags.FrameAuth`. A wrong tag is ``bad_tag``; the message is never
  delivered.
* ``L`` is the body's length, checked against the limits before a single body byte is
  buffered (``L == 0``: ``empty_header``; more than ``max_header_bytes + max_array_bytes``:
  ``header_too_large``).
* The body is exactly one msgpack object, a fixarray: ``PROTOCOL_VERSION`` (5, else
  ``bad_version``), the kind's code (:data:`~aiogc.protocol.headers.KIND_CODES`, else
  ``unknown_kind``), then the kind's fields in the order of
  :data:`~aiogc.protocol.headers.WIRE_FIELDS` (the codec, built from that one table:
  :mod:`aiogc.protocol.headers`). Any msgpack library's ``unpackb(body)`` returns the whole
  message, payload included.
* Array kinds (``round_start``, ``coded_gradient``) end with a dtype code (4: ``"<f4"``, 8:
  ``"<f8"``, else ``bad_dtype``) and the payload, a msgpack bin (bin32 from this sender) of
  the little-endian elements: the receiver parses the head before it, checks the payload's
  byte count against ``limits.max_array_bytes`` before anything is allocated
  (``array_too_large``; ``max_array_bytes == 0`` forbids array kinds, before authentication),
  and reads the payload's bytes straight into their destination.

Every field from the network is checked here, once, against the schema of ``messages`` (type
and context-free range, by the codec's typed decode; a failure is ``bad_field`` naming
``kind.field``), before the message is built with an unvalidated constructor. All head checks
happen before the payload is received, so ``alloc`` only ever sees validated heads.
docs/protocol.md gives the field table and test vectors.

Invariants
----------
* Every failure to decode raises :class:`~aiogc.errors.MalformedFrame` (or its subclass
  :class:`~aiogc.errors.FrameTooLarge`) carrying a short ``code``; nothing else escapes from
  decoding peer bytes. A :class:`FrameDecoder` that raised is poisoned: every later call raises
  the same exception (the connection must be closed; there is no resynchronisation).
* With a tag, nothing is delivered before the tag verified (the body may already sit in the
  destination ``alloc`` chose: a caller must not use it unless the message is delivered).
* Memory is bounded by the limits: the read buffer never exceeds ``max_header_bytes + 64 KiB``
  (read slack), and each frame allocates at most one array of ``max_array_bytes``.
* Frames are parsed in order and, with ``max_messages=1`` + :meth:`FrameDecoder.next_message`,
  one at a time: a caller can change ``limits`` or the state ``alloc`` reads between frames.
* Encoding never copies the array: :func:`encode_frame` returns a memoryview of it. The caller
  must not mutate the array until the transport has flushed it (see ``net.framing``).

Known imperfection: the decoder copies into the array the (at most one read's worth of) payload
bytes that arrived in the same read as the head; the rest lands directly in the array.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any, Final

import numpy as np

from aiogc.errors import FrameTooLarge, LocalProtocolError, MalformedFrame
from aiogc.protocol.headers import (
    _DECODERS,
    _V,
    DEFAULT_LIMITS,
    PREAMBLE_BYTES,
    PREFIX,
    PREFIX_BYTES,
    FrameLimits,
    encode_head,
    parse_head,
)
from aiogc.protocol.messages import Message
from aiogc.protocol.tags import ONESHOT_BELOW, TAG_BYTES, FrameAuth

__all__ = [
    "HOST_MAGIC",
    "AllocFn",
    "FrameDecoder",
    "HostPreamble",
    "decode_frame_bytes",
    "encode_frame",
    "encode_frame_bytes",
]

#: Initial size of the decoder's header buffer: many small frames per read, one page-ish alloc.
_READ_CHUNK: Final = 64 * 1024

#: The first four bytes of a worker host's connection (b"AGCH" as a u32 prefix): larger than
#: any header limit, so a plain decoder would refuse it as ``header_too_large``; a PS decoder
#: with ``accept_host`` raises :class:`HostPreamble` instead (docs/protocol.md §2.6).
HOST_MAGIC: Final = 0x41474348


class HostPreamble(MalformedFrame):
    """The connection is a worker host's (its first bytes are :data:`HOST_MAGIC`): ``rest``
    holds every byte buffered from the magic on, for the host decoder that takes over."""

    def __init__(self, rest: bytes) -> None:
        super().__init__("a worker host's preamble", code="host_preamble")
        self.rest = rest


#: ``alloc(kind, header_fields, dtype, n)`` -> destination array of shape (n,) and that dtype,
#: C-contiguous and writable, or None for a fresh ``np.empty``. It may raise MalformedFrame to
#: refuse the frame (the decoder is then poisoned and the connection must close).
AllocFn = Callable[[str, dict[str, Any], np.dtype, int], "np.ndarray | None"]


# ------------------------------------------------------------------------------- encoding


def encode_frame(msg: Message) -> list[bytes | memoryview]:
    """Frame ``msg`` for ``transport.writelines`` / successive ``write`` calls.

    Returns ``[prefix + body]`` or, for a non-empty array, ``[prefix + body head, view]`` where
    ``view`` is a byte memoryview of the message's array (no copy: do not mutate the array until
    it has been sent).
    """
    head, view = encode_head(msg)
    return [head] if view is None else [head, view]


def encode_frame_bytes(msg: Message, auth: FrameAuth | None = None) -> bytes:
    """The whole frame as one ``bytes`` (copies the array; for tests and small messages),
    tagged by ``auth`` (which advances its sequence number) if given."""
    head, view = encode_head(msg)
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
        #: a worker host's connection may start here (:class:`HostPreamble`; the PS's side)
        self.accept_host = False
        #: bytes that must be buffered before :meth:`_read_prefix` (a host decoder reads a
        #: slot number or a preamble first)
        self._prefix_need = PREFIX_BYTES

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
                need = self._prefix_need
                if avail < need:
                    self._need = need - avail
                    return None
                special = self._read_prefix()
                if special is not None:  # a host decoder's preamble or control record
                    return special  # type: ignore[no-any-return]
                avail = self._end - self._start
            buf, start = self._buf, self._start + PREFIX_BYTES
            # parse_head's dispatch, inlined for a well-formed start; it words every failure
            if avail >= PREFIX_BYTES + PREAMBLE_BYTES and buf[start] & 0xF0 == 0x90 \
                    and buf[start + 1] == _V and (decode := _DECODERS[buf[start + 2]]):
                head = decode(buf, start, avail - PREFIX_BYTES, self._hlen, self.limits)
            else:
                head = parse_head(buf, start, avail - PREFIX_BYTES, self._hlen, self.limits)
            if type(head) is int:
                self._need = head  # the next get_buffer makes room for the rest
                return None
            msg = self._read_header(*head)  # type: ignore[misc]
            if msg is not None or self._state == _BODY_STATE:
                return msg
            # else a tag is awaited and not yet buffered (_TAG_STATE): loop to check

    def _read_prefix(self) -> Any:
        """Read the u32 prefix at ``_start`` (the header follows); returns None (a host decoder
        returns its preamble or control records instead, see aiogc.protocol.hostmux)."""
        (h,) = PREFIX.unpack_from(self._buf, self._start)
        if h == 0:
            raise MalformedFrame("zero-length body", code="empty_header")
        if h > self.limits.max_body_bytes:
            if h == HOST_MAGIC and self.accept_host and self.frames_decoded == 0:
                raise HostPreamble(bytes(self._buf[self._start:self._end]))
            raise FrameTooLarge(f"body of {h} bytes exceeds {self.limits.max_body_bytes}",
                                code="header_too_large")
        self._hlen = h
        self._state = _HEADER_STATE
        return None

    def _read_header(self, msg: Message, dtype: np.dtype | None, n: int,
                     h: int) -> Message | None:
        """The head of the frame at ``_start`` (its first ``h`` body bytes) is buffered and
        validated as ``msg``: deliver the message (no payload, no tag), check its tag in
        place, or start its payload / tag.

        The common case, a whole small frame (prefix, body, tag) already buffered, is done
        here in one go: the payload copied once into its destination, the tag verified in
        place over one slice of the read buffer; the rest goes through the general state
        machine (:meth:`_begin_body`, :meth:`_tag_from_buffer`)."""
        buf, start = self._buf, self._start
        pos = start + PREFIX_BYTES
        end = pos + h
        auth = self.auth
        if dtype is None or n == 0:  # no body (an empty array keeps its (0,) placeholder)
            if auth is None:
                self._start = end
                self.last_frame_nbytes = end - start
                self._state = _PREFIX_STATE
                self._need = PREFIX_BYTES
                self.frames_decoded += 1
                return msg
            if self._end - end >= TAG_BYTES:  # the whole frame is here: verify in place
                self._start = end + TAG_BYTES
                if not auth.verify_one(buf[start:end], buf[end:end + TAG_BYTES]):
                    raise _bad_tag(msg)
                self.last_frame_nbytes = end + TAG_BYTES - start
                self._state = _PREFIX_STATE
                self._need = PREFIX_BYTES
                self.frames_decoded += 1
                return msg
            self.last_frame_nbytes = end - start
            self._head = bytes(buf[start:end])
            self._start = end
            self._await_tag(msg)
            return None
        t = end + n * dtype.itemsize  # where the body ends (and the tag starts)
        if (self._end - t >= (0 if auth is None else TAG_BYTES)
                and t - start <= ONESHOT_BELOW):
            return self._whole_frame(msg, dtype, n, end, t)
        self.last_frame_nbytes = end - start
        self._start = end
        done = self._begin_body(msg, dtype, n)
        if auth is None:
            return done
        self._head = bytes(buf[start:end])  # for the tag, after the body or the tag arrived
        return None

    def _whole_frame(self, msg: Message, dtype: np.dtype, n: int, end: int, t: int) -> Message:
        """An array frame whose body (``buf[end:t]``) and tag are all buffered: destination,
        tag (in place), one copy of the body, delivered."""
        buf, start = self._buf, self._start
        alloc = self._alloc
        dest = None if alloc is None else self._allocated(msg, dtype, n)
        auth = self.auth
        if auth is not None:
            self._start = t + TAG_BYTES
            if not auth.verify_one(buf[start:t], buf[t:t + TAG_BYTES]):
                raise _bad_tag(msg)
            self.last_frame_nbytes = t + TAG_BYTES - start
        else:
            self._start = t
            self.last_frame_nbytes = t - start
        if dest is None:
            dest = np.frombuffer(buf, dtype, n, end).copy()
        else:
            dest.data.cast("B")[:] = buf[end:t]
        # built (and validated) from the header, it never left the decoder: give it its array
        object.__setattr__(msg, msg.array_field, dest)  # type: ignore[arg-type]
        self._state = _PREFIX_STATE
        self._need = PREFIX_BYTES
        self.frames_decoded += 1
        return msg

    def _complete(self, msg: Message) -> Message:
        self._state = _PREFIX_STATE
        self._need = PREFIX_BYTES
        self.frames_decoded += 1
        return msg

    def _begin_body(self, msg: Message, dtype: np.dtype, n: int) -> Message | None:
        """Point the body at its destination, copy in what arrived with the header; the
        message if the body (and tag) completed from the buffer, else None."""
        dest = None if self._alloc is None else self._allocated(msg, dtype, n)
        if dest is None:
            dest = np.empty(n, dtype)
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

    def _allocated(self, msg: Message, dtype: np.dtype, n: int) -> np.ndarray | None:
        """``alloc``'s destination for the body of ``msg`` (checked usable), or None."""
        assert self._alloc is not None
        getter = _HEADER_GETTERS.get(msg.__class__)
        if getter is None:
            getter = _HEADER_GETTERS[msg.__class__] = _header_getter(msg.__class__)
        names, get = getter
        dest = self._alloc(msg.kind, dict(zip(names, get(msg), strict=True)), dtype, n)
        if dest is None:
            return None
        checked = self._checked_dest  # alloc usually hands out the same row again
        if checked is None or checked[0] is not dest or checked[1] != n or checked[2] != dtype:
            if (not isinstance(dest, np.ndarray) or dest.dtype != dtype
                    or dest.shape != (n,) or not dest.flags.c_contiguous
                    or not dest.flags.writeable):
                raise LocalProtocolError(f"alloc returned an unusable destination for {msg.kind}")
            self._checked_dest = (dest, n, dtype)
        return dest

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


#: array kind -> (its header fields' names, a getter of their values as a tuple), for alloc
_HEADER_GETTERS: dict[type[Message], tuple[tuple[str, ...], Callable[[Message], Any]]] = {}


def _header_getter(cls: type[Message]) -> tuple[tuple[str, ...], Callable[[Message], Any]]:
    names = tuple(name for name in cls._names if name != cls.array_field)
    return names, (lambda m: (getattr(m, names[0]),)) if len(names) == 1 else attrgetter(*names)


def _bad_tag(msg: Message) -> MalformedFrame:
    return MalformedFrame(f"{msg.kind}: frame tag does not verify (forged, replayed, reordered "
                          "or corrupted)", code="bad_tag")
