"""Experiment records: one run directory per run, tidy CSV + JSON, readable without aiogc.

A :class:`RunRecorder` writes these files into its directory, so a run can be analysed,
plotted and replayed from the files alone:

``manifest.json``
    Whatever the caller passes (version, git sha, argv, config, seed, assignment, B ...), written
    at once when the recorder is created. numpy arrays / scalars become lists / numbers.
``delays.csv``
    The materialised delay schedule (:meth:`RunRecorder.write_schedule`, via
    ``schedule.to_csv``); replayable.
``events.jsonl``
    One JSON object per frame: ``t_ns, direction, kind, scheme, round, worker, nbytes``; and
    run-level events (:meth:`RunRecorder.run_event`, ``direction == "event"``), such as
    ``run_end`` with the ``reason`` the run of a scheme ended. ``t_ns``
    must be on the same clock as the PS ``now`` values (``t_ns == round(now * 1e9)``), so frames
    and round records line up in ``trace.json`` and :func:`aiogc.inspect_run.inspect_round`.
``rounds.csv``
    One row per round and scheme: :meth:`aiogc.core.common.RoundRecord.as_row`, with ``scheme``
    set to the label the caller passed (first column).
``workers.csv``
    ``m`` rows per round (:data:`WORKER_COLUMNS`): ``round, scheme, worker, load, chunks_done``
    (largest count the PS saw; a send-when-done worker whose vector arrived counts as done),
    ``chunks_used`` (the decoding state entry), ``compute_s`` (as the worker reported it),
    ``arrival_s`` (PS time the coded vector arrived), ``comm_s``, ``arrival_order`` (1-based
    rank by arrival time, ties by worker id), ``straggler`` (1 if the worker's vector did not
    arrive or it was dropped) and ``dropped_reason``.

    ``comm_s`` is ``arrival_s - trigger_s`` for the partial-straggler scheme (the broadcast to the
    arrival: control message, encoding and upload) and ``arrival_s - start_s - compute_s`` for
    the send-when-done schemes (round start and upload legs, plus any slack between the two
    clocks). Empty when the vector did not arrive.
``reports.csv``
    Every accepted chunk-count report (:data:`REPORT_COLUMNS`): ``scheme, round, ps_time,
    worker, count, elapsed_s`` -- ``rounds.csv`` alone cannot say how a round unfolded.
``summary.json``
    :func:`summarize` of the rounds (or whatever dict the caller passes to :meth:`close`).
``trace.json``
    A Perfetto / ``chrome://tracing`` trace of the rounds seen (:func:`aiogc.trace.chrome_trace`).

Invariants
----------
* CSV files use the :mod:`csv` module, a header row, floats in ``repr`` form (exact round trip;
  ``nan`` / ``inf`` spelled that way) and an empty cell for ``None``.
* Every JSON file is strict JSON: NaN and infinities are written as ``null``.
* Rows are flushed after every round, so a crashed run leaves every finished round on disk;
  ``summary.json`` and ``trace.json`` appear only on :meth:`RunRecorder.close`.
* :func:`load_run` reads a directory back with typed values; :func:`records_from_run` rebuilds
  :class:`~aiogc.core.common.RoundRecord` objects (without gradients) from it, so plots and
  inspection need nothing but the files.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from types import TracebackType, UnionType
from typing import IO, Any, Final, Union, get_args, get_origin, get_type_hints

import numpy as np

from .coding.registry import spec_of_label
from .core.common import RoundRecord
from .delays import DelaySchedule
from .status import RoundStatus

__all__ = [
    "COLUMN_TYPES",
    "REPORT_COLUMNS",
    "ROUND_COLUMNS",
    "WORKER_COLUMNS",
    "ReportRow",
    "RunRecorder",
    "WorkerRow",
    "is_trigger_scheme",
    "load_events",
    "load_run",
    "records_from_run",
    "summarize",
    "to_jsonable",
    "worker_rows",
]

#: rounds.csv column of each RoundRecord field whose column name differs from the field name.
_COLUMN_OF_FIELD: Final[dict[str, str]] = {
    "t_start": "start_s",
    "t_trigger": "trigger_s",
    "t_end": "end_s",
    "oracle_elapsed_s": "oracle_s",
}
#: RoundRecord fields written to other files (or not at all: the gradient).
_NOT_IN_ROUNDS: Final = frozenset({"reports", "arrivals", "compute_s", "dropped", "gradient"})

#: rounds.csv columns: ``scheme`` then :meth:`RoundRecord.as_row` in its own order.
ROUND_COLUMNS: Final[tuple[str, ...]] = (
    "scheme",
    *(k for k in RoundRecord(round=0, scheme="", t_start=0.0).as_row() if k != "scheme"),
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


@dataclass(frozen=True)
class ReportRow:
    """One ``reports.csv`` row: an accepted chunk-count report."""

    scheme: str
    round: int
    ps_time: float
    worker: int
    count: int
    elapsed_s: float


WORKER_COLUMNS: Final[tuple[str, ...]] = tuple(f.name for f in fields(WorkerRow))
REPORT_COLUMNS: Final[tuple[str, ...]] = tuple(f.name for f in fields(ReportRow))


def _kind(tp: Any) -> type:
    """The scalar type a CSV cell of annotation ``tp`` parses to (``X | None`` -> ``X``)."""
    args = [a for a in get_args(tp) if a is not type(None)]
    base = args[0] if args and get_origin(tp) in (UnionType, Union) else tp
    origin = get_origin(base)
    if origin is tuple:
        return tuple
    for kind in (str, int, float):  # str first: a StrEnum (status) is written as its value
        if isinstance(base, type) and issubclass(base, kind):
            return kind
    raise TypeError(f"no CSV cell type for annotation {tp!r}")


def _column_types() -> dict[str, dict[str, type]]:
    """Cell type of every column of every CSV file, derived from the dataclasses."""
    hints = get_type_hints(RoundRecord)
    rounds: dict[str, type] = {"duration_s": float}
    for f in fields(RoundRecord):
        if f.name not in _NOT_IN_ROUNDS:
            rounds[_COLUMN_OF_FIELD.get(f.name, f.name)] = _kind(hints[f.name])
    missing = set(ROUND_COLUMNS) - set(rounds)
    if missing:  # as_row grew a column this module does not know how to read back
        raise TypeError(f"rounds.csv columns without a RoundRecord field: {sorted(missing)}")
    out = {"rounds.csv": rounds}
    for name, cls in (("workers.csv", WorkerRow), ("reports.csv", ReportRow)):
        h = get_type_hints(cls)
        out[name] = {f.name: _kind(h[f.name]) for f in fields(cls)}
    return out


#: ``{file: {column: int | float | str | tuple}}``: how :func:`load_run` parses each cell.
COLUMN_TYPES: Final = _column_types()


def is_trigger_scheme(scheme: str) -> bool:
    """Whether the label ``scheme`` names a scheme whose PS triggers encoding.

    Asks the scheme registry (:func:`aiogc.coding.registry.spec_of_label`): a registered name,
    or one followed by ``-variant`` / ``:variant`` (``partial-random``).

    Raises
    ------
    ConfigError
        If the label names no registered scheme.
    """
    return not spec_of_label(scheme).sends_when_done


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


def _write_json(path: Path, obj: Any) -> None:
    text = json.dumps(to_jsonable(obj), indent=2, sort_keys=False, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")


def _cell(v: Any) -> str:
    """One CSV cell: ``None`` -> empty, floats in ``repr`` form, bools as 0/1."""
    if v is None:
        return ""
    if isinstance(v, bool | np.bool_):
        return "1" if v else "0"
    if isinstance(v, float | np.floating):
        return repr(float(v))
    if isinstance(v, int | np.integer):
        return str(int(v))
    return str(v)


def _parse(kind: type, s: str) -> Any:
    if s == "":
        return None
    if kind is tuple:
        return [int(x) for x in s.split()]
    return kind(s)


def _read_csv(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    types = COLUMN_TYPES.get(path.name, {})
    with path.open(newline="", encoding="utf-8") as f:
        return [{k: _parse(types.get(k, str), v) for k, v in row.items()}
                for row in csv.DictReader(f)]


# ------------------------------------------------------------------------------ per-worker rows


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
    done = [0] * m
    for _, w, count, _ in record.reports:
        if 0 <= w < m:
            done[w] = max(done[w], int(count))
    order = {
        w: i + 1 for i, (_, w) in enumerate(sorted((t, w) for w, t in record.arrivals.items()))
    }
    rows = []
    for w in range(m):
        arrival = record.arrivals.get(w)
        compute = record.compute_s.get(w)
        chunks_done = done[w]
        if arrival is not None and not partial:
            # a send-when-done vector means every chunk was computed, last reports in flight
            chunks_done = max(chunks_done, int(loads[w]))
        comm: float | None = None
        if arrival is not None:
            if partial:
                if record.t_trigger is not None:
                    comm = arrival - record.t_trigger
            elif compute is not None:
                comm = arrival - record.t_start - compute
        rows.append(asdict(WorkerRow(
            round=record.round,
            scheme=scheme,
            worker=w,
            load=int(loads[w]),
            chunks_done=chunks_done,
            chunks_used=int(record.state[w]) if w < len(record.state) else 0,
            compute_s=compute,
            arrival_s=arrival,
            comm_s=comm,
            arrival_order=order.get(w),
            straggler=int(arrival is None or w in record.dropped),
            dropped_reason=record.dropped.get(w, ""),
        )))
    return rows


# ------------------------------------------------------------------------------ the recorder


class RunRecorder:
    """Writes one run directory (see the module docstring for the files and their columns).

    Parameters
    ----------
    out_dir : str or Path
        Created if missing (with parents). Existing files of the same names are overwritten.
    manifest : dict
        Written to ``manifest.json`` at once (numpy values converted, NaN -> null).
    trace : bool, default True
        Write ``trace.json`` on :meth:`close`. Keeping the trace needs the round records (held
        by reference, gradients dropped) and re-reads at most :data:`MAX_TRACE_FRAMES` frames.

    Examples
    --------
    >>> with RunRecorder(tmp / "run", {"seed": 1}) as rec:  # doctest: +SKIP
    ...     rec.round("partial", record, m=4, loads=[2, 2, 2, 2])
    """

    #: Frames beyond this many are left out of ``trace.json`` (they stay in events.jsonl):
    #: past a few hundred thousand events the trace viewers become unusable anyway.
    MAX_TRACE_FRAMES: Final = 200_000

    def __init__(
        self, out_dir: str | os.PathLike[str], manifest: Mapping[str, Any], *, trace: bool = True
    ) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._trace = trace
        self._records: dict[str, list[RoundRecord]] = {}
        self._closed = False
        _write_json(self.out_dir / "manifest.json", dict(manifest))
        self._events: IO[str] = (self.out_dir / "events.jsonl").open("w", encoding="utf-8")
        self._files: list[IO[str]] = [self._events]
        self._rounds = self._open_csv("rounds.csv", ROUND_COLUMNS)
        self._workers = self._open_csv("workers.csv", WORKER_COLUMNS)
        self._reports = self._open_csv("reports.csv", REPORT_COLUMNS)
        self.n_frames = 0

    def _open_csv(self, name: str, columns: Sequence[str]) -> Any:
        f = (self.out_dir / name).open("w", newline="", encoding="utf-8")
        self._files.append(f)
        writer = csv.writer(f)
        writer.writerow(columns)
        return writer

    # context manager ------------------------------------------------------------------

    def __enter__(self) -> RunRecorder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # writers ----------------------------------------------------------------------------

    def write_schedule(self, schedule: DelaySchedule) -> None:
        """Write ``delays.csv`` through ``schedule.to_csv(path)``."""
        schedule.to_csv(self.out_dir / "delays.csv")

    def frame(
        self,
        *,
        t_ns: int,
        direction: str,
        kind: str,
        scheme: str,
        round: int | None,
        worker: int | None,
        nbytes: int,
    ) -> None:
        """Append one frame to ``events.jsonl`` (buffered; flushed each round and on close).

        ``t_ns`` is on the PS clock (``round(now * 1e9)``); ``direction`` is ``"in"`` or
        ``"out"`` as the PS (or worker) saw it; ``round`` / ``worker`` are ``None`` for frames
        that carry none (handshake, ping).
        """
        self._check_open()
        line = {
            "t_ns": int(t_ns),
            "direction": direction,
            "kind": kind,
            "scheme": scheme,
            "round": None if round is None else int(round),
            "worker": None if worker is None else int(worker),
            "nbytes": int(nbytes),
        }
        self._events.write(json.dumps(line, separators=(",", ":")) + "\n")
        self.n_frames += 1

    def run_event(self, *, t_ns: int, kind: str, scheme: str, reason: str, **extra: Any) -> None:
        """Append a run-level event (e.g. ``kind="run_end"`` with the PS's finish reason) to
        ``events.jsonl``: ``direction`` is ``"event"``, ``round`` / ``worker`` null,
        ``nbytes`` 0, so frame readers can skip it by ``direction``."""
        self._check_open()
        line = {"t_ns": int(t_ns), "direction": "event", "kind": kind, "scheme": scheme,
                "round": None, "worker": None, "nbytes": 0, "reason": reason,
                **to_jsonable(extra)}
        self._events.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._events.flush()

    def round(
        self,
        scheme: str,
        record: RoundRecord,
        *,
        m: int,
        loads: Sequence[int],
        trigger_scheme: bool | None = None,
    ) -> None:
        """Write one ``rounds.csv`` row, ``m`` ``workers.csv`` rows and the round's reports.

        ``trigger_scheme`` overrides :func:`is_trigger_scheme` (how ``comm_s`` is measured).
        """
        self._check_open()
        row = record.as_row()
        row["scheme"] = scheme
        self._rounds.writerow([_cell(row.get(c)) for c in ROUND_COLUMNS])
        for wrow in worker_rows(scheme, record, m=m, loads=loads, trigger_scheme=trigger_scheme):
            self._workers.writerow([_cell(wrow[c]) for c in WORKER_COLUMNS])
        for t, w, count, elapsed in record.reports:
            rep = asdict(ReportRow(scheme, record.round, t, w, count, elapsed))
            self._reports.writerow([_cell(rep[c]) for c in REPORT_COLUMNS])
        if self._trace:
            # keep a gradient-free copy: the PS may hold (and later mutate) the original
            keep = RoundRecord(**{f: getattr(record, f) for f in _RECORD_FIELDS})
            keep.reports = list(record.reports)
            keep.arrivals = dict(record.arrivals)
            keep.compute_s = dict(record.compute_s)
            keep.dropped = dict(record.dropped)
            keep.gradient = None
            self._records.setdefault(scheme, []).append(keep)
        for f in self._files:
            f.flush()

    def close(self, summary: Mapping[str, Any] | None = None) -> None:
        """Flush and close the files; write ``summary.json`` (if given) and ``trace.json``.

        Idempotent: a second call only writes ``summary`` if one is given.
        """
        if not self._closed:
            self._closed = True
            for f in self._files:
                f.close()
            if self._trace:
                from .trace import chrome_trace

                frames = load_events(self.out_dir, limit=self.MAX_TRACE_FRAMES)
                _write_json(self.out_dir / "trace.json", chrome_trace(self._records, frames))
        if summary is not None:
            _write_json(self.out_dir / "summary.json", dict(summary))

    @property
    def records(self) -> dict[str, list[RoundRecord]]:
        """Gradient-free copies of the rounds written so far, by scheme label."""
        return self._records

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"RunRecorder for {self.out_dir} is closed")


_RECORD_FIELDS: Final = tuple(RoundRecord.__dataclass_fields__)


# ------------------------------------------------------------------------------ summary


def _finite(xs: Iterable[float | None]) -> list[float]:
    return [float(x) for x in xs if x is not None and math.isfinite(float(x))]


def _opt(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(float(x)) else None


#: Failed rounds listed by name in a summary at most (the count is always complete).
MAX_LISTED_FAILED_ROUNDS = 100


def _nonfinite_failure(recs: Sequence[RoundRecord]) -> tuple[int, str] | None:
    """The first round whose loss or decode error says the model was broken, with why.

    An infinite loss or decode error fails wherever it occurs. A NaN loss fails in a round that
    applied a step, once the run records losses at all (a run without a loss function has NaN
    everywhere); a NaN decode error only means the round was not verified.
    """
    losses_recorded = any(r.loss is not None and math.isfinite(r.loss) for r in recs)
    for r in recs:
        loss = float("nan") if r.loss is None else float(r.loss)
        if math.isinf(loss):
            return r.round, f"round {r.round}: loss is {loss}"
        if math.isnan(loss) and losses_recorded and r.status != "failed":
            return r.round, f"round {r.round}: loss is nan"
        rel = float("nan") if r.rel_error is None else float(r.rel_error)
        if math.isinf(rel):
            return r.round, f"round {r.round}: decode error is {rel}"
    return None


def summarize(
    records_by_scheme: Mapping[str, Sequence[RoundRecord]],
    *,
    initial_loss: float | None = None,
    end_reasons: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Per-scheme statistics of a run, JSON-serialisable (``None`` where undefined, never NaN).

    Round-time statistics cover the rounds that did not fail (a failed round produced no
    gradient step); ``wall_time_s`` sums every round. The summary reports the *worst* round,
    never hides one: any infinite loss or decode error (or a NaN loss after a step) makes the
    scheme fail, naming the first such round, and ``final_loss`` is the loss after the last
    step, not the last finite one.

    Parameters
    ----------
    records_by_scheme : mapping of str to sequence of RoundRecord
        The rounds of each scheme, in order.
    initial_loss : float, optional
        Loss of the initial model (the same for every scheme), copied to the output.
    end_reasons : mapping of str to str, optional
        Why each scheme's run ended (the PS's finish reason), copied to ``end_reason``.

    Returns
    -------
    dict
        ``{"schemes": {name: {...}}, "speedup": float | None, "speedup_vs_original": {...},
        "initial_loss": ...}``. Per scheme: ``rounds`` (completed, not failed),
        ``rounds_failed``, ``rounds_exact``, ``rounds_approximate``, ``round_time_mean_s``,
        ``round_time_p50_s``, ``round_time_p95_s``, ``round_time_max_s``, ``wall_time_s``,
        ``oracle_time_mean_s`` (mean over the rounds with an oracle time), ``overhead_ratio``
        (mean round time / mean oracle time), ``attempts_mean``, ``max_rel_decode_error``,
        ``max_residual``, ``max_amplification``, ``first_loss`` (after round 0),
        ``final_loss`` (after the last round that was not failed; None if not finite),
        ``worst_round`` (``{"round", "rel_error"}`` of the largest decode error, or None),
        ``failed_rounds`` (``[{"round", "reason"}]``, at most
        :data:`MAX_LISTED_FAILED_ROUNDS`), ``failure`` (None, or ``"round R: loss is inf"``
        and the like), ``failed_round`` (R or None) and ``end_reason`` (None if not given).
        ``speedup`` is the mean round time of ``original`` divided by that of ``partial``
        when both are present; ``speedup_vs_original`` gives the same ratio for every scheme.
        ``failures`` maps every failing scheme to its ``failure``; ``ok`` is True when there is
        none.
    """
    schemes: dict[str, dict[str, Any]] = {}
    for name, recs in records_by_scheme.items():
        ok = [r for r in recs if r.status != "failed" and r.t_end is not None]
        durations = np.array([r.duration_s for r in ok], dtype=np.float64)
        oracle = _finite(r.oracle_elapsed_s for r in ok)
        mean = float(durations.mean()) if durations.size else None
        oracle_mean = float(np.mean(oracle)) if oracle else None
        rel = _finite(r.rel_error for r in recs)
        stepped = [r for r in recs if r.status != "failed"]
        worst = max(
            ((float(r.rel_error), r.round) for r in recs
             if r.rel_error is not None and not math.isnan(float(r.rel_error))),
            default=None,
        )
        nonfinite = _nonfinite_failure(recs)
        resid = _finite(r.residual for r in ok)
        amp = _finite(r.amplification for r in ok)

        def pct(q: float, d: np.ndarray = durations) -> float | None:
            return float(np.percentile(d, q)) if d.size else None

        schemes[name] = {
            "rounds": len(ok),
            "rounds_failed": sum(r.status == "failed" for r in recs),
            "rounds_exact": sum(r.status == "exact" for r in ok),
            "rounds_approximate": sum(r.status == "approximate" for r in ok),
            "round_time_mean_s": mean,
            "round_time_p50_s": pct(50),
            "round_time_p95_s": pct(95),
            "round_time_max_s": float(durations.max()) if durations.size else None,
            "wall_time_s": float(sum(r.duration_s for r in recs)),
            "oracle_time_mean_s": oracle_mean,
            "overhead_ratio": (mean / oracle_mean if mean is not None and oracle_mean else None),
            "attempts_mean": float(np.mean([r.attempts for r in ok])) if ok else None,
            "max_rel_decode_error": max(rel) if rel else None,
            "max_residual": max(resid) if resid else None,
            "max_amplification": max(amp) if amp else None,
            "first_loss": _opt(recs[0].loss) if recs else None,
            "final_loss": _opt(stepped[-1].loss) if stepped else None,
            "worst_round": (None if worst is None
                            else {"round": worst[1], "rel_error": worst[0]}),
            "failed_rounds": [{"round": r.round, "reason": r.end_reason}
                              for r in recs if r.status == "failed"][:MAX_LISTED_FAILED_ROUNDS],
            "failure": None if nonfinite is None else nonfinite[1],
            "failed_round": None if nonfinite is None else nonfinite[0],
            "end_reason": (end_reasons or {}).get(name),
        }
    orig = schemes.get("original", {}).get("round_time_mean_s")
    part = schemes.get("partial", {}).get("round_time_mean_s")
    vs_orig = {
        name: (orig / s["round_time_mean_s"] if orig and s["round_time_mean_s"] else None)
        for name, s in schemes.items()
    }
    return to_jsonable(
        {
            "schemes": schemes,
            "speedup": orig / part if orig and part else None,
            "speedup_vs_original": vs_orig if orig else {},
            "initial_loss": _opt(initial_loss),
            "failures": {n: s["failure"] for n, s in schemes.items() if s["failure"]},
            "ok": not any(s["failure"] for s in schemes.values()),
        }
    )


# ------------------------------------------------------------------------------ reading back


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
    with path.open(encoding="utf-8") as f:
        for line in f:
            if limit is not None and len(out) >= limit:
                break
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
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
    manifest = (
        json.loads((d / "manifest.json").read_text("utf-8"))
        if (d / "manifest.json").exists()
        else {}
    )
    summary_path = d / "summary.json"
    return {
        "dir": d,
        "manifest": manifest,
        "rounds": _read_csv(d / "rounds.csv"),
        "workers": _read_csv(d / "workers.csv"),
        "reports": _read_csv(d / "reports.csv"),
        "summary": json.loads(summary_path.read_text("utf-8")) if summary_path.exists() else None,
    }


def _record_of_row(row: Mapping[str, Any]) -> RoundRecord:
    """A RoundRecord from a parsed rounds.csv row: every field written there, by the field
    list of the dataclass (an empty cell restores the field's default, e.g. NaN)."""
    kw: dict[str, Any] = {}
    for f in fields(RoundRecord):
        if f.name in _NOT_IN_ROUNDS:
            continue
        v = row.get(_COLUMN_OF_FIELD.get(f.name, f.name))
        if v is None:
            continue
        if f.name == "state":
            v = tuple(v)
        elif f.name == "status":
            v = RoundStatus.parse(v)
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
