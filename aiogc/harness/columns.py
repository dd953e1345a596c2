"""The run directory's file schema and cell formats: the columns of ``rounds.csv``,
``workers.csv`` and ``reports.csv`` with the type of each (:data:`COLUMN_TYPES`), the per-worker
rows of a round, and how values become CSV cells and strict JSON (and back).

:mod:`aiogc.harness.records` writes and reads run directories with these; its docstring
describes the files.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from types import UnionType
from typing import Any, Final, Union, get_args, get_origin, get_type_hints

import numpy as np

from aiogc.coding.registry import spec_of_label
from aiogc.core.attribution import chunk_cover, entered_counts, used_workers
from aiogc.core.common import RoundRecord
from aiogc.errors import ConfigError

__all__ = [
    "ATTRIBUTION_COLUMNS",
    "COLUMN_OF_FIELD",
    "COLUMN_TYPES",
    "NOT_IN_ROUNDS",
    "REPORT_COLUMNS",
    "ROUND_COLUMNS",
    "WORKER_COLUMNS",
    "ChunkRow",
    "ReportRow",
    "WorkerRow",
    "chunk_tuples",
    "format_cell",
    "is_trigger_scheme",
    "parse_cell",
    "read_csv",
    "to_jsonable",
    "worker_rows",
    "worker_tuples",
    "write_json",
    "write_json_compact",
]

#: rounds.csv column of each RoundRecord field whose column name differs from the field name.
COLUMN_OF_FIELD: Final[dict[str, str]] = {
    "t_start": "start_s",
    "t_trigger": "trigger_s",
    "t_end": "end_s",
    "oracle_elapsed_s": "oracle_s",
}
#: RoundRecord fields written to other files (or not at all: the gradient).
#: (rounding_bound, kept on the record, not a column, so that a
#: default run's rounds.csv keeps its columns; attribution: workers.csv and attribution.csv)
NOT_IN_ROUNDS: Final = frozenset({"reports", "arrivals", "compute_s", "dropped", "gradient",
                                  "rounding_bound", "attribution"})

#: rounds.csv columns written by the recorder after the record's own (appended at the end, so
#: readers of older files still work): ``workers_present``, the workers the PS started the
#: round with (empty when the recorder saw no frames).
RECORDER_ROUND_COLUMNS: Final[tuple[str, ...]] = ("workers_present",)

#: rounds.csv columns: ``scheme``, then :meth:`RoundRecord.as_row` in its own order, then
#: :data:`RECORDER_ROUND_COLUMNS`.
ROUND_COLUMNS: Final[tuple[str, ...]] = (
    "scheme",
    *(k for k in RoundRecord(round=0, scheme="", t_start=0.0).as_row() if k != "scheme"),
    *RECORDER_ROUND_COLUMNS,
)


@dataclass(frozen=True)
class WorkerRow:
    """One ``workers.csv`` row (see the module docstring); the columns are its fields."""

    round: int
    scheme: str
    worker: int
    load: int
    chunks_done: int
    chunks_used: int
    compute_s: float | None
    arrival_s: float | None
    comm_s: float | None
    arrival_order: int | None
    straggler: int
    dropped_reason: str
    # per-round attribution (aiogc.core.attribution), empty when the record has none:
    used: int | None  # 1 if the worker's vector entered the decode (nonzero weight)
    weight: tuple[float, ...] | None  # its decoding coefficients, one per part (ell)
    chunks_entered: int | None  # chunks that entered the applied gradient through it
    chunks_wasted: int | None  # chunks_done - chunks_entered: computed, not used


@dataclass(frozen=True)
class ReportRow:
    """One ``reports.csv`` row: an accepted chunk-count report."""

    scheme: str
    round: int
    ps_time: float
    worker: int
    count: int
    elapsed_s: float


@dataclass(frozen=True)
class ChunkRow:
    """One ``attribution.csv`` row: one chunk of one round (workers space-separated)."""

    scheme: str
    round: int
    chunk: int
    n_covered: int  # workers whose work on the chunk entered the applied gradient
    covered_by: tuple[int, ...] | None
    computed_by: tuple[int, ...] | None  # as far as the PS knows (reports, vectors)
    wasted_by: tuple[int, ...] | None  # computed_by minus covered_by


WORKER_COLUMNS: Final[tuple[str, ...]] = tuple(f.name for f in fields(WorkerRow))
ATTRIBUTION_COLUMNS: Final[tuple[str, ...]] = tuple(f.name for f in fields(ChunkRow))
REPORT_COLUMNS: Final[tuple[str, ...]] = tuple(f.name for f in fields(ReportRow))


def _kind(tp: Any) -> type:
    """The scalar type a CSV cell of annotation ``tp`` parses to (``X | None`` -> ``X``)."""
    args = [a for a in get_args(tp) if a is not type(None)]
    base = args[0] if args and get_origin(tp) in (UnionType, Union) else tp
    origin = get_origin(base)
    if origin is tuple:
        return list if float in get_args(base) else tuple  # list: of floats
    for kind in (str, int, float):  # str first: a StrEnum (status) is written as its value
        if isinstance(base, type) and issubclass(base, kind):
            return kind
    raise TypeError(f"no CSV cell type for annotation {tp!r}")


def _column_types() -> dict[str, dict[str, type]]:
    """Cell type of every column of every CSV file, derived from the dataclasses."""
    hints = get_type_hints(RoundRecord)
    rounds: dict[str, type] = {"duration_s": float, "workers_present": int}
    for f in fields(RoundRecord):
        if f.name not in NOT_IN_ROUNDS:
            rounds[COLUMN_OF_FIELD.get(f.name, f.name)] = _kind(hints[f.name])
    missing = set(ROUND_COLUMNS) - set(rounds)
    if missing:  # as_row grew a column this module does not know how to read back
        raise TypeError(f"rounds.csv columns without a RoundRecord field: {sorted(missing)}")
    out = {"rounds.csv": rounds}
    for name, cls in (("workers.csv", WorkerRow), ("reports.csv", ReportRow),
                      ("attribution.csv", ChunkRow)):
        h = get_type_hints(cls)
        out[name] = {f.name: _kind(h[f.name]) for f in fields(cls)}
    return out


#: ``{file: {column: int | float | str | tuple}}``: how :func:`load_run` parses each cell.
COLUMN_TYPES: Final = _column_types()


def is_trigger_scheme(scheme: str) -> bool:
    """Whether the label ``scheme`` names a scheme whose PS triggers encoding (neither
    send-when-done nor streaming).

    Asks the scheme registry (:func:`aiogc.coding.registry.spec_of_label`): a registered name,
    or one followed by ``-variant`` / ``:variant`` (``partial-random``).

    Raises
    ------
    ConfigError
        If the label names no registered scheme.
    """
    spec = spec_of_label(scheme)
    return not spec.sends_when_done and not spec.uploads_per_chunk


# ------------------------------------------------------------------------------ formatting


def to_jsonable(obj: Any) -> Any:
    """``obj`` with numpy values made plain and non-finite floats made ``None`` (strict JSON).

    Dicts get string keys; tuples, sets and arrays become lists; paths become strings; any
    other object falls back to ``str(obj)`` so a manifest never fails to write.
    """
    if obj is None or isinstance(obj, bool | str):
        return obj
    if isinstance(obj, int | np.integer):
        return int(obj)
    if isinstance(obj, float | np.floating):
        x = float(obj)
        return x if math.isfinite(x) else None
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        items = sorted(obj, key=repr) if isinstance(obj, set | frozenset) else obj
        return [to_jsonable(v) for v in items]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    return str(obj)


def write_json(path: Path, obj: Any) -> None:
    text = json.dumps(to_jsonable(obj), indent=2, sort_keys=False, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")


def write_json_compact(path: Path, obj: Any) -> None:
    """``obj`` as one line of strict JSON, for large machine-read files (the trace): plain
    values go straight to the encoder; only when it meets something it cannot write strictly
    (a NaN, a numpy value) is ``obj`` converted by :func:`to_jsonable` first."""
    try:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        text = json.dumps(to_jsonable(obj), separators=(",", ":"), allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")


def format_cell(v: Any) -> str:
    """One CSV cell: ``None`` -> empty, floats in ``repr`` form, bools as 0/1."""
    if v is None:
        return ""
    t = type(v)  # the common exact types first: the batch writer formats many cells
    if t is float:
        return repr(v)
    if t is int or t is str:
        return str(v)
    if isinstance(v, bool | np.bool_):
        return "1" if v else "0"
    if isinstance(v, float | np.floating):
        return repr(float(v))
    if isinstance(v, int | np.integer):
        return str(int(v))
    return str(v)


def parse_cell(kind: type, s: str) -> Any:
    if s == "":
        return None
    if kind is tuple:
        return [int(x) for x in s.split()]
    if kind is list:
        return [float(x) for x in s.split()]
    return kind(s)


def read_csv(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    types = COLUMN_TYPES.get(path.name, {})
    text = path.read_text(encoding="utf-8")
    if text and not text.endswith("\n"):
        # a run killed mid-write: its last row is incomplete, drop it
        text = text[: text.rfind("\n") + 1]
    from aiogc.harness.runfiles import read_csv_rows

    return read_csv_rows(path, text, types, parse_cell)


# ------------------------------------------------------------------------------ per-worker rows


def worker_tuples(
    scheme: str, record: RoundRecord, m: int, loads: Sequence[int], partial: bool
) -> list[tuple[Any, ...]]:
    """The ``m`` rows of ``workers.csv`` for one round, as tuples in :data:`WORKER_COLUMNS`
    order (see :func:`worker_rows`)."""
    done = [0] * m
    for _, w, count, _ in record.reports:
        if 0 <= w < m:
            done[w] = max(done[w], int(count))
    order = {
        w: i + 1 for i, (_, w) in enumerate(sorted((t, w) for w, t in record.arrivals.items()))
    }
    arrivals, compute_s, dropped, state = (record.arrivals, record.compute_s, record.dropped,
                                           record.state)
    t_start, t_trigger, rnd = record.t_start, record.t_trigger, record.round
    streams = _streams(scheme)
    att = _worker_attribution(record, m, _done_counts(record, m, loads, partial, streams))
    rows = []
    for w in range(m):
        arrival = arrivals.get(w)
        compute = compute_s.get(w)
        chunks_done = done[w]
        if arrival is not None and not partial and not streams:
            # a send-when-done vector means every chunk was computed, last reports in flight
            chunks_done = max(chunks_done, int(loads[w]))
        comm: float | None = None
        if arrival is not None:
            if partial:
                if t_trigger is not None:
                    comm = arrival - t_trigger
            elif compute is not None:
                comm = arrival - t_start - compute
        rows.append((
            rnd, scheme, w, int(loads[w]), chunks_done,
            int(state[w]) if w < len(state) else 0,
            compute, arrival, comm, order.get(w),
            int(arrival is None or w in dropped), dropped.get(w, ""),
            *att[w],
        ))
    return rows


def _streams(label: str) -> bool:
    """Whether ``label`` names a streaming scheme, whose chunk frames are its reports (a
    label outside the registry reads as not streaming)."""
    try:
        return spec_of_label(label).uploads_per_chunk
    except ConfigError:
        return False


def _done_counts(record: RoundRecord, m: int, loads: Sequence[int], partial: bool,
                 streams: bool) -> list[int]:
    """Chunks each worker computed as the PS knows it: its largest reported count, or its
    whole load once its send-when-done vector arrived (``chunks_done`` of workers.csv; a
    streaming worker's frames are its reports)."""
    done = [0] * m
    for _, w, count, _ in record.reports:
        if 0 <= w < m:
            done[w] = max(done[w], int(count))
    if not partial and not streams:
        for w in record.arrivals:
            if 0 <= w < m:
                done[w] = max(done[w], int(loads[w]))
    return done


def _worker_attribution(record: RoundRecord, m: int, done: Sequence[int]
                        ) -> list[tuple[Any, ...]]:
    """The attribution cells of each worker's row: ``used, weight, chunks_entered,
    chunks_wasted`` (all None without an attribution)."""
    att = record.attribution
    if att is None:
        return [(None, None, None, None)] * m
    W = np.asarray(att.weights)
    used = used_workers(W)
    entered = entered_counts(record.state, W, record.status != "failed")
    return [(int(used[w]), " ".join(repr(float(x)) for x in W[:, w]), entered[w],
             max(0, int(done[w]) - entered[w])) for w in range(m)]


def chunk_tuples(scheme: str, record: RoundRecord, m: int, loads: Sequence[int], partial: bool
                 ) -> list[tuple[Any, ...]]:
    """The ``attribution.csv`` rows of one round (:data:`ATTRIBUTION_COLUMNS` order), one per
    chunk; none when the record has no attribution."""
    att = record.attribution
    if att is None:
        return []
    entered = entered_counts(record.state, att.weights, record.status != "failed")
    done = _done_counts(record, m, loads, partial, _streams(scheme))
    return [(scheme, record.round, c.chunk, len(c.covered_by), " ".join(map(str, c.covered_by)),
             " ".join(map(str, c.computed_by)), " ".join(map(str, c.wasted_by)))
            for c in chunk_cover(att.orders, att.n_chunks, entered, done)]


def worker_rows(
    scheme: str,
    record: RoundRecord,
    *,
    m: int,
    loads: Sequence[int],
    trigger_scheme: bool | None = None,
) -> list[dict[str, Any]]:
    """The ``m`` rows of ``workers.csv`` for one round (see the module docstring).

    Parameters
    ----------
    scheme : str
        Label written in the ``scheme`` column.
    record : RoundRecord
        The round, as the PS recorded it.
    m : int
        Number of workers.
    loads : sequence of int, length m
        Chunks assigned to each worker.
    trigger_scheme : bool, optional
        Whether the PS triggers encoding (partial scheme); default :func:`is_trigger_scheme`
        of ``scheme``. Decides how ``comm_s`` is measured.
    """
    if len(loads) != m:
        raise ValueError(f"len(loads)={len(loads)} != m={m}")
    partial = is_trigger_scheme(scheme) if trigger_scheme is None else trigger_scheme
    return [dict(zip(WORKER_COLUMNS, row, strict=True))
            for row in worker_tuples(scheme, record, m, loads, partial)]
