"""The documented experiments (docs/experiments.md).

``aiogc experiment NAME --out DIR [--quick] [--seed S]`` writes ``NAME.csv`` (tidy rows with
their confidence intervals), ``NAME.png`` (drawn from the CSV alone) and ``NAME.json`` (the
command, grid, seed, wall time and headline figures, read by ``aiogc report``).

Each experiment is compute -> CSV -> plot (see :mod:`aiogc.experiments._common`); every one
repeats over trials *and* over code instances (the assignment draw, Tandon's H, the seed of B,
the random order) and reports 95 % percentile-bootstrap intervals that resample instances, then
trials within them, or min-max ranges where the quantity is a worst case or depends on the
platform's rounding. Everything except the live halves (``live-vs-sim``, ``latency``'s live
points, ``training``, ``approx-training``) is a deterministic function of the grid and the seed.

=============== =================================================================================
exact-speedup   exact round time vs ℓ, partial vs every baseline, cyclic / regular / fr, three laws
bandwidth       the same with a cost per byte: per-worker rate and shared PS ingress sweeps
approx-mse      MSE vs deadline T, partial vs original, ℓ ∈ {1, 2, 3}
approx-tails    MSE vs T under pareto (α ≤ 2), persistent stragglers, failures, and a mix
ordering        optimal vs random vs natural order, three assignment families, ℓ = 1..δ
adaptive-order… ``adaptive-ordering``: speed-aware orders vs the static optimum, stragglers / iid
heterogeneous   speed-aware vs uniform (cyclic) assignment on heterogeneous clusters, sim + live
stability       decode error vs m (float64/float32) and worst-case condition numbers
poly-digits     polynomial-code decoding error vs decimal digits of precision, next to partial
latency         exact speedup vs one-way latency: simulated sweep + live loopback points
training        live loss / accuracy vs wall time on a real data set, four schemes, seeds
approx-training live loss vs time at a deadline (approximate mode), four schemes, real data
live-vs-sim     one schedule live on loopback and in the protocol simulator, gap itemised
=============== =================================================================================
"""

from __future__ import annotations

import json
import logging
import platform
import sys
import time
from pathlib import Path
from typing import Any

from aiogc.errors import ConfigError
from aiogc.experiments import (
    adaptive,
    approx,
    approx_training,
    bandwidth,
    heterogeneous,
    live,
    ordering,
    speedup,
    stability,
)
from aiogc.experiments._common import (
    PROGRESS_LISTENERS,
    ROW_LISTENERS,
    Experiment,
    read_csv,
    write_csv,
)

__all__ = ["EXPERIMENTS", "Experiment", "refresh", "replot", "run_experiment"]

_ALL: tuple[Experiment, ...] = (
    speedup.EXPERIMENT,
    bandwidth.BANDWIDTH,
    approx.APPROX_MSE,
    approx.APPROX_TAILS,
    ordering.EXPERIMENT,
    adaptive.EXPERIMENT,
    heterogeneous.EXPERIMENT,
    stability.STABILITY,
    stability.POLY_DIGITS,
    live.LATENCY,
    live.TRAINING,
    approx_training.EXPERIMENT,
    live.LIVE_VS_SIM,
)

#: name -> Experiment, in the documented order.
EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in _ALL}


def _json_safe(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_safe(v) for v in x]
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, float) and x in (float("inf"), float("-inf")):
        return str(x)
    if hasattr(x, "item"):
        return _json_safe(x.item())
    return x


def _check(name: str, seed: int) -> Experiment:
    if name not in EXPERIMENTS:
        raise ConfigError("experiment", name, "one of " + ", ".join(EXPERIMENTS))
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError("seed", seed, "an integer >= 0")
    return EXPERIMENTS[name]


class CellProgress:
    """Progress of one experiment's grid on stderr: cells done, elapsed time and an ETA
    (elapsed / done x cells left). On a terminal one line rewritten in place, otherwise one
    line per cell."""

    def __init__(self, name: str, *, stream: Any = None, clock: Any = time.monotonic) -> None:
        self.name = name
        self.stream = stream
        self.clock = clock
        self.t0 = clock()
        self.lines: list[str] = []

    def __call__(self, done: int, total: int) -> None:
        out = self.stream if self.stream is not None else sys.stderr
        elapsed = self.clock() - self.t0
        eta = (f"ETA {elapsed / done * (total - done):.0f} s" if done
               else "ETA after the first cell")
        line = f"aiogc experiment {self.name}: {done}/{total} cells, {elapsed:.0f} s, {eta}"
        self.lines.append(line)
        tty = getattr(out, "isatty", lambda: False)()
        if tty:
            out.write("\r" + line + ("\n" if done == total else ""))
        else:
            out.write(line + "\n")
        out.flush()


def run_experiment(name: str, out: str | Path, *, quick: bool = False,
                   seed: int = 1, progress: bool = False) -> dict[str, Any]:
    """Run experiment ``name``: ``NAME.csv``, ``NAME.png``, ``NAME.json`` in ``out``;
    with ``progress``, its cells done and an ETA on stderr (:class:`CellProgress`).

    Returns
    -------
    dict
        The headline figures (also in ``NAME.json``), computed from the CSV as written.
    """
    exp = _check(name, seed)
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    listener = CellProgress(name) if progress else None
    if listener is not None:
        PROGRESS_LISTENERS.append(listener)
    done: list[list[Any]] = [[]]  # the rows of the cells finished so far
    keep = done.__setitem__
    verbose = _log.isEnabledFor(logging.INFO)

    def on_rows(rows: list[Any]) -> None:
        if verbose:  # -v: each finished cell's rows, as -v logs each round of a run
            for row in rows[len(done[0]):]:
                _log.info("%s: %s", name, ", ".join(f"{k}={_short(v)}" for k, v in row.items()))
        keep(0, rows)

    ROW_LISTENERS.append(on_rows)
    cell_count = CellCount()
    PROGRESS_LISTENERS.append(cell_count)
    try:
        rows = exp.compute(quick, seed)
    except KeyboardInterrupt:
        _write_interrupted(exp, path, done[0], cell_count, quick=quick, seed=seed, t0=t0)
        raise
    finally:
        if listener is not None:
            PROGRESS_LISTENERS.remove(listener)
        PROGRESS_LISTENERS.remove(cell_count)
        ROW_LISTENERS.pop()
    if not rows:
        raise RuntimeError(f"experiment {name} produced no rows")
    write_csv(path / f"{name}.csv", rows)
    compute_s = time.monotonic() - t0
    back = read_csv(path / f"{name}.csv")
    head = exp.summarise(back)
    png: str | None = f"{name}.png"
    try:
        exp.plot(back, path / f"{name}.png")
    except ImportError as exc:  # the plot extra is optional; the CSV and JSON still stand
        print(f"aiogc experiment {name}: figure skipped ({exc}); install the 'plot' extra",
              file=sys.stderr)
        png = None
    meta = {
        "experiment": name,
        "command": f"aiogc experiment {name} --out {path}" + (" --quick" if quick else "")
                   + f" --seed {seed}",
        "quick": quick, "seed": seed, "grid": exp.grid,
        "wall_s": round(time.monotonic() - t0, 2), "compute_s": round(compute_s, 2),
        "rows": len(rows), "csv": f"{name}.csv", "png": png,
        "python": sys.version.split()[0], "platform": platform.platform(),
        "headline": head,
    }
    (path / f"{name}.json").write_text(json.dumps(_json_safe(meta), indent=2) + "\n")
    return head


#: The command line's diagnostics logger (``-v``: the rows of each finished cell).
_log = logging.getLogger("aiogc")


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


class CellCount:
    """The last ``(cells done, cells)`` an experiment announced."""

    def __init__(self) -> None:
        self.done, self.total = 0, 0

    def __call__(self, done: int, total: int) -> None:
        self.done, self.total = done, total


def _write_interrupted(exp: Experiment, path: Path, rows: list[Any], count: CellCount, *,
                       quick: bool, seed: int, t0: float) -> None:
    """Ctrl-C during an experiment: keep what finished. ``NAME.csv`` holds the rows of the
    cells done (when the experiment hands them over cell by cell), ``NAME.json`` says it was
    interrupted and after how many cells (no headline: it would describe part of a grid)."""
    name = exp.name
    if rows:
        write_csv(path / f"{name}.csv", rows)
    else:
        (path / f"{name}.csv").unlink(missing_ok=True)
    (path / f"{name}.png").unlink(missing_ok=True)  # an earlier run's figure is not this one's
    meta = {"experiment": name, "interrupted": True, "cells_done": count.done,
            "cells": count.total, "rows": len(rows), "csv": f"{name}.csv" if rows else None,
            "png": None, "quick": quick, "seed": seed, "grid": exp.grid,
            "wall_s": round(time.monotonic() - t0, 2), "headline": None}
    (path / f"{name}.json").write_text(json.dumps(_json_safe(meta), indent=2) + "\n")
    kept = (f"the {len(rows)} rows of the finished cells are in {path / (name + '.csv')}"
            if rows else "no rows were finished")
    print(f"aiogc experiment {name}: interrupted after {count.done} of {count.total} cells; "
          f"{kept}", file=sys.stderr)


def replot(name: str, out: str | Path) -> Path:
    """Redraw ``NAME.png`` from ``NAME.csv`` in ``out`` (no recomputation)."""
    exp = _check(name, 0)
    path = Path(out)
    png = path / f"{name}.png"
    exp.plot(read_csv(path / f"{name}.csv"), png)
    return png


def refresh(name: str, out: str | Path) -> dict[str, Any]:
    """Redraw ``NAME.png`` and recompute the headline in ``NAME.json`` from ``NAME.csv`` (after
    a change to the analysis or the figure; nothing is re-run). Returns the headline."""
    exp = _check(name, 0)
    path = Path(out)
    rows = read_csv(path / f"{name}.csv")
    head = exp.summarise(rows)
    exp.plot(rows, path / f"{name}.png")
    meta_path = path / f"{name}.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {"experiment": name}
    meta["headline"] = head
    meta_path.write_text(json.dumps(_json_safe(meta), indent=2) + "\n")
    return head
