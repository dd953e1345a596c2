"""``heterogeneous``: the speed-aware assignment vs the uniform (cyclic) one on the same
heterogeneous cluster; simulated (fast path, checked against the protocol
engine by ``tests/test_hetero.py``) and live (loopback, coroutines).

A cluster is a multiset of worker speeds; where the slow workers sit among the ids matters to
a cyclic assignment (a chunk is slow when all its δ consecutive holders are), not to the
speed-aware one. So every cluster is laid out three ways (:data:`LAYOUTS`): ``contiguous``
(the slow workers one block of ids, the speeds ascending or descending in the id: the worst
case for cyclic), ``interleaved`` (:func:`speed_sorted_interleave`) and ``random`` (several
seeded placements per cell, :func:`layout`).

Four variants of the partial scheme run on each laid-out cluster, all on the same unit-chunk
delay draws (:func:`aiogc.training.cluster.cluster_schedule` scales them by chunk size over
worker speed per variant), so per-round differences are paired:

* ``cyclic-static``: the paper's cyclic assignment on the ids as laid out, and its static
  optimal order (the natural order, a proper colouring), blind to the speeds;
* ``cyclic-aware``: the same assignment with ``ordering=optimal`` on the cluster (the
  speed-aware order where it lowers the expected cover time, :mod:`aiogc.coding.hetero`);
* ``cyclic-relabelled``: the cyclic assignment after the cheapest use of the speeds, a
  relabelling of the workers (:func:`speed_sorted_interleave`: every window of δ consecutive
  ids holds one worker of each speed band), static order -- the best cheap alternative, the
  one the speed-aware assignment's gain is stated against;
* ``speed-aware``: ``assignment=speed-aware`` (faster workers hold more chunks, every chunk
  still on δ workers) with its speed-aware order.

Simulated only (free communication), the streaming baseline on the same cluster and draws:
``stream-cyclic`` / ``stream-aware``, stream-chunks on the cyclic / the speed-aware assignment
(every finished chunk gradient uploaded; done once every chunk arrived from some holder;
ℓ = 1, so its price, the uploads, is reported beside the times).

Live points run on random placements (block ``b`` draws placement ``b``) at a time scale
chosen by ``--time-scale auto`` (the first run; the rest keep its K) and interleaved: each
block draws one schedule and runs every variant on it, in alternating order
(:func:`block_order`), so load drift on the shared machine weighs on every variant alike.
Every run's own fidelity section is kept; a point is faithful only when every one of its runs
is (:func:`point_fidelity`), and an unfaithful point is marked in the CSV, the summary and the
plot, not presented as a result.

Intervals: cluster bootstrap over instances (each its own delay draw; random layouts: each
(placement, draw) pair; live: each block) and rounds
(:func:`~aiogc.experiments._common.mean_ci`).
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
#: How a cluster's speeds are laid out over the worker ids (module docstring).
LAYOUTS = ("contiguous", "interleaved", "random")
#: variant -> (assignment, ordering); ``cyclic-relabelled`` runs on the speed-sorted
#: interleave of the cluster's speeds, the others on the layout.
VARIANTS = {"cyclic-static": ("cyclic", "natural"), "cyclic-aware": ("cyclic", "optimal"),
            "cyclic-relabelled": ("cyclic", "natural"),
            "speed-aware": ("speed-aware", "optimal")}
#: The streaming baselines (simulated only), variant -> (assignment, ordering) of
#: ``stream-chunks``: every finished chunk gradient uploaded, done once every chunk arrived
#: from some holder; exact, ell = 1, on the same cluster and draws.
STREAM = {"stream-cyclic": ("cyclic", "optimal"), "stream-aware": ("speed-aware", "optimal")}


def clusters(m: int) -> dict[str, tuple[np.ndarray, str]]:
    """Cluster name -> (speeds, shape (m,), in the contiguous layout; chunk_sizes spec)."""
    q = m // 4
    spread = np.array([2.0 ** (2 * j / (m - 1) - 1) for j in range(m)])
    sizes = ",".join(("2" if i % 3 == 0 else "1") for i in range(m))
    quarter = np.array([1.0] * (m - q) + [0.25] * q)
    return {"quarter-slow": (quarter, "uniform"),  # 1/4 of workers 4x slower, one block
            "spread": (spread, "uniform"),  # speeds 0.5 .. 2, geometric in the id
            "spread+sizes": (spread, sizes)}  # every third chunk twice as large


def speed_sorted_interleave(speeds: np.ndarray, delta: int) -> np.ndarray:
    """The speeds relabelled so that every δ consecutive ids hold one worker of each band.

    The workers sorted fastest first (stable) are cut into δ bands, band ``b`` as large as
    the number of ids ``p < m`` with ``p mod δ = b``; id ``p`` gets the ``(p // δ)``-th worker
    of band ``p mod δ``. A cyclic chunk's δ holders are consecutive ids, so (when δ divides
    m, and up to the wrap-around otherwise) each chunk has one holder from the fastest band.

    Parameters
    ----------
    speeds : ndarray, shape (m,)
    delta : int
        The replication, 1 <= delta <= m.

    Returns
    -------
    ndarray, shape (m,)
        The same multiset of speeds, laid out.
    """
    m = speeds.size
    ranked = speeds[np.argsort(-speeds, kind="stable")]
    sizes = [len(range(b, m, delta)) for b in range(delta)]
    offset = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return np.array([ranked[offset[p % delta] + p // delta] for p in range(m)])


def layout(speeds: np.ndarray, name: str, delta: int, seed: int, placement: int = 0
           ) -> np.ndarray:
    """``speeds`` (contiguous) laid out as ``name`` (:data:`LAYOUTS`); ``random``: a seeded
    permutation, placement ``placement`` of seed ``seed``. Shape (m,)."""
    if name == "contiguous":
        return speeds.copy()
    if name == "interleaved":
        return speed_sorted_interleave(speeds, delta)
    if name == "random":
        return speeds[np.random.default_rng([int(seed), 0x1A40, int(placement)])
                      .permutation(speeds.size)]
    raise ValueError(f"layout {name!r} not in {LAYOUTS}")


def _spec(speeds: np.ndarray) -> str:
    return ",".join(f"{float(v):.6g}" for v in speeds)


def _configs(m: int, delta: int, ell: int, speeds: np.ndarray, sizes: str, rounds: int,
             seed: int) -> dict[str, Any]:
    relabelled = _spec(speed_sorted_interleave(speeds, delta))
    return {v: sim_config(workers=m, delta=delta, n_parts=ell, delay=BASE, rounds=rounds,
                          seed=seed, assignment=a, ordering=o, chunk_sizes=sizes,
                          worker_speeds=relabelled if v == "cyclic-relabelled"
                          else _spec(speeds))
            for v, (a, o) in VARIANTS.items()}


def _mean(x: np.ndarray | None) -> float:
    return math.nan if x is None else float(np.mean(x))


def _sim_cell(shape: tuple[int, int, int], speeds: np.ndarray, sizes: str, instances: int,
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


def _layout_cell(shape: tuple[int, int, int], speeds: np.ndarray, sizes: str, name: str,
                 placements: int, instances: int, rounds: int, seed: int
                 ) -> tuple[dict[str, np.ndarray], dict[str, float], list[float]]:
    """:func:`_sim_cell` on layout ``name`` of ``speeds``; ``random`` pools ``placements``
    placements (each on the same ``instances`` draws) into (placements * C, R) arrays and
    also returns each placement's speed-aware - cyclic-static difference in percent."""
    n = placements if name == "random" else 1
    parts = [_sim_cell(shape, layout(speeds, name, shape[1], seed, p), sizes, instances,
                       rounds, seed) for p in range(n)]
    times = {v: np.concatenate([t[v] for t, _ in parts]) for v in parts[0][0]}
    ups = {v: float(np.mean([u[v] for _, u in parts])) for v in parts[0][1]}
    per = [100 * float(np.mean(t["speed-aware"] - t["cyclic-static"]))
           / float(np.mean(t["cyclic-static"])) for t, _ in parts]
    return times, ups, per


#: Live variants, run in alternating order block by block (cyclic-aware only where its orders
#: differ from cyclic-static's: the same scheme would run twice).
LIVE_VARIANTS = ("cyclic-static", "cyclic-aware", "cyclic-relabelled", "speed-aware")


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


def _live_cell(speeds: np.ndarray, sizes: str, blocks: int, rounds: int,
               seed: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Round times (blocks, rounds) of each live variant, and the point's fidelity.

    Block ``b`` lays the cluster out at random (placement ``b``), materialises one schedule
    (seed ``seed + 1000 b``, as the simulated instances) and runs every variant on it, in
    :func:`block_order`; the first run chooses the time scale (``--time-scale auto`` on the
    speed-aware variant, whose rounds are the shortest, so the largest K), and every other
    run keeps that K so the pairs differ in the assignment only. Each run's own fidelity
    section is kept (:func:`point_fidelity`).
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
        laid = layout(speeds, "random", 3, seed, b)
        cfgs = {v: c.replace(task="linreg", heartbeat_s=1.0, dead_after_s=5.0,
                             round_timeout_s=60.0)
                for v, c in _configs(16, 3, 1, laid, sizes, rounds, seed + 1000 * b).items()}
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


#: Differences reported per row: name -> (minuend, subtrahend); ``diff`` is the headline,
#: the speed-aware assignment against the best cheap alternative.
DIFFS = {"diff": ("speed-aware", "cyclic-relabelled"),
         "layout_diff": ("speed-aware", "cyclic-static"),
         "relabel_diff": ("cyclic-relabelled", "cyclic-static")}


def _row(kind: str, shape: tuple[int, int, int], cluster: str, lay: str, placements: int,
         t: dict[str, np.ndarray], rng: np.random.Generator) -> Row:
    m, delta, ell = shape
    row: Row = {"kind": kind, "m": m, "delta": delta, "ell": ell, "cluster": cluster,
                "layout": lay, "placements": placements,
                "instances": t["speed-aware"].shape[0], "rounds": t["speed-aware"].shape[1]}
    for v, x in t.items():
        e, lo, hi = mean_ci(x, rng=rng)
        key = v.replace("-", "_")
        row.update({f"{key}_ms": 1e3 * e, f"{key}_lo": 1e3 * lo, f"{key}_hi": 1e3 * hi})
    for name, (a, b) in DIFFS.items():
        d, dlo, dhi = mean_ci(t[a] - t[b], rng=rng)
        row.update({f"{name}_ms": 1e3 * d, f"{name}_lo": 1e3 * dlo, f"{name}_hi": 1e3 * dhi,
                    f"{name}_pct": 100 * d / float(np.mean(t[b]))})
    if "stream-aware" in t:  # the streaming baseline against partial, same assignment
        d, dlo, dhi = mean_ci(t["stream-aware"] - t["speed-aware"], rng=rng)
        row.update({"stream_diff_ms": 1e3 * d, "stream_diff_lo": 1e3 * dlo,
                    "stream_diff_hi": 1e3 * dhi})
    return row


def compute(quick: bool, seed: int) -> list[Row]:
    instances, rounds, placements = (2, 60, 2) if quick else (8, 300, 5)
    blocks, live_rounds = (2, 8) if quick else (6, 15)
    shapes = SHAPES[:1] if quick else SHAPES
    live_clusters = ("quarter-slow",) if quick else tuple(clusters(16))
    tick = cells(len(shapes) * 3 * len(LAYOUTS) + len(live_clusters))
    rows: list[Row] = []
    for k, shape in enumerate(shapes):
        for name, (speeds, sizes) in clusters(shape[0]).items():
            for lay in LAYOUTS:
                t, ups, per = _layout_cell(shape, speeds, sizes, lay, placements, instances,
                                           rounds, seed)
                row = _row("simulated", shape, name, lay,
                           placements if lay == "random" else 1, t,
                           boot_rng(seed, k, len(rows)))
                row.update({"speed_aware_uploads": ups["speed-aware"],
                            "stream_aware_uploads": ups["stream-aware"],
                            "placement_layout_diff_pct": ", ".join(f"{x:.1f}" for x in per)})
                rows.append(row)
                tick(rows)
    for name in live_clusters:
        speeds, sizes = clusters(16)[name]
        t, info = _live_cell(speeds, sizes, blocks, live_rounds, seed)
        rows.append({**_row("live", (16, 3, 1), name, "random", blocks, t,
                            boot_rng(seed, 99, len(rows))), **info})
        tick(rows)
    return rows


def plot(rows: list[Row], path: Path) -> None:
    p = plt()
    fig, ax = p.subplots(figsize=(max(9.0, 0.9 * len(rows)), 4.5))
    x = np.arange(len(rows))
    for off, (v, mark) in zip((-0.3, -0.1, 0.1, 0.3),
                              (("cyclic_static", "o"), ("cyclic_relabelled", "s"),
                               ("speed_aware", "^"), ("stream_aware", "v")), strict=True):
        have = [i for i, r in enumerate(rows) if r.get(f"{v}_ms") is not None]
        if not have:
            continue
        y = np.array([rows[i][f"{v}_ms"] for i in have])
        err = np.array([[rows[i][f"{v}_ms"] - rows[i][f"{v}_lo"] for i in have],
                        [rows[i][f"{v}_hi"] - rows[i][f"{v}_ms"] for i in have]])
        ax.errorbar(x[have] + off, y, yerr=err, fmt=mark, capsize=3,
                    label=v.replace("_", "-") + (" (sim only)" if v == "stream_aware" else ""))
    ax.set_xticks(x, [_label(r) for r in rows], fontsize=6)
    ax.set_ylabel("mean round time (ms), 95% CI")
    ax.set_title("Heterogeneous cluster: speed-aware vs cyclic, as laid out and relabelled")
    ax.legend(fontsize=8)
    save(fig, path)


def _label(r: Row) -> str:
    """A plot label; an unfaithful live point says so (its numbers are not a result)."""
    live_bad = r["kind"] == "live" and r.get("fidelity") != "faithful"
    mark = "\nUNFAITHFUL" if live_bad else ""
    return (f"{r['kind'][:4]} m={r['m']} δ={r['delta']} ℓ={r['ell']}\n{r['cluster']}"
            f"\n{r.get('layout') or ''}{mark}")


def summarise(rows: list[Row]) -> dict[str, Any]:
    """Per point (shape, cluster, layout): each variant's mean round time with its interval
    and the differences of :data:`DIFFS` (``diff``: speed-aware - cyclic-relabelled, the
    headline; ``layout_diff``: speed-aware - cyclic-static as laid out; ``relabel_diff``:
    what relabelling alone gains), random layouts each placement's ``layout_diff`` in
    percent; live points add their fidelity (verdict, faithful runs, worst ratio, K). An
    unfaithful live point keeps its numbers under ``unfaithful_not_a_result`` instead of as
    the point's figures."""
    out: dict[str, Any] = {}
    for r in rows:
        key = (f"{r['kind']}|m={r['m']}|delta={r['delta']}|ell={r['ell']}|{r['cluster']}"
               f"|{r['layout']}")
        cell: dict[str, Any] = {v: fmt_ci(r[f"{v}_ms"], r[f"{v}_lo"], r[f"{v}_hi"])
                                for v in ("cyclic_static", "cyclic_aware",
                                          "cyclic_relabelled", "speed_aware")}
        for name in DIFFS:
            cell[f"{name}_ms"] = fmt_ci(r[f"{name}_ms"], r[f"{name}_lo"], r[f"{name}_hi"])
            cell[f"{name}_pct"] = round(float(r[f"{name}_pct"]), 2)
        if r.get("placement_layout_diff_pct") and r["layout"] == "random":
            cell["placement_layout_diff_pct"] = r["placement_layout_diff_pct"]
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
    "every third chunk twice as large, each laid out contiguous, speed-sorted interleaved and "
    "at random (5 seeded placements); cyclic + static order, cyclic + speed-aware order, "
    "cyclic relabelled by the speed-sorted interleave, speed-aware assignment + order, and "
    "stream-chunks (cyclic / speed-aware, simulated only); 8 instances x 300 rounds per "
    "placement simulated; live at (16, 3, 1) on the three clusters, a random placement per "
    "block, 6 interleaved blocks x 15 rounds per variant, --time-scale auto, each point's "
    "fidelity verdict (quick: (24, 4, 2) only, 2 placements x 2 x 60, live 2 x 8 on one)")

__all__ = ["DIFFS", "EXPERIMENT", "LAYOUTS", "clusters", "layout", "speed_sorted_interleave"]
