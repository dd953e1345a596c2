"""Without the oracle: approximate rounds under ``--no-verify`` are bounded
from round 0 by what the finished chunks can justify (aiogc/training/approx_bound.py).

* the data bound ``B(w)`` is an upper bound on ``sum_i ||g_i(w)||`` (least squares, logistic);
* the decode gain ``Γ(state)``: every honest decode at ``state`` has norm ``<= Γ ||sum|g_i| ||``
  (partial ell = 1, 2 and the original scheme, random states and gradients);
* honest approximate runs are never rejected by it; a lie in round 0 (no norm history) is.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from aiogc.config import RunConfig
from aiogc.core.common import RoundRecord
from aiogc.core.ps_work import DecodeRound
from aiogc.harness.kit import make_ps, materialise_for
from aiogc.training.approx_bound import decode_gain, gradient_bound_fn
from aiogc.training.tasks import make_task
from tests.helpers import build_rig, coded_rows


@pytest.mark.parametrize("spec", ["linreg:samples=240,dim=12",
                                  "logreg:builtin"])
def test_the_data_bound_holds(spec: str) -> None:
    task = make_task(spec, 8, 0)
    bound = gradient_bound_fn(task)
    assert bound is not None
    rng = np.random.default_rng(1)
    for scale in (0.0, 0.1, 1.0, 10.0):
        w = scale * rng.standard_normal(task.initial_model().shape)
        total = sum(float(np.linalg.norm(task.chunk_gradient(i, w))) for i in range(8))
        assert total <= bound(w) * (1 + 1e-9)


def _states(scheme: Any, rng: np.random.Generator, n: int) -> list[np.ndarray]:
    loads = np.asarray(scheme.loads)
    return [rng.integers(0, loads + 1) for _ in range(n)]


@pytest.mark.parametrize(("scheme", "n_parts"), [("partial", 1), ("partial", 2),
                                                 ("original", 1)])
def test_no_honest_decode_exceeds_the_gain(scheme: str, n_parts: int) -> None:
    cfg = RunConfig(scheme=scheme, workers=8, delta=3, n_parts=n_parts, seed=2,
                    task="linreg:samples=240,dim=12", mode="approx", deadline_s=1.0)
    ps, _task = make_ps(cfg, verify=False, schedule=materialise_for(cfg, [cfg.scheme]))
    agg: Any = ps.aggregator
    sch = ps.scheme
    rng = np.random.default_rng(3)
    d = 11  # not a multiple of ell: the padded last part too
    for st in _states(sch, rng, 25):
        gain = decode_gain(agg.honest_estimate, st, sch.n_chunks, sch.n_parts)
        for _ in range(4):
            G = rng.standard_normal((sch.n_chunks, d)) * rng.exponential(1.0, (sch.n_chunks, 1))
            dec = agg.honest_estimate(st, G, d)
            scale = float(np.linalg.norm(np.abs(G).sum(axis=0)))
            assert float(np.linalg.norm(dec)) <= gain * scale * (1 + 1e-9) + 1e-12, (st, gain)


@pytest.mark.parametrize("scheme", ["partial", "original"])
def test_honest_approximate_runs_are_never_rejected_by_the_bound(scheme: str) -> None:
    for seed in range(3):
        cfg = RunConfig(scheme=scheme, workers=6, delta=3, n_parts=2 if scheme == "partial"
                        else 1, rounds=8, seed=seed, task="linreg:samples=240,dim=12",
                        delay="exp:0.05", mode="approx", deadline_s=0.1,
                        heartbeat_s=None, dead_after_s=None)
        rig = build_rig(cfg)
        rig.aggregator.grad_bound_fn = gradient_bound_fn(rig.task)  # as --no-verify
        rig.aggregator.verify_fn = None
        rig.sim.run()
        stats = dict(rig.ps.stats)
        assert stats.get("rejected_approx_bound", 0) == 0, (seed, stats)
        assert any(r.status == "approximate" for r in rig.ps.records)


def test_a_lie_in_round_zero_is_rejected_without_a_norm_history() -> None:
    """One finished worker's vector, times 50, at round 0: the norm guard has nothing to
    compare with yet (it would apply it); the data bound rejects it."""
    cfg = RunConfig(scheme="partial", workers=6, delta=3, n_parts=2, seed=0,
                    task="linreg:samples=240,dim=12", mode="approx", deadline_s=1.0)
    ps, task = make_ps(cfg, verify=False, schedule=materialise_for(cfg, [cfg.scheme]))
    agg: Any = ps.aggregator
    assert agg.grad_bound_fn is not None and agg.verify_fn is None
    sch = ps.scheme
    w = task.initial_model()
    G = np.stack([task.chunk_gradient(i, w) for i in range(sch.n_chunks)])
    st = np.zeros(sch.m, dtype=np.int64)
    st[[0, 1, 2]] = [3, 2, 1]
    rows = np.zeros((sch.m, sch.payload_len(w.size)))
    for j in (0, 1, 2):
        rows[j] = sch.encode(j, st, G[[int(c) for c in sch.orders[j]]])

    def decode(rows: np.ndarray) -> Any:
        item = DecodeRound(RoundRecord(round=0, scheme="partial", t_start=0.0), exact=False,
                           reason="deadline", decode=True, state=st, attempt=0, model=w,
                           coded=coded_rows(rows), dim=w.size)
        return agg.run(item)

    honest = decode(rows.copy())
    assert honest.gradient is not None  # applied
    lie = rows.copy()
    lie[1] *= 50.0
    out = decode(lie)
    assert out.gradient is None and "rejected_approx_bound" in out.counters
