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
* 4 -- ``worker``: the PS evicted it (``--locate N``: its coded vectors were located as
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

# Re-exported: ``aiogc.cli`` stays the one import for the exit codes and the helpers tests and
# scripts use (they moved to cli/args.py and cli/remote.py).
from aiogc.cli.args import EXIT_CODES as EXIT_CODES
from aiogc.cli.args import (
    EXIT_CONFIG,
    EXIT_INCOMPLETE,
    EXIT_OK,
    EXIT_RECORDS,
    EXIT_SHRUNK,
    EXIT_TASK,
    EXIT_UNFAITHFUL,
    _help_with_exit_codes,
    _signal_exit,
    _writable_dir,
    config_from_args,
    read_secret,
    setup_logging,
)
from aiogc.cli.args import EXIT_EVICTED as EXIT_EVICTED
from aiogc.cli.args import EXIT_STOPPED as EXIT_STOPPED
from aiogc.cli.args import EXIT_UNREACHABLE as EXIT_UNREACHABLE
from aiogc.cli.remote import _ps_event_handler as _ps_event_handler
from aiogc.cli.remote import _ps_summary as _ps_summary
from aiogc.cli.remote import (
    add_ps_parser,
    add_worker_parser,
)
from aiogc.cli.run import add_run_args as add_run_args
from aiogc.cli.run import add_run_parser
from aiogc.cli.run import cmd_run as cmd_run
from aiogc.cli.run import prepare_run as prepare_run
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
    from aiogc.cli.knobs import add_diagnostics

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
        add_diagnostics(cmd)
    return parser


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser of ``aiogc NAME`` (its flags, defaults and help as the command has them)."""
    parser = build_parser()
    for act in parser._actions:
        if isinstance(act, argparse._SubParsersAction):
            return act.choices[name]  # type: ignore[no-any-return]
    raise KeyError(name)  # pragma: no cover - build_parser always adds the commands


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
