"""The protocol's vocabulary: one frozen, validated dataclass per message kind.

Invariants
----------
* A message object that exists is well formed: every field has its exact type (``type(x) is
  int`` — ``True`` is not a round number) and lies in its context-free range. Context-dependent
  checks (worker id < m, count <= load, round == current round) belong to the core.
* Arrays (the model in :class:`RoundStart`, the payload of :class:`CodedGradient`) are 1-D,
  little-endian float32 or float64. Their bytes travel as the last element of the frame's
  msgpack array, a ``bin`` (see ``headers``).
* The field checkers (``Cls._checks``) are the schema, and each carries its wire form
  (``.wire``: a msgspec type with the same bounds, ``.tag``: its msgpack encoding): ``headers``
  builds the codec of every kind from them, validates every field of every frame from the
  network with it (falling back to the checkers to word the error), then builds the message
  with :func:`slot_constructor` (no second validation). ``Cls(...)`` validates too (messages built
  from values not yet checked); :meth:`Message.trusted` and :func:`slot_constructor` do not
  (values this process built itself).
"""

from __future__ import annotations

import hashlib
import math
import struct
import sys
from dataclasses import dataclass, field, fields
from typing import Annotated, Any, ClassVar, Final

import msgspec
import numpy as np

from aiogc.errors import MalformedFrame

#: Wire/protocol version. Bumped on any incompatible change (see docs/protocol.md).
PROTOCOL_VERSION: Final = 5

#: Largest integer accepted in any int field: fits every language's int64 with margin.
MAX_INT: Final = 2**53
#: Longest text field (reasons, names): a reason is for humans, not for payloads.
MAX_TEXT: Final = 1024
#: Longest state vector / delay row: bounds m and chunks per worker on the wire.
MAX_WORKERS: Final = 65536
#: Nonce / MAC / digest byte strings are at most this long (HMAC-SHA256 is 32 bytes).
MAX_BLOB: Final = 64
#: Longest config map carried by ``welcome`` (entries).
MAX_CONFIG_ENTRIES: Final = 64

#: dtypes allowed for arrays on the wire (never object, never big-endian, no float16).
ARRAY_DTYPES: Final = {"<f4": np.dtype("<f4"), "<f8": np.dtype("<f8")}


def _fail(kind: str, name: str, value: object, allowed: str) -> MalformedFrame:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return MalformedFrame(f"{kind}.{name}={shown}: expected {allowed}", code="bad_field")


# --- field checkers: each returns the (possibly normalised) value or raises MalformedFrame ---
# Each checker also carries its wire form, the one declaration the codec
# (aiogc.protocol.headers) and the Wireshark dissector (aiogc.protocol.dissector) are built
# from: ``wire``, the msgspec type that validates the msgpack value with the same bounds, and
# ``tag``, the short name of the msgpack encoding (docs/protocol.md §2.1).

#: largest finite float (``le=`` of a finite float field: refuses +inf; NaN fails every bound)
_FMAX: Final = sys.float_info.max


def _wire(check: Any, wire: Any, tag: str) -> Any:
    check.wire = wire
    check.tag = tag
    return check


def _uint_type(lo: int, hi: int) -> Any:
    return Annotated[int, msgspec.Meta(ge=lo, le=hi)]


def _int(lo: int = 0, hi: int = MAX_INT) -> Any:
    def check(kind: str, name: str, v: object) -> int:
        if type(v) is not int or not lo <= v <= hi:
            raise _fail(kind, name, v, f"int in [{lo}, {hi}]")
        return v

    return _wire(check, _uint_type(lo, hi), "uint")


def _float(lo: float = 0.0, hi: float = math.inf, *, allow_inf: bool = False) -> Any:
    def check(kind: str, name: str, v: object) -> float:
        # int is accepted for floats (msgpack peers may encode 0.0 as 0); bool never.
        if type(v) is int:
            v = float(v)
        if type(v) is not float or math.isnan(v) or not lo <= v <= hi:
            raise _fail(kind, name, v, f"float in [{lo}, {hi}]")
        if math.isinf(v) and not allow_inf:
            raise _fail(kind, name, v, "a finite float")
        return v

    bound = hi if allow_inf else min(hi, _FMAX)
    return _wire(check, Annotated[float, msgspec.Meta(ge=lo, le=bound)], "float")


def _text(kind: str, name: str, v: object) -> str:
    if type(v) is not str or len(v) > MAX_TEXT:
        raise _fail(kind, name, v, f"str of at most {MAX_TEXT} chars")
    return v


_wire(_text, Annotated[str, msgspec.Meta(max_length=MAX_TEXT)], "str")


def _blob(kind: str, name: str, v: object) -> bytes:
    if type(v) is not bytes or len(v) > MAX_BLOB:
        raise _fail(kind, name, v, f"bytes of at most {MAX_BLOB}")
    return v


_wire(_blob, Annotated[bytes, msgspec.Meta(max_length=MAX_BLOB)], "bin")


def _nonce(kind: str, name: str, v: object) -> bytes:
    # fresh nonces must be long enough not to repeat: 16..64 bytes
    if type(v) is not bytes or not 16 <= len(v) <= MAX_BLOB:
        raise _fail(kind, name, v, f"bytes of 16 to {MAX_BLOB}")
    return v


_wire(_nonce, Annotated[bytes, msgspec.Meta(min_length=16, max_length=MAX_BLOB)], "bin")


def _count_list(kind: str, name: str, v: object) -> tuple[int, ...]:
    # entries are chunk counts (a state vector): 0..MAX_WORKERS, a u32 each on the wire
    if type(v) not in (list, tuple) or len(v) > MAX_WORKERS:  # type: ignore[arg-type]
        raise _fail(kind, name, v, f"list of at most {MAX_WORKERS} ints")
    for x in v:  # type: ignore[attr-defined]
        if type(x) is not int or not 0 <= x <= MAX_WORKERS:
            raise _fail(kind, name, x, f"ints in [0, {MAX_WORKERS}]")
    return tuple(v)  # type: ignore[arg-type]


_wire(_count_list, Annotated[tuple[_uint_type(0, MAX_WORKERS), ...],  # type: ignore[misc]
                             msgspec.Meta(max_length=MAX_WORKERS)], "uint_array")


#: Longest ``round_start.orders`` (every worker's order, flattened: the sum of the loads); at
#: 4 bytes an entry it fits the 1 MiB header limit of an authenticated connection.
MAX_ORDER_ENTRIES: Final = 1 << 17


def _order_list(kind: str, name: str, v: object) -> tuple[int, ...]:
    # chunk indices 0..MAX_WORKERS - 1, a u32 each on the wire; empty = the static order
    if type(v) not in (list, tuple) or len(v) > MAX_ORDER_ENTRIES:  # type: ignore[arg-type]
        raise _fail(kind, name, v, f"list of at most {MAX_ORDER_ENTRIES} ints")
    for x in v:  # type: ignore[attr-defined]
        if type(x) is not int or not 0 <= x < MAX_WORKERS:
            raise _fail(kind, name, x, f"ints in [0, {MAX_WORKERS - 1}]")
    return tuple(v)  # type: ignore[arg-type]


_wire(_order_list, Annotated[tuple[_uint_type(0, MAX_WORKERS - 1), ...],  # type: ignore[misc]
                             msgspec.Meta(max_length=MAX_ORDER_ENTRIES)], "uint_array")


def _delay_list(kind: str, name: str, v: object) -> tuple[float, ...]:
    if type(v) not in (list, tuple) or len(v) > MAX_WORKERS:  # type: ignore[arg-type]
        raise _fail(kind, name, v, f"list of at most {MAX_WORKERS} floats")
    out = []
    for x in v:  # type: ignore[attr-defined]
        if type(x) is int:
            x = float(x)
        # +inf is meaningful here: a worker scheduled to be dead never finishes that chunk.
        if type(x) is not float or math.isnan(x) or x < 0:
            raise _fail(kind, name, x, "non-negative floats (inf allowed)")
        out.append(x)
    return tuple(out)


# +inf allowed (ge=0 still refuses NaN)
_wire(_delay_list, Annotated[tuple[Annotated[float, msgspec.Meta(ge=0.0)], ...],
                             msgspec.Meta(max_length=MAX_WORKERS)], "float_array")


_CONFIG_SCALARS = (int, float, str, bool, type(None))


def _config(kind: str, name: str, v: object) -> dict[str, Any]:
    if type(v) is not dict or len(v) > MAX_CONFIG_ENTRIES:
        raise _fail(kind, name, v, f"map of at most {MAX_CONFIG_ENTRIES} entries")
    for k, x in v.items():
        if type(k) is not str or len(k) > 64:
            raise _fail(kind, name, k, "str keys of at most 64 chars")
        if type(x) not in _CONFIG_SCALARS or (type(x) is str and len(x) > MAX_TEXT):
            raise _fail(kind, f"{name}.{k}", x, "int, float, str, bool or nil")
    return dict(v)


_wire(_config, Annotated[
    dict[Annotated[str, msgspec.Meta(max_length=64)],
         int | float | Annotated[str, msgspec.Meta(max_length=MAX_TEXT)] | bool | None],
    msgspec.Meta(max_length=MAX_CONFIG_ENTRIES)], "map")


def _array(kind: str, name: str, v: object) -> np.ndarray:
    if not isinstance(v, np.ndarray) or v.ndim != 1:
        raise _fail(kind, name, type(v).__name__, "1-D ndarray")
    if v.dtype.str not in ARRAY_DTYPES:
        raise _fail(kind, name, v.dtype.str, f"dtype in {sorted(ARRAY_DTYPES)}")
    return v


_wire(_array, None, "payload")


#: coded_gradient's payload may also be one of the 16-bit upload types of ``coded_dtype``
#: (IEEE float16, or bfloat16 carried as ``<u2`` words (aiogc.coding.compress))
CODED_ARRAY_DTYPES: Final = {**ARRAY_DTYPES, "<f2": np.dtype("<f2"), "<u2": np.dtype("<u2")}


def _coded_array(kind: str, name: str, v: object) -> np.ndarray:
    if not isinstance(v, np.ndarray) or v.ndim != 1:
        raise _fail(kind, name, type(v).__name__, "1-D ndarray")
    if v.dtype.str not in CODED_ARRAY_DTYPES:
        raise _fail(kind, name, v.dtype.str, f"dtype in {sorted(CODED_ARRAY_DTYPES)}")
    return v


_wire(_coded_array, None, "payload")


@dataclass(frozen=True, slots=True)
class Message:
    """Base class. Subclasses set ``kind`` and ``_checks`` (field name -> checker)."""

    kind: ClassVar[str] = ""
    #: the header's kind byte (set by ``@_kind``; headers.KIND_CODES is derived from it)
    kind_code: ClassVar[int] = 0
    #: name of the ndarray field whose bytes travel after the header, or None
    array_field: ClassVar[str | None] = None
    _checks: ClassVar[dict[str, Any]] = {}
    #: field names in order, and those travelling in the header (cached: dataclasses.fields()
    #: per message was ~40 % of decoding a small frame)
    _names: ClassVar[tuple[str, ...]] = ()
    _header_names: ClassVar[frozenset[str]] = frozenset()

    def __post_init__(self) -> None:
        for name in self._names:
            value = getattr(self, name)
            checked = self._checks[name](self.kind, name, value)
            if checked is not value:
                object.__setattr__(self, name, checked)

    @classmethod
    def trusted(cls, *values: Any) -> Any:
        """Build from positional field values *without* validation.

        Only for messages this process builds itself from values it already trusts (the hot
        path: reports, coded vectors, pings); anything from the network goes through
        :meth:`from_fields`, which checks every field.
        """
        obj = object.__new__(cls)
        for name, v in zip(cls._names, values, strict=True):
            object.__setattr__(obj, name, v)
        return obj

    def header_fields(self) -> dict[str, Any]:
        """Fields as msgpack-ready values, array field excluded."""
        out: dict[str, Any] = {}
        for name in self._names:
            if name == self.array_field:
                continue
            v = getattr(self, name)
            out[name] = list(v) if isinstance(v, tuple) else v
        return out

    def array(self) -> np.ndarray | None:
        """The array carried after the header, or None."""
        return None if self.array_field is None else getattr(self, self.array_field)

    @classmethod
    def from_fields(cls, values: dict[str, Any], arr: np.ndarray | None = None) -> Message:
        """Build from decoded header fields; unknown or missing fields are MalformedFrame."""
        expected = cls._header_names
        got = set(values)
        if got != expected:
            missing = sorted(expected - got)
            unknown = sorted(str(k) for k in got - expected)
            raise MalformedFrame(
                f"{cls.kind}: missing fields {missing}, unknown fields {unknown[:5]}",
                code="bad_schema",
            )
        kwargs = dict(values)
        if cls.array_field is not None:
            if arr is None:
                raise MalformedFrame(f"{cls.kind}: array payload missing", code="bad_schema")
            kwargs[cls.array_field] = arr
        elif arr is not None:
            raise MalformedFrame(f"{cls.kind}: carries no array", code="bad_schema")
        return cls(**kwargs)


def slot_constructor(cls: type, names: tuple[str, ...] | None = None) -> Any:
    """A positional constructor of the slotted (frozen) dataclass ``cls`` that stores each
    field through its slot descriptor: no ``__init__``, no validation, no frozen
    ``__setattr__``. Arguments in ``names`` order (default: ``cls._names`` for a message
    class, else the dataclass fields).

    For the wire decoder (after it checked every field) and for messages and events this
    process builds itself; about 3x cheaper than :meth:`Message.trusted`. (The cores' name
    for it is ``aiogc.core.common.fast_new``.)
    """
    if names is None:
        names = getattr(cls, "_names", None) or tuple(f.name for f in fields(cls))
    ns: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    for i, name in enumerate(names):
        ns[f"_s{i}"] = getattr(cls, name).__set__  # the slot's member descriptor
    args = ", ".join(f"a{i}" for i in range(len(names)))
    body = "".join(f"    _s{i}(o, a{i})\n" for i in range(len(names)))
    exec(f"def make({args}):\n    o = _new(_cls)\n{body}    return o\n", ns)
    make = ns["make"]
    make.__doc__ = f"Unvalidated positional constructor of {cls.__name__}{names}."
    return make


def _kind(name: str, *, kind_code: int, array_field: str | None = None, **checks: Any) -> Any:
    """Class decorator: register the kind, its wire code (the header's kind byte,
    docs/protocol.md §2.1: never reuse one), its array field and its field checkers."""

    def wrap(cls: type[Message]) -> type[Message]:
        taken = {c.kind_code: k for k, c in KINDS.items()}
        assert 0 < kind_code < 256 and kind_code not in taken, \
            f"{name}: kind code {kind_code} is invalid or taken by {taken.get(kind_code)}"
        cls.kind = name
        cls.kind_code = kind_code
        cls.array_field = array_field
        cls._checks = checks
        cls._names = tuple(f.name for f in fields(cls))
        cls._header_names = frozenset(n for n in cls._names if n != array_field)
        missing = set(cls._names) ^ set(checks)
        assert not missing, f"{name}: checker/field mismatch {missing}"
        KINDS[name] = cls
        return cls

    return wrap


#: kind string -> message class (the wire dispatches on this table)
KINDS: dict[str, type[Message]] = {}

_ROUND = _int()
_EPOCH = _int()
_WORKER = _int(0, MAX_WORKERS - 1)


# ----------------------------------------------------------------------- handshake (both ways)


@_kind("challenge", kind_code=1, nonce=_nonce, epoch=_EPOCH)
@dataclass(frozen=True, slots=True)
class Challenge(Message):
    """PS -> worker, first frame on a connection: a fresh nonce to MAC, and the PS epoch."""

    nonce: bytes
    epoch: int


@_kind("hello", kind_code=2, worker=_WORKER, nonce=_nonce, mac=_blob, epoch=_EPOCH)
@dataclass(frozen=True, slots=True)
class Hello(Message):
    """Worker -> PS: who I am, my own nonce for the PS to MAC, and my MAC of the PS's nonce.

    ``epoch`` echoes the challenge's epoch; ``mac`` is empty when the PS runs without a secret.
    """

    worker: int
    nonce: bytes
    mac: bytes
    epoch: int


@_kind("welcome", kind_code=3, epoch=_EPOCH, worker=_WORKER, mac=_blob, config=_config)
@dataclass(frozen=True, slots=True)
class Welcome(Message):
    """PS -> worker: accepted. ``mac`` proves the PS knows the secret; ``config`` is the run
    configuration a worker needs to rebuild the scheme and task (see docs/protocol.md)."""

    epoch: int
    worker: int
    mac: bytes
    config: dict[str, Any] = field(hash=False)


# ------------------------------------------------------------------------- worker -> PS


@_kind("ready", kind_code=4, epoch=_EPOCH)
@dataclass(frozen=True, slots=True)
class Ready(Message):
    """Worker -> PS: configuration rebuilt and checked; include me from the next round on.

    Separate from ``hello`` because rebuilding the scheme and task takes time (~0.2 s), and a
    round started before a worker is ready would charge that time to the round.
    """

    epoch: int


@_kind(
    "chunk_report", kind_code=6,
    epoch=_EPOCH,
    round=_ROUND,
    count=_int(0, MAX_WORKERS),
    t_worker=_float(0.0),
    elapsed_s=_float(0.0),
)
@dataclass(frozen=True, slots=True)
class ChunkReport(Message):
    """Worker -> PS: I have finished and stored ``count`` chunk gradients of this round.

    ``t_worker`` is the worker's monotonic clock at the count-th chunk's completion,
    ``elapsed_s`` the same measured from the worker's receipt of ``round_start``.
    """

    epoch: int
    round: int
    count: int
    t_worker: float
    elapsed_s: float


@_kind(
    "coded_gradient", kind_code=8, array_field="payload",
    epoch=_EPOCH,
    round=_ROUND,
    attempt=_int(),
    state_digest=_blob,
    compute_s=_float(0.0),
    payload=_coded_array,
)
@dataclass(frozen=True, slots=True, eq=False)
class CodedGradient(Message):
    """Worker -> PS: one coded vector (length ceil(d/ℓ)) for (round, attempt).

    ``state_digest`` is :func:`state_digest` of the state vector it was encoded with, so the PS
    can refuse a vector encoded against another broadcast.
    """

    epoch: int
    round: int
    attempt: int
    state_digest: bytes
    compute_s: float
    payload: np.ndarray


@_kind(
    "chunk_gradient", kind_code=16, array_field="payload",
    epoch=_EPOCH,
    round=_ROUND,
    chunk=_int(0, MAX_WORKERS - 1),
    compute_s=_float(0.0),
    elapsed_s=_float(0.0),
    payload=_array,
)
@dataclass(frozen=True, slots=True, eq=False)
class ChunkGradient(Message):
    """Worker -> PS (streaming schemes): the gradient of chunk ``chunk``, sent as soon as it
    is computed, one frame per chunk in the worker's processing order.

    ``compute_s`` is the worker's scheduled compute time up to and including this chunk, and
    ``elapsed_s`` the time from the worker's receipt of ``round_start`` to the chunk's
    completion (a :class:`ChunkReport`'s); the frame also reports the chunk's position.
    """

    epoch: int
    round: int
    chunk: int
    compute_s: float
    elapsed_s: float
    payload: np.ndarray


@_kind("bye", kind_code=11, reason=_text)
@dataclass(frozen=True, slots=True)
class Bye(Message):
    """Worker -> PS: leaving on purpose (not a failure)."""

    reason: str


# ------------------------------------------------------------------------- PS -> worker


@_kind(
    "round_start", kind_code=5, array_field="model",
    epoch=_EPOCH,
    round=_ROUND,
    delays_s=_delay_list,
    net_delay_s=_float(0.0),
    model=_array,
    orders=_order_list,
)
@dataclass(frozen=True, slots=True, eq=False)
class RoundStart(Message):
    """PS -> worker: start round ``round`` at ``model``.

    ``delays_s`` is this worker's materialised compute delay for each chunk position in this
    round (empty = no artificial delay; ``inf`` = the worker is scheduled dead), and
    ``net_delay_s`` the artificial one-way delay it adds to each frame it sends this round.
    ``orders`` (``ordering="adaptive"`` only; empty otherwise, and then absent on the wire):
    every worker's processing order for this round, flattened in worker order.
    """

    epoch: int
    round: int
    delays_s: tuple[float, ...]
    net_delay_s: float
    model: np.ndarray
    orders: tuple[int, ...] = ()


@_kind(
    "encode_and_transmit", kind_code=7,
    epoch=_EPOCH,
    round=_ROUND,
    attempt=_int(),
    state=_count_list,
)
@dataclass(frozen=True, slots=True)
class EncodeAndTransmit(Message):
    """PS -> all workers: stop computing, encode against ``state`` and send one coded vector."""

    epoch: int
    round: int
    attempt: int
    state: tuple[int, ...]


@_kind("resume", kind_code=9, epoch=_EPOCH, round=_ROUND, attempt=_int())
@dataclass(frozen=True, slots=True)
class Resume(Message):
    """PS -> all workers: the broadcast of an earlier attempt is void; compute on.

    ``attempt`` is the new attempt number; stored chunk gradients are kept.
    """

    epoch: int
    round: int
    attempt: int


@_kind("round_end", kind_code=10, epoch=_EPOCH, round=_ROUND, status=_text)
@dataclass(frozen=True, slots=True)
class RoundEnd(Message):
    """PS -> all workers: round over (``status``: exact, approximate or failed); drop its data."""

    epoch: int
    round: int
    status: str


@_kind("error", kind_code=12, code=_text, reason=_text)
@dataclass(frozen=True, slots=True)
class Error(Message):
    """Either way: the sender is closing this connection because of ``code`` / ``reason``."""

    code: str
    reason: str


@_kind("shutdown", kind_code=13, reason=_text)
@dataclass(frozen=True, slots=True)
class Shutdown(Message):
    """PS -> worker: the run is over; exit."""

    reason: str


@_kind("ping", kind_code=14, seq=_int())
@dataclass(frozen=True, slots=True)
class Ping(Message):
    """Either way: liveness probe while otherwise silent."""

    seq: int


@_kind("pong", kind_code=15, seq=_int())
@dataclass(frozen=True, slots=True)
class Pong(Message):
    """Answer to :class:`Ping` with the same ``seq``."""

    seq: int


WORKER_TO_PS: Final = frozenset({"hello", "ready", "chunk_report", "coded_gradient",
                                 "chunk_gradient", "bye", "error", "ping", "pong"})
PS_TO_WORKER: Final = frozenset({"challenge", "welcome", "round_start", "encode_and_transmit",
                                 "resume", "round_end", "error", "shutdown", "ping", "pong"})


def state_digest(state: tuple[int, ...] | list[int] | np.ndarray) -> bytes:
    """8-byte digest of a state vector (blake2b of its little-endian int64 bytes)."""
    if isinstance(state, np.ndarray):
        raw = np.ascontiguousarray(state, dtype="<i8").tobytes()
    else:
        raw = struct.pack(f"<{len(state)}q", *state)
    return hashlib.blake2b(raw, digest_size=8).digest()
