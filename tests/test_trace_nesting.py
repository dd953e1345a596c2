"""The Perfetto trace's slices nest on every track.

A chunk report that reaches the PS after the trigger makes its chunk slice cross the worker's
``encode+upload`` slice; such a slice now sits on an overflow track beside the worker's.
"""

from __future__ import annotations

import json
from pathlib import Path

from aiogc.config import RunConfig
from aiogc.core.common import RoundRecord
from aiogc.harness.local import run_live
from aiogc.harness.options import RunOptions
from aiogc.harness.trace import LANE_STRIDE, chrome_trace, nesting_violations
from aiogc.protocol.status import EndReason, RoundStatus
from aiogc.sim.protocol import simulate_protocol


def _crossing_round() -> RoundRecord:
    """Worker 0's second report (0.6) arrives after the trigger (0.5): chunk 2 spans
    0.2-0.6, encode+upload 0.5-0.7."""
    return RoundRecord(
        round=0, scheme="partial", t_start=0.0, t_trigger=0.5, t_end=0.8,
        status=RoundStatus.EXACT, end_reason=EndReason.ALL_EXPECTED, attempts=1,
        state=(2, 1), reports=[(0.2, 0, 1, 0.2), (0.6, 0, 2, 0.4), (0.3, 1, 1, 0.3)],
        arrivals={0: 0.7, 1: 0.75}, compute_s={0: 0.4, 1: 0.3})


def test_the_checker_finds_crossing_slices() -> None:
    trace = {"traceEvents": [
        {"ph": "X", "pid": 1, "tid": 1, "ts": 0.0, "dur": 10.0},
        {"ph": "X", "pid": 1, "tid": 1, "ts": 2.0, "dur": 3.0},  # nested: fine
        {"ph": "X", "pid": 1, "tid": 1, "ts": 8.0, "dur": 5.0},  # crosses the first
        {"ph": "X", "pid": 1, "tid": 2, "ts": 8.0, "dur": 5.0},  # another track: fine
        {"ph": "X", "pid": 1, "tid": 1, "ts": 13.0, "dur": 1.0},  # starts as one ends: fine
    ]}
    bad = nesting_violations(trace)
    assert [(a["ts"], b["ts"]) for a, b in bad] == [(0.0, 8.0)]


def test_a_crossing_slice_moves_to_an_overflow_track() -> None:
    trace = chrome_trace({"partial": [_crossing_round()]}, trigger_schemes={"partial": True})
    assert nesting_violations(trace) == []
    evs = trace["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in evs
               if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads[(1, 1 + LANE_STRIDE)] == "worker 0 (overlap 1)"
    moved = [e for e in evs if e["ph"] == "X" and e["tid"] == 1 + LANE_STRIDE]
    assert [e["name"] for e in moved] == ["encode+upload"]
    # nothing lost: every slice is still there
    assert sum(e["ph"] == "X" for e in evs) == 1 + 3 + 2
    assert not any(tid >= LANE_STRIDE for _, tid in threads if tid != 1 + LANE_STRIDE)


def test_a_simulated_run_trace_nests() -> None:
    """The virtual-clock protocol simulator's records (the default configuration)."""
    recs = simulate_protocol(RunConfig(rounds=20), ["partial", "original"])
    assert nesting_violations(chrome_trace(recs)) == []


def test_a_live_loopback_run_trace_nests(tmp_path: Path) -> None:
    """A small live run on loopback: its trace.json has no crossing slices, and every round,
    report and arrival is a slice."""
    cfg = RunConfig(workers=4, delta=2, n_parts=1, rounds=20, delay="exp:0.005", seed=3)
    res = run_live(cfg, ["partial", "original"],
                   RunOptions(mode="coroutines", out_dir=tmp_path, plots=False, loop="asyncio"))
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert nesting_violations(trace) == []
    n_slices = sum(len(recs) + sum(len(r.reports) + len(r.arrivals) for r in recs)
                   for recs in res.records.values())
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == n_slices
