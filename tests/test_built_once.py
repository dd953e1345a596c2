"""A live run builds each scheme once, on the PS's side, and hands that object to every
consumer (schedule, PS, recorder, fidelity replay); the workers build their own from the
welcome, as separate parties do."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from aiogc.config import RunConfig
from aiogc.harness.local import run_live
from aiogc.harness.options import RunOptions

WORKER_SIDE = "aiogc.training.setup"  # a worker's scheme, rebuilt from the welcome config


def test_a_live_run_builds_each_scheme_once_on_the_ps_side(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    callers: Counter[str] = Counter()
    original = RunConfig.build_scheme

    def counted(self: RunConfig):  # type: ignore[no-untyped-def]
        callers[sys._getframe(1).f_globals["__name__"]] += 1
        return original(self)

    monkeypatch.setattr(RunConfig, "build_scheme", counted)
    cfg = RunConfig(workers=5, delta=3, rounds=3, seed=11, task="linreg:samples=300,dim=10",
                    delay="exp:0.004")
    schemes = ["partial", "original"]
    res = run_live(cfg, schemes, RunOptions(mode="coroutines", out_dir=tmp_path, plots=False,
                                            loop="asyncio"))
    assert all(len(res.records[s]) == cfg.rounds for s in schemes)
    assert "fidelity" in res.summary  # the replay ran, on the run's own schemes
    ps_side = {mod: n for mod, n in callers.items() if mod != WORKER_SIDE}
    assert sum(ps_side.values()) == len(schemes), ps_side
    # the in-process workers build theirs from the welcome (one per scheme, shared by the
    # coroutines of one process)
    assert callers[WORKER_SIDE] >= len(schemes)
