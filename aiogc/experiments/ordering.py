"""``ordering``: optimal vs random vs natural chunk order, on three assignment families.

Q_max for every ℓ, exact completion time for every ℓ, and the MSE at a deadline for
ℓ ∈ {1, 2, 3}, each over several code instances (assignment draw for ``regular``; the order
draw for ``random``; B for ℓ > 1). Within one instance all three orderings share the
assignment (checked), so differences come from the ordering alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aiogc.coding import SchemeChoices, make_scheme, q_max, random_order
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

ORDERINGS = ("optimal", "random", "natural")
FAMILIES = ("regular", "cyclic", "fr")
MSE_ELLS = (1, 2, 3)


def grid(quick: bool) -> dict[str, Any]:
    if quick:
        return {"sizes": [(20, 4)], "instances": 2, "trials": 100, "mse_trials": 20,
                "deadline_fracs": [0.5, 1.0], "random_draws": 10}
    # 20 code instances (4 under-covered) sharing the former 4-instance trial totals per cell
    # (4 x 500 -> 20 x 100, 4 x 100 -> 20 x 20): the same cost, a bootstrap that sees the
    # spread between instances
    return {"sizes": [(20, 4), (40, 8)], "instances": 20, "trials": 100, "mse_trials": 20,
            "deadline_fracs": [0.25, 0.5, 0.75, 1.0, 1.25], "random_draws": 50}


@dataclass
class _Samples:
    """Per-trial samples of one (family, m, δ) cell: instance index first."""

    qm: dict[tuple[int, str], np.ndarray]  # (ell, order) -> (C,) Q_max
    q_draws: dict[int, np.ndarray]  # ell -> (C,) mean Q_max of the extra random draws
    end: dict[tuple[int, str], np.ndarray]  # (ell, order) -> (C, R) exact completion times
    mse: dict[tuple[int, float, str], np.ndarray]  # (ell, T, order) -> (C, Rm) MSE


def _instance(s: _Samples, c: int, family: str, m: int, delta: int, g: dict[str, Any],
              seed: int, deadlines: list[float]) -> None:
    """Fill instance ``c`` of ``s``: every ℓ and ordering on one assignment draw."""
    from aiogc.sim.fast import exact_times, mse_of_states, outcomes

    sched = materialise("exp:1.0", rounds=g["trials"], m=m, max_chunks=delta,
                        seed=delay_seed(seed, c))
    sub = materialise("exp:1.0", rounds=g["mse_trials"], m=m, max_chunks=delta,
                      seed=delay_seed(seed, c))
    A = None
    for ell in range(1, delta + 1):
        for o in ORDERINGS:
            # the frame B only where the MSE needs it; times do not depend on B
            sch: Any = make_scheme("partial", m=m, delta=delta, n_parts=ell,
                                   assignment=family, choices=SchemeChoices(
                                       ordering=o,
                                       decoding="frame" if ell in MSE_ELLS else "gaussian"),
                                   rng=code_rng(seed, c))
            A = sch.A if A is None else A
            if not np.array_equal(A, sch.A):  # one assignment per instance, whatever the order
                raise AssertionError("orderings did not share the assignment")
            s.qm[ell, o][c] = sch.q_max()
            s.end[ell, o][c] = exact_times(sch, sched)[1]
            if o == "random":
                s.q_draws[ell][c] = np.mean([q_max(sch.A, random_order(
                    sch.A, np.random.default_rng([seed, 77, c, t])), ell)
                    for t in range(g["random_draws"])])
            for T in deadlines if ell in MSE_ELLS else []:
                states = outcomes(sch, sub, mode="approx", deadline_s=T)[3]
                s.mse[ell, T, o][c] = mse_of_states(sch, states, seed=delay_seed(seed, c))


def _cell(family: str, m: int, delta: int, g: dict[str, Any], seed: int, key: int
          ) -> list[Row]:
    C, R, Rm = g["instances"], g["trials"], g["mse_trials"]
    deadlines = [delta * f for f in g["deadline_fracs"]]
    ells = range(1, delta + 1)
    s = _Samples({(e, o): np.empty(C) for e in ells for o in ORDERINGS},
                 {e: np.empty(C) for e in ells},
                 {(e, o): np.empty((C, R)) for e in ells for o in ORDERINGS},
                 {(e, T, o): np.empty((C, Rm)) for e in MSE_ELLS for T in deadlines
                  for o in ORDERINGS})
    for c in range(C):
        _instance(s, c, family, m, delta, g, seed, deadlines)
    rows: list[Row] = []
    base = {"family": family, "m": m, "delta": delta, "instances": C}
    for ell in ells:
        rng = boot_rng(seed, key, ell)
        for o in ORDERINGS:
            mu, lo, hi = mean_ci(s.end[ell, o], rng=rng)
            gain = ratio_of_means_ci(s.end[ell, "random"], s.end[ell, o], rng=rng)
            rows.append({**base, "kind": "exact", "ell": ell, "ordering": o, "trials": R,
                         "q_max_mean": float(s.qm[ell, o].mean()),
                         "q_max_min": int(s.qm[ell, o].min()),
                         "q_max_max": int(s.qm[ell, o].max()),
                         "q_max_random_draws_mean": float(s.q_draws[ell].mean()),
                         "completion_mean": mu, "completion_lo": lo, "completion_hi": hi,
                         "random_over_this": gain[0], "random_over_this_lo": gain[1],
                         "random_over_this_hi": gain[2]})
    for ell in MSE_ELLS:
        for t_i, T in enumerate(deadlines):
            rng = boot_rng(seed, key, 100 + ell, t_i)
            for o in ORDERINGS:
                mu, lo, hi = mean_ci(s.mse[ell, T, o], rng=rng)
                gain = ratio_of_means_ci(s.mse[ell, T, "random"], s.mse[ell, T, o], rng=rng)
                rows.append({**base, "kind": "mse", "ell": ell, "ordering": o,
                             "trials": Rm, "deadline": T, "mse_mean": mu, "mse_lo": lo,
                             "mse_hi": hi, "random_over_this": gain[0],
                             "random_over_this_lo": gain[1], "random_over_this_hi": gain[2]})
    return rows


def compute(quick: bool, seed: int) -> list[Row]:
    g = grid(quick)
    rows: list[Row] = []
    tick = cells(len(g["sizes"]) * len(FAMILIES))
    for s_i, (m, delta) in enumerate(g["sizes"]):
        for f_i, family in enumerate(FAMILIES):
            rows += _cell(family, m, delta, g, seed, 10 * s_i + f_i)
            tick(rows)
    return rows


COLORS = {"optimal": "C0", "random": "C1", "natural": "C2"}


def plot(rows: list[Row], path: Path) -> None:
    p = plt()
    panels = list(dict.fromkeys((r["m"], r["delta"], r["family"]) for r in rows))
    ncol = 2 + len(MSE_ELLS)
    fig, axes = p.subplots(len(panels), ncol, figsize=(2.4 * ncol, 2.3 * len(panels)),
                           squeeze=False)
    for a, (m, delta, family) in enumerate(panels):
        for o, color in COLORS.items():
            ex = select(rows, m=m, delta=delta, family=family, ordering=o, kind="exact")
            ells = [r["ell"] for r in ex]
            axes[a, 0].plot(ells, [r["q_max_mean"] for r in ex], marker="o", ms=3,
                            color=color, label=o)
            band(axes[a, 1], ells, [r["completion_mean"] for r in ex],
                 [r["completion_lo"] for r in ex], [r["completion_hi"] for r in ex],
                 color=color, label=o)
            for k, ell in enumerate(MSE_ELLS):
                ms = select(rows, m=m, delta=delta, family=family, ordering=o, kind="mse",
                            ell=ell)
                band(axes[a, 2 + k], [r["deadline"] for r in ms], [r["mse_mean"] for r in ms],
                     [max(r["mse_lo"], 1e-33) for r in ms], [r["mse_hi"] for r in ms],
                     color=color, label=o)
        axes[a, 0].set_title(f"{family} m={m}, δ={delta}: Q_max")
        axes[a, 1].set_title("exact completion (s)")
        axes[a, 0].set_xlabel("ℓ")
        axes[a, 1].set_xlabel("ℓ")
        for k, ell in enumerate(MSE_ELLS):
            axes[a, 2 + k].set_yscale("log")
            mse_floor(axes[a, 2 + k], [r["mse_mean"] for r in select(
                rows, m=m, delta=delta, family=family, kind="mse", ell=ell)])
            axes[a, 2 + k].set_title(f"MSE vs T, ℓ={ell}")
            axes[a, 2 + k].set_xlabel("T (s)")
        axes[a, 0].legend()
    fig.suptitle("Chunk ordering (exp:1.0; band: 95% CI over code instances × trials)")
    save(fig, path)


def summarise(rows: list[Row]) -> dict[str, Any]:
    head: dict[str, Any] = {}
    for r in select(rows, kind="exact"):
        k = f"{r['family']}|m={r['m']}|ell={r['ell']}"
        h = head.setdefault(k, {"q_max": {}, "completion": {}})
        h["q_max"][r["ordering"]] = r["q_max_mean"]
        h["q_max_random_draws_mean"] = r["q_max_random_draws_mean"]
        h["completion"][r["ordering"]] = [r["completion_mean"], r["completion_lo"],
                                          r["completion_hi"]]
        if r["ordering"] == "optimal":
            h["random_over_optimal"] = [r["random_over_this"], r["random_over_this_lo"],
                                        r["random_over_this_hi"]]
    for r in select(rows, kind="mse", ordering="optimal"):
        k = f"{r['family']}|m={r['m']}|ell={r['ell']}"
        head[k].setdefault("mse_random_over_optimal", {})[f"T={r['deadline']}"] = [
            r["random_over_this"], r["random_over_this_lo"], r["random_over_this_hi"]]
    return head


EXPERIMENT = Experiment(
    "ordering", compute, plot, summarise,
    "regular / cyclic / fr assignments, (m, δ) ∈ {(20, 4), (40, 8)}, orderings optimal / "
    "random / natural; Q_max and exact completion for ℓ=1..δ (20 instances x 100 trials), MSE "
    "vs T for ℓ∈{1,2,3} (20 x 20) (quick: (20, 4) only, 2 x 100 and 2 x 20)")
