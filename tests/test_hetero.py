"""Heterogeneous clusters: worker speeds, chunk sizes, the speed-aware
assignment and order, through the config, the task, the fast path and the protocol engine."""

from __future__ import annotations

import numpy as np
import pytest

from aiogc.coding.assignments import cyclic_assignment
from aiogc.coding.hetero import (
    canonical_factors,
    cover_time,
    hetero_order,
    loads_work,
    parse_factor_list,
    parse_factors,
    speed_aware_assignment,
    speed_aware_order,
)
from aiogc.coding.orderings import optimal_order, validate_orders
from aiogc.config import RunConfig
from aiogc.errors import ConfigError
from aiogc.sim.fast import build_schemes, schedule_for, simulate_fast
from aiogc.sim.protocol import record_arrays, simulate_protocol
from aiogc.training.cluster import cluster_schedule
from aiogc.training.tasks import make_task

SPEEDS = "1x5,3,0.5,0.25"


def test_factor_specs_parse_and_round_trip() -> None:
    v = parse_factor_list("1x3, 0.5\n2", field="x")
    assert v.tolist() == [1.0, 1.0, 1.0, 0.5, 2.0]
    assert canonical_factors(v) == "1.0x3,0.5,2.0"
    assert parse_factor_list(canonical_factors(v), field="x").tolist() == v.tolist()
    assert parse_factors("uniform", 4, field="worker_speeds") is None
    for bad in ("1,2", "1,0,1,1", "1,-1,1,1", "a,1,1,1", "1x0,1x4", "file:x.txt", ""):
        with pytest.raises(ConfigError):
            parse_factors(bad, 4, field="worker_speeds")


@pytest.mark.parametrize("seed", range(12))
def test_speed_aware_assignment_keeps_every_chunks_replication(seed: int) -> None:
    rng = np.random.default_rng(seed)
    m = int(rng.integers(2, 24))
    delta = int(rng.integers(1, m + 1))
    speeds = rng.choice([0.25, 0.5, 1.0, 2.0, 4.0], size=m)
    sizes = rng.choice([0.5, 1.0, 3.0], size=m) if seed % 2 else None
    A = speed_aware_assignment(m, delta, speeds, sizes)
    assert A.shape == (m, m) and A.dtype == bool
    assert (A.sum(axis=1) == delta).all()  # each chunk on exactly delta distinct workers
    assert (A.sum(axis=0) >= 1).all()
    if sizes is None and delta < m:  # faster workers never get fewer chunks
        loads = A.sum(axis=0)
        order = np.argsort(speeds, kind="stable")
        assert (np.diff(loads[order]) >= -1).all()
    work = loads_work(A, sizes)
    np.testing.assert_allclose(work.sum(), delta * m)


def test_uniform_cluster_is_the_papers_scheme() -> None:
    np.testing.assert_array_equal(speed_aware_assignment(8, 3, None), cyclic_assignment(8, 3))
    np.testing.assert_array_equal(speed_aware_assignment(8, 3, np.full(8, 2.0)),
                                  cyclic_assignment(8, 3))
    A = cyclic_assignment(8, 3)
    rng = np.random.default_rng(0)
    for a, b in zip(hetero_order(A, 1, rng, None), optimal_order(A, 1, np.random.default_rng(0)),
                    strict=True):
        np.testing.assert_array_equal(a, b)
    base = RunConfig(workers=8)
    assert "worker_speeds" not in base.to_wire() and "chunk_sizes" not in base.to_wire()
    assert RunConfig.from_wire(base.to_wire()) == base


def test_speed_aware_order_is_an_order_and_not_worse_on_its_metric() -> None:
    s = parse_factors(SPEEDS, 8, field="worker_speeds")
    assert s is not None
    for A in (speed_aware_assignment(8, 3, s), cyclic_assignment(8, 3)):
        for ell in (1, 2):
            o = speed_aware_order(A, ell, s)
            validate_orders(A, o)
            h = hetero_order(A, ell, np.random.default_rng(0), s)
            assert cover_time(A, h, ell, s) <= cover_time(A, optimal_order(A, ell), ell, s)


def _cfg(**kw: object) -> RunConfig:
    base = dict(workers=8, delta=3, assignment="speed-aware", worker_speeds=SPEEDS,
                chunk_sizes="1x4,2,0.5,3,1", rounds=4, seed=3, delay="exp:1.0",
                task="linreg:samples=400,dim=6", heartbeat_s=None, dead_after_s=None)
    base.update(kw)
    return RunConfig(**base)  # type: ignore[arg-type]


def test_config_carries_the_cluster_in_welcome() -> None:
    cfg = _cfg()
    wire = cfg.to_wire()
    assert wire["worker_speeds"] == SPEEDS
    back = RunConfig.from_wire(wire)
    assert back == cfg
    sch = cfg.build_scheme()
    assert (sch.A.sum(axis=1) == 3).all()
    with pytest.raises(ConfigError):
        _cfg(ordering="adaptive")  # per-position chunk sizes need static orders
    with pytest.raises(ConfigError):
        _cfg(scheme="original")  # original GC keeps the equal-load assignments
    _cfg(ordering="adaptive", chunk_sizes="uniform")  # speeds alone are fine


def test_non_uniform_chunks_still_sum_to_the_full_gradient() -> None:
    sizes = np.array([1, 1, 1, 1, 2, 0.5, 3, 1.0])
    t = make_task("linreg:samples=400,dim=6", 8, 0, chunk_sizes=sizes)
    n = np.diff(t.bounds)  # type: ignore[attr-defined]
    assert n.sum() == 400 and (n >= 1).all() and n[6] > 2.5 * n[0]
    w = np.linspace(-1, 1, 6)
    total = sum(t.chunk_gradient(i, w) for i in range(8))
    np.testing.assert_allclose(total, t.full_gradient(w), rtol=1e-12, atol=1e-14)
    with pytest.raises(ConfigError):
        make_task("linreg", 8, 0, chunk_sizes=np.ones(7))


def test_cluster_schedule_scales_by_size_over_speed() -> None:
    cfg = _cfg()
    built = build_schemes(cfg, ["partial"])
    sch = built["partial"]
    base = schedule_for(cfg, built)
    got = cluster_schedule(base, cfg, sch).compute_s
    s, z = cfg.speeds, cfg.sizes
    assert s is not None and z is not None
    z = z * (8 / z.sum())
    for j, o in enumerate(sch.orders):
        for k, i in enumerate(o):
            np.testing.assert_allclose(got[:, j, k], base.compute_s[:, j, k] * z[i] / s[j])
    assert cluster_schedule(base, RunConfig(workers=8), sch) is base


def test_decode_is_exact_with_non_uniform_chunks_on_the_protocol_engine() -> None:
    cfg = _cfg(rounds=6)
    recs = simulate_protocol(cfg, ["partial"], gradients="task")["partial"]
    assert [r.status for r in recs] == ["exact"] * 6
    assert max(r.rel_error_plain for r in recs) < 1e-10


@pytest.mark.parametrize("kw", [{}, {"assignment": "cyclic"}, {"n_parts": 2},
                                {"chunk_sizes": "uniform", "ordering": "natural"},
                                {"mode": "approx", "deadline_s": 2.0}])
def test_fast_path_equals_protocol_engine_on_a_heterogeneous_cluster(kw: dict[str, object]) -> None:
    cfg = _cfg(**kw)
    names = ["partial", "uncoded"]
    built = build_schemes(cfg, names)
    sched = schedule_for(cfg, built)
    fast = simulate_fast(cfg, names, schedule=sched, built=built, dim=12)
    proto = simulate_protocol(cfg, names, schedule=sched, built=built, gradients="gaussian",
                              dim=12)
    for name in names:
        f, a = fast[name], record_arrays(proto[name], mode=cfg.mode)
        np.testing.assert_allclose(a["completion_s"], f.completion_s, rtol=0, atol=1e-9)
        assert list(a["status"]) == list(f.status)
        states = np.array([rec.state for rec in proto[name]])
        np.testing.assert_array_equal(states, f.states)


def test_live_points_alternate_and_take_every_runs_verdict() -> None:
    from aiogc.experiments.heterogeneous import LIVE_VARIANTS, block_order, point_fidelity

    # the order flips block by block, so a drifting load weighs on every variant alike
    assert block_order(LIVE_VARIANTS, 0) == LIVE_VARIANTS
    assert block_order(LIVE_VARIANTS, 1) == LIVE_VARIANTS[::-1]
    assert block_order(LIVE_VARIANTS, 2) == LIVE_VARIANTS
    ok = {"verdict": "faithful", "worst_ratio": 1.03, "time_scale": 3.0, "reasons": []}
    bad = {"verdict": "unfaithful", "worst_ratio": 1.4, "time_scale": 3.0,
           "reasons": ["partial rounds took 1.40x their simulated time"]}
    p = point_fidelity([ok, ok])
    assert p["fidelity"] == "faithful" and p["runs_faithful"] == "2/2"
    assert p["worst_ratio"] == 1.03 and p["time_scale"] == 3.0 and p["reasons"] == ""
    p = point_fidelity([ok, bad, ok])
    assert p["fidelity"] == "unfaithful" and p["runs_faithful"] == "2/3"
    assert p["worst_ratio"] == 1.4 and "1.40x" in p["reasons"]
    assert point_fidelity([])["fidelity"] == "unfaithful"  # no run: nothing to vouch for


def test_an_unfaithful_live_point_is_not_presented_as_a_result() -> None:
    from aiogc.experiments.heterogeneous import summarise

    row = {"kind": "live", "m": 16, "delta": 3, "ell": 1, "cluster": "spread",
           "layout": "random", "fidelity": "unfaithful", "runs_faithful": "5/6",
           "worst_ratio": 1.3, "time_scale": 2.0, "reasons": "r", "cyclic_aware_live": "ran"}
    for d in ("diff", "layout_diff", "relabel_diff"):
        row.update({f"{d}_ms": -1.0, f"{d}_lo": -2.0, f"{d}_hi": 0.0, f"{d}_pct": -3.0})
    for v in ("cyclic_static", "cyclic_aware", "cyclic_relabelled", "speed_aware"):
        row.update({f"{v}_ms": 30.0, f"{v}_lo": 29.0, f"{v}_hi": 31.0})
    cell = summarise([row])["live|m=16|delta=3|ell=1|spread|random"]
    assert "speed_aware" not in cell and "diff_ms" not in cell
    assert cell["fidelity"] == "unfaithful" and "speed_aware" in cell["unfaithful_not_a_result"]
    row["fidelity"] = "faithful"
    assert summarise([row])["live|m=16|delta=3|ell=1|spread|random"]["speed_aware"] == \
        "30 [29, 31]"


@pytest.mark.parametrize("m, delta", [(16, 3), (24, 4), (10, 3), (7, 7)])
def test_speed_sorted_interleave_gives_every_cyclic_window_a_fast_holder(m: int,
                                                                         delta: int) -> None:
    from aiogc.experiments.heterogeneous import LAYOUTS, clusters, layout

    rng = np.random.default_rng(m)
    speeds = rng.permutation(np.concatenate([np.ones(m - m // 4), np.full(m // 4, 0.25)]))
    for s in (speeds, clusters(m)["spread"][0]):
        laid = layout(s, "interleaved", delta, 0)
        assert sorted(laid) == sorted(s)  # a relabelling: the same cluster
        ranked = np.sort(s)[::-1]
        fastest_band = ranked[len(range(0, m, delta)) - 1]  # the slowest of band 0
        # every window of delta consecutive ids that does not wrap holds a band-0 worker
        for start in range(m - delta + 1):
            assert laid[start:start + delta].max() >= fastest_band
    q = clusters(m)["quarter-slow"][0]
    assert list(layout(q, "contiguous", delta, 0)) == list(q)  # the slow ones one block
    a, b = layout(q, "random", delta, 5, 0), layout(q, "random", delta, 5, 1)
    assert sorted(a) == sorted(q) and np.array_equal(a, layout(q, "random", delta, 5, 0))
    assert m < 8 or not np.array_equal(a, b)  # placements differ, each seeded
    with pytest.raises(ValueError, match="layout"):
        layout(q, "sorted", delta, 0)
    assert "random" in LAYOUTS


def test_the_headline_compares_against_the_relabelled_cyclic_assignment() -> None:
    from aiogc.experiments.heterogeneous import DIFFS, _layout_cell, clusters

    assert DIFFS["diff"] == ("speed-aware", "cyclic-relabelled")
    speeds, sizes = clusters(16)["quarter-slow"]
    t, _, per = _layout_cell((16, 3, 1), speeds, sizes, "contiguous", 3, 2, 30, 1)
    # contiguous: the worst layout for cyclic; relabelling recovers most of it
    assert t["cyclic-relabelled"].mean() < 0.7 * t["cyclic-static"].mean()
    assert len(per) == 1
    ti, _, _ = _layout_cell((16, 3, 1), speeds, sizes, "interleaved", 3, 2, 30, 1)
    np.testing.assert_array_equal(ti["cyclic-static"], ti["cyclic-relabelled"])
    tr, _, per = _layout_cell((16, 3, 1), speeds, sizes, "random", 3, 2, 30, 1)
    assert tr["speed-aware"].shape == (6, 30) and len(per) == 3


def test_training_replay_cuts_the_data_by_the_clusters_chunk_sizes() -> None:
    # experiments/live.py rebuilds each round's model from the records and checks every loss
    # against the one the PS logged: with --chunk-sizes the replay must cut the data the same
    # way as the workers did (it raised on the first round before the sizes were threaded)
    from aiogc.experiments.live import _replay

    # approximate rounds: an exact decode is the full gradient however the data is cut
    cfg = _cfg(rounds=6, task="logreg:breast-cancer", mode="approx", deadline_s=1.0)
    recs = simulate_protocol(cfg, ["partial"], gradients="task")["partial"]
    assert all(np.isfinite(r.loss) for r in recs)
    assert any(r.status == "approximate" for r in recs)
    path = _replay(cfg, recs)
    assert len(path) == 7 and path[-1][0] < path[0][0]


def test_stream_chunks_runs_on_the_speed_aware_assignment() -> None:
    # streaming needs every chunk on some holder, nothing of the cyclic structure: the same
    # assignment and (ell = 1) order as partial, and with free communication the same
    # completion as partial's ell = 1 trigger, round by round, on the same cluster
    cfg = _cfg(n_parts=1, rounds=40)
    names = ["partial", "stream-chunks"]
    built = build_schemes(cfg, names)
    p, s = built["partial"], built["stream-chunks"]
    np.testing.assert_array_equal(s.A, p.A)
    assert (s.A.sum(axis=1) == 3).all() and len(set(s.loads.tolist())) > 1
    for a, b in zip(s.orders, p.orders, strict=True):
        np.testing.assert_array_equal(a, b)
    fast = simulate_fast(cfg, names, schedule=schedule_for(cfg, built), built=built)
    np.testing.assert_allclose(fast["stream-chunks"].completion_s, fast["partial"].trigger_s,
                               rtol=0, atol=1e-12)
    assert set(fast["stream-chunks"].status) == {"exact"}


def test_original_refuses_the_speed_aware_assignment_and_says_why() -> None:
    with pytest.raises(ConfigError) as err:
        _cfg(scheme="original").build_scheme()
    msg = str(err.value)
    assert "speed-aware" in msg and "equal loads" in msg and "cyclic" in msg
    assert "stream-chunks" in msg  # what to use instead
    with pytest.raises(ConfigError) as err:
        _cfg(scheme="original", assignment="nope").build_scheme()
    assert "equal loads" not in str(err.value)  # the reason is the speed-aware one only


def test_only_an_unfaithful_live_point_is_labelled_so() -> None:
    from aiogc.experiments.heterogeneous import _label

    base = {"m": 16, "delta": 3, "ell": 1, "cluster": "spread"}
    # simulated rows read back from the CSV have an empty fidelity column: not a verdict
    assert "UNFAITHFUL" not in _label({**base, "kind": "simulated", "fidelity": None})
    assert "UNFAITHFUL" not in _label({**base, "kind": "live", "fidelity": "faithful"})
    assert "UNFAITHFUL" in _label({**base, "kind": "live", "fidelity": "unfaithful"})
