"""Every CLI path ends with a reason and a documented exit code.

In-process calls of ``aiogc.cli.main`` for the error paths; separate processes where a signal,
a dead parent or a second program is the point (marked ``processes``).
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from aiogc.cli import main
from tests.netkit import cli, listening

#: Hang guard only (no assertion on durations).
GUARD_S = 120
SMALL = ["--workers", "2", "--delta", "1", "--task", "linreg:samples=40,dim=3",
         "--delay", "exp:0.001"]


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) >= 1
    return lines[-1]


# ------------------------------------------------------------------------------ usage errors


def test_ps_invalid_port_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        main(["ps", "--port", "99999", *SMALL])
    assert ei.value.code == 2
    assert "port=99999 is out of range" in capsys.readouterr().err


def test_ps_busy_port_exits_2_with_message(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rc = main(["ps", "--port", str(port), "--loop", "asyncio", *SMALL])
    assert rc == 2
    line = one_line_error(capsys)
    assert f"port={port}" in line and "listen" in line


def test_worker_id_out_of_range_fails_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["worker", "--connect", "127.0.0.1:9", "--id", "65536"])
    assert rc == 2
    assert "id=65536" in one_line_error(capsys)


@pytest.mark.parametrize("argv_tail", [["--round", "0"], ["--round", "0", "--scheme", "x"]])
def test_inspect_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   argv_tail: list[str]) -> None:
    rc = main(["inspect", str(tmp_path / "nope"), *argv_tail])
    assert rc == 2
    assert "run_dir=" in one_line_error(capsys)


def test_plot_missing_directory_and_unwritable_out(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", str(tmp_path / "nope")]) == 2
    assert "run_dir=" in one_line_error(capsys)
    (tmp_path / "file").write_text("x")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "file" / "sub")]) == 2
    assert "out=" in one_line_error(capsys)


def test_run_unwritable_out_and_missing_secret(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("x")
    assert main(["run", "--out", str(tmp_path / "file" / "sub"), "--rounds", "1", *SMALL]) == 2
    assert "out=" in one_line_error(capsys)
    assert main(["ps", "--secret-file", str(tmp_path / "missing"), "--port", "0", *SMALL]) == 2
    line = one_line_error(capsys)
    assert "secret-file=" in line and "missing" in line


def test_inspect_bad_round_and_scheme(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["run", "--as", "coroutines", "--rounds", "2", "--schemes", "partial",
                 "--no-plots", "--loop", "asyncio", "--out", str(out), *SMALL]) == 0
    capsys.readouterr()
    assert main(["inspect", str(out), "--round", "7"]) == 2
    line = one_line_error(capsys)
    assert "round=7" in line and "rounds 0..1" in line
    assert main(["inspect", str(out), "--round", "0", "--scheme", "original"]) == 2
    line = one_line_error(capsys)
    assert "scheme='original'" in line and "partial" in line
    assert main(["inspect", str(out), "--round", "1"]) == 0


# ------------------------------------------------------------------------------ early ends


def test_run_with_tiny_dead_after_does_not_exit_0(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    rc = main(["run", "--as", "coroutines", "--rounds", "3", "--schemes", "partial",
               "--dead-after", "0.001", "--heartbeat", "0.0005", "--join-timeout", "1",
               "--no-plots", "--loop", "asyncio", "--out", str(out), *SMALL])
    captured = capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    assert rc == 1, (summary, captured.err[-2000:])
    p = summary["schemes"]["partial"]
    # every worker is declared dead at once: no round can be applied, and the run says so
    assert p["rounds"] < 3
    assert summary["end_reason"] != "all rounds done"
    assert f"aiogc run: end reason: {summary['end_reason']}" in captured.err
    if p["rounds_failed"]:
        assert "failed round(s):" in captured.out and p["failed_rounds"][0]["reason"]


def test_join_timeout_writes_summary_with_end_reason(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A PS whose workers never all come: summary.json and events.jsonl say why."""
    from aiogc.config import RunConfig
    from aiogc.harness.local import run_live
    from aiogc.harness.options import RunOptions

    cfg = RunConfig(workers=3, delta=1, rounds=2, task="linreg:samples=30,dim=3",
                    delay="exp:0.001", join_timeout_s=0.5)
    # a wrong secret for every worker: they connect (starting the join timer) but never join
    import aiogc.harness.inproc as runner  # where the in-process workers are made
    from aiogc.core import Worker

    class WrongSecret(Worker):
        def __init__(self, worker_id: int, **kw: Any) -> None:
            # whatever key the runner hands over (master secret or k_j), make it wrong
            kw = {k: (b"wrong" * 8 if k in ("secret", "worker_key") else v)
                  for k, v in kw.items()}
            super().__init__(worker_id, **kw)

    monkeypatch.setattr(runner, "Worker", WrongSecret)
    res = run_live(cfg, ["partial"], RunOptions(mode="coroutines", out_dir=tmp_path, plots=False,
                   loop="asyncio", secret=b"right" * 8))
    assert "workers ready" in res.end_reason and "join_timeout_s" in res.end_reason
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["end_reason"] == res.end_reason
    assert summary["schemes"]["partial"]["rounds"] == 0
    assert "workers ready" in summary["schemes"]["partial"]["end_reason"]
    ends = [json.loads(ln) for ln in (tmp_path / "events.jsonl").read_text().splitlines()
            if '"run_end"' in ln]
    assert len(ends) == 1 and "workers ready" in ends[0]["reason"]


# ------------------------------------------------------------------------------ processes


@pytest.mark.processes
def test_ps_sigterm_while_joining_writes_summary(tmp_path: Path) -> None:
    out = tmp_path / "run"
    ps = cli("ps", "--port", "0", "--loop", "asyncio", "--out", str(out), *SMALL)
    try:
        listening(ps)
        ps.send_signal(signal.SIGTERM)
        _, err = ps.communicate(timeout=GUARD_S)
    finally:
        if ps.poll() is None:
            ps.kill()
            ps.wait()
    assert ps.returncode == 130, err
    assert "end reason: signal SIGTERM" in err and "aiogc: interrupted by SIGTERM" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["end_reason"] == "signal SIGTERM"
    assert summary["interrupted_by"] == "SIGTERM"


class _Relay:
    """A loopback TCP relay owned by the test. A worker process connects to it first, which
    proves the worker is up; only then does the test start the PS and point the relay at it.
    So the PS's 1 s join deadline runs while a started worker is already waiting, and never
    races how long a process takes to start on a loaded machine (1.0-1.2 s measured).

    Every accepted connection (the worker reconnects if its handshake times out) is paired
    with a fresh connection to the target, bytes pumped both ways until either side ends.
    """

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self._sock.getsockname()[1]}"
        self.connected = threading.Event()
        self._target: tuple[str, int] | None = None
        self._target_set = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def point_at(self, addr: str) -> None:
        host, port = addr.rsplit(":", 1)
        self._target = (host, int(port))
        self._target_set.set()

    def close(self) -> None:
        self._sock.close()
        self._target_set.set()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed by the test
                return
            self.connected.set()
            threading.Thread(target=self._pair, args=(conn,), daemon=True).start()

    def _pair(self, conn: socket.socket) -> None:
        self._target_set.wait()
        if self._target is None:
            conn.close()
            return
        try:
            upstream = socket.create_connection(self._target)
        except OSError:
            conn.close()
            return
        pumps = [threading.Thread(target=self._pump, args=(a, b), daemon=True)
                 for a, b in ((conn, upstream), (upstream, conn))]
        for t in pumps:
            t.start()
        for t in pumps:
            t.join()
        conn.close()
        upstream.close()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


@pytest.mark.processes
def test_worker_says_why_it_exits_when_the_ps_ends_early(tmp_path: Path) -> None:
    relay = _Relay()
    ps = None
    w = cli("worker", "--connect", relay.addr, "--id", "0", "--loop", "asyncio")
    try:
        # the worker is up when it connects (an event, not a duration)
        while not relay.connected.wait(0.1):
            if w.poll() is not None:
                pytest.fail(f"worker exited before connecting: {w.communicate()[1]}")
        ps = cli("ps", "--port", "0", "--loop", "asyncio", "--join-timeout", "1", *SMALL)
        relay.point_at(listening(ps))
        _, werr = w.communicate(timeout=GUARD_S)
        _, perr = ps.communicate(timeout=GUARD_S)
    finally:
        relay.close()
        for p in (ps, w):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert ps is not None
    assert w.returncode == 1, werr
    assert "aiogc worker 0: exiting: PS ended the run: only 1 of 2 workers ready" in werr
    assert ps.returncode == 1 and "end reason: only 1 of 2 workers ready" in perr


@pytest.mark.processes
def test_sigkill_of_run_leaves_no_worker(tmp_path: Path) -> None:
    """Workers watch their runner: SIGKILL it mid-run and every worker exits, saying why.

    stderr reaches EOF only once every process holding it (runner, fork server, workers) has
    exited, so reading it to the end is the check; no timing is asserted.
    """
    out = tmp_path / "run"
    run = cli("run", "--as", "processes", "--workers", "3", "--delta", "2", "--rounds",
                 "5000", "--delay", "exp:0.005", "--schemes", "partial", "--no-plots",
                 "--task", "linreg:samples=60,dim=4", "--out", str(out))
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        assert run.stderr is not None
        for line in run.stderr:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rounds = out / "rounds.csv"
        # wait (no sleep-for-sync: poll the file the runner flushes every round)
        while not started.is_set():
            if run.poll() is not None:
                pytest.fail(f"runner exited early: {''.join(lines)[-2000:]}")
            if rounds.exists() and len(rounds.read_text().splitlines()) > 2:
                started.set()
            else:
                started.wait(0.05)
        run.kill()
        reader.join(GUARD_S)
        assert not reader.is_alive(), "a worker process outlived its runner"
    finally:
        if run.poll() is None:
            run.kill()
        run.wait()
    died = [ln for ln in lines if "exiting: parent process died" in ln]
    assert len(died) == 3, "".join(lines)[-2000:]


@pytest.mark.processes
def test_run_sigterm_writes_summary_and_exits_130(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run = cli("run", "--as", "coroutines", "--rounds", "20000", "--schemes", "partial",
                 "--no-plots", "--loop", "asyncio", "--out", str(out), "--workers", "2",
                 "--delta", "1", "--task", "linreg:samples=40,dim=3", "--delay", "exp:0.002")
    try:
        rounds = out / "rounds.csv"
        ready = threading.Event()
        while not ready.is_set():  # poll the file the runner flushes every round
            if run.poll() is not None:
                pytest.fail(run.communicate()[1][-2000:])
            if rounds.exists() and len(rounds.read_text().splitlines()) > 2:
                ready.set()
            else:
                ready.wait(0.05)
        run.send_signal(signal.SIGTERM)
        stdout, err = run.communicate(timeout=GUARD_S)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 130, err[-2000:]
    assert "end reason: stopped by SIGTERM" in err and "partial" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["end_reason"] == "stopped by SIGTERM"
    assert summary["schemes"]["partial"]["rounds"] >= 1


def test_keys_derive_prints_the_worker_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from aiogc.protocol.auth import derive_worker_key

    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 32 + b"\n")
    assert main(["keys", "derive", "--secret-file", str(secret), "--worker", "3"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == derive_worker_key(b"s" * 32, 3).hex()
    assert bytes.fromhex(out) != derive_worker_key(b"s" * 32, 4)
    assert main(["keys", "derive", "--secret-file", str(secret), "--worker", "-1"]) == 2


def test_worker_with_a_missing_task_file_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the file check comes before any connection attempt: no "PS unreachable" for a local typo
    for task in (f"logreg:{tmp_path / 'missing.csv'}", f"{tmp_path / 'missing.py'}:make"):
        rc = main(["worker", "--connect", "127.0.0.1:9", "--id", "0", "--task", task])
        err = capsys.readouterr().err
        assert rc == 2 and "task" in err and "exists on this worker" in err
        assert "unreachable" not in err
    rc = main(["worker", "--connect", "127.0.0.1:9", "--id", "0",
               "--data-dir", str(tmp_path / "nodir")])
    assert rc == 2 and "data-dir" in capsys.readouterr().err
