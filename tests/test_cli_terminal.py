"""The command line as a terminal user meets it: ``-v`` logs every round of every command that
runs rounds (run, sweep, simulate; an experiment's finished cells), progress shows a rate and an
ETA (runs and sweeps), an experiment prints a short table and leaves its JSON in the file, and
``aiogc report`` takes a sweep directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import aiogc
from aiogc.cli import main
from aiogc.harness.kit import Progress
from aiogc.harness.sweep import Cell, run_sweep

SMALL = ["--workers", "4", "--delta", "2", "--as", "coroutines", "--loop", "asyncio",
         "--task", "linreg:samples=80,dim=6", "--delay", "exp:0.002", "--no-plots"]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_progress_shows_rate_and_eta() -> None:
    clock = Clock()
    bar = Progress(10, "partial", enabled=False, clock=clock)
    assert bar.line().endswith("0/10 rounds   0.0 s, 0.0/s, ETA after the first round")
    clock.t = 2.0
    bar.update(4)
    assert bar.line().endswith("4/10 rounds   2.0 s, 2.0/s, ETA 3 s")


def test_run_v_logs_every_round_of_every_scheme(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-v", "--rounds", "3", "--out", str(tmp_path / "r"), *SMALL]) == 0
    err = capsys.readouterr().err
    for scheme in ("partial", "original"):
        for r in range(3):
            assert f"aiogc: {scheme} round {r}: exact in " in err
    assert "rounds/s" not in err and "[###" not in err  # the log replaces the bar
    assert main(["run", "--rounds", "2", "--out", str(tmp_path / "q"), *SMALL]) == 0
    assert " round 0: " not in capsys.readouterr().err


@pytest.mark.parametrize("engine", ["fast", "protocol"])
def test_simulate_v_logs_every_round_of_every_scheme(engine: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--workers", "6", "--delta", "2", "--rounds", "4", "--engine", engine]
    assert main([*argv, "-v"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    lines = [ln for ln in captured.err.splitlines() if " round " in ln]
    assert len(lines) == 2 * 4
    for row in summary["results"]:
        for r in range(4):
            assert any(ln.startswith(f"aiogc: {row['scheme']} round {r}: exact in ")
                       for ln in lines), (row["scheme"], r)
    assert main(argv) == 0
    assert " round " not in capsys.readouterr().err
    # approximate mode: a line per deadline and round, with its MSE
    assert main([*argv, "-v", "--mode", "approx", "--deadline", "0.5,2"]) == 0
    err = capsys.readouterr().err
    assert err.count("aiogc: partial (deadline 0.5 s) round ") == 4
    assert err.count("aiogc: original (deadline 2 s) round 3: ") == 1 and ", mse " in err


def test_sweep_v_logs_every_round_of_every_cell(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from aiogc.api import sweep_toml

    file = tmp_path / "grid.toml"
    file.write_text(sweep_toml({"workers": [4, 5]}, {
        "delta": 2, "rounds": 2, "as": "coroutines", "loop": "asyncio", "plots": False,
        "task": "linreg:samples=80,dim=6", "delay": "exp:0.002", "schemes": ["partial"]}))
    assert main(["sweep", "-v", str(file), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert err.count("aiogc: partial round 0: exact in ") == 2
    assert err.count("aiogc: partial round 1: exact in ") == 2


def test_experiment_v_logs_each_finished_cell(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from aiogc.experiments import EXPERIMENTS
    from aiogc.experiments._common import cells

    def compute(quick: bool, seed: int) -> list[dict[str, object]]:
        tick = cells(2)
        rows: list[dict[str, object]] = []
        for i in range(2):
            rows.append({"cell": i, "value": 0.5 + i})
            tick(rows)
        return rows

    monkeypatch.setitem(EXPERIMENTS, "poly-digits",
                        dataclasses.replace(EXPERIMENTS["poly-digits"], compute=compute,
                                            plot=lambda rows, path: None,
                                            summarise=lambda rows: {}))
    assert main(["experiment", "poly-digits", "--quick", "--out", str(tmp_path), "-v"]) == 0
    err = capsys.readouterr().err
    assert err.count("aiogc: poly-digits: cell=0, value=0.5\n") == 1
    assert err.count("aiogc: poly-digits: cell=1, value=1.5\n") == 1
    assert main(["experiment", "poly-digits", "--quick", "--out", str(tmp_path)]) == 0
    assert "cell=0" not in capsys.readouterr().err


def test_sweep_lines_count_cells_and_give_an_eta(tmp_path: Path) -> None:
    clock = Clock()
    lines: list[str] = []
    cells = [Cell(f"c{i}", {"i": i}) for i in range(3)]

    def run_cell(cell: Cell, d: Path) -> None:
        clock.t += 10.0
        (d / "summary.json").write_text(json.dumps({"schemes": {}}))

    run_sweep(tmp_path, cells, lambda c: dict(c.values), run_cell, ["partial"],
              log=lines.append, clock=clock)
    assert lines == ["sweep: [1/3] c0: running",
                     "sweep: [2/3] c1: running (10 s so far, ETA 20 s)",
                     "sweep: [3/3] c2: running (20 s so far, ETA 10 s)"]


def test_experiment_prints_a_short_table_and_keeps_the_json_in_its_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", "poly-digits", "--quick", "--out", str(tmp_path), "-q"]) == 0
    out = capsys.readouterr().out
    first, *rows = out.splitlines()
    assert first.startswith("poly-digits: ") and str(tmp_path / "poly-digits.json") in first
    meta = json.loads((tmp_path / "poly-digits.json").read_text())
    assert 0 < len(rows) <= 13 and "{" not in out
    key, value = rows[0].split()[0], rows[0].split()[-1]
    head = meta["headline"]
    for part in key.split("/"):
        head = head[part]
    assert float(value) == pytest.approx(float(head), rel=1e-3)


def test_report_of_a_sweep_directory_links_each_cell(tmp_path: Path) -> None:
    res = aiogc.sweep({"workers": [4, 5]}, delta=2, rounds=3, as_="coroutines", plots=False,
                      loop="asyncio", task="linreg:samples=80,dim=6", delay="exp:0.002",
                      out=tmp_path)
    assert main(["report", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text()
    assert '<section id="sweep">' in page and "mean round time, 95% CI (s)" in page
    for cell in res.ran:
        assert (tmp_path / cell / "report.html").is_file()
        assert f'href="{cell.replace("=", "%3D")}/report.html"' in page
    assert page.count("–") >= 4  # a CI per cell and scheme


def test_ctrl_c_on_an_experiment_keeps_the_finished_cells(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from aiogc.experiments import EXPERIMENTS
    from aiogc.experiments._common import cells, read_csv

    def compute(quick: bool, seed: int) -> list[dict[str, object]]:
        tick = cells(3)
        rows: list[dict[str, object]] = []
        for i in range(2):
            rows.append({"cell": i, "value": 0.5 + i})
            tick(rows)
        raise KeyboardInterrupt  # Ctrl-C during the third cell

    (tmp_path / "poly-digits.png").write_bytes(b"an earlier run's figure")
    monkeypatch.setitem(EXPERIMENTS, "poly-digits",
                        dataclasses.replace(EXPERIMENTS["poly-digits"], compute=compute))
    assert main(["experiment", "poly-digits", "--quick", "--out", str(tmp_path), "-q"]) == 130
    err = capsys.readouterr().err
    assert "interrupted after 2 of 3 cells" in err
    assert read_csv(tmp_path / "poly-digits.csv") == [{"cell": 0, "value": 0.5},
                                                      {"cell": 1, "value": 1.5}]
    meta = json.loads((tmp_path / "poly-digits.json").read_text())
    assert meta["interrupted"] is True and (meta["cells_done"], meta["cells"]) == (2, 3)
    assert meta["headline"] is None and not (tmp_path / "poly-digits.png").exists()
    assert main(["report", str(tmp_path)]) == 0  # the page of what finished says so
    assert "interrupted after 2 of 3 cells" in (tmp_path / "report.html").read_text()


def test_experiment_page_labels_its_tables(tmp_path: Path) -> None:
    """The quantities an experiment labels get their columns, units and CIs (lo–hi)."""
    assert main(["experiment", "exact-speedup", "--quick", "--out", str(tmp_path), "-q"]) == 0
    assert main(["report", str(tmp_path)]) == 0
    text = (tmp_path / "report.html").read_text()
    head = json.loads((tmp_path / "exact-speedup.json").read_text())["headline"]
    assert "<caption>cells</caption>" in text
    for col in ("assignment", "delay", "ℓ", "speedup (x)", "95% CI"):
        assert f"<th>{col}</th>" in text or f'<th class="">{col}</th>' in text or \
            f'<th class="k">{col}</th>' in text, col
    key, (est, lo, hi) = next(iter(head["cells"].items()))
    a, d, ell = key.split("|")
    row = (f'<td class="k">{a}</td><td class="">{d}</td><td class="">{ell.split("=")[1]}'
           f'</td><td class="">{est:.4g}</td><td class="">{lo:.4g}–{hi:.4g}</td>')
    assert row in text
    assert "speedup_min_ci" in text and "[" not in text.split("speedup_min_ci")[1][:60]
