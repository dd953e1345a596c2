"""The fidelity measurement of live runs (aiogc.harness.fidelity), on records built from the
protocol engine (virtual clock): a run that took exactly its simulated time is faithful, one
made slower on purpose is not, and the verdict names the number that broke it."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import numpy as np
import pytest

from aiogc.coding.base import Scheme
from aiogc.config import RunConfig
from aiogc.core import RoundRecord
from aiogc.harness.fidelity import (
    ROBUST_MIN_ROUNDS,
    Calibration,
    CpuSnapshot,
    LoopLagMonitor,
    auto_time_scale,
    chunk_lateness,
    fidelity_report,
    predicted_ratio,
    replay_ratios,
)
from aiogc.sim.fast import build_schemes, schedule_for
from aiogc.sim.protocol import simulate_protocol
from aiogc.training.schedule import DelaySchedule

SCHEMES = ["partial", "original"]
Run = tuple[RunConfig, DelaySchedule, dict[str, list[RoundRecord]], dict[str, Scheme]]


@pytest.fixture(scope="module")
def engine_run() -> Run:
    cfg = RunConfig(workers=8, delta=3, rounds=12, seed=5, delay="exp:0.01")
    built = build_schemes(cfg, SCHEMES)
    schedule = schedule_for(cfg, built)
    records = simulate_protocol(cfg, SCHEMES, schedule=schedule, built=built)
    return cfg, schedule, records, built


def _stretched(records: dict[str, list[RoundRecord]], k: float, extra_s: float = 0.0
               ) -> dict[str, list[RoundRecord]]:
    """The same rounds as a live run at time scale k would record them (wall = k x emulated),
    each round ``extra_s`` (wall) slower."""
    out: dict[str, list[RoundRecord]] = {}
    for name, recs in records.items():
        out[name] = [dataclasses.replace(
            r, t_start=r.t_start * k, t_end=None if r.t_end is None else r.t_end * k + extra_s,
            reports=[(t, w, c, e * k) for (t, w, c, e) in r.reports]) for r in recs]
    return out


def test_a_run_that_took_its_simulated_time_is_faithful(engine_run: Run) -> None:
    cfg, schedule, records, built = engine_run
    for k in (1.0, 7.0):
        rep = replay_ratios(cfg, schedule, _stretched(records, k), time_scale=k, built=built)
        for name in SCHEMES:
            assert rep["schemes"][name]["ratio"] == pytest.approx(1.0, rel=1e-9)
            assert rep["schemes"][name]["rounds_compared"] == cfg.rounds
        assert rep["speedups"]["original"]["ratio"] == pytest.approx(1.0, rel=1e-9)
        fid = fidelity_report(rep, threshold=0.1, time_scale=k)
        assert fid["verdict"] == "faithful" and fid["reasons"] == []
        late = chunk_lateness(schedule, _stretched(records, k), time_scale=k)
        assert late["n"] > 0 and abs(late["max"]) < 1e-9  # the engine is never late


def test_a_slow_run_is_unfaithful_and_says_which_ratio(engine_run: Run) -> None:
    cfg, schedule, records, built = engine_run
    mean = float(np.mean([r.duration_s for r in records["partial"]]))
    slow = _stretched(records, 1.0, extra_s=0.5 * mean)  # every round 50 % of a round late
    rep = replay_ratios(cfg, schedule, slow, built=built)
    assert rep["schemes"]["partial"]["ratio"] == pytest.approx(1.5, rel=0.25)
    fid = fidelity_report(rep, threshold=0.1, time_scale=1.0)
    assert fid["verdict"] == "unfaithful"
    assert any(r.startswith("partial rounds took") for r in fid["reasons"])
    assert fid["worst_ratio"] > 1.1


def test_starved_cpu_is_a_warning_beside_the_ratios(engine_run: Run) -> None:
    cfg, schedule, records, built = engine_run
    rep = replay_ratios(cfg, schedule, records, built=built)
    cpu = {"share_when_runnable": 0.4, "starved": True}
    fid = fidelity_report(rep, threshold=0.1, time_scale=1.0, cpu=cpu)
    assert fid["verdict"] == "faithful" and "CPU starved" in fid["warnings"][0]
    slow = fidelity_report(replay_ratios(cfg, schedule, _stretched(records, 1.0, 1.0),
                                         built=built),
                           threshold=0.1, time_scale=1.0, cpu=cpu)
    assert slow["verdict"] == "unfaithful" and slow["warnings"] == fid["warnings"]


def test_chosen_scale_keeps_the_predicted_overhead_under_a_quarter_of_the_threshold() -> None:
    cfg = RunConfig(workers=256, delta=4, rounds=20, seed=1, delay="exp:0.01")
    built = build_schemes(cfg, SCHEMES)
    schedule = schedule_for(cfg, built)
    cal = Calibration(frame_s=20e-6, core_s_per_worker=60e-6)
    k, why = auto_time_scale(cfg, SCHEMES, schedule, {}, built=built, threshold=0.1,
                             model=cal)
    assert k >= 1 and k == math.ceil(k)
    assert why["predicted_ratio"] <= 1.025 + 1e-12
    # the next smaller scale would not have been enough (K is the smallest)
    if k > 1:
        assert predicted_ratio(why["overhead_s_per_round"], why["sim_round_s"], k - 1) > 1.025
    # a free machine needs no dilation
    k0, _ = auto_time_scale(cfg, SCHEMES, schedule, {}, built=built, threshold=0.1,
                            model=Calibration(0.0, 0.0))
    assert k0 == 1.0


def test_one_stalled_calibration_round_does_not_choose_the_scale(engine_run: Run) -> None:
    """K from the second-worst calibration round once there are ROBUST_MIN_ROUNDS of them
    (a one-off 1.1 s stall at m=1024 once chose K=1000); from the worst below that."""
    cfg, schedule, records, built = engine_run
    steady = _stretched(records, 1.0, 0.002)  # 2 ms over the simulator in every round
    stalled = {n: list(recs) for n, recs in steady.items()}
    r0 = stalled["partial"][0]
    assert r0.t_end is not None
    stalled["partial"][0] = dataclasses.replace(r0, t_end=r0.t_end + 0.5)
    k_steady, _ = auto_time_scale(cfg, SCHEMES, schedule, steady, built=built, threshold=0.1)
    k, why = auto_time_scale(cfg, SCHEMES, schedule, stalled, built=built, threshold=0.1)
    assert k == k_steady and "set aside" in why["overhead_source"]
    assert why["overhead_s_per_round"] == pytest.approx(0.002, abs=1e-9)
    # too few rounds to call one an outlier: the worst counts
    few = {"partial": stalled["partial"][:ROBUST_MIN_ROUNDS - 1]}
    k_few, why_few = auto_time_scale(cfg, ["partial"], schedule, few, built=built,
                                     threshold=0.1)
    assert why_few["overhead_s_per_round"] == pytest.approx(0.502, abs=1e-9)
    assert k_few > 10 * k


def test_loop_lag_monitor_and_cpu_snapshot() -> None:
    async def main() -> dict[str, float]:
        mon = LoopLagMonitor(interval_s=0.001)
        mon.start()
        done = asyncio.Event()
        asyncio.get_running_loop().call_later(0.02, done.set)
        await done.wait()
        mon.stop()
        return mon.summary()

    before = CpuSnapshot.take()
    s = asyncio.run(main())
    assert s["n"] >= 1 and s["p50"] >= 0.0
    after = CpuSnapshot.take()
    if before is not None and after is not None:  # Linux with schedstat
        cpu = after.since(before)
        assert cpu["cpu_s"] >= 0.0 and 0.0 <= cpu["share_when_runnable"] <= 1.0
