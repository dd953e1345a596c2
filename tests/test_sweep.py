"""Experiments as files: aiogc run --config, aiogc sweep (grid, resume, results.csv)."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

import pytest

from aiogc.cli import main
from aiogc.cli.sweep import cmd_sweep
from aiogc.harness.sweep import MARKER, expand_grid

BASE = """\
workers = 4
delta = 2
rounds = 2
as = "coroutines"
loop = "asyncio"
plots = false
verify = true
task = "linreg:samples=80,dim=4"
schemes = ["partial", "original"]
"""


def _file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "exp.toml"
    p.write_text(text, encoding="utf-8")
    return p


def test_run_config_file_with_a_flag_on_top(tmp_path: Path) -> None:
    f = _file(tmp_path, BASE + 'delay = "exp:0.001"\n' + f'out = "{tmp_path / "r"}"\n')
    assert main(["run", "--config", str(f), "--rounds", "3", "--schemes", "partial"]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert list(summary["schemes"]) == ["partial"]  # the flag overrides the file's list
    assert summary["schemes"]["partial"]["rounds"] == 3
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["config"]["workers"] == 4


@pytest.mark.parametrize(("line", "needles"), [
    ("wrkers = 4", ["wrkers=4", "one of the keys", "workers"]),
    ('workers = "four"', ["workers='four'", "integer"]),
    ("verify = 1", ["verify=1", "true or false"]),
    ("time-scale = 0.5", ["time-scale=0.5", "[1, 1000]"]),
    ("fidelity = \"loose\"", ["fidelity='loose'", "report, strict"]),
])
def test_bad_file_names_key_value_and_allowed(tmp_path: Path, capsys: Any, line: str,
                                              needles: list[str]) -> None:
    f = _file(tmp_path, line + "\n")
    assert main(["run", "--config", str(f), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    for n in needles:
        assert n in err, (n, err)


def test_bad_grid_names_the_grid_key(tmp_path: Path, capsys: Any) -> None:
    f = _file(tmp_path, BASE + "[grid]\nworkers = 4\n")
    assert main(["sweep", str(f), "--out", str(tmp_path / "s")]) == 2
    assert "grid.workers=4" in capsys.readouterr().err
    f = _file(tmp_path, BASE + "[grid]\nworkers = [4, 0]\n")
    assert main(["sweep", str(f), "--out", str(tmp_path / "s")]) == 2
    assert "workers" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()  # checked before anything ran


def test_cell_names_are_readable_stable_and_unique() -> None:
    cells = expand_grid({"workers": [4, 5], "delay": ["exp:0.02", "exp,0.02"]})
    names = [c.name for c in cells]
    assert names[0].startswith("workers=4__delay=exp_0.02-")  # clash: both get a hash suffix
    assert len(set(names)) == 4
    assert names == [c.name for c in expand_grid({"workers": [4, 5],
                                                  "delay": ["exp:0.02", "exp,0.02"]})]
    assert [c.name for c in expand_grid({"seed": [1, 2]})] == ["seed=1", "seed=2"]


def test_sweep_interrupted_resumed_ends_with_six_cells_and_one_table(tmp_path: Path) -> None:
    f = _file(tmp_path, BASE + '[grid]\ndelay = ["exp:0.001", "shiftexp:0.0005,0.001"]\n'
                               "seed = [1, 2, 3]\n")
    out = tmp_path / "sweep"
    args = argparse.Namespace(file=str(f), out=str(out), rerun_failed=False, list=False)
    done: list[str] = []

    def stop_after_three(cell: Any, d: Path) -> None:
        done.append(cell.name)
        if len(done) == 3:
            raise KeyboardInterrupt("test: stop after the third cell")

    with pytest.raises(KeyboardInterrupt):
        cmd_sweep(args, None, on_cell_done=stop_after_three)
    assert len(done) == 3
    finished = sorted(p.parent.name for p in out.glob("*/summary.json"))
    assert finished == sorted(done)
    # a cell cut short: its marker is back (as if killed mid-run); it must be re-run
    (out / done[1] / MARKER).write_text("")
    ran: list[str] = []
    assert cmd_sweep(args, None, on_cell_done=lambda c, d: ran.append(c.name)) == 0
    assert done[0] not in ran and done[2] not in ran
    assert done[1] in ran and len(ran) == 4
    cells = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert len(cells) == 6
    for c in cells:
        assert (out / c / "summary.json").exists() and not (out / c / MARKER).exists()
    # one tidy table: one header line, no comments, one row per cell and scheme
    lines = (out / "results.csv").read_text().splitlines()
    assert not any(line.startswith("#") for line in lines)
    rows = list(csv.DictReader(lines))
    assert len(rows) == 12
    assert {r["cell"] for r in rows} == set(cells)
    assert all(len(r) == len(rows[0]) and None not in r for r in rows)
    assert {r["scheme"] for r in rows} == {"partial", "original"}
    assert all(r["rounds"] == "2" and r["complete"] == "1" for r in rows)
    assert {r["seed"] for r in rows} == {"1", "2", "3"}
    # a third sweep runs nothing
    ran.clear()
    assert cmd_sweep(args, None, on_cell_done=lambda c, d: ran.append(c.name)) == 0
    assert ran == []
    import pandas as pd  # the dev extra installs it: pandas must load every table
    df = pd.read_csv(out / "results.csv")
    assert df.shape[0] == 12
