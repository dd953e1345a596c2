"""Membership is a first-class result: how many workers each round started
with (``rounds.csv`` ``workers_present``, from the PS's ``round_start`` frames), who left and
who rejoined (events), and a run that ran any round with fewer than m workers says so in
``summary.json``, on stderr and in its exit code (5) unless ``--allow-shrink``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aiogc.cli import EXIT_OK, EXIT_SHRUNK, main
from aiogc.core.common import RoundRecord
from aiogc.harness.columns import read_csv
from aiogc.harness.kit import RunResult, close_run, run_complete, run_end_reason
from aiogc.harness.loaders import load_events
from aiogc.harness.records import RunRecorder
from aiogc.protocol.status import EndReason, RoundStatus

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class _Msg:
    kind: str
    round: int | None = None


def _rec(r: int, **kw: Any) -> RoundRecord:
    return RoundRecord(round=r, scheme="partial", t_start=float(r), t_end=r + 0.5,
                       status=RoundStatus.EXACT, end_reason=EndReason.ALL_EXPECTED, attempts=1,
                       state=(1, 1, 1), loss=1.0, **kw)


def _record(tmp_path: Path, plan: list[tuple[tuple[int, ...], RoundRecord]]) -> RunResult:
    """Record ``plan`` (the workers sent ``round_start``, the round's record) as a PS with
    m = 3 would, and close the run."""
    rec = RunRecorder(tmp_path, {})
    log = rec.frame_logger("partial", lambda peer: peer, clock=iter(range(10**6)).__next__)
    for sent, r in plan:
        for w in sent:
            log("out", w, _Msg("round_start", r.round), 10)
        log("in", 0, _Msg("chunk_report", r.round), 10)
        rec.round("partial", r, m=3, loads=[1, 1, 1], trigger_scheme=True)
    result = RunResult(records={"partial": [r for _, r in plan]},
                       end_reasons={"partial": "all rounds done"})
    close_run(result, [], rec)
    return result


def test_membership_from_the_round_start_frames(tmp_path: Path) -> None:
    plan = [  # (workers sent round_start, the round's record)
        ((0, 1, 2), _rec(0, arrivals={0: 0.4, 1: 0.4, 2: 0.4})),
        ((0, 1, 2), _rec(1, arrivals={0: 1.4, 1: 1.4}, dropped={2: "disconnected"})),
        ((0, 1), _rec(2, arrivals={0: 2.4, 1: 2.4})),
        ((0, 1, 2), _rec(3, arrivals={0: 3.4, 1: 3.4})),  # back, but slow this round
    ]
    result = _record(tmp_path, plan)
    assert [r["workers_present"] for r in read_csv(tmp_path / "rounds.csv")] == [3, 3, 2, 3]
    w2 = [w["dropped_reason"] for w in read_csv(tmp_path / "workers.csv") if w["worker"] == 2]
    assert w2 == [None, "disconnected", "absent: left in round 1", None]
    events = [(e["kind"], e["round"], e["worker"]) for e in load_events(tmp_path)
              if e["direction"] == "event" and e["kind"].startswith("worker_")]
    assert events == [("worker_left", 1, 2), ("worker_rejoined", 3, 2)]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["shrunk"] == {"partial": 1}
    mem = summary["membership"]["partial"]
    assert mem == {"m": 3, "rounds_known": 4, "rounds_short": 1, "fewest_workers_present": 2,
                   "first_short_round": 2, "left": [[1, 2]], "rejoined": [[3, 2]]}
    assert result.end_reason == ("all rounds ran, but partial: 1 round(s) with fewer than m=3 "
                                 "workers (fewest 2, first round 2)")
    assert run_complete(summary, 4, mode="exact")  # every round completed: shrinking is apart
    assert run_end_reason({"partial": "all rounds done"}, (), {"schemes": {}}) == \
        "all rounds done"


def test_a_worker_lost_while_the_ps_stalled_has_left_only_if_it_never_came_back(
        tmp_path: Path) -> None:
    """A worker dropped during the PS's own stall is not blamed for that round (its reason
    stays ``ps_stall``), but one that never comes back is listed as left; one that comes
    back is not."""
    plan = [
        ((0, 1, 2), _rec(0, arrivals={0: 0.4, 1: 0.4, 2: 0.4})),
        ((0, 1, 2), _rec(1, arrivals={0: 1.4}, dropped={1: "ps_stall", 2: "ps_stall"})),
        ((0, 1), _rec(2, arrivals={0: 2.4, 1: 2.4})),  # 1 is back, 2 never is
        ((0, 1), _rec(3, arrivals={0: 3.4, 1: 3.4})),
    ]
    _record(tmp_path, plan)
    dropped = {(w["round"], w["worker"]): w["dropped_reason"]
               for w in read_csv(tmp_path / "workers.csv")}
    assert dropped[(1, 1)] == dropped[(1, 2)] == "ps_stall"
    mem = json.loads((tmp_path / "summary.json").read_text())["membership"]["partial"]
    assert mem["left"] == [[1, 2]] and mem["rejoined"] == []
    events = [(e["kind"], e["round"], e["worker"], e["reason"]) for e in load_events(tmp_path)
              if e["direction"] == "event" and e["kind"].startswith("worker_")]
    assert events == [("worker_left", 1, 2, "ps_stall")]


def test_run_exit_code_says_shrunk_unless_allowed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    import aiogc.harness.local as local

    def fake_run_live(config: Any, schemes: Any, options: Any, **_: Any) -> RunResult:
        rec = {"partial": [_rec(r) for r in range(config.rounds)]}
        res = RunResult(records=rec, end_reasons={"partial": "all rounds done"})
        close_run(res, [], None)
        res.summary["shrunk"] = {"partial": 2}
        res.summary["membership"] = {"partial": {"m": 4, "rounds_short": 2,
                                                 "fewest_workers_present": 3,
                                                 "first_short_round": 1}}
        return res

    monkeypatch.setattr(local, "run_live", fake_run_live)
    argv = ["run", "--schemes", "partial", "--rounds", "3", "--out", str(tmp_path), "--no-plots"]
    assert main(argv) == EXIT_SHRUNK
    err = capsys.readouterr().err
    assert "partial: 2 round(s) with fewer than m=4 workers (fewest 3, first round 1)" in err
    assert "--allow-shrink accepts this" in err
    assert main([*argv, "--allow-shrink"]) == EXIT_OK
    assert "(allowed by --allow-shrink)" in capsys.readouterr().err


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        out += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    return out


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_a_killed_worker_process_shrinks_the_run(tmp_path: Path) -> None:
    """SIGKILL one worker process of a live run: the run completes its rounds with m - 1
    workers and exits 5, saying so; the files record who left and how many were present."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiogc", "run", "--schemes", "partial", "--rounds", "600",
         "--as", "processes", "--workers", "4", "--delta", "2", "--delay", "exp:0.004",
         "--out", str(out), "--no-plots", "--no-progress"],  # SIGKILL resets its socket:
        # the PS sees the loss at once; the default dead-after (5 s) keeps a loaded machine's
        # honest-but-slow workers from being dropped too (which would change "fewest 3")
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 600  # a guard only: the test waits on the file
        rounds = out / "rounds.csv"
        while not rounds.exists() or rounds.read_bytes().count(b"\n") < 4:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        # the workers: the forkserver's children (the runner's own children are the fork
        # server and the resource tracker)
        direct = {int(k) for k in
                  Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()}
        kids = set(_descendants(proc.pid)) - direct
        assert len(kids) == 4, kids
        os.kill(max(kids), signal.SIGKILL)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err.decode(errors="replace")
    assert proc.returncode == EXIT_SHRUNK, text[-3000:]
    assert "round(s) with fewer than m=4 workers (fewest 3" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["shrunk"]["partial"] >= 1
    assert summary["membership"]["partial"]["left"][0][1] in range(4)
    present = [r["workers_present"] for r in read_csv(out / "rounds.csv")]
    assert present[0] == 4 and present[-1] == 3
    left = [e for e in load_events(out) if e["kind"] == "worker_left"]
    assert len(left) == 1
    gone = left[0]["worker"]
    absent = [w for w in read_csv(out / "workers.csv")
              if w["worker"] == gone and (w["dropped_reason"] or "").startswith("absent")]
    assert len(absent) >= len(present) - present.index(3) - 1
