"""Injected faults (reliability.md, "Faults"): each is injected for real and the outcome checked.

Workers run as processes where the fault needs one (SIGKILL, SIGSTOP): the runner's own
``_worker_process`` target, started from its forkserver context. The PS runs in the test's
event loop so its records, statistics and events can be inspected. The PS restart uses
in-process workers (coroutines). Ctrl-C / SIGTERM drive ``run_local.py`` as a subprocess.

Every wait is on a core event (``EventLog.wait_for``) or a process/pidfd, under a timeout that
only guards against hangs; nothing asserts on wall-clock durations.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import os
import re
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aiogc.config import RunConfig
from aiogc.core import (
    Finished,
    PeerClosed,
    PSPhase,
    RoundRecord,
    RoundStarted,
    Triggered,
    Welcomed,
    WorkerDropped,
)
from aiogc.harness import spawn as runner  # the worker-process entry points
from aiogc.net.drivers import PSServer
from aiogc.protocol.messages import ChunkReport, EncodeAndTransmit, Message
from aiogc.protocol.status import EndReason
from aiogc.training.schedule import DelaySchedule
from tests.netkit import (
    GUARD_S,
    HOST,
    STEP_S,
    Cluster,
    EventLog,
    Runner,
    assert_exact_rounds,
    cfg,
    loop_factories,
    make_ps,
    make_runner,
    spaced_schedule,
    start_cluster,
)

pytestmark = pytest.mark.processes

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def run() -> Runner:
    """The PS side runs on the default loop; the worker processes use uvloop (the runner's
    default), so both loops are in every fault scenario."""
    return make_runner(asyncio.new_event_loop)


# ------------------------------------------------------------------ worker processes


class Procs:
    """Worker processes started exactly as the runner starts them; all killed at teardown."""

    def __init__(self) -> None:
        self.procs: dict[int, Any] = {}

    def start(self, port: int, ids: range | list[int], *, secret: bytes | None = None,
              loop_kind: str = "uvloop") -> None:
        ctx = runner._mp_context()
        with runner._single_thread_blas_env():
            for j in ids:
                p = ctx.Process(target=runner._worker_process, name=f"aiogc-worker-{j}",
                                args=(j, HOST, port, secret, loop_kind), daemon=True)
                p.start()
                self.procs[j] = p

    def pid(self, j: int) -> int:
        return int(self.procs[j].pid)

    def kill(self, j: int, sig: int = signal.SIGKILL) -> None:
        os.kill(self.pid(j), sig)

    async def join(self) -> dict[int, int | None]:
        """Wait (off the loop, up to ``STEP_S`` per process) for every process to exit; exit
        codes by worker id."""
        def _join() -> dict[int, int | None]:
            for p in self.procs.values():
                p.join(STEP_S)
            return {j: p.exitcode for j, p in self.procs.items()}

        return await asyncio.to_thread(_join)

    def cleanup(self) -> None:
        for p in self.procs.values():
            if p.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)  # a stopped process cannot die of SIGKILL
                p.kill()
            p.join(5)


@pytest.fixture
def procs() -> Iterator[Procs]:
    ps_ = Procs()
    try:
        yield ps_
    finally:
        ps_.cleanup()


async def serve(ps: Any, *, frame_log: Any = None, hook: Any = None,
                ) -> tuple[PSServer, EventLog, asyncio.Task[None]]:
    """Serve ``ps`` on loopback; ``hook(event)`` (fault injection) sees every event after the
    log recorded it.

    The first join deadline is deferred (``join_clock=False``): round 0 waits for every
    worker process however slowly a loaded machine starts them (GUARD_S bounds the test);
    later join waits (a round that lost workers) run on the configured join_timeout_s."""
    log = EventLog()

    def on_event(ev: Any) -> None:
        log(ev)
        if hook is not None:
            hook(ev)

    server = PSServer(ps, host=HOST, port=0, on_event=on_event, frame_log=frame_log,
                      join_clock=False)
    task = asyncio.create_task(server.serve(), name="ps-serve")
    async with asyncio.timeout(STEP_S):
        await server.started.wait()
    return server, log, task


def fault_free(run: Runner, config: RunConfig, schedule: Any) -> list[RoundRecord]:
    """The same run without faults (in-process workers): the reference results."""

    async def scenario() -> list[RoundRecord]:
        return await (await start_cluster(make_ps(config, schedule=schedule))).finish()

    records: list[RoundRecord] = run(scenario)
    return records


def assert_same_decodes(got: list[RoundRecord], ref: list[RoundRecord]) -> None:
    """Exact rounds decode the uncoded sum: whatever the state, the gradient (hence the model
    and the loss) equals the fault-free run's, up to floating-point rounding."""
    assert len(got) == len(ref)
    for a, b in zip(got, ref, strict=True):
        assert a.status == b.status == "exact"
        assert a.gradient is not None and b.gradient is not None
        np.testing.assert_allclose(a.gradient, b.gradient, rtol=1e-9,
                                   atol=1e-12 * float(np.linalg.norm(b.gradient)))
        assert a.loss == pytest.approx(b.loss, rel=1e-9)


# ------------------------------------------------------------------ SIGKILL during a round


@pytest.mark.parametrize("when", ["computing", "after_report_before_upload"])
def test_worker_sigkilled_during_round(run: Runner, procs: Procs, when: str) -> None:
    """partial, m=6, delta=3, ell=1: one worker dies in round 1 (while computing, after its
    first report; or after the trigger named it, before it could upload). The PS sees the reset,
    drops it, re-broadcasts when it had reported, decodes exactly, and the run completes all
    rounds with the fault-free run's gradients."""
    config = cfg(workers=6, delta=3, n_parts=1, rounds=4)
    schedule = spaced_schedule(config, gap_s=0.03)
    victim: list[int] = []

    def frame_log(direction: str, peer: Any, msg: Message, nbytes: int) -> None:
        if victim or getattr(msg, "round", None) != 1:
            return
        if when == "computing" and direction == "in" and isinstance(msg, ChunkReport):
            w = ps.worker_of(peer)
        elif (when == "after_report_before_upload" and direction == "out"
              and isinstance(msg, EncodeAndTransmit)):
            # logged before it is written: the victim never sees this trigger
            w = ps.worker_of(peer)
            if w is None or msg.state[w] == 0:
                return
        else:
            return
        assert w is not None
        victim.append(w)
        procs.kill(w)

    ps = make_ps(config, schedule=schedule)

    async def scenario() -> tuple[EventLog, dict[int, int | None]]:
        server, log, task = await serve(ps, frame_log=frame_log)
        procs.start(server.port, range(config.workers))
        async with asyncio.timeout(GUARD_S):
            await task
        return log, await procs.join()

    log, codes = run(scenario)
    assert len(victim) == 1
    v = victim[0]
    assert codes[v] == -signal.SIGKILL
    assert all(c == 0 for j, c in codes.items() if j != v), codes
    assert ps.phase is PSPhase.FINISHED and log.of(Finished)[0].reason == "all rounds done"
    assert_exact_rounds(ps.records, config.rounds, tol=1e-9)
    rec1 = ps.records[1]
    assert rec1.dropped == {v: "disconnected"}
    assert rec1.state[v] == 0  # nothing of the dead worker was used
    drops = log.of(WorkerDropped)
    assert [(d.worker, d.round, d.reason) for d in drops] == [(v, 1, "disconnected")]
    if when == "after_report_before_upload":
        # it was named by the first trigger: the PS re-broadcast a corrected state
        triggers = [t for t in log.of(Triggered) if t.round == 1]
        assert [t.attempt for t in triggers] == [0, 1]
        assert triggers[0].state[v] > 0 and triggers[1].state[v] == 0
        assert rec1.attempts == 2
    # later rounds run without it
    assert all(r.state[v] == 0 for r in ps.records[2:])
    # the honest result equals the fault-free run's (same seed and schedule)
    assert_same_decodes(ps.records, fault_free(run, config, schedule))


# ------------------------------------------------------------------ SIGSTOP


def _fast_victim_schedule(config: RunConfig, v: int) -> DelaySchedule:
    """Everyone's chunks take 40 ms, the victim's 10 ms: it has reported before every trigger
    it takes part in, so "it computed in round r" is visible as ``state[v] > 0``."""
    comp = np.full((config.rounds, config.workers, config.delta), 0.04)
    comp[:, v, :] = 0.01
    return DelaySchedule(compute_s=comp, network_s=np.zeros((config.rounds, config.workers)))


def test_worker_paused_past_collect_deadline_late_vector_is_stale(run: Runner,
                                                                   procs: Procs) -> None:
    """Paused (SIGSTOP) just as the trigger names it, for longer than collect_timeout_s but
    less than dead_after_s: the PS drops it from the round, re-broadcasts without it and
    decodes exactly; resumed, it answers the old trigger: that coded vector arrives in a later
    round and is counted as stale, never decoded; it takes part in the next round (same
    connection: it was slow, not dead)."""
    config = cfg(workers=6, delta=3, n_parts=1, rounds=10_000, heartbeat_s=0.2,
                 dead_after_s=5.0, collect_timeout_s=0.3)
    v = 2
    paused: list[int] = []  # the round it was paused in

    def frame_log(direction: str, peer: Any, msg: Message, nbytes: int) -> None:
        if (not paused and direction == "out" and isinstance(msg, EncodeAndTransmit)
                and msg.round >= 2 and ps.worker_of(peer) == v and msg.state[v] > 0):
            procs.kill(v, signal.SIGSTOP)  # before the trigger is even written
            paused.append(msg.round)

    ps = make_ps(config, schedule=_fast_victim_schedule(config, v))

    async def scenario() -> tuple[EventLog, dict[int, int | None]]:
        server, log, task = await serve(ps, frame_log=frame_log)
        procs.start(server.port, range(config.workers))
        await log.wait_for(lambda: bool(paused) and log.rounds_completed() > paused[0])
        procs.kill(v, signal.SIGCONT)
        await log.wait_for(lambda: any(r.round > paused[0] and r.state[v] > 0
                                       for r in ps.records))
        server.stop("test done")
        async with asyncio.timeout(STEP_S):
            await task
        return log, await procs.join()

    log, codes = run(scenario)
    assert all(c == 0 for c in codes.values()), codes
    r = paused[0]
    rec = ps.records[r]
    assert rec.status == "exact" and rec.rel_error <= 1e-9
    assert rec.dropped == {v: "collect_timeout"} and rec.state[v] == 0
    assert [t.attempt for t in log.of(Triggered) if t.round == r] == [0, 1]
    stats = dict(ps.stats)
    # its answer to the old trigger came late: counted, not decoded
    assert stats.get("stale_round_coded_gradient") == 1, stats
    assert "closed_heartbeat_timeout" not in stats and stats.get("joined") == config.workers
    assert all(x.status == "exact" and x.rel_error <= 1e-9 for x in ps.records)
    assert ps.records[r + 1].state[v] > 0 or any(
        x.state[v] > 0 for x in ps.records[r + 1:])
    assert log.of(Finished)[0].reason == "test done"


def test_worker_sigstopped_past_dead_after_declared_dead_then_rejoins(run: Runner,
                                                                      procs: Procs) -> None:
    """Paused (SIGSTOP) past dead_after_s: the heartbeat declares it dead and the PS closes its
    connection; the rounds go on without it. Resumed (SIGCONT), it finds the connection
    closed (whatever it sends late on it is discarded with the connection, never reaching the
    core), reconnects with backoff, and computes in a later round."""
    config = cfg(workers=6, delta=3, n_parts=1, rounds=10_000, heartbeat_s=0.2,
                 dead_after_s=1.0, collect_timeout_s=30.0)
    v = 2
    ps = make_ps(config, schedule=_fast_victim_schedule(config, v))

    async def scenario() -> tuple[EventLog, dict[int, int | None], int, int]:
        server, log, task = await serve(ps)
        procs.start(server.port, range(config.workers))
        await log.wait_for(lambda: log.rounds_completed() >= 2)
        # pause it in the middle of a round
        n = len(log.of(RoundStarted))
        await log.wait_for(lambda: len(log.of(RoundStarted)) > n)
        procs.kill(v, signal.SIGSTOP)
        stop_round = log.of(RoundStarted)[-1].round  # the round it was paused in
        await log.wait_for(lambda: any(d.worker == v for d in log.of(WorkerDropped)))
        procs.kill(v, signal.SIGCONT)
        drop = next(d for d in log.of(WorkerDropped) if d.worker == v)

        def rejoined() -> bool:
            return any(r.round > drop.round and r.state[v] > 0 for r in ps.records)

        await log.wait_for(rejoined)
        server.stop("test done")
        async with asyncio.timeout(STEP_S):
            await task
        return log, await procs.join(), stop_round, drop.round

    log, codes, stop_round, drop_round = run(scenario)
    assert all(c == 0 for c in codes.values()), codes  # the victim too: it was told to stop
    drops = [d for d in log.of(WorkerDropped) if d.worker == v]
    assert [d.reason for d in drops] == ["heartbeat_timeout"]
    # a paused worker is only a straggler until the heartbeat bound: rounds went on meanwhile
    assert drop_round >= stop_round
    stats = dict(ps.stats)
    # it came back on a new connection. (On a loaded machine an honest worker can also be
    # silent for dead_after_s while the run is still joining -- its first welcome imports and
    # builds the scheme -- and is then closed and rejoins before round 0: not a round drop.)
    hb = [e for e in log.of(PeerClosed) if e.code == "heartbeat_timeout"]
    assert stats.get("closed_heartbeat_timeout") == len(hb) >= 1
    assert stats.get("joined") == config.workers + len(hb)
    assert sum(1 for e in hb if e.time >= log.of(RoundStarted)[0].time) == 1
    assert not any(k.startswith(("stale_epoch", "nonfinite", "from_unknown")) for k in stats)
    recs = ps.records
    assert all(r.status == "exact" and r.rel_error <= 1e-9 for r in recs)
    assert recs[drop_round].dropped == {v: "heartbeat_timeout"}
    assert recs[drop_round].state[v] == 0
    assert any(r.state[v] > 0 for r in recs[drop_round + 1:])
    assert log.of(Finished)[0].reason == "test done"


# ------------------------------------------------------------------ PS killed and restarted


@pytest.mark.parametrize("crash", ["abort", "cancel"])
@pytest.mark.parametrize("loop_factory", loop_factories())
def test_ps_restart_new_epoch(crash: str, loop_factory: Any) -> None:
    """The PS dies mid-run (connections reset, or its serve task cancelled); a new PS with a
    new epoch listens on the same port; the workers reconnect with backoff, handshake into the
    new epoch and the new PS completes its rounds, bit-identical to a clean start: nothing of
    the old epoch was decoded."""
    run = make_runner(loop_factory)
    config = cfg(workers=4, delta=2, n_parts=1, rounds=6)
    schedule = spaced_schedule(config, gap_s=0.03)

    async def scenario() -> tuple[Cluster, Any, EventLog, int, int]:
        cl = await start_cluster(make_ps(config, schedule=schedule, epoch=0))
        port = cl.server.port
        await cl.log.wait_for(lambda: cl.log.rounds_completed() >= 2)
        # crash it mid-round
        n = len(cl.log.of(RoundStarted))
        await cl.log.wait_for(lambda: len(cl.log.of(RoundStarted)) > n)
        assert cl.serve_task is not None
        n_before = len(cl.ps.records)  # what the PS had decoded when it "died"
        if crash == "abort":
            for conn in list(cl.server._conns):  # test-only: reset every connection at once
                conn.abort()
        cl.serve_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await cl.serve_task
        # the restart: same port, new epoch; the old clients are still running
        ps2 = make_ps(config, schedule=schedule, epoch=1)
        log2 = EventLog()
        server2 = PSServer(ps2, host=HOST, port=port, on_event=log2)
        cl.serve_task = asyncio.create_task(server2.serve())
        old = cl.ps
        cl.ps, cl.server, cl.log = ps2, server2, log2
        await cl.finish()
        return cl, old, log2, port, n_before

    cl, old, log2, port, n_before = run(scenario)
    new = cl.ps
    assert 2 <= n_before < config.rounds
    # (after its serve task is gone the old core only sees its connections drop: whatever it
    # records then are failed rounds, never a decode)
    assert all(r.status == "failed" for r in old.records[n_before:])
    assert new.phase is PSPhase.FINISHED and log2.of(Finished)[0].reason == "all rounds done"
    assert new.epoch == 1 and cl.server.port == port
    assert_exact_rounds(new.records, config.rounds, tol=1e-9)
    # the new PS started from scratch and reproduced the old one's rounds exactly
    for a, b in zip(old.records[:n_before], new.records, strict=False):
        assert a.state == b.state and a.loss == b.loss
        np.testing.assert_array_equal(a.gradient, b.gradient)
    stats = dict(new.stats)
    assert stats.get("joined") == config.workers
    assert not any(k.startswith("stale_epoch") for k in stats), stats
    # every worker re-handshook into the new epoch
    for j, wlog in enumerate(cl.worker_logs):
        epochs = [e.epoch for e in wlog.of(Welcomed)]
        assert epochs[0] == 0 and epochs[-1] == 1, (j, epochs)
        assert cl.clients[j].connections >= 2


# ------------------------------------------------------------------ too many workers die


@pytest.mark.parametrize("scheme", ["partial", "original"])
def test_more_than_tolerable_workers_die(run: Runner, procs: Procs, scheme: str) -> None:
    """m=4, delta=2 tolerates one lost worker; two die at the start of round 1. The PS ends
    the round as failed with its reason -- at once when it sees the round cannot decode any
    more, at the latest after round_timeout_s --, applies nothing (the loss is unchanged), and
    the run still ends: no hang, no wrong gradient."""
    config = cfg(scheme=scheme, workers=4, delta=2, n_parts=1, rounds=3, delay="const:0.1",
                 round_timeout_s=1.0, heartbeat_s=0.2, dead_after_s=1.0, join_timeout_s=1.5)
    killed = [0, 1]  # neighbours in the cyclic assignment: a chunk only they hold

    def on_started(ev: Any) -> None:
        if isinstance(ev, RoundStarted) and ev.round == 1:
            for j in killed:
                procs.kill(j)

    ps = make_ps(config)

    async def scenario() -> tuple[EventLog, dict[int, int | None]]:
        server, log, task = await serve(ps, hook=on_started)
        procs.start(server.port, range(config.workers))
        async with asyncio.timeout(GUARD_S):
            await task
        return log, await procs.join()

    log, codes = run(scenario)
    assert codes == {0: -signal.SIGKILL, 1: -signal.SIGKILL, 2: 0, 3: 0}
    r0, r1 = ps.records
    assert r0.status == "exact" and r0.rel_error <= 1e-9
    assert r1.status == "failed"
    # said at once when the PS sees the round cannot decode any more, else at the timeout
    assert (r1.end_reason, r1.end_detail) in {
        (EndReason.WORKERS_GONE, "cannot decode: workers [0, 1] gone"),
        (EndReason.TIMEOUT, "round timeout (1.0 s)"),
    }, (r1.end_reason, r1.end_detail)
    assert r1.gradient is None and np.isnan(r1.rel_error)
    # a failed round changes nothing: the model after it is the model after round 0
    assert r1.loss == r0.loss
    assert set(r1.dropped) == {0, 1}
    assert dict(ps.stats).get("failed_rounds") == 1
    # round 2 is never started hopeless: the PS waits join_timeout_s for enough ready workers,
    # then ends the run with the reason
    assert "ready for round 2" in log.of(Finished)[0].reason


# ------------------------------------------------------------------ Ctrl-C / SIGTERM


def _proc_stat(pid: int) -> tuple[int, str] | None:
    """(ppid, state) of a live process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(rest[1]), rest[0]


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _proc_stat(int(d))
            if st is not None:
                children.setdefault(st[0], []).append(int(d))
    out: list[int] = []
    stack = [root]
    while stack:
        for c in children.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


class _StderrWatch(threading.Thread):
    """Reads a pipe to EOF in the background; ``wait_for(regex)`` blocks until it matched."""

    def __init__(self, pipe: Any) -> None:
        super().__init__(daemon=True)
        self.pipe = pipe
        self.data = b""
        self.cond = threading.Condition()
        self.eof = False

    def run(self) -> None:
        while chunk := os.read(self.pipe.fileno(), 65536):
            with self.cond:
                self.data += chunk
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def wait_for(self, pattern: bytes, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: re.search(pattern, self.data) or self.eof,
                                      timeout) and bool(re.search(pattern, self.data))


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds")
@pytest.mark.parametrize(("sig", "group"), [
    pytest.param(signal.SIGINT, True, id="ctrl-c"),  # a terminal's Ctrl-C: the whole group
    pytest.param(signal.SIGINT, False, id="SIGINT"),
    pytest.param(signal.SIGTERM, False, id="SIGTERM"),
])
def test_signal_during_run_shuts_down_cleanly(tmp_path: Path, sig: int, group: bool) -> None:
    """Ctrl-C / SIGTERM during a live run (worker processes): the PS stops, the run ends (no
    further scheme starts) with exit code 130, no 'Task exception was never retrieved' or any
    traceback, and every process it started is gone."""
    out = tmp_path / "run"
    # --time-scale 1: run_local.py's default calibration run is not what this test is about
    cmd = [sys.executable, "run_local.py", "--as", "processes", "--workers", "4",
           "--rounds", "200", "--delay", "exp:0.01", "--out", str(out), "--no-plots",
           "--progress", "--time-scale", "1"]
    stdout_f = open(tmp_path / "stdout.txt", "wb")  # noqa: SIM115 - closed below
    # stderr is read by one thread only (communicate() would race it for the bytes)
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=stdout_f, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            start_new_session=group)
    watch = _StderrWatch(proc.stderr)
    watch.start()
    pidfds: list[tuple[int, int]] = []
    try:
        # the progress bar shows a completed round: PS, forkserver and workers are all up
        assert watch.wait_for(rb"\b[1-9]\d*/200 rounds", timeout=60), watch.data[-2000:]
        for pid in _descendants(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                pidfds.append((pid, os.pidfd_open(pid)))
        assert len(pidfds) >= 4  # the workers (and the forkserver) at least
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        proc.wait(timeout=30)  # hang guard
        watch.join(30)  # EOF once every holder of the pipe (its children too) is gone
        # every process it started is gone (pidfds are immune to pid reuse)
        survivors = []
        for pid, fd in pidfds:
            readable, _, _ = select.select([fd], [], [], 15.0)  # readable = exited
            if not readable:
                survivors.append(pid)
        assert not survivors, f"orphans left behind: {survivors}"
    finally:
        for _, fd in pidfds:
            if not select.select([fd], [], [], 0)[0]:  # a failed test leaves no orphan either
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stdout_f.close()
    assert watch.eof  # nobody holds its stderr any more
    err = watch.data.decode(errors="replace")
    stdout = (tmp_path / "stdout.txt").read_text(errors="replace")
    assert "Task exception was never retrieved" not in err
    assert "Traceback" not in err, err[-3000:]
    assert "aiogc: interrupted" in err
    assert proc.returncode == 130, (proc.returncode, err[-2000:], stdout[-2000:])
    # the run stopped: no scheme ran to the end, the next scheme was never started
    with open(out / "rounds.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    schemes = {r["scheme"] for r in rows}
    assert schemes == {"partial"}, schemes
    assert 1 <= len(rows) < 200
