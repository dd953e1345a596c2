"""`aiogc ps` and `aiogc worker` as separate processes, as on different machines (loopback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.netkit import CLI_JOIN_TIMEOUT_S, cli, listening

pytestmark = pytest.mark.processes

#: Hang guard only (no assertion on durations).
GUARD_S = 120


@pytest.mark.parametrize("id_groups", [("0", "1", "2", "3"), ("0-2", "3")])
def test_ps_and_workers_as_separate_processes(tmp_path: Path, id_groups: tuple[str, ...]) -> None:
    """One process per worker, or (``--id A-B``) a block of workers as coroutines in one."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"0123456789abcdef0123456789abcdef")
    out = tmp_path / "run"
    ps = cli("ps", "--port", "0", "--workers", "4", "--delta", "2", "--rounds", "3",
             "--delay", "exp:0.003", "--task", "linreg:samples=120,dim=6",
             "--secret-file", str(secret), "--out", str(out), "--verify", "--loop", "asyncio",
             "-v", "--join-timeout", CLI_JOIN_TIMEOUT_S)
    workers: list[subprocess.Popen[str]] = []
    try:
        addr = listening(ps)
        workers = [cli("worker", "--connect", addr, "--id", ids, "--secret-file", str(secret),
                       "-v")
                   for ids in id_groups]
        ps_out, ps_err = ps.communicate(timeout=GUARD_S)
        outs = [w.communicate(timeout=GUARD_S) for w in workers]
    finally:
        for p in [ps, *workers]:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert ps.returncode == 0, ps_err
    assert [w.returncode for w in workers] == [0] * len(id_groups), outs
    said = "".join(err for _, err in outs)
    assert all(f"aiogc worker {j}: exiting" in said for j in range(4)), said
    # -v: a line per round on both sides
    for r in range(3):
        assert f"aiogc: round {r}: exact in " in ps_err, ps_err
    for j in range(4):
        assert f"aiogc: worker {j} round 0: " in said, said
    summary = json.loads((out / "summary.json").read_text())
    s = summary["schemes"]["partial"]
    assert s["rounds"] == 3 and s["rounds_failed"] == 0
    assert s["max_rel_decode_error"] <= 1e-9
    assert "partial" in ps_out


def test_worker_with_wrong_secret_exits_with_error(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.write_bytes(b"g" * 32)
    bad = tmp_path / "bad"
    bad.write_bytes(b"b" * 32)
    # the PS is killed once the worker has exited
    ps = cli("ps", "--port", "0", "--workers", "1", "--delta", "1", "--rounds", "1",
             "--secret-file", str(good), "--join-timeout", CLI_JOIN_TIMEOUT_S)
    try:
        w = subprocess.run(
            [sys.executable, "-m", "aiogc", "worker", "--connect", listening(ps), "--id", "0",
             "--secret-file", str(bad)],
            capture_output=True, text=True, timeout=GUARD_S)
    finally:
        ps.kill()
        ps.wait()
    assert w.returncode == 3
    assert "auth_failed" in w.stderr


def test_non_loopback_bind_without_secret_is_refused() -> None:
    r = subprocess.run([sys.executable, "-m", "aiogc", "ps", "--host", "0.0.0.0", "--port", "0",
                        "--workers", "2", "--delta", "1"],
                       capture_output=True, text=True, timeout=GUARD_S,
                       env={k: v for k, v in os.environ.items() if k != "AIOGC_SECRET"})
    assert r.returncode == 2
    assert "secret" in r.stderr
