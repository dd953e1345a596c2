"""``approx-mse`` and ``approx-tails``: MSE at a deadline T, over code instances and trials.

The MSE of one trial is ``||ĝ-g||²/||g||²`` with i.i.d. Gaussian chunk gradients, encoded and
decoded by the schemes' own code (:func:`aiogc.sim.fast.mse_of_states`). A code instance is one
draw of the scheme's randomness (Tandon's H at ℓ=1, the partial scheme's B, the assignment for
random assignments) with its own delay schedule and gradient stream.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    mse_floor,
    plt,
    ratio_of_means_ci,
    save,
    select,
)
from aiogc.training.delays import materialise

DIM = 120


#: every scheme, in the order of the figures' legends
ALL_SCHEMES = ("partial", "original", "uncoded", "stream-chunks", "ignore-stragglers")
#: schemes whose result does not depend on ℓ (computed once per delay law and instance)
_ELL_FREE = ("uncoded", "stream-chunks", "ignore-stragglers")


def _scheme(name: str, m: int, delta: int, ell: int, seed: int, c: int) -> Any:
    if name == "ignore-stragglers":  # as aiogc run builds it: ℓ = 1, waits for m - δ + 1
        return make_scheme(name, m=m, delta=delta, n_parts=1, k=m - delta + 1)
    if name in _ELL_FREE:
        return make_scheme(name, m=m, delta=delta, n_parts=1, rng=code_rng(seed, c))
    return make_scheme(name, m=m, delta=delta, n_parts=ell, rng=code_rng(seed, c))


@dataclass(frozen=True)
class _MseGrid:
    """What every (ℓ, delay) cell of an MSE sweep shares: m workers, δ, the deadlines T, the
    schemes, C code instances of R trials each, the seed."""

    m: int
    delta: int
    deadlines: list[float]
    schemes: tuple[str, ...]
    instances: int
    trials: int
    seed: int


_Samples = dict[tuple[float, str], np.ndarray]


def _mse_samples(grid: _MseGrid, names: tuple[str, ...], *, ell: int, delay: str
                 ) -> tuple[_Samples, _Samples]:
    """MSE and exactness (C, R) of every (T, scheme) for ``names`` at ``ell``."""
    from aiogc.sim.fast import mse_of_states, outcomes

    m, delta, C, R, seed = grid.m, grid.delta, grid.instances, grid.trials, grid.seed
    mse = {(T, n): np.empty((C, R)) for T in grid.deadlines for n in names}
    exact = {(T, n): np.empty((C, R), dtype=bool) for T in grid.deadlines for n in names}
    for c in range(C):
        sched = materialise(delay, rounds=R, m=m, max_chunks=delta, seed=delay_seed(seed, c))
        for n in names:
            s = _scheme(n, m, delta, ell, seed, c)
            for T in grid.deadlines:
                _, _, status, states = outcomes(s, sched, mode="approx", deadline_s=T)
                mse[T, n][c] = mse_of_states(s, states, seed=delay_seed(seed, c), dim=DIM)
                exact[T, n][c] = status == "exact"
    return mse, exact


def _mse_cell(grid: _MseGrid, *, ell: int, delay: str, key: tuple[int, ...],
              shared: tuple[_Samples, _Samples] | None = None) -> list[Row]:
    """Rows for every (T, scheme) of one (ℓ, delay) cell: mean MSE with CI, the
    original/partial MSE ratio with CI, and every scheme's ratio to partial with CI.

    ``shared``: samples of the ℓ-free schemes already computed for this delay law."""
    m, delta, deadlines, schemes = grid.m, grid.delta, grid.deadlines, grid.schemes
    C, R, seed = grid.instances, grid.trials, grid.seed
    base: Row = {"m": m, "delta": delta, "dim": DIM}
    own = tuple(n for n in schemes if shared is None or (deadlines[0], n) not in shared[0])
    mse, exact = _mse_samples(grid, own, ell=ell, delay=delay)
    if shared is not None:
        mse.update({k: v for k, v in shared[0].items() if k[1] in schemes})
        exact.update({k: v for k, v in shared[1].items() if k[1] in schemes})
    rows: list[Row] = []
    for t_i, T in enumerate(deadlines):
        rng = boot_rng(seed, *key, t_i)
        ratio = ratio_of_means_ci(mse[T, "original"], mse[T, "partial"], rng=rng)
        for n in schemes:
            x = mse[T, n]
            mu, lo, hi = mean_ci(x, rng=rng)
            inst = x.mean(axis=1)
            vs = ratio_of_means_ci(x, mse[T, "partial"], rng=rng)
            rows.append({**base, "ell": ell, "delay": delay, "deadline": T, "scheme": n,
                         "instances": C, "trials": R, "mse_mean": mu, "mse_lo": lo,
                         "mse_hi": hi, "mse_median": float(np.median(x)),
                         "mse_instance_min": float(inst.min()),
                         "mse_instance_max": float(inst.max()),
                         "exact_fraction": float(exact[T, n].mean()),
                         "ratio_orig_over_partial": ratio[0], "ratio_lo": ratio[1],
                         "ratio_hi": ratio[2], "over_partial": vs[0],
                         "over_partial_lo": vs[1], "over_partial_hi": vs[2]})
    return rows


def _plot_cells(rows: list[Row], path: Path, panels: list[tuple[str, dict[str, Any]]],
                title: str) -> None:
    p = plt()
    fig, axes = p.subplots(1, len(panels), figsize=(3 * len(panels), 3.2), sharey=True,
                           squeeze=False)
    colors = {"partial": "C0", "original": "C3", "ignore-stragglers": "C1", "uncoded": "C7",
              "stream-chunks": "C2"}
    for ax, (label, eq) in zip(axes[0], panels, strict=True):
        for n, color in colors.items():
            sel = select(rows, scheme=n, **eq)
            if not sel:
                continue
            band(ax, [r["deadline"] for r in sel], [r["mse_mean"] for r in sel],
                 [max(r["mse_lo"], 1e-33) for r in sel], [r["mse_hi"] for r in sel],
                 label=n, color=color)
        ax.set_yscale("log")
        ax.set_title(label)
        ax.set_xlabel("deadline T (s)")
        ax.legend()
    mse_floor(axes[0, 0], [r["mse_mean"] for r in rows])  # shared y axis
    axes[0, 0].set_ylim(top=2.0)
    axes[0, 0].set_ylabel("mean MSE  ||ĝ-g||²/||g||²")
    fig.suptitle(title)
    save(fig, path)


def _ratio_table(rows: list[Row], keys: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in select(rows, scheme="partial"):
        o = next(x for x in rows if x["scheme"] == "original"
                 and all(x[k] == r[k] for k in (*keys, "deadline")))
        label = ",".join(f"{k}={r[k]}" for k in keys) + f",T={r['deadline']}"
        out[label] = {"partial": r["mse_mean"], "partial_ci": [r["mse_lo"], r["mse_hi"]],
                      "original": o["mse_mean"], "original_ci": [o["mse_lo"], o["mse_hi"]],
                      "ratio": r["ratio_orig_over_partial"],
                      "ratio_ci": [r["ratio_lo"], r["ratio_hi"]],
                      "partial_exact_fraction": r["exact_fraction"]}
    return out


# ------------------------------------------------------------------------------ approx-mse


def mse_grid(quick: bool) -> dict[str, Any]:
    if quick:
        return {"m": 20, "delta": 4, "instances": 2, "trials": 40,
                "deadlines": [1.0, 2.0, 4.0]}
    return {"m": 20, "delta": 4, "instances": 20, "trials": 300,
            "deadlines": [0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]}


def mse_compute(quick: bool, seed: int) -> list[Row]:
    g = mse_grid(quick)
    rows: list[Row] = []
    grid = _MseGrid(m=g["m"], delta=g["delta"], deadlines=g["deadlines"],
                    schemes=ALL_SCHEMES, instances=g["instances"], trials=g["trials"],
                    seed=seed)
    shared = _mse_samples(grid, _ELL_FREE, ell=1, delay="exp:1.0")
    tick = cells(3)
    for ell in (1, 2, 3):
        rows += _mse_cell(grid, ell=ell, delay="exp:1.0", key=(ell,), shared=shared)
        tick(rows)
    return rows


def mse_plot(rows: list[Row], path: Path) -> None:
    r0 = rows[0]
    _plot_cells(rows, path, [(f"ℓ={e} (s={r0['delta'] - e} for original)", {"ell": e})
                             for e in (1, 2, 3)],
                f"Approximate recovery (cyclic m={r0['m']}, δ={r0['delta']}, exp:1.0, "
                f"d={r0['dim']}, {r0['instances']} code instances × {r0['trials']} trials; "
                "band: 95% CI)")


def mse_summarise(rows: list[Row]) -> dict[str, Any]:
    r0 = rows[0]
    return {"m": r0["m"], "delta": r0["delta"], "instances": r0["instances"],
            "trials": r0["trials"], "mse": _ratio_table(rows, ("ell",)),
            "baselines": _baseline_table(rows)}


def _baseline_table(rows: list[Row]) -> dict[str, Any]:
    """Per (ℓ, T): each scheme's mean MSE and its ratio to partial ``[est, lo, hi]`` (> 1:
    partial is better), and which scheme has the lowest mean."""
    out: dict[str, Any] = {}
    for r in select(rows, scheme="partial"):
        cell = {x["scheme"]: [x["mse_mean"], x["over_partial"], x["over_partial_lo"],
                              x["over_partial_hi"]]
                for x in rows if x["ell"] == r["ell"] and x["deadline"] == r["deadline"]}
        # MSEs under 1e-20 are exact decodes at round-off: equal, whatever their digits
        floor = {n: (v[0] if v[0] > 1e-20 else 0.0) for n, v in cell.items()}
        low = min(floor.values())
        out[f"ell={r['ell']},T={r['deadline']}"] = {
            **cell, "lowest": [n for n, v in floor.items() if v <= low * (1 + 1e-9)]}
    return out


APPROX_MSE = Experiment(
    "approx-mse", mse_compute, mse_plot, mse_summarise,
    "cyclic m=20, δ=4, ℓ∈{1,2,3}, exp:1.0, T∈{0.5,1,2,3,4,5,6}, d=120; partial, original, "
    "uncoded, stream-chunks, ignore-stragglers; 20 code instances x 300 trials (quick: 2 x 40, "
    "T∈{1,2,4})")


# ------------------------------------------------------------------------------ approx-tails

TAIL_DELAYS = ("pareto:1.5", "pareto:2.0", "straggle:0.2,5,exp:1.0", "fail:0.1,exp:1.0",
               "fail:0.1,straggle:0.2,5,exp:1.0")
TAIL_SCHEMES = ("partial", "original", "ignore-stragglers")


def tails_grid(quick: bool) -> dict[str, Any]:
    if quick:
        return {"m": 20, "delta": 4, "ell": 2, "instances": 2, "trials": 30,
                "deadlines": [2.0, 4.0], "delays": TAIL_DELAYS}
    # 20 code instances (4 under-covered: the cluster bootstrap needs enough instances to
    # see the spread between them), 200 trials each for the rare-event means at large T
    return {"m": 20, "delta": 4, "ell": 2, "instances": 20, "trials": 200,
            "deadlines": [1.0, 2.0, 3.0, 4.0, 6.0, 8.0], "delays": TAIL_DELAYS}


def tails_compute(quick: bool, seed: int) -> list[Row]:
    g = tails_grid(quick)
    rows: list[Row] = []
    grid = _MseGrid(m=g["m"], delta=g["delta"], deadlines=g["deadlines"],
                    schemes=TAIL_SCHEMES, instances=g["instances"], trials=g["trials"],
                    seed=seed)
    tick = cells(len(g["delays"]))
    for d_i, delay in enumerate(g["delays"]):
        rows += _mse_cell(grid, ell=g["ell"], delay=delay, key=(100 + d_i,))
        tick(rows)
    return rows


def tails_plot(rows: list[Row], path: Path) -> None:
    r0 = rows[0]
    delays = list(dict.fromkeys(r["delay"] for r in rows))
    _plot_cells(rows, path, [(d.replace(",straggle", ",\nstraggle"), {"delay": d})
                             for d in delays],
                f"Approximate recovery under heavy tails, persistent stragglers and failures "
                f"(cyclic m={r0['m']}, δ={r0['delta']}, ℓ={r0['ell']}, {r0['instances']} "
                f"instances × {r0['trials']} trials; band: 95% CI)")


def tails_summarise(rows: list[Row]) -> dict[str, Any]:
    r0 = rows[0]
    return {"m": r0["m"], "delta": r0["delta"], "ell": r0["ell"], "instances": r0["instances"],
            "trials": r0["trials"], "mse": _ratio_table(rows, ("delay",)),
            "partial_lowest_everywhere": all(
                r["mse_mean"] <= min(x["mse_mean"] for x in rows if x["delay"] == r["delay"]
                                     and x["deadline"] == r["deadline"])
                for r in select(rows, scheme="partial"))}


APPROX_TAILS = Experiment(
    "approx-tails", tails_compute, tails_plot, tails_summarise,
    "cyclic m=20, δ=4, ℓ=2; pareto:1.5, pareto:2.0, straggle:0.2,5,exp:1.0, fail:0.1,exp:1.0, "
    "fail:0.1,straggle:0.2,5,exp:1.0; partial / original / ignore-stragglers; "
    "T∈{1,2,3,4,6,8}; 20 instances x 200 trials (quick: 2 x 30, T∈{2,4})")
