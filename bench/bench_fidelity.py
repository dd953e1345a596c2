"""Live fidelity records of bench/run.py, each measured in the same run as its
baseline:

* ``floor_round_vs_sim_m64`` / ``_m256``: the protocol-free floor (bench/floor.py) against the
  simulator on its own schedule: the honest lower bound of a single Python loop here, now;
* ``loop_cpu_vs_floor_m64`` (``_per_conn_m64``): CPU per round of an aiogc coroutine run / the
  one-connection (per-connection) floor's, each as the difference of a long and a short run
  after a warm-up (setup cancels), same m, schedule law and rounds, medians of 3 interleaved;
* ``loop_cpu_vs_work_floor_m64``: the same aiogc CPU per round / the work floor's
  (bench/floor.py ``--mux --work``: the mux floor plus exactly the work the protocol needs --
  per-worker frame tags, real chunk gradients, coded vectors, decode, verify oracle, step),
  measured in the same interleaved trials as the two above (informational);
* ``round_vs_sim_m256_auto``, ``round_vs_sim_m1024_auto`` (``--worker-hosts 2``),
  ``speedup_vs_sim_m256_auto``: ``aiogc run --time-scale auto`` against the simulator replaying
  the run's delays.csv (the bench's own replay, independent of the run's fidelity section);
* ``fidelity_flag_agrees``: over every live run of this stage (the K=1 m=256 runs, made
  unfaithful on purpose, and the auto runs), the fraction whose verdict agrees with the bench's
  independent replay ratio against the threshold, *and* whose own ratio is within 5 % of it.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

#: the fidelity section's default threshold (the verdict's tolerance)
THRESHOLD = 0.10
#: the fidelity section and the bench's own replay must agree this closely
AGREE = 0.05


def floor_ratio(m: int, rounds: int, trials: int, seed0: int = 1, *,
                mux: bool = False) -> dict[str, Any]:
    """Median floor live/sim over ``trials`` seeds (``mux``: the one-connection floor)."""
    from floor import floor_round_vs_sim

    runs = [floor_round_vs_sim(m, rounds=rounds, seed=seed0 + i, mux=mux)
            for i in range(trials)]
    return {"ratio": statistics.median(r["ratio"] for r in runs), "runs": runs}


def _cpu_per_round(fn: Any, short: int, long: int) -> float:
    """CPU seconds per round: (cpu(long) - cpu(short)) / (long - short), after a warm-up run
    (lazy imports and first-use caches would otherwise land in the short run). A dict
    returned by ``fn`` with ``check_cpu_s`` (the work floor's correctness checks, not part of
    a round's work) has that CPU left out."""
    fn(short)
    cpu = []
    for n in (short, long):
        t0 = time.process_time()
        out = fn(n)
        spent = time.process_time() - t0
        if isinstance(out, dict):
            spent -= float(out.get("check_cpu_s", 0.0))
        cpu.append(spent)
    return (cpu[1] - cpu[0]) / (long - short)


#: BLAS and OpenMP pools of one thread in the child that measures CPU: a pool's threads
#: spin-wait after each call (OpenBLAS), so a run's process time varied by tens of ms with the
#: task's set-up solve, which the long-minus-short difference does not cancel; the per-round
#: work (gemv on ~30 x 50 blocks, a 64-row oracle) does not use a pool's threads anyway
_ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def loop_cpu_ratio(m: int, rounds: int, trials: int = 3) -> dict[str, Any]:
    """:func:`loop_cpu_ratio_here` in a child process with one-thread BLAS pools."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = {**os.environ, **_ONE_THREAD}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(here.parent), str(here), *filter(None, [os.environ.get("PYTHONPATH")])])
    out = subprocess.run(
        [sys.executable, "-c", "import json, sys, bench_fidelity as b; "
         "json.dump(b.loop_cpu_ratio_here(*map(int, sys.argv[1:])), sys.stdout)",
         str(m), str(rounds), str(trials)],
        env=env, capture_output=True, text=True, check=True)
    res: dict[str, Any] = json.loads(out.stdout)
    res["blas_threads"] = 1
    return res


def loop_cpu_ratio_here(m: int, rounds: int, trials: int = 3) -> dict[str, Any]:
    """aiogc's CPU per partial round (coroutines on one loop, verify on, no records; its
    default in-process path, one host connection) over each floor's (per connection, mux,
    and the work floor: mux plus the protocol's work, verify on), same m, delta 4, exp:0.01,
    seed: medians of ``trials`` interleaved measurements of all four."""
    from floor import floor_round_vs_sim

    from aiogc.config import RunConfig
    from aiogc.harness.local import run_live
    from aiogc.harness.options import RunOptions

    def aiogc_run(n: int) -> None:
        cfg = RunConfig(workers=m, delta=4, n_parts=1, delay="exp:0.01", rounds=n, seed=1)
        run_live(cfg, ["partial"], RunOptions(mode="coroutines", plots=False))

    def floor_run(n: int, mux: bool, work: bool = False) -> dict[str, Any]:
        return floor_round_vs_sim(m, rounds=n, seed=1, mux=mux, work=work)

    short = max(2, rounds // 5)
    a: list[float] = []
    f: list[float] = []
    fm: list[float] = []
    fw: list[float] = []
    for _ in range(trials):
        a.append(_cpu_per_round(aiogc_run, short, rounds))
        f.append(_cpu_per_round(lambda n: floor_run(n, False), short, rounds))
        fm.append(_cpu_per_round(lambda n: floor_run(n, True), short, rounds))
        fw.append(_cpu_per_round(lambda n: floor_run(n, True, True), short, rounds))
    am, fmed, fmm, fwm = (statistics.median(a), statistics.median(f), statistics.median(fm),
                          statistics.median(fw))
    return {"aiogc_cpu_s_per_round": am, "floor_per_conn_cpu_s_per_round": fmed,
            "floor_mux_cpu_s_per_round": fmm, "floor_work_cpu_s_per_round": fwm,
            "ratio_per_conn": am / fmed if fmed > 0 else math.nan,
            "ratio_mux": am / fmm if fmm > 0 else math.nan,
            "ratio_work": am / fwm if fwm > 0 else math.nan,
            "work_floor_vs_mux_floor": fwm / fmm if fmm > 0 else math.nan,
            "rounds": (short, rounds), "trials": trials,
            "runs_s": {"aiogc": a, "floor_per_conn": f, "floor_mux": fm, "floor_work": fw}}


def agreement(trial: dict[str, Any], *, expect: str) -> dict[str, Any]:
    """Whether a live trial's fidelity verdict agrees with the bench's own replay ratio
    (``trial["round_ratio"]`` etc., from bench/run.py live_vs_sim) and with ``expect``."""
    fid = trial.get("fidelity") or {}
    own = (fid.get("schemes") or {}).get("partial", {}).get("ratio", math.nan)
    indep = trial.get("round_ratio", math.nan)
    speed = trial.get("live_speedup", math.nan) / trial.get("sim_speedup", math.nan) \
        if trial.get("sim_speedup") else math.nan
    ratios = [indep, trial.get("original", {}).get("live_mean_s", math.nan)
              / trial.get("original", {}).get("sim_mean_s", math.nan)
              if trial.get("original", {}).get("sim_mean_s") else math.nan, speed]
    faithful_by_bench = all(math.isfinite(r) and abs(r - 1.0) <= THRESHOLD for r in ratios)
    verdict = fid.get("verdict")
    close = math.isfinite(own) and math.isfinite(indep) and abs(own / indep - 1.0) <= AGREE
    ok = (verdict == ("faithful" if faithful_by_bench else "unfaithful") and close
          and verdict == expect)
    return {"verdict": verdict, "expected": expect, "bench_says_faithful": faithful_by_bench,
            "own_ratio": own, "bench_ratio": indep, "speedup_ratio": speed, "agrees": ok,
            "time_scale": fid.get("time_scale")}
