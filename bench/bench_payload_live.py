"""Compressed coded payloads live, with traffic shaping: interleaved pairs.

Runs ``aiogc run --as coroutines ... --bandwidth worker=100MB/s --time-scale auto --payload-dtype
same`` and ``... float16`` alternately (the order flips every pair), ``--pairs`` times, and
reads each run's ``summary.json`` (fidelity verdict, the simulator's mean on the run's own
delays.csv) and ``rounds.csv`` (round times, rel_error, loss). Only complete runs whose
fidelity section says faithful enter the comparison. A run takes 1-2 minutes on a loaded
2-core machine (``--time-scale auto`` chooses K = 100-1000).

    python bench/bench_payload_live.py --pairs 5 --out /tmp/payload_live
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

BASE = ["--as", "coroutines", "--workers", "16", "--delta", "4", "--task",
        "linreg:samples=160,dim=100000", "--dtype", "float32", "--bandwidth", "worker=100MB/s",
        "--time-scale", "auto", "--schemes", "partial", "--rounds", "20", "--delay", "exp:0.002"]


def one(out: Path, coded: str, seed: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "aiogc", "run", *BASE, "--payload-dtype", coded, "--seed",
           str(seed), "--out", str(out), "--overwrite"]  # a re-run replaces its pairs
    subprocess.run(cmd, check=False, capture_output=True, text=True)
    s = json.loads((out / "summary.json").read_text())
    fid = s.get("fidelity") or {}
    sc = (fid.get("schemes") or {}).get("partial") or {}
    with open(out / "rounds.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "exact"]
    errs = [float(r["rel_error"]) for r in rows if r["rel_error"]]
    return {"payload": coded, "seed": seed, "verdict": fid.get("verdict"),
            "K": fid.get("time_scale"), "live_mean_s": sc.get("live_mean_s"),
            "sim_mean_s": sc.get("sim_mean_s"), "rounds": len(rows),
            "rel_error_median": statistics.median(errs) if errs else None,
            "rel_error_max": max(errs) if errs else None,
            "final_loss": float(rows[-1]["loss"]) if rows else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--out", default="/tmp/payload_live")
    a = p.parse_args(argv)
    print("$ aiogc run " + shlex.join(BASE) + " --payload-dtype same|float16 --seed S")
    runs = []
    for i in range(a.pairs):
        for coded in (("same", "float16") if i % 2 == 0 else ("float16", "same")):
            r = one(Path(a.out) / f"{i}_{coded}", coded, seed=100 + i)
            runs.append(r)
            print(json.dumps(r), flush=True)
    # faithful and complete (a stopped run can still carry a fidelity section)
    ok = [r for r in runs if r["verdict"] == "faithful" and r["rounds"] == 20]
    by = {c: [r for r in ok if r["payload"] == c] for c in ("same", "float16")}
    if all(by.values()):
        live = {c: statistics.mean(r["live_mean_s"] for r in by[c]) for c in by}
        sim = {c: statistics.mean(r["sim_mean_s"] for r in by[c]) for c in by}
        print(f"faithful: same {len(by['same'])}, float16 {len(by['float16'])} of "
              f"{a.pairs} each")
        for what, d in (("live mean round", live), ("simulated (each run's replay)", sim)):
            print(f"{what}: same {1e3 * d['same']:.2f} ms, float16 {1e3 * d['float16']:.2f} "
                  f"ms, saved {100 * (1 - d['float16'] / d['same']):.1f} %")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "pairs.json").write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
