"""Locating a liar at the ``aiogc run`` level: ``--locate N`` through the options and the CLI,
and the eviction in the run directory (events.jsonl, summary.json, workers.csv, the printed
summary). One loopback run (port 0, coroutine workers, one authenticated liar); the rest is
validation without sockets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from aiogc.cli import EXIT_CONFIG, EXIT_OK, main
from aiogc.config import RunConfig
from aiogc.errors import ConfigError
from aiogc.harness.columns import read_csv
from aiogc.harness.evictions import check_run_locate, eviction_lines, locate_ps_options
from aiogc.harness.loaders import load_events
from aiogc.training.locate import LOCATE_SPARE_WAIT, MAX_LOCATE, check_locate, locate_spares
from tests.helpers import Scale3

ORIGINAL = RunConfig(scheme="original", workers=16, delta=4, rounds=4)


def test_locate_implies_two_spares_and_a_default_spare_wait() -> None:
    assert locate_spares(None, None) == (0.0, 1)
    assert locate_spares(None, 0.5) == (0.5, 1)
    assert locate_spares(3, None) == (LOCATE_SPARE_WAIT, 2)
    assert locate_spares(3, 7.0) == (7.0, 2)
    opts = locate_ps_options(ORIGINAL, 3, None)
    assert (opts.spares, opts.spare_wait) == (2, LOCATE_SPARE_WAIT)
    with pytest.raises(ConfigError) as exc:
        locate_spares(3, 0.0)  # an explicit 0 never waits for a spare: nothing to locate with
    assert exc.value.field == "spare_wait"


@pytest.mark.parametrize("bad", [-1, MAX_LOCATE + 1, True, 2.5])
def test_locate_range_is_validated(bad: Any) -> None:
    with pytest.raises(ConfigError) as exc:
        check_locate(bad, ORIGINAL)
    assert exc.value.field == "locate" and f"[0, {MAX_LOCATE}]" in str(exc.value)


@pytest.mark.parametrize("changes, says", [
    ({"scheme": "partial"}, "broadcast state"),
    ({"scheme": "uncoded", "n_parts": 1}, "tolerates 0"),
    ({"scheme": "ignore-stragglers"}, "approximately by design"),
    ({"assignment": "fr"}, "fractional repetition"),
    ({"delta": 2}, "tolerates 1"),                 # cyclic delta=2: one spare at most
    ({"delta": 3, "n_parts": 2}, "tolerates 1"),   # delta - ell = 1
])
def test_configurations_that_cannot_locate_are_refused_saying_why(changes: dict[str, Any],
                                                                   says: str) -> None:
    with pytest.raises(ConfigError) as exc:
        check_locate(3, ORIGINAL.replace(**changes))
    assert exc.value.field == "locate" and says in str(exc.value)
    check_locate(0, ORIGINAL.replace(delta=3))  # delta - ell = 2: enough


def test_run_refuses_locate_before_starting(tmp_path: Path, capsys: Any) -> None:
    argv = ["run", "--as", "coroutines", "--workers", "8", "--delta", "4", "--rounds", "2",
            "--out", str(tmp_path / "r"), "--no-plots", "--locate", "3"]
    assert main([*argv, "--schemes", "partial,original"]) == EXIT_CONFIG
    assert "locate" in capsys.readouterr().err
    assert main([*argv, "--schemes", "original", "--spare-wait", "0"]) == EXIT_CONFIG
    assert "spare_wait" in capsys.readouterr().err
    assert main([*argv, "--schemes", "original", "--locate", "-2"]) == EXIT_CONFIG
    assert f"[0, {MAX_LOCATE}]" in capsys.readouterr().err
    assert not (tmp_path / "r" / "rounds.csv").exists()
    with pytest.raises(ConfigError, match="Ray"):
        check_run_locate(ORIGINAL, ["original"], 3, None, backend="ray")


def test_printed_line_of_an_eviction() -> None:
    lines = eviction_lines({"evicted": [{"scheme": "original", "worker": 5, "round": 4,
                                         "rounds_located": [1, 3, 4]}]})
    assert lines == ["original: worker 5 evicted after round 4 (its vectors located as "
                     "inconsistent in 3 rounds: 1, 3, 4); key refused for the rest of the run"]
    assert eviction_lines({"evicted": []}) == []


def test_aiogc_run_locate_evicts_one_authenticated_liar(tmp_path: Path, capsys: Any,
                                                       monkeypatch: Any) -> None:
    """Locating and evicting one liar through ``aiogc run``: cyclic m=16, delta=4, worker 5 sends 3x
    its coded vector every round. Every round completes exactly (the liar's rounds decoded
    without it), it is evicted after 3 located rounds, and the run says so everywhere; the
    eviction is not a shrunk run (exit 0 without --allow-shrink)."""
    import aiogc.harness.inproc as local  # where the in-process workers are made
    from aiogc.core import Worker as real

    liars: list[Scale3] = []

    def worker(j: int, **kw: Any) -> Any:
        w = real(j, **kw)
        if j == 5:
            liars.append(Scale3(w))
        return w

    monkeypatch.setattr(local, "Worker", worker)
    out = tmp_path / "run"
    rounds = 12
    # --spare-wait 100: the two spares always arrive before the wait ends (no wall-clock race);
    # the default (1) is checked above
    code = main(["run", "--schemes", "original", "--as", "coroutines", "--workers", "16",
                 "--delta", "4", "--rounds", str(rounds), "--seed", "2",
                 "--task", "linreg:samples=320,dim=12", "--delay", "exp:0.002",
                 "--locate", "3", "--spare-wait", "100", "--out", str(out), "--no-plots"])
    printed = capsys.readouterr().out
    assert code == EXIT_OK, printed
    assert liars and liars[0].sent > 0
    summary = json.loads((out / "summary.json").read_text())
    s = summary["schemes"]["original"]
    assert s["rounds"] == rounds and s["rounds_exact"] == rounds and not s["rounds_failed"]
    [ev] = summary["evicted"]
    assert ev["scheme"] == "original" and ev["worker"] == 5
    assert len(ev["rounds_located"]) == 3 and ev["round"] == ev["rounds_located"][-1]
    assert summary["membership"]["original"]["evicted"] == [[ev["round"], 5]]
    assert not summary["shrunk"]  # evicted on purpose: not a lost worker
    assert "original: worker 5 evicted after round" in printed
    events = [e for e in load_events(out) if e["kind"] == "worker_evicted"]
    assert [(e["round"], e["worker"], e["rounds_located"]) for e in events] == [
        (ev["round"], 5, ev["rounds_located"])]
    rows = read_csv(out / "rounds.csv")
    assert len(rows) == rounds and all(r["status"] == "exact" for r in rows)
    located = [r for r in rows if "worker 5 located as inconsistent" in (r["end_detail"] or "")]
    assert sorted(r["round"] for r in located) == ev["rounds_located"]
    later = [w for w in read_csv(out / "workers.csv")
             if w["worker"] == 5 and w["round"] > ev["round"]]
    assert later and all(w["dropped_reason"] == f"absent: evicted in round {ev['round']}"
                         for w in later)


def test_an_evicted_worker_exits_4_saying_so(capsys: Any) -> None:
    """``aiogc worker``'s exit path: the driver's EvictedError (an authenticated
    error(evicted)) is exit 4 with a line naming the eviction, not 3 (unreachable)."""
    from aiogc.cli import EXIT_EVICTED, EXIT_UNREACHABLE
    from aiogc.cli.remote import _worker_exit
    from aiogc.errors import EvictedError
    from aiogc.harness.kit import ExitReason

    why = "worker 5: evicted: PS closed the connection: its vectors were located as " \
          "inconsistent (round 2)"
    assert EXIT_EVICTED == 4
    assert _worker_exit([5], [EvictedError(why)], [ExitReason()]) == EXIT_EVICTED
    err = capsys.readouterr().err
    assert "aiogc worker 5: exiting: evicted by the PS" in err and "round 2" in err
    assert "key is refused" in err
    assert _worker_exit([5], [ConnectionError("unreachable")], [ExitReason()]) == \
        EXIT_UNREACHABLE
