"""What locating a liar costs the PS per round, at m=64.

PS and worker cores back to back on the virtual clock (original scheme, cyclic ``delta``, the
PS waiting for two spares). Worker ``--liar`` sends 3x its coded vector every round; with
``evict_after=0`` it is never evicted, so every round is a located round. The bench times the
aggregator's work per round (decode, guard and, in a located round, the leave-one-out
location and the decode without the liar) and reports the median against an honest run of
the same configuration.

    python bench/bench_locate.py                  # m=64, delta=4
    python bench/bench_locate.py --workers 16
    python bench/bench_locate.py --decoder scheme # before: the scheme's decoder per subset
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from aiogc.config import RunConfig
from aiogc.core import PSOptions, Setup, Worker, WorkerCache
from aiogc.core.ps_work import DecodeRound
from aiogc.harness.kit import make_ps, materialise_for
from aiogc.protocol.messages import CodedGradient
from aiogc.sim.engine import Simulation


def _lie(worker: Worker) -> None:
    polled = worker.poll

    def poll() -> Any:
        events, work, out, when = polled()
        fixed = []
        for o in out:
            if isinstance(o.message, CodedGradient):
                from dataclasses import replace
                o = o._replace(message=replace(o.message, payload=3 * o.message.payload))
            fixed.append(o)
        return events, work, fixed, when

    worker.poll = poll  # type: ignore[method-assign]


def run(cfg: RunConfig, liar: int | None, fast: bool = True) -> tuple[list[float], int]:
    schedule = materialise_for(cfg, [cfg.scheme])
    ps, task = make_ps(cfg, schedule=schedule, verify=False, locate=0,
                       options=PSOptions(spare_wait=100.0, spares=2))
    agg = ps.aggregator
    agg.locator.fast = fast
    times: list[float] = []
    inner = agg.run

    def timed(item: Any) -> Any:
        t0 = time.perf_counter()
        out = inner(item)
        if type(item) is DecodeRound:
            times.append(time.perf_counter() - t0)
        return out

    agg.run = timed  # type: ignore[method-assign]
    built: dict[RunConfig, Setup] = {}

    def setup(c: RunConfig) -> Setup:
        if c not in built:
            built[c] = Setup(c, c.build_scheme(), task.chunk_gradient)
        return built[c]

    cache = WorkerCache()
    workers = [Worker(j, setup=setup, cache=cache) for j in range(ps.m)]
    if liar is not None:
        _lie(workers[liar])
    Simulation(ps, workers).run()
    located = sum("located as inconsistent" in r.end_detail for r in ps.records)
    assert all(r.status == "exact" for r in ps.records)
    return times, located


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--delta", type=int, default=4)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--task", default="linreg:samples=2560,dim=256")
    p.add_argument("--decoder", choices=("fast", "scheme"), default="fast",
                   help="fast: one factorisation per decoded subset (aiogc.coding."
                        "leave_one_out); scheme: redundancy_check per leave-one-out set")
    a = p.parse_args(argv)
    cfg = RunConfig(scheme="original", workers=a.workers, delta=a.delta, rounds=a.rounds, seed=1,
                    task=a.task, delay="exp:0.05", heartbeat_s=None, dead_after_s=None)
    honest, _ = run(cfg, None)
    lying, located = run(cfg, 3, fast=a.decoder == "fast")
    h, l_ = statistics.median(honest) * 1e3, statistics.median(lying) * 1e3
    print(f"m={a.workers} delta={a.delta} {a.task} ({a.decoder}): decode+guard per round, "
          f"median of {a.rounds}: honest {h:.2f} ms, located ({located}/{a.rounds} rounds) "
          f"{l_:.2f} ms "
          f"(x{l_ / h:.1f}; max {max(lying) * 1e3:.2f} ms) numpy {np.__version__}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
