"""A worker written from docs/protocol.md alone (``tests/independent_worker.py``, no aiogc
import) interoperates with ``aiogc ps`` beside aiogc's own workers: the run completes, every
round exact, and the PS's records show the independent worker's vectors in every round."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.netkit import CLI_JOIN_TIMEOUT_S, cli, listening

HERE = Path(__file__).resolve().parent
WORKER = HERE / "independent_worker.py"


def test_the_independent_worker_imports_no_aiogc() -> None:
    tree = ast.parse(WORKER.read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and n.module}
    assert "aiogc" not in names and "tests" not in names, names


def test_independent_worker_joins_an_aiogc_run(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"0123456789abcdef0123456789abcdef")
    out = tmp_path / "run"
    ps = cli("ps", "--port", "0", "--scheme", "uncoded", "--workers", "3", "--delta", "1",
             "--rounds", "4", "--delay", "exp:0.003", "--task", "linreg:samples=120,dim=6",
             "--secret-file", str(secret), "--out", str(out), "--loop", "asyncio",
             "--join-timeout", CLI_JOIN_TIMEOUT_S)
    workers: list[subprocess.Popen[str]] = []
    try:
        addr = listening(ps)
        workers = [
            cli("worker", "--connect", addr, "--id", "0-1", "--secret-file", str(secret)),
            subprocess.Popen([sys.executable, str(WORKER), "--connect", addr, "--id", "2",
                              "--secret-file", str(secret)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": ""},
                             cwd=tmp_path)]
        _, ps_err = ps.communicate(timeout=300)  # hang guard only
        outs = [w.communicate(timeout=300) for w in workers]
    finally:
        for p in [ps, *workers]:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert ps.returncode == 0, ps_err
    assert workers[1].returncode == 0, outs[1][1]
    assert "shutdown" in outs[1][1]
    events = [json.loads(line) for line in (out / "events.jsonl").open()]
    vectors = {(e["round"], e["worker"]) for e in events
               if e["direction"] == "in" and e["kind"] == "coded_gradient"}
    assert {(r, 2) for r in range(4)} <= vectors
    summary = json.loads((out / "summary.json").read_text())
    res = summary["schemes"]["uncoded"]
    assert summary["ok"] and res["rounds_exact"] == 4 and res["end_reason"] == "all rounds done"
    # the PS verified every round against the full gradient: the independent worker's
    # chunk gradient (§11) is the PS's, bit for bit
    assert res["verification"] == "verified" and res["max_rel_decode_error"] == 0.0
