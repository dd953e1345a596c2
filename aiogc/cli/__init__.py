"""``aiogc`` command line: ``run``, ``ps``, ``worker``, ``simulate``, ``experiment``, ``plot``,
``inspect``, ``report``. ``main(argv) -> int``; configuration errors exit 2 with a message naming
the field, the value and the allowed range.

Exit codes (every command; errors are one line on stderr, never a traceback):

* 0 -- done: for ``run`` / ``ps``, every requested round of every scheme completed, none failed,
  no loss or decode error was non-finite, and in exact mode every round decoded exactly; for
  ``worker``, the PS ended the run after all its rounds.
* 1 -- the run ended early or incompletely (join timeout, failed or non-exact rounds, a
  non-finite loss; the summary and ``end reason`` line say which), a worker whose PS ended the
  run early, or an internal error.
* 2 -- bad configuration or usage: an out-of-range flag, a port that cannot be bound, a missing
  file or directory, an unwritable ``--out``, an unknown round or scheme for ``inspect``.
* 3 -- ``worker``: the PS was unreachable for ``--give-up-after`` seconds or refused it for good
  (wrong secret, config mismatch, task not allowed); the message says which.
* 5 -- ``run``: every round completed, but some ran with fewer than m workers (a worker left
  or never joined; ``summary.json`` ``shrunk`` / ``membership`` and a stderr line say which);
  ``--allow-shrink`` accepts that (exit 0).
* 130 -- stopped by SIGINT or SIGTERM (``aiogc: interrupted by ...`` on stderr); ``run`` /
  ``ps`` still write ``summary.json`` with the ``end_reason``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aiogc.coding.registry import scheme_names
from aiogc.config import MAX_WORKERS, WORKLOAD_TIMEOUTS, RunConfig, workload_timeouts
from aiogc.errors import AiogcError, ConfigError

DEFAULT_OUT = "runs/latest"

EXIT_OK = 0
EXIT_INCOMPLETE = 1
EXIT_CONFIG = 2
EXIT_UNREACHABLE = 3
EXIT_SHRUNK = 5
#: --fidelity strict: the run completed but its fidelity verdict is "unfaithful" (its round
#: times or speedups differ from the simulator's replay of its own schedule by more than the
#: threshold): its timings are not a result
EXIT_UNFAITHFUL = 6


#: Exit status of a run stopped by SIGINT or SIGTERM (both mean "the operator stopped it").
EXIT_STOPPED = 130

#: ``aiogc --help`` / ``aiogc run --help`` (and every command's help) list these: what each
#: exit status means (the module docstring says it at length).
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "done: run / ps: every requested round of every scheme completed as "
              "configured; worker: the PS ended the run after all its rounds"),
    (EXIT_INCOMPLETE, "the run ended early or incompletely (join timeout, failed or non-exact "
                      "rounds, a non-finite loss), a worker whose PS ended early, or an "
                      "internal error"),
    (EXIT_CONFIG, "bad configuration or usage (the message names the flag, value and range)"),
    (EXIT_UNREACHABLE, "worker: the PS was unreachable for --give-up-after seconds or refused "
                       "it for good"),
    (EXIT_SHRUNK, "run: every round completed, but some with fewer than m workers "
                  "(--allow-shrink accepts that)"),
    (EXIT_UNFAITHFUL, "run --fidelity strict: every round completed, but the fidelity verdict "
                      "is unfaithful (live round times or speedups off the simulator's replay "
                      "of the run's own schedule by more than --fidelity-threshold)"),
    (EXIT_STOPPED, "stopped by SIGINT or SIGTERM (run / ps still write summary.json)"),
)

#: The diagnostics logger of the command line (``-v`` / ``-q`` set its level).
log = logging.getLogger("aiogc")


def exit_codes_epilog() -> str:
    """The ``exit codes:`` section of the help texts, from :data:`EXIT_CODES`."""
    import textwrap

    lines = ["exit codes:"]
    lines += [textwrap.fill(text, 79, initial_indent=f"  {code:<4} ", subsequent_indent=" " * 7)
              for code, text in EXIT_CODES]
    return "\n".join(lines)


def _help_with_exit_codes(p: argparse.ArgumentParser) -> None:
    """Make ``p --help`` end with the exit codes (kept as written: one per line)."""
    p.epilog = exit_codes_epilog()
    p.formatter_class = argparse.RawDescriptionHelpFormatter


def add_log_args(p: argparse.ArgumentParser) -> None:
    """``-v`` / ``-q``: more or fewer diagnostics on stderr (stdlib logging)."""
    g = p.add_argument_group("diagnostics")
    g.add_argument("-v", "--verbose", action="count", default=0,
                   help="more diagnostics on stderr (-v: per round, -vv: debug)")
    g.add_argument("-q", "--quiet", action="count", default=0,
                   help="only errors on stderr (no warnings, no progress line)")


def setup_logging(verbose: int = 0, quiet: int = 0) -> None:
    """Route the ``aiogc`` logger to stderr at WARNING, -v INFO, -vv DEBUG, -q ERROR."""
    level = (logging.ERROR if quiet else logging.WARNING if not verbose
             else logging.INFO if verbose == 1 else logging.DEBUG)
    log.setLevel(level)
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        log.addHandler(handler)
    log.propagate = False


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler writing to whatever ``sys.stderr`` is when a record is emitted."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _signal_exit(name: str) -> int:
    """The exit status after a stop signal: 130 for SIGINT and SIGTERM alike."""
    return EXIT_STOPPED


def _port(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port={s!r} is not an integer in [0, 65535]") from None
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"port={v} is out of range: expected an integer in "
                                         "[0, 65535] (0 = any free port)")
    return v


def _writable_dir(flag: str, path: str) -> None:
    """Create ``path`` if needed and check a file can be written there, or raise ConfigError."""
    d = Path(path)
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / ".aiogc-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(flag, path, f"a writable directory ({exc.strerror or exc})") from None


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    return v


def add_config_args(p: argparse.ArgumentParser, *, defaults: RunConfig | None = None) -> None:
    """Flags shared by ``run`` and ``ps`` (everything that defines the run)."""
    d = defaults or RunConfig()
    g = p.add_argument_group("run configuration")
    g.add_argument("--workers", "-m", type=_positive_int, default=d.workers,
                   help="number of workers m (default %(default)s)")
    g.add_argument("--delta", type=_positive_int, default=d.delta,
                   help="chunks per worker δ (default %(default)s)")
    g.add_argument("--ell", type=_positive_int, default=d.n_parts,
                   help="communication split ℓ, 1 <= ℓ <= δ (default %(default)s)")
    g.add_argument("--assignment", default=d.assignment, help="cyclic | fr | regular")
    g.add_argument("--ordering", default=d.ordering, help="optimal | natural | random")
    g.add_argument("--decoding", default=d.decoding, help="B construction: frame | gaussian")
    g.add_argument("--k", type=_positive_int, default=None,
                   help="ignore-stragglers: finished workers to wait for (default m-δ+1)")
    g.add_argument("--mode", default=d.mode, help="exact | approx (approx needs --deadline)")
    g.add_argument("--deadline", type=float, default=None,
                   help="approx mode: seconds after round start at which the PS decodes")
    g.add_argument("--rounds", type=_positive_int, default=d.rounds, help="gradient steps")
    g.add_argument("--seed", type=_positive_int, default=d.seed, help="seed of everything")
    g.add_argument("--task", default=d.task,
                   help="linreg[:samples=N,dim=D,noise=S] | logreg:PATH|builtin | module:factory")
    g.add_argument("--delay", default=d.delay,
                   help="per-chunk compute delay model, e.g. exp:0.02, shiftexp:0.01,0.02, "
                        "pareto:2.5, lognormal:-4,0.5, straggle:0.25,5,exp:0.02, "
                        "fail:0.1,exp:0.02, markov:0.1,0.5,5,exp:0.02, replay:delays.csv, none")
    g.add_argument("--latency", default=d.latency,
                   help="per-frame artificial one-way delay of the workers' frames (same syntax)")
    g.add_argument("--dtype", default=d.dtype, help="payload dtype: float64 | float32")
    g.add_argument("--report-every", type=_positive_int, default=d.report_every,
                   help="report the chunk count after every k chunks")
    g.add_argument("--max-predicted-error", type=float, default=d.max_predicted_error,
                   help="refuse a decoding matrix B whose cond(B)*eps(dtype) exceeds this")
    g.add_argument("--on-ill-conditioned", default=d.on_ill_conditioned,
                   help="raise | warn, when --max-predicted-error is exceeded")
    g.add_argument("--lr", type=float, default=None, help="learning rate (default: the task's)")
    g.add_argument("--round-timeout", type=float, default=None,
                   help="seconds before a round that cannot decode is declared failed "
                        "(default: max(60, 10 x the slowest worker's round in the schedule))")
    g.add_argument("--collect-timeout", type=float, default=None,
                   help="seconds the PS waits for coded vectors after a broadcast "
                        "(default: max(5, 2 x the slowest worker's round in the schedule))")
    g.add_argument("--heartbeat", type=float, default=d.heartbeat_s,
                   help="seconds of silence after which a worker pings")
    g.add_argument("--dead-after", type=float, default=d.dead_after_s,
                   help="seconds of silence after which a peer is declared dead")
    g.add_argument("--join-timeout", type=float, default=None,
                   help="seconds the PS waits for all m workers to join "
                        "(default: max(30, 0.05 x m))")
    g.add_argument("--time-scale", type=_time_scale, default=d.time_scale, metavar="K|auto",
                   help="time dilation: every delay and every timeout above times K, records "
                        "in emulated seconds (emulates a machine K times faster); auto "
                        "(aiogc run): the smallest K this machine keeps faithful, from a "
                        "short calibration run (default 1)")


def _spare_wait(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"spare-wait={s!r}: expected a number in [0, 100]") \
            from None
    if not 0.0 <= v <= 100.0:
        raise argparse.ArgumentTypeError(f"spare-wait={v:g} is out of range: expected a "
                                         "number in [0, 100]")
    return v


def _time_scale(s: str) -> float | str:
    if s == "auto":
        return s
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"time-scale={s!r}: expected auto or a number in [1, 1000]") from None
    if not 1.0 <= v <= 1000.0:
        raise argparse.ArgumentTypeError(f"time-scale={v:g} is out of range: expected auto or "
                                         "a number in [1, 1000]")
    return v


def config_from_args(a: argparse.Namespace, scheme: str) -> RunConfig:
    """The run's configuration; a timeout flag not given takes its workload default
    (:func:`aiogc.config.workload_timeouts`, from the schedule the run draws: same delay law,
    seed and m; as wide as ``scheme``'s largest load)."""
    config = _config_from_flags(a, scheme)
    unset = [f for f in WORKLOAD_TIMEOUTS if getattr(a, _TIMEOUT_FLAGS[f]) is None]
    if not unset:
        return config
    from aiogc.harness.kit import materialise_for

    schedule = materialise_for(config, [scheme])
    derived = workload_timeouts(config, schedule.slowest_round_s())
    return config.replace(**{f: derived[f] for f in unset})


#: RunConfig field -> argparse dest of its flag
_TIMEOUT_FLAGS = {"round_timeout_s": "round_timeout", "collect_timeout_s": "collect_timeout",
                  "join_timeout_s": "join_timeout"}


def _config_from_flags(a: argparse.Namespace, scheme: str) -> RunConfig:
    d = RunConfig()
    return RunConfig(
        scheme=scheme, workers=a.workers, delta=a.delta, n_parts=a.ell,
        assignment=a.assignment, ordering=a.ordering, decoding=a.decoding, k=a.k,
        mode=a.mode, deadline_s=a.deadline, rounds=a.rounds, seed=a.seed, task=a.task,
        delay=a.delay, latency=a.latency, dtype=a.dtype, report_every=a.report_every,
        max_predicted_error=a.max_predicted_error, on_ill_conditioned=a.on_ill_conditioned,
        learning_rate=a.lr,
        round_timeout_s=d.round_timeout_s if a.round_timeout is None else a.round_timeout,
        collect_timeout_s=d.collect_timeout_s if a.collect_timeout is None else a.collect_timeout,
        heartbeat_s=a.heartbeat, dead_after_s=a.dead_after,
        join_timeout_s=d.join_timeout_s if a.join_timeout is None else a.join_timeout,
        time_scale=1.0 if a.time_scale == "auto" else float(a.time_scale),
    )


def read_secret(path: str | None) -> bytes | None:
    """--secret-file, else $AIOGC_SECRET, else None."""
    if path:
        try:
            data = Path(path).read_bytes().strip()
        except OSError as exc:
            raise ConfigError("secret-file", path,
                              f"a readable, non-empty file ({exc.strerror or exc})") from None
        if not data:
            raise ConfigError("secret-file", path, "a non-empty file")
        return data
    env = os.environ.get("AIOGC_SECRET")
    return env.encode() if env else None


# ------------------------------------------------------------------ run


def add_run_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="PS + m workers on this machine, schemes side by side",
                       description="Run the schemes live on loopback over one delay schedule.")
    add_run_args(p)
    p.set_defaults(func=cmd_run)


def add_run_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    p.add_argument("--config", default=None, metavar="FILE.toml",
                   help="read these flags from a TOML file (keys: the long flag names without "
                        "dashes); flags given here override it (aiogc.cli.sweep)")
    p.add_argument("--schemes", default="partial,original",
                   help="comma list of " + ", ".join(scheme_names()))
    p.add_argument("--as", dest="as_", default="processes", help="processes | coroutines")
    p.add_argument("--worker-hosts", type=int, default=0, metavar="N",
                   help="with --as coroutines: run the workers in N worker-host processes "
                        "(coroutines sharing one loop each) instead of beside the PS on its "
                        "loop (default 0)")
    p.add_argument("--out", default=DEFAULT_OUT, help="run directory (default %(default)s)")
    p.add_argument("--spare-wait", type=_spare_wait, default=0.0, metavar="F",
                   help="after the vectors decode, wait up to F x the round's elapsed time for "
                        "one spare vector so the original scheme's redundancy check can "
                        "catch a liar (0: off, the paper's protocol; costs ~+22%% round time "
                        "at F=0.5 on the virtual clock)")
    p.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                   help="record each round's decode error against the uncoded gradient")
    p.add_argument("--loop", default="uvloop", help="uvloop | asyncio")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar (default: when stderr is a terminal)")
    p.add_argument("--plots", action=argparse.BooleanOptionalAction, default=True,
                   help="write PNGs (needs the plot extra)")
    p.add_argument("--backend", default="local",
                   help="local (processes on this machine) | ray (actors on a Ray cluster, "
                        "needs the ray extra; see docs/cluster.md)")
    p.add_argument("--address", default=None,
                   help="--backend ray: auto | HOST:PORT of the cluster's GCS "
                        "(default: start a local Ray instance for this run)")
    p.add_argument("--allow-shrink", action="store_true",
                   help="exit 0 even if some rounds ran with fewer than m workers (the summary "
                        "and stderr still say so; default: exit 5)")
    p.add_argument("--fidelity", choices=("report", "strict"), default="report",
                   help="report: summary.json's fidelity section and a line on stdout; "
                        f"strict: also exit {EXIT_UNFAITHFUL} when the verdict is unfaithful")
    p.add_argument("--fidelity-threshold", type=float, default=0.10, metavar="F",
                   help="the verdict's tolerance: every live/simulated ratio within F of 1 "
                        "(default %(default)s)")


def _live_only(schemes: Sequence[str]) -> None:
    """Refuse schemes the protocol core cannot run (``SchemeSpec.live`` false)."""
    from aiogc.coding.registry import scheme_spec

    for name in schemes:
        if name in scheme_names() and not scheme_spec(name).live:
            raise ConfigError("schemes", name, "a scheme the protocol can run live: " + ", ".join(
                n for n in scheme_names() if scheme_spec(n).live) + f" ({name} runs in "
                "`aiogc simulate --engine fast` only; docs/protocol.md §1.5)")


def cmd_run(a: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    from aiogc.harness.kit import (
        RunInterrupted,
        dump_json,
        format_summary,
        run_complete,
        shrink_line,
    )
    from aiogc.harness.local import run_live
    from aiogc.harness.options import RunOptions

    if getattr(a, "config", None):
        from aiogc.cli.sweep import with_config

        a = with_config(a, argv)
    schemes = [s.strip() for s in a.schemes.split(",") if s.strip()]
    if not schemes:
        raise ConfigError("schemes", a.schemes, "a comma list of scheme names")
    _live_only(schemes)
    base = config_from_args(a, schemes[0])
    _writable_dir("out", a.out)
    progress = (sys.stderr.isatty() if a.progress is None else a.progress) and not a.quiet
    options = RunOptions(mode=a.as_, out_dir=a.out, verify=a.verify, loop=a.loop,
                         progress=progress, argv=argv, plots=a.plots, backend=a.backend,
                         address=a.address, worker_hosts=a.worker_hosts,
                         auto_time_scale=a.time_scale == "auto",
                         fidelity_threshold=a.fidelity_threshold, spare_wait=a.spare_wait)
    try:
        result = run_live(base, schemes, options)
    except RunInterrupted as exc:
        print(format_summary(exc.result.summary))
        print(f"run directory: {a.out}")
        print(f"aiogc run: end reason: {exc.result.end_reason}", file=sys.stderr)
        print(f"aiogc: interrupted by {exc.signal_name}", file=sys.stderr)
        return _signal_exit(exc.signal_name)
    print(format_summary(result.summary))
    print(f"run directory: {a.out}")
    if os.environ.get("AIOGC_PRINT_SUMMARY_JSON"):
        print(dump_json(result.summary))
    print(f"aiogc run: end reason: {result.end_reason}", file=sys.stderr)
    if not run_complete(result.summary, base.rounds, mode=base.mode):
        return EXIT_INCOMPLETE
    shrunk = shrink_line(result.summary)
    if shrunk:
        allowed = " (allowed by --allow-shrink)" if a.allow_shrink else \
            " (--allow-shrink accepts this)"
        print(f"aiogc run: {shrunk}{allowed}", file=sys.stderr)
        if not a.allow_shrink:
            return EXIT_SHRUNK
    fid = result.summary.get("fidelity") or {}
    if a.fidelity == "strict" and fid.get("verdict") != "faithful":
        why = "; ".join(fid.get("reasons") or ["no fidelity measured"])
        print(f"aiogc run: unfaithful (--fidelity strict): {why}", file=sys.stderr)
        return EXIT_UNFAITHFUL
    return EXIT_OK


# ------------------------------------------------------------------ ps / worker


def add_ps_parser(sub: Any) -> None:
    p = sub.add_parser("ps", help="run a parameter server for remote workers",
                       description="Serve one scheme to m workers started with `aiogc worker`.")
    p.add_argument("--host", default="127.0.0.1",
                   help="bind address; a non-loopback address requires a secret")
    p.add_argument("--port", type=_port, default=7733,
                   help="TCP port in [0, 65535] (0 = any free port)")
    p.add_argument("--scheme", default="partial",
                   help=" | ".join(scheme_names()))
    add_config_args(p)
    p.add_argument("--out", default=None, help="directory for summary.json and records")
    p.add_argument("--spare-wait", type=_spare_wait, default=0.0, metavar="F",
                   help="after the vectors decode, wait up to F x the round's elapsed time for "
                        "one spare vector so the original scheme's redundancy check can "
                        "catch a liar (0: off, the paper's protocol; costs ~+22%% round time "
                        "at F=0.5 on the virtual clock)")
    p.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                   help="compute the uncoded gradient too: record each round's decode error "
                        "and refuse to apply a gradient that does not match it (default on)")
    p.add_argument("--secret-file", default=None, help="shared HMAC secret (or $AIOGC_SECRET)")
    p.add_argument("--loop", default="uvloop", help="uvloop | asyncio")
    p.add_argument("--epoch", type=int, default=None,
                   help="PS epoch (default: derived from the clock, so a restart is new)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="one progress line on stderr (default: when stderr is a terminal; "
                        "-v logs every round instead)")
    p.set_defaults(func=cmd_ps)


def _ps_event_handler(scheme_name: str, scheme: Any, recorder: Any,
                      ended: list[str], progress: Any = None) -> Callable[[Any], None]:
    """``aiogc ps``'s event callback: advances the progress line (if ``progress``), logs
    each round (INFO: ``-v``), records it (if ``recorder``), and appends the PS's end reason
    to ``ended``."""
    import time

    from aiogc.core import Finished, RoundCompleted
    from aiogc.protocol.status import describe_end

    loads = tuple(int(x) for x in scheme.loads)
    trigger = not scheme.sends_when_done

    def on_event(ev: Any) -> None:
        if isinstance(ev, RoundCompleted):
            r = ev.record
            if log.isEnabledFor(logging.INFO):
                why = (f" ({describe_end(r.end_reason, r.end_detail)})"
                       if r.status == "failed" and r.end_reason else "")
                log.info("round %d: %s%s in %.4f s", r.round, r.status, why, r.duration_s)
            if progress is not None:
                progress.update()
            if recorder is not None:
                recorder.round(scheme_name, r, m=scheme.m, loads=loads, trigger_scheme=trigger)
        elif isinstance(ev, Finished):
            ended.append(ev.reason)
            if recorder is not None:
                recorder.run_event(t_ns=time.monotonic_ns(), kind="run_end",
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

    from aiogc.harness.kit import (
        Progress,
        build_manifest,
        dump_json,
        format_summary,
        make_ps,
        materialise_for,
        run_complete,
    )
    from aiogc.harness.local import _started
    from aiogc.harness.records import FLUSH_EVERY_S, RunRecorder
    from aiogc.net.drivers import PSServer, run_on

    _live_only([a.scheme])
    config = config_from_args(a, a.scheme)
    secret = read_secret(a.secret_file)
    if a.out:
        _writable_dir("out", a.out)
    schedule = materialise_for(config, [a.scheme])
    epoch = a.epoch if a.epoch is not None else time.time_ns() // 1_000_000 % (2**52)
    ps, _ = make_ps(config, schedule=schedule, verify=a.verify, secret=secret, epoch=epoch,
                    spare_wait=a.spare_wait)
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
    on_event = _ps_event_handler(a.scheme, scheme, recorder, ended, bar)
    server = PSServer(ps, host=a.host, port=a.port, on_event=on_event)

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
        bar.close()
        summary = _ps_summary(a.scheme, ps.records, ended, stopped)
        end_reason = summary["end_reason"]
        if recorder is not None:
            recorder.close(summary)
        elif a.out:
            (Path(a.out) / "summary.json").write_text(dump_json(summary))
    print(format_summary(summary))
    print(f"aiogc ps: end reason: {end_reason}", file=sys.stderr)
    if stopped:
        print(f"aiogc: interrupted by {stopped[0]}", file=sys.stderr)
        return _signal_exit(stopped[0])
    return EXIT_OK if run_complete(summary, config.rounds, mode=config.mode) else EXIT_INCOMPLETE


def add_worker_parser(sub: Any) -> None:
    p = sub.add_parser("worker", help="run one worker (or a block of them) against a PS",
                       description="Connect to `aiogc ps`, reconnecting with backoff. A range "
                                   "of ids runs those workers as coroutines on one loop.")
    p.add_argument("--connect", required=True, help="HOST:PORT of the PS")
    p.add_argument("--id", required=True,
                   help="worker id j in [0, m), or a range A-B (inclusive) of ids to run as "
                        "coroutines in this process (needs the master secret)")
    p.add_argument("--secret-file", default=None, help="shared HMAC secret (or $AIOGC_SECRET)")
    p.add_argument("--worker-key-file", default=None,
                   help="this worker's own key k_j (hex) instead of the master secret")
    p.add_argument("--task", default=None,
                   help="a task this worker may build (plug-ins and data files are never "
                        "taken from the PS otherwise)")
    p.add_argument("--data-dir", action="append", default=None,
                   help="directory whose data files a logreg:PATH task may name (repeatable)")
    p.add_argument("--loop", default="uvloop", help="uvloop | asyncio")
    p.add_argument("--give-up-after", type=float, default=30.0,
                   help="seconds without reaching the PS before exiting with an error")
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
    from aiogc.net.drivers import WorkerClient, run_on

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
    clients = [WorkerClient(w, host, int(port), give_up_after_s=a.give_up_after,
                            setups=setups, on_event=why, progress_events=False)
               for w, why in zip(_worker_cores(a, ids), whys, strict=True)]
    stopped: list[str] = []

    async def main() -> list[BaseException | None]:
        loop = asyncio.get_running_loop()
        tasks = [asyncio.create_task(c.run()) for c in clients]

        def on_signal(name: str) -> None:
            stopped.append(name)
            for t in tasks:
                t.cancel()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig.name)
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = run_on(a.loop, main())
    if stopped:
        print(f"aiogc worker {a.id}: exiting: stopped by {stopped[0]}", file=sys.stderr)
        return _signal_exit(stopped[0])
    return _worker_exit(ids, results, whys)


def _worker_exit(ids: list[int], results: list[BaseException | None], whys: list[Any]) -> int:
    """Say on stderr why each worker ended; the exit code of the worst."""
    code = EXIT_OK
    for j, res, why in zip(ids, results, whys, strict=True):
        me = f"aiogc worker {j}"
        if isinstance(res, ConnectionError):
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


def add_plot_parsers(sub: Any) -> None:
    p = sub.add_parser("plot", help="regenerate the PNGs of a run directory")
    p.add_argument("run_dir")
    p.add_argument("--out", default=None, help="where to write the PNGs (default: run_dir)")
    p.set_defaults(func=cmd_plot)
    q = sub.add_parser("inspect", help="print what happened in one round, frame by frame")
    q.add_argument("run_dir")
    q.add_argument("--round", type=int, required=True)
    q.add_argument("--scheme", default=None)
    q.set_defaults(func=cmd_inspect)


def _run_dir(path: str) -> None:
    if not Path(path).is_dir():
        raise ConfigError("run_dir", path, "an existing run directory")


def cmd_plot(a: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    from aiogc.harness.plots import plot_run

    _run_dir(a.run_dir)
    if a.out is not None:
        _writable_dir("out", a.out)
    for path in plot_run(a.run_dir, a.out):
        print(path)
    return 0


def cmd_inspect(a: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    from aiogc.harness.inspect_run import NoSuchRound, inspect_round

    _run_dir(a.run_dir)
    try:
        print(inspect_round(a.run_dir, a.round, a.scheme))
    except NoSuchRound as exc:
        raise ConfigError(exc.field, exc.value, exc.allowed) from None
    return 0


# ------------------------------------------------------------------ report


def add_report_parser(sub: Any) -> None:
    p = sub.add_parser("report", help="one self-contained HTML page for a run or experiment "
                       "directory")
    p.add_argument("dir", help="run directory (aiogc run --out) or experiment directory")
    p.add_argument("--out", default=None, help="HTML file to write (default: DIR/report.html)")
    p.set_defaults(func=cmd_report)


def cmd_report(a: argparse.Namespace) -> int:
    from aiogc.cli.report import write_report

    print(write_report(a.dir, a.out))
    return 0


# ------------------------------------------------------------------ main


def _check_local_task_files(task: str | None, data_dirs: Sequence[str]) -> None:
    """Fail at once, naming the flag, when a file or directory this worker's own command line
    names is missing (rather than after connecting, where it would look like a PS problem)."""
    from aiogc.training.tasks import task_kind

    for d in data_dirs:
        if not Path(d).expanduser().is_dir():
            raise ConfigError("data-dir", d, "an existing directory on this worker")
    if task is None:
        return
    kind, path = task_kind(task)
    if kind == "logreg-file" and path is not None and not Path(path).expanduser().is_file():
        raise ConfigError("task", task, "a logreg:PATH whose data file exists on this worker")
    module = task.partition(":")[0].strip()
    if kind == "plugin" and module.endswith(".py") and not Path(module).expanduser().is_file():
        raise ConfigError("task", task, "a FILE.py:ATTR plug-in whose file exists on this worker")


# ------------------------------------------------------------------ keys


def add_keys_parser(sub: Any) -> None:
    p = sub.add_parser("keys", help="derive a worker's own key from the run's master secret")
    ksub = p.add_subparsers(dest="keys_command", required=True)
    d = ksub.add_parser("derive", help="print k_j (64 hex digits) for `aiogc worker "
                                       "--worker-key-file`: it authenticates worker j only")
    d.add_argument("--secret-file", default=None,
                   help="the master secret (default: $AIOGC_SECRET)")
    d.add_argument("--worker", type=int, required=True, help="worker id j")
    d.set_defaults(func=cmd_keys_derive)


def cmd_keys_derive(a: argparse.Namespace) -> int:
    from aiogc.protocol.auth import derive_worker_key

    if not 0 <= a.worker < MAX_WORKERS:
        raise ConfigError("worker", a.worker, f"an integer in [0, {MAX_WORKERS - 1}]")
    secret = read_secret(a.secret_file)
    if secret is None:
        raise ConfigError("secret-file", a.secret_file, "a secret file or $AIOGC_SECRET")
    print(derive_worker_key(secret, a.worker).hex())
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    from aiogc._version import __version__

    parser = argparse.ArgumentParser(
        prog="aiogc", description="Gradient coding that leverages partial stragglers.")
    parser.add_argument("--version", action="version", version=f"aiogc {__version__}")
    _help_with_exit_codes(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_parser(sub)
    add_ps_parser(sub)
    add_worker_parser(sub)
    add_keys_parser(sub)
    try:
        from aiogc.cli import simulate as sim_cli

        sim_cli.register(sub)
    except ImportError:  # pragma: no cover - during development only
        pass
    add_plot_parsers(sub)
    add_report_parser(sub)
    from aiogc.cli import sweep as sweep_cli
    from aiogc.cli import whatif as whatif_cli

    sweep_cli.register(sub)
    whatif_cli.register(sub)
    for cmd in sub.choices.values():
        _help_with_exit_codes(cmd)
        add_log_args(cmd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(args_list)
    setup_logging(getattr(args, "verbose", 0), getattr(args, "quiet", 0))
    try:
        rc = args.func(args, args_list) if _takes_argv(args.func) else args.func(args)
        return int(rc)
    except ConfigError as exc:
        print(f"aiogc: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except AiogcError as exc:
        print(f"aiogc: {exc}", file=sys.stderr)
        return EXIT_INCOMPLETE
    except KeyboardInterrupt:
        print("aiogc: interrupted", file=sys.stderr)
        return _signal_exit("SIGINT")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError) as exc:
        # a path the user gave: one line, no traceback
        print(f"aiogc: {_os_error(exc)}", file=sys.stderr)
        return EXIT_CONFIG
    except OSError as exc:
        print(f"aiogc: {_os_error(exc)}", file=sys.stderr)
        return EXIT_INCOMPLETE
    except Exception as exc:
        if os.environ.get("AIOGC_TRACEBACK"):
            raise
        print(f"aiogc: internal error: {type(exc).__name__}: {exc} "
              "(set AIOGC_TRACEBACK=1 to see the traceback)", file=sys.stderr)
        return EXIT_INCOMPLETE


def _os_error(exc: OSError) -> str:
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


def _takes_argv(func: Any) -> bool:
    import inspect

    return len(inspect.signature(func).parameters) >= 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
