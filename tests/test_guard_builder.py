"""The protocol engine and a live PS build the same guard: both go through
``aiogc.training.ps_aggregator.task_aggregator``, so the oracle, the data bound of every decode
mode, the norm guard and the model bound cannot drift apart.

Compared: the guard's settings, the oracle's and the data bound's values at random models, and
the verdicts on the same decode work items (honest, and a lie no other check sees) in exact and
approximate rounds, float32 and float64, with and without the oracle; and a whole engine run
under ``verify=False`` is guarded by the data bound, not the oracle.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from aiogc.config import RunConfig
from aiogc.core.common import RoundRecord
from aiogc.core.ps_work import DecodeRound
from aiogc.harness.kit import make_ps, materialise_for
from aiogc.sim.fast import build_schemes
from aiogc.sim.protocol import simulate_protocol, simulation_config, task_ps
from tests.helpers import coded_rows


def _signature(agg: Any, rng: np.random.Generator, d: int) -> tuple[Any, ...]:
    g = agg.guard
    n = g.norms
    ws = [rng.standard_normal(d) * s for s in (0.0, 1.0, 50.0)]
    oracle = None if agg.verify_fn is None else [np.asarray(agg.verify_fn(w)) for w in ws]
    bound = None if agg.grad_bound_fn is None else [agg.grad_bound_fn(w) for w in ws]
    return (type(agg), agg.learning_rate, agg.predicted_error, agg.keep_gradients,
            agg.locator, g.bound, g.predicted_error, g.coded_eps,
            (n.window, n.factor, n.min_history, n.warmup_factor, n.initial_scale,
             n.absolute_max, n.floor),
            None if oracle is None else [a.tolist() for a in oracle], bound)


def _items(ps: Any, task: Any, rng: np.random.Generator) -> list[DecodeRound]:
    """Decode items: every worker finished (exact) and a random partial state (approximate),
    each with one vector x1000 and honest, at a random model."""
    sch = ps.scheme
    w = task.initial_model() + rng.standard_normal(task.initial_model().shape)
    dt = ps.config.payload_dtype
    G = np.stack([task.chunk_gradient(i, w.astype(dt)) for i in range(sch.n_chunks)])
    loads = np.asarray(sch.loads, dtype=np.int64)
    partial = np.where(rng.random(sch.m) < 0.5, loads, 0)
    partial[0] = loads[0]
    out = []
    for exact, st in ((True, loads), (False, partial)):
        rows = np.zeros((sch.m, sch.payload_len(w.size)), dtype=dt)
        for j in np.flatnonzero(st > 0):
            rows[j] = sch.encode(int(j), st, G[[int(c) for c in sch.orders[j]]])
        for lie in (1000.0, 1.0):  # the lie first: no norm history yet
            r = rows.copy()
            r[0] *= lie
            out.append(DecodeRound(RoundRecord(round=0, scheme=sch.name, t_start=0.0),
                                   exact=exact, reason="decodable" if exact else "deadline",
                                   decode=True, state=st.copy(), attempt=0, model=w,
                                   coded=coded_rows(r), dim=w.size))
    return out


def _fresh(item: DecodeRound) -> DecodeRound:
    return item._replace(record=RoundRecord(round=0, scheme=item.record.scheme, t_start=0.0))


@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(("scheme", "n_parts", "mode"), [("partial", 2, "exact"),
                                                         ("partial", 2, "approx"),
                                                         ("original", 1, "approx")])
def test_engine_and_live_build_equivalent_guards(scheme: str, n_parts: int, mode: str,
                                                 dtype: str, verify: bool) -> None:
    cfg = RunConfig(scheme=scheme, workers=8, delta=3, n_parts=n_parts, seed=4, rounds=3,
                    task="linreg:samples=240,dim=12", mode=mode, dtype=dtype,
                    deadline_s=1.0 if mode == "approx" else None)
    schedule = materialise_for(cfg, [cfg.scheme])
    live, task = make_ps(cfg, schedule=schedule, verify=verify)
    # the engine's own path: its configuration and its scheme builder
    ecfg = simulation_config(cfg.for_scheme(scheme))
    engine, _ = task_ps(ecfg, build_schemes(cfg, [scheme])[scheme], schedule, verify=verify)
    la: Any = live.aggregator
    ea: Any = engine.aggregator
    assert (la.grad_bound_fn is None) == verify  # the data bound exactly when no oracle
    d = task.initial_model().size
    rngs = np.random.default_rng(0), np.random.default_rng(0)
    assert _signature(la, rngs[0], d) == _signature(ea, rngs[1], d)
    rng = np.random.default_rng(1)
    for item in _items(live, task, rng):
        a, b = la.run(_fresh(item)), ea.run(_fresh(item))
        assert a.counters == b.counters
        assert (a.gradient is None) == (b.gradient is None)
        if a.gradient is not None:
            assert np.array_equal(a.gradient, b.gradient)
    assert la.guard.rejected == ea.guard.rejected
    if not verify and scheme == "partial":  # no redundancy: the data bound caught the lie
        assert sum(la.guard.rejected.get(k, 0) for k in ("data_bound", "approx_bound")) >= 1


def test_an_engine_run_without_the_oracle_is_guarded_by_the_data_bound() -> None:
    cfg = RunConfig(scheme="partial", workers=6, delta=3, n_parts=2, rounds=6, seed=0,
                    task="linreg:samples=240,dim=12", delay="exp:0.05", mode="approx",
                    deadline_s=0.1)
    recs = simulate_protocol(cfg, ["partial", "original"], verify=False)
    verified = simulate_protocol(cfg, ["partial", "original"])
    for name, rs in recs.items():
        assert len(rs) == 6, name
        # honest: nothing rejected, the same rounds applied as with the oracle
        assert [r.status for r in rs] == [r.status for r in verified[name]], name
        assert all(r.end_reason != "rejected" for r in rs), name
        applied = [r for r in rs if r.status != "failed"]
        assert applied, name
        assert all(np.isnan(r.rel_error) for r in applied), name  # no oracle
        assert all(r.end_detail.startswith("unverified") and "data" in r.end_detail
                   for r in applied), name
