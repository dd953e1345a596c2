"""Adaptive, speed-aware ordering: the estimator, the exact plug-in order, the
round_start extension, and the protocol engine against the fast path (virtual clock only)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from aiogc.coding import cyclic_assignment, optimal_order
from aiogc.coding.adaptive import (
    AdaptiveOrdering,
    SpeedEstimator,
    flatten_orders,
    plugin_trigger_time,
    round_samples,
    speed_orders,
    unflatten_orders,
)
from aiogc.config import RunConfig
from aiogc.errors import CodingError
from aiogc.protocol.messages import RoundStart
from aiogc.protocol.wire import decode_frame_bytes, encode_frame_bytes
from aiogc.sim.adaptive import adaptive_times
from aiogc.sim.fast import build_schemes, exact_times, schedule_for
from aiogc.sim.protocol import record_arrays, simulate_protocol


def _brute(A: np.ndarray, tau: np.ndarray, ell: int) -> float:
    per = [list(itertools.permutations(np.flatnonzero(A[:, j]).tolist()))
           for j in range(A.shape[1])]
    return min(plugin_trigger_time(A, [np.array(o) for o in combo], tau, ell)
               for combo in itertools.product(*per))


@pytest.mark.parametrize("ell", [1, 2])
def test_speed_orders_are_exact_on_small_cases(ell: int) -> None:
    A = cyclic_assignment(4, 3)
    base = optimal_order(A)
    rng = np.random.default_rng(5)
    for _ in range(5):
        tau = rng.choice([1.0, 1.0, 3.0, 5.0], size=4)
        got, t = speed_orders(A, base, tau, ell)
        assert t == pytest.approx(_brute(A, tau, ell))
        assert t == pytest.approx(plugin_trigger_time(A, got, tau, ell))
        assert t <= plugin_trigger_time(A, base, tau, ell) + 1e-12


def test_speed_orders_beat_static_with_two_adjacent_stragglers() -> None:
    A = cyclic_assignment(8, 3)
    base = optimal_order(A)
    tau = np.ones(8)
    tau[[3, 4]] = 5.0
    assert plugin_trigger_time(A, base, tau) == 3.0
    assert speed_orders(A, base, tau)[1] == 2.0


def test_estimator_is_censored_and_robust_to_one_outlier_round() -> None:
    # worker 0: 3 chunks at 1 s each; worker 1: nothing by the trigger at 2.5 s (>= 2.5 s/chunk)
    s = round_samples(2, [3, 3], [(1.0, 0, 1, 1.0), (2.0, 0, 2, 2.0)], 0.0, 2.5, [0, 1])
    assert s[0] == pytest.approx(1.0) and s[1] == pytest.approx(2.5)
    est = SpeedEstimator(2)
    for x in ([1.0, 4.0], [1.0, 4.0], [9.0, 4.0]):  # one outlier round for worker 0
        est.observe(np.array(x))
    tau = est.estimate(distinct=1.5)
    assert tau is not None and tau.tolist() == [1.0, 4.0]


def test_equal_workers_keep_the_static_order() -> None:
    A = cyclic_assignment(8, 3)
    pol = AdaptiveOrdering(A, optimal_order(A))
    assert pol.orders() is pol.base  # no evidence yet
    pol.observe([(0.1 * (k + 1), j, k + 1, 0.1 * (k + 1)) for j in range(8) for k in range(2)],
                0.0, 0.25, range(8))
    assert pol.orders() is pol.base


def test_orders_travel_in_round_start_only_when_given() -> None:
    model = np.array([1.0, 2.0])
    plain = RoundStart(epoch=1, round=2, delays_s=(0.5,), net_delay_s=0.0, model=model)
    A = cyclic_assignment(4, 2)
    flat = flatten_orders(optimal_order(A))
    witho = RoundStart(epoch=1, round=2, delays_s=(0.5,), net_delay_s=0.0, model=model,
                       orders=flat)
    a, b = encode_frame_bytes(plain), encode_frame_bytes(witho)
    # one byte per chunk index below 128; the array header stays one byte under 16 entries
    assert len(b) == len(a) + len(flat)
    back = decode_frame_bytes(b)
    assert isinstance(back, RoundStart) and back.orders == flat
    back0 = decode_frame_bytes(a)
    assert isinstance(back0, RoundStart) and back0.orders == ()
    assert [o.tolist() for o in unflatten_orders(A, flat)] == [o.tolist()
                                                               for o in optimal_order(A)]
    with pytest.raises(CodingError):
        unflatten_orders(A, flat[::-1])


def test_protocol_engine_matches_the_fast_path_and_decodes_exactly() -> None:
    cfg = RunConfig(workers=16, delta=4, n_parts=2, ordering="adaptive",
                    delay="straggle:0.25,5,exp:0.02", rounds=25, seed=2)
    built = build_schemes(cfg, ["partial"])
    sched = schedule_for(cfg, built)
    _, end, adopted = adaptive_times(built["partial"], sched)
    recs = simulate_protocol(cfg, ["partial"], schedule=sched, built=built)["partial"]
    arr = record_arrays(recs, mode="exact")
    assert adopted.any()
    np.testing.assert_allclose(arr["completion_s"], end, rtol=0, atol=1e-12)
    assert set(arr["status"].tolist()) == {"exact"}
    # PS and workers disagreeing on a round's orders would decode with O(1) error; the rest
    # is B's conditioning at ell = 2 in float64
    assert max(r.rel_error_plain for r in recs) < 1e-6
    static = exact_times(built["partial"], sched)[1]
    assert end[~adopted] == pytest.approx(static[~adopted])


def test_warm_start_and_cap_keep_the_search_exact() -> None:
    A = cyclic_assignment(12, 4)
    base = optimal_order(A)
    rng = np.random.default_rng(3)
    prev = None
    for _ in range(8):
        tau = rng.choice([1.0, 1.0, 1.0, 5.0], size=12)
        _, t_cold = speed_orders(A, base, tau, 2)
        warm, t_warm = speed_orders(A, base, tau, 2, prev=prev)
        assert t_warm == pytest.approx(t_cold)
        assert t_warm == pytest.approx(plugin_trigger_time(A, warm, tau, 2))
        prev = warm
        # below the optimum nothing is feasible: the static order and its own time
        capped, t_cap = speed_orders(A, base, tau, 2, cap=0.99 * t_cold)
        assert [o.tolist() for o in capped] == [o.tolist() for o in base]
        assert t_cap == pytest.approx(plugin_trigger_time(A, base, tau, 2))


def _slow(m: int, who: list[int], factor: float = 5.0) -> np.ndarray:
    x = np.full(m, 1.0)
    x[who] = factor
    return x


def test_one_outlier_round_moves_no_plan_and_a_move_is_not_followed_stale() -> None:
    A = cyclic_assignment(8, 3)
    pol = AdaptiveOrdering(A, optimal_order(A))
    for _ in range(3):
        pol.estimator.observe(_slow(8, [3, 4]))
    planned = pol.orders()
    assert pol.last is not None and pol.last[2]  # adopted: two adjacent stragglers
    # one outlier round (worker 0 slow once): no stale plan is trusted this round ...
    pol.estimator.observe(_slow(8, [0, 3, 4]))
    tau = pol.estimator.estimate()
    assert tau is not None and tau[0] == tau[1]  # ... and the estimate did not move
    pol.orders()
    # back to normal: the same orders as before the outlier
    pol.estimator.observe(_slow(8, [3, 4]))
    assert [o.tolist() for o in pol.orders()] == [o.tolist() for o in planned]
    # the slow set moves to {0, 2}: the orders planned for {3, 4} would take 3 there against
    # the static order's 2; the round right after the move does not use them ...
    pol = AdaptiveOrdering(A, optimal_order(A))
    for _ in range(3):
        pol.estimator.observe(_slow(8, [3, 4]))
    assert [o.tolist() for o in pol.orders()] == [o.tolist() for o in planned]
    now = _slow(8, [0, 2])
    assert plugin_trigger_time(A, planned, now) > plugin_trigger_time(A, pol.base, now)
    pol.estimator.observe(now)
    got = pol.orders()
    assert plugin_trigger_time(A, got, now) <= plugin_trigger_time(A, pol.base, now)
    # ... and once the median has moved, neither the stale plan nor anything worse than static
    pol.estimator.observe(now)
    follow = pol.orders()
    assert plugin_trigger_time(A, follow, now) <= plugin_trigger_time(A, pol.base, now)


def test_fidelity_replays_the_adaptive_policy_not_the_static_order() -> None:
    from aiogc.harness.fidelity import replay_ratios

    cfg = RunConfig(workers=16, delta=4, n_parts=2, ordering="adaptive",
                    delay="straggle:0.25,5,exp:0.02", rounds=25, seed=2)
    built = build_schemes(cfg, ["partial"])
    sched = schedule_for(cfg, built)
    recs = simulate_protocol(cfg, ["partial"], schedule=sched, built=built)["partial"]
    got = replay_ratios(cfg, sched, {"partial": recs}, built=built)["schemes"]["partial"]
    assert got["ratio"] == pytest.approx(1.0, abs=1e-9)
    static = float(np.mean(exact_times(built["partial"], sched)[1]))
    assert got["sim_mean_s"] != pytest.approx(static)  # the static order's time differs


def test_static_rounds_of_an_adaptive_run_send_the_static_round_start_bytes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the rounds where the policy keeps the static order carry no `orders` field: their
    # round_start frames are the static ordering's byte for byte, so workers and aggregator
    # stay on their static path
    from aiogc.sim.engine import Simulation

    sent: list[tuple[int, RoundStart]] = []
    route = Simulation._route_down

    def spy(self: Simulation, out: Any, now: float) -> None:
        if isinstance(out.message, RoundStart):
            sent.append((out.peer[0], out.message))
        route(self, out, now)

    monkeypatch.setattr(Simulation, "_route_down", spy)
    msgs: dict[str, dict[tuple[int, int], RoundStart]] = {}
    for ordering in ("optimal", "adaptive"):
        cfg = RunConfig(workers=16, delta=4, n_parts=2, ordering=ordering,
                        delay="straggle:0.25,5,exp:0.02", rounds=25, seed=2)
        built = build_schemes(cfg, ["partial"])
        sched = schedule_for(cfg, built)
        sent.clear()
        simulate_protocol(cfg, ["partial"], schedule=sched, built=built)
        msgs[ordering] = {(m.round, w): m for w, m in sent}  # peers: (worker, generation)
    adopted = adaptive_times(built["partial"], sched)[2]
    assert adopted.any() and not adopted.all()
    first = int(np.argmax(adopted))
    static, adaptive = msgs["optimal"], msgs["adaptive"]
    assert static.keys() == adaptive.keys() and len(static) == 16 * 25
    for (r, w), got in adaptive.items():
        b, want = encode_frame_bytes(got), static[r, w]
        if adopted[r]:
            assert got.orders and b != encode_frame_bytes(want)
            continue
        if r <= first:  # the same model so far: the very same frame
            assert b == encode_frame_bytes(want), (r, w)
        # later the models differ by the rounding of decodes with other orders (the wire has
        # nothing to do with it): the frame is the static one's at this model
        np.testing.assert_allclose(got.model, want.model, rtol=1e-9, atol=1e-12)
        same = RoundStart(epoch=want.epoch, round=want.round, delays_s=want.delays_s,
                          net_delay_s=want.net_delay_s, model=got.model)
        assert b == encode_frame_bytes(same), (r, w)


def test_simulate_fast_walks_the_adaptive_policy() -> None:
    """`aiogc simulate --ordering adaptive` (the fast path) once reported the static order's
    times; it now runs the policy, round for round as the protocol engine, and says when it
    cannot (approximate mode, shaped links)."""
    from aiogc.errors import ConfigError
    from aiogc.sim.fast import simulate_fast

    cfg = RunConfig(workers=16, delta=4, n_parts=2, ordering="adaptive",
                    delay="straggle:0.25,5,exp:0.02", rounds=25, seed=2)
    built = build_schemes(cfg, ["partial"])
    sched = schedule_for(cfg, built)
    fast = simulate_fast(cfg, ["partial"], schedule=sched, built=built)["partial"]
    trig, end, adopted = adaptive_times(built["partial"], sched)
    assert adopted.any()
    np.testing.assert_array_equal(fast.completion_s, end)
    np.testing.assert_array_equal(fast.trigger_s, trig)
    static = simulate_fast(cfg.replace(ordering="optimal"), ["partial"], schedule=sched)
    assert not np.array_equal(static["partial"].completion_s, fast.completion_s)
    with pytest.raises(ConfigError, match="ordering"):
        simulate_fast(cfg.replace(mode="approx", deadline_s=0.05), ["partial"], schedule=sched,
                      built=built)
