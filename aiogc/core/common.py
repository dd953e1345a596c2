"""Values shared by the two core state machines: outgoing items, events, auth helpers.

The core never touches a socket or a clock: drivers feed ``receive(peer, msg, now=...)`` and
``handle_timer(now=...)``, flush :class:`Outgoing` items and re-arm one timer at
``next_deadline()``. ``peer`` is any hashable the driver chooses (a connection object, an int).
"""

from __future__ import annotations

import hashlib
import hmac
from collections import Counter, deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..messages import Message

#: Close codes after which a worker does not reconnect: retrying cannot succeed.
FATAL_CODES = frozenset({"auth_failed", "config_mismatch", "bad_config", "bad_worker_id",
                         "bad_version"})

#: Seconds a new connection has to authenticate before it is closed. reliability.md asks for
#: every bad connection to be closed within 2 s; timer latency adds up to ~30 ms under load
#: (measured in bench/soak_socket_fuzz.py), so the deadline itself sits a little below.
AUTH_DEADLINE_S = 1.9


class Endpoint:
    """Outbox, event queue and counters shared by the two state machines."""

    def __init__(self) -> None:
        self._outbox: list[Outgoing] = []
        self._events: deque[Event] = deque()
        self.stats: Counter[str] = Counter()

    def messages_to_send(self) -> list[Outgoing]:
        """Drain the outbox."""
        out, self._outbox = self._outbox, []
        return out

    def next_event(self) -> Event | None:
        """The next event, or None."""
        return self._events.popleft() if self._events else None

    def statistics(self) -> dict[str, int]:
        """Counters of dropped, rejected and closed things, by reason."""
        return dict(self.stats)


@dataclass(frozen=True, slots=True)
class Outgoing:
    """Send ``message`` to ``peer`` (if any), then close the connection if ``close``."""

    peer: Hashable
    message: Message | None
    close: bool = False
    reason: str = ""


def worker_mac(secret: bytes, ps_nonce: bytes, worker: int, epoch: int) -> bytes:
    """MAC a worker sends in ``hello``: binds its id and the PS epoch to the PS's fresh nonce."""
    msg = b"aiogc-worker|" + ps_nonce + worker.to_bytes(8, "big") + epoch.to_bytes(8, "big")
    return hmac.new(secret, msg, hashlib.sha256).digest()


def ps_mac(secret: bytes, worker_nonce: bytes, worker: int, epoch: int) -> bytes:
    """MAC the PS sends in ``welcome``: proves to the worker that the PS knows the secret."""
    msg = b"aiogc-ps|" + worker_nonce + worker.to_bytes(8, "big") + epoch.to_bytes(8, "big")
    return hmac.new(secret, msg, hashlib.sha256).digest()


def macs_equal(a: bytes, b: bytes) -> bool:
    """Constant-time comparison."""
    return hmac.compare_digest(a, b)


# ------------------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True)
class Event:
    """Base class of everything ``next_event()`` returns."""


@dataclass(frozen=True, slots=True)
class WorkerJoined(Event):
    worker: int
    peer: Hashable
    time: float


@dataclass(frozen=True, slots=True)
class WorkerDropped(Event):
    """A worker left the round (dead, timed out, payload rejected, disconnected)."""

    worker: int
    round: int
    reason: str
    time: float


@dataclass(frozen=True, slots=True)
class PeerClosed(Event):
    """The core closed a connection for a typed reason (counted in ``statistics()``)."""

    peer: Hashable
    code: str
    reason: str
    time: float


@dataclass(frozen=True, slots=True)
class RoundStarted(Event):
    round: int
    time: float


@dataclass(frozen=True, slots=True)
class Triggered(Event):
    """The PS broadcast ``encode_and_transmit`` (partial scheme)."""

    round: int
    attempt: int
    state: tuple[int, ...]
    time: float
    exact: bool


@dataclass(frozen=True, slots=True)
class RoundResumed(Event):
    round: int
    attempt: int
    time: float


@dataclass(slots=True)
class RoundRecord:
    """What happened in one round, as the PS saw it (one row of rounds.csv and m of workers.csv).

    Times are the PS's ``now`` values. ``reports`` holds (ps_time, worker, count, elapsed_s)
    for every accepted report; ``arrivals`` the PS time each coded vector arrived.
    """

    round: int
    scheme: str
    t_start: float
    t_trigger: float | None = None
    t_end: float | None = None
    status: str = "running"  # exact | approximate | failed
    end_reason: str = ""
    attempts: int = 0
    state: tuple[int, ...] = ()
    coverage_min: int = 0
    residual: float = float("nan")
    amplification: float = float("nan")
    rel_error: float = float("nan")  # scaled: ||ĝ - g|| / ||Σ|g_i| ||
    rel_error_plain: float = float("nan")  # ||ĝ - g|| / ||g||
    loss: float = float("nan")
    oracle_elapsed_s: float | None = None
    reports: list[tuple[float, int, int, float]] = field(default_factory=list)
    arrivals: dict[int, float] = field(default_factory=dict)
    compute_s: dict[int, float] = field(default_factory=dict)
    dropped: dict[int, str] = field(default_factory=dict)
    gradient: np.ndarray | None = None

    @property
    def duration_s(self) -> float:
        return (self.t_end if self.t_end is not None else self.t_start) - self.t_start

    def as_row(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "scheme": self.scheme,
            "start_s": self.t_start,
            "trigger_s": self.t_trigger,
            "end_s": self.t_end,
            "duration_s": self.duration_s,
            "status": self.status,
            "end_reason": self.end_reason,
            "attempts": self.attempts,
            "state": " ".join(map(str, self.state)),
            "coverage_min": self.coverage_min,
            "residual": self.residual,
            "amplification": self.amplification,
            "rel_error": self.rel_error,
            "rel_error_plain": self.rel_error_plain,
            "loss": self.loss,
            "oracle_s": self.oracle_elapsed_s,
        }


@dataclass(frozen=True, slots=True)
class RoundCompleted(Event):
    record: RoundRecord


@dataclass(frozen=True, slots=True)
class Finished(Event):
    """All rounds done (or the run was aborted: ``reason``)."""

    rounds_completed: int
    reason: str
    time: float


# worker-side events


@dataclass(frozen=True, slots=True)
class Welcomed(Event):
    worker: int
    epoch: int
    time: float


@dataclass(frozen=True, slots=True)
class ChunkComputed(Event):
    round: int
    position: int
    chunk: int
    time: float
    compute_s: float


@dataclass(frozen=True, slots=True)
class CodedSent(Event):
    round: int
    attempt: int
    chunks_used: int
    time: float


@dataclass(frozen=True, slots=True)
class RoundEnded(Event):
    round: int
    status: str
    time: float


@dataclass(frozen=True, slots=True)
class ShutdownRequested(Event):
    reason: str
    time: float


@dataclass(frozen=True, slots=True)
class ConnectionFailed(Event):
    """The worker gave up on its current connection (PS silent, error frame, bad handshake)."""

    code: str
    reason: str
    time: float
    #: True when reconnecting cannot help (wrong secret, config or version): stop the worker
    fatal: bool = False
