"""``adaptive-ordering``: speed-aware orders chosen by the PS between rounds vs the static
optimal order, under persistent stragglers, a fail-slow pattern that moves between workers,
and i.i.d. delays; simulated (fast path, checked against the protocol engine by
``tests/test_adaptive.py``) and live (loopback, coroutines).

Both orderings of a cell share the code instance (assignment, B) and the delay schedule, so
the per-round difference ``adaptive - static`` is paired. Intervals: cluster bootstrap over
instances (each a different straggler draw) and rounds (:func:`mean_ci`); live: the same
over the interleaved pairs of runs (:func:`_live_cell`), each run judged by its own fidelity
section (live against the simulated run of its own ordering).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from aiogc.experiments._common import (
    Experiment,
    Row,
    boot_rng,
    cells,
    fmt_ci,
    mean_ci,
    plt,
    save,
    sim_config,
)

#: (m, delta, ell) of the simulated grid.
SHAPES = ((24, 6, 3), (32, 4, 2))
BASE = "exp:0.02"
#: Live instances (pairs of runs) per delay pattern: most where the gain depends on the
#: straggler draw (persistent stragglers); i.i.d. runs at the largest K, so fewer there.
LIVE_PAIRS = {"iid": 4, "straggle": 8, "moving": 4}


def moving_trace(path: Path, m: int, *, factor: float = 5.0, period_s: float = 2.0,
                 windows: int = 400, stride: int = 4) -> str:
    """Write a fail-slow trace: ``m // stride`` workers spaced ``stride`` apart are ``factor``
    times slower for ``period_s`` schedule seconds, then the set moves on by one worker.
    Returns the delay spec (``trace:PATH,BASE``)."""
    lines = ["start,end,workers,factor"]
    for w in range(windows):
        who = ";".join(str((w + k * stride) % m) for k in range(m // stride))
        end = "inf" if w == windows - 1 else f"{(w + 1) * period_s:g}"
        lines.append(f"{w * period_s:g},{end},{who},{factor:g}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return f"trace:{path},{BASE}"


def _delays(m: int, where: Path) -> dict[str, str]:
    return {"iid": BASE, "straggle": f"straggle:0.25,5,{BASE}",
            "moving": moving_trace(where / f"moving_m{m}.csv", m)}


def _sim_cell(m: int, delta: int, ell: int, delay: str, instances: int, rounds: int,
              seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(static, adaptive) round times (C, R) and the fraction of rounds on adaptive orders."""
    from aiogc.sim.adaptive import adaptive_times
    from aiogc.sim.fast import build_schemes, exact_times, schedule_for

    st, ad, used = np.empty((instances, rounds)), np.empty((instances, rounds)), 0.0
    for c in range(instances):
        cfg = sim_config(workers=m, delta=delta, n_parts=ell, delay=delay, rounds=rounds,
                         seed=seed + 1000 * c)
        built = build_schemes(cfg, ["partial"])
        sched = schedule_for(cfg, built)
        st[c] = exact_times(built["partial"], sched)[1]
        _, ad[c], adopted = adaptive_times(built["partial"], sched)
        used += float(adopted.mean()) / instances
    return st, ad, used


def _live_run(cfg: Any, sched: Any, auto: bool) -> tuple[np.ndarray, dict[str, Any]]:
    """One live run (loopback, coroutines): round times (emulated s) and its fidelity."""
    from aiogc.harness.local import run_live
    from aiogc.harness.options import RunOptions

    res = run_live(cfg, ["partial"], RunOptions(mode="coroutines", out_dir=None, verify=False,
                                                auto_time_scale=auto), schedule=sched)
    fid = res.extra_summary.get("fidelity", {})
    return np.array([r.duration_s for r in res.records["partial"]]), fid


def _live_cell(delay: str, rounds: int, seed: int, pairs: int
               ) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(static, adaptive) round times (pairs, rounds) and the fidelity of the runs.

    Pair ``p`` is one code instance and delay draw (seed ``seed + 1000 p``) run once per
    ordering on the same materialised schedule, the two runs back to back and in alternating
    order (static first in even pairs), so that the machine's drift cancels in the paired
    difference. The time scale K is chosen once per cell by ``--time-scale auto`` (the first
    run's calibration) and used by every run of the cell; each run's own fidelity verdict
    (live against the simulated run of its own ordering) is kept.
    """
    from aiogc.config import RunConfig
    from aiogc.sim.fast import build_schemes, schedule_for

    out: dict[str, list[np.ndarray]] = {"optimal": [], "adaptive": []}
    fids: list[dict[str, Any]] = []
    k: float | None = None
    for p in range(pairs):
        base = RunConfig(workers=24, delta=6, n_parts=3, rounds=rounds, delay=delay,
                         seed=seed + 1000 * p, task="linreg")
        sched = schedule_for(base, build_schemes(base, ["partial"]))
        for ordering in (("optimal", "adaptive") if p % 2 == 0 else ("adaptive", "optimal")):
            cfg = base.replace(ordering=ordering, time_scale=k if k is not None else 1.0)
            times, fid = _live_run(cfg, sched, auto=k is None)
            k = float(fid.get("time_scale", 1.0)) if k is None else k
            out[ordering].append(times)
            fids.append(fid)
    n = min(len(t) for ts in out.values() for t in ts)
    faithful = sum(f.get("verdict") == "faithful" for f in fids)
    worst = max((float(f.get("worst_ratio", float("nan"))) for f in fids), default=float("nan"))
    return (np.array([t[:n] for t in out["optimal"]]), np.array([t[:n] for t in out["adaptive"]]),
            {"time_scale": k, "faithful_runs": faithful, "runs": len(fids),
             "worst_ratio": worst})


def _row(kind: str, shape: tuple[int, int, int], pattern: str, st: np.ndarray,
         ad: np.ndarray, rng: np.random.Generator, **extra: Any) -> Row:
    s, slo, shi = mean_ci(st, rng=rng)
    a, alo, ahi = mean_ci(ad, rng=rng)
    d, dlo, dhi = mean_ci(ad - st, rng=rng)
    m, delta, ell = shape
    return {"kind": kind, "m": m, "delta": delta, "ell": ell, "pattern": pattern,
            "instances": st.shape[0], "rounds": st.shape[1],
            "static_ms": 1e3 * s, "static_lo": 1e3 * slo, "static_hi": 1e3 * shi,
            "adaptive_ms": 1e3 * a, "adaptive_lo": 1e3 * alo, "adaptive_hi": 1e3 * ahi,
            "diff_ms": 1e3 * d, "diff_lo": 1e3 * dlo, "diff_hi": 1e3 * dhi,
            "diff_pct": 100 * d / s, **extra}


def compute(quick: bool, seed: int, where: Path | None = None) -> list[Row]:
    import tempfile

    tmp = tempfile.TemporaryDirectory() if where is None else None
    base = Path(tmp.name) if tmp is not None else Path(where)  # type: ignore[arg-type]
    instances, rounds = (2, 60) if quick else (8, 200)
    live_rounds = 12 if quick else 30
    shapes = SHAPES[:1] if quick else SHAPES
    tick = cells(len(shapes) * 3 + 3)
    rows: list[Row] = []
    try:
        for k, (m, delta, ell) in enumerate(shapes):
            for pattern, spec in _delays(m, base).items():
                st, ad, used = _sim_cell(m, delta, ell, spec, instances, rounds, seed)
                rows.append(_row("simulated", (m, delta, ell), pattern, st, ad,
                                 boot_rng(seed, k, len(rows)), adopted=used))
                tick(rows)
        for pattern, spec in _delays(24, base).items():
            pairs = 1 if quick else LIVE_PAIRS[pattern]
            st1, ad1, fid = _live_cell(spec, live_rounds, seed, pairs)
            rows.append(_row("live", (24, 6, 3), pattern, st1, ad1,
                             boot_rng(seed, 99, len(rows)), **fid))
            tick(rows)
    finally:
        if tmp is not None:
            tmp.cleanup()
    return rows


def plot(rows: list[Row], path: Path) -> None:
    p = plt()
    fig, ax = p.subplots(figsize=(8, 4))
    labels = [f"{r['kind'][:4]} m={r['m']} ℓ={r['ell']}\n{r['pattern']}" for r in rows]
    x = np.arange(len(rows))
    d = np.array([r["diff_ms"] for r in rows])
    err = np.array([[r["diff_ms"] - r["diff_lo"] for r in rows],
                    [r["diff_hi"] - r["diff_ms"] for r in rows]])
    ax.errorbar(x, d, yerr=err, fmt="o", capsize=3)
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("adaptive − static optimal (ms / round)")
    ax.set_title("Adaptive ordering: mean round time difference, 95% CI")
    save(fig, path)


def summarise(rows: list[Row]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in rows:
        key = f"{r['kind']}|m={r['m']}|delta={r['delta']}|ell={r['ell']}|{r['pattern']}"
        out[key] = {"static_ms": fmt_ci(r["static_ms"], r["static_lo"], r["static_hi"]),
                    "adaptive_ms": fmt_ci(r["adaptive_ms"], r["adaptive_lo"],
                                          r["adaptive_hi"]),
                    "diff_ms": fmt_ci(r["diff_ms"], r["diff_lo"], r["diff_hi"]),
                    "diff_pct": round(float(r["diff_pct"]), 2)}
    return out


EXPERIMENT = Experiment(
    "adaptive-ordering", compute, plot, summarise,
    "partial, cyclic (m, δ, ℓ) ∈ {(24, 6, 3), (32, 4, 2)}; delays exp:0.02 (iid), "
    "straggle:0.25,5,exp:0.02, a fail-slow trace moving between workers (factor 5); static "
    "optimal vs adaptive order, 8 instances x 200 rounds simulated; live at (24, 6, 3): 4 "
    "(iid, moving) / 8 (straggle) instances x 30 rounds, the two orderings' runs "
    "interleaved, K from --time-scale auto (quick: (24, 6, 3) only, 2 x 60 simulated, 1 x 12 live)")

__all__ = ["EXPERIMENT", "moving_trace"]
