"""``aiogc run``: its flags, its command, and its ``--config FILE.toml`` (the file's values as
defaults, the command line on top; the keys are described in :mod:`aiogc.cli.sweep`, which
runs a grid of these), and the Python keywords of :mod:`aiogc.api`, which are the same names.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from aiogc.cli.args import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    EXIT_RECORDS,
    EXIT_SHRUNK,
    EXIT_TASK,
    EXIT_UNFAITHFUL,
    _live_only,
    _signal_exit,
    claim_run_dir,
    config_from_args,
    log,
    new_run_dir,
    settle_ok,
    task_line,
)
from aiogc.config import RunConfig
from aiogc.errors import ConfigError

if TYPE_CHECKING:
    from aiogc.harness.options import RunOptions

__all__ = ["add_run_args", "add_run_parser", "cmd_run", "file_values", "keyword_name",
           "keyword_values", "prepare_run", "with_config"]

#: Flags that are not run settings (never read from a file, never part of a cell's identity).
_NOT_KEYS = {"help", "config", "verbose", "quiet", "format"}


def add_run_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="PS + m workers on this machine, schemes side by side",
                       description="Run the schemes live on loopback over one delay schedule.")
    add_run_args(p)
    p.set_defaults(func=cmd_run)


def add_run_args(p: argparse.ArgumentParser) -> None:
    """``aiogc run``'s flags (:mod:`aiogc.cli.knobs`)."""
    from aiogc.cli.knobs import add_knobs

    add_knobs(p, "run")


def prepare_run(a: argparse.Namespace, argv: Sequence[str] | None = None
                ) -> tuple[RunConfig, list[str], RunOptions]:
    """What ``aiogc run`` (and :func:`aiogc.run`) hands :func:`~aiogc.harness.local.run_live`
    for parsed flags ``a``: the base configuration, the schemes and the run options. It claims
    the run directory (``a.out`` is set to it): a new ``runs/<timestamp>`` when none was
    given, else one without an earlier run unless ``a.overwrite``."""
    from aiogc.harness.options import RunOptions

    schemes = [s.strip() for s in a.schemes.split(",") if s.strip()]
    if not schemes:
        raise ConfigError("schemes", a.schemes, "a comma list of scheme names")
    _live_only(schemes)
    base = config_from_args(a, schemes[0])
    if getattr(a, "pcap", None) is not None and a.backend != "local":
        raise ConfigError("pcap", a.pcap, "the local backend (the capture taps the PS's "
                          "connections in this process)")
    if a.out is None:
        a.out = str(new_run_dir())
    else:
        claim_run_dir(a.out, overwrite=getattr(a, "overwrite", False))
    # -v logs a line per round instead of the bar
    progress = ((sys.stderr.isatty() if a.progress is None else a.progress) and not a.quiet
                and not log.isEnabledFor(logging.INFO))
    options = RunOptions(mode=a.as_, out_dir=a.out, verify=a.verify, loop=a.loop,
                         progress=progress, argv=argv, plots=a.plots, backend=a.backend,
                         address=a.address, worker_hosts=a.worker_hosts,
                         connection_per_worker=getattr(a, "connection_per_worker", False),
                         auto_time_scale=a.time_scale == "auto",
                         fidelity_threshold=a.fidelity_threshold, spare_wait=a.spare_wait,
                         locate=a.locate,
                         pcap=getattr(a, "pcap", None))
    return base, schemes, options


#: The line a Ray run's closing lines start under (:class:`EndLines`).
END_BANNER = "==== aiogc run: the run's outcome (Ray's own lines are above) ===="


class EndLines:
    """``aiogc run``'s closing lines on stderr: collected while the exit status is worked out
    and written together, last. A Ray run has stopped Ray (``ray.shutdown()``) by then; its
    lines come under :data:`END_BANNER`, after a blank line, with the runner's own warnings
    from during the run (``notes``: a worker lost with its node, ...) repeated first, so
    that Ray's retry and shutdown lines cannot bury them.

    Parameters
    ----------
    banner : bool
        Set the lines apart (a Ray run).
    notes : sequence of str
        What the runner said on stderr during the run, repeated (with the banner only).
    """

    def __init__(self, *, banner: bool = False, notes: Sequence[str] = ()) -> None:
        self.banner = banner
        self.lines: list[str] = list(notes) if banner else []

    def add(self, line: str) -> None:
        self.lines.append(line)

    def text(self) -> str:
        """The block as written: each line ends in a newline; with the banner, a blank line
        and the banner first."""
        head = ["", END_BANNER] if self.banner and self.lines else []
        return "".join(f"{line}\n" for line in [*head, *self.lines])

    def emit(self, stream: Any = None) -> None:
        """Write the block to ``stream`` (default ``sys.stderr``) in one write, after what
        this process buffered on stdout and stderr, and flush it."""
        out = sys.stderr if stream is None else stream
        sys.stdout.flush()
        out.flush()
        out.write(self.text())
        out.flush()


def cmd_run(a: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    from aiogc.harness.kit import RunInterrupted, dump_json, format_summary
    from aiogc.harness.local import run_live

    if getattr(a, "config", None):
        a = with_config(a, argv)
    base, schemes, options = prepare_run(a, argv)
    try:
        result = run_live(base, schemes, options)
    except RunInterrupted as exc:
        print(format_summary(exc.result.summary))
        print(f"run directory: {a.out}")
        end = EndLines(banner=a.backend == "ray", notes=exc.result.notes)
        end.add(f"aiogc run: end reason: {exc.result.end_reason}")
        end.add(f"aiogc: interrupted by {exc.signal_name}")
        end.emit()
        return settle_ok(exc.result.summary, a.out, _signal_exit(exc.signal_name))
    print(format_summary(result.summary))
    print(f"run directory: {a.out}")
    if os.environ.get("AIOGC_PRINT_SUMMARY_JSON"):
        print(dump_json(result.summary))
    end = EndLines(banner=a.backend == "ray", notes=result.notes)
    end.add(f"aiogc run: end reason: {result.end_reason}")
    rc = _run_exit(result, base, a, end)
    end.emit()
    return settle_ok(result.summary, a.out, rc)


def _run_exit(result: Any, base: Any, a: argparse.Namespace, end: EndLines) -> int:
    """``aiogc run``'s exit status (said in ``end`` when it is not a plain success)."""
    from aiogc.harness.kit import run_complete, shrink_line

    records_error = result.summary.get("records_error")
    if records_error:
        end.add(f"aiogc run: the run's records could not be written: {records_error}; the run "
                "was stopped (what was written before is kept)")
        return EXIT_RECORDS
    task_error = result.summary.get("task_error")
    if task_error:
        end.add(f"aiogc run: {task_line(task_error)}")
        return EXIT_TASK
    if not run_complete(result.summary, base.rounds, mode=base.mode):
        return EXIT_INCOMPLETE
    shrunk = shrink_line(result.summary)
    if shrunk:
        allowed = " (allowed by --allow-shrink)" if a.allow_shrink else \
            " (--allow-shrink accepts this)"
        end.add(f"aiogc run: {shrunk}{allowed}")
        if not a.allow_shrink:
            return EXIT_SHRUNK
    fid = result.summary.get("fidelity") or {}
    if a.fidelity == "strict" and fid.get("verdict") != "faithful":
        why = "; ".join(fid.get("reasons") or ["no fidelity measured"])
        end.add(f"aiogc run: unfaithful (--fidelity strict): {why}")
        return EXIT_UNFAITHFUL
    return EXIT_OK


# ------------------------------------------------------------------ --config FILE and keywords


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
    if isinstance(act, argparse.BooleanOptionalAction | argparse._StoreTrueAction):
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


def keyword_values(p: argparse.ArgumentParser, knobs: Mapping[str, Any], *,
                   command: str) -> dict[str, Any]:
    """argparse dest -> converted value for Python keyword arguments (:mod:`aiogc.api`).

    A keyword is a file key with ``_`` for ``-`` (``payload_dtype``, ``time_scale``; ``as_``
    for ``as``), so the flags, the file keys and the keywords are one set of names; a list is
    accepted where the flag takes a comma list, a path where it takes one, and None leaves
    the flag's default. TypeError names an unknown keyword and lists
    the known ones; ConfigError names a bad value and what is allowed.
    """
    actions = _key_actions(p)
    out: dict[str, Any] = {}
    for name, value in knobs.items():
        key = name.rstrip("_").replace("_", "-")
        act = actions.get(key)
        if act is None:
            known = ", ".join(sorted(keyword_name(k) for k in actions))
            raise TypeError(f"{command}() got an unexpected keyword argument {name!r} "
                            f"(known: {known})")
        if value is None:  # the flag's default
            continue
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if isinstance(value, list | tuple) and act.type is None and act.nargs != 0:
            value = ",".join(str(v) for v in value)
        out[act.dest] = _convert(keyword_name(key), act, value)
    return out


def keyword_name(key: str) -> str:
    """The Python keyword of file key ``key`` (``payload-dtype`` -> ``payload_dtype``,
    ``as`` -> ``as_``)."""
    import keyword

    name = key.replace("-", "_")
    return f"{name}_" if keyword.iskeyword(name) else name


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
