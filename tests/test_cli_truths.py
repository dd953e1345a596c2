"""The command line says what is true: exit codes in --help, --version,
every scheme exits 0 when its rounds completed as configured, ``ok`` false for a stopped run,
``aiogc ps``'s one progress line and -v / -q logging, a worker that left is absent in
``workers.csv`` (not one row), experiments' progress with an ETA."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from aiogc import __version__
from aiogc.cli import EXIT_CODES, _ps_event_handler, _ps_summary, main, setup_logging
from aiogc.config import RunConfig
from aiogc.core import Finished, RoundCompleted, RoundRecord
from aiogc.harness.columns import read_csv
from aiogc.harness.kit import Progress, RunResult, close_run, run_complete
from aiogc.harness.loaders import load_events
from aiogc.harness.records import RunRecorder
from aiogc.protocol.status import EndReason, RoundStatus


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["ps", "--help"],
                                  ["worker", "--help"]])
def test_help_lists_every_exit_code(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(argv, capsys)
    assert "exit codes:" in text
    from aiogc.cli import (
        EXIT_CONFIG,
        EXIT_EVICTED,
        EXIT_INCOMPLETE,
        EXIT_OK,
        EXIT_RECORDS,
        EXIT_SHRUNK,
        EXIT_STOPPED,
        EXIT_TASK,
        EXIT_UNFAITHFUL,
        EXIT_UNREACHABLE,
    )

    codes = {EXIT_OK, EXIT_INCOMPLETE, EXIT_CONFIG, EXIT_UNREACHABLE, EXIT_EVICTED,
             EXIT_SHRUNK, EXIT_UNFAITHFUL, EXIT_RECORDS, EXIT_TASK, EXIT_STOPPED}
    assert {c for c, _ in EXIT_CODES} == codes
    section = text.split("exit codes:", 1)[1]
    for code, _ in EXIT_CODES:
        assert f"\n  {code:<4} " in section, code
    assert "SIGINT or SIGTERM" in section and "completed as" in section


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert _help(["--version"], capsys).strip() == f"aiogc {__version__}"


def _scheme_summary(rounds: int, exact: int, approx: int) -> dict[str, Any]:
    return {"rounds": rounds, "rounds_failed": 0, "rounds_exact": exact,
            "rounds_approximate": approx, "failure": None}


def test_run_complete_accepts_a_scheme_that_is_approximate_by_design() -> None:
    """ignore-stragglers waits for k of m workers and scales: its rounds are approximate as
    configured; for partial in exact mode an approximate round is still incomplete."""
    ok = {"schemes": {"ignore-stragglers": _scheme_summary(5, 1, 4)}, "ok": True}
    assert run_complete(ok, 5, mode="exact")
    bad = {"schemes": {"partial": _scheme_summary(5, 4, 1)}, "ok": True}
    assert not run_complete(bad, 5, mode="exact")
    short = {"schemes": {"ignore-stragglers": _scheme_summary(4, 0, 4)}, "ok": True}
    assert not run_complete(short, 5, mode="exact")


def test_ignore_stragglers_run_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "run"
    rc = main(["run", "--schemes", "ignore-stragglers", "--rounds", "4", "--as", "coroutines",
               "--workers", "4", "--delta", "2", "--delay", "exp:0.001", "--out", str(out),
               "--no-plots", "--no-progress", "--loop", "asyncio"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["end_reason"] == "all rounds done"
    assert summary["ok"] is True and summary["in_progress"] is False
    assert rc == 0


def _rec(r: int, status: str = RoundStatus.EXACT, **kw: Any) -> RoundRecord:
    return RoundRecord(round=r, scheme="partial", t_start=float(r), t_end=r + 0.5,
                       status=status, end_reason=EndReason.ALL_EXPECTED, attempts=1,
                       state=(1, 1, 1), loss=1.0, **kw)


def test_a_stopped_run_is_not_ok(tmp_path: Path) -> None:
    """``ok`` is true only when every round of every scheme completed: a run stopped by a
    signal is not, even if every round it ran was fine (run and ps)."""
    records = {"partial": [_rec(0), _rec(1)]}
    stopped = RunResult(records=records, end_reasons={"partial": "SIGINT"})
    close_run(stopped, ["SIGINT"], None)
    assert stopped.summary["ok"] is False and stopped.summary["interrupted_by"] == "SIGINT"
    done = RunResult(records=records, end_reasons={"partial": "all rounds done"})
    close_run(done, [], None)
    assert done.summary["ok"] is True and done.summary["in_progress"] is False
    assert _ps_summary("partial", records["partial"], [], ["SIGTERM"])["ok"] is False
    assert _ps_summary("partial", records["partial"], ["all rounds done"], [])["ok"] is True


def test_ps_prints_one_progress_line_and_logs_rounds_with_v(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``aiogc ps``: a progress line rewritten in place (no line per round); ``-v`` logs each
    round (stdlib logging on stderr), ``-q`` nothing."""
    scheme = RunConfig(workers=3, delta=1, scheme="partial").build_scheme()  # loads 1, 1, 1

    def feed(progress: Any) -> str:
        handler = _ps_event_handler("partial", scheme, None, [], progress)
        for r in range(5):
            handler(RoundCompleted(_rec(r)))
        handler(RoundCompleted(_rec(5, RoundStatus.FAILED)))
        handler(Finished(6, "all rounds done", 9.0))
        if progress is not None:
            progress.close()
        return capsys.readouterr().err

    try:
        setup_logging(0, 0)
        err = feed(Progress(6, "partial", enabled=True))
        assert err.count("\n") == 1 and err.count("\r") == 6 and "6/6 rounds" in err
        assert "round 3:" not in err
        setup_logging(1, 0)
        err = feed(None)
        assert err.count("aiogc: round ") == 6 and "round 5: failed" in err
        setup_logging(0, 1)
        assert feed(None) == ""
    finally:
        setup_logging(0, 0)
    assert logging.getLogger("aiogc").level == logging.WARNING


def test_a_worker_that_left_is_absent_in_every_later_round(tmp_path: Path) -> None:
    """A killed worker used to leave one row (``disconnected``) in workers.csv and then look
    like an ordinary straggler: every round it missed now says it was absent, and its leaving
    and return are events."""
    rec = RunRecorder(tmp_path, {})
    loads = [1, 1, 1]
    rounds = [
        _rec(0, arrivals={0: 0.4, 1: 0.4}, dropped={2: "disconnected"}),
        _rec(1, arrivals={0: 1.4, 1: 1.4}),
        _rec(2, arrivals={0: 2.4, 1: 2.4}),
        _rec(3, arrivals={0: 3.4, 1: 3.4, 2: 3.45}),
        _rec(4, arrivals={0: 4.4, 1: 4.4}),
    ]
    for r in rounds:
        rec.round("partial", r, m=3, loads=loads, trigger_scheme=True)
    rec.close()
    w2 = [w for w in read_csv(tmp_path / "workers.csv") if w["worker"] == 2]
    assert [w["dropped_reason"] for w in w2] == [
        "disconnected", "absent: left in round 0", "absent: left in round 0", None, None]
    assert [w["straggler"] for w in w2] == [1, 1, 1, 0, 1]
    events = [(e["kind"], e["round"], e["worker"]) for e in load_events(tmp_path)
              if e["direction"] == "event"]
    assert events == [("worker_left", 0, 2), ("worker_rejoined", 3, 2)]


def test_experiment_progress_has_an_eta() -> None:
    from aiogc.experiments import CellProgress
    from aiogc.experiments._common import PROGRESS_LISTENERS, cells

    ticks = iter([0.0, 0.0, 2.0, 4.0, 6.0])
    out = io.StringIO()
    listener = CellProgress("demo", stream=out, clock=lambda: next(ticks))
    PROGRESS_LISTENERS.append(listener)
    try:
        tick = cells(3)
        for _ in range(3):
            tick()
    finally:
        PROGRESS_LISTENERS.remove(listener)
    assert out.getvalue().splitlines() == [
        "aiogc experiment demo: 0/3 cells, 0 s, ETA after the first cell",
        "aiogc experiment demo: 1/3 cells, 2 s, ETA 4 s",
        "aiogc experiment demo: 2/3 cells, 4 s, ETA 2 s",
        "aiogc experiment demo: 3/3 cells, 6 s, ETA 0 s",
    ]


def test_experiment_command_prints_progress(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", "approx-mse", "--quick", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "aiogc experiment approx-mse: 0/3 cells" in err
    assert "aiogc experiment approx-mse: 3/3 cells" in err and "ETA" in err
    assert main(["experiment", "approx-mse", "--quick", "--out", str(tmp_path), "-q"]) == 0
    assert "cells" not in capsys.readouterr().err


def test_ok_agrees_with_the_exit_status(tmp_path: Path) -> None:
    """summary.json's ``ok`` is false whenever the command exits non-zero (a run that shrank,
    exit 5, used to say ``ok: true``), and ``exit_code`` records the status."""
    import json

    from aiogc.cli.args import EXIT_SHRUNK, settle_ok

    (tmp_path / "summary.json").write_text(json.dumps({"ok": True, "shrunk": {"partial": 2}}))
    summary = {"ok": True, "shrunk": {"partial": 2}}
    assert settle_ok(summary, str(tmp_path), EXIT_SHRUNK) == EXIT_SHRUNK
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["ok"] is False and on_disk["exit_code"] == EXIT_SHRUNK
    summary = {"ok": True}
    assert settle_ok(summary, str(tmp_path), 0) == 0
    assert json.loads((tmp_path / "summary.json").read_text()) == {"ok": True, "exit_code": 0}
