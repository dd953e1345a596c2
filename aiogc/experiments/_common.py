"""Shared pieces of the experiments: CSV in/out, confidence intervals, plotting helpers.

Every experiment is split into three steps with one hand-off each:

* ``compute(quick, seed) -> rows``: runs the grid and does the statistics (means, medians and
  bootstrap intervals need the per-trial samples, which are not kept);
* the rows go to ``NAME.csv`` (:func:`write_csv`), nothing else is passed on;
* ``plot(rows, path)`` and ``summarise(rows)`` read the rows back from the CSV
  (:func:`read_csv`), so a figure can be redrawn from the CSV alone
  (:func:`aiogc.experiments.replot`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aiogc.config import RunConfig

Row = dict[str, Any]

#: Bootstrap resamples per interval and the interval's coverage.
N_BOOT = 1000
LEVEL = 0.95

#: Seed salt of the bootstrap stream, distinct from delay / scheme / gradient streams.
_BOOT_SALT = 0xB0075


@dataclass(frozen=True)
class Labels:
    """How the report labels one headline quantity whose value maps ``a|b|c`` keys to lists.

    Attributes
    ----------
    key : tuple of str
        The column names of the key's ``|``-separated parts (a part ``name=value`` shows
        its value).
    value : tuple of str
        The names of a list value's entries; ``"95% CI"`` takes two (lo, hi), shown lo–hi.
    unit : str
        The values' unit, appended to their column names.
    """

    key: tuple[str, ...]
    value: tuple[str, ...]
    unit: str = ""


#: The name in :attr:`Labels.value` that takes a (lo, hi) pair.
CI = "95% CI"


@dataclass(frozen=True)
class Experiment:
    """One named experiment: compute the rows, then plot and summarise them from the CSV.

    Attributes
    ----------
    name : str
        ``aiogc experiment NAME``.
    compute : callable ``(quick: bool, seed: int) -> list[dict]``
    plot : callable ``(rows, png_path) -> None``
    summarise : callable ``(rows) -> dict``
        The headline figures (JSON-able), from the CSV rows only.
    grid : str
        One line: the default grid, for ``NAME.json`` and the report.
    labels : mapping of str to Labels
        Headline quantity -> how the report labels its table (columns, units, CIs).
    """

    name: str
    compute: Callable[[bool, int], list[Row]]
    plot: Callable[[list[Row], Path], None]
    summarise: Callable[[list[Row]], dict[str, Any]]
    grid: str
    labels: Mapping[str, Labels] = field(default_factory=dict)


# ------------------------------------------------------------------------------ progress

#: Who hears of an experiment's progress: ``(cells done, cells in the grid)``, at the start
#: (0 done) and after each cell (:func:`aiogc.experiments.run_experiment` installs one).
PROGRESS_LISTENERS: list[Callable[[int, int], None]] = []


#: Who gets a copy of the rows of the cells finished so far, after each cell that passes them
#: to ``tick`` (:func:`aiogc.experiments.run_experiment` keeps the last, to write them if the
#: experiment is interrupted).
ROW_LISTENERS: list[Callable[[list[Row]], None]] = []


def cells(total: int) -> Callable[..., None]:
    """Announce that the running experiment's grid has ``total`` cells; returns ``tick``, to
    call after each cell (progress with an ETA on stderr) with the rows finished so far
    (kept for an interrupted run; None for an experiment that makes its rows at the end)."""
    done = 0
    listeners = list(PROGRESS_LISTENERS)
    keepers = list(ROW_LISTENERS)

    def tick(rows: Sequence[Row] | None = None) -> None:
        nonlocal done
        done += 1
        for f in listeners:
            f(done, total)
        if rows is not None:
            for k in keepers:
                k(list(rows))

    for f in listeners:
        f(0, total)
    return tick


# ------------------------------------------------------------------------------ CSV


def _fmt(v: Any) -> Any:
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, float | np.floating):
        return f"{float(v):.6g}"
    if isinstance(v, np.integer):
        return int(v)
    return v


def write_csv(path: Path, rows: Sequence[Row]) -> None:
    """Tidy CSV: the union of the rows' keys (first-seen order), floats to 6 digits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    keys: list[str] = []
    for r in rows:
        keys.extend(k for k in r if k not in keys)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: _fmt(v) for k, v in r.items()})


def _parse(text: str) -> Any:
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def read_csv(path: Path) -> list[Row]:
    """Rows of a CSV written by :func:`write_csv`, with ints, floats, bools and ``None`` (empty)
    parsed back."""
    with path.open(newline="") as fh:
        return [{k: _parse(v) for k, v in r.items()} for r in csv.DictReader(fh)]


def select(rows: Sequence[Row], **eq: Any) -> list[Row]:
    """Rows whose fields equal every ``eq`` item (a missing field never matches)."""
    return [r for r in rows if all(k in r and r[k] == v for k, v in eq.items())]


# ------------------------------------------------------------------------------ statistics


def boot_rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), _BOOT_SALT, *[int(k) for k in key]])


def _resample(C: int, R: int, rng: np.random.Generator, n_boot: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """Two-level (cluster) bootstrap indices: instances with replacement, then trials with
    replacement inside each drawn instance. Shapes (B, C, 1) and (B, C, R)."""
    ci = rng.integers(0, C, size=(n_boot, C, 1))
    ri = rng.integers(0, R, size=(n_boot, C, R))
    return ci, ri


def ratio_of_means_ci(num: np.ndarray, den: np.ndarray, *, rng: np.random.Generator,
                      n_boot: int = N_BOOT, level: float = LEVEL) -> tuple[float, float, float]:
    """``mean(num) / mean(den)`` and its percentile bootstrap interval.

    Parameters
    ----------
    num, den : ndarray, shape (C, R)
        Paired samples: C code instances (assignment draw, Tandon's H, B's seed...) times R
        trials (one delay-schedule round each). Pairs share the index, so resampling keeps
        them together; instances are resampled as clusters, then trials within each.
    rng : numpy.random.Generator
    n_boot : int
        Resamples.
    level : float
        Coverage of the two-sided interval.

    Returns
    -------
    (estimate, low, high) : floats
    """
    num = np.atleast_2d(np.asarray(num, dtype=np.float64))
    den = np.atleast_2d(np.asarray(den, dtype=np.float64))
    C, R = num.shape
    est = float(num.mean() / den.mean()) if den.mean() != 0 else math.inf
    ci, ri = _resample(C, R, rng, n_boot)
    with np.errstate(divide="ignore", invalid="ignore"):
        b = num[ci, ri].mean(axis=(1, 2)) / den[ci, ri].mean(axis=(1, 2))
    a = (1 - level) / 2
    lo, hi = np.quantile(b, [a, 1 - a])
    return est, float(lo), float(hi)


def mean_ci(x: np.ndarray, *, rng: np.random.Generator, n_boot: int = N_BOOT,
            level: float = LEVEL) -> tuple[float, float, float]:
    """``mean(x)`` over a (C, R) array of instances x trials, with its cluster-bootstrap
    interval (see :func:`ratio_of_means_ci`)."""
    x = np.atleast_2d(np.asarray(x, dtype=np.float64))
    C, R = x.shape
    ci, ri = _resample(C, R, rng, n_boot)
    b = x[ci, ri].mean(axis=(1, 2))
    a = (1 - level) / 2
    lo, hi = np.quantile(b, [a, 1 - a])
    return float(x.mean()), float(lo), float(hi)


def fmt_ci(est: float, lo: float, hi: float, spec: str = ".3g") -> str:
    """``"est [lo, hi]"``."""
    return f"{est:{spec}} [{lo:{spec}}, {hi:{spec}}]"


# ------------------------------------------------------------------------------ configs


def sim_config(**kw: Any) -> RunConfig:
    """A RunConfig for simulation only (no liveness timers, no round timeout)."""
    base: dict[str, Any] = dict(heartbeat_s=None, dead_after_s=None, round_timeout_s=1e6)
    base.update(kw)
    return RunConfig(**base)


def code_rng(seed: int, instance: int) -> np.random.Generator:
    """The generator of code instance ``instance``: assignment draw, ordering, B, Tandon's H.

    Instance 0 of seed ``s`` is the instance ``RunConfig(seed=s).build_scheme()`` builds, so
    a single-instance experiment matches ``aiogc run`` / ``aiogc simulate`` with that seed."""
    if instance == 0:
        return np.random.default_rng([int(seed), 0x5C4E3E])
    return np.random.default_rng([int(seed), 0x5C4E3E, int(instance)])


def delay_seed(seed: int, instance: int) -> int:
    """The delay schedule's seed for code instance ``instance`` (instance 0: ``seed``)."""
    return int(seed) if instance == 0 else int(seed) * 1000 + int(instance)


# ------------------------------------------------------------------------------ plotting


def plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    pyplot.rcParams.update({"font.size": 8, "axes.titlesize": 8, "legend.fontsize": 7})
    return pyplot


def save(fig: Any, path: Path) -> None:
    # constrained layout makes room for a suptitle (tight_layout lets it overlap the top row)
    fig.set_layout_engine("constrained")
    fig.savefig(path, dpi=80)
    import matplotlib.pyplot as pyplot

    pyplot.close(fig)


def band(ax: Any, x: Sequence[float], est: Sequence[float], lo: Sequence[float],
         hi: Sequence[float], **kw: Any) -> None:
    """A line with markers and a shaded interval."""
    line = ax.plot(x, est, marker="o", ms=3, **kw)[0]
    ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, lw=0)


def col(rows: Sequence[Row], key: str) -> list[Any]:
    return [r[key] for r in rows]


def mse_floor(ax: Any, means: Sequence[float]) -> None:
    """Put a log axis' floor a decade under the smallest mean MSE above round-off.

    A round in which the exact trigger fired has an MSE of ~1e-31 (round-off); intervals that
    reach it would squash every other curve, so the axis stops at the floor (said in the
    docs)."""
    real = [m for m in means if m is not None and m > 1e-20]
    if real:
        ax.set_ylim(bottom=max(1e-12, 0.1 * min(real)))
