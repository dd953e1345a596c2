"""``--as coroutines`` without worker hosts: the in-process workers share one host connection
(one timer heap, coalesced writes); ``--connection-per-worker`` keeps one connection each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aiogc.cli import build_parser
from aiogc.config import RunConfig
from aiogc.harness import inproc
from aiogc.harness.local import run_live
from aiogc.harness.options import RunOptions
from aiogc.net.hostclient import HostClient

SMALL: dict[str, Any] = dict(workers=5, delta=3, rounds=3, seed=11,
                             task="linreg:samples=300,dim=10", delay="exp:0.004")


@pytest.mark.parametrize("per_worker", [False, True])
def test_in_process_workers_decode_every_round(monkeypatch: pytest.MonkeyPatch,
                                               per_worker: bool) -> None:
    hosts: list[HostClient] = []

    class Recording(HostClient):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            hosts.append(self)

    monkeypatch.setattr(inproc, "HostClient", Recording)
    cfg = RunConfig(**SMALL)
    res = run_live(cfg, ["partial", "original"], RunOptions(
        mode="coroutines", plots=False, loop="asyncio", connection_per_worker=per_worker))
    for name in ("partial", "original"):
        recs = res.records[name]
        assert [r.round for r in recs] == list(range(cfg.rounds))
        assert all(r.rel_error < 1e-9 for r in recs)  # verified: every round decoded exactly
    if per_worker:
        assert hosts == []
    else:  # one host per scheme, each with every worker, over one connection
        assert [(h.first, h.count, h.connections) for h in hosts] == [(0, 5, 1)] * 2
        assert all(st.result is None for h in hosts for st in h.slots)  # shutdown, no error


def test_in_process_blocks_are_at_most_max_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inproc, "MAX_SLOTS", 2)
    coros = inproc.in_process_workers(5, 1, None, "linreg:samples=300,dim=10")
    try:
        assert len(coros) == 3  # blocks 0-1, 2-3, 4
    finally:
        for c in coros:
            c.close()
    coros = inproc.in_process_workers(5, 1, None, "linreg:samples=300,dim=10",
                                      connection_per_worker=True)
    try:
        assert len(coros) == 5
    finally:
        for c in coros:
            c.close()


def test_cli_connection_per_worker_flag(tmp_path: Path) -> None:
    a = build_parser().parse_args(["run", "--as", "coroutines", "--connection-per-worker",
                                   "--out", str(tmp_path)])
    assert a.connection_per_worker is True
    a = build_parser().parse_args(["run", "--as", "coroutines", "--out", str(tmp_path)])
    assert a.connection_per_worker is False


@pytest.mark.parametrize("opts", [dict(mode="processes"), dict(mode="coroutines", worker_hosts=2)])
def test_connection_per_worker_is_refused_where_it_would_be_ignored(opts: dict[str, Any]) -> None:
    from aiogc.errors import ConfigError

    with pytest.raises(ConfigError, match="connection_per_worker"):
        run_live(RunConfig(**SMALL), ["partial"],
                 RunOptions(plots=False, connection_per_worker=True, **opts))
