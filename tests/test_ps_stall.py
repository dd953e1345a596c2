"""A stall of the PS itself is recorded as the PS's, not as workers gone.

``aiogc run`` with worker processes and ``--dead-after 1``: once rounds are on disk, the PS
(the run's main process) is stopped with SIGSTOP for several liveness periods and resumed.
The workers declare the silent PS dead and reconnect; when the PS runs again it notices its
own stall first: no worker is dropped as dead or disconnected, and a round that failed for
it ends as ``ps_stall``. The sleep is the stimulus (how long the PS is stopped); nothing
asserts on a duration, and the guards only bound a hang.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

#: Hang guard only.
GUARD_S = 180
#: How long the PS is stopped: four liveness periods of --dead-after 1.
STOP_S = 4.0


def test_a_stopped_ps_blames_itself_not_its_workers(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    run = subprocess.Popen(
        [sys.executable, "-m", "aiogc", "run", "--workers", "4", "--delta", "2", "--rounds",
         "150", "--dead-after", "1", "--task", "linreg:samples=120,dim=6", "--delay",
         "exp:0.01", "--loop", "asyncio", "--no-progress", "--schemes", "partial",
         "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True, cwd=Path(__file__).resolve().parent.parent)
    try:
        deadline = time.monotonic() + GUARD_S
        rounds = out / "rounds.csv"
        while not (rounds.is_file() and len(rounds.read_text().splitlines()) > 3):
            assert time.monotonic() < deadline and run.poll() is None, run.poll()
            time.sleep(0.05)
        run.send_signal(signal.SIGSTOP)
        time.sleep(STOP_S)
        run.send_signal(signal.SIGCONT)
        _, err = run.communicate(timeout=GUARD_S)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert "the PS did not run for" in err, err
    summary = json.loads((out / "summary.json").read_text())
    failed = summary["schemes"]["partial"].get("failed_rounds") or []
    assert all(f["reason"] == "ps_stall" for f in failed), failed
    with (out / "workers.csv").open() as f:
        reasons = {row["dropped_reason"] for row in csv.DictReader(f)}
    assert reasons <= {"", "ps_stall"}, reasons
    with (out / "rounds.csv").open() as f:
        ends = {row["end_reason"] for row in csv.DictReader(f)}
    assert "workers_gone" not in ends
    # the run went on to its last round: every round either completed or was the stall's
    assert summary["schemes"]["partial"]["rounds"] + len(failed) == 150
