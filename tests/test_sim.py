"""Simulator front-end: the protocol engine's times, the fast path's agreement with it, the CLI.

Deterministic (seeded schedules), virtual clock only: no wall-clock assertions.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from typing import Any

import numpy as np
import pytest

from aiogc.cli import simulate as sim_cli
from aiogc.config import RunConfig
from aiogc.sim.engine import SimNetwork
from aiogc.sim.fast import build_schemes, schedule_for, simulate_fast
from aiogc.sim.protocol import record_arrays, simulate_protocol
from tests.helpers import finish_times, partial_trigger_offset

SCHEMES = ["partial", "original", "uncoded", "ignore-stragglers", "stream-chunks"]


def _cfg(**kw: object) -> RunConfig:
    base: dict[str, object] = dict(workers=10, delta=4, n_parts=1, rounds=12, delay="exp:1.0",
                                   seed=7)
    base.update(kw)
    return RunConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("assignment", "workers", "delta", "ell"),
    [("cyclic", 10, 4, 1), ("cyclic", 10, 4, 2), ("regular", 12, 4, 3), ("fr", 12, 3, 1)],
)
def test_protocol_times_are_the_order_statistics(assignment: str, workers: int, delta: int,
                                                 ell: int) -> None:
    """Zero latency: partial triggers at the earliest time every chunk has >= ell finished
    holders; original ends at the (m - s)-th finishing worker, or (fractional repetition) when
    every group has a finished worker; trial by trial."""
    cfg = _cfg(assignment=assignment, workers=workers, delta=delta, n_parts=ell)
    built = build_schemes(cfg, ["partial", "original"])
    sched = schedule_for(cfg, built)
    recs = simulate_protocol(cfg, ["partial", "original"], schedule=sched, built=built,
                             gradients="gaussian", dim=8)
    p, o = built["partial"], built["original"]
    s = delta - ell
    for r in range(cfg.rounds):
        ft = finish_times(sched, r, np.asarray(p.loads))
        expect = partial_trigger_offset(p, ft)  # brute force over event times
        rec = recs["partial"][r]
        assert rec.status == "exact"
        assert rec.t_trigger is not None
        assert rec.t_trigger - rec.t_start == pytest.approx(expect, abs=1e-12)
        done = np.array([f[-1] for f in finish_times(sched, r, np.asarray(o.loads))])
        orec = recs["original"][r]
        assert orec.t_trigger is not None
        if assignment == "fr":  # one finished worker per group of delta decodes
            want = done.reshape(-1, delta).min(axis=1).max()
        else:
            want = np.sort(done)[workers - s - 1]
            # partial never later than original (s = delta - ell, every chunk has delta
            # holders); with fractional repetition original decodes per group and can be earlier
            assert rec.t_trigger - rec.t_start <= orec.t_trigger - orec.t_start + 1e-12
        assert orec.t_trigger - orec.t_start == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize(
    ("kw", "latency"),
    [
        ({}, 0.0),
        ({"n_parts": 2}, 0.0),
        ({"assignment": "regular", "workers": 12, "n_parts": 2, "ordering": "random"}, 0.0),
        ({"n_parts": 2, "latency": "exp:0.1"}, 0.05),
    ],
)
@pytest.mark.parametrize("deadline", [None, 1.5, 3.0])
def test_fast_path_equals_protocol_engine(kw: dict[str, Any], latency: float,
                                          deadline: float | None) -> None:
    mode = "exact" if deadline is None else "approx"
    cfg = _cfg(mode=mode, deadline_s=deadline, **kw)
    built = build_schemes(cfg, SCHEMES)
    sched = schedule_for(cfg, built)
    fast = simulate_fast(cfg, SCHEMES, schedule=sched, latency=latency, built=built, dim=24)
    proto = simulate_protocol(cfg, SCHEMES, schedule=sched,
                              network=SimNetwork(latency=latency), built=built,
                              gradients="gaussian", dim=24)
    for name in SCHEMES:
        f, a = fast[name], record_arrays(proto[name], mode=cfg.mode)
        assert len(proto[name]) == cfg.rounds
        np.testing.assert_allclose(a["completion_s"], f.completion_s, rtol=0, atol=1e-12)
        assert list(a["status"]) == list(f.status)
        ok = f.status != "failed"
        np.testing.assert_allclose(a["trigger_s"][ok], f.trigger_s[ok], rtol=0, atol=1e-12)
        states = np.array([rec.state for rec in proto[name]])
        np.testing.assert_array_equal(states[ok], f.states[ok])
        if mode == "approx":
            assert f.mse is not None
            np.testing.assert_allclose(a["mse"], f.mse, rtol=1e-9, atol=1e-20)


def test_exact_rounds_decode_exactly_under_gaussian_gradients() -> None:
    cfg = _cfg(n_parts=3, rounds=6)
    recs = simulate_protocol(cfg, ["partial", "original"], gradients="gaussian", dim=30)
    for name in ("partial", "original"):
        a = record_arrays(recs[name], mode=cfg.mode)
        assert (a["status"] == "exact").all()
        assert (a["mse"] < 1e-18).all()


def test_approx_mse_decreases_with_deadline_and_partial_beats_original() -> None:
    base = _cfg(rounds=60, mode="approx", deadline_s=1.0)
    means = {}
    for T in (1.0, 2.0, 3.0):
        res = simulate_fast(base.replace(deadline_s=T), ["partial", "original"], dim=16)
        means[T] = {k: float(v.mse.mean()) for k, v in res.items() if v.mse is not None}
    for name in ("partial", "original"):
        assert means[1.0][name] >= means[2.0][name] >= means[3.0][name]
    for T in means:
        assert means[T]["partial"] < means[T]["original"]


# ------------------------------------------------------------------------------ CLI


def _run_cli(argv: list[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="aiogc")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sim_cli.register(sub)
    args = parser.parse_args(argv)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = args.func(args)
    return rc, out.getvalue(), err.getvalue()


def test_simulate_cli_json_has_documented_keys() -> None:
    rc, out, _ = _run_cli(["simulate", "--assignment", "cyclic", "--workers", "20", "--delta",
                           "4", "--ell", "2", "--schemes", "partial,original", "--delay",
                           "exp:1.0", "--trials", "200", "--seed", "1", "--format", "json"])
    assert rc == 0
    obj = json.loads(out)
    assert set(obj) >= {"config", "results", "speedup"}
    assert obj["config"]["workers"] == 20 and obj["config"]["ell"] == 2
    rows = obj["results"]
    assert [r["scheme"] for r in rows] == ["partial", "original"]
    for r in rows:
        assert set(r) >= {"scheme", "mode", "completion_mean", "completion_std", "trials"}
        assert r["mode"] == "exact" and r["trials"] == 200
    assert obj["speedup"] == pytest.approx(rows[1]["completion_mean"] / rows[0]["completion_mean"])
    assert obj["speedup"] > 1.0


def test_simulate_cli_engines_agree_and_approx_rows() -> None:
    argv = ["simulate", "--workers", "8", "--delta", "3", "--trials", "20", "--mode", "approx",
            "--deadline", "1.0,2.5", "--dim", "16", "--schemes", "partial,original,uncoded"]
    rc, out, _ = _run_cli([*argv, "--engine", "fast"])
    rc2, out2, _ = _run_cli([*argv, "--engine", "protocol"])
    assert rc == rc2 == 0
    a, b = json.loads(out), json.loads(out2)
    assert len(a["results"]) == 6
    for ra, rb in zip(a["results"], b["results"], strict=True):
        assert set(ra) >= {"deadline", "mse_mean", "mse_std"}
        assert ra["deadline"] == rb["deadline"] and ra["scheme"] == rb["scheme"]
        assert ra["mse_mean"] == pytest.approx(rb["mse_mean"], rel=1e-9)
        assert ra["completion_mean"] == pytest.approx(rb["completion_mean"], abs=1e-12)
    rc, table, _ = _run_cli([*argv, "--format", "table"])
    assert rc == 0 and "mse mean" in table and "partial" in table


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--workers", "0"], "--workers"),
        (["--ell", "9"], "--ell"),
        (["--delay", "bogus:1"], "--delay"),
        (["--schemes", "partial,nope"], "--schemes"),
        (["--mode", "approx"], "--deadline"),
        (["--mode", "approx", "--deadline", "1,-2"], "--deadline"),
        (["--trials", "0"], "--trials"),
        (["--engine", "warp"], "--engine"),
        (["--assignment", "star"], "--assignment"),
        (["--latency", "-1"], "--latency"),
        (["--ell", "4", "--schemes", "original"], "--ell"),
    ],
)
def test_simulate_cli_bad_args_exit_2(argv: list[str], flag: str) -> None:
    trials = [] if "--trials" in argv else ["--trials", "5"]
    rc, out, err = _run_cli(["simulate", *trials, *argv])
    assert rc == 2
    assert out == ""
    assert flag in err and "expected" in err
