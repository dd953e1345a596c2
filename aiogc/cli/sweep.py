"""Experiments as files: ``aiogc run --config FILE.toml`` and ``aiogc sweep FILE.toml``.

Keys
----
A file's top-level keys are the **long flag names of** ``aiogc run`` **without the leading
dashes**; ``-`` and ``_`` are interchangeable (``time-scale = 4`` or ``time_scale = 4``,
``as = "coroutines"``, ``ell = 2``, ``verify = false``). ``schemes`` may be a list of names.
Values have the flag's type (a TOML integer or a string the flag would accept). A flag given on
the command line overrides the file. An unknown key, a value of the wrong type or out of range
fails with a configuration error naming the key, the value and what is allowed.

Sweeps
------
``aiogc sweep FILE.toml`` takes the same keys plus a ``[grid]`` table of lists: every
combination of the grid's values is one run (a *cell*) with the top-level keys as the base,
written to ``OUT/<cell name>`` (``workers=4__delay=exp_0.02``; see
:func:`aiogc.harness.sweep.expand_grid`). ``out`` is the sweep directory (default
``runs/<file stem>``; ``--out`` overrides it). Run again, the sweep skips the complete cells and
re-runs the ones cut short (:mod:`aiogc.harness.sweep`), then writes ``OUT/results.csv`` (one row
per cell and scheme; ``pandas.read_csv`` needs no options). Example::

    rounds = 20
    as = "coroutines"
    schemes = ["partial", "original"]
    task = "linreg:samples=400,dim=10"

    [grid]
    workers = [6, 8]
    delay = ["exp:0.002", "straggle:0.25,5,exp:0.002", "pareto:2.5,0.0012"]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aiogc.errors import ConfigError

#: Flags that are not run settings (never read from a file, never part of a cell's identity).
_NOT_KEYS = {"help", "config", "verbose", "quiet", "format"}
#: Namespace entries that are not part of a cell's identity (cell.json ``params``).
_NOT_PARAMS = {"out", "overwrite", "progress", "config", "func"}
#: Keys a grid may not vary.
_NOT_GRID = {"out", "overwrite", "progress", "backend", "address"}


def _run_parser() -> argparse.ArgumentParser:
    from aiogc.cli import add_run_args

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


# ------------------------------------------------------------------ sweep


def register(sub: Any) -> None:
    p = sub.add_parser("sweep", help="run the grid of a TOML experiment file, resumably",
                       description="Run every cell of FILE's [grid] (skipping complete cells), "
                                   "then write OUT/results.csv. Keys: the long flags of "
                                   "`aiogc run` without dashes.")
    p.add_argument("file", help="experiment file (TOML)")
    p.add_argument("--out", default=None,
                   help="sweep directory (default: the file's out, else runs/<file stem>)")
    p.add_argument("--rerun-failed", action="store_true",
                   help="also re-run cells that finished with failed rounds")
    p.add_argument("--list", action="store_true", help="list the cells and their state only")
    p.set_defaults(func=cmd_sweep)


def plan(path: str, out: str | None) -> tuple[argparse.ArgumentParser, dict[str, Any],
                                                 list[Any], Path]:
    """(run parser, base values by dest, cells with converted values, sweep directory)."""
    from aiogc.harness.sweep import Cell, expand_grid, load_toml

    data = load_toml(path)
    grid = data.pop("grid", {})
    if not isinstance(grid, dict):
        raise ConfigError("grid", grid, "a [grid] table of lists")
    p = _run_parser()
    actions = _key_actions(p)
    base = file_values(data, actions)
    for raw in grid:
        if raw.replace("_", "-") in _NOT_GRID:
            raise ConfigError(f"grid.{raw}", grid[raw], "a run setting (not one of "
                              + ", ".join(sorted(_NOT_GRID)) + ")")
    cells = []
    for cell in expand_grid(grid):
        conv = file_values(cell.values, actions, prefix="grid.")
        cells.append((Cell(cell.name, dict(cell.values)), conv))
    sweep_dir = Path(out or base.pop("out", None) or Path("runs") / Path(path).stem)
    base.pop("out", None)
    return p, base, cells, sweep_dir


def cmd_sweep(a: argparse.Namespace, argv: Sequence[str] | None = None,
              *, on_cell_done: Callable[[Any, Path], None] | None = None) -> int:
    from aiogc.cli import cmd_run
    from aiogc.cli.args import EXIT_STOPPED, _config_from_flags, _writable_dir
    from aiogc.harness.sweep import ResumeRule, cell_complete, run_sweep

    p, base, cells, sweep_dir = plan(a.file, a.out)
    by_name = {c.name: conv for c, conv in cells}
    p.set_defaults(**base)
    defaults = vars(p.parse_args([]))

    def params_of(cell: Any) -> dict[str, Any]:
        d = {**defaults, **by_name[cell.name]}
        return {k: v for k, v in d.items() if k not in _NOT_PARAMS}

    # every cell's configuration is checked before the first one runs
    schemes = [s.strip() for s in str(defaults["schemes"]).split(",") if s.strip()]
    for cell, _ in cells:
        ns = argparse.Namespace(**params_of(cell))
        for s in schemes:
            _config_from_flags(ns, s)
    if a.list:
        for cell, _ in cells:
            done = cell_complete(sweep_dir / cell.name, params_of(cell), schemes)
            print(f"{'complete' if done else 'to run  '}  {cell.name}")
        return 0
    _writable_dir("out", str(sweep_dir))
    if Path(a.file).resolve() != (sweep_dir / "sweep.toml").resolve():
        shutil.copyfile(a.file, sweep_dir / "sweep.toml")

    def run_cell(cell: Any, d: Path) -> None:
        # a cell cut short is re-run in place: its earlier files go (overwrite)
        ns = argparse.Namespace(**params_of(cell), out=str(d), overwrite=True, progress=False,
                                config=None)
        rc = cmd_run(ns, ["sweep", a.file, "--cell", cell.name])
        if rc == EXIT_STOPPED:
            raise KeyboardInterrupt(f"cell {cell.name} stopped")

    rounds = int(defaults["rounds"])
    res = run_sweep(sweep_dir, [c for c, _ in cells], params_of, run_cell, schemes,
                    resume=ResumeRule(rerun_failed=a.rerun_failed, rounds=rounds),
                    on_cell_done=on_cell_done,
                    log=lambda s: print(s, file=sys.stderr, flush=True))
    print(f"sweep: {len(res.ran)} cell(s) run, {len(res.skipped)} skipped as complete")
    print(f"results: {res.results}")
    return 0
