"""The recorder's golden calls and files (``tests/data/recorder_golden/``), shared by the tests
of the buffered recorder and of crash-safe records. Not a test module."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import numpy as np

from aiogc.core.common import RoundRecord
from aiogc.protocol.status import EndReason, RoundStatus

GOLDEN = Path(__file__).parent / "data" / "recorder_golden"
M = 3
LOADS = [2, 1, 2]


def golden_rounds() -> list[tuple[str, RoundRecord]]:
    """Rounds with every kind of cell: NaN, inf, None, a failed round, a dropped worker whose
    reason needs CSV quoting, and a second scheme."""
    a = RoundRecord(
        round=0, scheme="partial", t_start=0.125, t_trigger=0.5, t_end=0.75,
        status=RoundStatus.EXACT, end_reason=EndReason.ALL_EXPECTED, attempts=1,
        state=(2, 1, 0), coverage_min=1, residual=1e-15, amplification=1.5,
        rel_error=1 / 3, rel_error_plain=2e-7, loss=3.0, oracle_elapsed_s=0.5,
        reports=[(0.2, 0, 1, 0.19), (0.3, 1, 1, 0.29), (0.4, 0, 2, 0.1 + 0.2)],
        arrivals={1: 0.7, 0: 0.6}, compute_s={0: 0.4, 1: 0.3},
    )
    b = RoundRecord(
        round=1, scheme="partial", t_start=0.75, t_trigger=None, t_end=1.5,
        status=RoundStatus.APPROXIMATE, end_reason=EndReason.DEADLINE, attempts=2,
        state=(0, 1, 1), coverage_min=0, residual=float("inf"), amplification=float("nan"),
        loss=float("-inf"), oracle_elapsed_s=None,
        reports=[(0.9, 2, 1, 0.15)], arrivals={2: 1.25}, compute_s={2: 0.5},
        dropped={0: 'lost, then "late"'},
    )
    c = RoundRecord(
        round=0, scheme="original", t_start=10.0, t_trigger=None, t_end=20.0,
        status=RoundStatus.FAILED, end_reason=EndReason.TIMEOUT, attempts=0,
        state=(2, 1, 1), reports=[(11.0, 0, 1, 1.0), (12.0, 0, 2, 2.0)],
        arrivals={0: 13.0}, compute_s={0: 2.5, 1: 9.0}, dropped={1: "timeout"},
        gradient=np.ones(4),
    )
    return [("partial", a), ("partial", b), ("original", c)]


def golden_calls(rec: Any) -> None:
    """A fixed sequence of recorder calls (frames, run events and rounds interleaved)."""
    rounds = golden_rounds()
    rec.frame(t_ns=0, direction="in", kind="hello", scheme="partial", round=None, worker=None,
              nbytes=50)
    for w in range(M):
        rec.frame(t_ns=np.int64(125_000_000 + w), direction="out", kind="round_start",
                  scheme="partial", round=np.int64(0), worker=np.int32(w), nbytes=np.int64(77))
    rec.frame(t_ns=600_000_000, direction="in", kind='odd "kind" é\n', scheme="partial",
              round=0, worker=0, nbytes=1234)
    rec.round("partial", rounds[0][1], m=M, loads=LOADS)
    rec.frame(t_ns=900_000_000, direction="in", kind="chunk_report", scheme="partial",
              round=1, worker=2, nbytes=33)
    rec.round("partial", rounds[1][1], m=M, loads=LOADS)
    rec.run_event(t_ns=2_000_000_000, kind="run_end", scheme="partial",
                  reason="all rounds done", rounds=np.int64(2), extra={"x": float("nan")})
    rec.frame(t_ns=10_000_000_000, direction="out", kind="round_start", scheme="original",
              round=0, worker=1, nbytes=77)
    rec.round("original", rounds[2][1], m=M, loads=LOADS, trigger_scheme=False)
    rec.run_event(t_ns=21_000_000_000, kind="run_end", scheme="original",
                  reason="stopped by SIGTERM", rounds=0)


def _rows_without(path: Path, *columns: str) -> str:
    """The CSV text of ``path`` with ``columns`` removed (as the csv module writes it): the
    columns added after the golden files were written."""
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    drop = {rows[0].index(c) for c in columns if c in rows[0]}
    out = io.StringIO(newline="")
    w = csv.writer(out)
    for row in rows:
        w.writerow([c for i, c in enumerate(row) if i not in drop])
    return out.getvalue()


def assert_golden(run_dir: Path) -> None:
    for name in ("events.jsonl", "reports.csv"):
        assert (run_dir / name).read_bytes() == (GOLDEN / name).read_bytes(), name
    # the attribution columns came after the golden files; without an attribution
    # in the record they are empty
    assert _rows_without(run_dir / "workers.csv", "used", "weight", "chunks_entered",
                         "chunks_wasted") == (GOLDEN / "workers.csv").read_bytes().decode("utf-8")
    assert _rows_without(run_dir / "rounds.csv", "end_detail", "workers_present") == \
        (GOLDEN / "rounds.csv").read_bytes().decode("utf-8")
