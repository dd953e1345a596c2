"""The project's exception tree.

Blame is split the h11 way: :class:`RemoteProtocolError` means the *peer* sent something we
refuse (close that peer with a reason, keep serving everyone else); :class:`LocalProtocolError`
means *we* misused the API (a bug in the caller). Bugs in our own code propagate unchanged.
"""

from __future__ import annotations


class AiogcError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(AiogcError, ValueError):
    """A configuration value is out of range; the message names field, value and allowed range."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}={value!r} is invalid: expected {allowed}")


class CodingError(AiogcError, ValueError):
    """Invalid input to the coding library (bad assignment, shapes, state vector...)."""


class ProtocolError(AiogcError):
    """Base of protocol-level errors; ``code`` is the short machine-readable reason."""

    code: str = "protocol_error"

    def __init__(self, reason: str, *, code: str | None = None) -> None:
        if code is not None:
            self.code = code
        self.reason = reason
        super().__init__(f"{self.code}: {reason}")


class EvictedError(ConnectionError):
    """The PS evicted this worker (an authenticated ``error`` with code ``evicted``):
    its key is refused for the rest of the run, so the worker ends instead of reconnecting
    (``aiogc worker`` exits 4)."""


class LocalProtocolError(ProtocolError):
    """We tried to do something the protocol does not allow (caller bug)."""

    code = "local_protocol_error"


class RemoteProtocolError(ProtocolError):
    """The peer violated the protocol; close that peer with ``code`` / ``reason``."""

    code = "remote_protocol_error"


class MalformedFrame(RemoteProtocolError):
    """Bytes on the wire that do not decode into a valid message (framing, msgpack, schema)."""

    code = "malformed_frame"


class FrameTooLarge(MalformedFrame):
    """A declared length exceeds the bound for this kind or connection state."""

    code = "frame_too_large"
