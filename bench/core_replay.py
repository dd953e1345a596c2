"""core_us_per_worker_round: process CPU inside the PS + worker state machines per worker-round.

Runs a virtual-clock Simulation once (m workers, δ=4, exp:0.01, 30 rounds, gradients
precomputed so the task costs nothing) while recording every call the driver makes into the
state machines, then replays that call sequence on fresh, identical state machines with no
driver and times it with ``time.process_time``: what remains is the cores' own cost.
Prints the median of 5 replays per scheme. Works on protocol v1 trees too (missing methods
are skipped), so ``PYTHONPATH=OTHER_TREE python bench/core_replay.py`` gives the baseline.

    python bench/core_replay.py [--m 64] [--buckets]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from typing import Any

import numpy as np

from aiogc.config import RunConfig
from aiogc.core import Setup, Worker, WorkerCache
from aiogc.harness.kit import make_ps, materialise_for
from aiogc.sim.engine import Simulation

METHODS = ("poll", "receive", "handle_timer", "connection_made",
           "connection_lost", "messages_to_send", "next_event", "next_deadline", "chunks_done",
           "encode_done", "next_work", "work_done", "setup_ready", "start")


def build(scheme: str, m: int, rounds: int) -> tuple[Any, Any, list[Worker]]:
    cfg = RunConfig(scheme=scheme, workers=m, delta=4, rounds=rounds, delay="exp:0.01", seed=1,
                    heartbeat_s=None, dead_after_s=None)
    ps, task = make_ps(cfg, schedule=materialise_for(cfg, [scheme]), verify=False)
    ps.aggregator.loss_fn = None
    sch = ps.scheme
    G = np.stack([task.chunk_gradient(i, task.initial_model()) for i in range(sch.n_chunks)])
    setup = Setup(cfg, sch, lambda chunk, w: G[chunk])
    counter = [0]

    def nonce() -> bytes:
        counter[0] += 1
        return counter[0].to_bytes(16, "big")

    ps.nonce_fn = nonce
    # progress_events=False: what Simulation sets on its workers (the recorded run's)
    kw: dict[str, Any] = {"cache": WorkerCache()}
    return cfg, ps, [Worker(j, setup=lambda c: setup, nonce_fn=nonce, progress_events=False,
                            **kw) for j in range(m)]


def record(scheme: str, m: int, rounds: int) -> tuple[list[tuple[int, str, Any, Any]], int]:
    _, ps, ws = build(scheme, m, rounds)
    log: list[tuple[int, str, Any, Any]] = []
    depth = [0]  # only the driver's calls are recorded, not a core method calling another
    for k, o in enumerate([ps, *ws]):
        for name in METHODS:
            f = getattr(o, name, None)
            if f is None:
                continue

            def rec(*a: Any, _f: Any = f, _k: int = k, _n: str = name, **kw: Any) -> Any:
                if depth[0]:
                    return _f(*a, **kw)
                depth[0] += 1
                try:
                    if _k == 0 and _n == "next_work":
                        return _f(*a, **kw)  # replayed inside the "work_done" entry
                    if _k == 0 and _n == "work_done":
                        # replay the driver's step on the fresh PS: take its own item, run
                        # its own aggregator, answer at the virtual time this driver did
                        log.append((_k, "_work", (), {"now": kw["now"]}))
                        return _f(*a, **kw)
                    log.append((_k, _n, a, kw))
                    return _f(*a, **kw)
                finally:
                    depth[0] -= 1

            setattr(o, name, rec)
    sim = Simulation(ps, ws)
    sim.run()
    assert len(ps.records) == rounds
    return log, sim.frames


def _bound(obj: Any, name: str) -> Any:
    """The replayed call: a core method, or ``_work`` (the PS driver's step on a work item:
    next_work, the aggregator, work_done)."""
    if name != "_work":
        return getattr(obj, name)

    def work(*, now: float) -> None:
        item = obj.next_work()
        obj.work_done(item, obj.aggregator.run(item), now=now)

    return work


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--m", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--buckets", action="store_true", help="time per core method")
    a = ap.parse_args()
    m, rounds = a.m, a.rounds
    for scheme in ("partial", "original"):
        log, frames = record(scheme, m, rounds)
        res = []
        for _ in range(5):
            _, ps, ws = build(scheme, m, rounds)
            objs = [ps, *ws]
            calls = [(_bound(objs[k], n), args, kw) for k, n, args, kw in log]
            t0 = time.process_time()
            for f, args, kw in calls:
                f(*args, **kw)
            res.append((time.process_time() - t0) / (m * rounds) * 1e6)
            assert len(ps.records) == rounds
        res.sort()
        print(f"{scheme} m={m}: core_us_per_worker_round median {res[2]:.1f} us "
              f"(replays {', '.join(f'{x:.1f}' for x in res)}); {len(log)} core calls; "
              f"frames/worker-round {frames / (m * rounds):.2f}")
        if a.buckets:
            _, ps, ws = build(scheme, m, rounds)
            objs = [ps, *ws]
            tot: dict[str, float] = defaultdict(float)
            for k, n, args, kw in log:
                key = ("ps." if k == 0 else "w.") + n + (
                    ":" + args[1].kind if n == "receive" else "")
                t = time.perf_counter()
                _bound(objs[k], n)(*args, **kw)
                tot[key] += time.perf_counter() - t
            for key in sorted(tot, key=tot.__getitem__, reverse=True)[:15]:
                print(f"   {key:36s} {tot[key] / (m * rounds) * 1e6:7.1f} us/worker-round")


if __name__ == "__main__":
    main()
