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
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aiogc.cli.run import _key_actions, _run_parser, cmd_run, file_values
from aiogc.errors import ConfigError

#: Namespace entries that are not part of a cell's identity (cell.json ``params``).
_NOT_PARAMS = {"out", "overwrite", "progress", "config", "func"}
#: Keys a grid may not vary.
_NOT_GRID = {"out", "overwrite", "progress", "backend", "address"}

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
