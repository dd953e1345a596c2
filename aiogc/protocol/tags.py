"""Frame tags: AES-256-GCM with an empty plaintext (GMAC) over one frame, per direction.

The tag format (key, nonce, associated data) is in :mod:`aiogc.protocol.wire`'s docstring and
docs/protocol.md; :class:`FrameAuth` is the one place that computes or checks it. Sans-IO.
"""

from __future__ import annotations

import hmac
import struct
from collections.abc import Sequence
from typing import Any, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from aiogc.errors import LocalProtocolError

__all__ = ["ONESHOT_BELOW", "TAG_BYTES", "FrameAuth", "SessionAuth"]

#: Length of a frame tag (GCM's full 128-bit tag).
TAG_BYTES: Final = 16
#: Frames up to this many bytes are tagged with one one-shot AESGCM call (which copies the
#: frame, cheap when it is small); larger ones stream their parts through a GCM context, whose
#: fixed setup cost is repaid on large frames by not copying them.
ONESHOT_BELOW: Final = 64 * 1024
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
            if len(aad) <= ONESHOT_BELOW:
                return self._aead.encrypt(nonce, b"", aad)  # takes any buffer: no copy
        elif sum(map(len, parts)) <= ONESHOT_BELOW:
            return self._aead.encrypt(nonce, b"", b"".join(parts))
        return self._stream(nonce, parts)

    def tag_one(self, frame: bytes | bytearray | memoryview) -> bytes:
        """:meth:`tag` of a frame given as one buffer of at most :data:`ONESHOT_BELOW` bytes
        (one one-shot call)."""
        nonce = _NONCE.pack(self.seq)
        self.seq += 1
        return self._aead.encrypt(nonce, b"", frame)

    def verify(self, parts: Sequence[bytes | bytearray | memoryview],
               tag: bytes | bytearray | memoryview) -> bool:
        """True iff ``tag`` is the tag of ``parts`` at the current sequence number (which
        advances either way: after a failure the connection must close)."""
        nonce = _NONCE.pack(self.seq)
        self.seq += 1
        aad: Any = None
        if len(parts) == 1:
            if len(parts[0]) <= ONESHOT_BELOW:
                aad = parts[0]
        elif sum(map(len, parts)) <= ONESHOT_BELOW:
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


class SessionAuth:
    """The two directions' :class:`FrameAuth` of one worker session on a shared (host)
    connection: what the PS's slot endpoint and the host's slot each hold per worker."""

    __slots__ = ("recv_auth", "send_auth")

    def __init__(self) -> None:
        self.send_auth: FrameAuth | None = None
        self.recv_auth: FrameAuth | None = None

    def set_auth(self, *, send: bytes | None = None, recv: bytes | None = None) -> None:
        """Tag frames sent with key ``send`` and/or verify frames received with ``recv``, from
        the session's next frame on in that direction (sequence numbers from 0)."""
        if send is not None:
            self.send_auth = FrameAuth(send)
        if recv is not None:
            self.recv_auth = FrameAuth(recv)

    @property
    def authenticated(self) -> bool:
        """True once frames sent are tagged."""
        return self.send_auth is not None
