"""The parameter server's rules as data: its phases, the moves between them, and what each
kind of frame from an authenticated worker does in each phase.

``TRANSITIONS`` lists every phase change the PS may make (``ParameterServer._set_phase``
refuses anything else with :class:`~aiogc.errors.LocalProtocolError` before any state
changes); the rules table (``ParameterServer.RULES``, :data:`aiogc.core.ps.RULES`) maps (phase,
kind) to the name of the handler that runs, for every kind in
:data:`aiogc.protocol.messages.WORKER_TO_PS` and every phase. Its rows are declared next to
their handlers (``@handles(kind, phases)`` in ps.py / ps_rounds.py) and :func:`rules_of`
builds the table once, when the class is defined, checking that each pair has one outcome.
Two handlers decide nothing: ``stale`` drops the frame and counts it (``stale_epoch_<kind>``
or ``stale_round_<kind>``), ``second_hello`` closes the connection (``bad_kind``). A kind
outside WORKER_TO_PS closes the connection too (``bad_kind``). Before authentication only
``hello`` is read (the handshake, whatever the phase). ``tests/test_ps_rules.py`` walks the
tables.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType as _ro
from typing import Final

from aiogc.core.common import declared_rows
from aiogc.protocol.messages import WORKER_TO_PS


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

#: every phase: the default phase set of a row
ALL: Final = frozenset(PSPhase)
#: the phases in which a round runs (its reports and coded vectors are acted on)
IN_ROUND: Final = frozenset({P, C})

#: handlers that refuse the frame: dropped and counted, or the connection closed
REFUSING: Final = frozenset({"stale", "second_hello"})


def rules_of(cls: type) -> Mapping[PSPhase, Mapping[str, str]]:
    """The PS's table, phase -> kind -> handler name (``cls._on_<name>``), built from the
    rows its handlers declare (:func:`aiogc.core.common.handles`).

    Every kind of WORKER_TO_PS must have exactly one outcome in every phase: a row covering
    the phase, else its row's ``otherwise``. Raises AssertionError at import otherwise.
    """
    table: dict[PSPhase, dict[str, str]] = {ph: {} for ph in PSPhase}
    fallback: dict[str, str] = {}
    for attr, _fn, row in declared_rows(cls):
        assert attr.startswith("_on_"), f"{attr}: a handler is named _on_<name>"
        assert row.kind in WORKER_TO_PS, f"{attr}: {row.kind} is not a worker's kind"
        for ph in row.phases:
            assert isinstance(ph, PSPhase) and row.kind not in table[ph], (attr, row, ph)
            table[ph][row.kind] = attr[4:]
        if row.otherwise is not None:
            assert fallback.setdefault(row.kind, row.otherwise) == row.otherwise, (attr, row)
    for ph, kinds in table.items():
        for kind in WORKER_TO_PS - set(kinds):
            assert kind in fallback, f"no rule for {kind} in {ph.value}"
            kinds[kind] = fallback[kind]
    assert all(hasattr(cls, "_on_" + name) for row in table.values() for name in row.values())
    return _ro({ph: _ro(kinds) for ph, kinds in table.items()})


def accepts_of(rules: Mapping[PSPhase, Mapping[str, str]]
               ) -> Mapping[str, frozenset[PSPhase]]:
    """kind -> phases in which an authenticated worker's frame of that kind is acted on."""
    return _ro({
        kind: frozenset(ph for ph in PSPhase if rules[ph][kind] not in REFUSING)
        for kind in rules[J]
        if any(rules[ph][kind] not in REFUSING for ph in PSPhase)
    })
