"""Loopback scenarios shared by the socket tests: the loops each test runs on (asyncio and
uvloop) under a hang guard that fails on unhandled loop errors, small run configurations, a PS
on port 0, a cluster of real workers and its event log. Not a test module: test modules import
it, never each other.
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
import subprocess
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aiogc.config import RunConfig
from aiogc.core import (
    Event,
    ParameterServer,
    PeerClosed,
    PSOptions,
    RoundCompleted,
    RoundRecord,
    Worker,
)
from aiogc.harness.kit import make_ps as runner_make_ps
from aiogc.harness.kit import materialise_for
from aiogc.net.drivers import ClientOptions, PSServer, WorkerClient
from aiogc.protocol.messages import Error, Shutdown
from aiogc.protocol.wire import encode_frame_bytes
from aiogc.training.schedule import DelaySchedule

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parent.parent
#: Hang guard for one whole scenario (never an assertion on duration).
GUARD_S = 30.0
#: Hang guard for one awaited condition inside a scenario.
STEP_S = 15.0
TASK = "linreg:samples=240,dim=12"
#: Fast reconnects: tests that restart or kill things must not wait out the default backoff.
FAST_BACKOFF = (0.01, 0.1)


# ------------------------------------------------------------------ loops and the error fixture


def loop_factories() -> list[Any]:
    out: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop

        out.append(pytest.param(uvloop.new_event_loop, id="uvloop"))
    except ImportError:  # pragma: no cover - platform without uvloop
        pass
    return out


Runner = Callable[[Callable[[], Coroutine[Any, Any, Any]]], Any]


def make_runner(loop_factory: Callable[[], asyncio.AbstractEventLoop]) -> Runner:
    """``run(async_fn)``: run ``async_fn()`` on a fresh loop of the given kind under a hang
    guard; fail if the loop's exception handler was called (unhandled task exceptions,
    callback errors, 'Task exception was never retrieved')."""

    def run(async_fn: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        errors: list[dict[str, Any]] = []
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.get_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx))

            async def guarded() -> Any:
                async with asyncio.timeout(GUARD_S):
                    return await async_fn()

            try:
                result = runner.run(guarded())
            finally:
                gc.collect()  # a failed task that nobody awaited reports itself when collected
                runner.run(asyncio.sleep(0))  # let such reports run before the loop closes
        assert not errors, [
            f"{c.get('message')}: {c.get('exception')!r}" for c in errors]
        return result

    return run


# ------------------------------------------------------------------ scenario helpers


#: handshake deadline of the test PSs (seconds)
AUTH_DEADLINE_TEST_S = 0.5


def cfg(**kw: Any) -> RunConfig:
    base: dict[str, Any] = dict(
        workers=6, delta=3, n_parts=1, rounds=3, seed=11, task=TASK, delay="exp:0.005",
        heartbeat_s=1.0, dead_after_s=5.0, join_timeout_s=15.0, round_timeout_s=15.0,
    )
    base.update(kw)
    return RunConfig(**base)


def spaced_schedule(config: RunConfig, *, gap_s: float) -> DelaySchedule:
    """A scripted schedule whose chunk completions (all workers, one round) fall on distinct
    multiples of ``gap_s``: the order of reports at the PS, hence each round's trigger state,
    does not depend on scheduling jitter smaller than ``gap_s``. Seeded by ``config.seed``."""
    scheme = config.build_scheme()
    loads = [int(x) for x in scheme.loads]
    m, k_max = scheme.m, max(loads)
    rng = np.random.default_rng([config.seed, 0x5ACED])
    comp = np.zeros((config.rounds, m, k_max))
    for r in range(config.rounds):
        slots = (rng.permutation(sum(loads)) + 1) * gap_s
        i = 0
        for j, load in enumerate(loads):
            finish = np.sort(slots[i:i + load])
            i += load
            comp[r, j, :load] = np.diff(np.concatenate(([0.0], finish)))
    return DelaySchedule(compute_s=comp, network_s=np.zeros((config.rounds, m)),
                         seed=config.seed, compute_spec=f"scripted-gap:{gap_s}",
                         network_spec="none")


def make_ps(config: RunConfig, *, schedule: DelaySchedule | None = None,
            secret: bytes | None = None, epoch: int = 0) -> ParameterServer:
    """A PS assembled as the runner assembles it (``runner.make_ps``), with verification (the
    per-round ``rel_error``) and the decoded gradients kept for comparisons."""
    if schedule is None:
        schedule = materialise_for(config, [config.scheme])
    # auth_deadline_s: a short handshake deadline keeps the tests that wait for bad peers
    # to be timed out fast (the default is 1.9 s)
    ps, _ = runner_make_ps(config, schedule=schedule, verify=True, secret=secret, epoch=epoch,
                           keep_gradients=True,
                           options=PSOptions(auth_deadline_s=AUTH_DEADLINE_TEST_S))
    return ps


class EventLog:
    """Collects core events (an ``on_event`` sink) and lets a coroutine wait for a condition
    on them: no polling, no sleeps."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._changed = asyncio.Event()

    def __call__(self, ev: Event) -> None:
        self.events.append(ev)
        self._changed.set()

    async def wait_for(self, pred: Callable[[], bool]) -> None:
        """Return once ``pred()`` holds (bound it with ``asyncio.timeout`` at the call)."""
        while not pred():
            self._changed.clear()
            await self._changed.wait()

    def of(self, cls: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, cls)]

    def rounds_completed(self) -> int:
        return len(self.of(RoundCompleted))


@dataclass
class Cluster:
    """One PS served on loopback and its in-process worker clients."""

    ps: ParameterServer
    server: PSServer
    log: EventLog
    clients: list[WorkerClient] = field(default_factory=list)
    client_tasks: list[asyncio.Task[None]] = field(default_factory=list)
    #: one EventLog per started client (worker-side events: Welcomed, RoundEnded, ...)
    worker_logs: list[EventLog] = field(default_factory=list)
    serve_task: asyncio.Task[None] | None = None

    def add_worker(self, worker_id: int, *, secret: bytes | None = None,
                   backoff_s: tuple[float, float] = FAST_BACKOFF,
                   give_up_after_s: float = 10.0) -> asyncio.Task[None]:
        wlog = EventLog()
        client = WorkerClient(Worker(worker_id, secret=secret), HOST, self.server.port,
                              on_event=wlog, options=ClientOptions(backoff_s=backoff_s),
                              give_up_after_s=give_up_after_s)
        self.worker_logs.append(wlog)
        task = asyncio.create_task(client.run(), name=f"worker-{worker_id}")
        self.clients.append(client)
        self.client_tasks.append(task)
        return task

    async def finish(self) -> list[RoundRecord]:
        """Wait for the PS to finish and every worker client to return; re-raise a client's
        error. (Bound it with ``asyncio.timeout(GUARD_S)`` at the call.)"""
        assert self.serve_task is not None
        await self.serve_task
        results = await asyncio.gather(*self.client_tasks, return_exceptions=True)
        for t, res in zip(self.client_tasks, results, strict=True):
            if isinstance(res, BaseException):
                closes = [(e.code, e.reason, self.ps.worker_of(e.peer))
                          for e in self.log.of(PeerClosed)]
                j = self.client_tasks.index(t)
                wev = [type(e).__name__ + str(getattr(e, "round", getattr(e, "code", "")))
                       for e in self.worker_logs[j].events]
                raise AssertionError(
                    f"{t.get_name()} failed: {res!r}; PS statistics {dict(self.ps.stats)}; "
                    f"closes {closes}; rounds {len(self.ps.records)}; worker events {wev}; "
                    f"worker stats {dict(self.clients[j].worker.stats)}; "
                    f"connections {self.clients[j].connections}") from res
        return self.ps.records


async def start_cluster(ps: ParameterServer, *, workers: int | None = None,
                        secret: bytes | None = None, port: int = 0,
                        frame_log: Any = None) -> Cluster:
    """Serve ``ps`` on 127.0.0.1 and start ``workers`` (default m) worker clients."""
    log = EventLog()
    server = PSServer(ps, host=HOST, port=port, on_event=log, frame_log=frame_log)
    cl = Cluster(ps, server, log)
    cl.serve_task = asyncio.create_task(server.serve(), name="ps-serve")
    async with asyncio.timeout(STEP_S):
        await server.started.wait()
    for j in range(ps.m if workers is None else workers):
        cl.add_worker(j, secret=secret)
    return cl


def assert_exact_rounds(records: list[RoundRecord], rounds: int, *, tol: float) -> None:
    assert [r.round for r in records] == list(range(rounds))
    for rec in records:
        assert rec.status == "exact", (rec.round, rec.status, rec.end_reason)
        assert rec.rel_error <= tol, (rec.round, rec.rel_error)
        assert np.isfinite(rec.loss)


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    """Read until the PS closed the connection (EOF, or a reset when the PS closed with our
    bytes still unread: that is a close too)."""
    data = bytearray()
    try:
        while chunk := await reader.read(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return bytes(data)


# ------------------------------------------------------------------ every scheme trains


class SquatThenRelay:
    """Listens on one port: answers each connection with a forged frame (``error(auth_failed)``
    and ``shutdown`` in turn) while ``squatting``; afterwards relays bytes to the real PS."""

    def __init__(self) -> None:
        self.squatting = True
        self.target: int | None = None
        self.squatted = 0
        self.changed = asyncio.Event()
        #: the writer towards the worker of the latest relayed connection, once connected up
        self.down: asyncio.StreamWriter | None = None
        self.ready = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.squatting:
            self.squatted += 1
            frame = (Error(code="auth_failed", reason="squatter") if self.squatted % 2
                     else Shutdown(reason="all rounds done"))
            writer.write(encode_frame_bytes(frame))
            await writer.drain()
            writer.close()
            self.changed.set()
            return
        assert self.target is not None
        up_r, up_w = await asyncio.open_connection(HOST, self.target)
        self.down = writer
        self.ready.set()

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while chunk := await r.read(65536):
                    w.write(chunk)
                    await w.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                w.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))


# ------------------------------------------------------------------ the CLI as processes

#: ``--join-timeout`` of a CLI PS: its join clock starts at listen, before the worker processes
#: exist, so this is a hang guard far beyond their start-up on a busy machine, not a race
CLI_JOIN_TIMEOUT_S = "600"


def cli(*args: str, **kw: Any) -> subprocess.Popen[str]:
    """``python -m aiogc ARGS`` as a process from the repository's root: text pipes for stdout
    and stderr, unbuffered, without the caller's ``AIOGC_SECRET`` (``kw``: more ``Popen``
    arguments)."""
    env = {k: v for k, v in os.environ.items() if k != "AIOGC_SECRET"}
    env["PYTHONUNBUFFERED"] = "1"
    return subprocess.Popen([sys.executable, "-m", "aiogc", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO, **kw)


def listening(ps: subprocess.Popen[str]) -> str:
    """The ``HOST:PORT`` an ``aiogc ps`` process announces on its first stderr line
    ("aiogc ps listening on HOST:PORT (epoch N)"; EOF if it died first)."""
    assert ps.stderr is not None
    line = ps.stderr.readline()
    match = re.search(r"listening on ([\d.]+):(\d+)", line)
    assert match, line
    return f"{match[1]}:{match[2]}"
