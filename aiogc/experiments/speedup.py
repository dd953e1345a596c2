"""``exact-speedup``: exact-mode round time vs ℓ, partial vs original, over code instances."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from aiogc.coding import make_scheme
from aiogc.experiments._common import (
    Experiment,
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

SPEEDUP_DELAYS = ("exp:1.0", "pareto:2.5", "straggle:0.2,5,exp:1.0")
ASSIGNMENTS = ("cyclic", "regular")


def grid(quick: bool) -> dict[str, Any]:
    if quick:
        return {"m": 20, "delta": 4, "instances": 2, "trials": 150}
    return {"m": 40, "delta": 6, "instances": 5, "trials": 1000}


def compute(quick: bool, seed: int) -> list[Row]:
    from aiogc.sim.fast import exact_times

    g = grid(quick)
    m, delta, C, R = g["m"], g["delta"], g["instances"], g["trials"]
    rows: list[Row] = []
    tick = cells(len(ASSIGNMENTS) * len(SPEEDUP_DELAYS) * (delta - 1))
    for a_i, assignment in enumerate(ASSIGNMENTS):
        for d_i, delay in enumerate(SPEEDUP_DELAYS):
            for ell in range(1, delta):
                ends: dict[str, np.ndarray] = {"partial": np.empty((C, R)),
                                               "original": np.empty((C, R))}
                for c in range(C):
                    sched = materialise(delay, rounds=R, m=m, max_chunks=delta,
                                        seed=delay_seed(seed, c))
                    for name in ends:
                        # Round times depend on the assignment and the orders only, not on
                        # B (B is drawn after the orders from the same generator), so the cheap
                        # Gaussian B gives the same times as the frame search at ~1/100 the cost.
                        s = make_scheme(name, m=m, delta=delta, n_parts=ell,
                                        assignment=assignment, decoding="gaussian",
                                        rng=code_rng(seed, c))
                        ends[name][c] = exact_times(s, sched)[1]
                rng = boot_rng(seed, a_i, d_i, ell)
                sp, sp_lo, sp_hi = ratio_of_means_ci(ends["original"], ends["partial"], rng=rng)
                base = {"assignment": assignment, "delay": delay, "m": m, "delta": delta,
                        "ell": ell, "instances": C, "trials": R}
                for name, e in ends.items():
                    mu, lo, hi = mean_ci(e, rng=rng)
                    rows.append({**base, "scheme": name, "completion_mean": mu,
                                 "completion_lo": lo, "completion_hi": hi,
                                 "completion_sd": float(e.std(ddof=1)),
                                 "instance_speedup_min": float(np.min(
                                     ends["original"].mean(axis=1)
                                     / ends["partial"].mean(axis=1))),
                                 "instance_speedup_max": float(np.max(
                                     ends["original"].mean(axis=1)
                                     / ends["partial"].mean(axis=1))),
                                 "speedup": sp, "speedup_lo": sp_lo, "speedup_hi": sp_hi,
                                 "partial_faster_frac": float(np.mean(
                                     ends["original"] >= ends["partial"]))})
                tick()
    return rows


def plot(rows: list[Row], path: Path) -> None:
    p = plt()
    fig, axes = p.subplots(2, 3, figsize=(9, 5.2), sharex=True)
    for a, assignment in enumerate(ASSIGNMENTS):
        for d, delay in enumerate(SPEEDUP_DELAYS):
            ax = axes[a, d]
            for name, color in (("partial", "C0"), ("original", "C3")):
                sel = select(rows, assignment=assignment, delay=delay, scheme=name)
                band(ax, [r["ell"] for r in sel], [r["completion_mean"] for r in sel],
                     [r["completion_lo"] for r in sel], [r["completion_hi"] for r in sel],
                     label=name, color=color)
            sel = select(rows, assignment=assignment, delay=delay, scheme="partial")
            lo = min(r["speedup_lo"] for r in sel)
            hi = max(r["speedup_hi"] for r in sel)
            ax.set_title(f"{assignment}, {delay}\nspeedup {lo:.2f}-{hi:.2f}x (95% CIs)")
            ax.set_xlabel("ℓ")
            if d == 0:
                ax.set_ylabel("mean completion time (s)")
            ax.legend()
    r0 = rows[0]
    fig.suptitle(f"Exact recovery: round time vs ℓ (m={r0['m']}, δ={r0['delta']}, "
                 f"{r0['instances']} code instances × {r0['trials']} trials; band: 95% "
                 "cluster-bootstrap CI of the mean)")
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
    }


EXPERIMENT = Experiment(
    "exact-speedup", compute, plot, summarise,
    "cyclic + regular, delays exp:1.0 / pareto:2.5 / straggle:0.2,5,exp:1.0, m=40, δ=6, "
    "ℓ=1..5, 5 code instances x 1000 trials (quick: m=20, δ=4, 2 x 150)")
