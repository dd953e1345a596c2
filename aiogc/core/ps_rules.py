"""The parameter server's rules as data: its phases, the moves between them, and what each
kind of frame from an authenticated worker does in each phase.

``TRANSITIONS`` lists every phase change the PS may make (``ParameterServer._set_phase``
refuses anything else with :class:`~aiogc.errors.LocalProtocolError` before any state
changes); ``RULES`` maps (phase, kind) to the name of the handler that runs, for every kind in
:data:`aiogc.protocol.messages.WORKER_TO_PS` and every phase. Two handlers decide nothing:
``stale`` drops the frame and counts it (``stale_epoch_<kind>`` or ``stale_round_<kind>``),
``second_hello`` closes the connection (``bad_kind``). A kind outside WORKER_TO_PS closes the
connection too (``bad_kind``). Before authentication only ``hello`` is read (the handshake,
whatever the phase). ``tests/test_ps_rules.py`` walks these tables.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType as _ro
from typing import Final


class PSPhase(enum.Enum):
    JOINING = "joining"  # waiting for enough ready workers (all m before round 0)
    COMPUTING = "computing"  # round running, workers computing and reporting
    COLLECTING = "collecting"  # encode_and_transmit broadcast, waiting for coded vectors
    DECODING = "decoding"  # the round ended; its DecodeRound is with the driver
    FINISHED = "finished"

    # members are singletons: hash by identity (Enum's default hashes the name in Python, and
    # the phase selects the handler table on every phase change)
    __hash__ = object.__hash__


J, P, C, D, F = (PSPhase.JOINING, PSPhase.COMPUTING, PSPhase.COLLECTING, PSPhase.DECODING,
                 PSPhase.FINISHED)

#: phase -> {next phase: when}. Every entry is reached by a test (tests/test_ps_rules.py).
TRANSITIONS: Final[Mapping[PSPhase, Mapping[PSPhase, str]]] = _ro({
    J: {P: "enough workers ready (round 0: all m, or the join deadline with a decodable set)",
        F: "join deadline with too few workers, or stop()"},
    P: {C: "the reported state is decodable (or the approx deadline): encode_and_transmit",
        D: "the round ended (send-when-done decodable, failed, timed out)",
        F: "stop()"},
    C: {C: "a re-broadcast with a new attempt (a worker we waited for is gone)",
        P: "resume: the state lost a worker and is no longer decodable",
        D: "the round ended (every expected vector arrived, failed, timed out)",
        F: "stop()"},
    D: {P: "the next round starts (after the decode)",
        J: "the next round waits for enough ready workers",
        F: "all rounds done, or stop() while the decode was out"},
    F: {},
})

_IN_ROUND: Final[Mapping[str, str]] = _ro({
    "hello": "second_hello",
    "ready": "ready",
    "chunk_report": "report",
    "coded_gradient": "coded",
    "ping": "ping",
    "pong": "ignore",
    "bye": "bye",
    "error": "bye",
})
_BETWEEN_ROUNDS: Final[Mapping[str, str]] = _ro(
    {**_IN_ROUND, "chunk_report": "stale", "coded_gradient": "stale"})

#: phase -> kind -> handler name (``ParameterServer._on_<name>``)
RULES: Final[Mapping[PSPhase, Mapping[str, str]]] = _ro({
    J: _ro({**_BETWEEN_ROUNDS, "ready": "ready_and_start"}),  # ready may start a round
    P: _IN_ROUND,
    C: _IN_ROUND,
    D: _BETWEEN_ROUNDS,  # ready counts for the next round, which starts after the decode
    F: _BETWEEN_ROUNDS,
})

#: handlers that refuse the frame: dropped and counted, or the connection closed
REFUSING: Final = frozenset({"stale", "second_hello"})

#: kind -> phases in which an authenticated worker's frame of that kind is acted on
_ACCEPTS: Final[Mapping[str, frozenset[PSPhase]]] = _ro({
    kind: frozenset(ph for ph in PSPhase if RULES[ph][kind] not in REFUSING)
    for kind in RULES[J]
    if any(RULES[ph][kind] not in REFUSING for ph in PSPhase)
})
