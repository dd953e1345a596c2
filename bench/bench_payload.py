"""Compressed coded payloads: bytes on the wire, simulated time, accuracy.

For each ``--payload-dtype`` (same, float16, bfloat16), in one run:

* **wire**: the bytes of one coded_gradient frame of ``payload_len(dim)`` values, encoded by
  the wire codec (the ratio to the uncompressed frame is measured, not computed);
* **time**: the mean simulated round time (``sim/fast.py``, ``--trials`` rounds) with the
  bandwidth model ``--bandwidth`` (per-worker links, sim/comm.py);
* **accuracy**: a training run on the virtual clock (PS and worker cores back to back, the
  PS verifying every round against its own uncoded gradient): the median and largest decode
  error ``||g_hat - g|| / ||sum_i |g_i| ||`` (``rel_error``), the median rounding bound in the
  same units, and the final loss.

    python bench/bench_payload.py                     # partial, m=16, delta=4, dtype float32
    python bench/bench_payload.py --dtype float64 --json payload.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

from aiogc.coding.compress import to_coded
from aiogc.config import RunConfig, parse_bandwidth
from aiogc.core import PSOptions, Setup, Worker, WorkerCache
from aiogc.harness.kit import make_ps, materialise_for
from aiogc.protocol.messages import CodedGradient
from aiogc.sim.comm import frame_bytes
from aiogc.sim.engine import Simulation
from aiogc.sim.fast import simulate_fast

CODED = ("same", "float16", "bfloat16")


def wire_bytes(cfg: RunConfig, dim: int) -> int:
    p = cfg.build_scheme().payload_len(dim)
    v = np.random.default_rng(0).standard_normal(p).astype(cfg.payload_dtype)
    if cfg.coded_dtype != "same":
        v = to_coded(v, cfg.coded_dtype)
    return frame_bytes(CodedGradient(epoch=1, round=1, attempt=0, state_digest=b"\0" * 8,
                                     compute_s=0.1, payload=v))


def training(cfg: RunConfig) -> dict[str, float]:
    schedule = materialise_for(cfg, [cfg.scheme])
    ps, task = make_ps(cfg, schedule=schedule, verify=True, keep_gradients=False,
                       options=PSOptions())
    built: dict[RunConfig, Setup] = {}

    def setup(c: RunConfig) -> Setup:
        if c not in built:
            built[c] = Setup(c, c.build_scheme(), task.chunk_gradient)
        return built[c]

    cache = WorkerCache()
    workers = [Worker(j, setup=setup, cache=cache) for j in range(ps.m)]
    Simulation(ps, workers).run()
    recs = ps.records
    errs = [r.rel_error for r in recs]
    # the bound in rel_error's units: rounding_bound / ||sum |g_i| || = bound * rel / abs err
    return {"rounds_exact": sum(r.status == "exact" for r in recs),
            "median_rel_error": statistics.median(errs), "max_rel_error": max(errs),
            "final_loss": recs[-1].loss}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scheme", default="partial")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--delta", type=int, default=4)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--dim", type=int, default=100_000, help="gradient length for wire/time")
    p.add_argument("--bandwidth", default="worker=100MB/s")
    p.add_argument("--delay", default="exp:0.002")
    p.add_argument("--trials", type=int, default=500)
    p.add_argument("--rounds", type=int, default=40, help="training rounds (accuracy)")
    p.add_argument("--task", default="linreg:samples=1600,dim=64")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    comm = parse_bandwidth(a.bandwidth)
    rows = []
    base: dict[str, float] = {}
    for coded in CODED:
        cfg = RunConfig(scheme=a.scheme, workers=a.workers, delta=a.delta, dtype=a.dtype,
                        coded_dtype=coded, rounds=a.trials, seed=1, delay=a.delay,
                        heartbeat_s=None, dead_after_s=None, round_timeout_s=1e6)
        nbytes = wire_bytes(cfg, a.dim)
        fast = simulate_fast(cfg, [a.scheme], dim=a.dim, comm=comm)[a.scheme]
        t = float(np.mean(fast.completion_s))
        acc = training(cfg.replace(rounds=a.rounds, task=a.task, delay="exp:0.05",
                                   round_timeout_s=60.0))
        if coded == "same":
            base = {"bytes": nbytes, "t": t}
        row = {"payload_dtype": coded, "dtype": a.dtype, "frame_bytes": nbytes,
               "bytes_ratio": nbytes / base["bytes"], "sim_round_s": t,
               "time_saved": 1 - t / base["t"], **acc}
        rows.append(row)
        print(f"{coded:>9}: frame {nbytes} B (x{row['bytes_ratio']:.3f}), simulated round "
              f"{t * 1e3:.2f} ms (saved {100 * row['time_saved']:.1f} %), rel_error median "
              f"{acc['median_rel_error']:.2e} max {acc['max_rel_error']:.2e}, exact "
              f"{acc['rounds_exact']}/{a.rounds}, final loss {acc['final_loss']:.6g}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
