"""Per-round attribution: the decode's weights reproduce the decoded
gradient, and the work that did not enter it is exactly the work not covered.

Coding level (random states, every scheme the core runs), the protocol simulator (the real
PS and worker cores on virtual time, exact and approx mode: the weights the aggregator
records reproduce the very decode it ran) and the record files (workers.csv columns,
attribution.csv, load_run, inspect, the timeline figure).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aiogc.coding.registry import make_scheme
from aiogc.config import RunConfig
from aiogc.core.attribution import chunk_cover, entered_counts, used_workers
from aiogc.core.common import RoundRecord
from aiogc.harness.columns import ATTRIBUTION_COLUMNS, WORKER_COLUMNS, read_csv
from aiogc.harness.records import RunRecorder
from aiogc.protocol.status import RoundStatus
from aiogc.sim.protocol import simulate_protocol
from aiogc.training.aggregator import Aggregator

SCHEMES = [("partial", 1), ("partial", 2), ("original", 1), ("original", 2), ("uncoded", 1),
           ("ignore-stragglers", 1), ("stream-chunks", 1)]


def _scheme(name: str, ell: int) -> Any:
    m = 6
    delta = 1 if name in ("uncoded", "ignore-stragglers") else 3
    return make_scheme(name, m=m, delta=delta, n_parts=ell, k=4 if name.startswith("ig") else None,
                       rng=np.random.default_rng(3))


def _states(s: Any, rng: np.random.Generator) -> list[np.ndarray]:
    """Random states the scheme decodes from: partial counts, finished sets."""
    out = []
    for _ in range(12):
        if s.sends_when_done:
            fin = rng.random(s.m) < 0.7
            out.append(np.where(fin, s.loads, 0).astype(np.int64))
        else:
            out.append(rng.integers(0, s.loads + 1).astype(np.int64))
    return [c for c in out if c.any()]


def _encode_all(s: Any, c: np.ndarray, G: list[np.ndarray], d: int) -> np.ndarray:
    """Every contributing worker's vector, worker j encoding its own copy ``G[j]`` (its chunk
    gradients in processing order); shape (m, payload_len)."""
    V = np.zeros((s.m, s.payload_len(d)))
    for j in range(s.m):
        if s.contributes(j, c):
            V[j] = s.encode(j, c, G[j])
    return V


@pytest.mark.parametrize(("name", "ell"), SCHEMES)
def test_weights_reproduce_the_decode(name: str, ell: int) -> None:
    """sum_j W[k, j] v_j is the decoded gradient's part k, for any payloads (the decode reads
    nothing else), and the identity probe (schemes that do not report W) finds the same W."""
    s = _scheme(name, ell)
    rng = np.random.default_rng(11)
    d = 7  # not a multiple of ell: the zero padding is part of the identity
    for c in _states(s, rng):
        V = rng.standard_normal((s.m, s.payload_len(d)))
        res = s.decode_result(V, c, d)
        W = res.weights
        assert W is not None and W.shape == (s.n_parts, s.m)
        np.testing.assert_allclose((W @ V).reshape(-1)[:d], res.gradient, rtol=0, atol=1e-12)
        probe = s.decode_result(np.eye(s.m), c, s.n_parts * s.m).gradient
        np.testing.assert_allclose(probe.reshape(s.n_parts, s.m), W, rtol=0, atol=1e-12)
        # rows of workers with a zero column are never read: garbage there changes nothing
        unused = ~np.asarray(used_workers(W))
        V2 = V.copy()
        V2[unused] = 1e300
        np.testing.assert_array_equal(s.decode_result(V2, c, d).gradient, res.gradient)


@pytest.mark.parametrize(("name", "ell"), [x for x in SCHEMES if x[0] != "stream-chunks"])
def test_wasted_work_is_exactly_the_uncovered_work(name: str, ell: int) -> None:
    """Every worker computed its whole load (done = loads). Changing a worker's own copy of a
    chunk gradient changes the decode iff that (worker, chunk) is covered (in some chunk's
    covered_by); the wasted ones (wasted_by) are exactly the others. (stream-chunks, which
    the protocol core does not run, sends only its designated chunks, not its whole prefix.)"""
    s = _scheme(name, ell)
    rng = np.random.default_rng(5)
    d = 4
    for c in _states(s, rng)[:6]:
        G0 = rng.standard_normal((s.n_chunks, d))
        G = [G0[s.orders[j]].copy() for j in range(s.m)]
        base = s.decode(_encode_all(s, c, G, d), c, d)
        W = s.decode_result(_encode_all(s, c, G, d), c, d).weights
        entered = entered_counts(c.tolist(), W, applied=True)
        cover = chunk_cover([o.tolist() for o in s.orders], s.n_chunks, entered,
                            s.loads.tolist())
        covered = {(j, cc.chunk) for cc in cover for j in cc.covered_by}
        wasted = {(j, cc.chunk) for cc in cover for j in cc.wasted_by}
        every = {(j, int(i)) for j in range(s.m) for i in s.orders[j]}
        assert covered | wasted == every and not covered & wasted
        for j in range(s.m):
            for pos, i in enumerate(s.orders[j].tolist()):
                G2 = [g.copy() for g in G]
                G2[j][pos] += 1.0 + rng.random(d)
                moved = not np.allclose(s.decode(_encode_all(s, c, G2, d), c, d), base,
                                        rtol=0, atol=1e-12)
                assert moved == ((j, i) in covered), (name, c.tolist(), j, i)


def _capture(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Record (record, rows, state, dim, decoded gradient, applied gradient) of every decode
    the aggregator runs."""
    seen: list[tuple[Any, ...]] = []
    orig = Aggregator.decode_round

    def spy(self: Aggregator, item: Any) -> Any:
        answer = orig(self, item)
        if item.decode:
            rows = self.rows.array  # the rows this decode filled from the round's vectors
            g = np.asarray(self._decode(rows, item.state, item.dim).gradient)
            seen.append((item.record, rows.copy(), item.state.copy(), item.dim, g,
                         answer.gradient))
        else:
            seen.append((item.record, None, item.state.copy(), item.dim, None, None))
        return answer

    monkeypatch.setattr(Aggregator, "decode_round", spy)
    return seen


@pytest.mark.parametrize("mode", ["exact", "approx"])
def test_simulated_rounds_attribute_their_decode(monkeypatch: pytest.MonkeyPatch,
                                                 mode: str) -> None:
    """The real cores on virtual time: each round's recorded weights reproduce the gradient
    the PS decoded from its payload rows (and applied, when it applied one)."""
    seen = _capture(monkeypatch)
    extra: dict[str, Any] = {"mode": "approx", "deadline_s": 0.6} if mode == "approx" else {}
    cfg = RunConfig(workers=6, delta=3, n_parts=2, rounds=6, delay="exp:0.3", seed=4, **extra)
    names = ["partial", "original"]
    if mode == "exact":
        names.append("uncoded")
    recs = simulate_protocol(cfg, names, gradients="gaussian", dim=9)
    assert len(seen) == sum(len(v) for v in recs.values())
    statuses = set()
    for rec, rows, state, dim, g, applied in seen:
        att = rec.attribution
        assert att is not None
        assert tuple(state.tolist()) == rec.state
        statuses.add(str(rec.status))
        if rows is None:
            assert not att.weights.any()
            continue
        W = att.weights
        np.testing.assert_allclose((W @ rows).reshape(-1)[:dim], g, rtol=0, atol=1e-9)
        if applied is not None:
            np.testing.assert_array_equal(applied, g)
    assert "exact" in statuses
    if mode == "approx":
        assert "approximate" in statuses  # the deadline cut some rounds short


def _record(status: str = RoundStatus.APPROXIMATE) -> RoundRecord:
    from aiogc.core.attribution import Attribution

    # 3 workers, cyclic: worker j holds chunks j, j+1 (orders below); ell = 1
    orders = [[0, 1], [1, 2], [2, 0]]
    W = np.array([[1.0, 0.0, 0.5]])
    return RoundRecord(round=0, scheme="partial", t_start=0.0, t_trigger=1.0, t_end=2.0,
                       status=status, state=(2, 1, 1),
                       reports=[(0.5, 0, 1, 0.5), (0.9, 0, 2, 0.9), (0.6, 1, 1, 0.6),
                                (1.5, 1, 2, 1.5), (0.7, 2, 1, 0.7)],
                       arrivals={0: 1.5, 1: 1.6, 2: 1.7},
                       attribution=Attribution(W, orders, 3))


def test_records_carry_the_attribution(tmp_path: Path) -> None:
    """workers.csv columns and attribution.csv of a hand-made round: worker 1's vector had
    weight 0 (its chunk 1 and its late chunk 2 were wasted), worker 2's count 1 entered."""
    with RunRecorder(tmp_path, {}) as rec:
        rec.round("partial", _record(), m=3, loads=[2, 2, 2])
        rec.round("partial", _record(RoundStatus.FAILED), m=3, loads=[2, 2, 2])
    workers = read_csv(tmp_path / "workers.csv")
    assert tuple(workers[0]) == WORKER_COLUMNS
    got = [(w["used"], w["weight"], w["chunks_done"], w["chunks_entered"], w["chunks_wasted"])
           for w in workers[:3]]
    assert got == [(1, [1.0], 2, 2, 0), (0, [0.0], 2, 0, 2), (1, [0.5], 1, 1, 0)]
    # a failed round applied nothing: everything computed was wasted
    assert [w["chunks_wasted"] for w in workers[3:]] == [2, 2, 1]
    chunks = read_csv(tmp_path / "attribution.csv")
    assert tuple(chunks[0]) == ATTRIBUTION_COLUMNS
    first = [(c["chunk"], c["n_covered"], c["covered_by"], c["computed_by"], c["wasted_by"])
             for c in chunks[:3]]
    assert first == [(0, 1, [0], [0], None), (1, 1, [0], [0, 1], [1]),
                     (2, 1, [2], [1, 2], [1])]
    assert [c["n_covered"] for c in chunks[3:]] == [0, 0, 0]


def test_pandas_reads_the_attribution(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    with RunRecorder(tmp_path, {}) as rec:
        rec.round("partial", _record(), m=3, loads=[2, 2, 2])
    w = pd.read_csv(tmp_path / "workers.csv")
    assert list(w["weight"]) == [1.0, 0.0, 0.5] and list(w["chunks_wasted"]) == [0, 2, 0]
    a = pd.read_csv(tmp_path / "attribution.csv")
    assert list(a["n_covered"]) == [1, 1, 1]
    from aiogc.harness.loaders import load_run_tables

    t = load_run_tables(tmp_path, pandas=True)
    assert list(t.attribution["chunk"]) == [0, 1, 2]


def test_inspect_and_timeline_show_the_attribution(tmp_path: Path) -> None:
    """`aiogc inspect` lists each worker's weight and the wasted work; the timeline draws the
    wasted part of a worker's computation hatched."""
    from aiogc.harness.inspect_run import inspect_round

    with RunRecorder(tmp_path, {}) as rec:
        rec.round("partial", _record(), m=3, loads=[2, 2, 2])
    text = inspect_round(tmp_path, 0)
    assert "attribution (decoded gradient part k = sum_j weight_j[k] * v_j)" in text
    assert "wasted work (2 worker:chunk computations not used): w1:c1 w1:c2" in text
    assert "chunks: 3 of 3 entered the gradient" in text
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from aiogc.harness import plots

    fig = Figure()
    ax = fig.add_subplot()
    plots._draw_round(ax, "partial", _record(), 3, {0: 2, 1: 0, 2: 1})
    hatched = [p for p in ax.collections if p.get_hatch() == "//"]
    assert len(hatched) == 2  # worker 1's two report intervals, nobody else's
