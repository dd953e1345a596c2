"""stream-chunks on the protocol: one ``chunk_gradient`` per computed chunk, the PS keeps the
first copy of every chunk and decodes once every chunk arrived.

The cores on the virtual clock (what the PS does with each frame), then live runs (coroutines,
worker hosts, processes) on a pinned schedule, whose decisions equal the protocol engine's and
the fast path's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aiogc.config import RunConfig
from aiogc.core import PSPhase
from aiogc.core.common import PeerClosed
from aiogc.harness.local import run_live
from aiogc.harness.options import RunOptions
from aiogc.protocol.messages import ChunkGradient, CodedGradient, Message, state_digest
from aiogc.sim.fast import simulate_fast
from aiogc.sim.protocol import simulate_protocol
from aiogc.training.delays import materialise
from tests.helpers import Rig, build_rig, pinned_trigger_schedule

STREAM: dict[str, Any] = dict(scheme="stream-chunks", workers=6, delta=2, seed=3,
                              task="linreg:samples=120,dim=6")


def _rig(**kw: Any) -> Rig:
    cfg = RunConfig(**{**STREAM, "heartbeat_s": None, "dead_after_s": None, **kw})
    return build_rig(cfg)


def _computing(**kw: Any) -> Rig:
    """A stream-chunks rig in round 0, before any chunk is done (chunks take 10 s)."""
    rig = _rig(rounds=2, delay="const:10", **kw)
    rig.sim.run(until=0.5)
    assert rig.ps.phase is PSPhase.COMPUTING
    return rig


def _chunk(rig: Rig, worker: int, position: int, **over: Any) -> ChunkGradient:
    """Worker ``worker``'s frame of its chunk at ``position`` (the true gradient)."""
    chunk = int(rig.scheme.orders[worker][position])
    grad = rig.task.chunk_gradient(chunk, rig.ps.model)
    fields: dict[str, Any] = dict(epoch=0, round=0, chunk=chunk, compute_s=1.0, elapsed_s=1.0,
                                  payload=np.asarray(grad, dtype=np.float64))
    return ChunkGradient(**{**fields, **over})


def _send(rig: Rig, worker: int, msg: Message) -> str:
    """Deliver ``msg`` from ``worker``: "open", or "closed:<code>"."""
    n = len(rig.ps._events)
    rig.ps.receive(rig.sim._peer(worker), msg, now=rig.sim.now)
    closed = [e for e in rig.ps._events[n:] if isinstance(e, PeerClosed)]
    return "closed:" + closed[0].code if closed else "open"


# ------------------------------------------------------------------ the cores


def test_every_round_decodes_exactly_and_duplicates_are_counted() -> None:
    """Every chunk frame counts in the state; one copy of each chunk is kept, the others are
    counted ``duplicate_chunk``: over the run, duplicates = sum(state) - N per round."""
    rig = _rig(rounds=8, delay="exp:0.5")
    rig.sim.run()
    recs = rig.ps.records
    assert [r.status for r in recs] == ["exact"] * 8
    assert max(r.rel_error for r in recs) < 1e-12
    n = rig.scheme.n_chunks
    dup = sum(sum(r.state) - n for r in recs)
    assert dup > 0  # exp delays: some chunk arrives from a second holder before the end
    assert rig.ps.stats["duplicate_chunk"] == dup
    # each chunk frame is also the worker's report of its position
    for r in recs:
        last: dict[int, int] = {}
        for _t, w, count, _e in r.reports:
            assert count == last.get(w, 0) + 1
            last[w] = count
        assert [last.get(w, 0) for w in range(rig.scheme.m)] == list(r.state)


def test_a_chunk_out_of_its_order_closes_bad_chunk() -> None:
    rig = _computing()
    wrong = int(rig.scheme.orders[1][1])  # position 1 before position 0
    assert _send(rig, 1, _chunk(rig, 1, 0, chunk=wrong)) == "closed:bad_chunk"


def test_a_coded_vector_in_a_streaming_run_closes_bad_kind() -> None:
    rig = _computing()
    vec = CodedGradient(epoch=0, round=0, attempt=0, state_digest=state_digest([0] * 6),
                        compute_s=1.0, payload=np.zeros(rig.ps.dim))
    assert _send(rig, 2, vec) == "closed:bad_kind"


def test_a_non_finite_chunk_drops_the_worker_and_keeps_its_earlier_chunks() -> None:
    rig = _computing()
    assert _send(rig, 3, _chunk(rig, 3, 0)) == "open"
    bad = _chunk(rig, 3, 1)
    bad.payload[0] = np.nan
    assert _send(rig, 3, bad) == "open"  # a rejected contribution, not a closed connection
    rs = rig.ps._round
    assert rs is not None
    assert rig.ps.stats["payload_rejected"] == 1 and 3 in rs.excluded
    assert rs.state[3] == 1 and int(rig.scheme.orders[3][0]) in rs.chunks


@pytest.mark.parametrize("streamed_first", [True, False])
def test_a_dropped_workers_streamed_chunk_still_counts(streamed_first: bool) -> None:
    """Worker a streams its first chunk c, then a and c's other holder b are lost: c is
    already at the PS, so the round goes on. Without that frame nobody left holds c: the
    round is hopeless and fails at once (workers_gone)."""
    rig = _computing()
    a = 0
    c = int(rig.scheme.orders[a][0])
    (b,) = [j for j in np.flatnonzero(rig.scheme.A[c]) if j != a]
    if streamed_first:
        assert _send(rig, a, _chunk(rig, a, 0)) == "open"
    for w in (a, int(b)):
        rig.ps.connection_lost(rig.sim._peer(w), now=rig.sim.now)
    if streamed_first:
        assert rig.ps.phase is PSPhase.COMPUTING
    else:
        assert rig.ps.phase is PSPhase.DECODING
        rec = rig.ps._decode_item.record  # type: ignore[union-attr]
        assert rec.end_reason == "workers_gone"


def test_the_worker_streams_each_chunk_as_it_is_computed() -> None:
    """Worker 0 sends chunk_gradient frames in its processing order, each at the instant its
    chunk is done (no report, no coded vector), with the scheduled compute time so far."""
    rig = _rig(rounds=1, delay="exp:0.5")
    sent: list[tuple[float, ChunkGradient]] = []
    w0 = rig.workers[0]
    orig = w0.poll

    def poll() -> Any:
        events, work, out, deadline = orig()
        sent.extend((rig.sim.now, o.message) for o in out
                    if isinstance(o.message, ChunkGradient))
        assert not any(o.message is not None and o.message.kind in ("chunk_report",
                                                                    "coded_gradient")
                       for o in out)
        return events, work, out, deadline

    w0.poll = poll  # type: ignore[method-assign]
    rig.sim.run()
    assert sent
    order = [int(c) for c in rig.scheme.orders[0]]
    assert [m.chunk for _, m in sent] == order[:len(sent)]
    due = np.cumsum(rig.schedule.compute_s[0, 0, :len(sent)])
    np.testing.assert_allclose([m.compute_s for _, m in sent], due, rtol=1e-12)
    np.testing.assert_allclose([t for t, _ in sent], due, rtol=1e-12)  # latency 0


def test_sixteen_bit_uploads_are_refused_for_streaming() -> None:
    from aiogc.errors import ConfigError

    with pytest.raises(ConfigError, match="coded_dtype"):
        _rig(rounds=1, coded_dtype="bfloat16")


# ------------------------------------------------------------------ live


def _pinned(tmp_path: Path, rounds: int = 3) -> RunConfig:
    """stream-chunks on a schedule whose end states cannot depend on timing."""
    cfg = RunConfig(**{**STREAM, "rounds": rounds})
    path = tmp_path / "delays_in.csv"
    pinned_trigger_schedule(cfg, gap_s=0.01).to_csv(path)
    return cfg.replace(delay=f"replay:{path}")


def _engines(cfg: RunConfig) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    sched = materialise(cfg.delay, cfg.latency, rounds=cfg.rounds, m=cfg.workers,
                        max_chunks=cfg.delta, seed=cfg.seed)
    proto = simulate_protocol(cfg, ["stream-chunks"], schedule=sched)["stream-chunks"]
    fast = simulate_fast(cfg, ["stream-chunks"], schedule=sched, mse=False)["stream-chunks"]
    return [r.state for r in proto], [tuple(int(x) for x in s) for s in fast.states]


@pytest.mark.parametrize("how", [dict(connection_per_worker=True), dict(),
                                 dict(worker_hosts=2)], ids=["per-worker", "one-host", "hosts"])
def test_live_rounds_equal_the_engines(tmp_path: Path, how: dict[str, Any]) -> None:
    """Coroutine workers (a connection each, or one host connection), or two worker-host
    processes: every round exact, with the end state of the protocol engine and of the fast
    path."""
    cfg = _pinned(tmp_path)
    res = run_live(cfg, ["stream-chunks"], RunOptions(
        mode="coroutines", out_dir=tmp_path / "run", plots=False, loop="asyncio", **how))
    recs = res.records["stream-chunks"]
    assert [r.status for r in recs] == ["exact"] * cfg.rounds
    assert max(r.rel_error for r in recs) < 1e-9
    proto, fast = _engines(cfg)
    assert [r.state for r in recs] == proto == fast


@pytest.mark.processes
def test_process_workers_stream(tmp_path: Path) -> None:
    cfg = _pinned(tmp_path, rounds=2)
    res = run_live(cfg, ["stream-chunks"], RunOptions(mode="processes",
                                                      out_dir=tmp_path / "run", plots=False))
    recs = res.records["stream-chunks"]
    assert [r.status for r in recs] == ["exact"] * 2
    assert [r.state for r in recs] == _engines(cfg)[0]


def test_a_streaming_workers_row_counts_its_frames() -> None:
    """workers.csv: a streaming worker's chunks_done is its frames (reports), not its load,
    and comm_s runs from its last chunk's computation to that frame's arrival."""
    from aiogc.core import RoundRecord
    from aiogc.harness.columns import is_trigger_scheme, worker_rows

    rec = RoundRecord(round=0, scheme="stream-chunks", t_start=1.0, t_end=1.9, t_trigger=1.9,
                      state=(1, 2), reports=[(1.3, 0, 1, 0.25), (1.5, 1, 1, 0.4),
                                             (1.9, 1, 2, 0.8)],
                      arrivals={0: 1.3, 1: 1.9}, compute_s={0: 0.25, 1: 0.75})
    assert not is_trigger_scheme("stream-chunks")
    rows = worker_rows("stream-chunks", rec, m=2, loads=[2, 2])
    assert [r["chunks_done"] for r in rows] == [1, 2]
    assert [r["comm_s"] for r in rows] == pytest.approx([0.05, 0.15])
