"""Benchmark the simulator: ``aiogc simulate`` end to end, and fast path vs protocol engine.

Usage::

    python bench/bench_sim.py [--repeats 5] [--protocol-trials 20]

1. ``aiogc simulate --workers 100 --delta 10 --trials 1000 --schemes partial,original``
   (default fast engine) as a subprocess, ``--repeats`` times; prints the median wall time
   (target: < 10 s on a 2-core machine).
2. Per-trial cost of both engines on the same configuration (m=100, δ=10, exact mode): the fast
   path over 1000 trials vs the protocol engine (state machines on the virtual clock) over
   ``--protocol-trials`` trials; prints seconds per trial and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CLI = [sys.executable, "-m", "aiogc", "simulate", "--workers", "100", "--delta", "10",
       "--trials", "1000", "--schemes", "partial,original", "--delay", "exp:1.0", "--seed", "1",
       "--format", "json"]


def _median_time(fn: object, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--protocol-trials", type=int, default=20)
    args = ap.parse_args(argv)

    def cli() -> None:
        subprocess.run(CLI, check=True, stdout=subprocess.DEVNULL)

    t_cli = _median_time(cli, args.repeats)
    print(f"aiogc simulate m=100 δ=10 1000 trials partial,original (fast engine): "
          f"median {t_cli:.2f} s over {args.repeats} runs (target < 10 s)")

    from aiogc.config import RunConfig
    from aiogc.sim.fast import build_schemes, schedule_for, simulate_fast
    from aiogc.sim.protocol import simulate_protocol

    schemes = ["partial", "original"]
    cfg = RunConfig(workers=100, delta=10, n_parts=1, rounds=1000, delay="exp:1.0", seed=1)
    built = build_schemes(cfg, schemes)
    sched = schedule_for(cfg, built)
    t_fast = _median_time(lambda: simulate_fast(cfg, schemes, schedule=sched, built=built),
                          args.repeats) / cfg.rounds
    pcfg = cfg.replace(rounds=args.protocol_trials)
    t_proto = _median_time(
        lambda: simulate_protocol(pcfg, schemes, schedule=sched, built=built,
                                  gradients="gaussian", dim=120),
        max(1, min(args.repeats, 3))) / pcfg.rounds
    print(f"per trial (both schemes, m=100, δ=10): fast {1e6 * t_fast:.1f} µs, "
          f"protocol {1e3 * t_proto:.1f} ms, ratio protocol/fast = {t_proto / t_fast:.0f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
