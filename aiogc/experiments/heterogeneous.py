"""``heterogeneous``: the speed-aware assignment vs the uniform (cyclic) one on the same
heterogeneous cluster (issue 21 item 2); simulated (fast path, checked against the protocol
engine by ``tests/test_hetero.py``) and live (loopback, coroutines).

Three variants of the partial scheme run on each cluster, all on the same unit-chunk delay
draws (:func:`aiogc.training.cluster.cluster_schedule` scales them by chunk size over worker
speed per variant), so per-round differences are paired:

* ``cyclic-static``: the paper's cyclic assignment and its static optimal order (the natural
  order, a proper colouring), blind to the speeds;
* ``cyclic-aware``: the cyclic assignment with ``ordering=optimal`` on the cluster (the
  speed-aware order where it lowers the expected cover time, :mod:`aiogc.coding.hetero`);
* ``speed-aware``: ``assignment=speed-aware`` (faster workers hold more chunks, every chunk
  still on δ workers) with its speed-aware order.

Simulated only (``stream-chunks`` has no live form), the streaming baseline on the same
cluster and draws: ``stream-cyclic`` / ``stream-aware``, stream-chunks on the cyclic / the
speed-aware assignment (every finished chunk gradient uploaded; done once every chunk arrived
from some holder; ℓ = 1 and free communication, so its price, the uploads, is reported
beside the times).

Live points run at a time scale chosen by ``--time-scale auto`` (the first run; the rest keep
its K) and interleaved: each block draws one schedule and runs every variant on it, in
alternating order (:func:`block_order`), so load drift on the shared machine weighs on every
variant alike. Every run's own fidelity section is kept; a point is faithful only when every
one of its runs is (:func:`point_fidelity`), and an unfaithful point is marked in the CSV,
the summary and the plot, not presented as a result.

Intervals: cluster bootstrap over instances (each its own delay draw; live: each block) and
rounds (:func:`~aiogc.experiments._common.mean_ci`).
"""

from __future__ import annotations

import math
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
SHAPES = ((24, 4, 2), (16, 3, 1))
BASE = "shiftexp:0.01,0.01"
#: variant -> (assignment, ordering)
VARIANTS = {"cyclic-static": ("cyclic", "natural"), "cyclic-aware": ("cyclic", "optimal"),
            "speed-aware": ("speed-aware", "optimal")}
#: The streaming baselines (simulated only: stream-chunks has no live form), variant ->
#: (assignment, ordering) of ``stream-chunks``: every finished chunk gradient uploaded, done
#: once every chunk arrived from some holder; exact, ell = 1, on the same cluster and draws.
STREAM = {"stream-cyclic": ("cyclic", "optimal"), "stream-aware": ("speed-aware", "optimal")}


def clusters(m: int) -> dict[str, tuple[str, str]]:
    """Cluster name -> (worker_speeds, chunk_sizes) specs for ``m`` workers."""
    q = m // 4
    spread = ",".join(f"{2.0 ** (2 * j / (m - 1) - 1):.3g}" for j in range(m))
    sizes = ",".join(("2" if i % 3 == 0 else "1") for i in range(m))
    return {"quarter-slow": (f"1x{m - q},0.25x{q}", "uniform"),  # 1/4 of workers 4x slower
            "spread": (spread, "uniform"),  # speeds 0.5 .. 2, geometric
            "spread+sizes": (spread, sizes)}  # every third chunk twice as large


def _configs(m: int, delta: int, ell: int, speeds: str, sizes: str, rounds: int,
             seed: int) -> dict[str, Any]:
    return {v: sim_config(workers=m, delta=delta, n_parts=ell, delay=BASE, rounds=rounds,
                          seed=seed, assignment=a, ordering=o, worker_speeds=speeds,
                          chunk_sizes=sizes)
            for v, (a, o) in VARIANTS.items()}


def _mean(x: np.ndarray | None) -> float:
    return math.nan if x is None else float(np.mean(x))


def _sim_cell(shape: tuple[int, int, int], speeds: str, sizes: str, instances: int,
              rounds: int, seed: int) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Round times (C, R) of each variant and of the streaming baselines (:data:`STREAM`),
    on shared unit-chunk draws per instance; and the mean vector uploads per round of the
    speed-aware variant and its streaming baseline."""
    from aiogc.sim.fast import build_schemes, schedule_for, simulate_fast

    out = {v: np.empty((instances, rounds)) for v in (*VARIANTS, *STREAM)}
    ups: dict[str, list[float]] = {"speed-aware": [], "stream-aware": []}
    for c in range(instances):
        cfgs = _configs(*shape, speeds, sizes, rounds, seed + 1000 * c)
        built = {v: build_schemes(cfg, ["partial"])["partial"] for v, cfg in cfgs.items()}
        # streaming is ell = 1 whatever the shape: same draws, same cluster, its own scheme
        s_cfgs = {v: cfgs["speed-aware"].replace(scheme="stream-chunks", n_parts=1,
                                                 assignment=a, ordering=o)
                  for v, (a, o) in STREAM.items()}
        s_built = {v: build_schemes(cfg, ["stream-chunks"])["stream-chunks"]
                   for v, cfg in s_cfgs.items()}
        sched = schedule_for(cfgs["speed-aware"], built)  # wide enough for every variant
        for v, cfg in cfgs.items():
            res = simulate_fast(cfg, ["partial"], schedule=sched, built={"partial": built[v]})
            out[v][c] = res["partial"].completion_s
            if v == "speed-aware":
                ups[v].append(_mean(res["partial"].uploads))
        for v, cfg in s_cfgs.items():
            res = simulate_fast(cfg, ["stream-chunks"], schedule=sched,
                                built={"stream-chunks": s_built[v]})
            out[v][c] = res["stream-chunks"].completion_s
            if v == "stream-aware":
                ups[v].append(_mean(res["stream-chunks"].uploads))
    return out, {v: float(np.mean(x)) for v, x in ups.items()}


#: Live variants, run in alternating order block by block (cyclic-aware only where its orders
#: differ from cyclic-static's: the same scheme would run twice).
LIVE_VARIANTS = ("cyclic-static", "cyclic-aware", "speed-aware")


def block_order(variants: tuple[str, ...], block: int) -> tuple[str, ...]:
    """The order the live variants run in within ``block``: forward in even blocks, reversed
    in odd ones, so a load that drifts over the experiment weighs on every variant alike."""
    return variants if block % 2 == 0 else variants[::-1]


def point_fidelity(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A live point's verdict from its runs' ``fidelity`` sections: faithful only when every
    run was (an unfaithful run measured Python, not the schedule, and its pair with it).

    Returns
    -------
    dict
        ``fidelity`` ("faithful" / "unfaithful"), ``runs_faithful`` ("n/N"), ``worst_ratio``
        (the largest live / simulated round-time ratio, or its inverse, over the runs),
        ``time_scale`` (the largest K used) and ``reasons`` (the unfaithful runs' reasons).
    """
    ok = [f.get("verdict") == "faithful" for f in runs]
    reasons = [r for f in runs for r in f.get("reasons", [])]
    return {"fidelity": "faithful" if runs and all(ok) else "unfaithful",
            "runs_faithful": f"{sum(ok)}/{len(runs)}",
            "worst_ratio": max((float(f.get("worst_ratio", math.inf)) for f in runs),
                               default=math.nan),
            "time_scale": max((float(f.get("time_scale", 1.0)) for f in runs),
                              default=math.nan),
            "reasons": "; ".join(dict.fromkeys(reasons))}


def _live_cell(speeds: str, sizes: str, blocks: int, rounds: int,
               seed: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Round times (blocks, rounds) of each live variant, and the point's fidelity.

    Block ``b`` materialises one schedule (seed ``seed + 1000 b``, as the simulated
    instances) and runs every variant on it, in :func:`block_order`; the first run chooses
    the time scale (``--time-scale auto`` on the speed-aware variant, whose rounds are the
    shortest, so the largest K), and every other run keeps that K so the pairs differ in the
    assignment only. Each run's own fidelity section is kept (:func:`point_fidelity`).
    """
    from aiogc.harness.local import run_live
    from aiogc.harness.options import RunOptions
    from aiogc.sim.fast import build_schemes, schedule_for

    out: dict[str, list[np.ndarray]] = {v: [] for v in LIVE_VARIANTS}
    fids: list[dict[str, Any]] = []
    k: float | None = None
    ran_aware = False
    first = ("speed-aware", *[v for v in LIVE_VARIANTS if v != "speed-aware"])
    for b in range(blocks):
        cfgs = {v: c.replace(task="linreg", heartbeat_s=1.0, dead_after_s=5.0,
                             round_timeout_s=60.0)
                for v, c in _configs(16, 3, 1, speeds, sizes, rounds, seed + 1000 * b).items()}
        built = {v: build_schemes(cfg, ["partial"])["partial"] for v, cfg in cfgs.items()}
        same = all(np.array_equal(a, c) for a, c in zip(built["cyclic-aware"].orders,
                                                         built["cyclic-static"].orders,
                                                         strict=True))
        sched = schedule_for(cfgs["speed-aware"], built)  # wide enough for every variant
        order = first if b == 0 else block_order(LIVE_VARIANTS, b)
        for v in order:
            if v == "cyclic-aware" and same:
                continue  # the same scheme as cyclic-static: its rounds are copied below
            cfg = cfgs[v] if k is None else cfgs[v].replace(time_scale=k)
            res = run_live(cfg, ["partial"], RunOptions(
                mode="coroutines", out_dir=None, verify=False, auto_time_scale=k is None),
                schedule=sched)
            fid = res.summary.get("fidelity", {})
            fids.append(fid)
            k = float(fid.get("time_scale", cfg.time_scale)) if k is None else k
            out[v].append(np.array([r.duration_s for r in res.records["partial"]]))
        if same:
            out["cyclic-aware"].append(out["cyclic-static"][-1])
        ran_aware = ran_aware or not same
    n = min(x.size for xs in out.values() for x in xs)
    times = {v: np.stack([x[:n] for x in xs]) for v, xs in out.items()}
    info = point_fidelity(fids)
    info["cyclic_aware_live"] = "ran" if ran_aware else "same orders as cyclic-static"
    return times, info


def _row(kind: str, shape: tuple[int, int, int], cluster: str, t: dict[str, np.ndarray],
         rng: np.random.Generator) -> Row:
    m, delta, ell = shape
    row: Row = {"kind": kind, "m": m, "delta": delta, "ell": ell, "cluster": cluster,
                "instances": t["speed-aware"].shape[0], "rounds": t["speed-aware"].shape[1]}
    for v, x in t.items():
        e, lo, hi = mean_ci(x, rng=rng)
        key = v.replace("-", "_")
        row.update({f"{key}_ms": 1e3 * e, f"{key}_lo": 1e3 * lo, f"{key}_hi": 1e3 * hi})
    base = t["cyclic-static"]
    d, dlo, dhi = mean_ci(t["speed-aware"] - base, rng=rng)
    row.update({"diff_ms": 1e3 * d, "diff_lo": 1e3 * dlo, "diff_hi": 1e3 * dhi,
                "diff_pct": 100 * d / float(np.mean(base))})
    if "stream-aware" in t:  # the streaming baseline against partial, same assignment
        d, dlo, dhi = mean_ci(t["stream-aware"] - t["speed-aware"], rng=rng)
        row.update({"stream_diff_ms": 1e3 * d, "stream_diff_lo": 1e3 * dlo,
                    "stream_diff_hi": 1e3 * dhi})
    return row


def compute(quick: bool, seed: int) -> list[Row]:
    instances, rounds = (2, 60) if quick else (8, 300)
    blocks, live_rounds = (2, 8) if quick else (6, 15)
    shapes = SHAPES[:1] if quick else SHAPES
    live_clusters = ("quarter-slow",) if quick else tuple(clusters(16))
    tick = cells(len(shapes) * 3 + len(live_clusters))
    rows: list[Row] = []
    for k, shape in enumerate(shapes):
        for name, (speeds, sizes) in clusters(shape[0]).items():
            t, ups = _sim_cell(shape, speeds, sizes, instances, rounds, seed)
            row = _row("simulated", shape, name, t, boot_rng(seed, k, len(rows)))
            row.update({"speed_aware_uploads": ups["speed-aware"],
                        "stream_aware_uploads": ups["stream-aware"]})
            rows.append(row)
            tick(rows)
    for name in live_clusters:
        speeds, sizes = clusters(16)[name]
        t, info = _live_cell(speeds, sizes, blocks, live_rounds, seed)
        rows.append({**_row("live", (16, 3, 1), name, t, boot_rng(seed, 99, len(rows))),
                     **info})
        tick(rows)
    return rows


def plot(rows: list[Row], path: Path) -> None:
    p = plt()
    fig, ax = p.subplots(figsize=(max(9.0, 1.3 * len(rows)), 4))
    x = np.arange(len(rows))
    for off, (v, mark) in zip((-0.3, -0.1, 0.1, 0.3),
                              (("cyclic_static", "o"), ("cyclic_aware", "s"),
                               ("speed_aware", "^"), ("stream_aware", "v")), strict=True):
        have = [i for i, r in enumerate(rows) if r.get(f"{v}_ms") is not None]
        if not have:
            continue
        y = np.array([rows[i][f"{v}_ms"] for i in have])
        err = np.array([[rows[i][f"{v}_ms"] - rows[i][f"{v}_lo"] for i in have],
                        [rows[i][f"{v}_hi"] - rows[i][f"{v}_ms"] for i in have]])
        ax.errorbar(x[have] + off, y, yerr=err, fmt=mark, capsize=3,
                    label=v.replace("_", "-") + (" (sim only)" if v == "stream_aware" else ""))
    ax.set_xticks(x, [_label(r) for r in rows], fontsize=7)
    ax.set_ylabel("mean round time (ms), 95% CI")
    ax.set_title("Heterogeneous cluster: speed-aware vs uniform (cyclic) assignment")
    ax.legend(fontsize=8)
    save(fig, path)


def _label(r: Row) -> str:
    """A plot label; an unfaithful live point says so (its numbers are not a result)."""
    live_bad = r["kind"] == "live" and r.get("fidelity") != "faithful"
    mark = "\nUNFAITHFUL" if live_bad else ""
    return f"{r['kind'][:4]} m={r['m']} δ={r['delta']} ℓ={r['ell']}\n{r['cluster']}{mark}"


def summarise(rows: list[Row]) -> dict[str, Any]:
    """Per point: each variant's mean round time with its interval and the difference
    speed-aware - cyclic-static; live points add their fidelity (verdict, faithful runs, worst
    ratio, K). An unfaithful live point keeps its numbers under ``unfaithful_not_a_result``
    instead of as the point's figures."""
    out: dict[str, Any] = {}
    for r in rows:
        key = f"{r['kind']}|m={r['m']}|delta={r['delta']}|ell={r['ell']}|{r['cluster']}"
        cell: dict[str, Any] = {v: fmt_ci(r[f"{v}_ms"], r[f"{v}_lo"], r[f"{v}_hi"])
                                for v in ("cyclic_static", "cyclic_aware", "speed_aware")}
        cell["diff_ms"] = fmt_ci(r["diff_ms"], r["diff_lo"], r["diff_hi"])
        cell["diff_pct"] = round(float(r["diff_pct"]), 2)
        for v in ("stream_cyclic", "stream_aware"):
            if r.get(f"{v}_ms") is not None:
                cell[v] = fmt_ci(r[f"{v}_ms"], r[f"{v}_lo"], r[f"{v}_hi"])
        if r.get("stream_diff_ms") is not None:
            cell["stream_minus_speed_aware_ms"] = fmt_ci(r["stream_diff_ms"],
                                                         r["stream_diff_lo"],
                                                         r["stream_diff_hi"])
        if r.get("stream_aware_uploads") is not None:
            cell["uploads_per_round"] = {"speed_aware": round(r["speed_aware_uploads"], 2),
                                         "stream_aware": round(r["stream_aware_uploads"], 2)}
        if r["kind"] == "live":
            fid = {f: r.get(f) for f in ("fidelity", "runs_faithful", "worst_ratio",
                                         "time_scale", "cyclic_aware_live")}
            if fid["fidelity"] != "faithful":
                cell = {"unfaithful_not_a_result": cell, "reasons": r.get("reasons")}
            cell.update(fid)
        out[key] = cell
    return out


EXPERIMENT = Experiment(
    "heterogeneous", compute, plot, summarise,
    "partial, (m, δ, ℓ) ∈ {(24, 4, 2), (16, 3, 1)}; delay shiftexp:0.01,0.01 per unit chunk; "
    "clusters: a quarter of the workers 4x slower, speeds 0.5..2 geometric, the same with "
    "every third chunk twice as large; cyclic + static order vs cyclic + speed-aware order "
    "vs speed-aware assignment + order, and stream-chunks (cyclic / speed-aware, simulated "
    "only); 8 instances x 300 rounds simulated; live at (16, 3, 1) "
    "on the three clusters, 6 interleaved blocks x 15 rounds per variant, --time-scale auto, "
    "each point's fidelity verdict (quick: (24, 4, 2) only, 2 x 60, live 2 x 8 on one)")

__all__ = ["EXPERIMENT", "clusters"]
