"""``--worker-hosts``: coroutine workers in worker-host processes, the PS on its own loop."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aiogc.cli import main
from aiogc.config import RunConfig
from aiogc.errors import ConfigError
from aiogc.harness import local as runner
from aiogc.harness import spawn
from aiogc.harness.local import run_live
from aiogc.harness.options import RunOptions
from aiogc.harness.spawn import host_blocks

SMALL: dict[str, Any] = dict(workers=5, delta=3, rounds=3, seed=11,
                             task="linreg:samples=300,dim=10", delay="exp:0.004")


@pytest.mark.parametrize(("m", "hosts"), [(5, 2), (5, 5), (5, 9), (64, 3), (1, 1)])
def test_host_blocks_partition_the_workers(m: int, hosts: int) -> None:
    blocks = host_blocks(m, hosts)
    assert [j for b in blocks for j in b] == list(range(m))  # every worker once, in order
    assert len(blocks) == min(hosts, m) and all(blocks)
    sizes = [len(b) for b in blocks]
    assert max(sizes) - min(sizes) <= 1


def test_run_with_worker_hosts_decodes_every_round(tmp_path: Path) -> None:
    cfg = RunConfig(**SMALL)
    res = run_live(cfg, ["partial", "original"], RunOptions(mode="coroutines", out_dir=tmp_path,
                   plots=False, loop="asyncio", worker_hosts=2))
    for scheme in ("partial", "original"):
        recs = res.records[scheme]
        assert [r.round for r in recs] == list(range(SMALL["rounds"]))
        assert all(r.status == "exact" for r in recs), [r.status for r in recs]
        assert all(r.rel_error is not None and r.rel_error < 1e-9 for r in recs)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["mode"] == "coroutines, 2 worker-host processes"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["end_reason"] == "all rounds done"


@pytest.mark.parametrize(("hosts", "mode", "why"), [
    (-1, "coroutines", "[0, m=5]"), (6, "coroutines", "[0, m=5]"),
    (True, "coroutines", "[0, m=5]"), (2, "processes", "--as coroutines"),
])
def test_bad_worker_hosts_fail_fast_naming_the_field(hosts: Any, mode: str, why: str) -> None:
    with pytest.raises(ConfigError, match="worker_hosts") as err:
        run_live(RunConfig(**SMALL), ["partial"], RunOptions(mode=mode, out_dir=None, plots=False,
                 worker_hosts=hosts))
    assert why in str(err.value)


def test_cli_worker_hosts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = main(["run", "--as", "coroutines", "--worker-hosts", "2", "--workers", "4",
                 "--delta", "2", "--rounds", "2", "--delay", "exp:0.002", "--schemes",
                 "partial", "--out", str(out), "--no-plots", "--loop", "asyncio"])
    assert code == 0, capsys.readouterr().err
    assert json.loads((out / "summary.json").read_text())["schemes"]["partial"]["rounds"] == 2


def test_worker_host_exits_when_the_runner_dies() -> None:
    """The host's workers never reach a PS (a listener that never speaks); closing the
    runner's end of the parent-watch pipe ends the whole host with EXIT_PARENT_DIED."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        ctx = spawn._mp_context()
        parent_alive, keep_alive = ctx.Pipe(duplex=False)
        p = ctx.Process(target=spawn._worker_host_process,
                        args=([0, 1], "127.0.0.1", port, [None, None], "asyncio", None,
                              parent_alive), daemon=True)
        p.start()
        parent_alive.close()
        keep_alive.close()  # the "runner" is gone
        p.join(60)  # hang guard only: the host sees EOF on its next loop iteration
        assert p.exitcode == spawn.EXIT_PARENT_DIED


@pytest.mark.parametrize(("ids", "extra", "field"), [
    ("3-1", [], "id='3-1'"), ("a-b", [], "id='a-b'"), ("0-4096", [], "id='0-4096'"),
    ("0-3", [], "id='0-3'"),  # a range needs the master secret
])
def test_bad_worker_id_ranges(ids: str, extra: list[str], field: str,
                              capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIOGC_SECRET", raising=False)
    assert main(["worker", "--connect", "127.0.0.1:9", "--id", ids, *extra]) == 2
    assert field in capsys.readouterr().err


def test_worker_key_file_serves_one_id(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "k"
    key.write_text("00" * 32)
    assert main(["worker", "--connect", "127.0.0.1:9", "--id", "0-1",
                 "--worker-key-file", str(key)]) == 2
    assert "worker-key-file=" in capsys.readouterr().err


@pytest.mark.parametrize(("env", "added"), [("5", 5), ("0", 0), ("junk", spawn.WORKER_NICE)])
def test_local_workers_yield_the_cpu_to_the_ps(env: str, added: int) -> None:
    """Worker processes lower their priority by AIOGC_WORKER_NICE (default WORKER_NICE)."""
    code = ("import os; from aiogc.harness.spawn import _yield_cpu_to_ps as f; "
            "b = os.nice(0); f(); "
            "print(b, os.nice(0) - b)")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "AIOGC_WORKER_NICE": env},
                         capture_output=True, text=True, check=True).stdout
    base, delta = (int(x) for x in out.split())
    assert delta == min(added, 19 - base)  # niceness saturates at 19


@pytest.mark.parametrize("hosts", [0, 1])
def test_join_deadline_starts_when_the_workers_are_launched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hosts: int) -> None:
    """The runner's PS defers its first join deadline (``join_clock=False``) and starts it
    once the workers exist: after the worker-host processes were started (a slow fork must
    not eat the join timeout), or after the coroutine workers were created."""
    import multiprocessing

    seen: list[tuple[bool, int]] = []

    class Recording(runner.PSServer):  # type: ignore[misc, name-defined]
        def __init__(self, *args: Any, **kw: Any) -> None:
            seen.append((kw.get("join_clock", True), -1))
            super().__init__(*args, **kw)

        def workers_launched(self) -> None:
            seen.append((True, len(multiprocessing.active_children())))
            super().workers_launched()

    monkeypatch.setattr(runner, "PSServer", Recording)
    cfg = RunConfig(**{**SMALL, "rounds": 1})
    res = run_live(cfg, ["partial"], RunOptions(mode="coroutines", out_dir=None, plots=False,
                   loop="asyncio", worker_hosts=hosts))
    assert len(res.records["partial"]) == 1
    assert seen[0] == (False, -1)  # built with the join clock deferred
    assert len(seen) == 2  # ... and started exactly once
    if hosts:
        assert seen[1][1] >= hosts  # the host processes were running already
