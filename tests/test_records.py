"""Run records: files, summary numbers, trace, plots and round inspection, on synthetic rounds."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aiogc.core.common import RoundRecord
from aiogc.errors import ConfigError
from aiogc.harness.columns import (
    COLUMN_TYPES,
    REPORT_COLUMNS,
    ROUND_COLUMNS,
    WORKER_COLUMNS,
    is_trigger_scheme,
    to_jsonable,
    worker_rows,
)
from aiogc.harness.inspect_run import inspect_round
from aiogc.harness.loaders import load_events, load_run, records_from_run
from aiogc.harness.records import RunRecorder
from aiogc.harness.summary import summarize
from aiogc.harness.trace import chrome_trace
from aiogc.protocol.status import EndReason
from aiogc.training.schedule import DelaySchedule

M = 3
LOADS = [2, 2, 2]
NAN = float("nan")
Records = dict[str, list[RoundRecord]]


def partial_round(
    r: int, t0: float, dur: float, *, oracle: float | None, rel: float, loss: float
) -> RoundRecord:
    """w0 computes 2 chunks, w1 one, w2 none; trigger at half time with state (2, 1, 0)."""
    return RoundRecord(
        round=r,
        scheme="partial",
        t_start=t0,
        t_trigger=t0 + 0.5 * dur,
        t_end=t0 + dur,
        status="exact",
        end_reason=EndReason.ALL_EXPECTED,
        attempts=1,
        state=(2, 1, 0),
        coverage_min=1,
        residual=1e-15,
        amplification=1.5,
        rel_error=rel,
        rel_error_plain=2e-7 if rel == rel else NAN,  # rel == rel: not NaN
        loss=loss,
        oracle_elapsed_s=oracle,
        reports=[
            (t0 + 0.2 * dur, 0, 1, 0.19 * dur),
            (t0 + 0.3 * dur, 1, 1, 0.29 * dur),
            (t0 + 0.4 * dur, 0, 2, 0.39 * dur),
        ],
        arrivals={1: t0 + 0.9 * dur, 0: t0 + 0.8 * dur},
        compute_s={0: 0.4 * dur, 1: 0.3 * dur},
    )


def original_round(
    r: int, t0: float, dur: float, *, failed: bool = False, loss: float = NAN
) -> RoundRecord:
    """w0, w1 finish both chunks and send; w2 computes one. The failed variant: w1 dropped."""
    rec = RoundRecord(
        round=r,
        scheme="original",
        t_start=t0,
        t_trigger=t0 + 0.9 * dur,
        t_end=t0 + dur,
        status="exact",
        end_reason=EndReason.DECODABLE,
        attempts=1,
        state=(2, 2, 0),
        coverage_min=1,
        residual=1e-14,
        amplification=2.0,
        loss=loss,
        oracle_elapsed_s=0.8 * dur,
        reports=[
            (t0 + 0.3 * dur, 0, 1, 0.3 * dur),
            (t0 + 0.4 * dur, 1, 1, 0.4 * dur),
            (t0 + 0.6 * dur, 0, 2, 0.6 * dur),
            (t0 + 0.7 * dur, 2, 1, 0.7 * dur),
            (t0 + 0.8 * dur, 1, 2, 0.8 * dur),
        ],
        arrivals={0: t0 + 0.7 * dur, 1: t0 + 0.9 * dur},
        compute_s={0: 0.6 * dur, 1: 0.8 * dur},
    )
    if failed:
        rec.status, rec.end_reason, rec.t_trigger = "failed", EndReason.TIMEOUT, None
        rec.end_detail = "round timeout (10 s)"
        rec.state, rec.oracle_elapsed_s = (2, 1, 1), None
        del rec.arrivals[1]
        rec.dropped[1] = "timeout"
    return rec


@pytest.fixture
def records() -> dict[str, list[RoundRecord]]:
    partial = [
        partial_round(0, 0.0, 1.0, oracle=0.5, rel=1e-12, loss=3.0),
        partial_round(1, 1.0, 2.0, oracle=1.0, rel=NAN, loss=2.0),
        partial_round(2, 3.0, 3.0, oracle=None, rel=3e-12, loss=1.0),
    ]
    original = [
        original_round(0, 100.0, 3.0, loss=3.0),
        original_round(1, 103.0, 4.0, loss=2.5),
        original_round(2, 107.0, 10.0, failed=True),
    ]
    return {"partial": partial, "original": original}


def tiny_schedule() -> DelaySchedule:
    return DelaySchedule(np.full((1, 1, 1), 0.1), np.zeros((1, 1)))


def write_run(run_dir: Path, records: dict[str, list[RoundRecord]]) -> dict[str, Any]:
    summary = summarize(records, initial_loss=4.0)
    manifest = {"seed": np.int64(7), "B": np.eye(2), "cond": np.float64(np.inf), "path": run_dir}
    with RunRecorder(run_dir, manifest) as rec:
        assert (run_dir / "manifest.json").exists()  # written at once
        rec.write_schedule(tiny_schedule())
        for scheme, recs in records.items():
            for r in recs:
                if scheme == "partial" and r.round == 1:
                    t = r.t_trigger
                    assert t is not None
                    for w in range(M):
                        rec.frame(
                            t_ns=round((t + 1e-4 * w) * 1e9),
                            direction="out",
                            kind="encode_and_transmit",
                            scheme=scheme,
                            round=1,
                            worker=w,
                            nbytes=40,
                        )
                    for w in range(M):  # one resume broadcast: three frames, one instant
                        rec.frame(
                            t_ns=round((t + 0.1 + 1e-5 * w) * 1e9),
                            direction="out",
                            kind="resume",
                            scheme=scheme,
                            round=1,
                            worker=w,
                            nbytes=20,
                        )
                    rec.frame(
                        t_ns=round(r.arrivals[0] * 1e9),
                        direction="in",
                        kind="coded_gradient",
                        scheme=scheme,
                        round=1,
                        worker=0,
                        nbytes=1234,
                    )
                rec.round(scheme, r, m=M, loads=LOADS)
        rec.frame(
            t_ns=0,
            direction="in",
            kind="hello",
            scheme="partial",
            round=None,
            worker=None,
            nbytes=50,
        )
        rec.close(summary)
    return summary


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------------------ files


def test_run_directory_files_exist_and_parse(tmp_path: Path, records: Records) -> None:
    run_dir = tmp_path / "run"
    write_run(run_dir, records)
    for name in (
        "manifest.json",
        "delays.csv",
        "events.jsonl",
        "rounds.csv",
        "workers.csv",
        "reports.csv",
        "summary.json",
        "trace.json",
    ):
        assert (run_dir / name).is_file(), name
    for name in ("manifest.json", "summary.json", "trace.json"):
        json.loads((run_dir / name).read_text(), parse_constant=pytest.fail)  # strict JSON
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest == {
        "seed": 7,
        "B": [[1.0, 0.0], [0.0, 1.0]],
        "cond": None,
        "path": str(run_dir),
    }

    rounds = read_csv(run_dir / "rounds.csv")
    assert len(rounds) == 6 and tuple(rounds[0]) == ROUND_COLUMNS
    assert [r["scheme"] for r in rounds] == ["partial"] * 3 + ["original"] * 3
    assert rounds[1]["duration_s"] == "2.0" and rounds[1]["state"] == "2 1 0"
    assert rounds[2]["oracle_s"] == "" and rounds[1]["rel_error"] == "nan"
    assert rounds[5]["trigger_s"] == "" and rounds[5]["status"] == "failed"

    workers = read_csv(run_dir / "workers.csv")
    assert len(workers) == 6 * M and tuple(workers[0]) == WORKER_COLUMNS
    reports = read_csv(run_dir / "reports.csv")
    assert tuple(reports[0]) == REPORT_COLUMNS
    assert len(reports) == sum(len(r.reports) for rs in records.values() for r in rs)

    lines = (run_dir / "events.jsonl").read_text().splitlines()
    assert len(lines) == 2 * M + 2
    first = json.loads(lines[0])
    assert set(first) == {"t_ns", "direction", "kind", "scheme", "round", "worker", "nbytes"}


def test_floats_round_trip_exactly(tmp_path: Path, records: Records) -> None:
    """Every field of every RoundRecord comes back from the files (the gradient is not
    written), floats bit for bit, NaN as NaN; the field list is the dataclass's own."""
    write_run(tmp_path, records)
    run = load_run(tmp_path)
    back = records_from_run(run)
    assert list(back) == ["partial", "original"]
    compared = [f.name for f in dataclasses.fields(RoundRecord) if f.name != "gradient"]
    assert "rel_error_plain" in compared
    assert run["rounds"][0]["rel_error_plain"] == 2e-7  # typed, not the string '2e-07'
    for scheme, recs in records.items():
        for a, b in zip(recs, back[scheme], strict=True):
            for f in compared:
                x, y = getattr(a, f), getattr(b, f)
                if isinstance(x, float) and math.isnan(x):
                    assert isinstance(y, float) and math.isnan(y), (scheme, a.round, f)
                else:
                    assert (x == y and type(x) is type(y)) or (f == "status" and x == y), (
                        scheme, a.round, f, x, y)
    assert run["summary"]["speedup"] == pytest.approx(1.75)


def test_column_types_come_from_the_dataclasses() -> None:
    assert tuple(COLUMN_TYPES["workers.csv"]) == WORKER_COLUMNS
    assert tuple(COLUMN_TYPES["reports.csv"]) == REPORT_COLUMNS
    assert set(COLUMN_TYPES["rounds.csv"]) == set(ROUND_COLUMNS)
    assert COLUMN_TYPES["rounds.csv"]["rel_error_plain"] is float
    assert COLUMN_TYPES["rounds.csv"]["oracle_s"] is float
    assert COLUMN_TYPES["rounds.csv"]["state"] is tuple


def test_worker_rows_by_hand(tmp_path: Path, records: Records) -> None:
    write_run(tmp_path, records)
    rows = load_run(tmp_path)["workers"]
    p0 = [w for w in rows if w["scheme"] == "partial" and w["round"] == 0]
    # partial round 0: trigger 0.5, arrivals w0 0.8, w1 0.9; w2 never contributed
    assert [w["chunks_done"] for w in p0] == [2, 1, 0]
    assert [w["chunks_used"] for w in p0] == [2, 1, 0]
    assert [w["arrival_order"] for w in p0] == [1, 2, None]
    assert [w["straggler"] for w in p0] == [0, 0, 1]
    assert p0[0]["comm_s"] == pytest.approx(0.3) and p0[1]["comm_s"] == pytest.approx(0.4)
    assert p0[2]["comm_s"] is None and p0[2]["compute_s"] is None
    assert [w["load"] for w in p0] == LOADS

    o2 = [w for w in rows if w["scheme"] == "original" and w["round"] == 2]
    # send-when-done: comm = arrival - start - compute = 7.0 - 6.0
    assert o2[0]["comm_s"] == pytest.approx(1.0)
    assert [w["straggler"] for w in o2] == [0, 1, 1]
    assert o2[1]["dropped_reason"] == "timeout" and o2[0]["dropped_reason"] is None
    assert [w["chunks_done"] for w in o2] == [2, 2, 1]


def test_send_when_done_arrival_counts_as_all_chunks() -> None:
    rec = RoundRecord(
        round=0,
        scheme="uncoded",
        t_start=0.0,
        t_end=1.0,
        state=(2, 2),
        reports=[(0.3, 0, 1, 0.3)],
        arrivals={0: 0.9, 1: 1.0},
        compute_s={0: 0.5, 1: 0.5},
    )
    rows = worker_rows("uncoded", rec, m=2, loads=[2, 2])
    assert [r["chunks_done"] for r in rows] == [2, 2]
    assert rows[0]["comm_s"] == pytest.approx(0.4)
    # the override: measure from the trigger even though the label is not "partial"
    rows = worker_rows("uncoded", rec, m=2, loads=[2, 2], trigger_scheme=True)
    assert rows[0]["comm_s"] is None  # no trigger time recorded
    with pytest.raises(ValueError):
        worker_rows("uncoded", rec, m=3, loads=[2, 2])


def test_is_trigger_scheme() -> None:
    assert is_trigger_scheme("partial") and is_trigger_scheme("partial-random")
    assert is_trigger_scheme("partial:natural")
    assert not any(map(is_trigger_scheme, ("original", "uncoded", "ignore-stragglers",
                                           "ignore-stragglers-k4", "original-fr")))
    with pytest.raises(ConfigError, match="scheme='mystery'"):
        is_trigger_scheme("mystery")


# ------------------------------------------------------------------------------ summary


def test_summary_by_hand(records: Records) -> None:
    s = summarize(records, initial_loss=4.0)
    json.dumps(s, allow_nan=False)
    p, o = s["schemes"]["partial"], s["schemes"]["original"]
    assert p["rounds"] == 3 and p["rounds_failed"] == 0 and p["rounds_exact"] == 3
    assert p["round_time_mean_s"] == pytest.approx(2.0)
    assert p["round_time_p50_s"] == pytest.approx(2.0)
    assert p["round_time_p95_s"] == pytest.approx(2.9)  # linear: 2 + 0.9 * (3 - 2)
    assert p["oracle_time_mean_s"] == pytest.approx(0.75)
    assert p["overhead_ratio"] == pytest.approx(2.0 / 0.75)
    assert p["max_rel_decode_error"] == pytest.approx(3e-12)
    assert p["final_loss"] == 1.0 and p["first_loss"] == 3.0
    assert p["wall_time_s"] == pytest.approx(6.0)

    assert o["rounds"] == 2 and o["rounds_failed"] == 1
    assert o["round_time_mean_s"] == pytest.approx(3.5)  # the failed 10 s round excluded
    assert o["wall_time_s"] == pytest.approx(17.0)
    assert o["oracle_time_mean_s"] == pytest.approx(0.8 * 3.5)
    assert o["max_rel_decode_error"] is None  # never verified
    assert o["final_loss"] == 2.5  # last finite loss
    assert s["speedup"] == pytest.approx(3.5 / 2.0)
    assert s["speedup_vs_original"]["original"] == pytest.approx(1.0)
    assert s["initial_loss"] == 4.0


def test_summary_without_both_schemes() -> None:
    s = summarize({"partial": [], "uncoded": [original_round(0, 0.0, 1.0)]})
    assert s["speedup"] is None and s["speedup_vs_original"] == {}
    assert s["schemes"]["partial"]["round_time_mean_s"] is None
    assert s["schemes"]["partial"]["round_time_p95_s"] is None
    assert s["schemes"]["uncoded"]["rounds"] == 1
    json.dumps(s, allow_nan=False)


def test_to_jsonable() -> None:
    out = to_jsonable({1: (np.float32(0.5), np.nan), "a": {np.bool_(True), 2}, "n": None})
    assert out == {"1": [0.5, None], "a": [2, True], "n": None}


# ------------------------------------------------------------------------------ trace


def test_chrome_trace_slices(tmp_path: Path, records: Records) -> None:
    write_run(tmp_path, records)
    trace = json.loads((tmp_path / "trace.json").read_text())
    evs = trace["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in evs if e["name"] == "process_name"}
    assert procs == {1: "partial", 2: "original"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in evs if e["name"] == "thread_name"}
    assert threads[(1, 0)] == "PS" and threads[(2, 3)] == "worker 2" and len(threads) == 8

    def xs(pid: int, cat: str) -> list[dict[str, Any]]:
        return [e for e in evs if e["ph"] == "X" and e["pid"] == pid and e["cat"] == cat]

    for pid, scheme in procs.items():
        recs = records[scheme]
        assert len(xs(pid, "round")) == len(recs)
        assert len(xs(pid, "chunk")) == sum(len(r.reports) for r in recs)
        assert len(xs(pid, "upload")) == sum(len(r.arrivals) for r in recs)
        assert all(e["dur"] >= 0 for e in evs if e["ph"] == "X")

    # partial round 1 (start 1.0, dur 2.0): w0's chunks 1.0-1.4-1.8 us-scaled, upload 2.0-2.6
    w0 = sorted(
        (e["ts"], e["dur"], e["name"])
        for e in xs(1, "chunk") + xs(1, "upload")
        if e["tid"] == 1 and e["args"]["round"] == 1
    )
    assert w0 == [
        (pytest.approx(1.0e6), pytest.approx(0.4e6), "chunk 1"),
        (pytest.approx(1.4e6), pytest.approx(0.4e6), "chunk 2"),
        (pytest.approx(2.0e6), pytest.approx(0.6e6), "encode+upload"),
    ]
    # original round 0 (start 100): w0 upload from start + compute_s = 101.8 to arrival 102.1
    up = [e for e in xs(2, "upload") if e["tid"] == 1 and e["args"]["round"] == 0]
    assert up[0]["name"] == "upload" and up[0]["ts"] == pytest.approx(101.8e6)

    instants = [e for e in evs if e["ph"] == "i"]
    trig = [e for e in instants if e["name"] == "trigger"]
    assert len(trig) == 3 and trig[1]["args"]["state"] == [2, 1, 0]
    assert len([e for e in instants if e["name"] == "decodable"]) == 2  # failed round: none
    assert len([e for e in instants if e["name"] == "round end"]) == 6
    assert len([e for e in instants if e["name"] == "resume"]) == 1  # one burst of 3 frames
    assert len([e for e in instants if e["cat"] == "frame"]) == 2 * M + 2
    assert len([e for e in instants if e["name"] == "dropped"]) == 1


def test_chrome_trace_without_frames(records: Records) -> None:
    trace = chrome_trace({"partial": records["partial"]})
    assert trace["displayTimeUnit"] == "ms"
    assert not [e for e in trace["traceEvents"] if e.get("cat") == "frame"]
    json.dumps(trace, allow_nan=False)


# ------------------------------------------------------------------------------ reading back


def test_load_events_filters_and_skips_truncated_line(tmp_path: Path, records: Records) -> None:
    write_run(tmp_path, records)
    with (tmp_path / "events.jsonl").open("a") as f:
        f.write('{"t_ns": 5, "kind": "cod')  # a crashed run's last, partial line
    assert len(load_events(tmp_path)) == 2 * M + 2
    assert len(load_events(tmp_path, scheme="partial", round=1)) == 2 * M + 1
    assert load_events(tmp_path, round=0) == []
    assert len(load_events(tmp_path, limit=2)) == 2


def test_recorder_rejects_writes_after_close_and_is_idempotent(tmp_path: Path,
                                                               records: Records) -> None:
    rec = RunRecorder(tmp_path / "r", {"x": 1}, trace=False)
    rec.round("partial", records["partial"][0], m=M, loads=LOADS)
    rec.close()
    rec.close({"late": True})
    assert json.loads((tmp_path / "r" / "summary.json").read_text()) == {"late": True}
    assert not (tmp_path / "r" / "trace.json").exists()
    with pytest.raises(ValueError, match="closed"):
        rec.round("partial", records["partial"][1], m=M, loads=LOADS)
    run = load_run(tmp_path / "r")
    assert len(run["rounds"]) == 1 and run["manifest"] == {"x": 1}


def test_rows_are_on_disk_before_close(tmp_path: Path, records: Records) -> None:
    """Rows are buffered (nothing formatted on the event loop per round), and on disk after
    :meth:`RunRecorder.flush` or as soon as the buffer passes ``flush_rows``."""
    rec = RunRecorder(tmp_path, {})
    rec.round("partial", records["partial"][0], m=M, loads=LOADS)
    assert rec.buffered_rows == 1 + M + len(records["partial"][0].reports)
    rec.flush()
    assert rec.buffered_rows == 0
    assert len(read_csv(tmp_path / "rounds.csv")) == 1
    assert len(read_csv(tmp_path / "workers.csv")) == M
    rec.flush_rows = 2 * M
    rec.round("partial", records["partial"][1], m=M, loads=LOADS)  # 1 + M + 3 rows > 2 M
    assert rec.buffered_rows == 0
    assert len(read_csv(tmp_path / "rounds.csv")) == 2
    rec.close()


def test_load_run_missing_dir(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_run(tmp_path / "nope")


# ------------------------------------------------------------------------------ plots


def test_plot_run_writes_three_pngs(tmp_path: Path, records: Records) -> None:
    # one policy with test_experiments.py: the plot extra is a test dependency (CI installs
    # '.[dev,plot]'), so a missing matplotlib fails here instead of skipping
    from aiogc.harness.plots import plot_run, representative_round

    write_run(tmp_path / "run", records)
    paths = plot_run(tmp_path / "run", tmp_path / "png")
    # median-duration round of the first scheme: durations 1, 2, 3 -> round 1
    assert representative_round(records["partial"]) == 1
    assert sorted(p.name for p in paths) == [
        "loss_vs_time.png",
        "round_time_cdf.png",
        "timeline_round1.png",
    ]
    for p in paths:
        assert p.parent == tmp_path / "png"
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_run_without_matplotlib(tmp_path: Path, records: Records,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from aiogc.harness.plots import PlotUnavailable, plot_run

    write_run(tmp_path, records)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(PlotUnavailable, match=r"aiogc\[plot\]"):
        plot_run(tmp_path)


def test_representative_round_edge_cases(records: Records) -> None:
    from aiogc.harness.plots import representative_round

    assert representative_round([]) is None
    assert representative_round([records["original"][2]]) == 2  # only failed rounds
    assert representative_round(records["original"]) == 0  # lower median of 3.0, 4.0


# ------------------------------------------------------------------------------ inspect


def test_inspect_round_tells_the_story(tmp_path: Path, records: Records) -> None:
    write_run(tmp_path, records)
    text = inspect_round(tmp_path, 1, "partial")
    assert "== partial, round 1: exact" in text
    assert "trigger    encode_and_transmit, state [2 1 0]" in text
    assert text.count("report     worker") == 3
    assert text.count("arrival    worker") == 2
    assert "frames (7)" in text and "resume" in text and "1234 B" in text
    assert "x2 of oracle" in text  # 2.0 s vs oracle 1.0 s
    # timeline is in time order: start, reports, trigger, arrivals, end
    order = [
        text.index(s)
        for s in ("start ", "count   1", "count   2", "trigger ", "arrival    worker   0", "end ")
    ]
    assert order == sorted(order)

    both = inspect_round(tmp_path, 2)
    assert "== partial, round 2" in both and "== original, round 2: failed" in both
    assert "dropped" in both and "timeout" in both and "no trigger" in both
    with pytest.raises(KeyError, match=r"rounds 0\.\.2"):
        inspect_round(tmp_path, 9)


def test_status_enums_parse_and_name_the_allowed_values() -> None:
    from aiogc.protocol.status import EndReason, RoundStatus

    assert RoundStatus.parse("exact") is RoundStatus.EXACT
    assert str(RoundStatus.EXACT) == "exact"  # written to rounds.csv as its value
    assert EndReason.parse("deadline") is EndReason.DEADLINE
    with pytest.raises(ConfigError, match=r"status='approx-pending'.*exact, approximate"):
        RoundStatus.parse("approx-pending")
    with pytest.raises(ConfigError, match="end_reason='why'"):
        EndReason.parse("why")
