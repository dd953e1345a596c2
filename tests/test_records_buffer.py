"""The recorder's buffered path: same bytes as the per-row writer it replaced, bounded memory,
nothing lost when a run ends by an error or a signal.

``tests/data/recorder_golden/`` holds the files the per-row recorder (one ``json.dumps`` per
frame, csv rows and a flush of every file per round) wrote for :func:`golden_calls`; the
buffered recorder must write the same bytes (``rounds.csv`` plus its ``end_detail`` column,
which the per-row recorder did not have).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aiogc.harness.loaders import load_events, load_run, records_from_run
from aiogc.harness.records import RunRecorder
from tests.records_golden import (
    LOADS,
    M,
    assert_golden,
    golden_calls,
    golden_rounds,
)


def test_buffered_files_equal_the_per_row_writer(tmp_path: Path) -> None:
    rec = RunRecorder(tmp_path, {"seed": 1})
    golden_calls(rec)
    rec.close()
    assert_golden(tmp_path)
    # and the trace still sees every frame and round
    trace = json.loads((tmp_path / "trace.json").read_text())
    names = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "frame"]
    assert len(names) == 9 and "in hello" in names and "event run_end" in names
    assert sum(e.get("cat") == "round" and e["ph"] == "X" for e in trace["traceEvents"]) == 3


def test_bound_flushes_mid_run_with_the_same_bytes(tmp_path: Path) -> None:
    """A buffer that passes its bound is written out at once (memory stays bounded on long
    runs), and the files are the same as with one flush at close."""
    rec = RunRecorder(tmp_path, {})
    rec.flush_rows = 2
    seen: list[int] = []
    calls = 0

    class Spy:
        def __getattr__(self, name: str) -> Any:
            fn = getattr(rec, name)

            def call(*a: Any, **k: Any) -> Any:
                nonlocal calls
                calls += 1
                out = fn(*a, **k)
                seen.append(rec.buffered_rows)
                return out
            return call

    golden_calls(Spy())
    assert calls == 12 and max(seen) <= 2 + M + 3  # one round's rows past the bound at most
    # rows beyond the bound are already on disk before close
    assert len((tmp_path / "events.jsonl").read_text().splitlines()) >= 7
    rec.close()
    assert_golden(tmp_path)


@dataclass
class _Msg:
    kind: str
    round: int | None = None


class _Hello:
    kind = "hello"  # no round attribute at all


def test_frame_logger_is_the_same_row_as_frame(tmp_path: Path) -> None:
    """The drivers' ``frame_log(direction, peer, msg, nbytes)`` through
    :meth:`RunRecorder.frame_logger` writes what :meth:`RunRecorder.frame` writes."""
    ticks = iter([5, 6, 7, 8])
    peers = {"a": 0, "b": None}
    log = RunRecorder(tmp_path / "a", {})
    fl = log.frame_logger("partial", peers.get, clock=lambda: next(ticks))
    fl("in", "b", _Hello(), 10)
    fl("out", "a", _Msg("round_start", 3), 20)
    fl("in", "a", _Msg("coded_gradient", None), 30)
    log.close()
    ref = RunRecorder(tmp_path / "b", {})
    ref.frame(t_ns=5, direction="in", kind="hello", scheme="partial", round=None, worker=None,
              nbytes=10)
    ref.frame(t_ns=6, direction="out", kind="round_start", scheme="partial", round=3, worker=0,
              nbytes=20)
    ref.frame(t_ns=7, direction="in", kind="coded_gradient", scheme="partial", round=None,
              worker=0, nbytes=30)
    ref.close()
    assert (tmp_path / "a" / "events.jsonl").read_bytes() == \
        (tmp_path / "b" / "events.jsonl").read_bytes()
    assert log.n_frames == 3
    with pytest.raises(ValueError, match="closed"):
        fl("in", "a", _Msg("late", 1), 1)


def test_rounds_are_copied_when_recorded(tmp_path: Path) -> None:
    """The PS may mutate a record after handing it over: what was recorded is what the round
    was at that moment, and the gradient is not kept."""
    rec = RunRecorder(tmp_path, {})
    _, r = golden_rounds()[2]
    rec.round("original", r, m=M, loads=LOADS, trigger_scheme=False)
    r.loss, r.arrivals[2], r.reports[0] = 99.0, 1.0, (0.0, 0, 0, 0.0)
    assert rec.records["original"][0].gradient is None
    rec.close()
    back = records_from_run(load_run(tmp_path))["original"][0]
    assert math.isnan(back.loss) and 2 not in back.arrivals and back.reports[0][0] == 11.0


def test_an_error_mid_run_still_writes_every_buffered_row(tmp_path: Path) -> None:
    """``with RunRecorder(...)`` (and the runner's close path) writes what was buffered when
    the run raises."""
    with pytest.raises(RuntimeError, match="boom"), RunRecorder(tmp_path, {}) as rec:
        golden_calls(rec)
        assert rec.buffered_rows > 0
        assert "partial" not in (tmp_path / "rounds.csv").read_text()  # buffered, not written
        raise RuntimeError("boom")
    assert_golden(tmp_path)


def test_a_signal_mid_run_still_writes_every_buffered_row(tmp_path: Path) -> None:
    """``runner.close_run`` (the path an interrupted or failed run takes) flushes the buffer
    with the summary."""
    from aiogc.harness.kit import RunResult, close_run

    rec = RunRecorder(tmp_path, {})
    golden_calls(rec)
    result = RunResult(records={s: [r] for s, r in golden_rounds()[1:]},
                       end_reasons={"partial": "all rounds done",
                                    "original": "stopped by SIGTERM"})
    close_run(result, ["SIGTERM"], rec)
    assert_golden(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted_by"] == "SIGTERM"
    assert len(load_events(tmp_path)) == 9


def test_writes_after_close_are_refused(tmp_path: Path) -> None:
    rec = RunRecorder(tmp_path, {})
    rec.close()
    calls: list[Callable[[], None]] = [
        lambda: rec.frame(t_ns=0, direction="in", kind="x", scheme="partial", round=None,
                          worker=None, nbytes=0),
        lambda: rec.run_event(t_ns=0, kind="run_end", scheme="p", reason="r"),
        lambda: rec.round("partial", golden_rounds()[0][1], m=M, loads=LOADS),
        rec.flush,
    ]
    for call in calls:
        with pytest.raises(ValueError, match="closed"):
            call()


def test_trace_is_strict_json_even_with_nan_and_numpy_values(tmp_path: Path) -> None:
    """trace.json goes straight to the encoder; a NaN or a numpy value takes the converting
    path instead of writing non-strict JSON."""
    _, r = golden_rounds()[0]
    r.reports.append((0.45, 1, 2, float("nan")))
    r.state = (np.int64(2), 1, 0)  # type: ignore[assignment]
    with RunRecorder(tmp_path, {}) as rec:
        rec.round("partial", r, m=M, loads=LOADS)
    trace = json.loads((tmp_path / "trace.json").read_text(),
                       parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
    chunks = [e for e in trace["traceEvents"] if e.get("cat") == "chunk"]
    assert any(e["args"]["worker_elapsed_s"] is None for e in chunks)
    assert any(e["args"].get("state") == [2, 1, 0] for e in trace["traceEvents"])
