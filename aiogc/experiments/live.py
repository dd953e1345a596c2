"""Experiments with a live half (real sockets on loopback): ``live-vs-sim``, ``latency``,
``training``. Their live numbers are measured, so a re-run reproduces them within the jitter of
the machine, not bit for bit; the simulated halves are deterministic."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from aiogc.coding.base import Scheme
from aiogc.config import RunConfig
from aiogc.experiments._common import (
    Experiment,
    Row,
    band,
    boot_rng,
    cells,
    code_rng,
    delay_seed,
    plt,
    ratio_of_means_ci,
    save,
    select,
)
from aiogc.training.delays import materialise

# ------------------------------------------------------------------------------ live-vs-sim


def lvs_compute(quick: bool, seed: int) -> list[Row]:
    """The same schedule live on loopback (coroutines; asyncio and uvloop) and in the protocol
    simulator, with zero latency and with one per-frame latency calibrated on the live
    original-scheme rounds (so the partial scheme's calibrated prediction is out of sample)."""
    from aiogc.harness.local import run_live
    from aiogc.harness.options import RunOptions
    from aiogc.sim.engine import SimNetwork
    from aiogc.sim.fast import build_schemes, schedule_for
    from aiogc.sim.protocol import simulate_protocol

    rounds = 10 if quick else 40
    schemes = ["partial", "original"]
    cfg = RunConfig(workers=8, delta=3, n_parts=1, rounds=rounds, delay="exp:0.02", seed=seed,
                    task="linreg")
    built = build_schemes(cfg, schemes)
    schedule = schedule_for(cfg, built)
    tick = cells(3)  # the simulation, then each loop live
    sim = simulate_protocol(cfg, schemes, schedule=schedule, gradients="task", built=built)
    tick()
    rows: list[Row] = []
    for loop in ("asyncio", "uvloop"):
        live = run_live(cfg, schemes, RunOptions(mode="coroutines", out_dir=None, verify=False,
                        loop=loop), schedule=schedule)
        tick(rows)
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
    # One per-frame latency measured on the live *original* runs (its control leg is about two
    # one-way frames: round_start and the deciding report), applied to both schemes.
    ctrl = [x["control_s"] for x in rows if x["scheme"] == "original" and x["loop"] == "asyncio"]
    latency = max(0.0, float(np.nanmedian(ctrl)) / 2) if ctrl else 0.0
    cal = simulate_protocol(cfg, schemes, schedule=schedule, gradients="task", built=built,
                            network=SimNetwork(latency=latency))
    for x in rows:
        x["latency_calibrated_s"] = latency
        x["sim_calibrated_round_s"] = cal[x["scheme"]][x["round"]].duration_s
    return rows


def lvs_summarise(rows: list[Row]) -> dict[str, Any]:
    head: dict[str, Any] = {}
    for name in dict.fromkeys(r["scheme"] for r in rows):
        for loop in dict.fromkeys(r["loop"] for r in rows):
            sel = select(rows, scheme=name, loop=loop)
            lm = float(np.mean([x["live_round_s"] for x in sel]))
            sm = float(np.mean([x["sim_round_s"] for x in sel]))
            cm = float(np.mean([x["sim_calibrated_round_s"] for x in sel]))
            # paired by round: the interval of live/sim over the rounds of this one run
            live_r = np.array([[x["live_round_s"] for x in sel]])
            gap = ratio_of_means_ci(live_r, np.array([[x["sim_round_s"] for x in sel]]),
                                    rng=boot_rng(0, len(name), len(loop)))
            gap_cal = ratio_of_means_ci(
                live_r, np.array([[x["sim_calibrated_round_s"] for x in sel]]),
                rng=boot_rng(1, len(name), len(loop)))
            head[f"{name}|{loop}"] = {
                "rounds": len(sel), "live_mean_s": lm, "sim_mean_s": sm,
                "rel_gap": (lm - sm) / sm if sm else None,
                "rel_gap_ci": [gap[1] - 1, gap[2] - 1],
                "rel_gap_calibrated_ci": [gap_cal[1] - 1, gap_cal[2] - 1],
                "latency_calibrated_s": sel[0]["latency_calibrated_s"],
                "sim_calibrated_mean_s": cm,
                "rel_gap_calibrated": (lm - cm) / cm if cm else None,
                "compute_overrun_mean_s": float(np.nanmean([x["compute_overrun_s"]
                                                            for x in sel])),
                "control_mean_s": float(np.nanmean([x["control_s"] for x in sel])),
                "collect_mean_s": float(np.mean([x["collect_s"] for x in sel])),
                "between_rounds_mean_s": float(np.mean([x["between_rounds_s"] for x in sel])),
                "same_state_fraction": float(np.mean([bool(x["same_state"]) for x in sel])),
            }
    return head


def lvs_plot(rows: list[Row], path: Path) -> None:
    p = plt()
    head = lvs_summarise(rows)
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    fig, axes = p.subplots(1, len(schemes), figsize=(9, 3.2), squeeze=False)
    for ax, name in zip(axes[0], schemes, strict=True):
        sel = select(rows, scheme=name, loop="asyncio")
        rr = [x["round"] for x in sel]
        lat = sel[0]["latency_calibrated_s"]
        ax.plot(rr, [1e3 * x["sim_round_s"] for x in sel], marker="o", ms=3, label="simulated")
        ax.plot(rr, [1e3 * x["sim_calibrated_round_s"] for x in sel], marker=".", ms=3,
                lw=0.8, label=f"simulated, latency {1e3 * lat:.2f} ms")
        for loop, mk in (("asyncio", "x"), ("uvloop", "+")):
            lsel = select(rows, scheme=name, loop=loop)
            ax.plot([x["round"] for x in lsel], [1e3 * x["live_round_s"] for x in lsel],
                    marker=mk, ms=3, lw=0.8, label=f"live ({loop})")
        h = head[f"{name}|asyncio"]
        ax.set_title(f"{name}: live {1e3 * h['live_mean_s']:.1f} ms vs sim "
                     f"{1e3 * h['sim_mean_s']:.1f} ms ({100 * (h['rel_gap'] or 0):+.1f}%, asyncio)")
        ax.set_xlabel("round")
        ax.set_ylabel("round time (ms)")
        ax.legend()
    save(fig, path)


LIVE_VS_SIM = Experiment(
    "live-vs-sim", lvs_compute, lvs_plot, lvs_summarise,
    "m=8, δ=3, ℓ=1, exp:0.02, linreg, 40 rounds live on loopback (asyncio and uvloop) vs the "
    "protocol simulator (zero and calibrated latency) (quick: 10 rounds)")


# ------------------------------------------------------------------------------ latency

LAT_SCHEMES = ("partial", "original")


def lat_grid(quick: bool) -> dict[str, Any]:
    if quick:
        return {"m": 8, "delta": 3, "ells": [1], "delay": "exp:0.02", "instances": 2,
                "trials": 100, "latencies_ms": [0.0, 5.0, 20.0], "live_ms": [5.0],
                "live_rounds": 4}
    return {"m": 8, "delta": 3, "ells": [1, 2], "delay": "exp:0.02", "instances": 5,
            "trials": 1000,
            "latencies_ms": [0.0, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 50.0, 75.0, 100.0],
            "live_ms": [0.0, 5.0, 20.0, 50.0], "live_rounds": 20}


def _sim_latency_rows(g: dict[str, Any], seed: int) -> list[Row]:
    from aiogc.coding import SchemeChoices, make_scheme
    from aiogc.sim.fast import exact_times

    m, delta, C, R = g["m"], g["delta"], g["instances"], g["trials"]
    rows: list[Row] = []
    for ell in g["ells"]:
        for l_i, lat_ms in enumerate(g["latencies_ms"]):
            L = lat_ms / 1e3
            for model in ("symmetric", "worker-frames"):
                ends = {n: np.empty((C, R)) for n in LAT_SCHEMES}
                for c in range(C):
                    # symmetric: every frame, both directions, takes L (the physical picture);
                    # worker-frames: only the workers' frames are delayed by L, which is what
                    # ``--latency const:L`` does live (the live points below).
                    lat_spec = f"const:{L!r}" if model == "worker-frames" and L > 0 else "none"
                    sched = materialise(g["delay"], lat_spec, rounds=R, m=m, max_chunks=delta,
                                        seed=delay_seed(seed, c))
                    for n in LAT_SCHEMES:
                        # times only: B does not matter (see exact-speedup), Gaussian is cheap
                        s = make_scheme(n, m=m, delta=delta, n_parts=ell,
                                        choices=SchemeChoices(decoding="gaussian"),
                                        rng=code_rng(seed, c))
                        ends[n][c] = exact_times(
                            s, sched, latency=L if model == "symmetric" else 0.0)[1]
                sp = ratio_of_means_ci(ends["original"], ends["partial"],
                                       rng=boot_rng(seed, ell, l_i, model == "symmetric"))
                rows.append({"kind": "sim", "model": model, "m": m, "delta": delta, "ell": ell,
                             "delay": g["delay"], "latency_ms": lat_ms, "instances": C,
                             "trials": R,
                             "partial_mean_s": float(ends["partial"].mean()),
                             "original_mean_s": float(ends["original"].mean()),
                             "speedup": sp[0], "speedup_lo": sp[1], "speedup_hi": sp[2]})
    return rows


def _live_latency_rows(g: dict[str, Any], seed: int) -> list[Row]:
    from aiogc.harness.kit import scheme_config
    from aiogc.harness.local import run_live
    from aiogc.harness.options import RunOptions
    from aiogc.sim.fast import exact_times

    rows: list[Row] = []
    for lat_ms in g["live_ms"]:
        lat = f"const:{lat_ms / 1e3!r}" if lat_ms > 0 else "none"
        cfg = RunConfig(workers=g["m"], delta=g["delta"], n_parts=1, rounds=g["live_rounds"],
                        delay=g["delay"], latency=lat, seed=seed, task="linreg")
        res = run_live(cfg, list(LAT_SCHEMES), RunOptions(mode="coroutines", out_dir=None,
                       verify=False))
        d = {n: np.array([r.duration_s for r in res.records[n] if r.status != "failed"])
             for n in LAT_SCHEMES}
        # the fast path on the very rounds that ran live (same schedule, same code): separates
        # the live-vs-model gap from the sampling noise of a few rounds
        assert res.schedule is not None
        same = {n: exact_times(scheme_config(cfg, n).build_scheme(), res.schedule)[1]
                for n in LAT_SCHEMES}
        sp = ratio_of_means_ci(d["original"][None, :], d["partial"][None, :],
                               rng=boot_rng(seed, 999, int(lat_ms * 1000)))
        rows.append({"kind": "live", "model": "worker-frames", "m": g["m"],
                     "delta": g["delta"], "ell": 1, "delay": g["delay"], "latency_ms": lat_ms,
                     "instances": 1, "trials": int(min(d["partial"].size, d["original"].size)),
                     "partial_mean_s": float(d["partial"].mean()),
                     "original_mean_s": float(d["original"].mean()),
                     "speedup": sp[0], "speedup_lo": sp[1], "speedup_hi": sp[2],
                     "sim_same_rounds_partial_s": float(same["partial"].mean()),
                     "sim_same_rounds_original_s": float(same["original"].mean()),
                     "sim_same_rounds_speedup": float(same["original"].mean()
                                                      / same["partial"].mean())})
    return rows


def lat_compute(quick: bool, seed: int) -> list[Row]:
    g = lat_grid(quick)
    tick = cells(2)  # the simulated sweep, then the live points
    rows = _sim_latency_rows(g, seed)
    tick(rows)
    rows += _live_latency_rows(g, seed)
    tick(rows)
    return rows


def lat_plot(rows: list[Row], path: Path) -> None:
    p = plt()
    fig, ax = p.subplots(figsize=(6, 3.6))
    ells = sorted({r["ell"] for r in select(rows, kind="sim")})
    for i, ell in enumerate(ells):
        for model, ls in (("symmetric", "-"), ("worker-frames", "--")):
            sel = select(rows, kind="sim", ell=ell, model=model)
            x = [max(r["latency_ms"], 0.1) for r in sel]
            band(ax, x, [r["speedup"] for r in sel], [r["speedup_lo"] for r in sel],
                 [r["speedup_hi"] for r in sel], ls=ls, color=f"C{i}",
                 label=f"simulated, ℓ={ell}, {model}")
    live = select(rows, kind="live")
    if live:
        x = [max(r["latency_ms"], 0.1) for r in live]
        ax.errorbar(x, [r["speedup"] for r in live],
                    yerr=[[r["speedup"] - r["speedup_lo"] for r in live],
                          [r["speedup_hi"] - r["speedup"] for r in live]],
                    fmt="k^", ms=5, capsize=2, label="live loopback, ℓ=1 (--latency const:L)")
        ax.plot(x, [r["sim_same_rounds_speedup"] for r in live], "kx", ms=6,
                label="simulated, the same rounds as live")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("one-way latency per frame (ms; 0 drawn at 0.1)")
    ax.set_ylabel("speedup = original / partial round time")
    r0 = rows[0]
    ax.set_title(f"Exact speedup vs latency (m={r0['m']}, δ={r0['delta']}, {r0['delay']} "
                 "per chunk; 95% CI)")
    ax.legend()
    save(fig, path)


def lat_summarise(rows: list[Row]) -> dict[str, Any]:
    head: dict[str, Any] = {"sim": {}, "live": {}, "break_even_ms": {}}
    for r in select(rows, kind="sim"):
        head["sim"][f"ell={r['ell']},{r['model']},L={r['latency_ms']}ms"] = [
            r["speedup"], r["speedup_lo"], r["speedup_hi"]]
    for r in select(rows, kind="live"):
        head["live"][f"L={r['latency_ms']}ms"] = [r["speedup"], r["speedup_lo"],
                                                  r["speedup_hi"]]
    for ell in sorted({r["ell"] for r in select(rows, kind="sim")}):
        for model in ("symmetric", "worker-frames"):
            sel = sorted(select(rows, kind="sim", ell=ell, model=model),
                         key=lambda r: r["latency_ms"])
            below = [r["latency_ms"] for r in sel if r["speedup_hi"] < 1.0]
            head["break_even_ms"][f"ell={ell},{model}"] = below[0] if below else None
    return head


LATENCY = Experiment(
    "latency", lat_compute, lat_plot, lat_summarise,
    "m=8, δ=3, ℓ∈{1,2}, exp:0.02 per chunk, one-way latency 0-100 ms (fast path, 5 delay "
    "schedules x 1000 trials; symmetric and worker-frames-only models) + live loopback points "
    "at 0/5/20/50 ms, 20 rounds (quick: ℓ=1, 0/5/20 ms, 2 x 100; one live point, 4 rounds)")


# ------------------------------------------------------------------------------ training

TRAIN_SCHEMES = ("partial", "original", "uncoded", "ignore-stragglers")
TRAIN_TASK = "logreg:breast-cancer"


def train_grid(quick: bool) -> dict[str, Any]:
    if quick:
        return {"m": 6, "delta": 3, "ell": 1, "delay": "straggle:0.34,4,exp:0.005",
                "rounds": 4, "seeds": 1, "mode": "processes", "points": 20}
    return {"m": 8, "delta": 3, "ell": 1, "delay": "straggle:0.25,4,exp:0.01", "rounds": 60,
            "seeds": 3, "mode": "processes", "points": 200}


def _replay(cfg: RunConfig, records: list[Any]) -> list[tuple[float, float]]:
    """(loss, training accuracy) of the initial model, then after every round, rebuilt from
    the records.

    The PS logs the loss but not the model. Each round's decode is replayed here with the
    scheme's own encode and decode, on the recorded state (which workers had finished what),
    from the same initial model and learning rate; every replayed loss is checked against the
    loss the live PS logged, so the accuracy is that of the live model."""
    from aiogc.training.tasks import chunk_gradients, make_task

    scheme: Scheme = cfg.build_scheme()
    # the live PS and workers cut the data by the cluster's chunk sizes (--chunk-sizes): the
    # replay must cut it the same way, or its losses are another model's
    task: Any = make_task(cfg.task, scheme.n_chunks, cfg.seed, chunk_sizes=cfg.sizes)
    lr = cfg.learning_rate or task.learning_rate
    w = np.asarray(task.initial_model(), dtype=np.float64).copy()
    dim = w.size
    out: list[tuple[float, float]] = [(task.loss(w), task.accuracy(w))]  # before round 0
    for rec in records:
        if rec.status != "failed":
            c = np.asarray(rec.state, dtype=np.int64)
            G = chunk_gradients(task, np.arange(scheme.n_chunks), w)
            V = np.zeros((scheme.m, scheme.payload_len(dim)))
            for j in range(scheme.m):
                if scheme.contributes(j, c):
                    V[j] = scheme.encode(j, c, G[scheme.orders[j]])
            w = w - lr * np.asarray(scheme.decode_result(V, c, dim).gradient, dtype=np.float64)
        loss = task.loss(w)
        if np.isfinite(rec.loss) and not np.isclose(loss, rec.loss, rtol=1e-6, atol=1e-12):
            raise RuntimeError(f"replay of {cfg.scheme} round {rec.round} gives loss {loss!r}, "
                               f"the live PS logged {rec.loss!r}")
        out.append((loss, task.accuracy(w)))
    return out


def train_compute(quick: bool, seed: int) -> list[Row]:
    from aiogc.harness.kit import scheme_config
    from aiogc.harness.local import run_live
    from aiogc.harness.options import RunOptions

    g = train_grid(quick)
    rows: list[Row] = []
    tick = cells(g["seeds"])
    for k in range(g["seeds"]):
        cfg = RunConfig(workers=g["m"], delta=g["delta"], n_parts=g["ell"], rounds=g["rounds"],
                        delay=g["delay"], seed=seed + k, task=TRAIN_TASK)
        res = run_live(cfg, list(TRAIN_SCHEMES), RunOptions(mode=g["mode"], out_dir=None,
                       verify=False))
        for name in TRAIN_SCHEMES:
            recs = res.records[name]
            t0 = recs[0].t_start
            path = _replay(scheme_config(cfg, name), recs)
            base = {"seed": seed + k, "scheme": name, "m": g["m"], "delta": g["delta"],
                    "ell": g["ell"], "delay": g["delay"], "task": TRAIN_TASK,
                    "mode": g["mode"], "rounds": g["rounds"]}
            rows.append({**base, "round": -1, "status": "initial", "wall_s": 0.0,
                         "loss": path[0][0], "loss_logged": None, "accuracy": path[0][1]})
            for rec, (loss, acc) in zip(recs, path[1:], strict=True):
                end = rec.t_end if rec.t_end is not None else rec.t_start
                rows.append({**base, "round": rec.round, "status": rec.status,
                             "wall_s": end - t0, "loss": loss, "loss_logged": rec.loss,
                             "accuracy": acc})
        tick(rows)
    return rows


def _on_grid(rows: list[Row], key: str, t: np.ndarray) -> np.ndarray:
    """Per seed: ``key`` after the last round finished by time t (the initial value before)."""
    wall = np.array([r["wall_s"] for r in rows])
    val = np.array([r[key] for r in rows])
    idx = np.searchsorted(wall, t, side="right") - 1
    return np.where(idx >= 0, val[np.maximum(idx, 0)], np.nan)


def _curves(rows: list[Row], key: str, t: np.ndarray) -> dict[str, np.ndarray]:
    out = {}
    for name in TRAIN_SCHEMES:
        seeds = sorted({r["seed"] for r in select(rows, scheme=name)})
        out[name] = np.stack([_on_grid(select(rows, scheme=name, seed=s), key, t)
                              for s in seeds])
    return out


def train_plot(rows: list[Row], path: Path) -> None:
    p = plt()
    t = np.linspace(0.0, max(r["wall_s"] for r in rows), 300)
    fig, axes = p.subplots(1, 2, figsize=(9, 3.4))
    colors = {"partial": "C0", "original": "C3", "uncoded": "C7", "ignore-stragglers": "C2"}
    for ax, key in zip(axes, ("loss", "accuracy"), strict=True):
        for name, curve in _curves(rows, key, t).items():
            with warnings.catch_warnings():  # before a seed's first round ends: all-NaN
                warnings.simplefilter("ignore", RuntimeWarning)
                ax.plot(t, np.nanmedian(curve, axis=0), color=colors[name], label=name)
                ax.fill_between(t, np.nanmin(curve, axis=0), np.nanmax(curve, axis=0),
                                color=colors[name], alpha=0.2, lw=0)
        ax.set_xlabel("wall-clock time (s)")
        ax.set_ylabel("training " + ("log-loss" if key == "loss" else "accuracy"))
        ax.legend()
    # the initial model (w = 0) scores the majority-class share; the interesting part is above
    lo_acc = min(r["accuracy"] for r in rows if r["round"] >= 2) if rows else 0.0
    axes[1].set_ylim(max(0.0, lo_acc - 0.01), 1.0)
    axes[1].set_ylabel("training accuracy")
    if rows:
        r0 = rows[0]
        n_seeds = len({r["seed"] for r in rows})
        axes[0].set_yscale("log")
        fig.suptitle(f"Live training on {r0['task']} ({r0['mode']} on loopback, m={r0['m']}, "
                     f"δ={r0['delta']}, {r0['delay']})\nmedian and min-max over "
                     f"{n_seeds} seed(s)")
    save(fig, path)


def train_summarise(rows: list[Row]) -> dict[str, Any]:
    """Per scheme: final loss and accuracy, wall time, and the wall time to reach the loss that
    exact gradient descent reaches after 2/3 of the rounds (every exactly decoding scheme follows
    the same loss path round by round, so this compares how fast rounds go; a scheme that
    never reaches it within the run gets ``None`` for that seed)."""
    exact = [r for r in rows if r["scheme"] == "original" and r["status"] == "exact"]
    n_rounds = int(rows[0]["rounds"])
    at = [r["loss"] for r in exact if r["round"] == (2 * n_rounds) // 3]
    target = float(np.max(at)) if at else float("nan")
    head: dict[str, Any] = {"target_loss": target, "target_round": (2 * n_rounds) // 3}
    for name in TRAIN_SCHEMES:
        seeds = sorted({r["seed"] for r in select(rows, scheme=name)})
        finals, times = [], []
        for s in seeds:
            sel = [r for r in select(rows, scheme=name, seed=s) if r["round"] >= 0]
            finals.append(sel[-1])
            hit = [r["wall_s"] for r in sel if r["loss"] <= target]
            times.append(hit[0] if hit else None)
        reached = [t for t in times if t is not None]
        head[name] = {"final_loss_median": float(np.median([f["loss"] for f in finals])),
                      "final_accuracy_median": float(np.median([f["accuracy"] for f in finals])),
                      "wall_s_median": float(np.median([f["wall_s"] for f in finals])),
                      "time_to_target_s": times,
                      "time_to_target_median_s": float(np.median(reached)) if reached else None,
                      "reached_target": f"{len(reached)}/{len(times)}"}
    return head


TRAINING = Experiment(
    "training", train_compute, train_plot, train_summarise,
    "logistic regression on the Wisconsin breast-cancer data (569 x 30, shipped), m=8, δ=3, "
    "ℓ=1, straggle:0.25,4,exp:0.01, 60 rounds, partial / original / uncoded / "
    "ignore-stragglers, worker processes on loopback, 3 seeds (quick: m=6, 4 rounds, 1 seed)")

