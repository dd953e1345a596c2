"""The worker's tables (aiogc/core/worker_rules.py) walked h11-style.

* every (phase, PS kind) pair has one defined outcome: dropped (CLOSED), refused with
  ``bad_kind`` (a kind the phase does not accept), or handled with every phase change inside
  ``TRANSITIONS``;
* the accepted kinds are exactly messages.py's ``PS_TO_WORKER``;
* every transition in the table is taken by some scenario below, or is listed in
  ``NOT_EXERCISED`` with the reason;
* a handler that jumps outside the table fails with LocalProtocolError before the phase
  changes, and nothing in core/worker*.py assigns ``self.phase`` except ``_set_phase``.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest

import aiogc.core.worker as worker_mod
from aiogc.config import RunConfig, scheme_digest
from aiogc.core import ComputeChunks, Outgoing, Setup, Worker, WorkerPhase
from aiogc.core.worker import ACCEPTS
from aiogc.core.worker_round import WorkerRounds
from aiogc.core.worker_rules import NEXT, TRANSITIONS
from aiogc.errors import LocalProtocolError
from aiogc.protocol.messages import (
    PS_TO_WORKER,
    Challenge,
    EncodeAndTransmit,
    Error,
    Message,
    Ping,
    Pong,
    Resume,
    RoundEnd,
    RoundStart,
    Shutdown,
    Welcome,
)
from tests.helpers import build_rig

P = WorkerPhase
CORE = Path(__file__).resolve().parents[1] / "aiogc" / "core"
J = 2  # the worker under test
EPOCH = 1

#: transitions no scenario here takes, and why they are in the table all the same
NOT_EXERCISED: dict[tuple[WorkerPhase, WorkerPhase], str] = {
    (P.CLOSED, P.CLOSED): "Worker._fail is idempotent by design, but every caller checks "
                          "for CLOSED first (receive, the timer, setup_failed, "
                          "_internal_error): kept so that a failure path can never raise",
}

Edge = tuple[WorkerPhase, WorkerPhase]


@pytest.fixture
def edges(monkeypatch: pytest.MonkeyPatch) -> list[Edge]:
    """Every phase change any worker makes while the test runs, as (from, to)."""
    seen: list[Edge] = []
    real = WorkerRounds._set_phase

    def recording(self: WorkerRounds, new: WorkerPhase) -> None:
        old = self.phase
        real(self, new)
        seen.append((old, new))

    monkeypatch.setattr(WorkerRounds, "_set_phase", recording)
    return seen


# ------------------------------------------------------------------ a worker in each phase

def _phase(w: Worker) -> WorkerPhase:
    """``w.phase``, read afresh (mypy would keep an earlier assert's narrowing)."""
    return w.phase


_CFG = RunConfig(workers=6, delta=3, rounds=3, delay="exp:0.05", seed=3,
                 task="linreg:samples=240,dim=12", heartbeat_s=None, dead_after_s=None)
_SCHEME = _CFG.build_scheme()
_WIRE = {**_CFG.to_wire(), "scheme_digest": scheme_digest(_SCHEME)}
_DIM = 12


def _setup(config: RunConfig) -> Setup:
    return Setup(config, _SCHEME, lambda chunk, w: np.zeros(_DIM))


def _load() -> int:
    return int(_SCHEME.loads[J])


def _round_start(rnd: int) -> RoundStart:
    return RoundStart(epoch=EPOCH, round=rnd, delays_s=(1.0,) * _load(), net_delay_s=0.0,
                      model=np.zeros(_DIM))


def _in_phase(phase: WorkerPhase) -> Worker:
    """A fresh worker (no secret: no MACs) driven by hand into ``phase``."""
    w = Worker(J, nonce_fn=lambda: b"w" * 16)
    steps: list[Callable[[], None]] = [
        lambda: w.connection_made(now=0.0),
        lambda: w.receive("ps", Challenge(nonce=b"p" * 16, epoch=EPOCH), now=0.0),
        lambda: w.receive("ps", Welcome(epoch=EPOCH, worker=J, mac=b"", config=_WIRE),
                          now=0.0),
        lambda: w.setup_ready(_setup(_CFG), now=0.0),
        lambda: w.receive("ps", _round_start(0), now=0.0),  # chunks due at t=1: computing
        lambda: w.receive("ps", EncodeAndTransmit(epoch=EPOCH, round=0, attempt=0,
                                                  state=(0,) * _SCHEME.m), now=0.0),
    ]
    order = [P.CLOSED, P.CONNECTING, P.AUTHENTICATING, P.SETTING_UP, P.IDLE, P.COMPUTING,
             P.WAITING]
    for step in steps[:order.index(phase)]:
        step()
    assert w.phase is phase, (w.phase, phase, dict(w.stats))
    w.poll()  # start from empty queues
    return w


#: one well-formed frame of each kind the PS sends (epoch 1, round 0 where it matters)
SAMPLES: dict[str, Callable[[], Message]] = {
    "challenge": lambda: Challenge(nonce=b"q" * 16, epoch=EPOCH + 1),
    "welcome": lambda: Welcome(epoch=EPOCH, worker=J, mac=b"", config=_WIRE),
    "round_start": lambda: _round_start(1),
    "encode_and_transmit": lambda: EncodeAndTransmit(epoch=EPOCH, round=0, attempt=1,
                                                     state=(0,) * _SCHEME.m),
    "resume": lambda: Resume(epoch=EPOCH, round=0, attempt=1),
    "round_end": lambda: RoundEnd(epoch=EPOCH, round=0, status="exact"),
    "shutdown": lambda: Shutdown(reason="done"),
    "error": lambda: Error(code="ps_says_so", reason="test"),
    "ping": lambda: Ping(seq=1),
    "pong": lambda: Pong(seq=1),
}


def _pairs() -> Iterator[tuple[WorkerPhase, str]]:
    for phase in WorkerPhase:
        for kind in sorted(PS_TO_WORKER):
            yield phase, kind


# ------------------------------------------------------------------ the tables

def test_tables_are_consistent_with_the_protocol() -> None:
    assert set(ACCEPTS) == set(PS_TO_WORKER) == set(SAMPLES)
    assert {cls.kind for cls in worker_mod._DISPATCH} == set(PS_TO_WORKER)
    for cls, (phases, _handler) in worker_mod._DISPATCH.items():
        assert phases == ACCEPTS[cls.kind]
    # nothing is dispatched in CLOSED (frames on a closed connection are dropped)
    assert all(P.CLOSED not in phases for phases in ACCEPTS.values())
    # NEXT is TRANSITIONS by source phase, and every phase can close
    assert {(a, b) for a, nxt in NEXT.items() for b in nxt} == set(TRANSITIONS)
    assert all((p, P.CLOSED) in TRANSITIONS for p in WorkerPhase)
    assert isinstance(ACCEPTS, MappingProxyType) and isinstance(TRANSITIONS, MappingProxyType)


@pytest.mark.parametrize(("phase", "kind"), list(_pairs()),
                         ids=[f"{p.value}-{k}" for p, k in _pairs()])
def test_every_phase_kind_pair_has_a_defined_outcome(phase: WorkerPhase, kind: str,
                                                     edges: list[Edge]) -> None:
    w = _in_phase(phase)
    before = dict(dict(w.stats))
    del edges[:]
    w.receive("ps", SAMPLES[kind](), now=0.5)
    stats = dict(w.stats)
    _events, _work, out, _deadline = w.poll()
    if phase is P.CLOSED:  # dropped: nothing dispatched, nothing sent
        assert stats["after_close"] == before.get("after_close", 0) + 1
        assert w.phase is P.CLOSED and not out and not edges
    elif phase not in ACCEPTS[kind]:  # refused: bad_kind, the connection closes
        assert stats.get("failed_bad_kind") == 1
        assert w.phase is P.CLOSED and edges == [(phase, P.CLOSED)]
        err = out[-1].message
        assert isinstance(err, Error)
        assert out[-1] == Outgoing("ps", Error(code="bad_kind", reason=err.reason), close=True,
                                   reason="bad_kind")
    else:  # handled: no refusal, no internal error, every change in the table
        assert "failed_bad_kind" not in stats and "failed_worker_error" not in stats, stats
        assert all(e in TRANSITIONS for e in edges), edges


def test_every_transition_is_taken_by_a_scenario(edges: list[Edge]) -> None:
    # 1. the table walk: every (phase, kind) pair, and the driver calls on each phase
    for phase, kind in _pairs():
        _in_phase(phase).receive("ps", SAMPLES[kind](), now=0.5)
    for phase in WorkerPhase:
        w = _in_phase(phase)
        w.connection_made(now=0.5)  # a new transport, the old one not reported lost
        w = _in_phase(phase)
        w.connection_lost(now=0.5)
    w = _in_phase(P.COMPUTING)  # every chunk computed: WAITING
    w.handle_timer(now=float(_load()))
    for item in iter(w.next_work, None):
        assert isinstance(item, ComputeChunks)
        w.chunks_done(item.round, item.first, [np.zeros(_DIM)] * len(item.chunks), now=9.0)
    assert w.phase is P.WAITING
    w = _in_phase(P.WAITING)  # resume restarts the chunk in flight
    w.receive("ps", Resume(epoch=EPOCH, round=0, attempt=1), now=0.5)
    assert w.phase is P.COMPUTING
    w = _in_phase(P.COMPUTING)  # round_end twice: the second one in IDLE
    for _ in range(2):
        w.receive("ps", RoundEnd(epoch=EPOCH, round=0, status="exact"), now=0.5)
        assert w.phase is P.IDLE
    # 2. whole runs: a clean one, and one whose worker is paused long enough to be dropped
    # (it reconnects) -- tests/test_core.py checks their results
    build_rig(RunConfig(workers=6, delta=3, rounds=3, delay="exp:0.05", seed=3,
                        task="linreg:samples=240,dim=12")).sim.run()
    rig = build_rig(RunConfig(workers=6, delta=3, rounds=8, delay="const:0.5", seed=3,
                              task="linreg:samples=240,dim=12", heartbeat_s=0.2,
                              dead_after_s=1.0))
    rig.sim.pause(2, at=0.1, until=2.0)
    rig.sim.run()
    taken = set(edges)
    assert taken <= set(TRANSITIONS), taken - set(TRANSITIONS)
    missing = set(TRANSITIONS) - taken
    assert missing == set(NOT_EXERCISED), {(a.value, b.value) for a, b in missing}


# ------------------------------------------------------------------ changes outside the table

def test_set_phase_refuses_an_edge_outside_the_table_before_changing_anything() -> None:
    w = _in_phase(P.IDLE)
    illegal = [(a, b) for a in WorkerPhase for b in WorkerPhase if (a, b) not in TRANSITIONS]
    assert (P.IDLE, P.AUTHENTICATING) in illegal
    with pytest.raises(LocalProtocolError, match="illegal worker transition idle -> "
                                                 "authenticating"):
        w._set_phase(P.AUTHENTICATING)
    assert w.phase is P.IDLE


def test_a_handler_jumping_outside_the_table_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def rogue_ping(self: Worker, msg: Any, now: float) -> None:
        self._set_phase(P.AUTHENTICATING)  # IDLE -> AUTHENTICATING is not in the table

    dispatch = dict(worker_mod._DISPATCH)
    dispatch[Ping] = (dispatch[Ping][0], rogue_ping)
    monkeypatch.setattr(worker_mod, "_DISPATCH", MappingProxyType(dispatch))
    w = _in_phase(P.IDLE)
    with pytest.raises(LocalProtocolError, match="idle -> authenticating"):
        rogue_ping(w, Ping(seq=1), 0.5)  # the handler itself raises...
    assert w.phase is P.IDLE
    w.receive("ps", Ping(seq=1), now=0.5)  # ...and through the driver call it closes
    assert _phase(w) is P.CLOSED
    assert dict(w.stats).get("failed_worker_error") == 1
    _events, _work, out, _deadline = w.poll()
    assert isinstance(out[-1].message, Error)
    assert "illegal worker transition idle -> authenticating" in out[-1].message.reason


def _phase_assignments(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """(enclosing function, line) of every write to ``self.phase``."""
    def walk(node: ast.AST, func: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) \
                else func
            targets: list[ast.expr] = []
            if isinstance(child, ast.Assign):
                targets = child.targets
            elif isinstance(child, ast.AugAssign | ast.AnnAssign):
                targets = [child.target]
            for t in targets:
                for sub in ast.walk(t):
                    if (isinstance(sub, ast.Attribute) and sub.attr == "phase"
                            and isinstance(sub.value, ast.Name) and sub.value.id == "self"):
                        yield func, getattr(child, "lineno", 0)
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Name)
                    and child.func.id in ("setattr", "delattr") and len(child.args) >= 2
                    and isinstance(child.args[1], ast.Constant)
                    and child.args[1].value == "phase"):
                yield func, child.lineno
            yield from walk(child, name)

    return walk(tree, "<module>")


def test_only_set_phase_assigns_the_phase() -> None:
    files = sorted(CORE.glob("worker*.py"))
    assert {f.name for f in files} >= {"worker.py", "worker_round.py", "worker_rules.py"}
    writers = {(f.name, func, line) for f in files
               for func, line in _phase_assignments(ast.parse(f.read_text()))}
    assert {func for _f, func, _line in writers} == {"_set_phase"}, writers
    assert len(writers) == 1


def test_the_ast_check_sees_a_direct_write() -> None:
    bad = ast.parse("class W:\n    def f(self):\n        self.phase = 1\n"
                    "    def g(self):\n        setattr(self, 'phase', 2)\n")
    assert {func for func, _line in _phase_assignments(bad)} == {"f", "g"}
