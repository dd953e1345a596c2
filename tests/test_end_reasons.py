"""Round end reasons are codes (:class:`aiogc.protocol.status.EndReason`) with the particulars in
``end_detail``: set by the PS, written to rounds.csv, read back, summarised and printed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aiogc.coding.consistency import RoundGuard, Verdict
from aiogc.config import RunConfig
from aiogc.core.common import RoundRecord
from aiogc.errors import ConfigError
from aiogc.harness.kit import format_summary, run_end_reason
from aiogc.harness.loaders import load_run, records_from_run
from aiogc.harness.records import RunRecorder
from aiogc.harness.summary import summarize
from aiogc.protocol.status import EndReason, RoundStatus, describe_end
from tests.helpers import build_rig

CFG = RunConfig(workers=6, delta=3, rounds=3, delay="exp:0.05", seed=3,
                task="linreg:samples=240,dim=12", heartbeat_s=None, dead_after_s=None)


class _RejectRound1(RoundGuard):
    """A guard that refuses the second decoded step (whatever it is) and passes the rest."""

    def check(self, **kw: Any) -> tuple[Verdict | None, np.ndarray | None]:
        bad, new = super().check(**kw)
        if self.checked == 2:
            return Verdict(False, "oracle", "refused by the test"), None
        return bad, new


def test_a_rejected_step_fails_the_round_as_rejected() -> None:
    rig = build_rig(CFG)
    rig.aggregator.guard = _RejectRound1(rig.ps.model,
                                         predicted_error=rig.aggregator.predicted_error)
    rig.sim.run()
    reasons = [(r.status, r.end_reason, r.end_detail) for r in rig.ps.records]
    assert reasons[1] == (RoundStatus.FAILED, EndReason.REJECTED,
                          "rejected by oracle check: refused by the test")
    for status, reason, detail in (reasons[0], reasons[2]):
        assert status == RoundStatus.EXACT and detail == ""
        assert isinstance(reason, EndReason) and reason in (EndReason.DECODABLE,
                                                            EndReason.ALL_EXPECTED)


def test_a_nonfinite_decode_fails_the_round_as_nonfinite(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = build_rig(CFG.replace(rounds=2))
    decode = rig.aggregator._decode
    calls: list[int] = []

    def poisoned(rows: np.ndarray, state: np.ndarray, dim: int) -> Any:
        calls.append(1)
        res = decode(rows, state, dim)
        if len(calls) == 1:
            return dataclasses.replace(res, gradient=np.full_like(res.gradient, np.inf))
        return res

    monkeypatch.setattr(rig.aggregator, "_decode", poisoned)
    rig.sim.run()
    r0, r1 = rig.ps.records
    assert (r0.status, r0.end_reason, r0.end_detail) == (
        RoundStatus.FAILED, EndReason.NONFINITE, "decoded gradient is not finite")
    assert r1.status == RoundStatus.EXACT and r1.end_reason is not None


def test_a_running_round_has_no_end_reason() -> None:
    rec = RoundRecord(round=0, scheme="partial", t_start=0.0)
    assert rec.end_reason is None and rec.end_detail == ""
    assert rec.as_row()["end_reason"] is None


def test_codes_and_details_round_trip_and_reach_the_summary(tmp_path: Path) -> None:
    recs = [
        RoundRecord(round=0, scheme="partial", t_start=0.0, t_end=1.0, status=RoundStatus.EXACT,
                    end_reason=EndReason.ALL_EXPECTED),
        RoundRecord(round=1, scheme="partial", t_start=1.0, t_end=2.0,
                    status=RoundStatus.FAILED, end_reason=EndReason.WORKERS_GONE,
                    end_detail="cannot decode: workers [2, 3] gone"),
    ]
    with RunRecorder(tmp_path, {}) as rec:
        for r in recs:
            rec.round("partial", r, m=4, loads=[1, 1, 1, 1])
        summary = summarize({"partial": recs}, end_reasons={"partial": "all rounds done"})
        rec.close(summary)
    run = load_run(tmp_path)
    assert [r["end_detail"] for r in run["rounds"]] == [None, "cannot decode: workers [2, 3] gone"]
    back = records_from_run(run)["partial"]
    assert [r.end_reason for r in back] == [EndReason.ALL_EXPECTED, EndReason.WORKERS_GONE]
    assert all(type(r.end_reason) is EndReason for r in back)
    assert [r.end_detail for r in back] == ["", "cannot decode: workers [2, 3] gone"]
    failed = json.loads((tmp_path / "summary.json").read_text())["schemes"]["partial"][
        "failed_rounds"]
    assert failed == [{"round": 1, "reason": "workers_gone",
                       "detail": "cannot decode: workers [2, 3] gone"}]
    line = run_end_reason({"partial": "all rounds done"}, (), summary)
    assert "first: round 1: cannot decode: workers [2, 3] gone (workers_gone)" in line
    assert "round 1: cannot decode: workers [2, 3] gone (workers_gone)" in format_summary(summary)


def test_describe_end() -> None:
    assert describe_end(EndReason.TIMEOUT, "round timeout (60 s)") == \
        "round timeout (60 s) (timeout)"
    assert describe_end(EndReason.DEADLINE) == "deadline"
    assert describe_end(None, None) == "no reason given"


def test_rounds_csv_of_an_older_run_keeps_its_free_text_as_the_detail(tmp_path: Path) -> None:
    """A run directory written before the ``end_detail`` column had free text in
    ``end_reason``: it still loads (code unknown, the text kept as the detail); in a current
    file a value outside the vocabulary is an error."""
    header = ("scheme,round,start_s,trigger_s,end_s,duration_s,status,end_reason,attempts,"
              "state,coverage_min,residual,amplification,rel_error,rel_error_plain,loss,"
              "oracle_s\r\n")
    (tmp_path / "rounds.csv").write_text(
        header + "partial,0,0.0,,1.0,1.0,failed,round timeout (10 s),0,0 0,0,nan,nan,nan,nan,"
        "nan,\r\npartial,1,1.0,1.5,2.0,1.0,exact,decodable,1,1 1,1,0.0,1.0,nan,nan,nan,\r\n",
        encoding="utf-8")
    a, b = records_from_run(load_run(tmp_path))["partial"]
    assert (a.end_reason, a.end_detail) == (None, "round timeout (10 s)")
    assert (b.end_reason, b.end_detail) == (EndReason.DECODABLE, "")
    with RunRecorder(tmp_path / "new", {}, trace=False) as rec:
        rec.round("partial", RoundRecord(round=0, scheme="partial", t_start=0.0,
                                         end_reason="why"),  # type: ignore[arg-type]
                  m=1, loads=[1])
    with pytest.raises(ConfigError, match="end_reason='why'"):
        records_from_run(load_run(tmp_path / "new"))
