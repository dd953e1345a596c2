"""aiogc.load_run: a run directory as tables; every CSV a run writes is a plain CSV."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import aiogc
from aiogc.config import RunConfig
from aiogc.harness.loaders import load_run_tables
from aiogc.harness.local import run_live
from aiogc.harness.options import RunOptions
from aiogc.training.schedule import CSV_COLUMNS, DelaySchedule

CFG = RunConfig(workers=4, delta=2, rounds=3, seed=5, task="linreg:samples=80,dim=4",
                delay="exp:0.001")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("run")
    run_live(CFG, ["partial", "original"], RunOptions(mode="coroutines", out_dir=d, plots=False,
                                                      loop="asyncio"))
    return d


def test_load_run_is_exported_lazily() -> None:
    code = ("import sys, aiogc; assert not any(m.startswith('aiogc.harness') for m in "
            "sys.modules); f = aiogc.load_run; assert 'aiogc.harness.records' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert aiogc.load_run is load_run_tables
    assert "load_run" in dir(aiogc)
    with pytest.raises(AttributeError):
        aiogc.no_such_name  # noqa: B018


def test_load_run_returns_every_table(run_dir: Path) -> None:
    run = aiogc.load_run(run_dir, pandas=False)
    m, r, k = CFG.workers, CFG.rounds, CFG.delta
    assert len(run.rounds) == 2 * r
    assert len(run.workers) == 2 * r * m
    assert run.reports and all(isinstance(x["count"], int) for x in run.reports)
    assert {"round_start", "coded_gradient"} <= {f["kind"] for f in run.frames}
    assert len(run.delays) == r * m * k
    assert set(run.delays[0]) == set(CSV_COLUMNS)
    assert run.manifest["seed"] == CFG.seed
    assert run.summary is not None and set(run.summary["schemes"]) == {"partial", "original"}
    assert set(run.tables()) == {"rounds", "workers", "reports", "frames", "delays",
                                 "attribution"}
    assert len(run.attribution) == 2 * r * m  # one row per chunk (N = m) per round
    assert aiogc.load_run(run_dir, frames=False, pandas=False).frames == []
    import pandas as pd  # the dev extra installs it: pandas must load every table
    df = aiogc.load_run(run_dir)
    assert isinstance(df.rounds, pd.DataFrame) and len(df.rounds) == 2 * r


def test_every_csv_is_plain(run_dir: Path) -> None:
    """One header line, no comment lines, every row as wide as the header: what
    ``pandas.read_csv(path)`` needs with no options."""
    paths = sorted(run_dir.glob("*.csv"))
    assert {p.name for p in paths} >= {"rounds.csv", "workers.csv", "reports.csv", "delays.csv"}
    for p in paths:
        lines = p.read_text().splitlines()
        assert not any(line.startswith("#") for line in lines), p.name
        rows = list(csv.reader(lines))
        assert all(len(row) == len(rows[0]) for row in rows), p.name
        assert not any(c.replace(".", "").isdigit() for c in rows[0]), p.name  # a header
    import pandas as pd  # the dev extra installs it: pandas must load every table
    for p in paths:
        assert len(pd.read_csv(p)) == len(p.read_text().splitlines()) - 1


def test_delays_csv_sidecar_and_old_format(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    s = DelaySchedule(compute_s=rng.exponential(0.01, (2, 3, 2)), network_s=np.zeros((2, 3)),
                      seed=11, compute_spec="exp:0.01", network_spec="none")
    s.to_csv(tmp_path / "delays.csv")
    assert (tmp_path / "delays.json").exists()
    assert (tmp_path / "delays.csv").read_text().splitlines()[0] == ",".join(CSV_COLUMNS)
    assert DelaySchedule.from_csv(tmp_path / "delays.csv") == s
    # the format before the sidecar: '#' header lines, still read
    old = tmp_path / "old"
    old.mkdir()
    body = (tmp_path / "delays.csv").read_text()
    (old / "delays.csv").write_text("# aiogc delay schedule v1\n# seed=11\n"
                                    "# compute_spec=exp:0.01\n# network_spec=none\n"
                                    "# shape=2,3,2\n" + body)
    assert DelaySchedule.from_csv(old / "delays.csv") == s
    # a file named .json keeps its sidecar apart
    assert DelaySchedule.meta_path(tmp_path / "x.json").name == "x.json.meta.json"
