"""``aiogc run``: its flags, its command, and its ``--config FILE.toml`` (the file's values as
defaults, the command line on top; the keys are described in :mod:`aiogc.cli.sweep`, which
runs a grid of these).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from aiogc.cli.args import (
    DEFAULT_OUT,
    EXIT_INCOMPLETE,
    EXIT_OK,
    EXIT_SHRUNK,
    EXIT_UNFAITHFUL,
    _live_only,
    _signal_exit,
    _writable_dir,
    add_config_args,
    add_spare_wait_arg,
    config_from_args,
)
from aiogc.coding.registry import scheme_names
from aiogc.errors import ConfigError

__all__ = ["add_run_args", "add_run_parser", "cmd_run", "file_values", "with_config"]

#: Flags that are not run settings (never read from a file, never part of a cell's identity).
_NOT_KEYS = {"help", "config"}



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
        run_complete,
        shrink_line,
    )
    from aiogc.harness.local import run_live
    from aiogc.harness.options import RunOptions

    if getattr(a, "config", None):
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




# ------------------------------------------------------------------ --config FILE


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aiogc run", add_help=False)
    add_run_args(p)
    return p


def _key_actions(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """File key (long flag without dashes) -> its argparse action."""
    out: dict[str, argparse.Action] = {}
    for act in p._actions:
        longs = [o for o in act.option_strings if o.startswith("--")]
        if longs and longs[0][2:] not in _NOT_KEYS:
            out[longs[0][2:]] = act
    return out


def _convert(key: str, act: argparse.Action, value: Any) -> Any:
    """The value as the flag would hold it, or ConfigError(key, value, allowed)."""
    if isinstance(act, argparse.BooleanOptionalAction):
        if not isinstance(value, bool):
            raise ConfigError(key, value, "true or false")
        return value
    if key == "schemes" and isinstance(value, list) and all(isinstance(v, str) for v in value):
        value = ",".join(value)
    if act.type is None:
        if not isinstance(value, str):
            raise ConfigError(key, value, "a string")
        v: Any = value
    else:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(key, value, f"a value --{key} accepts ({_type_name(act)})")
        try:
            v = act.type(value if isinstance(value, str) else str(value))  # type: ignore[operator]
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(key, value, str(exc)) from None
        except (TypeError, ValueError):
            raise ConfigError(key, value, f"a value --{key} accepts ({_type_name(act)})"
                              ) from None
    if act.choices is not None and v not in act.choices:
        raise ConfigError(key, value, "one of " + ", ".join(map(str, act.choices)))
    return v


def _type_name(act: argparse.Action) -> str:
    name = getattr(act.type, "__name__", "value").lstrip("_")
    return {"positive_int": "an integer", "int": "an integer", "float": "a number",
            "time_scale": "auto or a number in [1, 1000]"}.get(name, name)


def file_values(data: Mapping[str, Any], actions: Mapping[str, argparse.Action],
                *, prefix: str = "") -> dict[str, Any]:
    """argparse dest -> converted value for every key of ``data`` (ConfigError on the first
    unknown key or bad value)."""
    out: dict[str, Any] = {}
    for raw, value in data.items():
        key = raw.replace("_", "-")
        act = actions.get(key)
        if act is None:
            raise ConfigError(f"{prefix}{raw}", value,
                              "one of the keys " + ", ".join(sorted(actions)))
        out[act.dest] = _convert(f"{prefix}{raw}", act, value)
    return out


def with_config(a: argparse.Namespace, argv: Sequence[str] | None) -> argparse.Namespace:
    """``aiogc run --config FILE``: the file's values as defaults, the command line on top."""
    from aiogc.harness.sweep import load_toml

    p = _run_parser()
    data = load_toml(a.config)
    if "grid" in data:
        raise ConfigError("grid", data["grid"], "no [grid] table in aiogc run --config "
                          "(use aiogc sweep FILE)")
    p.set_defaults(**file_values(data, _key_actions(p)))
    args = list(argv or [])
    run_argv = args[args.index("run") + 1:] if "run" in args else args
    return p.parse_args(run_argv)


