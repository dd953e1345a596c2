"""Reading a run directory back (what :class:`aiogc.harness.records.RunRecorder` wrote), with
typed values and without aiogc's writer: :func:`load_run` (dicts of rows), :func:`load_run_tables`
(:class:`RunTables`, pandas or lists; ``aiogc.load_run``), :func:`load_events` (``events.jsonl``,
skipping a truncated last line), :func:`run_state` (was the run cut short?) and
:func:`records_from_run` (:class:`~aiogc.core.common.RoundRecord` objects without gradients, so
plots and inspection need nothing but the files). The file formats are
:mod:`aiogc.harness.records`' docstring; the columns :mod:`aiogc.harness.columns`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final

from aiogc.core.common import RoundRecord
from aiogc.errors import ConfigError
from aiogc.harness.columns import (
    COLUMN_OF_FIELD,
    NOT_IN_ROUNDS,
    read_csv,
)
from aiogc.harness.runfiles import check_event, read_json
from aiogc.protocol.status import EndReason, RoundStatus
from aiogc.training.schedule import DelaySchedule


def load_events(
    run_dir: str | os.PathLike[str],
    *,
    scheme: str | None = None,
    round: int | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Frames of ``events.jsonl`` (optionally one scheme / round), in file order.

    A truncated last line (crashed run) is skipped. ``limit`` caps the number returned.
    """
    path = Path(run_dir) / "events.jsonl"
    out: list[dict[str, Any]] = []
    if not path.exists():
        return out
    with path.open(encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, start=1):
            if limit is not None and len(out) >= limit:
                break
            ev = check_event(path, lineno, line)
            if ev is None:  # not complete JSON: a run cut short mid-line
                continue
            if scheme is not None and ev.get("scheme") != scheme:
                continue
            if round is not None and ev.get("round") != round:
                continue
            out.append(ev)
    return out


def load_run(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a run directory back.

    Returns
    -------
    dict
        ``manifest`` (dict, ``{}`` if missing), ``rounds``, ``workers``, ``reports`` (lists of
        dicts with ints / floats / ``None`` parsed per column, ``state`` as a list of ints) and
        ``summary`` (dict or ``None``). Frames are not loaded: use :func:`load_events`.

    Raises
    ------
    FileNotFoundError
        If ``run_dir`` is not a directory.
    """
    d = Path(run_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"no run directory at {d}")
    manifest = read_json(d / "manifest.json") if (d / "manifest.json").exists() else {}
    summary_path = d / "summary.json"
    return {
        "dir": d,
        "manifest": manifest,
        "rounds": read_csv(d / "rounds.csv"),
        "workers": read_csv(d / "workers.csv"),
        "reports": read_csv(d / "reports.csv"),
        "attribution": read_csv(d / "attribution.csv"),
        "summary": read_json(summary_path) if summary_path.exists() else None,
    }


def run_state(run: Mapping[str, Any]) -> str | None:
    """None for a run that finished writing its records; else one line saying it was cut
    short (no final ``summary.json``: killed, out of memory, or still running) and which
    rounds ``rounds.csv`` holds per scheme."""
    summary = run.get("summary")
    if isinstance(summary, Mapping) and not summary.get("in_progress", False):
        return None
    last: dict[str, int] = {}
    count: dict[str, int] = {}
    for r in run.get("rounds", []):
        s = r.get("scheme")
        count[s] = count.get(s, 0) + 1
        last[s] = max(last.get(s, -1), r.get("round") if r.get("round") is not None else -1)
    held = ", ".join(f"{s}: {count[s]} rounds (last {last[s]})" for s in count) or "no rounds"
    why = ("summary.json says the run was still in progress" if summary is not None
           else "no summary.json")
    return (f"this run was cut short (or is still running): {why}; "
            f"the files hold {held}")


#: The tables of :class:`RunTables`, in order.
TABLES: Final = ("rounds", "workers", "reports", "frames", "delays", "attribution")


@dataclass
class RunTables:
    """A run directory as tables (:func:`load_run_tables`, ``aiogc.load_run``).

    Attributes
    ----------
    rounds, workers, reports : DataFrame or list of dict
        ``rounds.csv``, ``workers.csv``, ``reports.csv`` (columns in
        :mod:`aiogc.harness.columns`): one row per round and scheme; per round, scheme and
        worker; per accepted chunk-count report.
    frames : DataFrame or list of dict
        ``events.jsonl``: one row per frame or run event (``t_ns, direction, kind, scheme,
        round, worker, nbytes``; run events add ``reason`` ...).
    delays : DataFrame or list of dict
        ``delays.csv``: one row per (round, worker, chunk position): ``compute_s``,
        ``network_s`` (seconds, ``inf`` = never).
    attribution : DataFrame or list of dict
        ``attribution.csv``: one row per round, scheme and chunk (which workers' work on it
        entered the gradient, which was computed, which wasted); empty for older runs.
    manifest, summary : dict
        ``manifest.json`` and ``summary.json`` (``{}`` / ``None`` when missing).
    dir : pathlib.Path
        The run directory.

    The tables are pandas DataFrames when pandas is importable (and ``pandas`` was not
    False), else lists of dicts with typed values (``None`` for an empty cell); both forms load
    into pandas with ``pandas.DataFrame(table)``.
    """

    dir: Path
    manifest: dict[str, Any]
    summary: dict[str, Any] | None
    rounds: Any
    workers: Any
    reports: Any
    frames: Any
    delays: Any
    attribution: Any = None

    def tables(self) -> dict[str, Any]:
        """``{name: table}`` for :data:`TABLES`."""
        return {name: getattr(self, name) for name in TABLES}


def _delay_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    sched = DelaySchedule.from_csv(path)  # old (# headers) and new (sidecar) formats
    return list(sched.rows())


def load_run_tables(run_dir: str | os.PathLike[str], *, frames: bool = True,
                    pandas: bool | None = None) -> RunTables:
    """A run directory as tables: rounds, workers, reports, frames, delays (:class:`RunTables`).

    Parameters
    ----------
    run_dir : path
        A directory written by ``aiogc run`` / :class:`RunRecorder`.
    frames : bool
        Load ``events.jsonl`` (the largest file of a long run); False: an empty table.
    pandas : bool, optional
        True: DataFrames (ImportError without pandas); False: lists of dicts; default:
        DataFrames if pandas is importable.

    Raises
    ------
    FileNotFoundError
        If ``run_dir`` is not a directory.
    """
    run = load_run(run_dir)
    d = Path(run["dir"])
    raw = {
        "rounds": run["rounds"], "workers": run["workers"], "reports": run["reports"],
        "frames": load_events(d) if frames else [],
        "delays": _delay_rows(d / "delays.csv"),
        "attribution": run["attribution"],
    }
    if pandas is None:
        try:
            import pandas as pd
        except ImportError:
            pandas = False
        else:
            pandas = True
    if pandas:
        import pandas as pd

        tables = {k: pd.DataFrame(v) for k, v in raw.items()}
    else:
        tables = raw
    return RunTables(dir=d, manifest=run["manifest"], summary=run["summary"], **tables)


def _record_of_row(row: Mapping[str, Any]) -> RoundRecord:
    """A RoundRecord from a parsed rounds.csv row: every field written there, by the field
    list of the dataclass (an empty cell restores the field's default, e.g. NaN).

    ``end_reason`` must be an :class:`~aiogc.protocol.status.EndReason` value, except in a file
    written before rounds.csv had an ``end_detail`` column: there it was free text, which
    becomes the detail of a round whose code is unknown (None).
    """
    if "end_detail" not in row and row.get("end_reason") is not None:
        try:
            EndReason.parse(row["end_reason"])
        except ConfigError:
            row = {**row, "end_reason": None, "end_detail": row["end_reason"]}
    kw: dict[str, Any] = {}
    for f in fields(RoundRecord):
        if f.name in NOT_IN_ROUNDS:
            continue
        v = row.get(COLUMN_OF_FIELD.get(f.name, f.name))
        if v is None:
            continue
        if f.name == "state":
            v = tuple(v)
        elif f.name == "status":
            v = RoundStatus.parse(v)
        elif f.name == "end_reason":
            v = EndReason.parse(v)
        kw[f.name] = v
    return RoundRecord(**kw)


def records_from_run(run: Mapping[str, Any]) -> dict[str, list[RoundRecord]]:
    """Rebuild the round records of a :func:`load_run` result, by scheme in file order.

    ``gradient`` is ``None``; everything else written to the files is restored (a dropped
    worker's reason, compute times, arrivals, the reports).
    """
    out: dict[str, list[RoundRecord]] = {}
    index: dict[tuple[str, int], RoundRecord] = {}
    for row in run["rounds"]:
        rec = _record_of_row(row)
        out.setdefault(rec.scheme, []).append(rec)
        index[(rec.scheme, rec.round)] = rec
    for row in run["reports"]:
        rec_ = index.get((row["scheme"], row["round"]))
        if rec_ is not None:
            rec_.reports.append((row["ps_time"], row["worker"], row["count"], row["elapsed_s"]))
    for row in run["workers"]:
        rec_ = index.get((row["scheme"], row["round"]))
        if rec_ is None:
            continue
        w = row["worker"]
        if row.get("arrival_s") is not None:
            rec_.arrivals[w] = row["arrival_s"]
        if row.get("compute_s") is not None:
            rec_.compute_s[w] = row["compute_s"]
        if row.get("dropped_reason"):
            rec_.dropped[w] = row["dropped_reason"]
    return out
