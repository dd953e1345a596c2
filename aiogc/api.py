"""The Python front door: :func:`simulate`, :func:`run` / :func:`run_async`, :func:`sweep`,
:func:`experiment` and :func:`load_run`, re-exported as ``aiogc.simulate`` and so on.

Every keyword argument is a flag of the matching command with ``_`` for ``-``
(``aiogc.run(workers=8, delta=3, ell=1, payload_dtype="float16", time_scale=4)`` is
``aiogc run --workers 8 --delta 3 --ell 1 --payload-dtype float16 --time-scale 4``; ``as_``
for ``--as``); its default, its validation and its help are the flag's (``aiogc run --help``),
because the arguments go through the command's own parser. A list is accepted where the flag
takes a comma list (``schemes=["partial", "original"]``).

Each call returns a result whose ``.dir`` is where it wrote its files (a run directory, a sweep
directory, an experiment directory; ``None`` for a simulation without ``out``) and whose
``.to_pandas()`` gives its table as a DataFrame (pandas is optional: without it the call says
how to install it; ``.rows`` holds the same table as dicts).

``run`` works inside a running event loop (a Jupyter notebook): it then runs in a worker
thread with a loop of its own and blocks until done; ``await aiogc.run_async(...)`` does the
same without blocking the caller's loop.

A run in progress stops cleanly on ``stop=aiogc.RunStop()`` (call ``.stop(reason)`` from any
thread, a cell, or an ``on_round(scheme, record)`` callback), or by cancelling the task of
``run_async``: the workers are told to shut down, no further scheme starts, what finished is
written, and ``summary.json`` says ``"stopped by the caller: REASON"``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiogc.harness.options import RunStop
from aiogc.harness.records import load_run_tables

if TYPE_CHECKING:
    from aiogc.core import RoundRecord
    from aiogc.harness.kit import RunResult as LiveResult
    from aiogc.harness.loaders import RunTables

__all__ = ["ExperimentResult", "RunResult", "RunStop", "SimResult", "SweepResult",
           "experiment", "load_run", "run", "run_async", "simulate", "sweep"]

#: ``on_round(scheme, record)``: called after each completed round of a live run.
OnRound = Callable[[str, "RoundRecord"], None]


def _pandas(what: str) -> Any:
    try:
        import pandas as pd
    except ImportError:
        raise ImportError(f"{what}.to_pandas() needs pandas: pip install pandas (or use "
                          f"{what}.rows, the same table as a list of dicts)") from None
    return pd


def _namespace(command: str, knobs: Mapping[str, Any], *, caller: str) -> argparse.Namespace:
    """``aiogc COMMAND``'s parsed flags with no flag given, then ``knobs`` applied through
    the flags' own types and checks (:func:`aiogc.cli.run.keyword_values`)."""
    from aiogc.cli import command_parser
    from aiogc.cli.run import keyword_values

    p = command_parser(command)
    ns = p.parse_args([])
    for dest, value in keyword_values(p, knobs, command=caller).items():
        setattr(ns, dest, value)
    return ns


# ------------------------------------------------------------------ simulate


@dataclass(frozen=True)
class SimResult:
    """What :func:`simulate` returns.

    Attributes
    ----------
    summary : dict
        What ``aiogc simulate`` prints as JSON: ``config``, ``results`` (one row per scheme,
        or per scheme and deadline in approximate mode), ``speedup``.
    dir : Path or None
        Where ``summary.json`` and ``results.csv`` were written (``out``), else None.
    """

    summary: dict[str, Any]
    dir: Path | None = None

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The results table, one dict per row."""
        return list(self.summary["results"])

    @property
    def speedup(self) -> float | None:
        """Mean completion of ``original`` over ``partial``'s (None without both)."""
        v = self.summary.get("speedup")
        return None if v is None else float(v)

    def to_pandas(self) -> Any:
        """The results table as a DataFrame (one row per scheme / deadline)."""
        return _pandas("SimResult").DataFrame(self.rows)


def simulate(**knobs: Any) -> SimResult:
    """Simulate rounds of several schemes on one delay schedule (``aiogc simulate``).

    Parameters
    ----------
    **knobs
        ``aiogc simulate``'s flags as keywords, its defaults when left out: ``workers`` (20),
        ``delta`` (4), ``ell`` (1), ``schemes`` (partial, original), ``delay`` (exp:1.0),
        ``rounds`` (500), ``seed`` (1), ``mode``, ``deadline``, ``engine``, ``dim``,
        ``latency``, ``bandwidth``, ``ordering``, ``decoding``, ``payload_dtype``,
        ``worker_speeds``, ``chunk_sizes``, ``out`` (a directory to write, default none)...

    Returns
    -------
    SimResult
    """
    from aiogc.cli.simulate import simulate_from_args

    ns = _namespace("simulate", knobs, caller="aiogc.simulate")
    summary = simulate_from_args(ns)
    return SimResult(summary, None if ns.out is None else Path(ns.out))


# ------------------------------------------------------------------ run


@dataclass(frozen=True)
class RunResult:
    """What :func:`run` returns.

    Attributes
    ----------
    dir : Path
        The run directory (``aiogc.load_run(dir)`` reads it back).
    summary : dict
        ``summary.json`` as written.
    end_reason : str
        Why the run ended ("all rounds done" when it ran to its end; "stopped by the caller:
        REASON" after a :class:`RunStop`).
    complete : bool
        Every requested round of every scheme completed (exit status 0 of ``aiogc run``,
        shrinking aside).
    live : aiogc.harness.kit.RunResult
        The runner's own result (round records with their gradients, the schedule).
    stopped : str or None
        The reason given to the run's :class:`RunStop` when it stopped the run, else None.
    """

    dir: Path
    summary: dict[str, Any]
    end_reason: str
    complete: bool
    live: LiveResult = field(repr=False)
    stopped: str | None = None

    def tables(self) -> RunTables:
        """The run directory as tables (``aiogc.load_run(self.dir)``)."""
        return load_run(self.dir)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """``rounds.csv`` as dicts, one per scheme and round."""
        from aiogc.harness.loaders import load_run_tables

        rounds: list[dict[str, Any]] = load_run_tables(self.dir, frames=False,
                                                      pandas=False).rounds
        return rounds

    def to_pandas(self) -> Any:
        """``rounds.csv`` as a DataFrame (one row per scheme and round)."""
        _pandas("RunResult")
        from aiogc.harness.loaders import load_run_tables

        return load_run_tables(self.dir, frames=False, pandas=True).rounds


def _run_blocking(knobs: Mapping[str, Any], stop: RunStop | None,
                  on_round: OnRound | None) -> RunResult:
    from dataclasses import replace

    from aiogc.cli import prepare_run
    from aiogc.harness.kit import RunInterrupted, run_complete
    from aiogc.harness.local import run_live

    if stop is not None and not isinstance(stop, RunStop):
        raise TypeError(f"aiogc.run: stop= takes an aiogc.RunStop, not {type(stop).__name__}")
    if on_round is not None and not callable(on_round):
        raise TypeError("aiogc.run: on_round= takes a callable (scheme, record)")
    ns = _namespace("run", knobs, caller="aiogc.run")
    base, schemes, options = prepare_run(ns, _argv(knobs))
    options = replace(options, stop=stop, on_round=on_round)
    stopped: str | None = None
    try:
        result = run_live(base, schemes, options)
    except RunInterrupted as exc:
        if stop is None or exc.signal_name != stop.label:
            raise  # a signal (Ctrl-C in a script): as on the command line
        result, stopped = exc.result, stop.reason
    return RunResult(dir=Path(ns.out), summary=result.summary, end_reason=result.end_reason,
                     complete=run_complete(result.summary, base.rounds, mode=base.mode),
                     live=result, stopped=stopped)


def _argv(knobs: Mapping[str, Any]) -> list[str]:
    """The call as the manifest records it (``argv``)."""
    return ["aiogc.run", *(f"{k}={v!r}" for k, v in knobs.items())]


def run(*, stop: RunStop | None = None, on_round: OnRound | None = None,
        **knobs: Any) -> RunResult:
    """Run the schemes live: a PS and m workers over loopback TCP (``aiogc run``).

    Inside a running event loop (a notebook) the run goes to a worker thread with a loop of
    its own, and this call waits for it; from a coroutine prefer ``await run_async(...)``.

    Parameters
    ----------
    stop : RunStop, optional
        A handle whose ``stop(reason)`` (from any thread, or from ``on_round``) ends the run
        early and cleanly: the running scheme's PS tells its workers to shut down, no further
        scheme starts, the finished rounds are written with ``summary.json`` (``end_reason``
        "stopped by the caller: REASON", ``ok`` false), and this call returns them
        (``RunResult.stopped`` is REASON).
    on_round : callable, optional
        ``on_round(scheme, record)`` after each completed round
        (:class:`aiogc.core.RoundRecord`, times in emulated seconds). It runs on the run's
        event loop between rounds: keep it short.
    **knobs
        ``aiogc run``'s flags as keywords, its defaults when left out: ``workers`` (8),
        ``delta``, ``ell``, ``schemes`` (partial, original), ``delay``, ``rounds``, ``seed``,
        ``task``, ``lr``, ``payload_dtype``, ``as_`` (processes), ``time_scale``, ``out``
        (default: a new ``runs/<timestamp>``, ``runs/latest`` pointing at it), ``overwrite``,
        ``plots``...

    Returns
    -------
    RunResult

    Raises
    ------
    aiogc.errors.ConfigError
        A bad value (the message names it and what is allowed), or an ``out`` holding an
        earlier run without ``overwrite=True``.
    TypeError
        An unknown keyword (the message lists the known ones).
    """
    try:
        asyncio.get_running_loop()
        in_a_loop = True
    except RuntimeError:
        in_a_loop = False
    if not in_a_loop:
        return _run_blocking(knobs, stop, on_round)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="aiogc-run") as pool:
        return pool.submit(_run_blocking, dict(knobs), stop, on_round).result()


async def run_async(*, stop: RunStop | None = None, on_round: OnRound | None = None,
                    **knobs: Any) -> RunResult:
    """:func:`run` for a coroutine: the run goes to a worker thread with its own event loop,
    and the caller's loop keeps running meanwhile.

    Cancelling the task that awaits it stops the run as ``stop.stop("run_async
    cancelled")`` would (a fresh :class:`RunStop` when none was given): the cancellation
    waits until the workers were told to shut down and the finished rounds are written, then
    propagates (``summary.json`` says "stopped by the caller: run_async cancelled").
    """
    handle = stop if stop is not None else RunStop()
    job = asyncio.ensure_future(asyncio.to_thread(_run_blocking, dict(knobs), handle, on_round))
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        handle.stop("run_async cancelled")
        # the run ends at its next step and writes what finished; then the cancellation
        # goes on (a result or an error of the stopped run is not the caller's any more)
        await asyncio.wait({job})
        if not job.cancelled():
            job.exception()  # retrieved: no "exception was never retrieved" warning
        raise


# ------------------------------------------------------------------ sweep


@dataclass(frozen=True)
class SweepResult:
    """What :func:`sweep` returns.

    Attributes
    ----------
    dir : Path
        The sweep directory: ``sweep.toml``, one run directory per cell, ``results.csv``.
    ran, skipped : list of str
        The cells run by this call, and those found complete on disk.
    """

    dir: Path
    ran: list[str]
    skipped: list[str]

    @property
    def rows(self) -> list[dict[str, Any]]:
        """``results.csv`` as dicts (strings as written), one per cell and scheme."""
        with (self.dir / "results.csv").open(newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(fh))

    def to_pandas(self) -> Any:
        """``results.csv`` as a DataFrame (one row per cell and scheme)."""
        return _pandas("SweepResult").read_csv(self.dir / "results.csv")


def _toml_value(v: Any, where: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x, where) for x in v) + "]"
    from aiogc.errors import ConfigError

    raise ConfigError(where, v, "a string, number, boolean or list of them")


def _file_key(name: str) -> str:
    """The experiment-file key of keyword ``name`` (``payload_dtype`` -> ``payload-dtype``)."""
    return name.rstrip("_").replace("_", "-")


def sweep_toml(grid: Mapping[str, Sequence[Any]], knobs: Mapping[str, Any]) -> str:
    """The experiment file (``aiogc sweep FILE``) of ``grid`` over the base ``knobs``."""
    from aiogc.errors import ConfigError

    lines = [f"{k} = {_toml_value(v, k)}" for k, v in knobs.items()]
    lines += ["", "[grid]"]
    for k, values in grid.items():
        if not isinstance(values, list | tuple) or not values:
            raise ConfigError(f"grid.{k}", values, "a non-empty list of values")
        lines.append(f"{k} = {_toml_value(list(values), 'grid.' + k)}")
    return "\n".join(lines) + "\n"


def sweep(grid: Mapping[str, Sequence[Any]], **knobs: Any) -> SweepResult:
    """Run every combination of ``grid`` (``aiogc sweep``): a resumable grid of live runs.

    Parameters
    ----------
    grid : mapping of keyword -> list
        The values each keyword takes (``{"workers": [6, 8], "delay": ["exp:0.002",
        "pareto:2.5,0.0012"]}``); every combination is one cell, one run directory.
    **knobs
        The base of every cell: :func:`run`'s keywords. ``out``: the sweep directory
        (default a new ``runs/<timestamp>``); called again with the same ``out``, complete
        cells are skipped and the ones cut short re-run.

    Returns
    -------
    SweepResult
    """
    from aiogc.cli import command_parser
    from aiogc.cli.args import new_run_dir
    from aiogc.cli.run import keyword_values
    from aiogc.harness.sweep import load_toml

    knobs = dict(knobs)
    out = knobs.pop("out", None)
    # the names and the base values are checked before anything is written; every cell's
    # values are checked by the sweep before its first cell runs
    p = command_parser("run")
    keyword_values(p, knobs, command="aiogc.sweep")
    keyword_values(p, {k: v[0] for k, v in grid.items() if isinstance(v, list | tuple) and v},
                   command="aiogc.sweep")
    text = sweep_toml({_file_key(k): v for k, v in grid.items()},
                      {_file_key(k): v for k, v in knobs.items()})
    d = Path(out) if out is not None else new_run_dir()
    d.mkdir(parents=True, exist_ok=True)
    path = d / "sweep.toml"
    path.write_text(text, encoding="utf-8")
    load_toml(path)  # what was written reads back
    return _sweep_file(path, d)


def _sweep_file(path: Path, d: Path) -> SweepResult:
    from aiogc.cli.sweep import cmd_sweep

    ran: list[str] = []
    ns = argparse.Namespace(file=str(path), out=str(d), rerun_failed=False, list=False)
    res = cmd_sweep(ns, ["sweep", str(path)], on_cell_done=lambda cell, _d: ran.append(cell.name))
    if res != 0:  # pragma: no cover - cmd_sweep raises on every failure it knows
        raise RuntimeError(f"aiogc.sweep: the sweep ended with status {res}")
    with (d / "results.csv").open(newline="", encoding="utf-8") as fh:
        cells = list(dict.fromkeys(r["cell"] for r in csv.DictReader(fh)))
    return SweepResult(dir=d, ran=ran, skipped=[c for c in cells if c not in ran])


# ------------------------------------------------------------------ experiment


@dataclass(frozen=True)
class ExperimentResult:
    """What :func:`experiment` returns.

    Attributes
    ----------
    name : str
    dir : Path
        Holds ``NAME.csv`` (the table), ``NAME.json`` (command, grid, headline), ``NAME.png``.
    headline : dict
        The experiment's headline figures (also in ``NAME.json``).
    """

    name: str
    dir: Path
    headline: dict[str, Any]

    @property
    def rows(self) -> list[dict[str, Any]]:
        """``NAME.csv`` as dicts, typed as the experiment wrote them."""
        from aiogc.experiments._common import read_csv

        return list(read_csv(self.dir / f"{self.name}.csv"))

    def to_pandas(self) -> Any:
        """``NAME.csv`` as a DataFrame."""
        return _pandas("ExperimentResult").read_csv(self.dir / f"{self.name}.csv")


def experiment(name: str, *, out: str | Path | None = None, quick: bool = False,
               seed: int = 1, progress: bool | None = None) -> ExperimentResult:
    """Run a documented experiment (``aiogc experiment NAME``; docs/experiments.md).

    Parameters
    ----------
    name : str
        One of ``aiogc.experiments.EXPERIMENTS``.
    out : path, optional
        Output directory (default a new ``runs/<timestamp>``).
    quick : bool
        The small grid.
    seed : int
    progress : bool, optional
        Cells done and an ETA on stderr (default: when stderr is a terminal).
    """
    import sys

    from aiogc.cli.args import new_run_dir
    from aiogc.experiments import run_experiment

    d = Path(out) if out is not None else new_run_dir()
    show = sys.stderr.isatty() if progress is None else progress
    head = run_experiment(name, d, quick=quick, seed=seed, progress=show)
    return ExperimentResult(name=name, dir=d, headline=head)


# ------------------------------------------------------------------ load_run


#: ``aiogc.load_run(DIR)``: a run directory as tables (rounds, workers, reports, frames,
#: delays; DataFrames when pandas is installed), :func:`aiogc.harness.records.load_run_tables`.
load_run = load_run_tables
