"""Summaries report the worst round and fail on non-finite values."""

from __future__ import annotations

import json
import math

from aiogc.core.common import RoundRecord
from aiogc.harness.kit import format_summary, run_complete, run_end_reason
from aiogc.harness.summary import summarize
from aiogc.protocol.status import EndReason

NAN = float("nan")


def rec(r: int, *, loss: float = 1.0, rel: float = 1e-15, status: str = "exact",
        reason: EndReason = EndReason.DECODABLE, detail: str = "") -> RoundRecord:
    return RoundRecord(round=r, scheme="partial", t_start=float(r), t_end=r + 0.5, status=status,
                       end_reason=reason, end_detail=detail, attempts=1, loss=loss,
                       rel_error=rel)


def test_blown_up_model_fails_the_run_naming_the_round() -> None:
    # the 1e300 vector: one round's loss is inf, then NaN for good
    recs = [rec(0, loss=3.0), rec(1, loss=2.0), rec(2, loss=math.inf, rel=math.inf),
            rec(3, loss=NAN, rel=NAN), rec(4, loss=NAN, rel=NAN)]
    s = summarize({"partial": recs})
    json.dumps(s, allow_nan=False)
    p = s["schemes"]["partial"]
    assert p["failure"] == "round 2: loss is inf" and p["failed_round"] == 2
    assert s["ok"] is False and s["failures"] == {"partial": "round 2: loss is inf"}
    assert p["final_loss"] is None  # not the last finite loss (2.0)
    assert not run_complete(s, 5)
    assert "FAILED: round 2: loss is inf" in format_summary(s)


def test_nan_loss_after_a_step_fails_but_unrecorded_losses_do_not() -> None:
    s = summarize({"partial": [rec(0), rec(1, loss=NAN)]})
    assert s["schemes"]["partial"]["failure"] == "round 1: loss is nan"
    # no loss function at all: NaN everywhere is "not recorded", not a failure
    s2 = summarize({"partial": [rec(0, loss=NAN), rec(1, loss=NAN)]})
    assert s2["ok"] and s2["schemes"]["partial"]["failure"] is None
    # a failed round's NaN loss (nothing applied) is not a failure either
    s3 = summarize({"partial": [rec(0), rec(1, loss=NAN, status="failed",
                                            reason=EndReason.TIMEOUT)]})
    assert s3["schemes"]["partial"]["failure"] is None and s3["failures"] == {}
    # ... but the run is not ok: a round failed, and `ok` says a run completed as configured
    assert s3["ok"] is False


def test_infinite_decode_error_fails() -> None:
    s = summarize({"partial": [rec(0), rec(1, rel=math.inf)]})
    assert s["schemes"]["partial"]["failure"] == "round 1: decode error is inf"


def test_worst_round_is_reported() -> None:
    s = summarize({"partial": [rec(0, rel=1e-15), rec(1, rel=0.44), rec(2, rel=1e-14)]})
    p = s["schemes"]["partial"]
    assert p["worst_round"] == {"round": 1, "rel_error": 0.44}
    assert "worst round 1" in format_summary(s)


def test_failed_rounds_listed_with_reasons_in_table_and_json() -> None:
    recs = [rec(0), rec(1, status="failed", reason=EndReason.WORKERS_GONE,
                    detail="cannot decode: workers [2, 3] gone"),
            rec(2), rec(3, status="failed", reason=EndReason.TIMEOUT,
                        detail="round timeout (60.0 s)")]
    s = summarize({"partial": recs}, end_reasons={"partial": "all rounds done"})
    p = s["schemes"]["partial"]
    assert p["failed_rounds"] == [
        {"round": 1, "reason": "workers_gone", "detail": "cannot decode: workers [2, 3] gone"},
        {"round": 3, "reason": "timeout", "detail": "round timeout (60.0 s)"},
    ]
    assert json.loads(json.dumps(p["failed_rounds"]))[0]["reason"] == "workers_gone"
    assert p["end_reason"] == "all rounds done"
    s["end_reason"] = "all rounds done"
    table = format_summary(s)
    assert "partial: 2 failed round(s):" in table
    assert "round 1: cannot decode: workers [2, 3] gone (workers_gone)" in table
    assert "end reason: all rounds done" in table
    assert not run_complete(s, 4)


def test_run_complete_requires_every_requested_round() -> None:
    # `aiogc run --dead-after 0.001` completed 0 rounds and exited 0
    empty = summarize({"partial": []})
    assert not run_complete(empty, 30)
    assert not run_complete({"schemes": {}}, 1)
    full = summarize({"partial": [rec(r) for r in range(3)]})
    assert run_complete(full, 3)
    assert not run_complete(full, 4)
    approx = summarize({"partial": [rec(0), rec(1, status="approximate")]})
    assert not run_complete(approx, 2)  # exact mode: an approximate round is not as configured
    assert run_complete(approx, 2, mode="approx")


def test_run_end_reason() -> None:
    assert run_end_reason({"partial": "all rounds done", "original": "all rounds done"}) == \
        "all rounds done"
    assert run_end_reason({"partial": "all rounds done", "original": "only 2 of 8 workers"}) == \
        "original: only 2 of 8 workers"
    assert run_end_reason({"partial": "signal SIGTERM"}, ["SIGTERM"]) == "stopped by SIGTERM"
    assert run_end_reason({}) == "no scheme ran"


# ------------------------------------------------------------------ ok means complete


def test_rejected_rounds_make_the_run_not_ok() -> None:
    # the run: 27 of 30 rounds rejected by the guard and `"ok": true`
    recs = [rec(r) if r < 3 else
            rec(r, status="failed", reason=EndReason.REJECTED,
                detail="rejected by norm check: gradient norm 9.5e+05 exceeds 12")
            for r in range(30)]
    s = summarize({"partial": recs}, end_reasons={"partial": "all rounds done"})
    p = s["schemes"]["partial"]
    assert s["ok"] is False
    assert p["rounds_failed"] == 27 and p["rounds_rejected"] == 27 and p["rounds"] == 3
    assert p["failure"] is None  # no non-finite value: the failure is the skipped steps
    json.dumps(s, allow_nan=False)
    # one failed round of one scheme is enough; a clean scheme beside it does not hide it
    s2 = summarize({"original": [rec(0), rec(1)],
                    "partial": [rec(0), rec(1, status="failed", reason=EndReason.TIMEOUT)]})
    assert s2["ok"] is False and s2["schemes"]["partial"]["rounds_rejected"] == 0
    assert summarize({"partial": [rec(0), rec(1)]})["ok"] is True


def test_no_verify_rounds_are_reported_unverified() -> None:
    # --no-verify: the PS has no oracle, every decode error is NaN
    s = summarize({"original": [rec(r, rel=NAN) for r in range(5)]})
    o = s["schemes"]["original"]
    assert o["verification"] == "unverified"
    assert o["rounds_verified"] == 0 and o["rounds_unverified"] == 5
    assert s["unverified"] == ["original"] and s["ok"] is True
    json.dumps(s, allow_nan=False)


def test_verified_and_partly_verified() -> None:
    s = summarize({"partial": [rec(r) for r in range(4)]})
    assert s["schemes"]["partial"]["verification"] == "verified" and s["unverified"] == []
    # approximate rounds are not held to the oracle's tolerance: not verified by it
    mixed = [rec(0), rec(1, status="approximate", reason=EndReason.DEADLINE, rel=0.3),
             rec(2, status="failed", reason=EndReason.TIMEOUT, rel=NAN)]
    p = summarize({"partial": mixed})["schemes"]["partial"]
    assert p["verification"] == "partly verified"
    # the failed round applied nothing: neither verified nor unverified
    assert p["rounds_verified"] == 1 and p["rounds_unverified"] == 1
    # nothing applied: no verdict at all
    none = summarize({"partial": [rec(0, status="failed", reason=EndReason.TIMEOUT)]})
    assert none["schemes"]["partial"]["verification"] is None
