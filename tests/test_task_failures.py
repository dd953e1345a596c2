"""A failing task is named once and ends the run; a signal ends any run.

Plug-in tasks whose chunk gradient raises, whose gradient is NaN, or whose loss (run by the
PS) raises, each with worker processes and with coroutine workers: the run ends with
EXIT_TASK, one ``aiogc: task failed`` line naming the worker, the round and the exception,
no traceback, and ``task_error`` in summary.json. SIGTERM and SIGINT end a run in the middle
of its rounds with 130, in both modes. Separate processes (the CLI as a user runs it); no
assertion on durations: the guards only bound a hang.
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

from aiogc.cli.args import EXIT_STOPPED, EXIT_TASK
from aiogc.harness.failures import parse_task_failure
from aiogc.training.setup import NonFiniteGradient, finite_gradients

pytestmark = pytest.mark.processes

#: Hang guard only (no assertion on durations).
GUARD_S = 180

PLUGIN = '''
import numpy as np
from aiogc.training.tasks import FunctionTask


def raises(n_chunks, seed):
    def g(i, w):
        if i == 3 and np.any(w != 0):
            raise ValueError("chunk 3 is corrupt")
        return w - i
    return FunctionTask(g, dim=4, n_chunks=n_chunks)


def nan(n_chunks, seed):
    def g(i, w):
        out = w - i
        if i == 2 and np.any(w != 0):
            out[0] = np.nan
        return out
    return FunctionTask(g, dim=4, n_chunks=n_chunks)


def loss_raises(n_chunks, seed):
    def loss(w):
        if np.any(w != 0):
            raise ValueError("loss blew up")
        return 0.0
    return FunctionTask(lambda i, w: w - i, dim=4, n_chunks=n_chunks, loss_fn=loss)
'''


def _aiogc(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("AIOGC_SECRET", None)
    return subprocess.Popen([sys.executable, "-m", "aiogc", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
                            cwd=Path(__file__).resolve().parent.parent)


def _finish(p: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return p.communicate(timeout=GUARD_S)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_the_reason_is_parsed_and_a_nan_gradient_is_refused() -> None:
    assert parse_task_failure("worker 3: round 1: ValueError: x: y") == {
        "worker": 3, "round": 1, "error": "ValueError: x: y"}
    assert parse_task_failure("anything else") == {
        "worker": None, "round": None, "error": "anything else"}
    import numpy as np

    fn = finite_gradients(lambda i, w: np.array([1.0, np.inf]) if i else w)
    assert fn(0, np.zeros(2)).tolist() == [0.0, 0.0]
    with pytest.raises(NonFiniteGradient, match=r"chunk 1: .*non-finite values \(inf\)"):
        fn(1, np.zeros(2))


@pytest.mark.parametrize("mode", ["processes", "coroutines"])
@pytest.mark.parametrize(("factory", "worker", "error"), [
    ("raises", 3, "ValueError: chunk 3 is corrupt"),
    ("nan", 1, "NonFiniteGradient: chunk 2: the gradient has non-finite values (nan)"),
    ("loss_raises", "PS", "ValueError: loss blew up"),
])
def test_a_failing_task_is_named_once_and_ends_the_run(
        tmp_path: Path, mode: str, factory: str, worker: int | str, error: str) -> None:
    plugin = tmp_path / "plugin_task.py"
    plugin.write_text(PLUGIN)
    out = tmp_path / "run"
    run = _aiogc("run", "--workers", "4", "--delta", "2", "--rounds", "5", "--as", mode,
                 "--loop", "asyncio", "--no-progress", "--out", str(out),
                 "--task", f"{plugin}:{factory}")
    _, err = _finish(run)
    assert run.returncode == EXIT_TASK, err
    assert "Traceback" not in err and "Fatal error" not in err
    said = [ln for ln in err.splitlines() if ln.startswith("aiogc: task failed")]
    assert len(said) == 1, err
    assert error in said[0]
    summary = json.loads((out / "summary.json").read_text())
    task_error = summary["task_error"]
    assert (task_error["worker"], task_error["error"]) == (worker, error)
    assert task_error["round"] in (0, 1) and task_error["scheme"] == "partial"
    assert summary["ok"] is False
    where = "on the PS" if worker == "PS" else f"on worker {worker}"
    assert f"the task failed {where}, round {task_error['round']}" in err


def _wait_for_rounds(out: Path, run: subprocess.Popen[str], n: int) -> None:
    """Until ``n`` rounds are on disk (the recorder writes every second); under the guard."""
    deadline = time.monotonic() + GUARD_S
    rounds = out / "rounds.csv"
    while time.monotonic() < deadline and run.poll() is None:
        if rounds.is_file() and len(rounds.read_text().splitlines()) > n:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {n} rounds recorded (exit {run.poll()})")


@pytest.mark.parametrize(("mode", "sig"), [("processes", signal.SIGTERM),
                                           ("coroutines", signal.SIGINT),
                                           ("processes", signal.SIGINT),
                                           ("coroutines", signal.SIGTERM)])
def test_a_signal_ends_a_run_in_the_middle_of_its_rounds(tmp_path: Path, mode: str,
                                                         sig: signal.Signals) -> None:
    out = tmp_path / "run"
    run = _aiogc("run", "--workers", "4", "--delta", "2", "--rounds", "100000", "--as", mode,
                 "--loop", "asyncio", "--no-progress", "--out", str(out),
                 "--task", "linreg:samples=120,dim=6", "--delay", "exp:0.002")
    try:
        _wait_for_rounds(out, run, 2)
        run.send_signal(sig)
    finally:
        _, err = _finish(run)
    assert run.returncode == EXIT_STOPPED, err
    assert f"aiogc: interrupted by {sig.name}" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted_by"] == sig.name and summary["ok"] is False
