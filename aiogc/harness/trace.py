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

Known imperfection: the chunk slices are drawn in PS time, so they include the report's
network delay; the worker's own clock (``elapsed_s``) is in each slice's args.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from aiogc.coding.registry import spec_of_label
from aiogc.core.common import RoundRecord

__all__ = ["chrome_trace"]

#: ``resume`` frames closer than this to the previous one in the same round belong to the same
#: broadcast (the PS sends one frame per worker within microseconds).
RESUME_BURST_S: Final = 1e-3

_PS_TID: Final = 0


def _us(t: float) -> float:
    return t * 1e6


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
        says of the label (:func:`aiogc.coding.registry.spec_of_label`).

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
            partial = not spec_of_label(scheme).sends_when_done
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
    return {"traceEvents": events, "displayTimeUnit": "ms"}


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
        "dur": max(0.0, _us(t1 - t0)),
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
