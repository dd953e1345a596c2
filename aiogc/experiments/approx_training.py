"""``approx-training``: live training with the approximate schemes on real gradients.

Every round ends at the deadline T (``mode="approx"``) or earlier once the PS can decode the
exact gradient; the PS then steps with whatever estimate it has. Four schemes on one shared
delay schedule per seed, live on loopback (PS and workers as coroutines, at time scale K so
that the run keeps its schedule; its own fidelity section says whether it did), on the shipped
Wisconsin breast-cancer data: partial (ℓ=1), the original scheme (Tandon, approximate decoding
from the finished workers), ignore-stragglers (the k fastest, rescaled by N/k at the
deadline) and uncoded (the chunks that arrived, rescaled likewise). The loss is the one the
live PS logged after each step, and every round's end reason (``EndReason`` code) is in the
CSV beside its status; times are emulated seconds (wall / K) since round 0 started.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from aiogc.coding.base import Scheme
from aiogc.config import RunConfig
from aiogc.experiments._common import Experiment, Row, cells, plt, save, select

SCHEMES = ("partial", "original", "uncoded", "ignore-stragglers")
TASK = "logreg:breast-cancer"
COLORS = {"partial": "C0", "original": "C3", "uncoded": "C7", "ignore-stragglers": "C2"}


def grid(quick: bool) -> dict[str, Any]:
    if quick:
        return {"m": 6, "delta": 3, "ell": 1, "delay": "straggle:0.34,4,exp:0.005",
                "deadlines": [0.012], "rounds": 4, "seeds": 1, "time_scale": 2.0,
                "budget_s": 0.04}
    return {"m": 8, "delta": 3, "ell": 1, "delay": "straggle:0.25,4,exp:0.01",
            "deadlines": [0.015, 0.03], "rounds": 60, "seeds": 3, "time_scale": 5.0,
            "budget_s": 0.75}


def exact_gd_losses(cfg: RunConfig, rounds: int) -> list[float]:
    """Loss of exact full-batch gradient descent after 0..``rounds`` steps, same task, start
    and learning rate as the live runs (the reference every approximate scheme chases)."""
    from aiogc.training.tasks import chunk_gradients, make_task

    scheme: Scheme = cfg.build_scheme()
    task: Any = make_task(cfg.task, scheme.n_chunks, cfg.seed, chunk_sizes=cfg.sizes)
    lr = cfg.learning_rate or task.learning_rate
    w = np.asarray(task.initial_model(), dtype=np.float64).copy()
    out = [float(task.loss(w))]
    for _ in range(rounds):
        w = w - lr * chunk_gradients(task, np.arange(scheme.n_chunks), w).sum(axis=0)
        out.append(float(task.loss(w)))
    return out


def compute(quick: bool, seed: int) -> list[Row]:
    from aiogc.harness.local import run_live
    from aiogc.harness.options import RunOptions

    g = grid(quick)
    rows: list[Row] = []
    tick = cells(g["seeds"] * len(g["deadlines"]))
    for k in range(g["seeds"]):
        for T in g["deadlines"]:
            cfg = RunConfig(workers=g["m"], delta=g["delta"], n_parts=g["ell"],
                            rounds=g["rounds"], delay=g["delay"], seed=seed + k, task=TASK,
                            mode="approx", deadline_s=T, time_scale=g["time_scale"],
                            heartbeat_s=None, dead_after_s=None)
            ref = exact_gd_losses(cfg, g["rounds"])
            res = run_live(cfg, list(SCHEMES), RunOptions(mode="coroutines", out_dir=None,
                                                          verify=False))
            fid = res.summary.get("fidelity", {}).get("schemes", {})
            for name in SCHEMES:
                recs = res.records[name]
                t0 = recs[0].t_start
                base = {"seed": seed + k, "deadline_s": T, "scheme": name, "m": g["m"],
                        "delta": g["delta"], "ell": g["ell"], "delay": g["delay"],
                        "task": TASK, "rounds": g["rounds"], "time_scale": g["time_scale"],
                        "fidelity_ratio": fid.get(name, {}).get("ratio", float("nan"))}
                rows.append({**base, "round": -1, "status": "initial", "end_reason": "",
                             "t_s": 0.0, "loss": ref[0], "exact_gd_loss": ref[0],
                             "rel_error": float("nan")})
                for rec in recs:
                    end = rec.t_end if rec.t_end is not None else rec.t_start
                    rows.append({**base, "round": rec.round, "status": rec.status,
                                 "end_reason": _reason(rec.end_reason),
                                 "t_s": end - t0, "loss": rec.loss,
                                 "exact_gd_loss": ref[min(rec.round + 1, len(ref) - 1)],
                                 "rel_error": rec.rel_error_plain})
            tick(rows)
    return rows


def _reason(reason: object) -> str:
    """A round's end reason as its code (``EndReason`` value; "" if the PS gave none)."""
    return "" if reason is None else str(reason)


def _reasons(rounds: list[Row], status: str | None = None) -> dict[str, int]:
    """How many of ``rounds`` ended for each reason, most frequent first: keys are the reason
    codes of the rounds with ``status``, or ``"status:reason"`` over all rounds (``None``)."""
    out: dict[str, int] = {}
    for r in rounds:
        if status is None or r["status"] == status:
            reason = r.get("end_reason") or "unrecorded"  # a CSV from before the column
            key = reason if status is not None else f"{r['status']}:{reason}"
            out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def _loss_at(rows: list[Row], t: np.ndarray) -> np.ndarray:
    """One run's loss after the last round that ended by each time in ``t`` (step function)."""
    ts = np.array([r["t_s"] for r in rows])
    loss = np.array([r["loss"] for r in rows])
    idx = np.searchsorted(ts, t, side="right") - 1
    return np.where(idx >= 0, loss[np.maximum(idx, 0)], np.nan)


def _runs(rows: list[Row], T: float, name: str) -> list[list[Row]]:
    sel = select(rows, deadline_s=T, scheme=name)
    return [select(sel, seed=s) for s in sorted({r["seed"] for r in sel})]


def plot(rows: list[Row], path: Path) -> None:
    p = plt()
    deadlines = sorted({r["deadline_s"] for r in rows})
    fig, axes = p.subplots(1, len(deadlines), figsize=(4.5 * len(deadlines), 3.4),
                           squeeze=False)
    for ax, T in zip(axes[0], deadlines, strict=True):
        sel = select(rows, deadline_s=T)
        t = np.linspace(0.0, max(r["t_s"] for r in sel), 300)
        for name in SCHEMES:
            runs = _runs(rows, T, name)
            curve = np.stack([_loss_at(run, t) for run in runs])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                ax.plot(t, np.nanmedian(curve, axis=0), color=COLORS[name], label=name)
                ax.fill_between(t, np.nanmin(curve, axis=0), np.nanmax(curve, axis=0),
                                color=COLORS[name], alpha=0.2, lw=0)
        ax.set_yscale("log")
        ax.set_xlabel("emulated time since round 0 (s)")
        ax.set_ylabel("training log-loss (logged by the live PS)")
        ax.set_title(f"deadline T = {1e3 * T:g} ms")
        ax.legend()
    if rows:
        r0 = rows[0]
        n = len({r["seed"] for r in rows})
        fig.suptitle(f"Live approximate training on {r0['task']} (m={r0['m']}, δ={r0['delta']}, "
                     f"ℓ={r0['ell']}, {r0['delay']}, K={r0['time_scale']:g}); median and "
                     f"min-max over {n} seed(s)")
    save(fig, path)


def _scheme_head(rows: list[Row], T: float, name: str, budget: float) -> dict[str, Any]:
    runs = _runs(rows, T, name)
    at = [float(_loss_at(run, np.array([budget]))[0]) for run in runs]
    finals = [run[-1] for run in runs]
    done = [r for run in runs for r in run if r["round"] >= 0]
    n = max(1, len(done))
    fid = [r["fidelity_ratio"] for r in finals if np.isfinite(r["fidelity_ratio"])]
    return {
        "loss_at_budget_median": float(np.median(at)),
        "loss_at_budget_range": [float(np.min(at)), float(np.max(at))],
        "final_loss_median": float(np.median([f["loss"] for f in finals])),
        "final_loss_range": [float(min(f["loss"] for f in finals)),
                             float(max(f["loss"] for f in finals))],
        "final_t_s_median": float(np.median([f["t_s"] for f in finals])),
        "exact_rounds": sum(r["status"] == "exact" for r in done) / n,
        "failed_rounds": sum(r["status"] == "failed" for r in done) / n,
        "failed_reasons": _reasons(done, "failed"),
        "end_reasons": _reasons(done),
        "fidelity_ratio_range": [float(min(fid)), float(max(fid))] if fid else None,
    }


def summarise(rows: list[Row]) -> dict[str, Any]:
    """Per deadline and scheme: the loss at a time budget (median and min-max over seeds), the
    final loss and when it was reached, the share of rounds that decoded exactly / failed, the
    failed rounds counted by end reason (``failed_reasons``) and every round by
    ``"status:reason"`` (``end_reasons``), and the live runs' fidelity ratios;
    ``exact_gd_final_loss``: exact GD after the same number of rounds."""
    r0 = rows[0]
    quick = int(r0["rounds"]) < 10
    budget = grid(quick)["budget_s"]
    head: dict[str, Any] = {"budget_s": budget}
    for T in sorted({r["deadline_s"] for r in rows}):
        last = max(r["round"] for r in select(rows, deadline_s=T))
        ref = [r["exact_gd_loss"] for r in select(rows, deadline_s=T, scheme="partial")
               if r["round"] == last]
        cell: dict[str, Any] = {"exact_gd_final_loss": float(np.median(ref))}
        for name in SCHEMES:
            cell[name] = _scheme_head(rows, T, name, budget)
        head[f"T={T:g}"] = cell
    return head


EXPERIMENT = Experiment(
    "approx-training", compute, plot, summarise,
    "live approximate training, logistic regression on the shipped breast-cancer data "
    "(569 x 30), m=8, δ=3, ℓ=1, straggle:0.25,4,exp:0.01, deadlines T ∈ {15, 30} ms, 60 rounds, "
    "partial / original / uncoded / ignore-stragglers, coroutines on loopback at K=5, 3 seeds "
    "(quick: m=6, T=12 ms, 4 rounds, K=2, 1 seed)")
