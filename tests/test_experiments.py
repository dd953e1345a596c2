"""The experiments on their quick grids: files written, headline claims on the quick grid."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from aiogc.errors import ConfigError
from aiogc.experiments import run_experiment


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def test_exact_speedup_partial_faster_in_every_cell(tmp_path: Path) -> None:
    head = run_experiment("exact-speedup", tmp_path, quick=True, seed=1)
    assert head["partial_faster_every_cell"]
    rows = _rows(tmp_path / "exact-speedup.csv")
    assert (tmp_path / "exact-speedup.png").stat().st_size > 0
    cells: dict[tuple[str, str, str], dict[str, float]] = {}
    for r in rows:
        key = (r["assignment"], r["delay"], r["ell"])
        cells.setdefault(key, {})[r["scheme"]] = float(r["completion_mean"])
    assert len(cells) == 2 * 3 * 3
    for key, c in cells.items():
        assert c["partial"] < c["original"], key


def test_approx_mse_partial_lower_everywhere(tmp_path: Path) -> None:
    head = run_experiment("approx-mse", tmp_path, quick=True, seed=1)
    for cell in head["mse"].values():
        assert cell["partial"] < cell["original"]
    assert (tmp_path / "approx-mse.png").exists()


def test_ordering_optimal_q_max_never_worse(tmp_path: Path) -> None:
    head = run_experiment("ordering", tmp_path, quick=True, seed=1)
    for cell in head.values():
        q = cell["q_max"]
        assert q["optimal"] <= q["random"] and q["optimal"] <= q["natural"]
        assert q["optimal"] <= cell["q_max_random50_mean"]


def test_stability_partial_frame_is_accurate(tmp_path: Path) -> None:
    run_experiment("stability", tmp_path, quick=True, seed=1)
    rows = _rows(tmp_path / "stability.csv")
    for r in rows:
        if r["scheme"] == "partial-frame":
            tol = 1e-12 if r["dtype"] == "float64" else 1e-5
            assert float(r["rel_error_max"]) < tol
    big = [r for r in rows if r["scheme"] == "original-polynomial" and r["dtype"] == "float64"]
    errs = [float(r["rel_error_mean"]) for r in sorted(big, key=lambda r: int(r["m"]))]
    assert errs[-1] > 100 * errs[0]  # Vandermonde decoding degrades with m


def test_unknown_experiment_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        run_experiment("nope", tmp_path)


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
