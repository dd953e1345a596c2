"""Round records (and frames) -> a Perfetto / ``chrome://tracing`` JSON trace.

Layout of :func:`chrome_trace`'s output (Trace Event Format, timestamps in microseconds of the
PS clock):

* one *process* per scheme (``pid`` 1, 2, ... in the order given), named after the scheme;
* in each, thread ``tid 0`` is the PS and thread ``tid j + 1`` is worker ``j``;
* on the PS thread: an ``X`` slice per round (``cat "round"``: start to end, args status, state,
  end reason) and instant events ``trigger`` (args: the state vector), ``resume`` (from
  outgoing ``resume`` frames, one per broadcast) and ``round end``;
* on worker threads: an ``X`` slice per accepted report (``cat "chunk"``) spanning the previous
  report's PS time (the round start for the first) to this one, named ``chunk c`` (or
  ``chunks a-c`` when a report covers several), and an ``X`` slice per arrived coded vector
  (``cat "upload"``): ``encode+upload`` from the trigger to the arrival for the partial scheme,
  ``upload`` from ``start + compute_s`` to the arrival for the send-when-done schemes;
* frames, when given, become instant events (``cat "frame"``) on their worker's thread (the PS
  thread when they name no worker), named ``"<direction> <kind>"`` with the byte count.

Slices on one track always nest (Perfetto draws a track's slices as a stack and misdraws
slices that overlap without one containing the other): a slice that would cross another on its
track -- e.g. a report that arrived after the trigger, so its chunk slice overlaps the
``encode+upload`` slice -- moves to an overflow track beside it (``tid + k * LANE_STRIDE``,
named ``"worker j (overlap k)"``). Times are rounded to whole nanoseconds so that what nests
here nests in the viewer too. :func:`nesting_violations` checks a trace.

Known imperfection: the chunk slices are drawn in PS time, so they include the report's
network delay; the worker's own clock (``elapsed_s``) is in each slice's args.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from aiogc.core.common import RoundRecord
from aiogc.harness.columns import is_trigger_scheme

__all__ = ["LANE_STRIDE", "chrome_trace", "nesting_violations"]

#: Overflow track ``k`` of thread ``tid`` is ``tid + k * LANE_STRIDE`` (above any worker id).
LANE_STRIDE: Final = 1 << 20

#: ``resume`` frames closer than this to the previous one in the same round belong to the same
#: broadcast (the PS sends one frame per worker within microseconds).
RESUME_BURST_S: Final = 1e-3

_PS_TID: Final = 0


def _us(t: float) -> float:
    """Seconds -> microseconds, rounded to whole nanoseconds (the viewer's resolution)."""
    return round(t * 1e6, 3)


def _ns(us: float) -> int:
    return round(us * 1000)


def _n_workers(recs: Sequence[RoundRecord]) -> int:
    m = 0
    for r in recs:
        m = max(m, len(r.state))
        for w in (*r.arrivals, *r.compute_s, *r.dropped, *(rep[1] for rep in r.reports)):
            m = max(m, w + 1)
    return m


def chrome_trace(
    records_by_scheme: Mapping[str, Sequence[RoundRecord]],
    frames: Sequence[Mapping[str, Any]] | None = None,
    *,
    trigger_schemes: Mapping[str, bool] | None = None,
) -> dict[str, Any]:
    """Build a Trace Event Format document from round records (see the module docstring).

    Parameters
    ----------
    records_by_scheme : mapping of str to sequence of RoundRecord
        Rounds of each scheme; each scheme becomes one process.
    frames : sequence of dict, optional
        Rows of ``events.jsonl`` (``t_ns`` on the PS clock). Frames of a scheme not in
        ``records_by_scheme`` are ignored.
    trigger_schemes : mapping of str to bool, optional
        Whether each scheme triggers encoding (partial); default: what the scheme registry
        says of the label (:func:`aiogc.harness.columns.is_trigger_scheme`).

    Returns
    -------
    dict
        ``{"traceEvents": [...], "displayTimeUnit": "ms"}``; load it in ui.perfetto.dev or
        chrome://tracing.
    """
    events: list[dict[str, Any]] = []
    pids: dict[str, int] = {}
    for i, (scheme, recs) in enumerate(records_by_scheme.items()):
        pid = i + 1
        pids[scheme] = pid
        partial = (trigger_schemes or {}).get(scheme)
        if partial is None:
            partial = is_trigger_scheme(scheme)
        events.append(_meta(pid, None, "process_name", name=scheme))
        events.append(_meta(pid, None, "process_sort_index", sort_index=pid))
        events.append(_meta(pid, _PS_TID, "thread_name", name="PS"))
        events.append(_meta(pid, _PS_TID, "thread_sort_index", sort_index=0))
        for w in range(_n_workers(recs)):
            events.append(_meta(pid, w + 1, "thread_name", name=f"worker {w}"))
            events.append(_meta(pid, w + 1, "thread_sort_index", sort_index=w + 1))
        for rec in recs:
            events.extend(_round_events(pid, rec, partial))
    if frames:
        events.extend(_frame_events(frames, pids))
    return {"traceEvents": _nested(events), "displayTimeUnit": "ms"}


def _nested(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Move every ``X`` slice that would cross another on its track to an overflow track
    (the first lane where it starts after the open slices end or fits inside the innermost);
    adds the overflow tracks' names."""
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    by_track: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in events:
        if e["ph"] == "X":
            by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    extra: list[dict[str, Any]] = []
    for (pid, tid), slices in by_track.items():
        lanes: list[list[int]] = []  # per lane: the end times (ns) of its open slices
        for e in sorted(slices, key=lambda x: (_ns(x["ts"]), -_ns(x["dur"]))):
            t0 = _ns(e["ts"])
            t1 = t0 + _ns(e["dur"])
            k = _lane(lanes, t0, t1)
            if k == len(lanes):
                lanes.append([])
                if k:
                    name = names.get((pid, tid), f"thread {tid}")
                    extra.append(_meta(pid, tid + k * LANE_STRIDE, "thread_name",
                                       name=f"{name} (overlap {k})"))
                    extra.append(_meta(pid, tid + k * LANE_STRIDE, "thread_sort_index",
                                       sort_index=tid))
            lanes[k].append(t1)
            if k:
                e["tid"] = tid + k * LANE_STRIDE
    return events + extra


def _lane(lanes: list[list[int]], t0: int, t1: int) -> int:
    """The first lane where a slice ``[t0, t1]`` nests (every open slice there ended by
    ``t0``, or the innermost contains it); ``len(lanes)`` if none. Closes ended slices."""
    for k, stack in enumerate(lanes):
        while stack and stack[-1] <= t0:
            stack.pop()
        if not stack or t1 <= stack[-1]:
            return k
    return len(lanes)


def nesting_violations(trace: Mapping[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Pairs of ``X`` slices on one track (pid, tid) that overlap without one containing the
    other (in whole nanoseconds, as the viewer reads them); empty for a well-formed trace."""
    by_track: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X":
            by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    bad = []
    for slices in by_track.values():
        open_: list[tuple[int, dict[str, Any]]] = []
        for e in sorted(slices, key=lambda x: (_ns(x["ts"]), -_ns(x["dur"]))):
            t0 = _ns(e["ts"])
            t1 = t0 + _ns(e["dur"])
            while open_ and open_[-1][0] <= t0:
                open_.pop()
            if open_ and t1 > open_[-1][0]:
                bad.append((open_[-1][1], e))
            open_.append((t1, e))
    return bad


def _meta(pid: int, tid: int | None, meta: str, **args: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "M", "pid": pid, "name": meta, "args": args}
    if tid is not None:
        ev["tid"] = tid
    return ev


def _slice(
    pid: int, tid: int, name: str, cat: str, t0: float, t1: float, **args: Any
) -> dict[str, Any]:
    return {
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "name": name,
        "cat": cat,
        "ts": _us(t0),
        "dur": max(0.0, round(_us(t1) - _us(t0), 3)),
        "args": args,
    }


def _instant(pid: int, tid: int, name: str, cat: str, t: float, **args: Any) -> dict[str, Any]:
    return {
        "ph": "i",
        "s": "t",
        "pid": pid,
        "tid": tid,
        "name": name,
        "cat": cat,
        "ts": _us(t),
        "args": args,
    }


def _round_events(pid: int, rec: RoundRecord, partial: bool) -> list[dict[str, Any]]:
    r = rec.round
    end = rec.t_end if rec.t_end is not None else rec.t_start
    out = [
        _slice(
            pid,
            _PS_TID,
            f"round {r}",
            "round",
            rec.t_start,
            end,
            round=r,
            status=rec.status,
            end_reason=rec.end_reason,
            end_detail=rec.end_detail,
            state=list(rec.state),
            attempts=rec.attempts,
        )
    ]
    if rec.t_trigger is not None:
        name = "trigger" if partial else "decodable"
        out.append(
            _instant(pid, _PS_TID, name, "trigger", rec.t_trigger, round=r, state=list(rec.state))
        )
    if rec.t_end is not None:
        out.append(
            _instant(pid, _PS_TID, "round end", "round", rec.t_end, round=r, status=rec.status)
        )
    last_t: dict[int, float] = {}
    last_c: dict[int, int] = {}
    for t, w, count, elapsed in sorted(rec.reports):
        t0 = last_t.get(w, rec.t_start)
        c0 = last_c.get(w, 0)
        name = f"chunk {count}" if count == c0 + 1 else f"chunks {c0 + 1}-{count}"
        out.append(
            _slice(pid, w + 1, name, "chunk", t0, t, round=r, count=count, worker_elapsed_s=elapsed)
        )
        last_t[w], last_c[w] = t, count
    for w, t_arr in sorted(rec.arrivals.items()):
        if partial:
            start = rec.t_trigger if rec.t_trigger is not None else last_t.get(w, rec.t_start)
            name = "encode+upload"
        else:
            comp = rec.compute_s.get(w)
            start = rec.t_start + comp if comp is not None else last_t.get(w, rec.t_start)
            name = "upload"
        out.append(
            _slice(
                pid,
                w + 1,
                name,
                "upload",
                min(start, t_arr),
                t_arr,
                round=r,
                arrival_s=t_arr,
                compute_s=rec.compute_s.get(w),
            )
        )
    for w, reason in sorted(rec.dropped.items()):
        out.append(_instant(pid, w + 1, "dropped", "fault", end, round=r, reason=reason))
    return out


def _frame_events(
    frames: Sequence[Mapping[str, Any]], pids: Mapping[str, int]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    last_resume: dict[tuple[str, Any], float] = {}
    for fr in sorted(frames, key=lambda f: int(f.get("t_ns", 0))):
        scheme = str(fr.get("scheme"))
        if scheme not in pids:
            continue
        pid = pids[scheme]
        t = int(fr.get("t_ns", 0)) / 1e9
        worker = fr.get("worker")
        tid = _PS_TID if worker is None else int(worker) + 1
        kind = str(fr.get("kind", "?"))
        direction = str(fr.get("direction", "?"))
        out.append(
            _instant(
                pid,
                tid,
                f"{direction} {kind}",
                "frame",
                t,
                round=fr.get("round"),
                nbytes=fr.get("nbytes"),
            )
        )
        if kind == "resume" and direction != "in":
            key = (scheme, fr.get("round"))
            prev = last_resume.get(key)
            last_resume[key] = t
            if prev is None or t - prev > RESUME_BURST_S:
                out.append(_instant(pid, _PS_TID, "resume", "trigger", t, round=fr.get("round")))
    return out
