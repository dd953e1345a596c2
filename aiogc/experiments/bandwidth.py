"""``bandwidth``: exact round time when bytes cost time, from compute-bound to upload-bound.

The same comparison as ``exact-speedup`` (cyclic, exp:1.0, every scheme, partial and original
at every ℓ) with the communication model of :mod:`aiogc.sim.comm`: gradients of ``d`` float64
values, frames at their wire size, a round start that downloads the model. Two sweeps:

* ``worker``: every worker's upload and download rate (no shared link), from 1 GB/s (an
  8 MB vector in 8 ms against 1 s chunks: compute-bound) down to 1 MB/s (8 s: upload-bound);
* ``ps``: workers at 1 GB/s behind a shared PS ingress (FIFO) from 10 GB/s down to 30 MB/s:
  every upload of the round queues there.

Where partial wins and where it loses: its best ℓ against every baseline at each rate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from aiogc.coding import SchemeChoices, make_scheme
from aiogc.experiments._common import (
    Experiment,
    Row,
    band,
    boot_rng,
    code_rng,
    delay_seed,
    mean_ci,
    plt,
    ratio_of_means_ci,
    save,
    select,
)
from aiogc.training.delays import materialise

__all__ = ["BANDWIDTH", "RATES"]

#: (link, spec) sweeps; rates in bytes per second (decimal units).
RATES: dict[str, tuple[str, ...]] = {
    "worker": ("1GB/s", "100MB/s", "30MB/s", "10MB/s", "3MB/s", "1MB/s"),
    "ps": ("10GB/s", "1GB/s", "300MB/s", "100MB/s", "30MB/s"),
}
DELAY = "exp:1.0"
SCHEMES = ("partial", "original", "uncoded", "stream-chunks", "ignore-stragglers")


def grid(quick: bool) -> dict[str, Any]:
    if quick:
        return {"m": 12, "delta": 3, "dim": 1_000_000, "instances": 2, "trials": 60,
                "rates": {"worker": ("1GB/s", "10MB/s", "1MB/s"), "ps": ("1GB/s", "30MB/s")}}
    return {"m": 40, "delta": 6, "dim": 1_000_000, "instances": 20, "trials": 200,
            "rates": RATES}


def _spec(link: str, rate: str) -> str:
    return f"worker={rate}" if link == "worker" else f"worker=1GB/s,ps={rate}"


def _ells(name: str, delta: int) -> range:
    return range(1, delta) if name in ("partial", "original") else range(1, 2)


def compute(quick: bool, seed: int) -> list[Row]:
    from aiogc.config import parse_bandwidth
    from aiogc.sim.comm import FrameBytes
    from aiogc.sim.fast import outcomes, upload_counts

    g = grid(quick)
    m, delta, dim, C, R = g["m"], g["delta"], g["dim"], g["instances"], g["trials"]
    rows: list[Row] = []
    scheds = [materialise(DELAY, rounds=R, m=m, max_chunks=delta, seed=delay_seed(seed, c))
              for c in range(C)]
    for l_i, (link, rates) in enumerate(g["rates"].items()):
        for r_i, rate in enumerate(rates):
            comm = parse_bandwidth(_spec(link, rate))
            ends: dict[tuple[str, int], np.ndarray] = {}
            ups: dict[tuple[str, int], np.ndarray] = {}
            for name in SCHEMES:
                for ell in _ells(name, delta):
                    e, u = np.empty((C, R)), np.empty((C, R))
                    for c in range(C):
                        kw: dict[str, Any] = ({"k": m - delta + 1}
                                              if name == "ignore-stragglers" else {})
                        s = make_scheme(name, m=m, delta=delta, n_parts=ell,
                                        choices=SchemeChoices(decoding="gaussian"),
                                        rng=code_rng(seed, c), **kw)
                        fb = FrameBytes.of(s, dim)
                        _, e[c], _, st = outcomes(s, scheds[c], comm=comm, frames=fb)
                        u[c] = upload_counts(s, scheds[c], e[c], st, fb, comm=comm)[1]
                    ends[name, ell], ups[name, ell] = e, u
            best = min((k for k in ends if k[0] == "partial"), key=lambda k: ends[k].mean())
            rng = boot_rng(seed, 700 + l_i, r_i)
            for (name, ell), e in ends.items():
                mu, lo, hi = mean_ci(e, rng=rng)
                rat = ratio_of_means_ci(e, ends[best], rng=rng)
                rows.append({"link": link, "rate": rate, "bandwidth": _spec(link, rate),
                             "m": m, "delta": delta, "dim": dim, "delay": DELAY,
                             "instances": C, "trials": R, "scheme": name, "ell": ell,
                             "completion_mean": mu, "completion_lo": lo, "completion_hi": hi,
                             "upload_MB_mean": float(ups[name, ell].mean()) / 1e6,
                             "partial_best_ell": best[1], "over_partial_best": rat[0],
                             "over_partial_best_lo": rat[1], "over_partial_best_hi": rat[2]})
    return rows


_STYLE = {"partial": ("C0", "-"), "original": ("C3", "-"), "uncoded": ("C7", "--"),
          "stream-chunks": ("C2", "--"), "ignore-stragglers": ("C1", ":")}


def _best_rows(rows: list[Row], link: str) -> dict[str, list[Row]]:
    """Per scheme, its best-ℓ row at every rate of ``link`` (in sweep order)."""
    rates = list(dict.fromkeys(r["rate"] for r in select(rows, link=link)))
    out: dict[str, list[Row]] = {}
    for name in _STYLE:
        sel = [min(select(rows, link=link, rate=rt, scheme=name),
                   key=lambda r: r["completion_mean"]) for rt in rates
               if select(rows, link=link, rate=rt, scheme=name)]
        if sel:
            out[name] = sel
    return out


def plot(rows: list[Row], path: Path) -> None:
    p = plt()
    links = list(dict.fromkeys(r["link"] for r in rows))
    fig, axes = p.subplots(1, len(links), figsize=(4.6 * len(links), 3.6), squeeze=False)
    for ax, link in zip(axes[0], links, strict=True):
        best = _best_rows(rows, link)
        for name, sel in best.items():
            color, ls = _STYLE[name]
            x = list(range(len(sel)))
            lab = name + (" (best ℓ)" if name in ("partial", "original") else "")
            band(ax, x, [r["completion_mean"] for r in sel], [r["completion_lo"] for r in sel],
                 [r["completion_hi"] for r in sel], label=lab, color=color, ls=ls)
        rates = [r["rate"] for r in best["partial"]]
        ells = [r["ell"] for r in best["partial"]]
        ax.set_xticks(range(len(rates)), [f"{rt}\nℓ*={e}" for rt, e in zip(rates, ells,
                                                                          strict=True)])
        ax.set_yscale("log")
        ax.set_xlabel("per-worker rate" if link == "worker"
                      else "shared PS ingress (workers at 1GB/s)")
        ax.set_ylabel("mean completion time (s)")
        ax.legend()
    r0 = rows[0]
    fig.suptitle(f"Exact recovery when bytes cost time (cyclic m={r0['m']}, δ={r0['delta']}, "
                 f"d={r0['dim']} float64, {r0['delay']}, {r0['instances']} instances × "
                 f"{r0['trials']} trials; band: 95% CI)")
    save(fig, path)


def summarise(rows: list[Row]) -> dict[str, Any]:
    r0 = rows[0]
    out: dict[str, Any] = {"m": r0["m"], "delta": r0["delta"], "dim": r0["dim"],
                           "instances": r0["instances"], "trials": r0["trials"]}
    for link in dict.fromkeys(r["link"] for r in rows):
        best = _best_rows(rows, link)
        per: dict[str, Any] = {}
        for i, pr in enumerate(best["partial"]):
            cell: dict[str, Any] = {"partial_ell": pr["ell"],
                                    "partial": [round(pr[k], 3) for k in (
                                        "completion_mean", "completion_lo", "completion_hi")]}
            for name, sel in best.items():
                if name != "partial":
                    cell[name] = [round(sel[i][k], 3) for k in (
                        "over_partial_best", "over_partial_best_lo", "over_partial_best_hi")]
            exact = [n for n in ("original", "uncoded", "stream-chunks") if n in cell]
            cell["winner_exact"] = min(["partial", *exact], key=lambda n: 1.0 if n == "partial"
                                       else cell[n][0])
            per[pr["rate"]] = cell
        out[link] = per
    return out


BANDWIDTH = Experiment(
    "bandwidth", compute, plot, summarise,
    "cyclic m=40, δ=6, exp:1.0, d=10^6 float64; worker=1GB/s..1MB/s and worker=1GB/s with "
    "ps=10GB/s..30MB/s; every scheme, partial and original at ℓ=1..5 (best ℓ reported); "
    "20 instances x 200 trials (quick: m=12, δ=3, 2 x 60)")
