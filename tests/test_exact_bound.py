"""Exact rounds without the oracle: under ``--no-verify`` an exact decode is bounded
by the data too (``data_bound``, aiogc/training/approx_bound.py): an honest exact decode is the
true gradient, ``||g|| <= sum_i ||g_i|| <= B(w)``, up to its rounding.

* no honest exact decode is ever rejected: random models (scales 0..100), random decodable
  states, float32 and float64 payloads, partial ell 1..2 and the original scheme, and whole
  honest runs on the virtual clock;
* a lie in an exact round that no other check sees (round 0: no norm history; the partial
  scheme has no redundancy, the original scheme no spare) is rejected, and the round that
  passes stays ``unverified``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from aiogc.config import RunConfig
from aiogc.core.common import UNVERIFIED, RoundRecord
from aiogc.core.ps_work import DecodeRound
from aiogc.harness.kit import make_ps, materialise_for
from tests.helpers import build_rig, coded_rows

CASES = [("partial", 1), ("partial", 2), ("original", 1)]


def _ps(scheme: str, n_parts: int, dtype: str = "float64", task: str = "linreg:samples=240,dim=12",
        seed: int = 0) -> tuple[Any, Any]:
    cfg = RunConfig(scheme=scheme, workers=8, delta=3, n_parts=n_parts, seed=seed, task=task,
                    dtype=dtype)
    ps, t = make_ps(cfg, verify=False, schedule=materialise_for(cfg, [cfg.scheme]))
    agg: Any = ps.aggregator
    assert agg.grad_bound_fn is not None and agg.verify_fn is None
    return ps, t


def _honest_rows(sch: Any, task: Any, w: np.ndarray, st: np.ndarray, dtype: str) -> np.ndarray:
    """What honest workers send at ``st``: chunk gradients at the model they were sent
    (``w`` rounded to the payload dtype), encoded in float64, rounded to the payload dtype."""
    w_sent = w.astype(dtype)
    G = np.stack([task.chunk_gradient(i, w_sent) for i in range(sch.n_chunks)])
    rows = np.zeros((sch.m, sch.payload_len(w.size)), dtype=dtype)
    for j in np.flatnonzero(st > 0):
        if sch.sends_when_done and st[j] < sch.loads[j]:
            continue
        rows[j] = sch.encode(int(j), st, G[[int(c) for c in sch.orders[j]]])
    return rows


def _decode(agg: Any, rows: np.ndarray, st: np.ndarray, w: np.ndarray, rnd: int = 0) -> Any:
    item = DecodeRound(RoundRecord(round=rnd, scheme=agg.scheme.name, t_start=0.0), exact=True,
                       reason="decodable", decode=True, state=st, attempt=0, model=w,
                       coded=coded_rows(rows), dim=w.size)
    return agg.run(item), item.record


def _exact_states(sch: Any, rng: np.random.Generator, n: int) -> list[np.ndarray]:
    loads = np.asarray(sch.loads, dtype=np.int64)
    out: list[np.ndarray] = []
    while len(out) < n:
        if sch.sends_when_done:  # finished or nothing
            st = np.where(rng.random(sch.m) < rng.uniform(0.5, 1.0), loads, 0)
        else:
            st = rng.integers(0, loads + 1)
        if sch.is_decodable(st):
            out.append(st.astype(np.int64))
    return out


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(("scheme", "n_parts"), CASES)
@pytest.mark.parametrize("task", ["linreg:samples=240,dim=12", "logreg:builtin"])
def test_no_honest_exact_decode_is_rejected(scheme: str, n_parts: int, dtype: str,
                                            task: str) -> None:
    ps, t = _ps(scheme, n_parts, dtype, task)
    agg, sch = ps.aggregator, ps.scheme
    rng = np.random.default_rng(7)
    w0 = t.initial_model()
    checked = 0
    for scale in (0.0, 0.01, 1.0, 10.0, 100.0):
        for st in _exact_states(sch, rng, 6):
            w = w0 + scale * rng.standard_normal(w0.shape)
            agg.guard.norms._accepted.clear()  # no history: only the data bound can refuse
            out, rec = _decode(agg, _honest_rows(sch, t, w, st, dtype), st, w)
            assert rec.status == "exact", rec.end_detail
            assert "rejected_data_bound" not in out.counters, (scale, st, rec.end_detail)
            assert out.gradient is not None, rec.end_detail
            checked += 1
    assert checked == 30


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(("scheme", "n_parts"), CASES)
def test_honest_exact_runs_are_never_rejected_by_the_data_bound(scheme: str, n_parts: int,
                                                               dtype: str) -> None:
    for seed in range(3):
        cfg = RunConfig(scheme=scheme, workers=6, delta=3, n_parts=n_parts, rounds=10,
                        seed=seed, task="linreg:samples=240,dim=12", delay="exp:0.05",
                        dtype=dtype, heartbeat_s=None, dead_after_s=None)
        rig = build_rig(cfg)
        from aiogc.training.approx_bound import gradient_bound_fn

        rig.aggregator.grad_bound_fn = gradient_bound_fn(rig.task)  # as --no-verify
        rig.aggregator.verify_fn = None
        rig.sim.run()
        stats = dict(rig.ps.stats)
        assert stats.get("rejected_data_bound", 0) == 0, (seed, stats)
        assert all(r.status == "exact" for r in rig.ps.records)


@pytest.mark.parametrize(("scheme", "n_parts"), CASES)
def test_an_exact_lie_no_other_check_sees_is_bounded(scheme: str, n_parts: int) -> None:
    """Round 0, one worker's vector x1000: the norm guard has no history (it would apply it),
    there is no spare to cross-check; the data bound rejects it. The honest round passes and
    says it was unverified, naming the data bound."""
    ps, task = _ps(scheme, n_parts)
    agg, sch = ps.aggregator, ps.scheme
    w = task.initial_model()
    loads = np.asarray(sch.loads, dtype=np.int64)
    st = loads.copy()
    if sch.sends_when_done:
        # just decodable: drop workers while the rest still decodes (no spare left)
        for j in range(sch.m):
            trial = st.copy()
            trial[j] = 0
            if sch.is_decodable(trial):
                st = trial
    rows = _honest_rows(sch, task, w, st, "float64")
    honest, rec = _decode(agg, rows.copy(), st, w)
    assert honest.gradient is not None
    assert rec.end_detail.startswith(UNVERIFIED) and "data" in rec.end_detail
    liar = int(np.flatnonzero(st > 0)[0])
    rows[liar] *= 1000.0
    agg.guard.norms._accepted.clear()
    out, rec = _decode(agg, rows, st, w)
    assert out.gradient is None and "rejected_data_bound" in out.counters, rec.end_detail
    assert rec.end_reason == "rejected" and "data_bound" in rec.end_detail


def test_no_data_bound_with_the_oracle_or_for_a_task_without_one() -> None:
    cfg = RunConfig(scheme="partial", workers=8, delta=3, n_parts=2, seed=0,
                    task="linreg:samples=240,dim=12")
    ps, _ = make_ps(cfg, verify=True, schedule=materialise_for(cfg, [cfg.scheme]))
    agg: Any = ps.aggregator
    assert agg.grad_bound_fn is None  # the oracle is the stronger check


def _tight_task(n_chunks: int, d: int = 12) -> Any:
    """Least squares on which ``B`` is attained: every row ``x``, every label -1, so at ``w =
    c x`` (c > 0) every chunk gradient is ``n_i x (c ||x||^2 + 1) / n``, all aligned, each equal
    to its bound."""
    from aiogc.training.tasks import LinearRegression

    x = np.linspace(0.5, 1.5, d)
    n = 10 * n_chunks
    return LinearRegression(np.tile(x, (n, 1)), -np.ones(n), n_chunks, 0, "tight"), x


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(("scheme", "n_parts"), CASES)
def test_where_the_bound_is_attained_honest_passes_and_one_percent_more_does_not(
        scheme: str, n_parts: int, dtype: str) -> None:
    from aiogc.training.approx_bound import gradient_bound_fn

    ps, _ = _ps(scheme, n_parts, dtype)
    agg, sch = ps.aggregator, ps.scheme
    task, x = _tight_task(sch.n_chunks)
    agg.grad_bound_fn = gradient_bound_fn(task)
    st = np.asarray(sch.loads, dtype=np.int64)
    for c in (0.1, 1.0, 30.0):
        w = c * x
        G = np.stack([task.chunk_gradient(i, w) for i in range(sch.n_chunks)])
        assert float(np.linalg.norm(G.sum(axis=0))) >= 0.999999 * agg.grad_bound_fn(w)
        rows = _honest_rows(sch, task, w, st, dtype)
        agg.guard.norms._accepted.clear()
        out, rec = _decode(agg, rows, st, w)
        assert out.gradient is not None, rec.end_detail
        agg.guard.norms._accepted.clear()
        out, rec = _decode(agg, rows * 1.01, st, w)  # every vector 1 % longer
        assert "rejected_data_bound" in out.counters, rec.end_detail


@pytest.mark.parametrize("coded", ["float16", "bfloat16"])
@pytest.mark.parametrize(("scheme", "n_parts"), CASES)
def test_compressed_uploads_where_the_bound_is_attained(scheme: str, n_parts: int,
                                                        coded: str) -> None:
    """16-bit coded uploads round far more than float32: the round's own rounding
    bound is added, so an honest round at an attained bound still passes."""
    from aiogc.coding.compress import to_coded
    from aiogc.training.approx_bound import gradient_bound_fn

    cfg = RunConfig(scheme=scheme, workers=8, delta=3, n_parts=n_parts, seed=0,
                    task="linreg:samples=240,dim=12", dtype="float32", coded_dtype=coded)
    ps, _ = make_ps(cfg, verify=False, schedule=materialise_for(cfg, [cfg.scheme]))
    agg: Any = ps.aggregator
    sch = ps.scheme
    task, x = _tight_task(sch.n_chunks)
    agg.grad_bound_fn = gradient_bound_fn(task)
    st = np.asarray(sch.loads, dtype=np.int64)
    for c in (0.1, 1.0, 30.0):
        w = c * x
        rows = _honest_rows(sch, task, w, st, "float32")
        wire = np.stack([to_coded(r, coded) for r in rows])
        agg.guard.norms._accepted.clear()
        out, rec = _decode(agg, wire, st, w)
        assert "rejected_data_bound" not in out.counters, rec.end_detail
        assert out.gradient is not None, rec.end_detail
