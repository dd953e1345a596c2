"""``aiogc ps`` and ``aiogc worker``: the parameter server and the workers of a run across
machines (each in its own process)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aiogc.cli.args import (
    EXIT_EVICTED,
    EXIT_INCOMPLETE,
    EXIT_OK,
    EXIT_RECORDS,
    EXIT_SHRUNK,
    EXIT_TASK,
    EXIT_UNREACHABLE,
    _check_local_task_files,
    _live_only,
    _signal_exit,
    claim_run_dir,
    config_from_args,
    log,
    read_secret,
    settle_ok,
    task_line,
)
from aiogc.cli.knobs import add_knobs
from aiogc.coding.base import Scheme
from aiogc.config import MAX_WORKERS
from aiogc.errors import ConfigError, EvictedError

# ------------------------------------------------------------------ ps / worker


def add_ps_parser(sub: Any) -> None:
    p = sub.add_parser("ps", help="run a parameter server for remote workers",
                       description="Serve one scheme to m workers started with `aiogc worker`.")
    add_knobs(p, "ps")
    p.set_defaults(func=cmd_ps)


def _ps_event_handler(scheme_name: str, scheme: Scheme, recorder: Any,
                      ended: list[str], progress: Any = None,
                      time_scale: float = 1.0) -> Callable[[Any], None]:
    """``aiogc ps``'s event callback: advances the progress line (if ``progress``), logs
    each round (INFO: ``-v``), records it (if ``recorder``) in emulated seconds (wall / the
    time scale), and appends the PS's end reason to ``ended``."""
    import time

    from aiogc.core import Finished, RoundCompleted
    from aiogc.harness.fidelity import emulated
    from aiogc.harness.kit import round_line

    loads = tuple(int(x) for x in scheme.loads)
    trigger = not (scheme.sends_when_done or scheme.uploads_per_chunk)

    def on_event(ev: Any) -> None:
        if isinstance(ev, RoundCompleted):
            r = emulated(ev.record, time_scale)
            if log.isEnabledFor(logging.INFO):
                log.info("%s", round_line(r))  # one scheme: no label
            if progress is not None:
                progress.update()
            if recorder is not None:
                recorder.round(scheme_name, r, m=scheme.m, loads=loads, trigger_scheme=trigger)
        elif isinstance(ev, Finished):
            ended.append(ev.reason)
            if recorder is not None:
                recorder.run_event(t_ns=int(time.monotonic_ns() / time_scale), kind="run_end",
                                   scheme=scheme_name, reason=ev.reason,
                                   rounds=ev.rounds_completed)

    return on_event


def _ps_summary(scheme_name: str, records: Any, ended: list[str],
                stopped: list[str]) -> dict[str, Any]:
    """``aiogc ps``'s summary with the end reason (the PS's, or the signal that stopped it)."""
    from aiogc.harness.kit import ALL_ROUNDS_DONE, run_end_reason
    from aiogc.harness.summary import summarize

    ps_reason = (ended[0] if ended else
                 f"stopped by {stopped[0]}" if stopped else "PS ended without a reason")
    summary = summarize({scheme_name: records}, end_reasons={scheme_name: ps_reason})
    end_reason = ps_reason
    if ps_reason == ALL_ROUNDS_DONE:
        end_reason = run_end_reason({scheme_name: ps_reason}, (), summary)
    summary["end_reason"] = end_reason
    summary["interrupted_by"] = stopped[0] if stopped else None
    if stopped:
        summary["ok"] = False  # ok only when every round completed as configured
    summary["in_progress"] = False
    return summary


def cmd_ps(a: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    import time

    from aiogc.harness.evictions import eviction_sink, locate_ps_options
    from aiogc.harness.failures import TaskFailures
    from aiogc.harness.kit import (
        Progress,
        build_manifest,
        dump_json,
        format_summary,
        make_ps,
        materialise_for,
        stop_on_write_error,
    )
    from aiogc.harness.local import _started
    from aiogc.harness.records import FLUSH_EVERY_S, RunRecorder
    from aiogc.net.drivers import PSServer
    from aiogc.net.loops import run_on

    _live_only([a.scheme])
    config = config_from_args(a, a.scheme)
    secret = read_secret(a.secret_file)
    if a.out:  # never silently over an earlier run's files
        claim_run_dir(a.out, overwrite=a.overwrite)
    schedule = materialise_for(config, [a.scheme])
    epoch = a.epoch if a.epoch is not None else time.time_ns() // 1_000_000 % (2**52)
    ps, _ = make_ps(config, schedule=schedule, verify=a.verify, secret=secret, epoch=epoch,
                    locate=a.locate, options=locate_ps_options(config, a.locate, a.spare_wait,
                                                               verify=a.verify))
    scheme = ps.scheme
    recorder = None
    if a.out:
        recorder = RunRecorder(a.out, build_manifest(config, [a.scheme], schedule,
                                                     mode="remote", loop=a.loop,
                                                     verify=a.verify, argv=argv),
                               flush_every_s=FLUSH_EVERY_S)
        recorder.write_schedule(schedule)
    ended: list[str] = []
    stopped: list[str] = []
    show = sys.stderr.isatty() if a.progress is None else a.progress
    bar = Progress(config.rounds, a.scheme,
                   enabled=show and not a.quiet and not log.isEnabledFor(logging.INFO))
    k = config.time_scale
    evicted: list[dict[str, Any]] = []
    on_event = eviction_sink(_ps_event_handler(a.scheme, scheme, recorder, ended, bar,
                                               time_scale=k),
                             ps, a.scheme, recorder, evicted, time_scale=k)
    failures = TaskFailures()
    on_event = failures.sink(on_event, a.scheme, lambda why: server.stop(why))
    # every frame recorded (as `aiogc run` does): the membership columns come from them
    frame_log = None if recorder is None else recorder.frame_logger(
        a.scheme, ps.worker_of, clock=lambda: int(time.monotonic_ns() / k))
    server = PSServer(ps, host=a.host, port=a.port, on_event=on_event, frame_log=frame_log)
    close_capture = _open_capture(server, a.pcap)
    if recorder is not None:
        recorder.on_write_error = stop_on_write_error(server.stop)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task_ = asyncio.create_task(server.serve())

        def on_signal(name: str) -> None:
            stopped.append(name)
            if server.started.is_set():
                server.stop(f"signal {name}")  # tells the workers, then serve() returns
            else:
                task_.cancel()  # not listening yet: nothing to tell anyone

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig.name)
        try:
            await _started(server, task_)
        except OSError as exc:
            raise ConfigError("port", a.port, f"a port this host can listen on at {a.host} "
                              f"({exc.strerror or exc})") from None
        print(f"aiogc ps listening on {a.host}:{server.port} (epoch {epoch})", file=sys.stderr,
              flush=True)
        await task_

    try:
        with contextlib.suppress(asyncio.CancelledError):
            run_on(a.loop, main())
    finally:
        close_capture()
        bar.close()
        summary = _ps_summary(a.scheme, ps.records, ended, stopped)
        summary["evicted"] = evicted
        failures.add_to(summary)
        if recorder is not None:
            recorder.close(summary)
            if recorder.write_error is not None:
                summary["records_error"] = recorder.write_error
                summary["ok"] = False
        elif a.out:
            (Path(a.out) / "summary.json").write_text(dump_json(summary))
        end_reason = summary["end_reason"]
    print(format_summary(summary))
    print(f"aiogc ps: end reason: {end_reason}", file=sys.stderr)
    return settle_ok(summary, a.out, _ps_exit(summary, stopped, config, a.allow_shrink))


def _ps_exit(summary: dict[str, Any], stopped: list[str], config: Any, allow_shrink: bool
             ) -> int:
    """``aiogc ps``'s exit status (said on stderr when it is not a plain success)."""
    from aiogc.harness.kit import run_complete

    if stopped:
        print(f"aiogc: interrupted by {stopped[0]}", file=sys.stderr)
        return _signal_exit(stopped[0])
    if summary.get("records_error"):
        print(f"aiogc ps: the run's records could not be written: {summary['records_error']}; "
              "the run was stopped (what was written before is kept)", file=sys.stderr)
        return EXIT_RECORDS
    if summary.get("task_error"):
        print(f"aiogc ps: {task_line(summary['task_error'])}", file=sys.stderr)
        return EXIT_TASK
    if not run_complete(summary, config.rounds, mode=config.mode):
        return EXIT_INCOMPLETE
    return _shrink_exit(summary, allow_shrink)


def _open_capture(server: Any, path: str | None) -> Callable[[], None]:
    """``--pcap``: a fresh :class:`aiogc.net.pcap.PcapWriter` tapping the PS's connections;
    returns what closes it."""
    if path is None:
        return lambda: None
    from aiogc.net.pcap import PcapWriter

    try:
        Path(path).unlink(missing_ok=True)  # the writer appends; a PS run starts a fresh file
        capture = PcapWriter(path)
    except OSError as exc:
        raise ConfigError("pcap", path, f"a file this process can write ({exc.strerror or exc})"
                          ) from None
    server.tap = capture.tap
    return capture.close


def _shrink_exit(summary: dict[str, Any], allow: bool) -> int:
    """EXIT_OK, or EXIT_SHRUNK (said on stderr) when rounds ran with fewer than m workers
    and ``--allow-shrink`` was not given."""
    from aiogc.harness.kit import shrink_line

    shrunk = shrink_line(summary)
    if not shrunk:
        return EXIT_OK
    print(f"aiogc ps: {shrunk}" + (" (allowed by --allow-shrink)" if allow else
                                   " (--allow-shrink accepts this)"), file=sys.stderr)
    return EXIT_OK if allow else EXIT_SHRUNK


def add_worker_parser(sub: Any) -> None:
    p = sub.add_parser("worker", help="run one worker (or a block of them) against a PS",
                       description="Connect to `aiogc ps`, reconnecting with backoff. A range "
                                   "of ids runs those workers as coroutines on one loop.")
    add_knobs(p, "worker")
    p.set_defaults(func=cmd_worker)


def parse_worker_ids(text: str) -> list[int]:
    """``"j"`` or ``"a-b"`` (inclusive) as a list of worker ids, each in [0, MAX_WORKERS)."""
    allowed = (f"an id J or a range A-B with 0 <= A <= B <= {MAX_WORKERS - 1} (a PS has at "
               f"most {MAX_WORKERS} workers)")
    text = str(text).strip()
    shown: object = int(text) if text.isdigit() else text  # id=65536, id='3-x'
    lo, sep, hi = text.partition("-")
    if not lo.isdigit() or (sep and not hi.isdigit()):
        raise ConfigError("id", shown, allowed)
    a, b = int(lo), int(hi) if sep else int(lo)
    if not 0 <= a <= b < MAX_WORKERS:
        raise ConfigError("id", shown, allowed)
    return list(range(a, b + 1))


def _worker_cores(a: argparse.Namespace, ids: list[int]) -> list[Any]:
    """One :class:`~aiogc.core.Worker` per id, keyed by --worker-key-file or the secret."""
    from aiogc.core import Worker, WorkerCache

    if a.worker_key_file is None:
        secret = read_secret(a.secret_file)
        if len(ids) > 1 and secret is None:
            raise ConfigError("id", a.id, "a single id unless --secret-file or AIOGC_SECRET "
                                          "gives the master secret (each worker's key is "
                                          "derived from it)")
        cache = WorkerCache()  # the workers of this process share what they validate
        return [Worker(j, secret=secret, cache=cache) for j in ids]
    if len(ids) > 1:
        raise ConfigError("worker-key-file", a.worker_key_file,
                          "one worker's key: use --secret-file for a range of ids")
    try:  # hex of k_j = aiogc.core.derive_worker_key(S, j): 64 hex digits
        key = bytes.fromhex(Path(a.worker_key_file).read_text().strip())
    except (OSError, ValueError) as exc:
        raise ConfigError("worker-key-file", a.worker_key_file,
                          f"a readable file with 64 hex digits ({exc})") from None
    if len(key) != 32:
        raise ConfigError("worker-key-file", a.worker_key_file, "64 hex digits")
    return [Worker(ids[0], worker_key=key)]


def cmd_worker(a: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    from aiogc.harness.kit import ExitReason
    from aiogc.net.drivers import ClientOptions, WorkerClient
    from aiogc.net.hostclient import HostClient
    from aiogc.net.loops import run_on

    host, _, port = a.connect.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ConfigError("connect", a.connect, "HOST:PORT with a port in [1, 65535]")
    ids = parse_worker_ids(a.id)
    if not a.give_up_after > 0:
        raise ConfigError("give-up-after", a.give_up_after, "a number of seconds > 0")
    from aiogc.training.setup import SetupCache, TaskPolicy

    _check_local_task_files(a.task, a.data_dir or ())
    # no code from the wire: only built-in tasks, this worker's own --task, or data files
    # inside its own --data-dir directories (docs/protocol.md §4.5)
    policy = TaskPolicy(task=a.task, data_dirs=tuple(a.data_dir or ()))
    setups = SetupCache(policy)  # one scheme and task for every worker of this process
    whys = [ExitReason() for _ in ids]
    # -v: a line per round (the round events cost a little, so only then)
    verbose = log.isEnabledFor(logging.INFO)
    sinks = [_round_logger(j, why) if verbose else why for j, why in zip(ids, whys, strict=True)]
    opts = ClientOptions(progress_events=verbose)
    cores = _worker_cores(a, ids)
    runs: list[Callable[[], Any]]
    if len(ids) > 1 and not a.connection_per_worker:  # one worker-host connection
        host_client = HostClient(cores, host, int(port), give_up_after_s=a.give_up_after,
                                 setups=setups, on_events=sinks, options=opts)
        runs = [host_client.run]
    else:
        runs = [WorkerClient(w, host, int(port), give_up_after_s=a.give_up_after,
                             setups=setups, on_event=sink, options=opts).run
                for w, sink in zip(cores, sinks, strict=True)]
    stopped: list[str] = []

    async def main() -> list[BaseException | None]:
        loop = asyncio.get_running_loop()
        tasks = [asyncio.create_task(run()) for run in runs]

        def on_signal(name: str) -> None:
            stopped.append(name)
            for t in tasks:
                t.cancel()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig.name)
        out = await asyncio.gather(*tasks, return_exceptions=True)
        if len(runs) == 1 and len(ids) > 1:  # the host: one result per worker
            res = out[0]
            return res if isinstance(res, list) else [res] * len(ids)
        return out

    results = run_on(a.loop, main())
    if stopped:
        print(f"aiogc worker {a.id}: exiting: stopped by {stopped[0]}", file=sys.stderr)
        return _signal_exit(stopped[0])
    return _worker_exit(ids, results, whys)


def _round_logger(j: int, why: Callable[[Any], None]) -> Callable[[Any], None]:
    """Worker ``j``'s event sink under ``-v``: ``why``, and a line per ended round
    (``worker 3 round 5: exact``; ``ended`` when the PS folded the round's end into the next
    round's start)."""
    from aiogc.core import RoundEnded

    def sink(ev: Any) -> None:
        why(ev)
        if isinstance(ev, RoundEnded):
            log.info("worker %d round %d: %s", j, ev.round, ev.status or "ended")

    return sink


def _worker_exit(ids: list[int], results: list[BaseException | None], whys: list[Any]) -> int:
    """Say on stderr why each worker ended; the exit code of the worst."""
    code = EXIT_OK
    for j, res, why in zip(ids, results, whys, strict=True):
        me = f"aiogc worker {j}"
        if isinstance(res, EvictedError):  # ends the worker, not a retry
            print(f"{me}: exiting: evicted by the PS ({res}); its key is refused for the rest "
                  f"of the run", file=sys.stderr)
            code = EXIT_EVICTED
        elif isinstance(res, ConnectionError):
            print(f"{me}: exiting: {res}", file=sys.stderr)
            code = EXIT_UNREACHABLE
        elif isinstance(res, BaseException):
            print(f"{me}: exiting: {type(res).__name__}: {res}", file=sys.stderr)
            code = EXIT_INCOMPLETE if code == EXIT_OK else code
        else:
            print(f"{me}: exiting: {why.describe()}", file=sys.stderr)
            if why.early and code == EXIT_OK:
                code = EXIT_INCOMPLETE
    return code


# ------------------------------------------------------------------ plot / inspect
