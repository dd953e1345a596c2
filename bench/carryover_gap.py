"""Late vectors carried into the next round: fast path against the protocol engine and live.

In ``original`` and ``ignore-stragglers`` a worker sends its coded vector once all its chunks
are done, and the PS ends the round as soon as enough vectors have arrived. A straggler that
finished before the next ``round_start`` reached it has already handed its vector to its
uplink: live, that vector keeps its uplink and the shared PS ingress busy into the next round.
The protocol engine (:mod:`aiogc.sim.protocol`: the same cores on a virtual clock, whose links
persist across rounds as live ones do) charges it, and so does the fast path since
:mod:`aiogc.sim.carry` (before, it started every round with idle links, which is what
``--independent`` measures: each round of the schedule through the fast path on its own).

``grid`` (default): the ``bandwidth`` experiment's grid (cyclic m = 40, δ = 6, ``exp:1.0``,
every rate of both sweeps; original at ℓ = 1..5 and ignore-stragglers with k = m - δ + 1, the
Gaussian decoder), engine against fast path on the same schedules, trial by trial. The
gradient is scaled down by ``--scale S`` (d = 10**6 / S values) and every rate divided by S, so
each frame's wire time is the experiment's to within its header bytes (< 0.1 % at S = 100;
the fast path's means at full d are printed beside, as the check) and the engine's Gaussian
gradients fit in memory.

``live``: one ingress-bound configuration where the carry is large (m = 8, δ = 3, 8 kB
vectors, ``ps=200KB/s``, 2 ms chunks: every round is the ingress's), run live on loopback
(coroutines, at ``--time-scale``) and in both simulators on the same schedule, with the fast
path's old independent rounds beside; the live run's own fidelity ratio is live / fast path.

Usage::

    python bench/carryover_gap.py grid [--instances 2] [--trials 200] [--scale 100]
    python bench/carryover_gap.py live [--rounds 30] [--time-scale 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from aiogc.coding import SchemeChoices, make_scheme
from aiogc.config import CommModel, RunConfig, parse_bandwidth
from aiogc.experiments._common import code_rng, delay_seed
from aiogc.experiments.bandwidth import DELAY, RATES, _spec
from aiogc.sim.comm import FrameBytes
from aiogc.sim.fast import outcomes
from aiogc.sim.protocol import record_arrays, simulate_protocol
from aiogc.training.aggregator import Aggregator
from aiogc.training.delays import materialise
from aiogc.training.schedule import DelaySchedule

M, DELTA, DIM = 40, 6, 1_000_000


def _scaled(comm: CommModel, s: float) -> CommModel:
    def d(v: float | None) -> float | None:
        return None if v is None else v / s

    return CommModel(d(comm.up_Bps), d(comm.down_Bps), d(comm.ps_Bps))


def _fast(scheme: Any, sched: Any, comm: CommModel, dim: int,
          independent: bool = False) -> np.ndarray:
    """The fast path's round times; ``independent``: each round on its own (idle links)."""
    fb = FrameBytes.of(scheme, dim)
    if not independent:
        return outcomes(scheme, sched, comm=comm, frames=fb)[1]
    return np.array([outcomes(scheme, DelaySchedule(sched.compute_s[r:r + 1],
                                                    sched.network_s[r:r + 1]),
                              comm=comm, frames=fb)[1][0] for r in range(sched.rounds)])


class _NoOracle(Aggregator):
    """The aggregator without its oracle check: the grid measures round *times*, and the
    original scheme at ℓ > 1 is Ye–Abbe's, numerically unusable at m = 40 (the ``stability``
    experiment), so its decoded gradients would be rejected; the round ends at the same
    instant either way."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["verify_fn"] = None
        super().__init__(*args, **kwargs)


def _engine(scheme: Any, cfg: RunConfig, sched: Any, comm: CommModel, dim: int) -> np.ndarray:
    """The protocol engine's round times (end - start: a round the norm guard refuses ends
    when it would have been applied)."""
    import aiogc.sim.protocol as proto

    names = vars(proto)  # the module's globals: _run_one builds its Aggregator from there
    saved = names["Aggregator"]
    names["Aggregator"] = _NoOracle
    try:
        recs = proto._run_one(proto.simulation_config(cfg), scheme, sched, latency=0.0,
                              bandwidth_Bps=None, gradients="gaussian", dim=dim, comm=comm)
    finally:
        names["Aggregator"] = saved
    return np.array([np.inf if r.t_end is None else r.t_end - r.t_start for r in recs])


def grid(args: argparse.Namespace) -> None:
    s, seed = float(args.scale), args.seed
    dim = int(DIM / s)
    scheds = [materialise(DELAY, rounds=args.trials, m=M, max_chunks=DELTA,
                          seed=delay_seed(seed, c)) for c in range(args.instances)]
    what = "independent rounds" if args.independent else "rounds in order"
    print(f"# engine vs fast path ({what}), m={M} δ={DELTA} {DELAY}, {args.instances} code "
          f"instances x {args.trials} rounds, d={dim} with rates / {s:g} (experiment: d={DIM})")
    print("| bandwidth | scheme | ℓ | fast, d=1e6 (s) | fast (s) | engine (s) | engine / fast "
          "| rounds slower | largest Δ (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for link, rates in RATES.items():
        for rate in rates:
            full = parse_bandwidth(_spec(link, rate))
            comm = _scaled(full, s)
            for name, ells in (("original", range(1, DELTA)), ("ignore-stragglers", (1,))):
                for ell in ells:
                    kw: dict[str, Any] = ({"k": M - DELTA + 1}
                                          if name == "ignore-stragglers" else {})
                    f_full, f, e = [], [], []
                    for c, sched in enumerate(scheds):
                        sch = make_scheme(name, m=M, delta=DELTA, n_parts=ell,
                                          choices=SchemeChoices(decoding="gaussian"),
                                          rng=code_rng(seed, c), **kw)
                        cfg = RunConfig(workers=M, delta=DELTA, n_parts=ell, rounds=args.trials,
                                        delay=DELAY, seed=seed, decoding="gaussian",
                                        **kw).for_scheme(name)
                        f_full.append(_fast(sch, sched, full, DIM, args.independent))
                        f.append(_fast(sch, sched, comm, dim, args.independent))
                        e.append(_engine(sch, cfg, sched, comm, dim))
                    ff, fa, en = (np.concatenate(x) for x in (f_full, f, e))
                    d = en - fa
                    worst = max(worst, float(en.mean() / fa.mean()))
                    print(f"| {_spec(link, rate)} | {name} | {ell} | {ff.mean():.4f} | "
                          f"{fa.mean():.4f} | {en.mean():.4f} | {en.mean() / fa.mean():.5f} | "
                          f"{int((d > 1e-9).sum())} / {d.size} | {d.max():.3g} |", flush=True)
    print(f"# largest engine / fast ratio of means: {worst:.5f}")


def live(args: argparse.Namespace) -> None:
    from aiogc.harness.kit import materialise_for
    from aiogc.harness.local import run_live
    from aiogc.harness.options import RunOptions
    from aiogc.sim.fast import simulate_fast

    names = ["original", "ignore-stragglers"]
    task = "linreg:samples=400,dim=1000"  # coded vectors of 8,056 bytes
    cfg = RunConfig(workers=8, delta=3, rounds=args.rounds, delay="exp:0.002", seed=args.seed,
                    task=task, heartbeat_s=None, dead_after_s=None,
                    time_scale=float(args.time_scale), bandwidth="ps=200KB/s")
    sched = materialise_for(cfg, names)
    fast = simulate_fast(cfg, names, schedule=sched, dim=1000, comm=cfg.comm)
    eng = simulate_protocol(cfg, names, schedule=sched, comm=cfg.comm, dim=1000,
                            gradients="gaussian")
    with tempfile.TemporaryDirectory(prefix="carryover-") as d:
        t0 = time.monotonic()
        res = run_live(cfg, names, RunOptions(mode="coroutines", out_dir=Path(d), plots=False,
                                              verify=False, progress=False), schedule=sched)
        wall = time.monotonic() - t0
    fid = res.summary["fidelity"]["schemes"]
    print(f"# live (coroutines, K={args.time_scale}, {wall:.0f} s wall) vs engine vs fast path, "
          f"m=8 δ=3 exp:0.002 {task} ps=200KB/s, {args.rounds} rounds, seed {args.seed}")
    print("| scheme | fast, independent rounds (s) | fast (s) | engine (s) | live (s) "
          "| engine / fast | live / engine | live / fast (fidelity ratio) |")
    print("|---|---|---|---|---|---|---|---|")
    for n in names:
        alone = np.mean([simulate_fast(
            cfg.replace(rounds=1), [n], comm=cfg.comm, dim=1000, mse=False,
            schedule=DelaySchedule(sched.compute_s[r:r + 1], sched.network_s[r:r + 1]),
        )[n].completion_s[0] for r in range(sched.rounds)])
        f = float(fast[n].completion_s.mean())
        e = float(record_arrays(eng[n], mode="exact")["completion_s"].mean())
        lv = float(fid[n]["live_mean_s"])
        print(f"| {n} | {alone:.4f} | {f:.4f} | {e:.4f} | {lv:.4f} | {e / f:.3f} | {lv / e:.3f} | "
              f"{fid[n]['ratio']:.3f} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    g = sub.add_parser("grid")
    g.add_argument("--instances", type=int, default=2)
    g.add_argument("--trials", type=int, default=200)
    g.add_argument("--scale", type=float, default=100.0)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--independent", action="store_true",
                   help="the fast path one round at a time (as before aiogc.sim.carry)")
    lv = sub.add_parser("live")
    lv.add_argument("--rounds", type=int, default=30)
    lv.add_argument("--time-scale", type=float, default=3.0)
    lv.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    {"grid": grid, "live": live}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
