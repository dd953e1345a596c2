"""A write of the records that fails ends the run: a named reason, a documented exit code
(EXIT_RECORDS), the workers stopped, what was written before kept.

The recorder's own handling is checked with an injected write error (always possible). The
CLI runs (`aiogc run`, `aiogc ps` with an `aiogc worker` process) write into a 256 KiB tmpfs
mounted for the test; they are skipped, with the reason, where mounting is not allowed (not
root, or no mount in the container). No assertion on durations: the guards only bound a hang.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aiogc.cli.args import EXIT_RECORDS
from aiogc.harness.records import RunRecorder
from tests.netkit import CLI_JOIN_TIMEOUT_S, cli, listening

#: Hang guard only (no assertion on durations).
GUARD_S = 180
TASK = ["--task", "linreg:samples=120,dim=6", "--delay", "exp:0.002"]


class _FullDisk:
    """Wraps a text file: every write after ``room`` characters fails as a full disk does."""

    def __init__(self, f: Any, room: int) -> None:
        self._f = f
        self.name = f.name
        self._room = room

    def write(self, text: str) -> int:
        if len(text) > self._room:
            raise OSError(28, "No space left on device")
        self._room -= len(text)
        return int(self._f.write(text))

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def test_a_failed_write_is_named_once_and_ends_the_recording(tmp_path: Path) -> None:
    rec = RunRecorder(tmp_path / "run", {"seed": 1}, trace=False)
    failures: list[str] = []
    rec.on_write_error = failures.append
    rec.run_event(t_ns=1, kind="note", scheme="partial", reason="first")
    rec.flush()
    rec._events = _FullDisk(rec._events, room=0)  # type: ignore[assignment]
    rec._files[0] = rec._events
    for i in range(3):
        rec.run_event(t_ns=2 + i, kind="note", scheme="partial", reason="lost")
        rec.flush()  # no exception: the recorder says it once, and stops writing
    assert len(failures) == 1
    assert failures[0] == f"No space left on device writing {tmp_path / 'run' / 'events.jsonl'}"
    assert rec.write_error == failures[0]
    rec.close({"ok": True, "end_reason": "all rounds done"})
    # what was written before is kept; the summary says why the run is not ok
    lines = (tmp_path / "run" / "events.jsonl").read_text().splitlines()
    assert [json.loads(ln)["reason"] for ln in lines] == ["first"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["ok"] is False and summary["records_error"] == failures[0]


def test_a_failed_summary_write_leaves_no_temporary(tmp_path: Path) -> None:
    rec = RunRecorder(tmp_path / "run", {"seed": 1}, trace=False)
    rec.close()
    target = tmp_path / "run" / "summary.json"
    target.mkdir()  # os.replace onto a directory fails
    rec.close({"ok": True})
    assert rec.write_error is not None and "summary.json" in rec.write_error
    assert [p.name for p in (tmp_path / "run").iterdir() if p.name.startswith(".")] == []


@contextlib.contextmanager
def _small_disk(path: Path, size: str = "512k") -> Iterator[Path]:
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; the injected write error covers it")
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                         capture_output=True, text=True)
    if got.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({got.stderr.strip()}); "
                    "the injected write error covers it")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _aiogc(*args: str) -> subprocess.Popen[str]:
    return cli(*args, start_new_session=True)


def _group_gone(p: subprocess.Popen[str]) -> bool:
    """No process is left in ``p``'s session group (its workers; its multiprocessing
    forkserver, which exits once it sees its parent gone): polled under the hang guard."""
    deadline = time.monotonic() + GUARD_S
    while time.monotonic() < deadline:
        try:
            os.killpg(p.pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _finish(procs: list[subprocess.Popen[str]]) -> list[tuple[str, str]]:
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=GUARD_S))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return outs


def _assert_kept(out: Path) -> None:
    rows = (out / "rounds.csv").read_text().splitlines()
    assert len(rows) > 1, rows  # the header and the rounds written before the disk filled
    assert (out / "manifest.json").is_file()


@pytest.mark.processes
def test_run_whose_schedule_does_not_fit_ends_before_any_worker(tmp_path: Path) -> None:
    with _small_disk(tmp_path / "disk", size="64k") as disk:
        out = disk / "run"
        run = _aiogc("run", "--workers", "4", "--delta", "2", "--rounds", "3000",
                     "--loop", "asyncio", "--no-progress", "--out", str(out), *TASK)
        ((_, err),) = _finish([run])
        assert run.returncode == EXIT_RECORDS, err
        assert f"No space left on device writing {out / 'delays.csv'}" in err
        assert _group_gone(run)


@pytest.mark.processes
def test_run_on_a_full_disk_ends_with_its_exit_code(tmp_path: Path) -> None:
    with _small_disk(tmp_path / "disk") as disk:
        out = disk / "run"
        run = _aiogc("run", "--workers", "4", "--delta", "2", "--rounds", "400",
                     "--loop", "asyncio", "--no-progress", "--out", str(out), *TASK)
        ((_, err),) = _finish([run])
        assert run.returncode == EXIT_RECORDS, err
        assert "Traceback" not in err
        assert f"No space left on device writing {out}" in err
        assert "the run's records could not be written" in err
        assert _group_gone(run)  # the workers stopped with it
        _assert_kept(out)


@pytest.mark.processes
def test_ps_on_a_full_disk_ends_with_its_exit_code_and_stops_its_workers(
        tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"0123456789abcdef0123456789abcdef")
    with _small_disk(tmp_path / "disk") as disk:
        out = disk / "run"
        ps = _aiogc("ps", "--port", "0", "--workers", "4", "--delta", "2", "--rounds", "400",
                    "--secret-file", str(secret), "--out", str(out), "--loop", "asyncio",
                    "--join-timeout", CLI_JOIN_TIMEOUT_S, *TASK)
        procs = [ps]
        try:
            procs.append(_aiogc("worker", "--connect", listening(ps),
                                "--id", "0-3", "--secret-file", str(secret)))
        finally:
            (_, ps_err), (_, w_err) = _finish(procs)
        assert ps.returncode == EXIT_RECORDS, ps_err
        assert "Traceback" not in ps_err
        assert f"No space left on device writing {out}" in ps_err
        assert "records could not be written" in w_err  # the workers were told why
        assert procs[1].returncode is not None
        _assert_kept(out)
