"""The Python API (``aiogc.simulate`` / ``run`` / ``run_async`` / ``sweep`` / ``experiment`` /
``load_run``): the command line's names and defaults, files that read back, a running loop,
and an ``import aiogc`` that stays light."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import aiogc
from aiogc import api
from aiogc.cli import main
from aiogc.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
#: a live run of seconds: coroutine workers on one loop, no figures
LIVE: dict[str, Any] = dict(workers=4, delta=2, rounds=3, as_="coroutines", loop="asyncio",
                            task="linreg:samples=80,dim=6", delay="exp:0.002", plots=False)


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\n"
                          "print(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, env=ENV, check=True, cwd=ROOT)
    return set(out.stdout.split())


def test_import_aiogc_is_light() -> None:
    mods = _modules_after("import aiogc\nassert callable(aiogc.__getattr__)")
    assert "numpy" not in mods and "scipy" not in mods
    assert {m for m in mods if m.startswith("aiogc")} == {"aiogc", "aiogc._version"}


def test_version_answers_without_scipy() -> None:
    mods = _modules_after("from aiogc.__main__ import main\nassert main(['--version']) == 0")
    assert "scipy" not in mods and "numpy" not in mods
    out = subprocess.run([sys.executable, "-m", "aiogc", "--version"], capture_output=True,
                         text=True, env=ENV, check=True, cwd=ROOT)
    assert out.stdout.strip() == f"aiogc {aiogc.__version__}"


def test_public_names_are_listed_and_resolve() -> None:
    for name in ("simulate", "run", "run_async", "sweep", "experiment", "load_run", "RunStop",
                 "SimResult", "RunResult", "SweepResult", "ExperimentResult"):
        assert name in aiogc.__all__ and name in dir(aiogc)
        assert getattr(aiogc, name) is getattr(api, name)
    with pytest.raises(AttributeError):
        aiogc.no_such_name  # noqa: B018


# ------------------------------------------------------------------------------ simulate


def test_simulate_defaults_and_names_are_the_commands(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    """Leaving a keyword out gives the flag's default: the same JSON as the command."""
    assert main(["simulate", "--rounds", "40", "--workers", "6", "--delta", "3",
                 "--payload-dtype", "float16", "--ell", "2"]) == 0
    cli = json.loads(capsys.readouterr().out)
    res = aiogc.simulate(rounds=40, workers=6, delta=3, payload_dtype="float16", ell=2)
    assert res.summary == cli
    assert res.dir is None
    df = res.to_pandas()
    assert list(df["scheme"]) == ["partial", "original"]
    assert res.speedup == pytest.approx(cli["speedup"])


def test_simulate_out_writes_its_table(tmp_path: Path) -> None:
    res = aiogc.simulate(workers=8, delta=3, delay="exp:0.02", schemes=["partial", "original"],
                         rounds=30, out=tmp_path)
    assert res.dir == tmp_path
    assert json.loads((tmp_path / "summary.json").read_text()) == res.summary
    back = res.to_pandas()  # the printed table
    import pandas as pd

    disk = pd.read_csv(tmp_path / "results.csv")
    assert list(disk["scheme"]) == list(back["scheme"])
    assert disk["completion_mean"].tolist() == pytest.approx(back["completion_mean"].tolist())


def test_unknown_keyword_and_bad_value_are_named() -> None:
    with pytest.raises(TypeError, match=r"'worker'.*known: .*\bworkers\b"):
        aiogc.simulate(worker=3)
    with pytest.raises(TypeError, match="n_parts"):
        aiogc.simulate(n_parts=2)  # the user's name is ell
    with pytest.raises(ConfigError, match=r"workers=0 .*\[1, 4096\]"):
        aiogc.simulate(workers=0)
    with pytest.raises(ConfigError, match="delay"):
        aiogc.simulate(delay="bogus:1", rounds=5)


def test_to_pandas_without_pandas_says_how(monkeypatch: pytest.MonkeyPatch) -> None:
    res = aiogc.simulate(rounds=5)
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="pip install pandas"):
        res.to_pandas()
    assert res.rows[0]["scheme"] == "partial"


# ------------------------------------------------------------------------------ run


def test_run_writes_a_dir_load_run_agrees_and_it_is_not_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = aiogc.run(**LIVE, out=out)
    assert res.complete and res.end_reason == "all rounds done"
    assert res.dir == out
    tables = aiogc.load_run(out)
    assert tables.summary == res.summary
    df = res.to_pandas()
    assert len(df) == len(tables.rounds) == 2 * LIVE["rounds"]
    assert sorted(set(df["scheme"])) == ["original", "partial"]
    for name, recs in res.live.records.items():
        durations = df[df["scheme"] == name]["duration_s"].tolist()
        assert durations == pytest.approx([r.t_end - r.t_start for r in recs], rel=1e-6)
    # a second run into it is refused; overwrite=True removes the first run's files first
    with pytest.raises(ConfigError, match="overwrite"):
        aiogc.run(**LIVE, out=out)
    stale = out / "timeline_round0.png"
    stale.write_bytes(b"not this run's")
    again = aiogc.run(**{**LIVE, "rounds": 2}, out=out, overwrite=True)
    assert not stale.exists()
    assert len(again.to_pandas()) == 2 * 2


def test_run_without_out_gets_a_new_timestamped_dir(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    first = aiogc.run(**{**LIVE, "rounds": 1, "schemes": "partial"})
    second = aiogc.run(**{**LIVE, "rounds": 1, "schemes": "partial"})
    assert first.dir != second.dir
    assert first.dir.parent == second.dir.parent == Path("runs")
    assert (tmp_path / "runs" / "latest").resolve() == (tmp_path / second.dir).resolve()
    assert (tmp_path / first.dir / "summary.json").is_file()


def test_run_inside_a_running_event_loop(tmp_path: Path) -> None:
    async def notebook() -> tuple[aiogc.RunResult, aiogc.RunResult]:
        blocking = aiogc.run(**LIVE, out=tmp_path / "a")  # as a notebook cell would call it
        awaited = await aiogc.run_async(**LIVE, out=tmp_path / "b")
        return blocking, awaited

    a, b = asyncio.run(notebook())
    assert a.complete and b.complete
    assert aiogc.load_run(b.dir).summary == b.summary


def _rounds_csv(d: Path) -> list[tuple[str, int]]:
    with (d / "rounds.csv").open(newline="", encoding="utf-8") as fh:
        return [(r["scheme"], int(r["round"])) for r in csv.DictReader(fh)]


def test_a_stop_handle_ends_a_run_after_the_rounds_that_finished(tmp_path: Path) -> None:
    stop = aiogc.RunStop()
    seen: list[tuple[str, int]] = []

    def on_round(scheme: str, rec: Any) -> None:
        seen.append((scheme, rec.round))
        if rec.round == 2:
            stop.stop("three rounds are enough")

    out = tmp_path / "stopped"
    res = aiogc.run(**{**LIVE, "rounds": 200}, out=out, stop=stop, on_round=on_round)
    assert res.stopped == "three rounds are enough" and not res.complete
    assert res.end_reason == "stopped by the caller: three rounds are enough"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["end_reason"] == res.end_reason
    assert summary["interrupted_by"] == "the caller: three rounds are enough"
    assert summary["ok"] is False and summary["in_progress"] is False
    # the stop runs at the run loop's next step, before a round started later could finish
    # (that needs frames from the workers): at most the round in flight completes. The
    # rounds that finished are written, each one was seen by on_round, and the second
    # scheme never started
    assert 3 <= len(seen) <= 4 and {s for s, _ in seen} == {"partial"}
    assert _rounds_csv(out) == seen == [("partial", r) for r in range(len(seen))]
    assert summary["schemes"]["partial"]["rounds"] == len(seen)
    assert "original" not in summary["schemes"]
    assert not (out / "IN_PROGRESS").exists()
    # a handle stopped before its run stops the run at its start; the handle says why once
    stop.stop("again")
    assert stop.reason == "three rounds are enough"
    early = aiogc.run(**LIVE, out=tmp_path / "early", stop=stop)
    assert early.stopped == "three rounds are enough" and not early.complete
    assert early.summary["interrupted_by"] == "the caller: three rounds are enough"
    with pytest.raises(TypeError, match="RunStop"):
        aiogc.run(**LIVE, out=tmp_path / "bad", stop=object())


def test_cancelling_run_async_stops_the_run_and_keeps_what_finished(tmp_path: Path) -> None:
    out = tmp_path / "cancelled"

    async def notebook() -> None:
        loop = asyncio.get_running_loop()
        second_round = asyncio.Event()

        def on_round(scheme: str, rec: Any) -> None:  # on the run's own loop and thread
            if rec.round == 1:
                loop.call_soon_threadsafe(second_round.set)

        task = asyncio.create_task(aiogc.run_async(**{**LIVE, "rounds": 200}, out=out,
                                                   on_round=on_round))
        waiter = asyncio.create_task(second_round.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        assert not task.done(), task  # the run is in progress
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(notebook())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["end_reason"] == "stopped by the caller: run_async cancelled"
    assert summary["ok"] is False
    done = _rounds_csv(out)
    assert 2 <= len(done) < 200 and done == [("partial", r) for r in range(len(done))]
    assert summary["schemes"]["partial"]["rounds"] == len(done)


def test_cli_run_refuses_an_earlier_run_without_overwrite(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "--workers", "4", "--delta", "2", "--rounds", "1", "--as", "coroutines",
            "--schemes", "partial", "--task", "linreg:samples=80,dim=6", "--no-plots",
            "--delay", "exp:0.002", "--loop", "asyncio", "--out", str(tmp_path)]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--overwrite" in err and str(tmp_path) in err
    assert main([*argv, "--overwrite"]) == 0


# ------------------------------------------------------------------------------ sweep


def test_sweep_runs_the_grid_and_resumes(tmp_path: Path) -> None:
    base = {k: v for k, v in LIVE.items() if k != "workers"}
    res = aiogc.sweep({"workers": [4, 5]}, **{**base, "rounds": 2}, out=tmp_path)
    assert res.dir == tmp_path and len(res.ran) == 2 and res.skipped == []
    df = res.to_pandas()
    assert sorted(df["workers"].unique().tolist()) == [4, 5]
    assert set(df["rounds"]) == {2}
    again = aiogc.sweep({"workers": [4, 5]}, **{**base, "rounds": 2}, out=tmp_path)
    assert again.ran == [] and sorted(again.skipped) == sorted(res.ran)
    # the file it wrote is the command's own format
    assert main(["sweep", str(tmp_path / "sweep.toml"), "--out", str(tmp_path), "--list"]) == 0


def test_sweep_checks_names_before_writing(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="'wrokers'"):
        aiogc.sweep({"wrokers": [4]}, out=tmp_path / "s")
    assert not (tmp_path / "s").exists()


# ------------------------------------------------------------------------------ experiment


def test_experiment_result(tmp_path: Path) -> None:
    res = aiogc.experiment("poly-digits", quick=True, out=tmp_path, progress=False)
    assert res.dir == tmp_path and (tmp_path / "poly-digits.json").is_file()
    assert len(res.to_pandas()) == len(res.rows) > 0
    assert json.loads((tmp_path / "poly-digits.json").read_text())["headline"] == \
        json.loads(json.dumps(res.headline))


# ------------------------------------------------------------------------------ example


def test_notebook_example_runs_small(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "notebook.py"), "--small",
                          "--out", str(tmp_path)], capture_output=True, text=True, env=ENV,
                         cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "simulated speedup" in out.stdout
    assert (tmp_path / "run" / "summary.json").is_file()
    assert (tmp_path / "sweep" / "results.csv").is_file()
