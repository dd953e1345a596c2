"""Per-round CPU of ``--ordering adaptive`` against the static optimal order, same schedule.

Two measurements, the orderings interleaved, medians over ``--trials``:

* ``engine``: the protocol engine (``aiogc.sim.protocol.simulate_protocol``: PS core, worker
  cores and the aggregator back to back on the virtual clock, no sockets), process CPU per
  round;
* ``live``: ``run_live`` on loopback (coroutines, one process, K = 1, no verify), the run's
  own CPU seconds (``fidelity.cpu.cpu_s``: the process's schedstat) per round.

The difference ``adaptive - static`` is the adaptive machinery's cost per round: the policy
(estimates + order search) plus the plumbing of rounds that carry an ``orders`` field (wire,
the workers' and the aggregator's per-round order switching). Run it against two trees with
``PYTHONPATH`` to compare them::

    PYTHONPATH=$PWD python bench/bench_adaptive.py --trials 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def _engine(cfg: Any, sched: Any, built: Any) -> float:
    from aiogc.sim.protocol import simulate_protocol

    t0 = time.process_time()
    simulate_protocol(cfg, ["partial"], schedule=sched, built=built, verify=False)
    return (time.process_time() - t0) / cfg.rounds


def _live(cfg: Any, sched: Any) -> float:
    from aiogc.harness.local import run_live
    from aiogc.harness.options import RunOptions

    res = run_live(cfg, ["partial"], RunOptions(mode="coroutines", out_dir=None, verify=False),
                   schedule=sched)
    return float(res.extra_summary["fidelity"]["cpu"]["cpu_s"]) / cfg.rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--pattern", choices=("moving", "straggle", "iid"), default="moving")
    ap.add_argument("--no-live", action="store_true")
    a = ap.parse_args()
    from aiogc.config import RunConfig
    from aiogc.experiments.adaptive import BASE, moving_trace
    from aiogc.sim.fast import build_schemes, schedule_for

    with tempfile.TemporaryDirectory() as tmp:
        delay = {"iid": BASE, "straggle": f"straggle:0.25,5,{BASE}",
                 "moving": moving_trace(Path(tmp) / "moving.csv", 24)}[a.pattern]
        base = RunConfig(workers=24, delta=6, n_parts=3, rounds=a.rounds, delay=delay, seed=1,
                         task="linreg")
        built = build_schemes(base, ["partial"])
        sched = schedule_for(base, built)
        got: dict[str, list[float]] = {}
        for t in range(a.trials):
            for ordering in (("optimal", "adaptive") if t % 2 == 0 else ("adaptive", "optimal")):
                cfg = base.replace(ordering=ordering)
                got.setdefault(f"engine_{ordering}", []).append(_engine(cfg, sched, built))
                if not a.no_live:
                    got.setdefault(f"live_{ordering}", []).append(_live(cfg, sched))
    med = {k: 1e3 * statistics.median(v) for k, v in got.items()}
    for kind in ("engine", "live"):
        if f"{kind}_optimal" in med:
            med[f"{kind}_diff"] = med[f"{kind}_adaptive"] - med[f"{kind}_optimal"]
    print(json.dumps({"pattern": a.pattern, "rounds": a.rounds, "trials": a.trials,
                      "cpu_ms_per_round": {k: round(v, 3) for k, v in med.items()}}))


if __name__ == "__main__":
    main()
