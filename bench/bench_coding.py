"""Benchmark the coding library: coefficient solve and decode speed.

1. ``PartialScheme.coefficients`` for one worker at m=256, delta=16, ell=4 on a state where the
   exact trigger just holds (random completion order, stopped at the first decodable state).
2. Decode of m=64 pre-stacked payloads of d=1e6 float32 (ell=1, and ell=4 with d/4 payloads),
   interleaved with a plain ``V.sum(axis=0)`` of the same array; ratio = sum_time / decode_time
   (target >= 0.8 for ell=1). Medians over ``--trials`` trials.

Usage: ``python bench/bench_coding.py [--trials 7] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from aiogc.coding import PartialScheme, cyclic_assignment


def _trigger_state(s: PartialScheme, rng: np.random.Generator) -> np.ndarray:
    c = np.zeros(s.m, dtype=np.int64)
    while not s.is_decodable(c):
        j = rng.choice(np.flatnonzero(c < s.loads))
        c[j] += 1
    return c


def bench_coefficients(trials: int, reps: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    s = PartialScheme(cyclic_assignment(256, 16), 4, rng=rng)
    c = _trigger_state(s, rng)
    worker = int(np.argmax(c))  # the busiest worker: most chunks to solve for
    per_call = []
    for _ in range(trials):
        t0 = time.perf_counter()
        for _ in range(reps):
            s.coefficients(worker, c)
        per_call.append((time.perf_counter() - t0) / reps)
    return {"coef_us": statistics.median(per_call) * 1e6, "coef_chunks": float(c[worker])}


def bench_decode(ell: int, trials: int, m: int = 64, d: int = 10**6) -> dict[str, float]:
    rng = np.random.default_rng(1)
    s = PartialScheme(cyclic_assignment(m, 8), ell, rng=rng)
    p = s.payload_len(d)
    V = rng.standard_normal((m, p), dtype=np.float32)
    state = s.loads.copy()  # every worker contributes
    s.decode(V, state, d)
    V.sum(axis=0)
    t_dec, t_sum = [], []
    for _ in range(trials):  # interleaved trials
        t0 = time.perf_counter()
        V.sum(axis=0)
        t1 = time.perf_counter()
        s.decode(V, state, d)
        t2 = time.perf_counter()
        t_sum.append(t1 - t0)
        t_dec.append(t2 - t1)
    dec, sm = statistics.median(t_dec), statistics.median(t_sum)
    return {"ell": ell, "decode_ms": dec * 1e3, "numpy_sum_ms": sm * 1e3, "ratio": sm / dec}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=7, help="trials per measurement (>= 5)")
    ap.add_argument("--reps", type=int, default=50, help="coefficient calls per trial")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    coef = bench_coefficients(args.trials, args.reps)
    decs = [bench_decode(ell, args.trials) for ell in (1, 4)]
    print("| measurement | value |")
    print("|---|---|")
    print(
        f"| coefficients, m=256 delta=16 ell=4, one worker ({int(coef['coef_chunks'])} chunks) "
        f"| {coef['coef_us']:.0f} us/call |"
    )
    for r in decs:
        print(
            f"| decode m=64 d=1e6 float32 ell={r['ell']} | {r['decode_ms']:.2f} ms "
            f"(numpy sum {r['numpy_sum_ms']:.2f} ms, ratio {r['ratio']:.2f}) |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"coefficients": coef, "decode": decs, "trials": args.trials}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
