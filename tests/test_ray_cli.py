"""`aiogc run --backend ray` as a command: flags, errors, and Ctrl-C on the driver.

The Ctrl-C test lets the driver start its own local Ray instance (no --address), so every Ray
process of the run descends from it and the test can check that none outlives it; it is
skipped, with the reason, when Ray is not installed -- unless AIOGC_REQUIRE_RAY=1 (set by
.ci/run). The other tests need no Ray.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aiogc.cli import main
from aiogc.harness import ray_backend
from aiogc.harness.ray_backend import cpus_per_actor
from tests.helpers import StreamWatcher, wait_pids_exit

#: Hang guard only (no assertion on durations).
GUARD_S = 180


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has exited; only its parent's wait is missing


def wait_all_exit(pids: set[int], timeout_s: float) -> set[int]:
    """Wait (on pidfds, not by sleeping) until every pid exited; return those still alive."""
    wait_pids_exit(pids, timeout_s)
    return {p for p in pids if alive(p)}


@pytest.mark.processes
@pytest.mark.slow
def test_ctrl_c_on_the_driver_tears_everything_down(tmp_path: Path) -> None:
    if os.environ.get("AIOGC_REQUIRE_RAY") != "1":
        pytest.importorskip("ray", reason="the ray extra is not installed "
                                          "(pip install -e '.[ray]')")
    out = tmp_path / "run"
    rounds = 400  # far more than can finish before the interrupt
    stdout = (tmp_path / "stdout").open("wb")
    driver = subprocess.Popen(
        [sys.executable, "-m", "aiogc", "run", "--backend", "ray", "--workers", "3",
         "--delta", "2", "--rounds", str(rounds), "--delay", "const:0.02",
         "--schemes", "partial,original", "--task", "linreg:samples=60,dim=4",
         "--out", str(out), "--no-plots", "--progress"],
        stdout=stdout, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    stdout.close()  # the child holds its own copy
    err = StreamWatcher(driver.stderr)
    tree: set[int] = set()
    try:
        # the progress bar shows a finished round: the PS and the workers are running
        assert err.wait_for(f"2/{rounds} rounds", GUARD_S), err.text
        tree = descendants(driver.pid)
        assert tree, "the driver started no Ray processes?"
        driver.send_signal(signal.SIGINT)
        driver.wait(timeout=GUARD_S)  # not communicate(): it would race the watcher for stderr
        err.wait_eof(GUARD_S)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=GUARD_S)
    left = wait_all_exit(tree, timeout_s=60)
    for pid in left:  # only after a failure: do not leave the run's processes behind
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert driver.returncode == 130, err.text
    assert "interrupted" in err.text, err.text[-3000:]
    assert not left, f"still running after the driver exited: {sorted(left)}"
    # what was recorded before the interrupt is on disk; the second scheme never started
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["schemes"]) == ["partial"]
    assert 2 <= summary["schemes"]["partial"]["rounds"] < rounds
    assert (out / "nodes.csv").read_text().count("\npartial,worker,") == 3
    assert "original" not in (tmp_path / "stdout").read_text()


def test_cpus_per_actor() -> None:
    assert cpus_per_actor([2.0], 5) == 0.4
    assert cpus_per_actor([64.0], 5) == 1.0
    assert cpus_per_actor([2.0], 3) == 0.6666
    assert cpus_per_actor([1.0, 1.0, 1.0], 5) == 0.5  # 0.6 (= 3 CPUs / 5) would not pack
    assert cpus_per_actor([2.0, 2.0, 2.0], 5) == 1.0
    assert cpus_per_actor([4.0, 0.5], 9) == 0.5
    with pytest.raises(Exception, match=r"0\.0001"):
        cpus_per_actor([0.0], 5)


def test_unreachable_cluster_is_a_clear_error() -> None:
    """ray.init's failure becomes a ClusterError naming the address (the real one takes ~20 s
    of retries, so Ray is stood in for here); an explicit HOST:PORT that accepts no TCP
    connection fails before ray.init, at once, in one line."""
    class Unreachable:
        @staticmethod
        def is_initialized() -> bool:
            return False

        @staticmethod
        def init(**kwargs: object) -> None:
            raise ConnectionError(f"Failed to connect to Ray cluster at {kwargs['address']}")

    with pytest.raises(ray_backend.ClusterError, match=r"address='auto'"):
        ray_backend._connect(Unreachable(), "auto")
    with socket.socket() as s:  # a loopback port nobody listens on (bound, not listening)
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(ray_backend.ClusterError, match=r"no TCP connection") as ei:
            ray_backend._connect(Unreachable(), addr)
    assert addr in str(ei.value) and "\n" not in str(ei.value)
    with pytest.raises(ray_backend.ClusterError, match="HOST:PORT"):
        ray_backend._connect(Unreachable(), "nonsense")


def test_token_error_gets_a_hint() -> None:
    class TokenRefused:
        @staticmethod
        def is_initialized() -> bool:
            return False

        @staticmethod
        def init(**kwargs: object) -> None:
            raise RuntimeError("Unauthenticated: invalid auth token\nmore detail")

    with pytest.raises(ray_backend.ClusterError, match="RAY_AUTH_TOKEN") as ei:
        ray_backend._connect(TokenRefused(), "auto")
    assert "more detail" not in str(ei.value)


def test_unknown_backend_names_field(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "--backend", "slurm", "--workers", "2", "--delta", "1", "--rounds", "1"])
    assert rc == 2
    assert "backend='slurm'" in capsys.readouterr().err


def test_address_needs_the_ray_backend(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "--address", "auto", "--workers", "2", "--delta", "1", "--rounds", "1"])
    assert rc == 2
    assert "address='auto'" in capsys.readouterr().err


def test_coroutines_do_not_apply_to_the_ray_backend(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "--backend", "ray", "--as", "coroutines", "--workers", "2", "--delta", "1",
               "--rounds", "1"])
    assert rc == 2
    assert "as='coroutines'" in capsys.readouterr().err


def test_auto_is_resolved_and_checked_before_ray_init(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--address auto`` resolving to an address this driver cannot reach fails at once,
    naming what it resolved to, instead of ray.init retrying through the default route."""
    import ray._private.services as services

    class NeverCalled:
        @staticmethod
        def is_initialized() -> bool:
            return False

        @staticmethod
        def init(**kwargs: object) -> None:
            raise AssertionError("ray.init must not be reached")

    with socket.socket() as s:  # a loopback port nobody listens on (bound, not listening)
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"
        monkeypatch.setattr(services, "canonicalize_bootstrap_address",
                            lambda a, temp_dir=None: addr)
        with pytest.raises(ray_backend.ClusterError) as ei:
            ray_backend._connect(NeverCalled(), "auto")
    msg = str(ei.value)
    assert f"address='auto' (resolved to {addr})" in msg and "no TCP connection" in msg


def test_closing_lines_come_last_and_apart_after_a_ray_run(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capfd: pytest.CaptureFixture[str]
                                                           ) -> None:
    """aiogc run's closing lines are written after everything the runner (and Ray, through
    the process's stderr) printed: under a banner after a Ray run, with the runner's own
    warnings from during the run repeated first; a local run's lines are unchanged. The Ray
    backend is stood in for by a local run whose runner then prints as Ray's shutdown does
    (straight to fd 2, and buffered through sys.stderr) and leaves a note."""
    import dataclasses

    import aiogc.harness.local as local
    from aiogc.cli.run import END_BANNER

    real = local.run_live
    note = "aiogc: ray: worker 1 was lost with its node 10.0.0.2 (dead: node died) and never " \
           "restarted"

    def ray_like(base: Any, schemes: Any, options: Any) -> Any:
        result = real(base, schemes, dataclasses.replace(options, backend="local",
                                                          mode="coroutines"))
        result.notes.append(note)
        os.write(2, b"[raylet] Failed to connect to GCS, retrying (1/5)\n")
        sys.stderr.write("Ray's own shutdown line, buffered\n")
        return result

    monkeypatch.setattr(local, "run_live", ray_like)
    common = ["run", "--workers", "2", "--delta", "1", "--rounds", "2", "--schemes", "partial",
              "--task", "linreg:samples=40,dim=4", "--delay", "none", "--no-plots",
              "--no-progress"]
    assert main([*common, "--backend", "ray", "--out", str(tmp_path / "ray")]) == 0
    err = capfd.readouterr().err
    assert err.endswith(f"\n\n{END_BANNER}\n{note}\naiogc run: end reason: all rounds done\n"), \
        err[-600:]
    monkeypatch.setattr(local, "run_live", real)
    assert main([*common, "--as", "coroutines", "--out", str(tmp_path / "local")]) == 0
    err = capfd.readouterr().err
    assert END_BANNER not in err and note not in err
    assert err.endswith("aiogc run: end reason: all rounds done\n"), err[-600:]


@pytest.mark.processes
@pytest.mark.slow
def test_a_ray_runs_closing_lines_come_after_rays(tmp_path: Path) -> None:
    """On a local Ray instance the driver starts (and stops) itself: the closing block is the
    end of stderr, after every line Ray printed."""
    if os.environ.get("AIOGC_REQUIRE_RAY") != "1":
        pytest.importorskip("ray", reason="the ray extra is not installed "
                                          "(pip install -e '.[ray]')")
    from aiogc.cli.run import END_BANNER

    proc = subprocess.run(
        [sys.executable, "-m", "aiogc", "run", "--backend", "ray", "--workers", "2",
         "--delta", "1", "--rounds", "2", "--schemes", "partial",
         "--task", "linreg:samples=40,dim=4", "--delay", "none", "--out", str(tmp_path / "r"),
         "--no-plots", "--no-progress"],
        capture_output=True, text=True, timeout=GUARD_S, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Ray" in proc.stderr  # Ray said something first (its start-up lines)
    assert proc.stderr.endswith(f"\n\n{END_BANNER}\naiogc run: end reason: all rounds done\n"), \
        proc.stderr[-3000:]
