"""The experiments on their quick grids: files written, headline claims on the quick grid, the
confidence-interval machinery, and the compute -> CSV -> plot split."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aiogc.errors import ConfigError
from aiogc.experiments import EXPERIMENTS, refresh, replot, run_experiment
from aiogc.experiments._common import (
    mean_ci,
    ratio_of_means_ci,
    read_csv,
    write_csv,
)
from aiogc.experiments.stability import partial_decode_error, poly_decode_error
from aiogc.protocol.status import EndReason

NEW_FIVE = ("training", "latency", "approx-tails", "ordering", "poly-digits")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def _meta(path: Path, name: str) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((path / f"{name}.json").read_text())
    return meta


# ------------------------------------------------------------------------------ statistics


def test_ratio_ci_brackets_the_estimate_and_is_deterministic() -> None:
    rng = np.random.default_rng(0)
    den = rng.exponential(1.0, size=(4, 200))
    num = 2.0 * den + rng.normal(0, 0.1, size=den.shape)
    a = ratio_of_means_ci(num, den, rng=np.random.default_rng(5))
    b = ratio_of_means_ci(num, den, rng=np.random.default_rng(5))
    assert a == b
    est, lo, hi = a
    assert lo < est < hi
    assert lo > 1.9 and hi < 2.1  # 800 paired samples of a ratio of 2 with small noise


def test_cluster_bootstrap_widens_with_instance_spread() -> None:
    """Instances that disagree (one draw of H gives 0.23, another 0.55) must widen the
    interval beyond what the trials alone say."""
    rng = np.random.default_rng(1)
    same = rng.normal(1.0, 0.05, size=(6, 300))
    spread = same + np.linspace(-0.3, 0.3, 6)[:, None]
    _, lo1, hi1 = mean_ci(same, rng=np.random.default_rng(2))
    _, lo2, hi2 = mean_ci(spread, rng=np.random.default_rng(2))
    assert (hi2 - lo2) > 5 * (hi1 - lo1)


def test_constant_samples_give_a_zero_width_interval() -> None:
    est, lo, hi = mean_ci(np.full((3, 10), 0.25), rng=np.random.default_rng(0))
    assert est == lo == hi == 0.25


def test_csv_round_trip_types(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [{"a": 1, "b": 0.5, "c": "x", "d": True, "e": None},
                                  {"a": 2, "b": 1e-30}]
    write_csv(tmp_path / "t.csv", rows)
    back = read_csv(tmp_path / "t.csv")
    assert back[0] == {"a": 1, "b": 0.5, "c": "x", "d": True, "e": None}
    assert back[1]["b"] == 1e-30 and back[1]["c"] is None


# ------------------------------------------------------------------------------ exact / approx


def test_exact_speedup_partial_faster_in_every_cell(tmp_path: Path) -> None:
    head = run_experiment("exact-speedup", tmp_path, quick=True, seed=1)
    assert head["partial_faster_every_cell"]
    rows = _rows(tmp_path / "exact-speedup.csv")
    assert (tmp_path / "exact-speedup.png").stat().st_size > 0
    cells: dict[tuple[str, str, str], dict[str, float]] = {}
    for r in rows:
        key = (r["assignment"], r["delay"], r["ell"])
        cells.setdefault(key, {})[r["scheme"]] = float(r["completion_mean"])
        assert float(r["speedup_lo"]) <= float(r["speedup"]) <= float(r["speedup_hi"])
        assert int(r["instances"]) == 2
    assert len(cells) == 3 * 3 * 3  # cyclic, regular, fr x three laws x ℓ = 1..3
    for key, c in cells.items():
        assert c["partial"] < c["original"], key
        # every baseline on every row; at ℓ = 1 with free communication streaming every chunk
        # finishes exactly when partial's trigger fires (the same orders)
        assert set(c) == {"partial", "original", "uncoded", "stream-chunks",
                          "ignore-stragglers"}, key
        if key[2] == "1":
            assert c["stream-chunks"] == c["partial"], key
    assert head["lowest_ci_bound"] > 1.0  # even the interval's low end: partial is faster
    meta = _meta(tmp_path, "exact-speedup")
    assert meta["command"].startswith("aiogc experiment exact-speedup --out ")
    assert meta["quick"] is True and meta["seed"] == 1 and meta["png"] == "exact-speedup.png"


def test_approx_mse_partial_lower_everywhere(tmp_path: Path) -> None:
    head = run_experiment("approx-mse", tmp_path, quick=True, seed=1)
    for cell in head["mse"].values():
        assert cell["partial"] < cell["original"]
        lo, hi = cell["ratio_ci"]
        assert lo <= cell["ratio"] <= hi
    assert (tmp_path / "approx-mse.png").exists()


def test_approx_mse_has_every_baseline(tmp_path: Path) -> None:
    head = run_experiment("approx-mse", tmp_path, quick=True, seed=2)
    for label, cell in head["baselines"].items():
        assert set(cell) == {"partial", "original", "uncoded", "stream-chunks",
                             "ignore-stragglers", "lowest"}, label
        assert cell["partial"][1] == 1.0 and cell["lowest"], label
    # with free communication streaming matches partial at ℓ = 1 (same states at T) and beats
    # partial at ℓ = 3, which needs every chunk three times
    assert head["baselines"]["ell=1,T=1"]["stream-chunks"][0] == pytest.approx(
        head["baselines"]["ell=1,T=1"]["partial"][0], rel=1e-9)
    assert head["baselines"]["ell=3,T=2"]["stream-chunks"][1] < 1.0


def test_bandwidth_sweep_direction(tmp_path: Path) -> None:
    """Compute-bound: partial ties stream-chunks at ℓ = 1; upload-bound (1 MB/s per worker):
    partial's best ℓ grows; a congested shared ingress: stream-chunks's extra uploads cost it."""
    head = run_experiment("bandwidth", tmp_path, quick=True, seed=1)
    w, ps = head["worker"], head["ps"]
    assert w["1GB/s"]["partial_ell"] == 1
    assert w["1MB/s"]["partial_ell"] > 1
    assert ps["30MB/s"]["stream-chunks"][1] > 1.0  # even its interval's low end: slower
    assert w["1MB/s"]["partial"][0] > w["1GB/s"]["partial"][0]
    rows = _rows(tmp_path / "bandwidth.csv")
    assert {r["scheme"] for r in rows} == {"partial", "original", "uncoded", "stream-chunks",
                                           "ignore-stragglers"}
    assert (tmp_path / "bandwidth.png").stat().st_size > 0


def test_approx_tails_covers_every_delay_law(tmp_path: Path) -> None:
    run_experiment("approx-tails", tmp_path, quick=True, seed=1)
    rows = read_csv(tmp_path / "approx-tails.csv")
    delays = {r["delay"] for r in rows}
    assert {"pareto:1.5", "pareto:2.0"} <= delays
    assert any(d.startswith("straggle:") for d in delays)
    assert any(d.startswith("fail:") and "straggle:" in d for d in delays)
    assert {r["scheme"] for r in rows} == {"partial", "original", "ignore-stragglers"}
    for r in rows:
        assert 0.0 <= r["mse_lo"] <= r["mse_mean"] <= r["mse_hi"] + 1e-12
        assert 0.0 <= r["mse_mean"] <= 1.5  # MSE relative to ||g||^2, never wildly off


# ------------------------------------------------------------------------------ ordering


def test_ordering_optimal_q_max_never_worse(tmp_path: Path) -> None:
    head = run_experiment("ordering", tmp_path, quick=True, seed=1)
    families = {k.split("|")[0] for k in head}
    assert families == {"regular", "cyclic", "fr"}
    for cell in head.values():
        q = cell["q_max"]
        assert q["optimal"] <= q["random"] and q["optimal"] <= q["natural"]
        assert q["optimal"] <= cell["q_max_random_draws_mean"]
    rows = read_csv(tmp_path / "ordering.csv")
    assert {r["ell"] for r in rows if r["kind"] == "mse"} == {1, 2, 3}


# ------------------------------------------------------------------------------ stability


def test_stability_partial_frame_is_accurate_and_cond_table_written(tmp_path: Path) -> None:
    run_experiment("stability", tmp_path, quick=True, seed=1)
    rows = read_csv(tmp_path / "stability.csv")
    err = [r for r in rows if r["kind"] == "error"]
    for r in err:
        if r["scheme"] == "partial-frame":
            tol = 1e-12 if r["dtype"] == "float64" else 1e-5
            assert r["rel_error_max"] < tol
        assert r["rel_error_min"] <= r["rel_error_median"] <= r["rel_error_max"]
    big = sorted((r for r in err if r["scheme"] == "original-polynomial"
                  and r["dtype"] == "float64"), key=lambda r: r["m"])
    assert big[-1]["rel_error_median"] > 100 * big[0]["rel_error_median"]  # degrades with m
    cond = [r for r in rows if r["kind"] == "cond"]
    assert cond
    for r in cond:
        assert 1.0 <= r["cond_frame_min"] <= r["cond_frame_max"]
        assert r["cond_frame_max"] <= r["cond_gaussian_max"]
    c24 = next(r for r in cond if r["m"] == 24 and r["delta"] == 4)
    assert c24["cond_polynomial_lower_bound"] > 1e3 * c24["cond_frame_max"]


def test_poly_decode_error_falls_with_precision() -> None:
    rng = np.random.default_rng(0)
    e = [poly_decode_error(12, 2, 2, d, np.random.default_rng([0, d])) for d in (10, 20, 40)]
    assert e[0] > e[1] > e[2]
    assert e[2] < 1e-20
    B = rng.standard_normal((2, 2))
    assert partial_decode_error(B, 30, rng) < 1e-25


def test_poly_digits_quick(tmp_path: Path) -> None:
    head = run_experiment("poly-digits", tmp_path, quick=True, seed=1)
    rows = read_csv(tmp_path / "poly-digits.csv")
    for deg in {r["degree"] for r in rows}:
        for name in ("original-polynomial", "partial-frame"):
            sel = sorted((r for r in rows if r["degree"] == deg and r["scheme"] == name),
                         key=lambda r: r["digits"])
            assert sel[0]["rel_error_median"] > sel[-1]["rel_error_median"]
        for d in {r["digits"] for r in rows}:
            p = next(r for r in rows if r["degree"] == deg and r["digits"] == d
                     and r["scheme"] == "partial-frame")
            o = next(r for r in rows if r["degree"] == deg and r["digits"] == d
                     and r["scheme"] == "original-polynomial")
            assert p["rel_error_median"] < o["rel_error_median"]
    need = head["digits_for_1e-6"]
    assert need["partial-frame|degree=20"] < need["original-polynomial|degree=20"]


# ------------------------------------------------------------------------------ live halves


def test_latency_quick_sim_sweep_and_live_point(tmp_path: Path) -> None:
    """Bookkeeping only for the live point (no wall-clock thresholds)."""
    head = run_experiment("latency", tmp_path, quick=True, seed=1)
    rows = read_csv(tmp_path / "latency.csv")
    sim = sorted((r for r in rows if r["kind"] == "sim" and r["model"] == "symmetric"),
                 key=lambda r: r["latency_ms"])
    # the simulated speedup falls as latency grows: partial pays an extra round trip
    assert sim[0]["speedup"] > sim[-1]["speedup"]
    live = [r for r in rows if r["kind"] == "live"]
    assert len(live) == 1 and live[0]["trials"] == 4
    assert live[0]["partial_mean_s"] > 0 and live[0]["original_mean_s"] > 0
    assert head["live"]


def test_training_quick_live_processes_real_data(tmp_path: Path) -> None:
    """Live worker processes on loopback, four schemes, the shipped breast-cancer data; the
    per-round loss replayed from the records matches what the live PS logged (checked inside
    the experiment, which raises otherwise)."""
    head = run_experiment("training", tmp_path, quick=True, seed=1)
    rows = read_csv(tmp_path / "training.csv")
    assert {r["scheme"] for r in rows} == {"partial", "original", "uncoded",
                                            "ignore-stragglers"}
    assert {r["task"] for r in rows} == {"logreg:breast-cancer"}
    for name in ("partial", "original", "uncoded"):
        init = [r for r in rows if r["scheme"] == name and r["round"] == -1]
        assert len(init) == 1 and init[0]["loss"] == pytest.approx(np.log(2))  # w = 0
        sel = [r for r in rows if r["scheme"] == name and r["round"] >= 0]
        assert len(sel) == 4
        assert sel[-1]["loss"] < sel[0]["loss"] < np.log(2)  # descending from w = 0
        assert all(np.isclose(r["loss"], r["loss_logged"], rtol=1e-6) for r in sel)
        assert sel[-1]["accuracy"] > 0.8
    assert set(head) >= {"partial", "original", "uncoded", "ignore-stragglers"}
    # every exactly decoding scheme follows the same loss path round by round
    paths = {n: [r["loss"] for r in rows if r["scheme"] == n] for n in
             ("partial", "original", "uncoded")}
    assert np.allclose(paths["partial"], paths["original"], rtol=1e-9)
    assert np.allclose(paths["uncoded"], paths["original"], rtol=1e-9)
    assert head["partial"]["reached_target"] == "1/1"


def test_approx_training_quick_live_real_data(tmp_path: Path) -> None:
    """Live approximate rounds (deadline 12 ms at K=2) on the shipped breast-cancer data, four
    schemes: every one logs a loss each round and moves it down from log 2 (w = 0); the
    reference is exact GD on the same task. No timing is asserted."""
    head = run_experiment("approx-training", tmp_path, quick=True, seed=1)
    rows = read_csv(tmp_path / "approx-training.csv")
    assert {r["scheme"] for r in rows} == {"partial", "original", "uncoded",
                                            "ignore-stragglers"}
    assert {r["task"] for r in rows} == {"logreg:breast-cancer"}
    for name in ("partial", "original", "uncoded", "ignore-stragglers"):
        sel = [r for r in rows if r["scheme"] == name]
        assert sel[0]["round"] == -1 and sel[0]["loss"] == pytest.approx(np.log(2))
        done = [r for r in sel if r["round"] >= 0]
        assert [r["round"] for r in done] == [0, 1, 2, 3]
        assert {r["status"] for r in done} <= {"exact", "approximate", "failed"}
        # every round says why it ended, with a code of the closed vocabulary
        assert all(EndReason.parse(r["end_reason"]) for r in done)
        assert all(np.isfinite(r["loss"]) for r in done)
        assert done[-1]["loss"] < np.log(2)
        assert [r["t_s"] for r in done] == sorted(r["t_s"] for r in done)
    cell = head["T=0.012"]
    assert cell["exact_gd_final_loss"] < np.log(2)
    assert set(cell) >= {"partial", "original", "uncoded", "ignore-stragglers"}
    for name in ("partial", "original", "uncoded", "ignore-stragglers"):
        sel = [r for r in rows if r["scheme"] == name and r["round"] >= 0]
        # the summary's tallies are the CSV's: every round once, failed ones by reason
        assert sum(cell[name]["end_reasons"].values()) == len(sel)
        assert sum(cell[name]["failed_reasons"].values()) == sum(
            r["status"] == "failed" for r in sel)
    assert (tmp_path / "approx-training.png").is_file()


def test_live_vs_sim_quick_runs_and_itemises(tmp_path: Path) -> None:
    """Loopback run (coroutines) vs the simulator on one schedule: files and bookkeeping only
    (no wall-clock thresholds)."""
    head = run_experiment("live-vs-sim", tmp_path, quick=True, seed=1)
    rows = _rows(tmp_path / "live-vs-sim.csv")
    assert {r["scheme"] for r in rows} == {"partial", "original"}
    assert {r["loop"] for r in rows} == {"asyncio", "uvloop"}
    for name in ("partial|asyncio", "original|asyncio", "partial|uvloop", "original|uvloop"):
        h = head[name]
        assert h["rounds"] == 10
        assert h["sim_mean_s"] > 0 and h["live_mean_s"] > 0
    for r in rows:
        parts = (float(r["compute_overrun_s"]) + float(r["control_s"]) + float(r["collect_s"]))
        assert float(r["gap_s"]) == pytest.approx(parts, rel=1e-4, abs=1e-8)  # CSV: 6 digits


# ------------------------------------------------------------------------------ plumbing


def test_unknown_experiment_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        run_experiment("nope", tmp_path)
    with pytest.raises(ConfigError):
        run_experiment("exact-speedup", tmp_path, seed=-1)


def test_replot_needs_only_the_csv(tmp_path: Path) -> None:
    run_experiment("poly-digits", tmp_path, quick=True, seed=1)
    png = tmp_path / "poly-digits.png"
    png.unlink()
    (tmp_path / "poly-digits.json").unlink()
    assert replot("poly-digits", tmp_path) == png
    assert png.stat().st_size > 0
    head = refresh("poly-digits", tmp_path)  # headline back from the CSV alone
    assert _meta(tmp_path, "poly-digits")["headline"] == json.loads(json.dumps(head))
    assert head["digits_for_1e-6"]


def test_every_experiment_is_documented() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "experiments.md").read_text()
    for name in EXPERIMENTS:
        assert f"aiogc experiment {name}" in doc, name
    assert set(NEW_FIVE) <= set(EXPERIMENTS)


@pytest.mark.parametrize("assignment", ["cyclic", "regular"])
def test_round_times_do_not_depend_on_b(assignment: str) -> None:
    """exact-speedup, latency and ordering build the partial scheme with the cheap Gaussian B
    where only round times matter; that is sound only if B does not change them."""
    from aiogc.coding import SchemeChoices, make_scheme
    from aiogc.experiments._common import code_rng
    from aiogc.sim.fast import exact_times
    from aiogc.training.delays import materialise

    sched = materialise("exp:1.0", rounds=100, m=20, max_chunks=4, seed=3)
    for ell in (2, 3):
        t = [exact_times(make_scheme("partial", m=20, delta=4, n_parts=ell,
                                     assignment=assignment,
                                     choices=SchemeChoices(decoding=dec),
                                     rng=code_rng(1, 2)), sched)[1]
             for dec in ("frame", "gaussian")]
        assert np.array_equal(t[0], t[1])


def test_breast_cancer_task_is_the_documented_file() -> None:
    """The shipped real data set: the bytes whose provenance aiogc/data/README.md records."""
    import hashlib
    import importlib.resources

    from aiogc.training.datasets import load_breast_cancer
    from aiogc.training.tasks import make_task

    raw = importlib.resources.files("aiogc").joinpath("data", "breast_cancer.csv").read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    readme = (Path(__file__).resolve().parents[1] / "aiogc" / "data" / "README.md").read_text()
    assert digest in readme
    X, y = load_breast_cancer()
    assert X.shape == (569, 30) and y.shape == (569,)
    assert int((y == 0).sum()) == 212 and int((y == 1).sum()) == 357
    assert np.allclose(X.mean(axis=0), 0, atol=1e-12) and np.allclose(X.std(axis=0), 1)
    t = make_task("logreg:breast-cancer", 8, 1)
    assert t.spec == "logreg:breast-cancer" and t.dim == 31  # 30 features + bias
    assert make_task(t.spec, 8, 1).loss(t.initial_model()) == t.loss(t.initial_model())


def test_rerun_reproduces_the_csv_exactly(tmp_path: Path) -> None:
    """Deterministic experiments (everything but the live halves): same seed, same bytes,
    intervals included (the bootstrap is seeded too)."""
    run_experiment("exact-speedup", tmp_path / "a", quick=True, seed=3)
    run_experiment("exact-speedup", tmp_path / "b", quick=True, seed=3)
    a = (tmp_path / "a" / "exact-speedup.csv").read_bytes()
    assert a == (tmp_path / "b" / "exact-speedup.csv").read_bytes()
    run_experiment("exact-speedup", tmp_path / "c", quick=True, seed=4)
    assert a != (tmp_path / "c" / "exact-speedup.csv").read_bytes()


def test_without_matplotlib_the_csv_and_json_stand_and_it_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    run_experiment("poly-digits", tmp_path, quick=True, seed=1)
    assert (tmp_path / "poly-digits.csv").stat().st_size > 0
    assert not (tmp_path / "poly-digits.png").exists()
    assert _meta(tmp_path, "poly-digits")["png"] is None
    assert "figure skipped" in capsys.readouterr().err


def test_breast_cancer_is_a_builtin_task_for_remote_workers() -> None:
    """It ships inside the package, so a worker may build it from the PS's config like
    logreg:builtin (no file path, no code from the wire)."""
    from aiogc.training.setup import TaskPolicy
    from aiogc.training.tasks import task_kind

    assert task_kind("logreg:breast-cancer") == ("logreg-builtin", None)
    TaskPolicy().check("logreg:breast-cancer")  # raises TaskNotAllowed otherwise
