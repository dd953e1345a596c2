"""Explain one round of a recorded run in plain text (``aiogc inspect RUN_DIR --round R``).

:func:`inspect_round` reads only the run directory (``rounds.csv``, ``reports.csv``,
``workers.csv``, ``events.jsonl``) and prints, per scheme: the round's outcome, a timeline of
the PS's view (start, every accepted report, the trigger with its state vector, every arrival,
the end), the frames recorded for that round in time order, and a per-worker table.

Times in the timeline are seconds since the round start on the PS clock (``+0.012345``), with
the absolute PS time where useful. Frame times are converted from ``t_ns`` on the same clock
(see :mod:`aiogc.harness.records`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from aiogc.errors import AiogcError
from aiogc.harness.columns import is_trigger_scheme
from aiogc.harness.loaders import load_events, load_run, run_state
from aiogc.protocol.status import describe_end

__all__ = ["NoSuchRound", "inspect_round"]


class NoSuchRound(AiogcError, KeyError):
    """The run has no such round (or scheme); names the field, value and what exists."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}={value!r} is not in this run: expected {allowed}")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def _f(x: Any, digits: int = 6) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        return f"{x:.{digits}f}"
    return str(x)


def _g(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def inspect_round(run_dir: str | os.PathLike[str], round: int, scheme: str | None = None) -> str:
    """Describe what happened in round ``round`` of a run (every scheme, or just ``scheme``).

    Parameters
    ----------
    run_dir : str or Path
        A run directory written by :class:`aiogc.harness.records.RunRecorder`.
    round : int
        Round number (as in ``rounds.csv``).
    scheme : str, optional
        Only this scheme; default every scheme that has the round.

    Returns
    -------
    str
        Multi-line text, one section per scheme; first a ``note: this run was cut short ...``
        line when the run did not write its final summary (:func:`~.records.run_state`).

    Raises
    ------
    NoSuchRound
        (a KeyError) If no scheme has that round, or ``scheme`` is not in the run; the
        message lists the schemes and rounds available.
    FileNotFoundError
        If ``run_dir`` is not a directory.
    """
    run = load_run(run_dir)
    rows = [
        r
        for r in run["rounds"]
        if r["round"] == round and (scheme is None or r["scheme"] == scheme)
    ]
    if not rows:
        schemes = sorted({r["scheme"] for r in run["rounds"]})
        if not schemes:
            raise NoSuchRound("round", round, f"a recorded round, but {run['dir']} has none")
        if scheme is not None and scheme not in schemes:
            raise NoSuchRound("scheme", scheme, f"one of {schemes} in {run['dir']}")
        have = sorted({r["round"] for r in run["rounds"]
                       if scheme is None or r["scheme"] == scheme})
        raise NoSuchRound(
            "round", round,
            f"a round of {run['dir']}{f' scheme {scheme!r}' if scheme else ''}: "
            f"{_ranges(have)} (schemes {schemes})",
        )
    sections = []
    for row in rows:
        s = row["scheme"]
        reports = [r for r in run["reports"] if r["scheme"] == s and r["round"] == round]
        workers = [w for w in run["workers"] if w["scheme"] == s and w["round"] == round]
        frames = load_events(run_dir, scheme=s, round=round)
        chunks = [c for c in run.get("attribution", []) if c["scheme"] == s
                  and c["round"] == round]
        sections.append(_section(row, reports, workers, frames)
                        + _attribution_text(workers, chunks))
    cut = run_state(run)
    if cut is not None:
        sections.insert(0, f"note: {cut}")
    return "\n\n".join(sections) + "\n"


def _attribution_text(workers: Sequence[Mapping[str, Any]],
                      chunks: Sequence[Mapping[str, Any]]) -> str:
    """The round's attribution (workers.csv ``used, weight, chunks_entered, chunks_wasted``
    and attribution.csv): whose work entered the decoded gradient, with what weight, and what
    was computed in vain. Empty for a run recorded without it."""
    if not workers or all(w.get("used") is None for w in workers):
        return ""
    lines = ["", "", "   attribution (decoded gradient part k = sum_j weight_j[k] * v_j):",
             "   worker  used  entered  wasted  weight"]
    for w in workers:
        weight = " ".join(f"{x:.6g}" for x in (w.get("weight") or []))
        lines.append(f"   {w['worker']:>6}  {'yes' if w.get('used') else 'no':>4}  "
                     f"{_g(w.get('chunks_entered')):>7}  {_g(w.get('chunks_wasted')):>6}  "
                     f"{weight}")
    if chunks:
        uncovered = [c["chunk"] for c in chunks if not c.get("n_covered")]
        wasted = [f"w{j}:c{c['chunk']}" for c in chunks for j in (c.get("wasted_by") or [])]
        n_cov = [c.get("n_covered") or 0 for c in chunks]
        lines.append(f"   chunks: {len(chunks) - len(uncovered)} of {len(chunks)} entered the "
                     f"gradient (covered {min(n_cov)}..{max(n_cov)} times); uncovered: "
                     f"{_ranges(uncovered) if uncovered else 'none'}")
        lines.append(f"   wasted work ({len(wasted)} worker:chunk computations not used): "
                     + (" ".join(wasted[:40]) + (" ..." if len(wasted) > 40 else "")
                        if wasted else "none"))
    return "\n".join(line.rstrip() for line in lines)


def _ranges(xs: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"rounds 0..2, 5"``."""
    if not xs:
        return "no rounds"
    parts, lo, prev = [], xs[0], xs[0]
    for x in [*xs[1:], None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        parts.append(f"{lo}..{prev}" if prev > lo else str(lo))
        if x is not None:
            lo = prev = x
    return "rounds " + ", ".join(parts)


def _timeline_events(
    row: Mapping[str, Any],
    reports: Sequence[Mapping[str, Any]],
    workers: Sequence[Mapping[str, Any]],
    partial: bool,
    state: Sequence[int],
) -> list[tuple[float, int, str]]:
    """The round's timeline as ``(PS time, tie rank, text)``, unsorted."""
    # ties: start, reports, trigger (partial), arrivals, decodable (the arrival caused it), end
    t0 = row["start_s"]
    events: list[tuple[float, int, str]] = [(t0, 0, f"start      (PS time {_f(t0)})")]
    for r in reports:
        events.append(
            (
                r["ps_time"],
                1,
                f"report     worker {r['worker']:>3} count {r['count']:>3}"
                f"  (worker elapsed {_g(r['elapsed_s'])} s)",
            )
        )
    if row.get("trigger_s") is not None:
        what = "trigger    encode_and_transmit" if partial else "decodable  set arrived"
        events.append(
            (row["trigger_s"], 2 if partial else 4, f"{what}, state [{' '.join(map(str, state))}]")
        )
    for wr in workers:
        if wr.get("arrival_s") is not None:
            events.append(
                (
                    wr["arrival_s"],
                    3,
                    f"arrival    worker {wr['worker']:>3} (#{wr['arrival_order']}, compute "
                    f"{_g(wr.get('compute_s'))} s, comm {_g(wr.get('comm_s'))} s)",
                )
            )
    if row.get("end_s") is not None:
        events.append((row["end_s"], 5, f"end        {row.get('status')}"))
    return events


def _section(
    row: Mapping[str, Any],
    reports: Sequence[Mapping[str, Any]],
    workers: Sequence[Mapping[str, Any]],
    frames: Sequence[Mapping[str, Any]],
) -> str:
    s = row["scheme"]
    t0 = row["start_s"]
    partial = is_trigger_scheme(s)
    state = row.get("state") or []
    dur = row.get("duration_s")
    oracle = row.get("oracle_s")
    ratio = f" (x{dur / oracle:.3g} of oracle)" if dur is not None and oracle else ""
    lines = [
        f"== {s}, round {row['round']}: {row.get('status')}"
        f" ({describe_end(row.get('end_reason'), row.get('end_detail'))})",
        f"   duration {_g(dur)} s, oracle {_g(oracle)} s{ratio}; attempts {row.get('attempts')}",
        "",
        "   timeline (s since round start, PS clock):",
    ]

    def rel(t: float | None) -> str:
        return "         -" if t is None else f"{t - t0:+10.6f}"

    events = _timeline_events(row, reports, workers, partial, state)
    for t, _, text in sorted(events, key=lambda e: (e[0], e[1])):
        lines.append(f"   {rel(t)}  {text}")
    if row.get("trigger_s") is None:
        lines.append("             (no trigger: the decodable condition never held)")

    lines.append("")
    lines.append(f"   frames ({len(frames)}):")
    for fr in sorted(frames, key=lambda f: f["t_ns"]):
        fw = "-" if fr.get("worker") is None else fr["worker"]
        lines.append(
            f"   {rel(fr['t_ns'] / 1e9)}  {fr.get('direction', '?'):<4} "
            f"{fr.get('kind', '?'):<20} worker {fw:>3}  {fr.get('nbytes')} B"
        )
    if not frames:
        lines.append("             (none recorded)")

    lines.append("")
    lines.append(
        f"   decode: {row.get('status')}, state [{' '.join(map(str, state))}], coverage_min "
        f"{row.get('coverage_min')}, residual {_g(row.get('residual'))}, amplification "
        f"{_g(row.get('amplification'))}, rel_error {_g(row.get('rel_error'))}, "
        f"loss {_g(row.get('loss'))}"
    )
    if workers:
        lines.append("")
        lines.append("   worker  load  done  used  compute_s     comm_s  order  straggler  dropped")
        for wr in workers:
            lines.append(
                f"   {wr['worker']:>6}  {_g(wr.get('load')):>4}  {wr.get('chunks_done'):>4}  "
                f"{wr.get('chunks_used'):>4}  {_g(wr.get('compute_s')):>9}  "
                f"{_g(wr.get('comm_s')):>9}  {_g(wr.get('arrival_order')):>5}  "
                f"{'yes' if wr.get('straggler') else 'no':>9}  {wr.get('dropped_reason') or ''}"
            )
    return "\n".join(line.rstrip() for line in lines)
