"""Local live runs: one PS and m workers (processes or coroutines) over loopback TCP.

Every scheme in a comparison runs on the *same* materialised delay schedule (drawn once from
the seed, saved as ``delays.csv``), through the same PS, workers, transport and metrics; only
the scheme differs. Worker processes come from a ``forkserver`` that preloads the package
(starting 64 workers: ~0.5 s instead of ~4.5 s with ``spawn``), with BLAS limited to one thread
each (performance.md pitfall 5).

Shutdown: Ctrl-C, SIGTERM or the caller's stop handle (``RunOptions.stop``) stops the PS,
which tells the workers to exit, and ends the whole run (no further scheme starts); worker
processes still alive after a grace period are terminated, then killed. No process outlives
the runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aiogc.coding.base import Scheme
from aiogc.config import RunConfig
from aiogc.core import (
    Event,
    Finished,
    ParameterServer,
    RoundCompleted,
    RoundRecord,
)
from aiogc.errors import ConfigError
from aiogc.harness.evictions import check_run_locate, eviction_sink, locate_ps_options
from aiogc.harness.failures import TaskFailures
from aiogc.harness.fidelity import (
    LAG_INTERVAL_S,
    CpuSnapshot,
    LoopLagMonitor,
    auto_time_scale,
    emulated,
    live_fidelity,
)
from aiogc.harness.inproc import in_process_workers
from aiogc.harness.kit import (
    PROCESS_GRACE_S,
    Progress,
    RunResult,
    close_run,
    make_ps,
    open_recorder,
    run_schemes,
    scheme_config,
    stop_on_write_error,
)
from aiogc.harness.options import RunOptions
from aiogc.harness.spawn import _mp_context, _reap, _single_thread_blas_env, _worker_spawns
from aiogc.net.drivers import PSServer
from aiogc.net.loops import loop_factory, run_on
from aiogc.protocol.messages import Message
from aiogc.training.schedule import DelaySchedule

# ------------------------------------------------------------------ one scheme, live


@dataclass(frozen=True)
class SchemeOutcome:
    """What one scheme's live run returns: the PS's round records and why it finished (None
    if the PS ended without saying why)."""

    records: list[RoundRecord]
    end_reason: str | None
    #: the PS loop's timer lag samples, wall seconds (:class:`LoopLagMonitor`)
    loop_lag_s: list[float] = field(default_factory=list)
    #: the workers the PS evicted (:mod:`aiogc.harness.evictions`)
    evicted: list[dict[str, Any]] = field(default_factory=list)


def _attach_capture(server: PSServer, path: str | os.PathLike[str] | None) -> Any:
    """``--pcap``: a :class:`aiogc.net.pcap.PcapWriter` tapping every connection of
    ``server`` (appending: one file for every scheme of the run), or None."""
    if path is None:
        return None
    from aiogc.net.pcap import PcapWriter

    cap = PcapWriter(path)
    server.tap = cap.tap
    return cap


def _close_capture(capture: Any, *, truncate: str | os.PathLike[str] | None = None) -> None:
    """Close a :func:`_attach_capture` writer (None: nothing); ``truncate``: remove that
    capture file first (a run starts a fresh one, its schemes append)."""
    if capture is not None:
        capture.close()
    if truncate is not None:
        Path(truncate).unlink(missing_ok=True)


async def _run_scheme(
    config: RunConfig,
    schedule: DelaySchedule,
    options: RunOptions,
    *,
    scheme: Scheme | None = None,
    loop_kind: str,
    recorder: Any | None,
    on_round: Callable[[RoundRecord], None] | None,
    on_signal: Callable[[str], None] | None = None,
    failures: TaskFailures | None = None,
) -> SchemeOutcome:
    """One scheme, live (``options.mode``, ``verify``, ``secret``, ``start_method`` and
    ``worker_hosts`` apply). SIGTERM / SIGINT stop the PS gracefully (it tells every worker
    to shut down) and ``on_signal`` gets the signal's name; why the PS finished is returned
    (and written to ``events.jsonl``)."""
    mode, secret, worker_hosts = options.mode, options.secret, options.worker_hosts
    k = config.time_scale
    ps, _ = make_ps(config, schedule=schedule, verify=options.verify, secret=secret,
                    locate=options.locate, scheme=scheme,
                    options=locate_ps_options(config, options.locate, options.spare_wait,
                                              verify=options.verify))
    scheme = ps.scheme
    finished: list[str] = []
    evicted: list[dict[str, Any]] = []
    on_event = eviction_sink(_scheme_event_handler(config.scheme, scheme, recorder, on_round,
                                                   finished.append, time_scale=k),
                             ps, config.scheme, recorder, evicted, time_scale=k)
    # a failing task stops the run (server: bound below)
    on_event = (failures or TaskFailures()).sink(on_event, config.scheme,
                                                 lambda why: server.stop(why))
    frame_log = None if recorder is None else _frame_logger(config.scheme, ps, recorder, k)
    lag = LoopLagMonitor(interval_s=LAG_INTERVAL_S)
    # the join deadline starts when the workers are launched, not at listen
    server = PSServer(ps, host="127.0.0.1", port=0, frame_log=frame_log, on_event=on_event,
                      join_clock=False)
    capture = _attach_capture(server, options.pcap)
    if recorder is not None:
        recorder.on_write_error = stop_on_write_error(server.stop)
    procs: list[Any] = []
    parent_alive: Any = None  # read end of the workers' parent-watch pipe (processes mode)
    loop = asyncio.get_running_loop()
    stop_handlers = []
    watch_ends: list[Any] = []  # parent-watch write ends, closed after the reap

    def stop_on(name: str) -> None:
        if on_signal is not None:
            on_signal(name)
        server.stop(name)  # idempotent: a repeated signal changes nothing

    # SIGINT too: left to asyncio.Runner it cancels this task, which closes the connections
    # before the PS could tell the workers to stop (they were then terminated after the grace)
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop_on, sig.name)
            stop_handlers.append(sig)
    unsubscribe: Callable[[], None] = _nothing
    try:
        async with asyncio.TaskGroup() as tg:
            serving = tg.create_task(server.serve())
            await _started(server, serving)
            unsubscribe = _subscribe(options, loop, stop_on)
            lag.start()
            if mode == "coroutines" and not worker_hosts:
                # one host connection for all of them, or one each (--connection-per-worker)
                clients = [tg.create_task(c) for c in in_process_workers(
                    scheme.m, server.port, secret, config.task,
                    connection_per_worker=options.connection_per_worker)]
                server.workers_launched()
                await serving
                # workers exit on the PS's shutdown; one that cannot (it never joined) is
                # cancelled after the grace period rather than left reconnecting
                _, pending = await asyncio.wait(clients, timeout=PROCESS_GRACE_S)
                for t in pending:
                    t.cancel()
            else:
                ctx = _mp_context(options.start_method)
                # the runner keeps the only write end: the workers see EOF when it dies
                parent_alive, keep_alive = ctx.Pipe(duplex=False)
                watch_ends.append(keep_alive)
                with _single_thread_blas_env():
                    for name, target, args in _worker_spawns(
                            scheme.m, worker_hosts, secret, server.port, loop_kind,
                            config.task, parent_alive):
                        p = ctx.Process(target=target, name=name, args=args, daemon=True)
                        p.start()
                        procs.append(p)
                parent_alive.close()  # the workers have their copies
                server.workers_launched()
    except BaseException:
        server.stop("runner interrupted")
        raise
    finally:
        unsubscribe()
        lag.stop()
        _close_capture(capture)
        for sig in stop_handlers:
            loop.remove_signal_handler(sig)
        if procs:
            await asyncio.to_thread(_reap, procs, PROCESS_GRACE_S)
        for c in watch_ends:
            c.close()
    return SchemeOutcome([emulated(r, k) for r in ps.records],
                         finished[0] if finished else None, lag.lags, evicted)


def _nothing() -> None:
    pass


def _subscribe(options: RunOptions, loop: asyncio.AbstractEventLoop,
               stop_on: Callable[[str], None]) -> Callable[[], None]:
    """Have the caller's stop handle (``options.stop``, from any thread) call
    ``stop_on(label)`` on ``loop``, the listening PS's; returns the unsubscribe function."""
    if options.stop is None:
        return _nothing

    def on_stop(label: str) -> None:
        # nothing once the loop is closed: the scheme has ended, and the next one sees the
        # stopped handle when it subscribes
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(stop_on, label)

    return options.stop.subscribe(on_stop)


def _scheme_event_handler(
    scheme_name: str,
    scheme: Scheme,
    recorder: Any | None,
    on_round: Callable[[RoundRecord], None] | None,
    on_finished: Callable[[str], None] | None,
    *,
    time_scale: float = 1.0,
) -> Callable[[Event], None]:
    """The PS event callback of one scheme's run: records rounds and the run's end (if
    ``recorder``), calls ``on_round``, and ``on_finished`` with why the PS finished.

    It runs on the event loop between rounds: recording a round only buffers a copy of the
    record (:meth:`aiogc.harness.records.RunRecorder.round`); the rows are written later."""
    loads = tuple(int(x) for x in scheme.loads)
    m = scheme.m
    trigger = not (scheme.sends_when_done or scheme.uploads_per_chunk)
    k = time_scale

    def on_event(ev: Event) -> None:
        if isinstance(ev, Finished):
            if on_finished is not None:
                on_finished(ev.reason)
            if recorder is not None:
                recorder.run_event(t_ns=int(time.monotonic_ns() / k), kind="run_end",
                                   scheme=scheme_name, reason=ev.reason,
                                   rounds=ev.rounds_completed)
        if isinstance(ev, RoundCompleted):
            rec = emulated(ev.record, k)  # records hold emulated seconds
            if recorder is not None:
                recorder.round(scheme_name, rec, m=m, loads=loads, trigger_scheme=trigger)
            if on_round is not None:
                on_round(rec)

    return on_event


def _frame_logger(scheme_name: str, ps: ParameterServer, recorder: Any,
                  time_scale: float = 1.0) -> Callable[[str, Any, Message, int], None]:
    """The PS's frame log callback: one buffered ``events.jsonl`` row per frame (a tuple
    append on the loop; :meth:`aiogc.harness.records.RunRecorder.frame_logger`), its time
    in emulated nanoseconds (the PS clock divided by the time scale)."""
    if time_scale == 1.0:
        log: Callable[[str, Any, Message, int], None] = recorder.frame_logger(scheme_name,
                                                                              ps.worker_of)
        return log

    def clock() -> int:
        return int(time.monotonic_ns() / time_scale)

    scaled: Callable[[str, Any, Message, int], None] = recorder.frame_logger(
        scheme_name, ps.worker_of, clock=clock)
    return scaled


async def _started(server: PSServer, serving: asyncio.Task[None]) -> None:
    """Wait until ``server`` listens; re-raise at once if it could not (``serving`` ended)."""
    waiter = asyncio.ensure_future(server.started.wait())
    try:
        await asyncio.wait({waiter, serving}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if not server.started.is_set():
        await serving  # raises the bind error
        raise RuntimeError("PS server ended before it listened")


def run_live(
    config: RunConfig,
    schemes: Sequence[str],
    options: RunOptions | None = None,
    *,
    schedule: DelaySchedule | None = None,
) -> RunResult:
    """Run each scheme live on loopback over the same schedule; write the run directory.

    Parameters
    ----------
    config : RunConfig
        Base configuration; ``scheme`` is replaced by each entry of ``schemes``.
    options : RunOptions, optional
        Mode, loop, run directory, backend... (:class:`~aiogc.harness.options.RunOptions`);
        default ``RunOptions()``: coroutine workers on uvloop, verified, no files.
    schedule : DelaySchedule, optional
        The delays of every scheme; default drawn from ``config`` (its seed).

    Raises
    ------
    RunInterrupted
        (a KeyboardInterrupt) SIGINT or SIGTERM stopped the run: the running scheme's PS told
        its workers to shut down, no further scheme started, and what was recorded is written,
        ``summary.json`` included (no plots); the exception carries the partial result. So
        does ``options.stop`` (:class:`~aiogc.harness.options.RunStop`), its
        ``signal_name`` then the handle's ``label``.
    """
    options = options if options is not None else RunOptions()
    mode = options.mode
    mode_label = _check_worker_hosts(options.worker_hosts, mode, config.workers,
                                     options.connection_per_worker)
    check_run_locate(config, schemes, options.locate, options.spare_wait, options.backend)
    if options.backend == "ray":
        from aiogc.harness.ray_backend import run_ray

        _check_ray_mode(mode)
        for hook in ("stop", "on_round"):
            if getattr(options, hook) is not None:
                raise ConfigError(hook, "given", "none with the ray backend (local only)")
        return run_ray(config, schemes, options, schedule=schedule)
    _check_local_args(options.backend, options.address, mode)
    if options.secret is None:
        options = replace(options, secret=secrets.token_bytes(32))
    return run_schemes(config, schemes, _LocalBackend(schemes, options, mode_label),
                       schedule=schedule, out_dir=options.out_dir, plots=options.plots)


class _LocalBackend:
    """The local runner's side of the skeleton (:class:`~aiogc.harness.kit.RunnerBackend`):
    each scheme's PS and workers on this machine, on their own event loop."""

    def __init__(self, schemes: Sequence[str], options: RunOptions, mode_label: str) -> None:
        self.schemes = list(schemes)
        self.options = options
        self.mode_label = mode_label
        self.loop_kind, _ = loop_factory(options.loop)
        self.config: RunConfig | None = None
        self.schedule: DelaySchedule | None = None
        self.choice: Any = None
        self.cpu0: CpuSnapshot | None = None
        self.lags: list[float] = []
        self.recorder: Any = None
        self.interrupted: list[str] = []
        self.failures = TaskFailures()
        self.built: Mapping[str, Scheme] = {}

    def prepare(self, config: RunConfig, schedule: DelaySchedule,
                built: Mapping[str, Scheme]) -> RunConfig:
        self.built = built
        config, self.choice = _choose_time_scale(config, self.schemes, schedule, self.options,
                                                 self.loop_kind, built)
        self.config, self.schedule = config, schedule
        _close_capture(None, truncate=self.options.pcap)
        return config

    @contextlib.contextmanager
    def session(self, result: RunResult, interrupted: list[str]) -> Iterator[None]:
        assert self.config is not None and self.schedule is not None
        self.interrupted = interrupted
        self.cpu0 = CpuSnapshot.take()
        self.recorder = open_recorder(result, self.config, self.schemes, self.schedule,
                                      self.options, mode=self.mode_label,
                                      loop_kind=self.loop_kind, built=self.built)
        yield

    def run_scheme(self, cfg: RunConfig, scheme: Scheme, result: RunResult
                   ) -> list[RoundRecord]:
        assert self.schedule is not None
        name = cfg.scheme
        bar = Progress(cfg.rounds, name, enabled=self.options.progress)
        user_tick = self.options.on_round

        def tick(rec: RoundRecord) -> None:
            bar.update(record=rec)
            if user_tick is not None:
                user_tick(name, rec)

        try:
            outcome: SchemeOutcome = run_on(self.loop_kind, _run_scheme(
                cfg, self.schedule, self.options, scheme=scheme, loop_kind=self.loop_kind,
                recorder=self.recorder, on_round=tick, on_signal=self.interrupted.append,
                failures=self.failures))
        finally:
            bar.close()
        self.lags += outcome.loop_lag_s
        result.evicted += outcome.evicted
        result.end_reasons[name] = (outcome.end_reason if outcome.end_reason is not None
                                    else "PS ended without a reason")
        return outcome.records

    def halted(self) -> bool:
        return self.failures.first is not None or (
            self.recorder is not None and self.recorder.write_error is not None)

    def close(self, result: RunResult, interrupted: Sequence[str]) -> None:
        self.failures.add_to(result.extra_summary)
        if self.config is not None and self.schedule is not None and self.cpu0 is not None:
            result.extra_summary["fidelity"] = _fidelity(
                self.config, self.schedule, self.built, result, self.lags, self.cpu0,
                self.options.fidelity_threshold, self.choice)
        close_run(result, interrupted, self.recorder)


#: Rounds of the K = 1 calibration run behind ``--time-scale auto``.
CALIBRATION_ROUNDS = 5


def _fidelity(config: RunConfig, schedule: DelaySchedule, built: Mapping[str, Scheme],
              result: RunResult, lags: list[float], cpu0: CpuSnapshot | None, threshold: float,
              choice: dict[str, Any] | None) -> dict[str, Any]:
    cpu1 = CpuSnapshot.take()
    return live_fidelity(config, schedule, result.records, built=built, loop_lag_s=lags,
                         cpu=cpu1.since(cpu0) if cpu0 is not None and cpu1 is not None else None,
                         threshold=threshold, time_scale_choice=choice)


def _choose_time_scale(config: RunConfig, schemes: Sequence[str], schedule: DelaySchedule,
                       options: RunOptions, loop_kind: str, built: Mapping[str, Scheme]
                       ) -> tuple[RunConfig, dict[str, Any] | None]:
    """``--time-scale auto``: run the first scheme for a few rounds at K = 1 with the run's
    own mode, m and schedule, no records; its largest live-minus-simulated round time is this
    machine's overhead per round now; then K is the smallest that keeps that overhead under
    a quarter of the fidelity threshold of the shortest simulated round
    (:data:`~aiogc.harness.fidelity.AUTO_TARGET_FRACTION`). Without ``auto``: the
    configuration as it is, and no choice to record."""
    if not options.auto_time_scale:
        return config, None
    n = min(CALIBRATION_ROUNDS, config.rounds)
    cal_cfg = scheme_config(config, schemes[0]).replace(rounds=n, time_scale=1.0)
    cal_opts = replace(options, out_dir=None, progress=False, plots=False,
                       auto_time_scale=False, pcap=None)
    t0 = time.monotonic()
    outcome = run_on(loop_kind, _run_scheme(cal_cfg, schedule, cal_opts,
                                            scheme=built[schemes[0]], loop_kind=loop_kind,
                                            recorder=None, on_round=None))
    k, why = auto_time_scale(config, schemes, schedule, {schemes[0]: outcome.records},
                             built=built, threshold=options.fidelity_threshold)
    why["calibration_wall_s"] = time.monotonic() - t0
    print(f"aiogc: --time-scale auto chose K={k:g}: {why['explanation']}", file=sys.stderr,
          flush=True)
    return config.replace(time_scale=k), why


def _check_ray_mode(mode: str) -> None:
    if mode == "coroutines":
        raise ConfigError("as", mode, "processes with --backend ray (each worker is a Ray "
                                      "actor process)")


def _check_local_args(backend: str, address: str | None, mode: str) -> None:
    """The local backend's options: ``backend``, ``address`` (none) and ``mode``."""
    if backend != "local":
        raise ConfigError("backend", backend, "local or ray")
    if address is not None:
        raise ConfigError("address", address, "no address with --backend local")
    if mode not in ("coroutines", "processes"):
        raise ConfigError("as", mode, "processes or coroutines")


def _check_worker_hosts(worker_hosts: int, mode: str, m: int,
                        connection_per_worker: bool = False) -> str:
    """Validate ``worker_hosts`` (and ``connection_per_worker``, which only the in-process
    coroutine workers have a choice of); the run's mode as the manifest records it."""
    if isinstance(worker_hosts, bool) or not isinstance(worker_hosts, int) \
            or not 0 <= worker_hosts <= m:
        raise ConfigError("worker_hosts", worker_hosts, f"an integer in [0, m={m}]")
    if worker_hosts and mode != "coroutines":
        raise ConfigError("worker_hosts", worker_hosts,
                          "0 unless --as coroutines (processes mode has one process per worker)")
    if connection_per_worker and (mode != "coroutines" or worker_hosts):
        raise ConfigError("connection_per_worker", True,
                          "only with --as coroutines and no --worker-hosts (worker processes "
                          "always have one connection each; a worker host shares one)")
    return f"coroutines, {worker_hosts} worker-host processes" if worker_hosts else mode


