"""The worker's phases and its two tables: which PS frames each phase accepts, and which phase
changes exist.

Every phase change of :class:`aiogc.core.worker.Worker` goes through ``Worker._set_phase``,
which checks it against :data:`TRANSITIONS` before anything changes (an illegal one raises
:class:`aiogc.errors.LocalProtocolError`); every frame from the PS goes through the dispatch,
which refuses a kind its phase does not accept (:data:`ACCEPTS`, close code ``bad_kind``).
tests/test_worker_rules.py walks both tables: every (phase, kind) pair has a defined outcome,
and every transition is taken by some scenario.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from aiogc.core.common import declared_rows
from aiogc.protocol.messages import KINDS, PS_TO_WORKER, Message

__all__ = ["HANDSHAKING", "NEXT", "OPEN", "PS_PEER", "RUNNING", "TRANSITIONS", "WorkerPhase",
           "dispatch_of"]

#: the worker's one peer, as its :class:`~aiogc.core.common.Outgoing` frames name it
PS_PEER = "ps"


class WorkerPhase(enum.Enum):
    CONNECTING = "connecting"  # transport up, waiting for challenge
    AUTHENTICATING = "authenticating"  # hello sent, waiting for welcome
    SETTING_UP = "setting_up"  # welcomed, waiting for the driver to build scheme and task
    IDLE = "idle"  # ready, between rounds
    COMPUTING = "computing"
    WAITING = "waiting"  # stopped computing (all done, or told to encode), round not over
    CLOSED = "closed"

    # members are singletons: hash by identity (Enum's default hashes the name in Python, and
    # phase checks run on every message)
    __hash__ = object.__hash__


_CONNECTING = WorkerPhase.CONNECTING
_AUTHENTICATING = WorkerPhase.AUTHENTICATING
_SETTING_UP = WorkerPhase.SETTING_UP
_IDLE = WorkerPhase.IDLE
_COMPUTING = WorkerPhase.COMPUTING
_WAITING = WorkerPhase.WAITING
_CLOSED = WorkerPhase.CLOSED

RUNNING = frozenset({_IDLE, _COMPUTING, _WAITING})
HANDSHAKING = frozenset({_CONNECTING, _AUTHENTICATING})
#: every phase but CLOSED. In CLOSED nothing is dispatched at all: frames still in flight on
#: a connection the worker closed are dropped (``after_close``)
OPEN = frozenset(WorkerPhase) - {_CLOSED}
_OPEN = OPEN

#: (from, to) -> the triggers that take it: PS frames by kind, the driver's calls by method
#: name. Nothing else exists; a self-loop is listed where a handler sets the phase it is in.
TRANSITIONS: Mapping[tuple[WorkerPhase, WorkerPhase], str] = MappingProxyType({
    (_CLOSED, _CONNECTING): "connection_made (the first connection and every reconnect)",
    (_CONNECTING, _AUTHENTICATING): "challenge",
    (_AUTHENTICATING, _SETTING_UP): "welcome",
    (_SETTING_UP, _IDLE): "setup_ready, or welcome when the setup of that config is in hand",
    (_IDLE, _COMPUTING): "round_start",
    (_COMPUTING, _COMPUTING): "round_start (the previous round's round_end folded into it)",
    (_WAITING, _COMPUTING): "round_start, or resume",
    (_COMPUTING, _WAITING): "chunks_done with the last chunk, round_start of load 0, "
                            "encode_and_transmit",
    (_WAITING, _WAITING): "encode_and_transmit (a re-broadcast)",
    (_COMPUTING, _IDLE): "round_end",
    (_WAITING, _IDLE): "round_end",
    (_IDLE, _IDLE): "round_end (again)",
    # CLOSED from every phase: connection_lost, shutdown, error, a handshake or liveness
    # timeout, and any failure (Worker._fail). CLOSED -> CLOSED: _fail is idempotent
    **{(p, _CLOSED): "connection_lost, shutdown, error, timeout, or a failure"
       for p in WorkerPhase},
    # CONNECTING from an open phase: a driver's connection_made for a new transport whose
    # predecessor's loss it never reported (the simulator reconnecting a worker it paused):
    # connection_made starts over from any phase
    **{(p, _CONNECTING): "connection_made replacing a transport not reported lost"
       for p in _OPEN},
})

#: from -> the phases it may move to (what ``Worker._set_phase`` checks: one dict lookup and
#: one set test, no tuple built per phase change)
NEXT: Mapping[WorkerPhase, frozenset[WorkerPhase]] = MappingProxyType({
    p: frozenset(q for (a, q) in TRANSITIONS if a is p) for p in WorkerPhase
})


def dispatch_of(cls: type) -> Mapping[type[Message], tuple[frozenset[WorkerPhase],
                                                           Callable[..., None]]]:
    """The worker's dispatch table, exact message type -> (the phases that accept it, the
    handler), built from the rows ``cls``'s handlers declare
    (:func:`aiogc.core.common.handles`). A kind outside its phases is refused with
    ``bad_kind`` (the worker closes the connection).

    Every kind of PS_TO_WORKER has exactly one handler, and no phase set holds CLOSED;
    AssertionError at import otherwise.
    """
    table: dict[type[Message], tuple[frozenset[WorkerPhase], Callable[..., Any]]] = {}
    for attr, fn, row in declared_rows(cls):
        msg_cls = KINDS[row.kind]
        assert row.kind in PS_TO_WORKER and msg_cls not in table, f"{attr}: {row.kind}"
        assert row.otherwise is None and row.phases <= OPEN, f"{attr}: {row}"
        table[msg_cls] = (frozenset(row.phases), fn)  # type: ignore[arg-type]
    missing = PS_TO_WORKER - {c.kind for c in table}
    assert not missing, f"no handler for {sorted(missing)}"
    return MappingProxyType(table)
