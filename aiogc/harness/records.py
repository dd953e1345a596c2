"""Experiment records: one run directory per run, tidy CSV + JSON, readable without aiogc.

A :class:`RunRecorder` writes these files into its directory, so a run can be analysed,
plotted and replayed from the files alone:

``manifest.json``
    Whatever the caller passes (version, git sha, argv, config, seed, assignment, B ...), written
    at once when the recorder is created. numpy arrays / scalars become lists / numbers.
``delays.csv``
    The materialised delay schedule (:meth:`RunRecorder.write_schedule`, via
    ``schedule.to_csv``); replayable. A plain CSV; its seed and specs are in the sidecar
    ``delays.json``.
``events.jsonl``
    One JSON object per frame: ``t_ns, direction, kind, scheme, round, worker, nbytes``; and
    run-level events (:meth:`RunRecorder.run_event`, ``direction == "event"``), such as
    ``run_end`` with the ``reason`` the run of a scheme ended. ``t_ns``
    must be on the same clock as the PS ``now`` values (``t_ns == round(now * 1e9)``), so frames
    and round records line up in ``trace.json`` and :func:`aiogc.harness.inspect_run.inspect_round`.
``rounds.csv``
    One row per round and scheme: :meth:`aiogc.core.common.RoundRecord.as_row`, with ``scheme``
    set to the label the caller passed (first column).
``workers.csv``
    ``m`` rows per round (:data:`.WORKER_COLUMNS`): ``round, scheme, worker, load, chunks_done``
    (largest count the PS saw; a send-when-done worker whose vector arrived counts as done),
    ``chunks_used`` (the decoding state entry), ``compute_s`` (as the worker reported it),
    ``arrival_s`` (PS time the coded vector arrived), ``comm_s``, ``arrival_order`` (1-based
    rank by arrival time, ties by worker id), ``straggler`` (1 if the worker's vector did not
    arrive or it was dropped) and ``dropped_reason``.

    ``comm_s`` is ``arrival_s - trigger_s`` for the partial-straggler scheme (the broadcast to the
    arrival: control message, encoding and upload) and ``arrival_s - start_s - compute_s`` for
    the send-when-done schemes (round start and upload legs, plus any slack between the two
    clocks). Empty when the vector did not arrive.
``attribution.csv``
    Per round, one row per chunk (:data:`.ATTRIBUTION_COLUMNS`): ``scheme, round, chunk,
    n_covered, covered_by`` (the workers whose work on the chunk entered the applied gradient),
    ``computed_by`` (the workers that computed it, as far as the PS knows), ``wasted_by``
    (computed, not used); worker lists space-separated, empty for none. With the
    ``workers.csv`` columns ``used, weight, chunks_entered, chunks_wasted`` this is the
    per-round attribution (:mod:`aiogc.core.attribution`): ``weight`` holds the decoding
    coefficients applied to the worker's coded vector (``ell`` numbers, space-separated), so
    the decoded gradient's part ``k`` is ``sum_j weight_j[k] * v_j``.
``reports.csv``
    Every accepted chunk-count report (:data:`.REPORT_COLUMNS`): ``scheme, round, ps_time,
    worker, count, elapsed_s`` -- ``rounds.csv`` alone cannot say how a round unfolded.
``summary.json``
    :func:`.summarize` of the rounds (or whatever dict the caller passes to :meth:`close`).
``trace.json``
    A Perfetto / ``chrome://tracing`` trace of the rounds seen
    (:func:`~aiogc.harness.trace.chrome_trace`), compact (one line).

The columns and cell formats are :mod:`aiogc.harness.columns`; the summary is
:mod:`aiogc.harness.summary`.

Invariants
----------
* CSV files use the :mod:`csv` module, a header row, floats in ``repr`` form (exact round trip;
  ``nan`` / ``inf`` spelled that way) and an empty cell for ``None``.
* Every JSON file is strict JSON: NaN and infinities are written as ``null``.
* Recording costs the event loop a tuple append per frame and a record copy per round: rows
  are buffered and formatted in batches, when the buffer passes :attr:`RunRecorder.flush_rows`
  rows (so memory stays bounded on long runs), on :meth:`RunRecorder.flush` and on
  :meth:`RunRecorder.close` -- which the runner calls on every way a run ends (normal end,
  error, SIGINT, SIGTERM).
* Crash safety: a recorder made with ``flush_every_s`` (the runners pass
  :data:`FLUSH_EVERY_S`, 1 s) also writes the batch at a round's end once that long has passed
  since the last write, and, on a running event loop, at most that long after a round ended
  (a timer), so a SIGKILL or OOM kill loses at most the last second of rounds. Each file gets
  its batch in one ``write`` (workers, reports and events before rounds, so a round in
  ``rounds.csv`` has its other rows on disk) and ``summary.json`` is replaced atomically
  (temp file + ``os.replace``) by a progress summary with ``"in_progress": true``; the final
  summary written by :meth:`RunRecorder.close` has ``"in_progress": false``. A directory whose
  summary still says in progress was cut short (or is still running): :func:`run_state` says
  which rounds it holds, and readers skip a truncated last line (the readers are
  :mod:`aiogc.harness.loaders`).
* ``trace.json`` appears only on :meth:`RunRecorder.close`.
* :func:`load_run` reads a directory back with typed values; :func:`records_from_run` rebuilds
  :class:`~aiogc.core.common.RoundRecord` objects (without gradients) from it, so plots and
  inspection need nothing but the files.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final

from aiogc.core.common import RoundRecord
from aiogc.core.ps_rounds import PS_STALL_DROP
from aiogc.harness.columns import (
    ATTRIBUTION_COLUMNS,
    REPORT_COLUMNS,
    ROUND_COLUMNS,
    WORKER_COLUMNS,
    chunk_tuples,
    format_cell,
    is_trigger_scheme,
    to_jsonable,
    worker_tuples,
    write_json,
    write_json_compact,
)
from aiogc.harness.loaders import (
    RunTables,
    load_events,
    load_run,
    load_run_tables,
    records_from_run,
    run_state,
)
from aiogc.training.schedule import DelaySchedule

# The readers (harness/loaders.py) are re-exported: ``aiogc.harness.records.load_run`` and
# friends were the public way to read a run directory back, and ``aiogc.load_run`` loads this
# module (tests/test_load_run.py).
__all__ = [
    "FLUSH_EVERY_S",
    "RunRecorder",
    "RunTables",
    "load_events",
    "load_run",
    "load_run_tables",
    "records_from_run",
    "run_state",
    "write_json_atomic",
]

#: How often (seconds) the runners' recorders write their batch and the progress summary.
FLUSH_EVERY_S: Final = 1.0

#: A worker dropped for one of these reasons has left the run (its connection is gone): later
#: rounds without anything from it mark it absent (:meth:`RunRecorder.round`).
LEFT_REASONS: Final = frozenset({"disconnected", "heartbeat_timeout"})

#: Leaving / rejoining workers listed per scheme in :meth:`RunRecorder.membership` at most.
MAX_MEMBER_EVENTS: Final = 100

# ------------------------------------------------------------------------------ batch formatting

#: One buffered frame: ``(t_ns, direction, kind, scheme, round, worker, nbytes)``; a buffered
#: run event is its finished ``events.jsonl`` line (a str).
_Frame = tuple[int, str, str, str, int | None, int | None, int]
#: One buffered round: ``(scheme, gradient-free copy of the record, m, loads, trigger,
#: workers present or None)``.
_PendingRound = tuple[str, RoundRecord, int, tuple[int, ...], bool, int | None]


def _event_lines(rows: Sequence[_Frame | str], mids: dict[tuple[str, str, str], str]) -> str:
    """``events.jsonl`` lines of buffered rows, byte for byte what ``json.dumps(dict,
    separators=(",", ":"))`` of the frame dict writes (keys in the order of the module
    docstring). ``mids`` caches the JSON of each (direction, kind, scheme) middle part."""
    out = []
    for row in rows:
        if isinstance(row, str):
            out.append(row)
            continue
        t, d, k, s, r, w, n = row
        mid = mids.get((d, k, s))
        if mid is None:
            mid = mids[(d, k, s)] = (f',"direction":{json.dumps(d)},"kind":{json.dumps(k)}'
                                     f',"scheme":{json.dumps(s)},"round":')
        out.append(f'{{"t_ns":{int(t)}{mid}{"null" if r is None else int(r)},"worker":'
                   f'{"null" if w is None else int(w)},"nbytes":{int(n)}}}\n')
    return "".join(out)


def _detached(record: RoundRecord) -> RoundRecord:
    """A gradient-free copy of ``record`` (the PS may hold, and later mutate, the original)."""
    keep = RoundRecord(**{f: getattr(record, f) for f in _COPIED_FIELDS})
    keep.reports = list(record.reports)
    keep.arrivals = dict(record.arrivals)
    keep.compute_s = dict(record.compute_s)
    keep.dropped = dict(record.dropped)
    return keep


# ------------------------------------------------------------------------------ the recorder


class RecordsError(OSError):
    """A file of the run directory could not be written when the run started (the message
    names it and why); a failure later in the run is :attr:`RunRecorder.write_error`."""


@contextlib.contextmanager
def _naming(path: Path) -> Iterator[None]:
    try:
        yield
    except RecordsError:
        raise
    except OSError as exc:
        raise RecordsError(f"{exc.strerror or exc} writing {path}") from exc


class RunRecorder:
    """Writes one run directory (see the module docstring for the files and their columns).

    Recording is split in two: the calls made during a run (:meth:`frame`, the callable of
    :meth:`frame_logger`, :meth:`run_event`, :meth:`round`) only append to a buffer; the rows
    are formatted and written in batches by :meth:`flush` -- called when the buffer passes
    :attr:`flush_rows` rows, and by :meth:`close`.

    Parameters
    ----------
    out_dir : str or Path
        Created if missing (with parents). Existing files of the same names are overwritten.
    manifest : dict
        Written to ``manifest.json`` at once (numpy values converted, NaN -> null).
    trace : bool, default True
        Write ``trace.json`` on :meth:`close`. Keeping the trace needs the round records
        (gradient-free copies) and re-reads at most :data:`MAX_TRACE_FRAMES` frames.
    flush_every_s : float, optional
        Crash safety (see the module docstring): write the batch and a progress
        ``summary.json`` at a round's end once this many seconds passed since the last write,
        and at most this long after a round ended when an event loop is running. Default
        None: only on the row bound, :meth:`flush` and :meth:`close`.
    clock : callable, default time.monotonic
        Seconds, for ``flush_every_s``.

    Examples
    --------
    >>> with RunRecorder(tmp / "run", {"seed": 1}) as rec:  # doctest: +SKIP
    ...     rec.round("partial", record, m=4, loads=[2, 2, 2, 2])
    """

    #: Frames beyond this many are left out of ``trace.json`` (they stay in events.jsonl):
    #: past a few hundred thousand events the trace viewers become unusable anyway.
    MAX_TRACE_FRAMES: Final = 200_000
    #: Default :attr:`flush_rows`: about 10 MB of buffered rows.
    FLUSH_ROWS: Final = 50_000

    def __init__(
        self, out_dir: str | os.PathLike[str], manifest: Mapping[str, Any], *, trace: bool = True,
        flush_every_s: float | None = None, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._trace = trace
        self._records: dict[str, list[RoundRecord]] = {}
        self._closed = False
        with _naming(self.out_dir / "manifest.json"):
            write_json(self.out_dir / "manifest.json", dict(manifest))
        with _naming(self.out_dir / "events.jsonl"):
            self._events: IO[str] = (self.out_dir / "events.jsonl").open("w",
                                                                        encoding="utf-8")
        self._files: list[IO[str]] = [self._events]
        self._rounds = self._open_csv("rounds.csv", ROUND_COLUMNS)
        self._workers = self._open_csv("workers.csv", WORKER_COLUMNS)
        self._reports = self._open_csv("reports.csv", REPORT_COLUMNS)
        self._attribution = self._open_csv("attribution.csv", ATTRIBUTION_COLUMNS)
        # the buffers: events.jsonl rows in order, and the rounds not yet written
        self._event_buf: list[_Frame | str] = []
        self._round_buf: list[_PendingRound] = []
        self._round_rows = 0  # csv rows the buffered rounds make
        self._flush_rows = self.FLUSH_ROWS
        # how many event rows fit before a flush; -1 once closed, so a late frame raises
        self._room = self._flush_rows
        self._mids: dict[tuple[str, str, str], str] = {}
        self._frames_written = 0
        # crash safety: timed writes of the batch and of a progress summary.json
        self._every = flush_every_s
        self._clock = clock
        self._last_write = clock()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None
        self._rounds_written: dict[str, int] = {}
        # per scheme: workers whose connection was lost -> the round they left in
        self._gone: dict[str, dict[int, int]] = {}
        #: scheme -> worker -> (round, PS time in ns): workers dropped while the PS stalled
        #: (not blamed on them) and not back since; those never back have left
        #: (:meth:`membership`)
        self._stall_lost: dict[str, dict[int, tuple[int, int]]] = {}
        # workers sent each (scheme, round)'s round_start (the PS's members at its start)
        self._starts: dict[tuple[str, int], set[int]] = {}
        # per scheme: m, rounds short of m, fewest present, who left / rejoined (round, worker)
        self._members: dict[str, dict[str, Any]] = {}
        self._left: dict[str, list[list[int]]] = {}
        self._rejoined: dict[str, list[list[int]]] = {}
        # per scheme: evicted workers -> the round they were evicted in
        self._evicted: dict[str, dict[int, int]] = {}
        #: the first write of the records that failed (``"No space left on device writing
        #: DIR/events.jsonl"``), None while every write succeeded; after it nothing more is
        #: written (what is on disk is kept) and the rows recorded are dropped
        self.write_error: str | None = None
        #: called once with :attr:`write_error` when it is set (the runner stops the run)
        self.on_write_error: Callable[[str], None] | None = None
        if flush_every_s is not None:
            self._write_progress()

    def _open_csv(self, name: str, columns: Sequence[str]) -> IO[str]:
        with _naming(self.out_dir / name):
            f = (self.out_dir / name).open("w", newline="", encoding="utf-8")
            self._files.append(f)
            csv.writer(f).writerow(columns)
        return f

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

    # the buffer -------------------------------------------------------------------------

    @property
    def flush_rows(self) -> int:
        """Buffered rows (frames, run events, and per round ``1 + m + len(reports)``) past
        which the buffer is written out at once: bounds the memory of a long run."""
        return self._flush_rows

    @flush_rows.setter
    def flush_rows(self, n: int) -> None:
        self._flush_rows = int(n)
        self._update_room()

    @property
    def buffered_rows(self) -> int:
        """Rows waiting to be written (counted as :attr:`flush_rows` counts them)."""
        return len(self._event_buf) + self._round_rows

    @property
    def n_frames(self) -> int:
        """Frames recorded so far (written or buffered)."""
        return self._frames_written + sum(type(r) is tuple for r in self._event_buf)

    def _update_room(self) -> None:
        self._room = -1 if self._closed else self._flush_rows - self._round_rows

    def _spill(self) -> None:
        """The buffer passed its bound (or the recorder is closed: raises)."""
        self._check_open()
        self.flush()

    def flush(self) -> None:
        """Format and write every buffered row, then flush the files."""
        self._check_open()
        self._write_buffers()

    def _write_failed(self, exc: OSError, name: str) -> None:
        """A write of ``name`` failed: keep what is on disk, write nothing more, tell the
        runner once."""
        if self.write_error is not None:
            return
        self.write_error = f"{exc.strerror or exc} writing {self.out_dir / name}"
        self._event_buf.clear()
        self._round_buf.clear()
        self._round_rows = 0
        if self.on_write_error is not None:
            self.on_write_error(self.write_error)

    def _put(self, f: IO[str], text: str) -> None:
        """Write ``text`` to ``f`` and flush it; a failure ends the recording."""
        if self.write_error is not None:
            return
        try:
            f.write(text)
            f.flush()
        except OSError as exc:
            self._write_failed(exc, Path(f.name).name)

    def _write_buffers(self) -> None:
        # events, workers and reports first, rounds.csv last: a round row on disk has its
        # other rows there too; each file gets its batch in one write
        if self.write_error is not None:  # nothing is written after a failed write
            self._event_buf.clear()
            self._round_buf.clear()
        if self._event_buf:
            rows, self._event_buf[:] = list(self._event_buf), []
            self._put(self._events, _event_lines(rows, self._mids))
            self._frames_written += sum(type(r) is tuple for r in rows)
        if self._round_buf:
            pending, self._round_buf[:] = list(self._round_buf), []
            self._write_rounds(pending)
        self._round_rows = 0
        self._update_room()
        self._last_write = self._clock()

    def _write_rounds(self, pending: Sequence[_PendingRound]) -> None:
        rounds: list[list[str]] = []
        workers: list[list[str]] = []
        reports: list[list[str]] = []
        chunks: list[list[str]] = []
        written = self._rounds_written
        for scheme, rec, m, loads, partial, present in pending:
            row = rec.as_row()
            row["scheme"] = scheme
            row["workers_present"] = present
            rounds.append([format_cell(row.get(c)) for c in ROUND_COLUMNS])
            workers.extend([format_cell(v) for v in t]
                           for t in worker_tuples(scheme, rec, m, loads, partial))
            r = format_cell(rec.round)
            reports.extend([scheme, r, format_cell(t), format_cell(w), format_cell(count),
                            format_cell(elapsed)] for t, w, count, elapsed in rec.reports)
            chunks.extend([format_cell(v) for v in t]
                          for t in chunk_tuples(scheme, rec, m, loads, partial))
            written[scheme] = written.get(scheme, 0) + 1
        for f, rows_ in ((self._workers, workers), (self._reports, reports),
                         (self._attribution, chunks), (self._rounds, rounds)):
            if rows_:
                self._put(f, _csv_text(rows_))

    # crash safety -------------------------------------------------------------------------

    def _write_progress(self) -> None:
        """Replace ``summary.json`` (atomically) by the progress summary: the run is in
        progress, with the rounds written per scheme; :meth:`close` writes the final one."""
        if self.write_error is not None:
            return
        self._write_json(self.out_dir / "summary.json", {
            "in_progress": True,
            "ok": False,
            "end_reason": None,
            "rounds_written": dict(self._rounds_written),
            "pid": os.getpid(),
            "note": "written while the run went on: if the run is gone, it was cut short "
                    "(rounds.csv holds every round written so far)",
        })

    def _write_json(self, path: Path, obj: Mapping[str, Any], *, compact: bool = False
                    ) -> None:
        """``path`` written atomically (compact: in one go); a failure ends the recording
        and leaves the previous file, if any, in place."""
        try:
            if compact:
                write_json_compact(path, obj)
            else:
                write_json_atomic(path, obj)
        except OSError as exc:
            self._write_failed(exc, path.name)

    def _timed_write(self) -> None:
        """Write the batch and the progress summary (the round-end check or the timer)."""
        self._cancel_timer()
        if self._closed:
            return
        self._write_buffers()
        self._write_progress()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_loop = None

    def _after_round(self) -> None:
        """A round ended: write now if ``flush_every_s`` passed since the last write, else
        make sure a timer on the running loop (if any) writes it that long after the last."""
        every = self._every
        if every is None:
            return
        wait = self._last_write + every - self._clock()
        if wait <= 0:
            self._timed_write()
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: the next round's end (or close) writes it
        if self._timer is None or self._timer_loop is not loop:
            self._timer = loop.call_later(wait, self._timed_write)
            self._timer_loop = loop

    # writers ----------------------------------------------------------------------------

    def write_schedule(self, schedule: DelaySchedule) -> None:
        """Write ``delays.csv`` through ``schedule.to_csv(path)``."""
        with _naming(self.out_dir / "delays.csv"):
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
        """Append one frame to ``events.jsonl`` (buffered; see :meth:`flush`).

        ``t_ns`` is on the PS clock (``round(now * 1e9)``); ``direction`` is ``"in"`` or
        ``"out"`` as the PS (or worker) saw it; ``round`` / ``worker`` are ``None`` for frames
        that carry none (handshake, ping). :meth:`frame_logger` is the same, cheaper.
        """
        self._check_open()
        self._event_buf.append((int(t_ns), direction, kind, scheme,
                                None if round is None else int(round),
                                None if worker is None else int(worker), int(nbytes)))
        if kind == "round_start" and round is not None and worker is not None:
            self._starts.setdefault((scheme, int(round)), set()).add(int(worker))
        if len(self._event_buf) > self._room:
            self._spill()

    def frame_logger(
        self,
        scheme: str,
        worker_of: Callable[[Any], int | None],
        *,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> Callable[[str, Any, Any, int], None]:
        """The drivers' ``frame_log(direction, peer, msg, nbytes)`` for one scheme: one tuple
        appended per frame (``t_ns = clock()``, the PS clock; ``kind`` and ``round`` from the
        message; ``worker = worker_of(peer)`` at the time of the frame). The row is the one
        :meth:`frame` writes. Raises ValueError once the recorder is closed.
        """
        buf = self._event_buf
        append = buf.append
        starts = self._starts

        def frame_log(direction: str, peer: Any, msg: Any, nbytes: int) -> None:
            kind = msg.kind
            r = getattr(msg, "round", None)
            w = worker_of(peer)
            append((clock(), direction, kind, scheme, r, w, nbytes))
            if kind == "round_start" and w is not None and r is not None:
                # membership: the PS starts a round with the workers it sends it to
                starts.setdefault((scheme, r), set()).add(w)
            if len(buf) > self._room:
                self._spill()

        return frame_log

    def run_event(self, *, t_ns: int, kind: str, scheme: str, reason: str, **extra: Any) -> None:
        """Append a run-level event (e.g. ``kind="run_end"`` with the PS's finish reason) to
        ``events.jsonl``: ``direction`` is ``"event"``, ``round`` / ``worker`` null,
        ``nbytes`` 0, so frame readers can skip it by ``direction``."""
        self._check_open()
        line = {"t_ns": int(t_ns), "direction": "event", "kind": kind, "scheme": scheme,
                "round": None, "worker": None, "nbytes": 0, "reason": reason,
                **to_jsonable(extra)}
        self._event_buf.append(json.dumps(line, separators=(",", ":")) + "\n")
        if len(self._event_buf) > self._room:
            self._spill()

    def round(
        self,
        scheme: str,
        record: RoundRecord,
        *,
        m: int,
        loads: Sequence[int],
        trigger_scheme: bool | None = None,
    ) -> None:
        """Buffer one ``rounds.csv`` row, ``m`` ``workers.csv`` rows and the round's reports.

        Keeps a gradient-free copy of ``record`` as it is now. ``trigger_scheme`` overrides
        :func:`is_trigger_scheme` (how ``comm_s`` is measured).
        """
        self._check_open()
        if len(loads) != m:
            raise ValueError(f"len(loads)={len(loads)} != m={m}")
        partial = is_trigger_scheme(scheme) if trigger_scheme is None else trigger_scheme
        keep = _detached(record)
        present = self._starts.pop((scheme, keep.round), None)
        if keep.dropped or self._gone.get(scheme) or self._stall_lost.get(scheme):
            self._membership(scheme, keep, present)
        out = self._mark_evicted(scheme, keep)
        self._count_members(scheme, keep.round, m - out, present)
        if self._trace:
            self._records.setdefault(scheme, []).append(keep)
        self._round_buf.append((scheme, keep, m, tuple(loads), partial,
                                None if present is None else len(present)))
        self._round_rows += (1 + m + len(keep.reports)
                             + (keep.attribution.n_chunks if keep.attribution else 0))
        self._update_room()
        if len(self._event_buf) > self._room:
            self.flush()
        self._after_round()

    def _membership(self, scheme: str, keep: RoundRecord, present: set[int] | None) -> None:
        """Workers that left (their connection was lost) and came back.

        ``present`` is who the PS started the round with (its ``round_start`` frames), None
        when the recorder saw no frames. A worker dropped for :data:`LEFT_REASONS` has left;
        in every later round it is not present in (without frames: in which nothing of it
        arrived) its ``workers.csv`` row says ``absent: left in round R`` -- not a bare
        straggler -- until it takes part again (the round's ``workers_present`` in
        ``rounds.csv`` counts every worker). ``worker_left`` / ``worker_rejoined`` events go to
        ``events.jsonl`` (``round`` and ``worker`` set, PS time of the round's end).
        """
        gone = self._gone.setdefault(scheme, {})
        # who took part in the round: its round_start's addressees, else whoever sent anything
        taking_part = present if present is not None else (
            set(keep.arrivals) | {w for _, w, _, _ in keep.reports})
        t_ns = round((keep.t_end if keep.t_end is not None else keep.t_start) * 1e9)
        for w, since in sorted(gone.items()):
            if w in keep.dropped:
                continue
            if w in taking_part:
                del gone[w]
                self._member_event(t_ns, "worker_rejoined", scheme, keep.round, w,
                                   f"left in round {since}")
            else:
                keep.dropped[w] = f"absent: left in round {since}"
        for w, why in sorted(keep.dropped.items()):
            if why in LEFT_REASONS and w not in gone:
                gone[w] = keep.round
                self._member_event(t_ns, "worker_left", scheme, keep.round, w, why)
        stall_lost = self._stall_lost.setdefault(scheme, {})
        for w in list(stall_lost):
            if w in taking_part:
                del stall_lost[w]
        for w, why in keep.dropped.items():
            if why == PS_STALL_DROP and w not in gone:
                stall_lost.setdefault(w, (keep.round, t_ns))

    def _mark_evicted(self, scheme: str, keep: RoundRecord) -> int:
        """Workers evicted before ``keep``'s round: their ``workers.csv`` rows say
        ``absent: evicted in round R``; how many there are (the round is not short of them:
        the PS refused them on purpose)."""
        out = self._evicted.get(scheme)
        if not out:
            return 0
        n = 0
        for w, at in out.items():
            if at < keep.round:
                n += 1
                if w not in keep.arrivals:
                    keep.dropped[w] = f"absent: evicted in round {at}"
        return n

    def evicted(self, scheme: str, worker: int, round_: int, *, t_ns: int, reason: str,
                **extra: Any) -> None:
        """A ``worker_evicted`` event (the PS located ``worker``'s vectors as
        inconsistent often enough and refuses its key): one ``events.jsonl`` line (``round``
        and ``worker`` set, ``extra`` such as ``rounds_located``), ``membership`` ->
        ``evicted``, and its later rounds marked absent rather than short."""
        self._check_open()
        self._evicted.setdefault(scheme, {})[int(worker)] = int(round_)
        line = {"t_ns": int(t_ns), "direction": "event", "kind": "worker_evicted",
                "scheme": scheme, "round": int(round_), "worker": int(worker), "nbytes": 0,
                "reason": reason, **to_jsonable(extra)}
        self._event_buf.append(json.dumps(line, separators=(",", ":")) + "\n")
        if len(self._event_buf) > self._room:
            self._spill()

    def _count_members(self, scheme: str, round_: int, m: int, present: set[int] | None) -> None:
        s = self._members.setdefault(scheme, {"m": m, "rounds_known": 0, "rounds_short": 0,
                                              "fewest_workers_present": None,
                                              "first_short_round": None})
        if present is None:
            return
        n = len(present)
        s["rounds_known"] += 1
        if n < m:
            s["rounds_short"] += 1
            if s["first_short_round"] is None:
                s["first_short_round"] = round_
        fewest = s["fewest_workers_present"]
        s["fewest_workers_present"] = n if fewest is None else min(fewest, n)

    def membership(self) -> dict[str, dict[str, Any]]:
        """Per scheme: ``m``, ``rounds_known`` (rounds whose members the frames told),
        ``rounds_short`` (rounds the PS started with fewer than m workers),
        ``fewest_workers_present``, ``first_short_round``, ``left`` and ``rejoined``
        (``[round, worker]`` pairs, at most :data:`MAX_MEMBER_EVENTS` each), and ``evicted``
        (``[round, worker]``) when the PS evicted anyone: an evicted worker's absence does not
        make a round short.

        Called when the run's rounds are over, before :meth:`close`: a worker dropped while
        the PS stalled that never came back has left. It gets its ``worker_left`` event now
        (dated to the round it was dropped in, reason ``ps_stall``) and is listed in
        ``left``; its rows keep ``ps_stall``, so that round is still not blamed on it.
        """
        for s, lost in self._stall_lost.items():
            for w, (r, t_ns) in sorted(lost.items(), key=lambda kv: (kv[1][0], kv[0])):
                self._member_event(t_ns, "worker_left", s, r, w, PS_STALL_DROP)
            lost.clear()
        return {s: {**v, "left": list(self._left.get(s, [])),
                    "rejoined": list(self._rejoined.get(s, [])),
                    **({"evicted": [[r, w] for w, r in sorted(self._evicted[s].items())]}
                       if self._evicted.get(s) else {})}
                for s, v in self._members.items()}

    def _member_event(self, t_ns: int, kind: str, scheme: str, round_: int, worker: int,
                      reason: str) -> None:
        into = self._left if kind == "worker_left" else self._rejoined
        listed = into.setdefault(scheme, [])
        if len(listed) < MAX_MEMBER_EVENTS:
            listed.append([int(round_), int(worker)])
        line = {"t_ns": t_ns, "direction": "event", "kind": kind, "scheme": scheme,
                "round": int(round_), "worker": int(worker), "nbytes": 0, "reason": reason}
        self._event_buf.append(json.dumps(line, separators=(",", ":")) + "\n")

    def close(self, summary: Mapping[str, Any] | None = None) -> None:
        """Write what is buffered, close the files; write ``summary.json`` (if given) and
        ``trace.json``.

        Idempotent: a second call only writes ``summary`` if one is given.
        """
        if not self._closed:
            self._cancel_timer()
            try:
                self._write_buffers()
            finally:
                self._closed = True
                self._update_room()
                for f in self._files:
                    try:
                        f.close()
                    except OSError as exc:  # the last buffered bytes did not fit
                        self._write_failed(exc, Path(f.name).name)
            if self._trace and self.write_error is None:
                from aiogc.harness.trace import chrome_trace

                frames = load_events(self.out_dir, limit=self.MAX_TRACE_FRAMES)
                self._write_json(self.out_dir / "trace.json",
                                 chrome_trace(self._records, frames), compact=True)
        if summary is not None:
            summary = dict(summary)
            if self.write_error is not None:
                summary.setdefault("records_error", self.write_error)
                summary["ok"] = False
            self._write_json(self.out_dir / "summary.json", summary)

    @property
    def records(self) -> dict[str, list[RoundRecord]]:
        """Gradient-free copies of the rounds recorded so far, by scheme label."""
        return self._records

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"RunRecorder for {self.out_dir} is closed")


_COPIED_FIELDS: Final = tuple(f for f in RoundRecord.__dataclass_fields__ if f != "gradient")


def _csv_text(rows: Sequence[Sequence[str]]) -> str:
    """``rows`` as the csv module writes them (``\\r\\n`` line ends), as one string."""
    buf = io.StringIO(newline="")
    csv.writer(buf).writerows(rows)
    return buf.getvalue()


def write_json_atomic(path: Path, obj: Any) -> None:
    """:func:`write_json` to a temporary file beside ``path``, then ``os.replace``: a reader
    (or a crash) sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write_json(tmp, obj)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # no half-written temporary left behind
        raise
