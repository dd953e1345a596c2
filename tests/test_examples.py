"""The files in examples/ run as they are (examples/notebook.py: tests/test_api.py;
examples/mlp_digits.py: tests/test_frameworks.py): the TOML sweep end to end, and the
two-machine recipe with both roles on this machine over loopback."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
# the scripts call `aiogc`: the console script installed beside this interpreter
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
       "PYTHONPATH": str(ROOT)}


def test_the_sweep_file_runs_every_cell(tmp_path: Path) -> None:
    spec = tomllib.loads((EXAMPLES / "sweep.toml").read_text())
    cells = len(spec["grid"]["workers"]) * len(spec["grid"]["delay"])
    out = subprocess.run([sys.executable, "-m", "aiogc", "sweep", str(EXAMPLES / "sweep.toml"),
                          "--out", str(tmp_path / "sw")], capture_output=True, text=True,
                         env=ENV, cwd=tmp_path, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    with (tmp_path / "sw" / "results.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == cells * len(spec["schemes"])
    assert {r["cell"] for r in rows} == {p.name for p in (tmp_path / "sw").iterdir()
                                         if p.is_dir()}
    for r in rows:
        assert r["complete"] == "1" and r["rounds"] == str(spec["rounds"]), r
        assert r["end_reason"] == "all rounds done", r


@pytest.mark.processes
def test_the_two_machine_recipe_on_loopback(tmp_path: Path) -> None:
    assert shutil.which("aiogc", path=ENV["PATH"]), "the aiogc console script is not installed"
    script = str(EXAMPLES / "two_machines.sh")
    env = {**ENV, "WORKERS": "3", "DELTA": "2", "ROUNDS": "5", "PORT": "0",
           "OUT": str(tmp_path / "ps")}
    ps = subprocess.Popen(["sh", script, "ps", "127.0.0.1"], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert ps.stderr is not None
        port = None
        for line in ps.stderr:  # "aiogc ps listening on 127.0.0.1:PORT (epoch ...)"
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
            if m:
                port = m.group(1)
                break
        assert port, "aiogc ps never said where it listens"
        secret = tmp_path / "secret"
        assert secret.stat().st_mode & 0o077 == 0  # readable only by its owner
        keys = sorted(p.name for p in tmp_path.glob("key*"))
        assert keys == ["key0", "key1", "key2"]
        workers = subprocess.run(["sh", script, "worker", "127.0.0.1"], cwd=tmp_path,
                                 env={**env, "PORT": port}, capture_output=True, text=True,
                                 timeout=600)
        assert workers.returncode == 0, workers.stderr[-3000:]
        assert ps.wait(timeout=120) == 0, ps.stderr.read()[-3000:]
    finally:
        if ps.poll() is None:
            ps.kill()
            ps.wait()
    summary = json.loads((tmp_path / "ps" / "summary.json").read_text())
    assert summary["ok"] is True
    assert summary["in_progress"] is False


def test_the_two_machine_recipe_refuses_an_unknown_role(tmp_path: Path) -> None:
    out = subprocess.run(["sh", str(EXAMPLES / "two_machines.sh"), "both", "127.0.0.1"],
                         cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "the role is ps or worker, not 'both'" in out.stderr
