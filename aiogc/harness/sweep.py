"""Sweeps: a grid of runs from one TOML file, resumable, ending in one tidy ``results.csv``.

The file format and the command are :mod:`aiogc.cli.sweep`; this module is the logic that does
not depend on the command line: reading the file, expanding the grid, naming the cells, saying
whether a cell is complete, running the missing ones and tabulating them.

Layout of a sweep directory ``OUT``::

    OUT/sweep.toml          a copy of the file the sweep was started from
    OUT/<cell>/             one run directory per grid cell (aiogc run --out)
    OUT/<cell>/cell.json    the cell's exact parameters (the grid values and the resolved keys)
    OUT/<cell>/IN_PROGRESS  present while the cell runs; left behind if it is cut short
    OUT/results.csv         one row per cell and scheme (written at the end of every sweep)

A cell is **complete** when its ``cell.json`` holds the same parameters, ``summary.json`` is
present, ``IN_PROGRESS`` is absent, the summary's ``interrupted_by`` is empty and every
requested scheme is in it. A cell that ran to its own end with failed rounds is complete (its
schedule is drawn from its seed, so a re-run would fail the same way; ``rerun_failed=True``
re-runs it anyway); a cell stopped by a signal, killed, or whose parameters changed is re-run.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import re
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from aiogc.errors import ConfigError

__all__ = [
    "RESULT_COLUMNS",
    "Cell",
    "SweepResult",
    "cell_complete",
    "expand_grid",
    "load_toml",
    "results_rows",
    "run_sweep",
    "write_results",
]

MARKER: Final = "IN_PROGRESS"
CELL_FILE: Final = "cell.json"
RESULTS_FILE: Final = "results.csv"

#: Columns of ``results.csv`` after ``cell`` and the grid keys (in the file's order): per scheme,
#: from the cell's ``summary.json`` (``speedup_vs_original`` = original's mean round time over
#: this scheme's; ``complete`` = 1 when every requested round of the scheme completed).
RESULT_COLUMNS: Final = (
    "scheme", "rounds", "rounds_failed", "rounds_exact", "round_time_mean_s",
    "round_time_p50_s", "round_time_p95_s", "oracle_time_mean_s", "overhead_ratio",
    "speedup_vs_original", "max_rel_decode_error", "first_loss", "final_loss", "end_reason",
    "fidelity", "time_scale", "complete", "run_dir",
)


def load_toml(path: str | Path) -> dict[str, Any]:
    """The TOML file as a dict, or ConfigError naming the file and the parse error."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError("config", str(path), f"a readable TOML file ({exc.strerror or exc})"
                          ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config", str(path), f"valid TOML ({exc})") from None


@dataclass(frozen=True)
class Cell:
    """One grid cell: its directory name and its grid values (key -> value, file order)."""

    name: str
    values: Mapping[str, Any] = field(default_factory=dict)


_UNSAFE = re.compile(r"[^A-Za-z0-9.=+-]+")


def _slug(key: str, value: Any) -> str:
    v = str(value).lower() if isinstance(value, bool) else str(value)
    return f"{key}={_UNSAFE.sub('_', v).strip('_') or '_'}"


def _digest(values: Mapping[str, Any]) -> str:
    return hashlib.sha1(json.dumps(dict(values), sort_keys=True).encode()).hexdigest()[:6]


def expand_grid(grid: Mapping[str, Any]) -> list[Cell]:
    """The cells of the product of the grid's lists, the last key varying fastest.

    Names are ``key=value`` joined by ``__`` (characters other than letters, digits and
    ``.=+-`` become ``_``), e.g. ``workers=4__delay=exp_0.02``; when two cells would share a name
    each of them gets a ``-`` and 6 hex digits of its values' hash. An empty grid is one cell,
    ``base``.

    Raises
    ------
    ConfigError
        ``grid.KEY`` when a value is not a non-empty list of scalars without duplicates.
    """
    for key, vals in grid.items():
        if not isinstance(vals, list) or not vals:
            raise ConfigError(f"grid.{key}", vals, "a non-empty list of values")
        for v in vals:
            if isinstance(v, (dict, list)):
                raise ConfigError(f"grid.{key}", v, "a string, number or boolean")
        if len({json.dumps(v) for v in vals}) != len(vals):
            raise ConfigError(f"grid.{key}", vals, "a list without duplicates")
    if not grid:
        return [Cell("base", {})]
    keys = list(grid)
    combos = [dict(zip(keys, vs, strict=True)) for vs in itertools.product(*grid.values())]
    names = ["__".join(_slug(k, v) for k, v in c.items()) for c in combos]
    clash = {n for n in names if names.count(n) > 1}
    return [Cell(f"{n}-{_digest(c)}" if n in clash else n, c)
            for n, c in zip(names, combos, strict=True)]


def cell_complete(cell_dir: Path, params: Mapping[str, Any], schemes: Sequence[str],
                  *, rerun_failed: bool = False, rounds: int | None = None) -> bool:
    """Whether ``cell_dir`` holds a finished run of exactly ``params`` (module docstring)."""
    try:
        recorded = json.loads((cell_dir / CELL_FILE).read_text("utf-8"))
        summary = json.loads((cell_dir / "summary.json").read_text("utf-8"))
    except (OSError, ValueError):
        return False
    if (cell_dir / MARKER).exists() or recorded.get("params") != _jsonable(params):
        return False
    if summary.get("interrupted_by"):
        return False
    got = summary.get("schemes") or {}
    if any(s not in got for s in schemes):
        return False
    if rerun_failed:
        return all(not got[s].get("rounds_failed") and not got[s].get("failure")
                   and (rounds is None or got[s].get("rounds") == rounds) for s in schemes)
    return True


def _jsonable(params: Mapping[str, Any]) -> Any:
    return json.loads(json.dumps(dict(params), default=str))


@dataclass(frozen=True)
class ResumeRule:
    """Which cells already on disk a resumed sweep skips (see :func:`cell_complete`)."""

    rerun_failed: bool = False
    rounds: int | None = None


DEFAULT_RESUME: Final = ResumeRule()


@dataclass
class SweepResult:
    """What a sweep did: the cells run now, those skipped as complete, the table's path."""

    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    results: Path | None = None


def run_sweep(
    out: Path,
    cells: Sequence[Cell],
    params_of: Callable[[Cell], dict[str, Any]],
    run_cell: Callable[[Cell, Path], Any],
    schemes: Sequence[str],
    *,
    resume: ResumeRule = DEFAULT_RESUME,
    on_cell_done: Callable[[Cell, Path], None] | None = None,
    log: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> SweepResult:
    """Run every cell that is not complete, in order; then write ``OUT/results.csv``.

    ``params_of(cell)`` is the cell's full parameter set (recorded in ``cell.json`` and compared
    on resume); ``run_cell(cell, cell_dir)`` runs it (an exception, KeyboardInterrupt included,
    stops the sweep with the cell's ``IN_PROGRESS`` marker left behind, so the next sweep re-runs
    it). ``resume`` says which cells already on disk count as complete (:func:`cell_complete`'s
    ``rerun_failed`` and ``rounds``). ``on_cell_done`` is called after each cell that ran
    (tests use it to interrupt a sweep at a known point). ``log`` gets one line per cell: its
    count ``[k/N]``, and once a cell ran, the elapsed time and an ETA (the mean wall time of the
    cells run so far, times the cells left).
    """
    out.mkdir(parents=True, exist_ok=True)
    res = SweepResult()
    t0 = clock()
    for k, cell in enumerate(cells, 1):
        d = out / cell.name
        params = params_of(cell)
        if cell_complete(d, params, schemes, rerun_failed=resume.rerun_failed,
                         rounds=resume.rounds):
            res.skipped.append(cell.name)
            if log:
                log(f"sweep: [{k}/{len(cells)}] {cell.name}: complete, skipped")
            continue
        d.mkdir(parents=True, exist_ok=True)
        (d / "summary.json").unlink(missing_ok=True)
        (d / MARKER).write_text("this cell's run has not finished\n", encoding="utf-8")
        (d / CELL_FILE).write_text(json.dumps({"cell": cell.name, "grid": _jsonable(cell.values),
                                               "params": _jsonable(params)}, indent=1) + "\n",
                                   encoding="utf-8")
        if log:
            log(f"sweep: [{k}/{len(cells)}] {cell.name}: running"
                + _eta(clock() - t0, len(res.ran), len(cells) - k + 1))
        run_cell(cell, d)
        (d / MARKER).unlink()
        res.ran.append(cell.name)
        if on_cell_done is not None:
            on_cell_done(cell, d)
    res.results = write_results(out, cells, schemes)
    return res


def _eta(elapsed: float, ran: int, left: int) -> str:
    """``(12 s so far, ETA 30 s)`` once a cell ran (``left`` counts this one)."""
    if not ran:
        return ""
    return f" ({elapsed:.0f} s so far, ETA {elapsed / ran * left:.0f} s)"


def results_rows(out: Path, cells: Sequence[Cell], schemes: Sequence[str]
                 ) -> list[dict[str, Any]]:
    """One row per cell and scheme: ``cell``, the grid values, :data:`RESULT_COLUMNS`.

    A cell without a summary (never run, or cut short) has no rows.
    """
    rows: list[dict[str, Any]] = []
    for cell in cells:
        d = out / cell.name
        try:
            summary = json.loads((d / "summary.json").read_text("utf-8"))
        except (OSError, ValueError):
            continue
        if (d / MARKER).exists():
            continue
        fid = summary.get("fidelity") or {}
        speed = summary.get("speedup_vs_original") or {}
        for scheme in schemes:
            s = (summary.get("schemes") or {}).get(scheme)
            if s is None:
                continue
            row: dict[str, Any] = {"cell": cell.name, **cell.values, "scheme": scheme}
            for col in RESULT_COLUMNS[1:]:
                row[col] = s.get(col)
            row["speedup_vs_original"] = speed.get(scheme)
            row["end_reason"] = s.get("end_reason") or summary.get("end_reason")
            row["fidelity"] = fid.get("verdict")
            row["time_scale"] = fid.get("time_scale")
            row["complete"] = int(not s.get("rounds_failed") and not s.get("failure")
                                  and s.get("rounds_exact", s.get("rounds")) == s.get("rounds"))
            row["run_dir"] = cell.name
            rows.append(row)
    return rows


def _cell_text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def write_results(out: Path, cells: Sequence[Cell], schemes: Sequence[str]) -> Path:
    """Write ``OUT/results.csv``: one header line, then :func:`results_rows` (no comment lines,
    empty cell = missing, floats in ``repr`` form: ``pandas.read_csv`` needs no options)."""
    grid_keys = list(cells[0].values) if cells else []
    columns = ["cell", *grid_keys, *RESULT_COLUMNS]
    path = out / RESULTS_FILE
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(columns)
        for row in results_rows(out, cells, schemes):
            w.writerow([_cell_text(row.get(c)) for c in columns])
    return path
