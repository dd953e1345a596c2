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
* 4 -- ``worker``: the PS evicted it (issue 21, ``--locate N``: its coded vectors were located as
  inconsistent in N rounds; an authenticated ``error`` ``evicted``, its key refused for the rest
  of the run): ``aiogc worker J: exiting: evicted by the PS (...)``.
* 5 -- ``run``: every round completed, but some ran with fewer than m workers (a worker left
  or never joined; ``summary.json`` ``shrunk`` / ``membership`` and a stderr line say which);
  ``--allow-shrink`` accepts that (exit 0).
* 130 -- stopped by SIGINT or SIGTERM (``aiogc: interrupted by ...`` on stderr); ``run`` /
  ``ps`` still write ``summary.json`` with the ``end_reason``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiogc.cli.args import (
    DEFAULT_OUT,
    EXIT_CONFIG,
    EXIT_INCOMPLETE,
    EXIT_OK,
    EXIT_RECORDS,
    EXIT_SHRUNK,
    EXIT_TASK,
    EXIT_UNFAITHFUL,
    _help_with_exit_codes,
    _live_only,
    _signal_exit,
    _writable_dir,
    add_config_args,
    add_log_args,
    add_spare_wait_arg,
    config_from_args,
    read_secret,
    settle_ok,
    setup_logging,
    task_line,
)

# Re-exported: ``aiogc.cli`` stays the one import for the exit codes and the helpers tests and
# scripts use (they moved to cli/args.py and cli/remote.py).
from aiogc.cli.args import EXIT_CODES as EXIT_CODES
from aiogc.cli.args import EXIT_EVICTED as EXIT_EVICTED
from aiogc.cli.args import EXIT_STOPPED as EXIT_STOPPED
from aiogc.cli.args import EXIT_UNREACHABLE as EXIT_UNREACHABLE
from aiogc.cli.remote import _ps_event_handler as _ps_event_handler
from aiogc.cli.remote import _ps_summary as _ps_summary
from aiogc.cli.remote import (
    add_ps_parser,
    add_worker_parser,
)
from aiogc.coding.registry import scheme_names
from aiogc.config import MAX_WORKERS
from aiogc.errors import AiogcError, ConfigError

#: What ``from aiogc.cli import ...`` keeps offering since the split (tests and scripts use these).
__all__ = [
    "EXIT_CODES",
    "EXIT_CONFIG",
    "EXIT_EVICTED",
    "EXIT_INCOMPLETE",
    "EXIT_OK",
    "EXIT_RECORDS",
    "EXIT_SHRUNK",
    "EXIT_STOPPED",
    "EXIT_TASK",
    "EXIT_UNFAITHFUL",
    "EXIT_UNREACHABLE",
    "_ps_event_handler",
    "_ps_summary",
    "add_run_args",
    "build_parser",
    "cmd_run",
    "config_from_args",
    "main",
    "setup_logging",
]

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
    p.add_argument("--connection-per-worker", action="store_true",
                   help="with --as coroutines and no --worker-hosts: one connection and loop "
                        "timer per worker, instead of one shared connection for all of them "
                        "(docs/protocol.md 2.6)")
    p.add_argument("--out", default=DEFAULT_OUT, help="run directory (default %(default)s)")
    p.add_argument("--pcap", default=None, metavar="FILE",
                   help="write the PS's frames to FILE (pcap, synthetic TCP/IPv4 flows; "
                        "decode with tools/aiogc.lua; local backend only)")
    add_spare_wait_arg(p)
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




def cmd_run(a: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    from aiogc.harness.kit import (
        RunInterrupted,
        dump_json,
        format_summary,
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
                         connection_per_worker=getattr(a, "connection_per_worker", False),
                         auto_time_scale=a.time_scale == "auto",
                         fidelity_threshold=a.fidelity_threshold, spare_wait=a.spare_wait,
                         locate=a.locate,
                         pcap=getattr(a, "pcap", None))
    if options.pcap is not None and a.backend != "local":
        raise ConfigError("pcap", a.pcap, "the local backend (the capture taps the PS's "
                          "connections in this process)")
    try:
        result = run_live(base, schemes, options)
    except RunInterrupted as exc:
        print(format_summary(exc.result.summary))
        print(f"run directory: {a.out}")
        print(f"aiogc run: end reason: {exc.result.end_reason}", file=sys.stderr)
        print(f"aiogc: interrupted by {exc.signal_name}", file=sys.stderr)
        return settle_ok(exc.result.summary, a.out, _signal_exit(exc.signal_name))
    print(format_summary(result.summary))
    print(f"run directory: {a.out}")
    if os.environ.get("AIOGC_PRINT_SUMMARY_JSON"):
        print(dump_json(result.summary))
    print(f"aiogc run: end reason: {result.end_reason}", file=sys.stderr)
    return settle_ok(result.summary, a.out, _run_exit(result, base, a))


def _run_exit(result: Any, base: Any, a: argparse.Namespace) -> int:
    """``aiogc run``'s exit status (said on stderr when it is not a plain success)."""
    from aiogc.harness.kit import run_complete, shrink_line

    records_error = result.summary.get("records_error")
    if records_error:
        print(f"aiogc run: the run's records could not be written: {records_error}; the run "
              "was stopped (what was written before is kept)", file=sys.stderr)
        return EXIT_RECORDS
    task_error = result.summary.get("task_error")
    if task_error:
        print(f"aiogc run: {task_line(task_error)}", file=sys.stderr)
        return EXIT_TASK
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
        from aiogc.harness.records import RecordsError

        if isinstance(exc, RecordsError):
            print(f"aiogc: the run's records could not be written: {exc}", file=sys.stderr)
            return EXIT_RECORDS
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
