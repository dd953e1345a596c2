"""Fail-slow traces (--delay trace:FILE) and the no-straggler counterfactual (aiogc whatif)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from aiogc.cli import main
from aiogc.config import RunConfig
from aiogc.errors import ConfigError
from aiogc.harness.local import run_live
from aiogc.harness.options import RunOptions
from aiogc.harness.whatif import (
    format_whatif,
    no_straggler_schedule,
    parse_typical,
    whatif_no_stragglers,
)
from aiogc.training.delays import materialise, parse_delay
from aiogc.training.schedule import DelaySchedule


def _trace(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "trace.csv"
    p.write_text(text)
    return p


def test_trace_windows_follow_the_schedule_clock(tmp_path: Path) -> None:
    """Rounds last as long as their slowest worker's chunks: with const:0.01 and K=2, round r
    starts at 0.02 r until a slow-down lengthens one."""
    p = _trace(tmp_path, "# base=const:0.01\nstart,end,workers,factor\n"
                         "0.03,0.07,1;3,10\n0.2,inf,0-1,inf\n")
    s = materialise(f"trace:{p}", rounds=6, m=4, max_chunks=2, seed=0)
    c = s.compute_s
    assert s.compute_spec == f"trace:{p},const:0.01"
    # round 1 starts at 0.02; its second chunks start at 0.03: workers 1 and 3 slowed x10
    assert c[1, 1, 1] == pytest.approx(0.1) and c[1, 3, 1] == pytest.approx(0.1)
    assert c[1, 0, 1] == c[1, 1, 0] == pytest.approx(0.01)
    # round 1 lasted 0.11, so rounds 2..5 start at 0.13, 0.15, 0.17, 0.19: untouched until
    # round 5's second chunks (at 0.20): workers 0 and 1 die there (fail-stop)
    assert np.allclose(c[2:5], 0.01)
    assert math.isinf(c[5, 0, 1]) and math.isinf(c[5, 1, 1]) and c[5, 2, 1] == 0.01
    assert c[5, 0, 0] == pytest.approx(0.01)


def test_trace_base_from_the_spec_and_errors(tmp_path: Path) -> None:
    p = _trace(tmp_path, "0,1,*,2\n")
    assert parse_delay(f"trace:{p},exp:0.02").spec == f"trace:{p},exp:0.02"
    s = materialise(f"trace:{p},const:0.5", rounds=1, m=2, max_chunks=1, seed=0)
    assert np.allclose(s.compute_s, 1.0)
    with pytest.raises(ConfigError, match="no BASE"):
        parse_delay(f"trace:{p}")
    bad = _trace(tmp_path, "# base=none\n0,1,0,2\n0.5,0.2,1,3\n")
    with pytest.raises(ConfigError, match=r"trace\.csv:3 is '0.5,0.2,1,3'"):
        parse_delay(f"trace:{bad}")
    for line in ("0,1,x,2", "0,1,0,0", "0,1,0", "-1,1,0,2", "0,1,3-1,2"):
        _trace(tmp_path, f"# base=none\n{line}\n")
        with pytest.raises(ConfigError, match="start,end,workers,factor"):
            parse_delay(f"trace:{tmp_path / 'trace.csv'}")
    _trace(tmp_path, "0,1,9,2\n")
    with pytest.raises(ConfigError, match="worker 9"):
        materialise(f"trace:{tmp_path / 'trace.csv'},const:0.1", rounds=1, m=4, max_chunks=1,
                    seed=0)
    with pytest.raises(ConfigError, match="readable"):
        parse_delay(f"trace:{tmp_path / 'missing.csv'},none")


def test_no_straggler_schedule_uses_medians_and_keeps_the_dead() -> None:
    c = np.array([[[1.0, 1.0], [2.0, 2.0], [1.0, np.inf]],
                  [[9.0, 1.0], [2.0, 8.0], [1.0, 1.0]]])
    s = DelaySchedule(compute_s=c, network_s=np.zeros((2, 3)), compute_spec="x")
    w = no_straggler_schedule(s, "worker")
    assert np.array_equal(w.compute_s[:, 0], np.ones((2, 2)))  # worker 0: median 1
    assert np.array_equal(w.compute_s[:, 1], np.full((2, 2), 2.0))  # persistent: kept
    assert math.isinf(w.compute_s[0, 2, 1]) and w.compute_s[1, 2, 1] == 1.0
    cl = no_straggler_schedule(s, "cluster")
    finite = cl.compute_s[np.isfinite(cl.compute_s)]
    assert np.all(finite == np.median(c[np.isfinite(c)]))
    assert w.compute_spec == "no-stragglers(worker,median):x"
    with pytest.raises(ConfigError, match="baseline"):
        no_straggler_schedule(s, "median")


def test_no_straggler_schedule_takes_the_mean_or_a_quantile() -> None:
    c = np.array([[[1.0], [2.0]], [[2.0], [np.inf]], [[6.0], [4.0]]])
    s = DelaySchedule(compute_s=c, network_s=np.zeros((3, 2)), compute_spec="x")
    mean = no_straggler_schedule(s, "worker", "mean")
    assert np.all(mean.compute_s[:, 0] == 3.0)  # (1 + 2 + 6) / 3, above the median 2
    assert mean.compute_s[0, 1, 0] == 3.0 and math.isinf(mean.compute_s[1, 1, 0])
    q = no_straggler_schedule(s, "cluster", "quantile:1")
    assert np.all(q.compute_s[np.isfinite(c)] == 6.0)
    assert q.compute_spec == "no-stragglers(cluster,quantile:1):x"
    assert parse_typical("quantile:0.90") == ("quantile:0.9", 0.9)
    for bad in ("quantile:1.5", "quantile:x", "p90", "mode"):
        with pytest.raises(ConfigError, match="typical"):
            no_straggler_schedule(s, "worker", bad)


def test_whatif_splits_stragglers_from_the_system(tmp_path: Path) -> None:
    trace = _trace(tmp_path, "start,end,workers,factor\n0.01,0.05,1-2,10\n")
    cfg = RunConfig(workers=4, delta=2, rounds=6, seed=1, task="linreg:samples=80,dim=4",
                    delay=f"trace:{trace},const:0.003")
    run = tmp_path / "run"
    run_live(cfg, ["partial", "original"], RunOptions(mode="coroutines", out_dir=run,
                                                      plots=False, loop="asyncio"))
    res = whatif_no_stragglers(run)
    for name in ("partial", "original"):
        v = res["schemes"][name]
        # const base: the no-straggler schedule is const, the trace made some rounds slower
        assert v["clean_mean_s"] == pytest.approx(0.003 * (2 if name == "original" else 1),
                                                  rel=0.5)
        assert v["straggler_slowdown"] > 1.0  # two slow workers: original feels them too
        assert v["straggler_s"] == pytest.approx(v["sim_mean_s"] - v["clean_mean_s"])
        live = v["live_mean_s"]
        assert live is not None
        assert live == pytest.approx(v["clean_mean_s"] * v["straggler_slowdown"]
                                     * v["system_overhead"])
    summary = json.loads((run / "summary.json").read_text())
    assert res["schemes"]["partial"]["sim_mean_s"] == pytest.approx(
        summary["fidelity"]["schemes"]["partial"]["sim_mean_s"])
    # the live speedup is the measured one, the simulated one is named as such
    sp, v = res["speedups"]["original"], res["schemes"]
    assert sp["live"] == v["original"]["live_mean_s"] / v["partial"]["live_mean_s"]
    assert sp["simulated"] == v["original"]["sim_mean_s"] / v["partial"]["sim_mean_s"]
    text = format_whatif(res)
    assert f"live {sp['live']:.2f} (measured); simulated {sp['simulated']:.2f}" in text
    assert "the median of that worker's own delays (--typical median --baseline worker" in text
    assert main(["whatif", str(run), "--no-stragglers"]) == 0
    saved = json.loads((run / "whatif.json").read_text())
    assert set(saved["schemes"]) == {"partial", "original"}
    assert saved["typical"] == "median" and "live" in saved["speedups"]["original"]
    assert main(["whatif", str(run), "--no-stragglers", "--typical", "mean"]) == 0
    saved = json.loads((run / "whatif.json").read_text())
    mean = whatif_no_stragglers(run, typical="mean")
    assert saved["typical"] == "mean" and saved["schemes"]["partial"]["clean_mean_s"] == \
        pytest.approx(mean["schemes"]["partial"]["clean_mean_s"])
    assert main(["whatif", str(run), "--no-stragglers", "--typical", "quantile:2"]) == 2
    assert main(["whatif", str(run)]) == 2
    assert main(["whatif", str(tmp_path / "nope"), "--no-stragglers"]) == 2
