"""Time dilation (``--time-scale K``): every delay and every protocol timeout times K, records
in emulated seconds. On the virtual clock the dilated run is exactly K times longer and
decides exactly the same things."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from aiogc.config import RunConfig, workload_timeouts
from aiogc.core import AUTH_DEADLINE_S, Finished, WorkerDropped
from aiogc.errors import ConfigError
from aiogc.harness.fidelity import emulated
from aiogc.harness.kit import materialise_for
from aiogc.harness.loaders import load_run
from aiogc.harness.local import run_live
from aiogc.harness.options import RunOptions
from aiogc.sim.engine import Simulation
from aiogc.training.schedule import DelaySchedule
from tests.helpers import build_rig

K = 4.0
TIMEOUTS = ("heartbeat_s", "dead_after_s", "collect_timeout_s", "round_timeout_s",
            "join_timeout_s", "deadline_s")


def _cfg(**kw: object) -> RunConfig:
    base: dict[str, object] = dict(workers=6, delta=3, rounds=4, delay="exp:0.05", seed=3,
                                   task="linreg:samples=240,dim=12", heartbeat_s=None,
                                   dead_after_s=None)
    base.update(kw)
    return RunConfig(**base)  # type: ignore[arg-type]


def test_dilated_multiplies_every_timeout_and_nothing_else() -> None:
    cfg = _cfg(mode="approx", deadline_s=0.3, heartbeat_s=1.0, dead_after_s=5.0,
               time_scale=K)
    d = cfg.dilated()
    for name in TIMEOUTS:
        assert getattr(d, name) == pytest.approx(K * getattr(cfg, name)), name
    changed = {f.name for f in dataclasses.fields(cfg)
               if getattr(cfg, f.name) != getattr(d, f.name)}
    assert changed == set(TIMEOUTS)
    assert d.time_scale == K
    plain = _cfg()
    assert plain.dilated() is plain
    assert _cfg(time_scale=K).dilated().heartbeat_s is None  # "off" stays off


def test_time_scale_is_validated() -> None:
    for bad in (0.5, 0.0, 1001.0, float("nan")):
        with pytest.raises(ConfigError, match="time_scale"):
            _cfg(time_scale=bad)


def test_welcome_carries_k_only_when_dilated() -> None:
    plain, slow = _cfg(), _cfg(time_scale=K)
    assert "time_scale" not in plain.to_wire()  # real-time welcome bytes as before
    assert slow.to_wire()["time_scale"] == K
    assert RunConfig.from_wire(plain.to_wire()) == plain
    assert RunConfig.from_wire(slow.to_wire()) == slow


def test_virtual_run_at_scale_k_is_k_times_longer_and_decides_the_same() -> None:
    real = build_rig(_cfg())
    real.sim.run()
    slow = build_rig(_cfg(time_scale=K))
    slow.sim.run()
    a, b = real.ps.records, slow.ps.records
    assert len(a) == len(b) == 4
    for x, y in zip(a, b, strict=True):
        assert y.duration_s == pytest.approx(K * x.duration_s, rel=1e-9)
        assert y.t_start == pytest.approx(K * x.t_start, rel=1e-9, abs=1e-12)
        assert (y.state, y.status, y.loss) == (x.state, x.status, x.loss)
        e = emulated(y, K)  # what the records hold
        assert e.duration_s == pytest.approx(x.duration_s, rel=1e-9)
        assert [r[3] for r in e.reports] == pytest.approx([r[3] for r in x.reports])
    # the PS runs the dilated timeouts and gives handshakes K times as long
    assert slow.ps.config.round_timeout_s == K * real.ps.config.round_timeout_s
    assert slow.ps.auth_deadline_s == pytest.approx(K * AUTH_DEADLINE_S)


def test_join_deadline_is_dilated() -> None:
    rig = build_rig(_cfg(join_timeout_s=2.5, time_scale=K))
    sim = Simulation(rig.ps, [], reconnect=False)
    sim.run()
    fin = [e for e in sim.ps_events if isinstance(e, Finished)]
    assert len(fin) == 1 and fin[0].time == pytest.approx(2.5 * K)


def test_approx_deadline_and_dead_after_are_dilated() -> None:
    """Approximate mode: each round ends at the dilated deadline; a killed worker is declared
    dead after the dilated dead-after bound (both on the virtual clock, exactly)."""
    cfg = _cfg(mode="approx", deadline_s=0.02, delay="const:0.5", rounds=2)
    real = build_rig(cfg)
    real.sim.run()
    slow = build_rig(cfg.replace(time_scale=K))
    slow.sim.run()
    for x, y in zip(real.ps.records, slow.ps.records, strict=True):
        assert x.duration_s == pytest.approx(0.02)
        assert y.duration_s == pytest.approx(K * 0.02)
        assert x.status == y.status
    hb = _cfg(heartbeat_s=0.2, dead_after_s=1.0, delay="const:0.1", rounds=10, time_scale=K)
    rig = build_rig(hb)
    rig.sim.kill(2, at=0.05, silent=True)  # SIGSTOP-like: only the heartbeat can tell
    rig.sim.run()
    drops = [e for e in rig.sim.ps_events if isinstance(e, WorkerDropped) and e.worker == 2]
    assert drops and drops[0].reason == "heartbeat_timeout"
    # silent since at most 0.05 s; declared dead after dead_after_s * K, checked every
    # heartbeat_s * K (at real time it would be about 1 s)
    assert 1.0 * K - 0.05 <= drops[0].time <= 0.05 + (1.0 + 0.2) * K + 1e-9
    # the workers run the dilated heartbeat too: it came to them in welcome
    setup = rig.workers[0].setup
    assert setup is not None and setup.config.heartbeat_s == pytest.approx(0.2 * K)


def test_live_run_at_scale_k_records_emulated_seconds(tmp_path: Path) -> None:
    """A loopback run at K=3: the manifest and the fidelity section say K, delays.csv holds
    the emulated (undilated) schedule, and the recorded round times are emulated: each is at
    least its simulated time (nothing is faster than its schedule), never ~3x it. No wall
    time is asserted."""
    cfg = _cfg(workers=4, delta=2, rounds=3, delay="const:0.02", time_scale=3.0)
    schedule = materialise_for(cfg, ["partial"])
    res = run_live(cfg, ["partial"], RunOptions(out_dir=tmp_path, plots=False,
                                                 loop="asyncio"), schedule=schedule)
    fid = res.summary["fidelity"]
    assert fid["time_scale"] == 3.0
    assert json.loads((tmp_path / "manifest.json").read_text())["config"]["time_scale"] == 3.0
    assert DelaySchedule.from_csv(tmp_path / "delays.csv") == schedule
    sim = fid["schemes"]["partial"]["sim_mean_s"]
    assert sim == pytest.approx(0.02, rel=1e-9)  # const delays: each worker's first chunk
    live = fid["schemes"]["partial"]["live_mean_s"]
    assert sim <= live < 2.0 * sim  # emulated seconds (wall / 3), not wall
    rows = load_run(tmp_path)["rounds"]
    assert [r["duration_s"] for r in rows] == pytest.approx(
        [r.duration_s for r in res.records["partial"]])


def test_workload_timeouts_follow_m_and_the_schedule() -> None:
    """The documented hierarchy: join max(30, 0.05 m); round max(60, 10 S); collect
    max(5, 2 S), S the slowest worker's round (99th percentile over the schedule)."""
    small = workload_timeouts(_cfg(), 0.1)
    assert small == {"join_timeout_s": 30.0, "round_timeout_s": 60.0, "collect_timeout_s": 5.0}
    big = workload_timeouts(_cfg(workers=2048, delta=3), 12.0)
    assert big == {"join_timeout_s": 0.05 * 2048, "round_timeout_s": 120.0,
                   "collect_timeout_s": 24.0}
    cfg = _cfg(delay="const:0.5", rounds=3)
    sched = materialise_for(cfg, ["partial"])
    assert sched.slowest_round_s() == pytest.approx(0.5 * 3)  # delta=3 chunks of 0.5 s


def test_cli_fills_only_the_timeouts_not_given() -> None:
    from aiogc.cli import build_parser, config_from_args

    p = build_parser()
    a = p.parse_args(["run", "--workers", "6", "--delta", "3", "--delay", "const:4",
                      "--join-timeout", "7"])
    cfg = config_from_args(a, "partial")
    assert cfg.join_timeout_s == 7.0  # given: kept
    assert cfg.round_timeout_s == pytest.approx(10 * 12.0)  # 3 chunks of 4 s
    assert cfg.collect_timeout_s == pytest.approx(2 * 12.0)


def test_workload_timeouts_stay_in_range_for_chunks_that_never_finish() -> None:
    t = workload_timeouts(_cfg(), 7200.0)  # a schedule with hour-long "never" chunks
    assert t["collect_timeout_s"] == 3600.0 and t["round_timeout_s"] == 72000.0
    _cfg(**t)  # valid


def test_aiogc_ps_records_emulated_seconds() -> None:
    """`aiogc ps --time-scale K` records what `aiogc run` does: round times / K."""
    from aiogc.cli.remote import _ps_event_handler
    from aiogc.core import RoundCompleted, RoundRecord

    got: list[RoundRecord] = []

    class Recorder:
        def round(self, scheme: str, rec: RoundRecord, **_: object) -> None:
            got.append(rec)

    cfg = _cfg(time_scale=K)
    handler = _ps_event_handler("partial", cfg.build_scheme(), Recorder(), [], None,
                                time_scale=K)
    rec = RoundRecord(round=0, scheme="partial", t_start=8.0, t_trigger=9.0, t_end=12.0)
    handler(RoundCompleted(rec))
    assert got[0].t_start == 8.0 / K and got[0].duration_s == pytest.approx(4.0 / K)


def test_slow_links_are_workload_for_the_timeouts() -> None:
    """With --bandwidth the round's bytes count in S (config.wire_round_s): at 10 KB/s a
    linreg:dim=10000 float64 upload alone takes 8 s, longer than the 5 s collect default."""
    from aiogc.cli import build_parser, config_from_args
    from aiogc.config import wire_round_s

    p = build_parser()
    base = ["run", "--workers", "6", "--delta", "3", "--delay", "const:0.01",
            "--task", "linreg:dim=10000"]
    free = config_from_args(p.parse_args(base), "partial")
    slow = config_from_args(p.parse_args([*base, "--bandwidth", "worker=10KB/s"]), "partial")
    wire = wire_round_s(slow, 10000)
    assert wire == pytest.approx(2 * 10000 * 8 / 10e3)  # the model down, one coded vector up
    assert wire_round_s(free, 10000) == 0.0
    assert slow.collect_timeout_s == pytest.approx(2 * (3 * 0.01 + wire))
    assert slow.collect_timeout_s > 2 * 8.0 and free.collect_timeout_s == 5.0
    # the shared ingress carries all m uploads; stream-chunks uploads delta full gradients
    ing = slow.replace(bandwidth="ps=10KB/s")
    assert wire_round_s(ing, 10000) == pytest.approx(6 * 10000 * 8 / 10e3)
    assert wire_round_s(ing.replace(scheme="stream-chunks"), 10000) == pytest.approx(
        6 * 3 * 10000 * 8 / 10e3)


def test_protocol_engine_completes_rounds_whose_uploads_outlast_the_collect_default() -> None:
    """The engine has no wall clock to guard: collect waits as long as the fast path (which
    has no such timer) -- an 8 s upload at 10 KB/s once failed every round (workers_gone)."""
    from aiogc.sim.protocol import simulate_protocol

    cfg = _cfg(workers=6, delta=3, rounds=2, delay="const:0.01", bandwidth="worker=10KB/s")
    recs = simulate_protocol(cfg, ["partial"], gradients="gaussian", dim=10000,
                             comm=cfg.comm)["partial"]
    assert [r.status for r in recs] == ["exact", "exact"]
    assert all(r.duration_s > 8.0 for r in recs)
