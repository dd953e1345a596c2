"""The event loop's recording cost per round, with and without the crash-safe timed writes.

Replays a synthetic run into :class:`aiogc.harness.records.RunRecorder` exactly as the PS's
callbacks do (one frame-log call per frame, one ``round`` call per round): m = 64 workers,
5 frames and 2 chunk reports per worker-round, a round every 30 ms on a fake clock, 3000 rounds
(90 s of run). Prints, per mode and repetition, the total and per-round CPU time the recorder
takes on the loop's thread (``time.thread_time``: a shared machine's preemption does not count),
its median, p99 and largest single-round stall, and the close.

``flush_every_s=None`` is the old behaviour (a write only every 50 000 buffered rows);
``1.0`` is what the runners use (:data:`aiogc.harness.records.FLUSH_EVERY_S`).

Usage::

    python bench/record_cost.py [--rounds 3000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

from aiogc.core.common import RoundRecord
from aiogc.harness.records import RunRecorder
from aiogc.protocol.status import EndReason, RoundStatus

M, DT = 64, 0.030


def _record(r: int) -> RoundRecord:
    return RoundRecord(
        round=r, scheme="partial", t_start=r * DT, t_trigger=r * DT + 0.02, t_end=r * DT + 0.03,
        status=RoundStatus.EXACT, end_reason=EndReason.ALL_EXPECTED, attempts=1,
        state=tuple([2] * M), coverage_min=1, residual=1e-15, amplification=1.5,
        rel_error=1e-9, loss=3.0, oracle_elapsed_s=0.02,
        reports=[(r * DT + 0.001 * k, w, k, 0.01) for w in range(M) for k in (1, 2)],
        arrivals={w: r * DT + 0.025 for w in range(M)}, compute_s={w: 0.02 for w in range(M)})


class _Msg:
    __slots__ = ("kind", "round")

    def __init__(self, kind: str, round_: int) -> None:
        self.kind, self.round = kind, round_


def run(every: float | None, rounds: int) -> dict[str, float]:
    """One replay; times in seconds."""
    now = [0.0]
    with tempfile.TemporaryDirectory() as d:
        rec = RunRecorder(d, {}, flush_every_s=every, clock=lambda: now[0])
        log: Any = rec.frame_logger("partial", lambda p: p, clock=lambda: int(now[0] * 1e9))
        recs = [_record(r) for r in range(rounds)]
        msgs = [_Msg("chunk_report", 0)] * 5
        per_round = []
        for r in range(rounds):
            now[0] = r * DT
            t0 = time.thread_time()
            for w in range(M):
                for msg in msgs:
                    log("in", w, msg, 40)
            rec.round("partial", recs[r], m=M, loads=[4] * M, trigger_scheme=True)
            per_round.append(time.thread_time() - t0)
        t0 = time.thread_time()
        rec.close()
        close = time.thread_time() - t0
    per_round.sort()
    return {"total": sum(per_round), "median": statistics.median(per_round),
            "p99": per_round[int(0.99 * len(per_round))], "max": per_round[-1], "close": close}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    for _ in range(a.repeats):
        for every in (None, 1.0):
            s = run(every, a.rounds)
            print(f"flush_every_s={every}: on the loop {s['total'] * 1e3:.0f} ms for "
                  f"{a.rounds} rounds ({s['total'] / a.rounds * 1e6:.0f} us/round), median "
                  f"{s['median'] * 1e6:.0f} us, p99 {s['p99'] * 1e3:.2f} ms, max "
                  f"{s['max'] * 1e3:.1f} ms; close {s['close'] * 1e3:.0f} ms", flush=True)


if __name__ == "__main__":
    main()
