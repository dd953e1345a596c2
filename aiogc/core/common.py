"""Values shared by the two core state machines: outgoing items and events.

The core never touches a socket or a clock: drivers feed ``receive(peer, msg, now=...)`` and
``handle_timer(now=...)``, flush :class:`Outgoing` items and re-arm one timer at
``next_deadline()``. ``peer`` is any hashable the driver chooses (a connection object, an int).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import numpy as np

from aiogc.coding.base import Scheme, TrustedEncoder
from aiogc.core.attribution import Attribution
from aiogc.protocol.messages import Message, slot_constructor
from aiogc.protocol.status import EndReason, RoundStatus

#: Close codes after which a worker does not reconnect: retrying cannot succeed. Only in an
#: authenticated frame (or from the worker core's own checks): before the handshake every code
#: is a retry (docs/protocol.md §7.7). ``evicted``: the PS located this worker's
#: vectors as inconsistent and refuses its key for the rest of the run.
FATAL_CODES = frozenset({"auth_failed", "config_mismatch", "bad_config", "bad_worker_id",
                         "bad_version", "task_not_allowed", "evicted"})

#: Seconds a new connection has to authenticate before it is closed (the default of the PS's
#: ``auth_deadline_s``). Every bad connection should be closed within 2 s; a loaded loop fires
#: its timers late (bench/soak_socket_fuzz.py measures by how much), so the deadline itself
#: sits a little below.
AUTH_DEADLINE_S = 1.9


_Handler = TypeVar("_Handler", bound=Callable[..., None])

#: the function attribute a handler's rule rows live under (:func:`handles`)
_ROWS_ATTR = "__aiogc_rules__"


class Row(NamedTuple):
    """One rule row a handler declares: frames of ``kind`` in ``phases`` run it; in the
    phases no row of ``kind`` covers, the handler named ``otherwise`` runs (None: the kind is
    refused there, or another row covers it)."""

    kind: str
    phases: frozenset[enum.Enum]
    otherwise: str | None


def handles(kind: str, phases: Iterable[enum.Enum], *, otherwise: str | None = None
            ) -> Callable[[_Handler], _Handler]:
    """Method decorator: declare, next to a handler, the rules-table row it serves.

    A message kind's rule lives with its handler, so adding a kind touches its message
    (protocol/messages.py) and its handler's module, nothing else. The row is attached to the
    function (no module-level table is written, tests/test_core_purity.py); each machine's
    table is built once from its class (``ps_rules.rules_of``, ``worker_rules.dispatch_of``),
    which checks that every (phase, kind) pair has exactly one outcome. Stackable.
    """
    row = Row(kind, frozenset(phases), otherwise)

    def mark(fn: _Handler) -> _Handler:
        attrs = vars(fn)
        attrs[_ROWS_ATTR] = (*attrs.get(_ROWS_ATTR, ()), row)
        return fn

    return mark


def declared_rows(cls: type) -> Iterator[tuple[str, Callable[..., None], Row]]:
    """(attribute name, function, row) of every :func:`handles` row on ``cls`` and its bases
    (a subclass's attribute hides its base's, as attribute lookup does)."""
    seen: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        seen.update(vars(klass))
    for name, fn in seen.items():
        for row in getattr(fn, _ROWS_ATTR, ()):
            yield name, fn, row


class Backoff:
    """Reconnect delays: exponential growth with full jitter, capped, reset after progress.

    The n-th delay since the last :meth:`reset` is uniform in ``[base / 2, min(cap, base *
    2**n)]`` ("full jitter" above a floor of half the base, so a retry is never immediate:
    many workers that lost the same PS do not come back in lock step). The
    randomness is injected (``rng``: anything with ``random() -> float`` in [0, 1), e.g. a
    seeded ``random.Random``), so a test replays the exact delays; the core takes no global

    Parameters
    ----------
    base, cap : float
        First (un-jittered) delay and the largest, in seconds.
    rng : object with ``random()``
    """

    def __init__(self, base: float, cap: float, rng: Any) -> None:
        if not (0 < base <= cap):
            raise ValueError(f"backoff needs 0 < base <= cap, got {base}, {cap}")
        self.base = float(base)
        self.cap = float(cap)
        self.rng = rng
        self.attempt = 0

    def next_delay(self) -> float:
        """The delay before the next reconnect (and count the attempt)."""
        ceiling = min(self.cap, self.base * 2.0 ** min(self.attempt, 60))
        self.attempt += 1
        low = self.base / 2
        return low + float(self.rng.random()) * (ceiling - low)

    def reset(self) -> None:
        """A round completed on the last connection: start over from ``base``."""
        self.attempt = 0


#: How an applied round's ``end_detail`` starts when no content check (oracle, approximate
#: estimate, redundancy) vouched for its gradient; the norm and model bounds still applied.
UNVERIFIED = "unverified"


class Endpoint:
    """Outbox, event queue and counters shared by the two state machines."""

    def __init__(self) -> None:
        self._outbox: list[Outgoing] = []
        # lists, not deques: drivers drain them whole (a swap), one pop(0) per next_event
        self._events: list[Event] = []
        #: counters of dropped, rejected and closed things, by reason
        self.stats: Counter[str] = Counter()

    def messages_to_send(self) -> list[Outgoing]:
        """Drain the outbox."""
        out, self._outbox = self._outbox, []
        return out

    def next_event(self) -> Event | None:
        """The next event, or None."""
        return self._events.pop(0) if self._events else None


#: "No deadline" in the cores' deadline comparisons.
INF = float("inf")


def fast_new(cls: type, names: tuple[str, ...] | None = None) -> Any:
    """THE unvalidated positional constructor of the cores (the one hot-path idiom they share).

    For a slotted, frozen dataclass (messages, events): :func:`aiogc.protocol.messages.
    slot_constructor`, one implementation with the wire decoder's, which stores each field
    through its slot (no ``__init__``, no ``__post_init__`` validation, no frozen
    ``__setattr__``; ~3x cheaper than ``Message.trusted``). For a named tuple
    (:class:`Outgoing`, :class:`ComputeChunks`): ``tuple.__new__`` on the arguments, a third
    of the named tuple's own ``__new__``. Arguments in field order.

    Only for values this process built itself (messages it sends, its own events): anything
    that came from the network is still built through the validating constructors.
    """
    if not issubclass(cls, tuple):
        return slot_constructor(cls, names)
    fields_ = names or cls._fields  # type: ignore[attr-defined]
    args = ", ".join(fields_)
    ns: dict[str, Any] = {"_new": tuple.__new__, "_cls": cls}
    exec(f"def make({args}):\n    return _new(_cls, ({args},))\n", ns)
    make = ns["make"]
    make.__doc__ = f"Unvalidated positional constructor of {cls.__name__}{tuple(fields_)}."
    return make


class Outgoing(NamedTuple):
    """Send ``message`` to ``peer`` (if any), then close the connection if ``close``.

    A named tuple rather than a frozen dataclass: the cores build several per worker-round,
    and ``fast_new(Outgoing)`` (a bare ``tuple.__new__``) costs a third of a slotted
    dataclass's constructor.
    """

    peer: Hashable
    message: Message | None
    close: bool = False
    reason: str = ""


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
    """A worker left the round (dead, timed out, vector rejected, disconnected)."""

    worker: int
    round: int
    reason: str
    time: float


@dataclass(frozen=True, slots=True)
class WorkerEvicted(Event):
    """``worker`` was evicted (its vectors located as inconsistent ``evidence``
    times); its connection is closed and its key refused for the rest of the run."""

    worker: int
    round: int
    reason: str
    time: float


@dataclass(frozen=True, slots=True)
class DuplicateWorker(Event):
    """A second connection authenticated as ``worker`` while one was open (the newer wins)."""

    worker: int
    peer: Hashable
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
    ``end_reason`` is why the round ended (an :class:`EndReason`, None while it
    runs); ``end_detail`` the particulars in words (which workers went away, which check
    rejected the step), empty when the code says it all. An applied round that no content
    check vouched for (no oracle, no spare vector to cross-check: ``--no-verify``) says so
    there: its ``end_detail`` starts with :data:`UNVERIFIED`.
    """

    round: int
    scheme: str
    t_start: float
    t_trigger: float | None = None
    t_end: float | None = None
    status: str = RoundStatus.RUNNING  # a RoundStatus: exact | approximate | failed
    end_reason: EndReason | None = None
    end_detail: str = ""
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
    #: a compressed upload's bound on what its rounding moved the decode (absolute,
    #: aiogc.coding.compress.rounding_bound); NaN when the upload is not compressed
    rounding_bound: float = float("nan")
    #: the decode's coefficients (who entered the gradient, with what weight), set by the
    #: aggregator; workers.csv and attribution.csv are written from it
    attribution: Attribution | None = None

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
            "end_detail": self.end_detail,
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
class SetupNeeded(Event):
    """The worker needs scheme and task for ``config`` (the driver builds them, then calls
    ``Worker.setup_ready`` or ``Worker.setup_failed``)."""

    config: Any
    time: float


class ComputeChunks(NamedTuple):
    """Work item: compute the gradients of ``chunks`` (positions ``first``, ``first + 1``, ...
    of this worker's order in ``round``) at ``model``, then call ``Worker.chunks_done``.
    (A named tuple, like :class:`Outgoing`: one is built per worker wake-up.)"""

    round: int
    first: int
    chunks: tuple[int, ...]
    model: np.ndarray


class EncodeVector(NamedTuple):
    """Work item: encode the worker's first ``len(grads)`` chunk gradients into its coded
    vector for ``state`` (attempt ``attempt`` of ``round``), then call ``Worker.encode_done``.

    The core has decided that the worker sends and with which coefficients: ``theta`` (a
    send-when-done scheme's fixed (load, ell) coefficients, ``coef`` their one column when
    ell = 1), else ``fast`` (the scheme's trusted encoder), else ``scheme.encode``. The driver
    does the numbers and the upload type (``aiogc.training.encode``).

    A streaming scheme's item is one chunk (``chunk``, its index; -1 for a coded vector):
    ``grads`` holds that chunk's gradient alone and ``theta`` is ``[[1]]``, so the vector is
    the gradient in the upload type.
    """

    round: int
    attempt: int
    worker: int
    state: Sequence[int]  # (m,) the broadcast state the vector is encoded against
    digest: bytes  # state_digest(state)
    grads: Sequence[np.ndarray]  # (c,) of shape (d,): positions 0..c-1 of the worker's order
    scheme: Scheme  # the round's scheme (ordering="adaptive": with the round's orders)
    theta: np.ndarray | None
    coef: np.ndarray | None
    fast: TrustedEncoder | None
    chunk: int


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


# ------------------------------------------------------------------------------ hot-path builders
# The worker core's names for fast_new constructors (kept for aiogc/core/worker.py).

#: ``new_outgoing(peer, message, close, reason)``
new_outgoing = fast_new(Outgoing)
#: ``new_compute_chunks(round, first, chunks, model)``
new_compute_chunks = fast_new(ComputeChunks)
#: ``new_encode_vector(round, attempt, worker, state, digest, grads, scheme, theta, coef, fast,
#: chunk)``
new_encode_vector = fast_new(EncodeVector)
#: ``new_chunk_computed(round, position, chunk, time, compute_s)``
new_chunk_computed = fast_new(ChunkComputed)
#: ``new_coded_sent(round, attempt, chunks_used, time)``
new_coded_sent = fast_new(CodedSent)
