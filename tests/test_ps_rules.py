"""The parameter server's rules are data (aiogc/core/ps_rules.py), walked h11-style.

* every (phase, kind) pair of an authenticated worker's frame has one defined outcome, the
  table agrees with protocol/messages.py's WORKER_TO_PS, and each outcome is what the PS does
  when driven into that phase and fed that frame;
* every declared transition is reached by some run, and nothing else is;
* a phase change outside the table raises LocalProtocolError before anything changes, and no
  code in core/ps*.py assigns the phase except ``_set_phase``.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aiogc.config import RunConfig
from aiogc.core import Finished, PeerClosed, PSPhase, Triggered
from aiogc.core.ps import _ACCEPTS, RULES, ParameterServer
from aiogc.core.ps_rounds import RoundMachine
from aiogc.core.ps_rules import REFUSING, TRANSITIONS
from aiogc.core.ps_work import DecodeRound
from aiogc.errors import LocalProtocolError
from aiogc.protocol.messages import (
    WORKER_TO_PS,
    Bye,
    ChunkGradient,
    ChunkReport,
    CodedGradient,
    Error,
    Hello,
    Message,
    Ping,
    Pong,
    Ready,
    state_digest,
)
from tests.helpers import Rig, build_rig

CORE = Path(__file__).resolve().parents[1] / "aiogc" / "core"


def _cfg(**kw: object) -> RunConfig:
    base: dict[str, object] = dict(
        workers=6, delta=3, rounds=3, delay="exp:0.05", seed=3, task="linreg:samples=240,dim=12",
        heartbeat_s=None, dead_after_s=None,
    )
    base.update(kw)
    return RunConfig(**base)  # type: ignore[arg-type]


# ------------------------------------------------------------------ the table itself


def test_every_phase_and_kind_has_one_outcome_and_the_kinds_are_the_protocols() -> None:
    assert set(RULES) == set(PSPhase) == set(TRANSITIONS)
    for phase, row in RULES.items():
        assert set(row) == set(WORKER_TO_PS), phase
        for kind, name in row.items():
            # every outcome is a handler of the PS (the refusing ones too)
            assert callable(getattr(ParameterServer, "_on_" + name, None)), (phase, kind, name)
    # the acceptance view the layering test reads: hello is never accepted after auth
    assert set(_ACCEPTS) | {"hello"} == set(WORKER_TO_PS)
    assert all(RULES[ph]["hello"] in REFUSING for ph in PSPhase)
    # a round's frames are acted on only while a round runs
    for kind in ("chunk_report", "coded_gradient"):
        assert _ACCEPTS[kind] == {PSPhase.COMPUTING, PSPhase.COLLECTING}
    assert all(t in PSPhase for targets in TRANSITIONS.values() for t in targets)
    assert TRANSITIONS[PSPhase.FINISHED] == {}


# ------------------------------------------------------------------ walking (phase, kind)


def _peer(rig: Rig, j: int) -> Any:
    return rig.sim._peer(j)


def _in_joining() -> tuple[Rig, int]:
    rig = build_rig(_cfg(join_timeout_s=30.0))
    rig.sim.kill(5, at=0.0)  # never joins: round 0 waits for it
    rig.sim.run(until=0.5)
    assert rig.ps.phase is PSPhase.JOINING
    return rig, -1


def _in_computing() -> tuple[Rig, int]:
    rig = build_rig(_cfg(delay="const:10"))
    rig.sim.run(until=0.5)
    assert rig.ps.phase is PSPhase.COMPUTING
    return rig, 0


def _report_all(rig: Rig) -> None:
    """Every worker reports every chunk: the state is decodable, the PS triggers."""
    for j in range(rig.config.workers):
        if rig.ps.phase is not PSPhase.COMPUTING:
            break
        rig.ps.receive(_peer(rig, j), ChunkReport(epoch=0, round=0, count=rig.config.delta,
                                                  t_worker=0.0, elapsed_s=0.0),
                       now=rig.sim.now)


def _in_collecting() -> tuple[Rig, int]:
    rig, _ = _in_computing()
    _report_all(rig)
    assert rig.ps.phase is PSPhase.COLLECTING
    return rig, 0


def _in_decoding() -> tuple[Rig, int]:
    """The round's last vector arrived; its DecodeRound is out (the driver has not answered)."""
    rig, _ = _in_collecting()
    rs = rig.ps._round
    assert rs is not None and rs.broadcast is not None
    for j in sorted(rs.expected):
        rig.ps.receive(_peer(rig, j), CodedGradient(
            epoch=0, round=0, attempt=rs.attempt, state_digest=state_digest(rs.broadcast),
            compute_s=0.0, payload=np.zeros(rig.ps.scheme.payload_len(rig.ps.dim))),
            now=rig.sim.now)
    assert rig.ps.phase is PSPhase.DECODING
    assert isinstance(rig.ps.next_work(), DecodeRound)
    return rig, 0


def _in_finished() -> tuple[Rig, int]:
    rig, _ = _in_computing()
    rig.ps.stop("test", now=rig.sim.now)
    assert rig.ps.phase is PSPhase.FINISHED
    return rig, 0


IN_PHASE: dict[PSPhase, Callable[[], tuple[Rig, int]]] = {
    PSPhase.JOINING: _in_joining,
    PSPhase.COMPUTING: _in_computing,
    PSPhase.COLLECTING: _in_collecting,
    PSPhase.DECODING: _in_decoding,
    PSPhase.FINISHED: _in_finished,
}


def _frame(kind: str, rnd: int, rig: Rig) -> Message:
    rs = rig.ps._round
    digest = state_digest(rs.broadcast) if rs is not None and rs.broadcast else b"x" * 8
    return {
        "hello": Hello(worker=1, nonce=b"h" * 16, mac=b"", epoch=0),
        "ready": Ready(epoch=0),
        "chunk_report": ChunkReport(epoch=0, round=max(rnd, 0), count=1, t_worker=0.0,
                                    elapsed_s=0.0),
        "coded_gradient": CodedGradient(epoch=0, round=max(rnd, 0), attempt=0,
                                        state_digest=digest, compute_s=0.0,
                                        payload=np.zeros(rig.ps.scheme.payload_len(rig.ps.dim))),
        "chunk_gradient": ChunkGradient(epoch=0, round=max(rnd, 0), chunk=0, compute_s=0.0,
                                        elapsed_s=0.0, payload=np.zeros(rig.ps.dim)),
        "ping": Ping(seq=7),
        "pong": Pong(seq=7),
        "bye": Bye(reason="done"),
        "error": Error(code="worker_error", reason="boom"),
    }[kind]


def _outcome(rig: Rig, kind: str, rnd: int) -> tuple[str, dict[str, int], list[Any]]:
    ps = rig.ps
    peer = _peer(rig, 1)
    ps.messages_to_send()
    before = dict(ps.stats)
    n_events = len(ps._events)
    ps.receive(peer, _frame(kind, rnd, rig), now=rig.sim.now)
    after = dict(ps.stats)
    delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    closed = [e for e in ps._events[n_events:] if isinstance(e, PeerClosed)]
    return ("closed:" + closed[0].code if closed else "open"), delta, ps.messages_to_send()


@pytest.mark.parametrize("phase", list(PSPhase), ids=lambda p: p.value)
def test_each_phase_and_kind_does_what_the_table_says(phase: PSPhase) -> None:
    for kind in sorted(WORKER_TO_PS):
        rig, rnd = IN_PHASE[phase]()
        ps = rig.ps
        name = RULES[phase][kind]
        closed, delta, out = _outcome(rig, kind, rnd)
        where = (phase, kind, name, closed, delta)
        if name == "stale":
            assert closed == "open" and delta == {f"stale_round_{kind}": 1}, where
        elif name == "second_hello":
            assert closed == "closed:bad_kind", where
        elif name == "bye":
            assert closed == "closed:bye" and delta.get(f"peer_{kind}") == 1, where
        elif name == "ping":
            assert closed == "open" and [type(o.message) for o in out] == [Pong], where
        elif name == "ignore":
            assert closed == "open" and delta == {} and out == [], where
        elif name in ("ready", "ready_and_start"):
            assert closed == "open" and delta == {}, where
            assert ps._peers[_peer(rig, 1)].ready
        elif name == "report":
            assert closed == "open" and not any(k.startswith("stale_round") for k in delta)
            assert ps._round is not None and ps._round.state[1] >= 1, where
        elif name == "chunk":  # the rig runs partial, which streams nothing
            assert closed == "closed:bad_kind", where
        else:
            assert name == "coded", where
            assert closed == "open" and not any(k.startswith("stale_round") for k in delta)
        if closed == "open" and name != "ready_and_start":
            assert ps.phase is phase, where  # no frame above moves the phase by itself


def test_a_kind_outside_the_protocol_closes_the_connection() -> None:
    from aiogc.protocol.messages import Shutdown

    rig, _ = _in_computing()
    closed, _, _ = _outcome_of(rig, Shutdown(reason="not yours"))
    assert closed == "closed:bad_kind"


def _outcome_of(rig: Rig, msg: Message) -> tuple[str, None, None]:
    n = len(rig.ps._events)
    rig.ps.receive(_peer(rig, 1), msg, now=rig.sim.now)
    closed = [e for e in rig.ps._events[n:] if isinstance(e, PeerClosed)]
    return ("closed:" + closed[0].code if closed else "open"), None, None


# ------------------------------------------------------------------ transitions


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[tuple[PSPhase, PSPhase]]]:
    """Every (old, new) phase change any PS makes while the test runs."""
    got: set[tuple[PSPhase, PSPhase]] = set()
    orig = RoundMachine._set_phase

    def spy(self: RoundMachine, new: PSPhase) -> None:
        old = self.phase
        orig(self, new)
        got.add((old, new))

    monkeypatch.setattr(RoundMachine, "_set_phase", spy)
    yield got


def _trigger_time(cfg: RunConfig, **kw: Any) -> float:
    ref = build_rig(cfg, **kw)
    ref.sim.run()
    return next(e.time for e in ref.sim.ps_events if isinstance(e, Triggered))


def test_every_declared_transition_is_reached_and_no_other(
        seen: set[tuple[PSPhase, PSPhase]]) -> None:
    J, P, C, D, F = (PSPhase.JOINING, PSPhase.COMPUTING, PSPhase.COLLECTING,
                     PSPhase.DECODING, PSPhase.FINISHED)
    # rounds of a partial scheme, then all rounds done: J->P, P->C, C->D, D->P, D->F
    build_rig(_cfg()).sim.run()
    # a send-when-done scheme decodes from the computing phase: P->D
    build_rig(_cfg(scheme="original")).sim.run()
    # every chunk reported by all (delta=3, ell=1), then a worker we wait for goes: coverage
    # still holds without it, so the PS re-broadcasts with a new attempt: C->C
    rig, _ = _in_collecting()
    rs = rig.ps._round
    assert rs is not None
    for j in range(rig.config.workers):  # the reports after the trigger count too
        rig.ps.receive(_peer(rig, j), ChunkReport(epoch=0, round=0, count=rig.config.delta,
                                                  t_worker=0.0, elapsed_s=0.0), now=rig.sim.now)
    rig.ps.connection_lost(_peer(rig, min(rs.expected)), now=rig.sim.now)
    assert (C, C) in seen and rs.attempt == 1 and rig.ps.phase is C
    # coverage breaks after the trigger: resume C->P
    cfg = _cfg(workers=6, delta=3, n_parts=2, rounds=1, delay="const:1.0")
    t = _trigger_time(cfg, latency=0.01)
    rig = build_rig(cfg, latency=0.01)
    rig.sim.kill(1, at=t + 0.005)
    rig.sim.run()
    assert (C, P) in seen
    # a hopeless round: D->J (too few workers for the next), then J->F at the join deadline
    cfg = _cfg(workers=4, delta=2, n_parts=2, rounds=2, round_timeout_s=20.0,
               delay="const:1.0")
    t = _trigger_time(cfg, latency=0.01)
    rig = build_rig(cfg, latency=0.01)
    rig.sim.kill(1, at=t + 0.005)
    rig.sim.run()
    assert {(D, J), (J, F)} <= seen
    # stop() while computing, while collecting
    rig, _ = _in_computing()
    rig.ps.stop("test", now=rig.sim.now)
    rig, _ = _in_collecting()
    rig.ps.stop("test", now=rig.sim.now)
    assert {(P, F), (C, F)} <= seen
    # stop() while the decode is out: the round still completes, then the run ends
    rig = build_rig(_cfg())
    run = rig.aggregator.run

    def stop_first(item: Any) -> Any:
        if isinstance(item, DecodeRound) and rig.ps.phase is not PSPhase.FINISHED:
            rig.ps.stop("stopped mid-decode", now=rig.sim.now)
        return run(item)

    rig.sim.aggregator = type("A", (), {"run": staticmethod(stop_first)})()
    rig.sim.run()
    assert (D, F) in seen
    assert len(rig.ps.records) == 1 and rig.ps.records[0].status == "exact"
    fin = [e for e in rig.sim.ps_events if isinstance(e, Finished)]
    assert [(f.rounds_completed, f.reason) for f in fin] == [(1, "stopped mid-decode")]
    declared = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
    assert seen == declared


# ------------------------------------------------------------------ no phase change off the table


def test_a_handler_that_jumps_phases_off_the_table_raises_before_anything_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The trigger handler is made to go COMPUTING -> JOINING (not in TRANSITIONS)."""

    def rogue(self: RoundMachine, now: float, *, exact: bool) -> None:
        self._set_phase(PSPhase.JOINING)

    monkeypatch.setattr(RoundMachine, "_trigger", rogue)
    rig, _ = _in_computing()
    rs = rig.ps._round
    with pytest.raises(LocalProtocolError, match="illegal PS transition computing -> joining"):
        _report_all(rig)
    assert rig.ps.phase is PSPhase.COMPUTING and rig.ps._round is rs
    assert rig.ps._handlers is rig.ps._rules[PSPhase.COMPUTING]


def test_only_set_phase_assigns_the_phase() -> None:
    """No code in core/ps*.py assigns ``self.phase`` (or the handler table that follows it)
    outside ``_set_phase``; ``setattr`` is not used to get round that."""
    offenders = []
    files = sorted(CORE.glob("ps*.py"))
    assert {f.name for f in files} >= {"ps.py", "ps_rules.py", "ps_rounds.py"}
    for path in files:
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                targets: list[ast.expr] = []
                if isinstance(node, ast.Assign):
                    targets = list(node.targets)
                elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                    targets = [node.target]
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                      and node.func.id == "setattr"):
                    offenders.append((path.name, fn.name, "setattr"))
                for t in targets:
                    for sub in ast.walk(t):
                        if (isinstance(sub, ast.Attribute) and sub.attr in ("phase", "_handlers")
                                and isinstance(sub.value, ast.Name) and sub.value.id == "self"
                                and fn.name != "_set_phase" and not (
                                    sub.attr == "_handlers" and fn.name == "__init__")):
                            offenders.append((path.name, fn.name, sub.attr))
    assert offenders == []
