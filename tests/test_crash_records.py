"""Crash-safe records: a run killed with SIGKILL keeps every round it finished.

The recorder of a live run writes its batch at a round's end once a second has passed (and by a
timer at most a second after a round ended), and replaces ``summary.json`` atomically by a
progress summary that says the run is still in progress. The process test waits for
``rounds.csv`` to reach a row count (never for a fixed time), kills the runner with SIGKILL and
checks the files: every round below the highest recorded is there, with its worker rows, and
``aiogc inspect`` / ``aiogc report`` say the run was cut short.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aiogc.cli import main
from aiogc.harness.loaders import load_run, records_from_run, run_state
from aiogc.harness.records import RunRecorder
from tests.records_golden import LOADS, M, assert_golden, golden_calls, golden_rounds

ROOT = Path(__file__).resolve().parent.parent

#: Rows rounds.csv must hold (besides the header) before the runner is killed.
KILL_AT = 6
#: Only a guard against a runner that never gets there (the test waits on the file's rows).
GUARD_S = 600.0


def _data_rows(path: Path) -> int:
    """Complete data rows in a CSV file (a row being written has no line end yet)."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return 0
    return max(0, text.count(b"\n") - 1)


def test_sigkill_leaves_every_finished_round_on_disk(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiogc", "run", "--schemes", "partial", "--rounds", "5000",
         "--as", "coroutines", "--workers", "4", "--delta", "2", "--delay", "exp:0.001",
         "--out", str(out), "--no-plots", "--loop", "asyncio", "--no-progress"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + GUARD_S
        while _data_rows(out / "rounds.csv") < KILL_AT:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                pytest.fail(f"the run ended (rc {proc.returncode}) before {KILL_AT} rounds "
                            f"were on disk: {err[-2000:]}")
            assert time.monotonic() < deadline, "no rounds reached rounds.csv"
            time.sleep(0.05)  # polling the file, not waiting for a time
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()

    run = load_run(out)
    rounds = [r["round"] for r in run["rounds"]]
    assert len(rounds) >= KILL_AT
    assert sorted(rounds) == list(range(max(rounds) + 1))  # 0..N-1: none missing
    assert {r["scheme"] for r in run["rounds"]} == {"partial"}
    # every round on disk has its m worker rows (they are written before rounds.csv)
    per_round: dict[int, int] = {}
    for w in run["workers"]:
        per_round[w["round"]] = per_round.get(w["round"], 0) + 1
    assert all(per_round.get(r) == 4 for r in rounds)
    assert len(records_from_run(run)["partial"]) == len(rounds)
    # every complete events.jsonl line parses
    lines = (out / "events.jsonl").read_text().splitlines(keepends=True)
    assert lines and all(json.loads(x) for x in lines if x.endswith("\n"))
    # summary.json is the (atomically written) progress summary: the run never finished
    summary = json.loads((out / "summary.json").read_text())
    assert summary["in_progress"] is True and summary["ok"] is False
    state = run_state(run)
    assert state is not None and "cut short" in state


def test_inspect_and_report_say_a_run_was_cut_short(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A directory whose summary says in progress (as a killed run leaves it) is read back,
    and both readers say it was cut short; a finished one says nothing of the kind."""
    rec = RunRecorder(tmp_path / "cut", {"argv": ["aiogc", "run"]}, flush_every_s=3600.0)
    for name, r in golden_rounds():
        rec.round(name, r, m=M, loads=LOADS, trigger_scheme=name == "partial")
    rec.flush()  # what a timed write leaves on disk; the process then dies (no close)
    assert json.loads((tmp_path / "cut" / "summary.json").read_text())["in_progress"] is True
    assert main(["inspect", str(tmp_path / "cut"), "--round", "0"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("note: this run was cut short")
    assert "partial: 2 rounds (last 1)" in text and "== partial, round 0" in text
    assert main(["report", str(tmp_path / "cut")]) == 0
    page = (tmp_path / "cut" / "report.html").read_text()
    assert "this run was cut short" in page and "<td>partial</td>" in page.replace(
        ' class="k"', "")

    rec.close({"ok": True, "in_progress": False})
    assert run_state(load_run(tmp_path / "cut")) is None
    assert main(["inspect", str(tmp_path / "cut"), "--round", "0"]) == 0
    assert "cut short" not in capsys.readouterr().out


def test_timed_writes_keep_the_golden_bytes(tmp_path: Path) -> None:
    """Writing the batch at every round end (a clock that always says a second passed) leaves
    exactly the bytes of one write at close, and every round on disk before close."""
    ticks = iter(range(10_000))
    rec = RunRecorder(tmp_path, {"seed": 1}, flush_every_s=1.0, clock=lambda: next(ticks))
    golden_calls(rec)
    assert _data_rows(tmp_path / "rounds.csv") == 3  # on disk before close
    assert json.loads((tmp_path / "summary.json").read_text())["rounds_written"] == {
        "partial": 2, "original": 1}
    rec.close()
    assert_golden(tmp_path)


def test_a_truncated_last_row_is_skipped(tmp_path: Path) -> None:
    """A kill in the middle of a write can leave half a row: readers drop it."""
    rec = RunRecorder(tmp_path, {})
    golden_calls(rec)
    rec.close()
    path = tmp_path / "rounds.csv"
    text = path.read_bytes()
    path.write_bytes(text[: len(text) - 10])
    assert [r["round"] for r in load_run(tmp_path)["rounds"]] == [0, 1]
