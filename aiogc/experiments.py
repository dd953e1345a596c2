"""The documented experiments (docs/experiments.md): each writes ``NAME.csv`` and ``NAME.png``.

``aiogc experiment NAME --out DIR [--quick] [--seed S]``. Every experiment is a pure function of
its grid and seed (a fixed :class:`~aiogc.delays.DelaySchedule` per cell, drawn from the seed), so
re-running it reproduces the CSV exactly, except ``live-vs-sim``, whose live half measures real
loopback timings. Error bars are one (sample) standard deviation over trials. matplotlib is
imported lazily with the Agg backend.

The paper's grids are not public; ours are chosen so that each experiment runs in < 3 min at
default size and < 20 s with ``--quick`` on a 2-core machine:

=============== =================================================================================
exact-speedup   completion time vs ℓ, partial vs original; cyclic and random regular assignments;
                delays exp:1.0, pareto:2.5 (mean 1 s), straggle:0.2,5,exp:1.0 (persistent).
                m=40, δ=6, ℓ=1..5, 2000 trials (quick: m=20, δ=4, ℓ=1..3, 300 trials).
approx-mse      MSE vs deadline T, partial vs original, ℓ in {1, 2, 3}; cyclic m=20, δ=4,
                exp:1.0; d=120; 1000 trials per point (quick: 4 deadlines, 60 trials).
ordering        regular assignments; optimal vs random vs natural order: Q_max vs ℓ, exact
                completion vs ℓ (2000 trials), MSE vs T at ℓ=2 (300 trials); m=20, δ=4 and
                m=40, δ=6 (quick: m=20 only, fewer trials).
stability       decode relative error vs m (float32 / float64 payloads): original GC with ℓ=2
                (Ye–Abbe polynomial construction, as implemented by OriginalScheme) vs the partial
                scheme with the frame B (and a Gaussian B); cyclic, δ=4; 20 trials per m.
live-vs-sim     one schedule (exp:0.02, m=8, δ=3, ℓ=1, 40 rounds) run live on loopback
                (coroutines) and in the protocol simulator; mean round time and an itemised gap.
=============== =================================================================================
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .coding import make_scheme, q_max, random_order
from .config import RunConfig
from .delays import materialise
from .errors import ConfigError

__all__ = ["EXPERIMENTS", "run_experiment"]


# ------------------------------------------------------------------------------ helpers


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    keys: list[str] = []
    for r in rows:
        keys.extend(k for k in r if k not in keys)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 8, "axes.titlesize": 8, "legend.fontsize": 7})
    return plt


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    import matplotlib.pyplot as plt

    plt.close(fig)


def _mean_std(x: np.ndarray) -> tuple[float, float]:
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return float("nan"), float("nan")
    return float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else 0.0


def _cfg(**kw: Any) -> RunConfig:
    base: dict[str, Any] = dict(heartbeat_s=None, dead_after_s=None, round_timeout_s=1e6)
    base.update(kw)
    return RunConfig(**base)


def _logerr(ax: Any, x: Sequence[float], mean: np.ndarray, std: np.ndarray, **kw: Any) -> None:
    """Error bars of one std on a log axis (the lower bar clipped above 0)."""
    mean = np.asarray(mean)
    lo = np.minimum(np.asarray(std), mean * (1 - 1e-3))
    ax.errorbar(x, mean, yerr=[lo, np.asarray(std)], capsize=2, marker="o", ms=3, **kw)


# ------------------------------------------------------------------------------ exact-speedup

SPEEDUP_DELAYS = ("exp:1.0", "pareto:2.5", "straggle:0.2,5,exp:1.0")


def exact_speedup(out: Path, *, quick: bool = False, seed: int = 1) -> dict[str, Any]:
    """Completion time vs ℓ, partial vs original, per assignment and delay law."""
    from .sim.fast import build_schemes, exact_times

    m, delta, trials = (20, 4, 300) if quick else (40, 6, 2000)
    rows: list[dict[str, Any]] = []
    for assignment in ("cyclic", "regular"):
        for delay in SPEEDUP_DELAYS:
            for ell in range(1, delta):
                cfg = _cfg(workers=m, delta=delta, n_parts=ell, assignment=assignment,
                           delay=delay, rounds=trials, seed=seed)
                built = build_schemes(cfg, ["partial", "original"])
                sched = materialise(delay, rounds=trials, m=m, max_chunks=delta, seed=seed)
                res = {}
                for name, s in built.items():
                    _, end = exact_times(s, sched)
                    res[name] = end
                    mu, sd = _mean_std(end)
                    rows.append({"assignment": assignment, "delay": delay, "m": m,
                                 "delta": delta, "ell": ell, "scheme": name, "trials": trials,
                                 "completion_mean": mu, "completion_std": sd})
                ratio = res["original"] / res["partial"]
                rows[-1]["speedup"] = rows[-2]["speedup"] = float(
                    res["original"].mean() / res["partial"].mean())
                rows[-1]["partial_faster_frac"] = rows[-2]["partial_faster_frac"] = float(
                    np.mean(ratio >= 1.0))
    _write_csv(out / "exact-speedup.csv", rows)
    plt = _plt()
    fig, axes = plt.subplots(2, 3, figsize=(9, 5.2), sharex=True)
    for a, assignment in enumerate(("cyclic", "regular")):
        for d, delay in enumerate(SPEEDUP_DELAYS):
            ax = axes[a, d]
            for name, col in (("partial", "C0"), ("original", "C3")):
                sel = [r for r in rows if r["assignment"] == assignment and r["delay"] == delay
                       and r["scheme"] == name]
                ax.errorbar([r["ell"] for r in sel], [r["completion_mean"] for r in sel],
                            yerr=[r["completion_std"] for r in sel], label=name, color=col,
                            capsize=2, marker="o", ms=3)
            sp = [r["speedup"] for r in rows if r["assignment"] == assignment
                  and r["delay"] == delay and r["scheme"] == "partial"]
            ax.set_title(f"{assignment}, {delay}\nspeedup {min(sp):.2f}-{max(sp):.2f}x")
            ax.set_xlabel("ℓ")
            if d == 0:
                ax.set_ylabel("completion time (s)")
            ax.legend()
    fig.suptitle(f"Exact recovery: round time vs ℓ (m={m}, δ={delta}, {trials} trials, ±1 sd)")
    _save(fig, out / "exact-speedup.png")
    sps = [r["speedup"] for r in rows if r["scheme"] == "partial"]
    return {"m": m, "delta": delta, "trials": trials,
            "speedup_min": min(sps), "speedup_max": max(sps),
            "speedup_median": float(np.median(sps)),
            "partial_faster_every_cell": all(r["completion_mean"] < o["completion_mean"]
                                             for r, o in zip(rows[0::2], rows[1::2],
                                                             strict=True)),
            "cells": {f"{r['assignment']}|{r['delay']}|ell={r['ell']}": round(r["speedup"], 3)
                      for r in rows if r["scheme"] == "partial"}}


# ------------------------------------------------------------------------------ approx-mse


def approx_mse(out: Path, *, quick: bool = False, seed: int = 1) -> dict[str, Any]:
    """MSE vs deadline T for several ℓ, partial vs original."""
    from .sim.fast import build_schemes, mse_of_states, outcomes

    m, delta, dim = 20, 4, 120
    trials = 60 if quick else 1000
    deadlines = [1.0, 2.0, 3.0, 4.0] if quick else [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0]
    ells = (1, 2, 3)
    rows: list[dict[str, Any]] = []
    sched = materialise("exp:1.0", rounds=trials, m=m, max_chunks=delta, seed=seed)
    for ell in ells:
        cfg = _cfg(workers=m, delta=delta, n_parts=ell, delay="exp:1.0", rounds=trials,
                   seed=seed)
        built = build_schemes(cfg, ["partial", "original"])
        for T in deadlines:
            for name, s in built.items():
                _, end, status, states = outcomes(s, sched, mode="approx", deadline_s=T)
                mse = mse_of_states(s, states, seed=seed, dim=dim)
                mu, sd = _mean_std(mse)
                rows.append({"ell": ell, "deadline": T, "scheme": name, "m": m, "delta": delta,
                             "trials": trials, "mse_mean": mu, "mse_std": sd,
                             "mse_median": float(np.median(mse)),
                             "exact_fraction": float(np.mean(status == "exact")),
                             "completion_mean": float(end.mean())})
    _write_csv(out / "approx-mse.csv", rows)
    plt = _plt()
    fig, axes = plt.subplots(1, len(ells), figsize=(9, 3.2), sharey=True)
    for ax, ell in zip(axes, ells, strict=True):
        for name, col in (("partial", "C0"), ("original", "C3")):
            sel = [r for r in rows if r["ell"] == ell and r["scheme"] == name]
            _logerr(ax, [r["deadline"] for r in sel], np.array([r["mse_mean"] for r in sel]),
                    np.array([r["mse_std"] for r in sel]), label=name, color=col)
        ax.set_yscale("log")
        ax.set_title(f"ℓ={ell} (s={delta - ell} for original)")
        ax.set_xlabel("deadline T (s)")
        ax.legend()
    axes[0].set_ylabel("MSE  ||ĝ-g||²/||g||²")
    fig.suptitle(f"Approximate recovery (cyclic m={m}, δ={delta}, exp:1.0, d={dim}, "
                 f"{trials} trials, +1 sd)")
    _save(fig, out / "approx-mse.png")
    ratios = {}
    for ell in ells:
        for T in deadlines:
            p = next(r for r in rows if r["ell"] == ell and r["deadline"] == T
                     and r["scheme"] == "partial")
            o = next(r for r in rows if r["ell"] == ell and r["deadline"] == T
                     and r["scheme"] == "original")
            ratios[f"ell={ell},T={T}"] = {
                "partial": p["mse_mean"], "original": o["mse_mean"],
                "ratio": o["mse_mean"] / p["mse_mean"] if p["mse_mean"] else None,
                "partial_exact_fraction": p["exact_fraction"]}
    return {"m": m, "delta": delta, "trials": trials, "mse": ratios}


# ------------------------------------------------------------------------------ ordering

ORDERINGS = ("optimal", "random", "natural")


def ordering(out: Path, *, quick: bool = False, seed: int = 1) -> dict[str, Any]:
    """Optimal vs random vs natural ordering on regular-graph assignments."""
    from .sim.fast import exact_times, mse_of_states, outcomes

    sizes = [(20, 4)] if quick else [(20, 4), (40, 6)]
    trials = 300 if quick else 2000
    mse_trials = 60 if quick else 300
    mse_ell = 2
    rows: list[dict[str, Any]] = []
    for m, delta in sizes:
        sched = materialise("exp:1.0", rounds=trials, m=m, max_chunks=delta, seed=seed)
        deadlines = [delta * f for f in ((0.5, 0.75, 1.0) if quick else
                                         (0.25, 0.5, 0.75, 1.0, 1.25))]
        A = None
        for ell in range(1, delta + 1):
            for order in ORDERINGS:
                s: Any = make_scheme("partial", m=m, delta=delta, n_parts=ell, assignment="regular",
                                ordering=order, rng=np.random.default_rng([seed, 0x5C4E3E]))
                if A is None:
                    A = s.A
                assert np.array_equal(A, s.A)  # one assignment per size, whatever the order
                qm = s.q_max()
                _, end = exact_times(s, sched)
                mu, sd = _mean_std(end)
                row: dict[str, Any] = {"m": m, "delta": delta, "ell": ell, "ordering": order,
                                       "q_max": qm, "completion_mean": mu, "completion_std": sd,
                                       "trials": trials}
                if order == "random":
                    rq = [q_max(s.A, random_order(s.A, np.random.default_rng([seed, 77, t])),
                                ell) for t in range(50)]
                    row["q_max_random50_mean"] = float(np.mean(rq))
                    row["q_max_random50_min"] = int(np.min(rq))
                rows.append(row)
                if ell == mse_ell:
                    sub = materialise("exp:1.0", rounds=mse_trials, m=m, max_chunks=delta,
                                      seed=seed)
                    for T in deadlines:
                        _, _, status, states = outcomes(s, sub, mode="approx", deadline_s=T)
                        mse = mse_of_states(s, states, seed=seed, dim=120)
                        mmu, msd = _mean_std(mse)
                        rows.append({"m": m, "delta": delta, "ell": ell, "ordering": order,
                                     "deadline": T, "mse_mean": mmu, "mse_std": msd,
                                     "exact_fraction": float(np.mean(status == "exact")),
                                     "trials": mse_trials})
    _write_csv(out / "ordering.csv", rows)
    plt = _plt()
    fig, axes = plt.subplots(len(sizes), 3, figsize=(9, 2.9 * len(sizes)), squeeze=False)
    cols = {"optimal": "C0", "random": "C1", "natural": "C2"}
    for a, (m, delta) in enumerate(sizes):
        for order in ORDERINGS:
            sel = [r for r in rows if r["m"] == m and r["ordering"] == order
                   and "q_max" in r]
            ells = [r["ell"] for r in sel]
            axes[a, 0].plot(ells, [r["q_max"] for r in sel], marker="o", ms=3,
                            color=cols[order], label=order)
            axes[a, 1].errorbar(ells, [r["completion_mean"] for r in sel],
                                yerr=[r["completion_std"] for r in sel], capsize=2, marker="o",
                                ms=3, color=cols[order], label=order)
            ms = [r for r in rows if r["m"] == m and r["ordering"] == order and "deadline" in r]
            _logerr(axes[a, 2], [r["deadline"] for r in ms],
                    np.array([r["mse_mean"] for r in ms]), np.array([r["mse_std"] for r in ms]),
                    color=cols[order], label=order)
        axes[a, 0].set_title(f"Q_max (regular m={m}, δ={delta})")
        axes[a, 1].set_title(f"exact completion, exp:1.0, {trials} trials")
        axes[a, 2].set_title(f"MSE vs T, ℓ={mse_ell}, {mse_trials} trials")
        axes[a, 2].set_yscale("log")
        axes[a, 0].set_xlabel("ℓ")
        axes[a, 1].set_xlabel("ℓ")
        axes[a, 2].set_xlabel("deadline T (s)")
        for ax in axes[a]:
            ax.legend()
    _save(fig, out / "ordering.png")
    head: dict[str, Any] = {}
    for m, delta in sizes:
        for ell in range(1, delta + 1):
            q = {r["ordering"]: r for r in rows if r["m"] == m and r["ell"] == ell
                 and "q_max" in r}
            head[f"m={m},ell={ell}"] = {
                "q_max": {o: q[o]["q_max"] for o in ORDERINGS},
                "q_max_random50_mean": q["random"]["q_max_random50_mean"],
                "completion": {o: round(q[o]["completion_mean"], 4) for o in ORDERINGS}}
    return head


# ------------------------------------------------------------------------------ stability


def stability(out: Path, *, quick: bool = False, seed: int = 1) -> dict[str, Any]:
    """Decode relative error vs m: original (Ye–Abbe, ℓ=2) vs partial (frame / Gaussian B)."""
    from .sim.fast import gaussian_chunk_gradients, outcomes

    delta, ell, dim = 4, 2, 120
    ms = [8, 12, 16, 24] if quick else [8, 12, 16, 20, 24, 28, 32, 40, 48]
    trials = 6 if quick else 20
    rows: list[dict[str, Any]] = []
    variants = (("original", "polynomial"), ("partial", "frame"), ("partial", "gaussian"))
    for m in ms:
        sched = materialise("exp:1.0", rounds=trials, m=m, max_chunks=delta, seed=seed)
        for name, dec in variants:
            s: Any = make_scheme(name, m=m, delta=delta, n_parts=ell, decoding=dec,
                            rng=np.random.default_rng([seed, m]))
            rng = np.random.default_rng([seed, m, 1])
            # partial: the state at its exact trigger (some chunks with exactly ell holders)
            trig_states = outcomes(s, sched, mode="exact")[3] if name == "partial" else None
            for dtype in ("float64", "float32"):
                errs, amps = [], []
                for t in range(trials):
                    if name == "original":
                        state = np.asarray(s.loads).copy()
                        state[rng.choice(m, size=s.s, replace=False)] = 0  # s stragglers
                    else:
                        assert trig_states is not None
                        state = trig_states[t]
                    G = gaussian_chunk_gradients(seed, t, s.n_chunks, dim).astype(dtype)
                    g = G.astype(np.float64).sum(axis=0)
                    V = np.zeros((m, s.payload_len(dim)), dtype=dtype)
                    for j in range(m):
                        if s.contributes(j, state):
                            V[j] = s.encode(j, state, G[s.orders[j]])
                    with np.errstate(all="ignore"):
                        res = s.decode_result(V, state, dim)
                        est = np.asarray(res.gradient, dtype=np.float64)
                        err = float(np.linalg.norm(est - g) / np.linalg.norm(g))
                    errs.append(err if np.isfinite(err) else np.inf)
                    amps.append(res.amplification)
                e = np.asarray(errs)
                rows.append({"m": m, "delta": delta, "ell": ell, "scheme": f"{name}-{dec}",
                             "dtype": dtype, "trials": trials,
                             "rel_error_mean": float(e.mean()), "rel_error_max": float(e.max()),
                             "rel_error_std": float(e.std(ddof=1)) if e.size > 1 else 0.0,
                             "amplification_max": float(np.max(amps))})
    _write_csv(out / "stability.csv", rows)
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
    cols = {"original-polynomial": "C3", "partial-frame": "C0", "partial-gaussian": "C1"}
    for ax, dtype in zip(axes, ("float64", "float32"), strict=True):
        for sch, col in cols.items():
            sel = [r for r in rows if r["scheme"] == sch and r["dtype"] == dtype]
            mean = np.array([min(r["rel_error_mean"], 1e3) for r in sel])
            std = np.array([min(r["rel_error_std"], 1e3) for r in sel])
            _logerr(ax, [r["m"] for r in sel], mean, std, color=col, label=sch)
        ax.set_yscale("log")
        ax.set_xlabel("m (workers)")
        ax.set_title(f"{dtype} payloads (cyclic δ={delta}, ℓ={ell})")
        ax.legend()
    axes[0].set_ylabel("relative decode error ||ĝ-g||/||g||")
    _save(fig, out / "stability.png")
    head = {}
    for r in rows:
        if r["m"] in (ms[0], ms[-1]) or (r["m"] == 24):
            head[f"{r['scheme']}|{r['dtype']}|m={r['m']}"] = r["rel_error_mean"]
    return head


# ------------------------------------------------------------------------------ live-vs-sim


def live_vs_sim(out: Path, *, quick: bool = False, seed: int = 1) -> dict[str, Any]:
    """The same schedule live on loopback (coroutines) and in the protocol simulator.

    The live half runs twice, with the default asyncio loop and with uvloop (the drivers stamp
    with ``time.monotonic()`` under both). The simulator runs twice: with zero latency, and with
    one per-frame latency calibrated on the live original-scheme rounds.
    """
    from .runner import run_live
    from .sim.fast import build_schemes, schedule_for
    from .sim.protocol import simulate_protocol

    rounds = 10 if quick else 40
    schemes = ["partial", "original"]
    cfg = RunConfig(workers=8, delta=3, n_parts=1, rounds=rounds, delay="exp:0.02", seed=seed,
                    task="linreg")
    built = build_schemes(cfg, schemes)
    schedule = schedule_for(cfg, built)
    sim = simulate_protocol(cfg, schemes, schedule=schedule, gradients="task", built=built)
    rows: list[dict[str, Any]] = []
    head: dict[str, Any] = {}
    for loop in ("asyncio", "uvloop"):
        live = run_live(cfg, schemes, mode="coroutines", out_dir=None, verify=False,
                        schedule=schedule, loop=loop)
        for name in schemes:
            lrec, srec = live.records[name], sim[name]
            n = min(len(lrec), len(srec))
            for r in range(n):
                lr, sr = lrec[r], srec[r]
                t_end = lr.t_end if lr.t_end is not None else lr.t_start
                t_trig = lr.t_trigger if lr.t_trigger is not None else t_end
                oracle = lr.oracle_elapsed_s if lr.oracle_elapsed_s is not None else float("nan")
                s_trig = (sr.t_trigger - sr.t_start) if sr.t_trigger is not None else float("nan")
                rows.append({
                    "loop": loop, "scheme": name, "round": r,
                    "live_round_s": lr.duration_s, "sim_round_s": sr.duration_s,
                    "gap_s": lr.duration_s - sr.duration_s,
                    # worker stamps vs schedule: timer lateness / compute overrun at the workers
                    "compute_overrun_s": oracle - s_trig,
                    # round_start delivery + report delivery + PS processing
                    "control_s": (t_trig - lr.t_start) - oracle,
                    # encode_and_transmit broadcast, encoding, upload, decode (partial only)
                    "collect_s": t_end - t_trig,
                    "between_rounds_s": (lrec[r + 1].t_start - t_end) if r + 1 < n else 0.0,
                    "same_state": tuple(lr.state) == tuple(sr.state),
                    "live_status": lr.status, "sim_status": sr.status,
                })
            sel = [x for x in rows if x["scheme"] == name and x["loop"] == loop]
            lm = float(np.mean([x["live_round_s"] for x in sel]))
            sm = float(np.mean([x["sim_round_s"] for x in sel]))
            head[f"{name}|{loop}"] = {
                "rounds": len(sel), "live_mean_s": lm, "sim_mean_s": sm,
                "rel_gap": (lm - sm) / sm if sm else None,
                "compute_overrun_mean_s": float(np.nanmean([x["compute_overrun_s"]
                                                            for x in sel])),
                "control_mean_s": float(np.nanmean([x["control_s"] for x in sel])),
                "collect_mean_s": float(np.mean([x["collect_s"] for x in sel])),
                "between_rounds_mean_s": float(np.mean([x["between_rounds_s"] for x in sel])),
                "same_state_fraction": float(np.mean([x["same_state"] for x in sel])),
            }
    # Calibrated simulation: one per-frame latency, measured on the live *original* runs (its
    # control leg = round_start delivery + report delivery, about two one-way frames), applied
    # to both schemes. The partial scheme's prediction is then out of sample.
    ctrl = [x["control_s"] for x in rows if x["scheme"] == "original" and x["loop"] == "asyncio"]
    latency = max(0.0, float(np.nanmedian(ctrl)) / 2) if ctrl else 0.0
    cal = simulate_protocol(cfg, schemes, schedule=schedule, gradients="task", built=built,
                            latency=latency)
    for name in schemes:
        cm = float(np.mean([r.duration_s for r in cal[name]]))
        for loop in ("asyncio", "uvloop"):
            h = head[f"{name}|{loop}"]
            h["latency_calibrated_s"] = latency
            h["sim_calibrated_mean_s"] = cm
            h["rel_gap_calibrated"] = (h["live_mean_s"] - cm) / cm if cm else None
    _write_csv(out / "live-vs-sim.csv", rows)
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for ax, name in zip(axes, schemes, strict=True):
        sel = [x for x in rows if x["scheme"] == name and x["loop"] == "asyncio"]
        rr = [x["round"] for x in sel]
        ax.plot(rr, [1e3 * x["sim_round_s"] for x in sel], marker="o", ms=3, label="simulated")
        ax.plot(rr, [1e3 * r.duration_s for r in cal[name][: len(rr)]], marker=".", ms=3,
                lw=0.8, label=f"simulated, latency {1e3 * latency:.2f} ms")
        for loop, mk in (("asyncio", "x"), ("uvloop", "+")):
            lsel = [x for x in rows if x["scheme"] == name and x["loop"] == loop]
            ax.plot(rr, [1e3 * x["live_round_s"] for x in lsel], marker=mk, ms=3, lw=0.8,
                    label=f"live ({loop})")
        h = head[f"{name}|asyncio"]
        ax.set_title(f"{name}: live {1e3 * h['live_mean_s']:.1f} ms vs sim "
                     f"{1e3 * h['sim_mean_s']:.1f} ms ({100 * (h['rel_gap'] or 0):+.1f}%, asyncio)")
        ax.set_xlabel("round")
        ax.set_ylabel("round time (ms)")
        ax.legend()
    _save(fig, out / "live-vs-sim.png")
    return head


EXPERIMENTS: dict[str, Callable[..., dict[str, Any]]] = {
    "exact-speedup": exact_speedup,
    "approx-mse": approx_mse,
    "ordering": ordering,
    "stability": stability,
    "live-vs-sim": live_vs_sim,
}


def run_experiment(name: str, out: str | Path, *, quick: bool = False,
                   seed: int = 1) -> dict[str, Any]:
    """Run experiment ``name``, writing ``NAME.csv`` / ``NAME.png`` into ``out``; headline dict."""
    if name not in EXPERIMENTS:
        raise ConfigError("experiment", name, "one of " + ", ".join(EXPERIMENTS))
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError("seed", seed, "an integer >= 0")
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    return EXPERIMENTS[name](path, quick=quick, seed=seed)
