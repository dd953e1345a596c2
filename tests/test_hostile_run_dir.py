"""A hostile or corrupt run directory gets one clear error from every reader.

A real run directory is written once; each case copies it and damages one file the way an
adversary (or a broken disk) would: a 5 MB CSV cell, a cell of the wrong type, a time of
1e308, deeply nested JSON, NaN in JSON, a JSON array for an object, a huge or non-object
events line. ``load_run`` / ``aiogc.load_run`` raise :class:`RunFileError` naming the file and
where in it; ``aiogc report`` / ``inspect`` / ``whatif`` / ``plot`` exit 2 with that message on
one line and no traceback.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import aiogc
from aiogc.cli import EXIT_CONFIG, main
from aiogc.config import RunConfig
from aiogc.harness.loaders import load_events, load_run
from aiogc.harness.local import run_live
from aiogc.harness.options import RunOptions
from aiogc.harness.runfiles import MAX_JSON_DEPTH, RunFileError

CFG = RunConfig(workers=4, delta=2, rounds=3, seed=5, task="linreg:samples=80,dim=4",
                delay="exp:0.001")


@pytest.fixture(scope="module")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("run")
    run_live(CFG, ["partial"], RunOptions(mode="coroutines", out_dir=d, plots=False,
                                          loop="asyncio"))
    return d


def _replace_cell(path: Path, column: str, value: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    header = lines[0].rstrip("\r\n").split(",")
    cells = lines[1].rstrip("\r\n").split(",")
    cells[header.index(column)] = value
    lines[1] = ",".join(cells) + "\r\n"
    path.write_text("".join(lines))


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


#: name -> (how to damage the directory, the file named, what the message says)
CASES: dict[str, tuple[Callable[[Path], object], str, str]] = {
    "csv_cell_5mb": (lambda d: _replace_cell(d / "rounds.csv", "scheme", "x" * 5_000_000),
                     "rounds.csv", "line"),
    "csv_bad_int": (lambda d: _replace_cell(d / "rounds.csv", "round", "zero"),
                    "rounds.csv", "column round: 'zero' is not a integer"),
    "csv_time_1e308": (lambda d: _replace_cell(d / "rounds.csv", "start_s", "1e308"),
                       "rounds.csv", "column start_s: '1e308' is not a time"),
    "csv_time_inf": (lambda d: _replace_cell(d / "workers.csv", "arrival_s", "inf"),
                     "workers.csv", "column arrival_s: 'inf' is not a time"),
    "summary_nested": (lambda d: (d / "summary.json").write_text(_nested(100_000)),
                       "summary.json", f"nested deeper than {MAX_JSON_DEPTH} levels"),
    "summary_nested_shallow": (lambda d: (d / "summary.json").write_text(
        '{"a": ' + _nested(MAX_JSON_DEPTH + 1) + "}"),
        "summary.json", "nested deeper"),
    "manifest_nan": (lambda d: (d / "manifest.json").write_text('{"seed": NaN}'),
                     "manifest.json", "non-finite number NaN"),
    "manifest_array": (lambda d: (d / "manifest.json").write_text("[1, 2]"),
                       "manifest.json", "top level: a JSON dict, not list"),
    "summary_not_json": (lambda d: (d / "summary.json").write_text("{oops"),
                         "summary.json", "line 1, column 2: not JSON"),
}

EVENT_CASES: dict[str, tuple[Callable[[Path], object], str]] = {
    "event_line_huge": (lambda d: (d / "events.jsonl").write_text(
        '{"k": "' + "x" * 2_000_000 + '"}\n'), "longer than"),
    "event_not_object": (lambda d: (d / "events.jsonl").write_text("[1]\n"), "a JSON object"),
    "event_nested": (lambda d: (d / "events.jsonl").write_text(_nested(100_000) + "\n"),
                     "nested deeper"),
}


def _damaged(good: Path, tmp_path: Path, damage: Callable[[Path], object]) -> Path:
    d = tmp_path / "run"
    shutil.copytree(good, d)
    damage(d)
    return d


@pytest.mark.parametrize("case", sorted(CASES))
def test_load_run_names_the_file_and_field(good_run: Path, tmp_path: Path, case: str) -> None:
    damage, name, says = CASES[case]
    d = _damaged(good_run, tmp_path, damage)
    with pytest.raises(RunFileError) as ei:
        aiogc.load_run(d, pandas=False)
    msg = str(ei.value)
    assert msg.startswith(str(d / name)) and says in msg, msg
    assert len(msg) < 400  # the value is shortened, never echoed whole


@pytest.mark.parametrize("case", sorted(EVENT_CASES))
def test_events_are_bounded(good_run: Path, tmp_path: Path, case: str) -> None:
    damage, says = EVENT_CASES[case]
    d = _damaged(good_run, tmp_path, damage)
    with pytest.raises(RunFileError, match=r"events\.jsonl, line 1") as ei:
        load_events(d)
    assert says in str(ei.value)


@pytest.mark.parametrize("command", ["report", "inspect", "whatif", "plot"])
@pytest.mark.parametrize("case", ["csv_cell_5mb", "csv_time_1e308", "summary_nested",
                                  "manifest_nan"])
def test_every_reader_exits_2_with_one_line(good_run: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str], command: str,
                                            case: str) -> None:
    damage, name, _says = CASES[case]
    d = _damaged(good_run, tmp_path, damage)
    if command == "whatif" and name == "rounds.csv":
        name = "manifest.json"  # whatif replays the schedule: damage what it reads
        (d / name).write_text('{"config": ' + _nested(10_000) + "}")
    argv = {"report": ["report", str(d), "--out", str(tmp_path / "r.html")],
            "inspect": ["inspect", str(d), "--round", "0"],
            "whatif": ["whatif", str(d), "--no-stragglers"],
            "plot": ["plot", str(d), "--out", str(tmp_path / "plots")]}[command]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == EXIT_CONFIG, err
    assert "Traceback" not in err and "internal error" not in err
    assert str(d / name) in err


def test_the_good_run_still_loads(good_run: Path) -> None:
    run = load_run(good_run)
    assert len(run["rounds"]) == CFG.rounds and run["summary"]["in_progress"] is False
