"""What the original scheme's spare wait costs in round time (virtual clock, honest rounds).

``--no-verify`` runs of the original scheme wait for one spare vector by default
(``aiogc.harness.evictions.NO_VERIFY_SPARE_WAIT``). This replays honest runs on the protocol
engine's virtual clock (no machine noise: the times are the schedule's) with spare waits 0,
0.25, 0.5 and 1 and prints the mean round time, its ratio to no wait, and the share of rounds
that got their spare::

    python bench/spare_cost.py --workers 8 --delta 3 --rounds 200 --delay exp:0.05 --seeds 3
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections.abc import Callable

from aiogc.config import RunConfig
from aiogc.core import PSOptions
from aiogc.core.common import UNVERIFIED
from aiogc.core.worker import Worker
from aiogc.core.worker_setup import Setup
from aiogc.harness.kit import make_ps, materialise_for
from aiogc.sim.engine import Simulation


def _run(config: RunConfig, spare_wait: float) -> tuple[float, float]:
    schedule = materialise_for(config, [config.scheme])
    counter = itertools.count()
    ps, task = make_ps(config, schedule=schedule, verify=False,
                       options=PSOptions(spare_wait=spare_wait,
                                         nonce_fn=lambda: next(counter).to_bytes(16, "big")))
    built: dict[RunConfig, Setup] = {}

    def setup(cfg: RunConfig) -> Setup:
        if cfg not in built:
            built[cfg] = Setup(cfg, cfg.build_scheme(), task.chunk_gradient)
        return built[cfg]

    def nonces(j: int) -> Callable[[], bytes]:
        return lambda: (next(counter) + (j << 64)).to_bytes(16, "big")

    workers = [Worker(j, setup=setup, nonce_fn=nonces(j)) for j in range(ps.m)]
    Simulation(ps, workers).run()
    recs = ps.records
    mean = statistics.fmean(r.duration_s for r in recs)
    checked = sum(UNVERIFIED not in r.end_detail for r in recs) / len(recs)
    return mean, checked


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--delta", type=int, default=3)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--delay", default="exp:0.05")
    p.add_argument("--seeds", type=int, default=3)
    a = p.parse_args()
    waits = (0.0, 0.25, 0.5, 1.0)
    means: dict[float, list[float]] = {w: [] for w in waits}
    shares: dict[float, list[float]] = {w: [] for w in waits}
    for seed in range(a.seeds):
        config = RunConfig(scheme="original", workers=a.workers, delta=a.delta,
                           rounds=a.rounds, seed=seed, delay=a.delay,
                           task="linreg:samples=240,dim=12", heartbeat_s=None,
                           dead_after_s=None)
        for w in waits:
            mean, share = _run(config, w)
            means[w].append(mean)
            shares[w].append(share)
    base = statistics.median(means[0.0])
    print(f"original, m={a.workers}, delta={a.delta}, {a.rounds} honest rounds, {a.delay}, "
          f"{a.seeds} seeds (medians)")
    print("| spare wait | mean round | vs no wait | rounds cross-checked |")
    print("|---|---|---|---|")
    for w in waits:
        m = statistics.median(means[w])
        print(f"| {w:g} | {m * 1e3:.1f} ms | {m / base:.3f} | "
              f"{statistics.median(shares[w]) * 100:.0f} % |")


if __name__ == "__main__":
    main()
