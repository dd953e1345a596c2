"""A forged ``welcome`` (its MAC fails) never ends a worker, and a worker caps what a PS's
``welcome`` can make it allocate.

No sleeps for synchronisation: the socket scenario waits on the workers' counters through an
event log, as tests/test_forgeries_backoff_and_liars.py does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from aiogc.config import RunConfig
from aiogc.core import ConnectionFailed, Worker
from aiogc.errors import ConfigError
from aiogc.net.drivers import ClientOptions, WorkerClient
from aiogc.protocol.headers import PREAUTH_LIMITS
from aiogc.protocol.messages import Challenge, Hello, Welcome
from aiogc.protocol.wire import FrameDecoder, encode_frame_bytes
from aiogc.sim.engine import Simulation
from aiogc.training import tasks
from aiogc.training.caps import check_welcome_memory, welcome_memory
from aiogc.training.memory import MEMORY_BUDGET_ENV
from aiogc.training.setup import SetupCache, TaskPolicy, build_setup
from tests.helpers import build_rig
from tests.netkit import (
    FAST_BACKOFF,
    HOST,
    STEP_S,
    EventLog,
    Runner,
    SquatThenRelay,
    assert_exact_rounds,
    cfg,
    make_ps,
    make_runner,
    start_cluster,
)

SECRET = b"forged-welcome-secret-0123456789"


@pytest.fixture
def run() -> Runner:
    return make_runner(asyncio.new_event_loop)


class _ForgedWelcomeSquatter(SquatThenRelay):
    """While squatting, plays a PS without the key: a ``challenge``, then, on the worker's
    ``hello``, a ``welcome`` for that worker whose MAC is garbage (and whose config is the
    real run's, so only the MAC is wrong). Afterwards relays bytes to the real PS."""

    def __init__(self, config: RunConfig) -> None:
        super().__init__()
        self.wire_config = {**config.to_wire(), "scheme_digest": "forged"}

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.squatting:
            await super().handle(reader, writer)
            return
        self.squatted += 1
        writer.write(encode_frame_bytes(Challenge(nonce=b"s" * 16, epoch=0)))
        await writer.drain()
        decoder = FrameDecoder(PREAUTH_LIMITS)
        msgs: list[Any] = []
        while not msgs and (data := await reader.read(65536)):
            msgs = decoder.feed(data)
        if msgs and isinstance(msgs[0], Hello):
            writer.write(encode_frame_bytes(Welcome(epoch=0, worker=msgs[0].worker,
                                                    mac=b"\x00" * 32, config=self.wire_config)))
            await writer.drain()
            await reader.read(65536)  # the worker closes: EOF
        writer.close()


def _refused_twice(client: WorkerClient) -> Callable[[], bool]:
    stats = client.worker.stats
    return lambda: stats["preauth_auth_failed"] >= 2


def test_forged_welcome_squatter_then_real_ps_every_round_completes(run: Runner) -> None:
    """A port squatter answering every connection with a forged welcome: the workers reject
    it (``preauth_auth_failed``), keep retrying with backoff, and when the real PS is back
    every round completes."""
    config = cfg(workers=4, delta=2, rounds=4)

    async def scenario() -> tuple[Any, list[Any], list[int], list[list[Any]]]:
        squatter = _ForgedWelcomeSquatter(config)
        front = await asyncio.start_server(squatter.handle, HOST, 0)
        port = front.sockets[0].getsockname()[1]
        logs = [EventLog() for _ in range(config.workers)]
        clients = [WorkerClient(Worker(j, secret=SECRET), HOST, port, on_event=logs[j],
                                options=ClientOptions(backoff_s=FAST_BACKOFF),
                                give_up_after_s=60.0)
                   for j in range(config.workers)]
        tasks = [asyncio.create_task(c.run()) for c in clients]
        # every worker is refused twice by the forgery (so it did retry after the first)
        async with asyncio.timeout(STEP_S):
            for c, log in zip(clients, logs, strict=True):
                await log.wait_for(_refused_twice(c))
        assert not any(t.done() for t in tasks)
        failed = [[(e.code, e.fatal) for e in log.events if isinstance(e, ConnectionFailed)]
                  for log in logs]
        cl = await start_cluster(make_ps(config, secret=SECRET), workers=0, secret=SECRET)
        squatter.target = cl.server.port
        squatter.squatting = False
        async with asyncio.timeout(STEP_S):
            await cl.serve_task  # type: ignore[misc]
            results = await asyncio.gather(*tasks, return_exceptions=True)
        front.close()
        await front.wait_closed()
        return (cl.ps.records, results, [c.worker.stats["preauth_auth_failed"] for c in clients],
                failed)

    records, results, forged, failed = run(scenario)
    assert all(r is None for r in results), results
    assert all(n >= 2 for n in forged)
    # each rejection was the forged welcome, and none was fatal
    assert all(f and set(f) == {("preauth_auth_failed", False)} for f in failed), failed
    assert_exact_rounds(records, config.rounds, tol=1e-9)


# ------------------------------------------------------------------ allocation caps


def _no_build(*_a: object, **_k: object) -> None:
    raise AssertionError("built before the budget check")


@pytest.mark.parametrize(("kw", "field"), [
    (dict(workers=1024, delta=64, n_parts=8, task="linreg:samples=100,dim=4"), "delta"),
    (dict(workers=8, delta=3, task="linreg:samples=20000,dim=2000"), "task"),
])
def test_a_worker_refuses_a_welcome_over_its_budget_before_allocating(
        monkeypatch: pytest.MonkeyPatch, kw: dict[str, Any], field: str) -> None:
    """The PS's config sizes the scheme (workers x delta x n_parts) and the task (samples x
    dim): a worker whose budget ($AIOGC_MEMORY_BUDGET) cannot hold both refuses it, naming
    the field, before building either (the builders would fail the test if called)."""
    config = RunConfig(**kw)
    assert welcome_memory(config).total > 32 << 20
    monkeypatch.setenv(MEMORY_BUDGET_ENV, "32M")
    monkeypatch.setattr(RunConfig, "build_scheme", _no_build)
    monkeypatch.setattr(tasks, "make_task", _no_build)
    with pytest.raises(ConfigError) as err:
        build_setup(config)
    assert err.value.field == field
    # the same configuration fits a worker with the budget for it
    monkeypatch.setenv(MEMORY_BUDGET_ENV, str(2 * welcome_memory(config).total))
    assert check_welcome_memory(config).total == welcome_memory(config).total


def test_over_budget_welcome_ends_the_worker_naming_the_field(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the worker core: the refusal is ``bad_config`` (fatal: the config came in an
    authenticated welcome, a retry would get the same one), and its reason names the field."""
    config = cfg(workers=4, delta=2, rounds=1, task="linreg:samples=2000,dim=400",
                 join_timeout_s=1.0)
    rig = build_rig(config)  # the PS's own build, under the machine's budget
    need = welcome_memory(config).total
    monkeypatch.setenv(MEMORY_BUDGET_ENV, str(need // 2))  # then the workers' budget
    workers = [Worker(j) for j in range(config.workers)]
    sim = Simulation(rig.ps, workers, setups=SetupCache(TaskPolicy(task="linreg")),
                     reconnect=False)
    sim.run()
    for j in range(config.workers):
        failed = [e for e in sim.worker_events[j] if isinstance(e, ConnectionFailed)]
        assert [(e.code, e.fatal) for e in failed] == [("bad_config", True)]
        assert "task='linreg:samples=2000,dim=400' is invalid: expected dim in" in \
            failed[0].reason
