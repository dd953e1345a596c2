"""``exact-speedup``: exact-mode round time vs ℓ, partial vs every baseline, over code instances.

Partial and original run at every ℓ = 1..δ-1; the ℓ-free baselines (uncoded, stream-chunks,
ignore-stragglers, all at ℓ = 1) once per (assignment, delay) cell and are reported on every ℓ
row of the cell. ignore-stragglers is *approximate* (it waits for m - δ + 1 workers and rescales):
its time is not an exact-recovery time, it is there to show what giving up exactness buys.
Communication is free here (see ``bandwidth`` for the same comparison with a cost per byte).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aiogc.coding import SchemeChoices, make_scheme
from aiogc.experiments._common import (
    CI,
    Experiment,
    Labels,
    Row,
    band,
    boot_rng,
    cells,
    code_rng,
    delay_seed,
    mean_ci,
    plt,
    ratio_of_means_ci,
    save,
    select,
)
from aiogc.training.delays import materialise

__all__ = ["ASSIGNMENTS", "BASELINES", "EXPERIMENT", "SPEEDUP_DELAYS"]

SPEEDUP_DELAYS = ("exp:1.0", "pareto:2.5", "straggle:0.2,5,exp:1.0")
#: cyclic, a random regular (bipartite graph) assignment, fractional repetition
ASSIGNMENTS = ("cyclic", "regular", "fr")
#: the ℓ-free baselines, each compared with partial at every ℓ
BASELINES = ("uncoded", "stream-chunks", "ignore-stragglers")


def grid(quick: bool) -> dict[str, Any]:
    if quick:
        return {"m": 20, "delta": 4, "instances": 2, "trials": 150}
    return {"m": 40, "delta": 6, "instances": 20, "trials": 500}


def _m_for(assignment: str, m: int, delta: int) -> int:
    """Fractional repetition needs δ | m: the next multiple of δ (m = 42 for m = 40, δ = 6)."""
    return -(-m // delta) * delta if assignment == "fr" else m


@dataclass(frozen=True)
class _Cell:
    """One cell of the grid: the cluster, the delay model, and C code instances x R trials."""

    m: int
    delta: int
    assignment: str
    delay: str
    seed: int
    C: int
    R: int


def _times(name: str, ell: int, cell: _Cell) -> np.ndarray:
    """Exact-mode completion times (C, R) of one scheme over C code instances."""
    from aiogc.sim.fast import exact_times

    m, delta, seed, C, R = cell.m, cell.delta, cell.seed, cell.C, cell.R
    assignment, delay = cell.assignment, cell.delay

    out = np.empty((C, R))
    for c in range(C):
        sched = materialise(delay, rounds=R, m=m, max_chunks=delta, seed=delay_seed(seed, c))
        # Round times depend on the assignment and the orders only, not on B (B is drawn
        # after the orders from the same generator), so the cheap Gaussian B gives the same
        # times as the frame search at ~1/100 the cost.
        kw: dict[str, Any] = {"k": m - delta + 1} if name == "ignore-stragglers" else {}
        s = make_scheme(name, m=m, delta=delta, n_parts=ell, assignment=assignment,
                        choices=SchemeChoices(decoding="gaussian"), rng=code_rng(seed, c), **kw)
        out[c] = exact_times(s, sched)[1]
    return out


def compute(quick: bool, seed: int) -> list[Row]:
    g = grid(quick)
    delta, C, R = g["delta"], g["instances"], g["trials"]
    rows: list[Row] = []
    tick = cells(len(ASSIGNMENTS) * len(SPEEDUP_DELAYS) * (delta - 1))
    for a_i, assignment in enumerate(ASSIGNMENTS):
        m = _m_for(assignment, g["m"], delta)
        for d_i, delay in enumerate(SPEEDUP_DELAYS):
            cell = _Cell(m=m, delta=delta, assignment=assignment, delay=delay, seed=seed, C=C,
                         R=R)
            free = {n: _times(n, 1, cell) for n in BASELINES}
            for ell in range(1, delta):
                ends = {n: _times(n, ell, cell) for n in ("partial", "original")}
                ends.update(free)
                rows += _cell_rows(ends, seed=seed, key=(a_i, d_i, ell),
                                   base={"assignment": assignment, "delay": delay, "m": m,
                                         "delta": delta, "ell": ell, "instances": C,
                                         "trials": R})
                tick(rows)
    return rows


def _cell_rows(ends: dict[str, np.ndarray], *, seed: int, key: tuple[int, ...],
               base: Row) -> list[Row]:
    """One row per scheme of a (assignment, delay, ℓ) cell: mean completion with its CI and
    the ratio to partial (``speedup``: original / partial on the partial and original rows,
    the row's scheme / partial on the baselines' rows)."""
    rng = boot_rng(seed, *key)
    part = ends["partial"]
    sp, sp_lo, sp_hi = ratio_of_means_ci(ends["original"], part, rng=rng)
    inst = ends["original"].mean(axis=1) / part.mean(axis=1)
    rows: list[Row] = []
    for name, e in ends.items():
        mu, lo, hi = mean_ci(e, rng=rng)
        vs = (sp, sp_lo, sp_hi) if name in ("partial", "original") else ratio_of_means_ci(
            e, part, rng=rng)
        rows.append({**base, "scheme": name, "completion_mean": mu, "completion_lo": lo,
                     "completion_hi": hi, "completion_sd": float(e.std(ddof=1)),
                     "instance_speedup_min": float(np.min(inst)),
                     "instance_speedup_max": float(np.max(inst)),
                     "speedup": vs[0], "speedup_lo": vs[1], "speedup_hi": vs[2],
                     "partial_faster_frac": float(np.mean(e >= part))})
    return rows


_STYLE = {"partial": ("C0", "-"), "original": ("C3", "-"), "uncoded": ("C7", "--"),
          "stream-chunks": ("C2", "--"), "ignore-stragglers": ("C1", ":")}


def plot(rows: list[Row], path: Path) -> None:
    p = plt()
    assignments = list(dict.fromkeys(r["assignment"] for r in rows))
    fig, axes = p.subplots(len(assignments), 3, figsize=(9, 2.7 * len(assignments)),
                           sharex=True, squeeze=False)
    for a, assignment in enumerate(assignments):
        for d, delay in enumerate(SPEEDUP_DELAYS):
            ax = axes[a, d]
            for name, (color, ls) in _STYLE.items():
                sel = select(rows, assignment=assignment, delay=delay, scheme=name)
                if not sel:
                    continue
                band(ax, [r["ell"] for r in sel], [r["completion_mean"] for r in sel],
                     [r["completion_lo"] for r in sel], [r["completion_hi"] for r in sel],
                     label=name, color=color, ls=ls)
            sel = select(rows, assignment=assignment, delay=delay, scheme="partial")
            lo = min(r["speedup_lo"] for r in sel)
            hi = max(r["speedup_hi"] for r in sel)
            ax.set_title(f"{assignment} (m={sel[0]['m']}), {delay}\nvs original "
                         f"{lo:.2f}-{hi:.2f}x (95% CIs)")
            ax.set_xlabel("ℓ")
            if d == 0:
                ax.set_ylabel("mean completion time (s)")
    axes[0, 0].legend()
    r0 = rows[0]
    fig.suptitle(f"Exact recovery, free communication: round time vs ℓ (δ={r0['delta']}, "
                 f"{r0['instances']} code instances × {r0['trials']} trials)\nband: 95% "
                 "cluster-bootstrap CI; ignore-stragglers is approximate")
    save(fig, path)


def summarise(rows: list[Row]) -> dict[str, Any]:
    part = select(rows, scheme="partial")
    orig = select(rows, scheme="original")
    return {
        "m": rows[0]["m"], "delta": rows[0]["delta"], "instances": rows[0]["instances"],
        "trials": rows[0]["trials"],
        "speedup_min": min(r["speedup"] for r in part),
        "speedup_min_ci": [min(part, key=lambda r: r["speedup"])[k]
                           for k in ("speedup_lo", "speedup_hi")],
        "speedup_max": max(r["speedup"] for r in part),
        "speedup_max_ci": [max(part, key=lambda r: r["speedup"])[k]
                           for k in ("speedup_lo", "speedup_hi")],
        "speedup_median": float(np.median([r["speedup"] for r in part])),
        "partial_faster_every_cell": all(p["completion_mean"] < o["completion_mean"]
                                         for p, o in zip(part, orig, strict=True)),
        "lowest_ci_bound": min(r["speedup_lo"] for r in part),
        "cells": {f"{r['assignment']}|{r['delay']}|ell={r['ell']}":
                  [round(r["speedup"], 3), round(r["speedup_lo"], 3), round(r["speedup_hi"], 3)]
                  for r in part},
        "best": _best_table(rows),
    }


def _best_table(rows: list[Row]) -> dict[str, Any]:
    """Per (assignment, delay): partial and original at their best ℓ, and every baseline;
    ``[mean, lo, hi]`` seconds."""
    out: dict[str, Any] = {}
    for a in dict.fromkeys(r["assignment"] for r in rows):
        for d in dict.fromkeys(r["delay"] for r in rows):
            cell: dict[str, Any] = {}
            for name in _STYLE:
                sel = select(rows, assignment=a, delay=d, scheme=name)
                if not sel:
                    continue
                b = min(sel, key=lambda r: r["completion_mean"])
                cell[name] = [round(b[k], 3) for k in ("completion_mean", "completion_lo",
                                                        "completion_hi")]
                if name in ("partial", "original"):
                    cell[f"{name}_ell"] = b["ell"]
            exact = [n for n in ("original", "uncoded", "stream-chunks") if n in cell]
            # > 1: partial at its best ℓ is faster than every exact baseline at its best
            cell["best_exact_baseline_over_partial"] = round(
                min(cell[n][0] for n in exact) / cell["partial"][0], 3)
            out[f"{a}|{d}"] = cell
    return out


EXPERIMENT = Experiment(
    "exact-speedup", compute, plot, summarise,
    "cyclic, regular and fr (m=42), delays exp:1.0 / pareto:2.5 / straggle:0.2,5,exp:1.0, "
    "m=40, δ=6, ℓ=1..5; partial, original, uncoded, stream-chunks, ignore-stragglers; "
    "20 code instances x 500 trials (quick: m=20, δ=4, 2 x 150)",
    {"cells": Labels(("assignment", "delay", "ℓ"), ("speedup", CI), "x")})
