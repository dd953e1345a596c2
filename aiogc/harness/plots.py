"""PNG plots of a run directory, drawn from its files alone (``aiogc plot RUN_DIR``).

:func:`plot_run` writes three figures:

``round_time_cdf.png``
    Empirical CDF of the round time of every scheme (solid), with the oracle time (dashed: the
    earliest moment the reported counts were decodable) in the same colour.
``timeline_round{r}.png``
    What happened in one representative round ``r`` (the median-duration round of the first
    scheme; the same round, hence the same delays, in every scheme): one panel per scheme, one
    row per worker. Bars are chunk computations (from one report to the next, PS time), ticks
    the reports, the dashed vertical line the broadcast (partial) or the moment the decodable
    set had arrived (other schemes), the orange bar each coded vector's way to the PS ending at
    its arrival, the grey line the end of the round and the green dotted line the oracle time.
    Work that entered the decoded gradient is blue; work computed in vain (after the state the
    vector was encoded against, by a worker whose vector was not used, or in a failed round)
    is hatched grey (workers.csv ``chunks_entered``). A send-when-done worker sends no chunk
    reports: its bar runs from the round start to its reported ``compute_s``.
``loss_vs_time.png``
    Training loss after each round against cumulative emulated time (the round times as
    recorded: wall time divided by the time scale), per scheme.

matplotlib is an optional dependency (``pip install 'aiogc[plot]'``). It is imported lazily and
only through the object-oriented API with the Agg canvas, so plotting never touches pyplot's
global state or the caller's backend. Without it :func:`plot_run` raises
:class:`PlotUnavailable`; callers that treat plots as optional check :func:`plots_available`
first and warn.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from aiogc.core.common import RoundRecord
from aiogc.errors import AiogcError
from aiogc.harness.columns import is_trigger_scheme
from aiogc.harness.loaders import load_run, records_from_run

__all__ = ["PlotUnavailable", "plot_run", "plots_available", "representative_round"]

_DPI: Final = 120
_CHUNK_COLOURS: Final = ("#4c72b0", "#8fb0d9")
_UPLOAD_COLOUR: Final = "#dd8452"
_WASTED_COLOUR: Final = "#c8c8c8"


class PlotUnavailable(AiogcError, ImportError):
    """matplotlib is not installed (``pip install 'aiogc[plot]'``)."""


def plots_available() -> bool:
    """Whether matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _new_figure(**kwargs: Any) -> Any:
    """A Figure attached to an Agg canvas (no pyplot, no global backend switch)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlotUnavailable("plots need matplotlib: pip install 'aiogc[plot]'") from exc
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def representative_round(records: Sequence[RoundRecord]) -> int | None:
    """Round number of the median-duration non-failed round (lower median; ties by round).

    Falls back to the first round when every round failed; ``None`` when there are none.
    """
    ok = [r for r in records if r.status != "failed" and r.t_end is not None]
    if not ok:
        return records[0].round if records else None
    ranked = sorted(ok, key=lambda r: (r.duration_s, r.round))
    return ranked[(len(ranked) - 1) // 2].round


def plot_run(
    run_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None,
    *, fmt: str = "png",
) -> list[Path]:
    """Write the run's PNGs (see the module docstring) and return their paths.

    Parameters
    ----------
    run_dir : str or Path
        A run directory written by :class:`aiogc.harness.records.RunRecorder`.
    out_dir : str or Path, optional
        Where to write the PNGs (created if missing); default ``run_dir``.
    fmt : str
        ``png`` (default), or ``svg`` / ``pdf``: the same figures, same names, that suffix.

    Raises
    ------
    PlotUnavailable
        If matplotlib is not installed.
    FileNotFoundError
        If ``run_dir`` is not a directory.
    """
    run = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    recs = records_from_run(run)
    loads = _loads_by_scheme(run["workers"])
    entered = _entered_by_round(run["workers"])
    summary = run.get("summary") or {}
    paths = [_plot_cdf(recs, out / f"round_time_cdf.{fmt}")]
    first = next(iter(recs.values()), [])
    r = representative_round(first)
    if r is not None:
        paths.append(_plot_timeline(recs, loads, r, out / f"timeline_round{r}.{fmt}",
                                    entered))
    paths.append(_plot_loss(recs, summary.get("initial_loss"), out / f"loss_vs_time.{fmt}"))
    return paths


def _loads_by_scheme(worker_rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[int, int]]:
    loads: dict[str, dict[int, int]] = {}
    for row in worker_rows:
        if row.get("load") is not None:
            loads.setdefault(row["scheme"], {})[row["worker"]] = row["load"]
    return loads


def _entered_by_round(worker_rows: Sequence[Mapping[str, Any]]
                      ) -> dict[tuple[str, int], dict[int, int]]:
    """``{(scheme, round): {worker: chunks that entered the gradient}}`` (attribution columns
    of workers.csv; rounds recorded without them are absent)."""
    out: dict[tuple[str, int], dict[int, int]] = {}
    for row in worker_rows:
        if row.get("chunks_entered") is not None:
            out.setdefault((row["scheme"], row["round"]), {})[row["worker"]] = \
                row["chunks_entered"]
    return out


def _colour(i: int) -> str:
    return f"C{i % 10}"


def _ecdf(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Step-plot points of the empirical CDF of sorted ``x``, rising from 0 at ``x[0]``."""
    return np.r_[x[0], x], np.arange(x.size + 1) / x.size


def _plot_cdf(recs: Mapping[str, Sequence[RoundRecord]], path: Path) -> Path:
    fig = _new_figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    for i, (scheme, rs) in enumerate(recs.items()):
        ok = [r for r in rs if r.status != "failed" and r.t_end is not None]
        d = np.sort([r.duration_s for r in ok])
        if d.size:
            ax.step(*_ecdf(d), where="post", color=_colour(i), label=f"{scheme} (n={d.size})")
        o = np.sort([r.oracle_elapsed_s for r in ok if r.oracle_elapsed_s is not None])
        if o.size:
            ax.step(
                *_ecdf(o),
                where="post",
                color=_colour(i),
                linestyle="--",
                alpha=0.6,
                label=f"{scheme} oracle",
            )
    ax.set_xlabel("round time (s)")
    ax.set_ylabel("fraction of rounds")
    ax.set_ylim(0, 1.02)
    ax.set_title("Round time CDF (failed rounds excluded)")
    ax.grid(alpha=0.3)
    if ax.has_data():
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=_DPI)
    return path


def _plot_timeline(
    recs: Mapping[str, Sequence[RoundRecord]],
    loads: Mapping[str, Mapping[int, int]],
    round_no: int,
    path: Path,
    entered: Mapping[tuple[str, int], Mapping[int, int]] | None = None,
) -> Path:
    panels = [(s, r) for s, rs in recs.items() for r in rs if r.round == round_no]
    m = max([_n_workers(r, loads.get(s, {})) for s, r in panels] + [1])
    height = max(2.2, 0.35 * m + 1.3)
    fig = _new_figure(figsize=(9.0, height * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (scheme, rec) in zip(axes, panels, strict=True):
        _draw_round(ax, scheme, rec, m, (entered or {}).get((scheme, rec.round)))
    # one time axis for every panel, so the schemes compare at a glance
    right = max(_round_span(rec) for _, rec in panels)
    for ax in axes:
        ax.set_xlim(-0.02 * right, 1.04 * right)
    axes[-1].set_xlabel("time since round start (s, PS clock)")
    handles = _legend_handles()
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4),
               fontsize="small")
    fig.savefig(path, dpi=_DPI)
    return path


def _n_workers(rec: RoundRecord, loads: Mapping[int, int]) -> int:
    m = max(len(rec.state), len(loads))
    for w in (*rec.arrivals, *rec.compute_s, *rec.dropped, *(x[1] for x in rec.reports)):
        m = max(m, w + 1)
    return m


def _round_span(rec: RoundRecord) -> float:
    ts = [rec.duration_s, *(a - rec.t_start for a in rec.arrivals.values())]
    ts += [t - rec.t_start for t, *_ in rec.reports]
    if rec.oracle_elapsed_s is not None:
        ts.append(rec.oracle_elapsed_s)
    return max([t for t in ts if math.isfinite(t)] + [1e-9])


def _legend_handles() -> list[Any]:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    return [
        Patch(color=_CHUNK_COLOURS[0], label="chunk computed, used"),
        Patch(facecolor=_WASTED_COLOUR, hatch="//", label="computed, wasted"),
        Line2D([], [], color="black", marker="|", linestyle="", markersize=10, label="report"),
        Line2D([], [], color="crimson", linestyle="--", label="broadcast / decodable"),
        Patch(color=_UPLOAD_COLOUR, label="encode + upload"),
        Line2D([], [], color=_UPLOAD_COLOUR, marker=">", linestyle="", label="arrival"),
        Line2D([], [], color="green", linestyle=":", label="oracle"),
        Line2D([], [], color="grey", linestyle="-", label="round end"),
    ]


def _compute_bar(ax: Any, w: int, span: tuple[float, float], chunks: tuple[int, int],
                 entered: int | None, colour: str) -> None:
    """Chunks ``chunks[0]+1 .. chunks[1]`` of worker ``w`` computed over ``span`` (s since
    the round start): the part up to ``entered`` in ``colour``, the rest hatched as wasted
    (split in proportion to the chunks; all in ``colour`` when ``entered`` is unknown)."""
    a, b = span
    c0, c1 = chunks
    used = c1 - c0 if entered is None else max(0, min(c1, entered) - c0)
    cut = a + (b - a) * (used / (c1 - c0) if c1 > c0 else 1.0)
    if cut > a:
        ax.broken_barh([(a, cut - a)], (w - 0.3, 0.6), facecolors=colour, edgecolor="white")
    if b > cut:
        ax.broken_barh([(cut, b - cut)], (w - 0.3, 0.6), facecolors=_WASTED_COLOUR,
                       edgecolor="white", hatch="//")


def _draw_round(ax: Any, scheme: str, rec: RoundRecord, m: int,
                entered: Mapping[int, int] | None = None) -> None:
    t0 = rec.t_start
    partial = is_trigger_scheme(scheme)
    last_t: dict[int, float] = {}
    last_c: dict[int, int] = {}
    ent = entered or {}
    for t, w, count, _ in sorted(rec.reports):
        a = last_t.get(w, t0) - t0
        b = t - t0
        colour = _CHUNK_COLOURS[count % 2]
        _compute_bar(ax, w, (a, b), (last_c.get(w, 0), count), ent.get(w), colour)
        ax.plot([b], [w], marker="|", color="black", markersize=12, linestyle="")
        c0 = last_c.get(w, 0)
        label = str(count) if count == c0 + 1 else f"{c0 + 1}-{count}"
        ax.text((a + b) / 2, w, label, ha="center", va="center", fontsize=7, color="white")
        last_t[w], last_c[w] = t, count
    for w, comp in rec.compute_s.items():
        if w not in last_t and entered is not None and math.isfinite(comp):
            # a send-when-done worker: no reports, one bar of its whole load
            _compute_bar(ax, w, (0.0, comp), (0, 1), min(1, ent.get(w, 0)), _CHUNK_COLOURS[0])
    for w, arr in rec.arrivals.items():
        if partial and rec.t_trigger is not None:
            a = rec.t_trigger - t0
        elif w in rec.compute_s:
            a = rec.compute_s[w]
        else:
            a = last_t.get(w, t0) - t0
        b = arr - t0
        a = min(a, b)
        ax.broken_barh([(a, b - a)], (w + 0.3, 0.15), facecolors=_UPLOAD_COLOUR)
        ax.plot([b], [w + 0.375], marker=">", color=_UPLOAD_COLOUR, linestyle="")
    for w, reason in rec.dropped.items():
        ax.plot([rec.duration_s], [w], marker="x", color="crimson", markersize=9, linestyle="")
        ax.annotate(
            f"dropped: {reason}",
            (rec.duration_s, w),
            xytext=(4, 0),
            textcoords="offset points",
            fontsize=7,
            color="crimson",
            va="center",
        )
    if rec.t_trigger is not None:
        ax.axvline(rec.t_trigger - t0, color="crimson", linestyle="--", linewidth=1)
    if rec.oracle_elapsed_s is not None:
        ax.axvline(rec.oracle_elapsed_s, color="green", linestyle=":", linewidth=1.2)
    if rec.t_end is not None:
        ax.axvline(rec.t_end - t0, color="grey", linewidth=1)
    ax.set_ylim(m - 0.5, -0.6)
    ax.set_yticks(range(m), [f"w{j}" for j in range(m)])
    oracle = f", oracle {rec.oracle_elapsed_s:.3g} s" if rec.oracle_elapsed_s is not None else ""
    state = " ".join(map(str, rec.state))
    ax.set_title(
        f"{scheme}: round {rec.round}, {rec.status}, {rec.duration_s:.3g} s{oracle}"
        f"  state=[{state}]",
        fontsize="medium",
    )
    ax.grid(axis="x", alpha=0.3)


def _plot_loss(
    recs: Mapping[str, Sequence[RoundRecord]], initial_loss: float | None, path: Path
) -> Path:
    fig = _new_figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    for i, (scheme, rs) in enumerate(recs.items()):
        t = np.cumsum([r.duration_s for r in rs])
        xs = [0.0] if initial_loss is not None else []
        ys = [float(initial_loss)] if initial_loss is not None else []
        for ti, r in zip(t, rs, strict=True):
            if math.isfinite(r.loss):
                xs.append(float(ti))
                ys.append(r.loss)
        if xs:
            ax.plot(xs, ys, color=_colour(i), marker=".", label=scheme)
    if ax.has_data():
        ax.legend(fontsize="small")
        ys_all = np.concatenate([np.asarray(line.get_ydata(), float) for line in ax.get_lines()])
        if ys_all.min() > 0 and ys_all.max() > 10 * ys_all.min():
            ax.set_yscale("log")  # spans a decade or more
    else:
        ax.text(0.5, 0.5, "no loss recorded", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("cumulative emulated time (s)")
    ax.set_ylabel("loss")
    ax.set_title("Loss vs emulated time")
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=_DPI)
    return path
