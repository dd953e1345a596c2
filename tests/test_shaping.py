"""Live traffic shaping (aiogc/net/shaping.py): the FIFO link rule on a fake clock, the same
rule as the simulators' (aiogc/sim/comm.py), the wire left unchanged without a bandwidth, and
a loopback run whose shaped round times its own fast-path replay predicts."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from aiogc.config import RunConfig, parse_bandwidth
from aiogc.errors import ConfigError
from aiogc.harness.kit import materialise_for
from aiogc.harness.local import run_live
from aiogc.harness.options import RunOptions
from aiogc.net.shaping import SLACK_S, Link, ShapedQueue, link_for
from aiogc.sim.comm import link_exits
from aiogc.sim.fast import simulate_fast


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeTimer:
    """Remembers the armed time; the test fires it by hand."""

    def __init__(self, fire: Callable[[], None]) -> None:
        self.fire = fire
        self.when: float | None = None

    def arm(self, when: float | None) -> None:
        self.when = when

    def cancel(self) -> None:
        self.when = None


def _queue(rate: float, k: float = 1.0) -> tuple[ShapedQueue[str], list[tuple[float, str]],
                                                   FakeClock, list[FakeTimer], list[int]]:
    clock = FakeClock()
    got: list[tuple[float, str]] = []
    timers: list[FakeTimer] = []
    batches: list[int] = []

    def make_timer(fire: Callable[[], None]) -> FakeTimer:
        timers.append(FakeTimer(fire))
        return timers[-1]

    q: ShapedQueue[str] = ShapedQueue(Link(rate, k), lambda it: got.append((clock.t, it)),
                                      make_timer, clock, after=lambda: batches.append(len(got)))
    return q, got, clock, timers, batches


def test_link_is_a_fifo_serialiser_at_rate_over_k() -> None:
    link = Link(1000.0)  # 1000 B per second
    assert link.exit(0.0, 500) == pytest.approx(0.5)
    assert link.exit(0.1, 500) == pytest.approx(1.0)  # waits for the first frame
    assert link.exit(3.0, 100) == pytest.approx(3.1)  # idle link: from now
    slow = Link(1000.0, time_scale=4.0)  # bytes per *emulated* second: 4x the wall time
    assert slow.exit(0.0, 500) == pytest.approx(2.0)
    assert link_for(None, 3.0) is None
    with pytest.raises(ConfigError):
        Link(0.0)
    with pytest.raises(ConfigError):
        Link(1.0, time_scale=0.5)


def test_link_matches_the_simulators_link_exits() -> None:
    rng = np.random.default_rng(7)
    send = np.sort(rng.uniform(0.0, 1.0, size=(3, 4, 6)), axis=2)
    nbytes = rng.integers(40, 5000, size=(3, 4, 6))
    want = link_exits(send, nbytes.astype(np.float64), 20e3)
    for r in range(3):
        for j in range(4):
            link = Link(20e3)
            got = [link.exit(float(send[r, j, k]), int(nbytes[r, j, k])) for k in range(6)]
            assert got == pytest.approx(list(want[r, j]), rel=1e-12)


def test_queue_releases_in_order_once_carried_and_flushes_per_batch() -> None:
    q, got, clock, timers, batches = _queue(1000.0)
    assert q.put("a", 100) is False  # 0.1 s on the link
    assert q.put("b", 200) is False  # behind it: leaves at 0.3
    assert timers[0].when == pytest.approx(0.1)
    clock.t = 0.1
    timers[0].fire()
    assert got == [(0.1, "a")] and batches == [1]
    assert timers[0].when == pytest.approx(0.3)
    clock.t = 0.3
    timers[0].fire()
    assert [it for _, it in got] == ["a", "b"] and batches == [1, 2]
    assert timers[0].when is None
    assert q.stats() == {"frames": 2, "bytes": 300, "held_s": pytest.approx(0.1 + 0.3)}


def test_queue_early_fire_delivers_nothing_and_rearms() -> None:
    q, got, clock, timers, _ = _queue(1000.0)
    q.put("a", 100)
    clock.t = 0.05  # a loop timer that fired early
    timers[0].fire()
    assert got == [] and timers[0].when == pytest.approx(0.1)


def test_queue_slack_and_zero_bytes() -> None:
    q, got, clock, timers, _ = _queue(1e6)
    # a frame due within SLACK_S leaves at once (the caller flushes); the link is still busy
    assert q.put("tiny", int(0.5 * SLACK_S * 1e6)) is True
    assert got == [(0.0, "tiny")]
    assert q.link.free == pytest.approx(0.5 * SLACK_S)
    # a close (0 bytes) behind a waiting frame waits for it: order is kept
    q.put("big", 10_000)  # 10 ms
    assert q.put("close", 0) is False
    clock.t = q.link.free
    timers[0].fire()
    assert [it for _, it in got] == ["tiny", "big", "close"]


def test_queue_release_all_delivers_in_order_at_once() -> None:
    q, got, _, timers, batches = _queue(1000.0)
    q.put("a", 100)
    q.put("b", 100)
    q.release_all()
    assert [it for _, it in got] == ["a", "b"] and batches == [2] and timers[0].when is None


def test_queue_cancel_drops_the_waiting_items() -> None:
    q, got, _, timers, _ = _queue(1000.0)
    q.put("a", 100)
    q.put("b", 100)
    assert q.cancel() == ["a", "b"] and len(q) == 0 and timers[0].when is None and got == []


def test_bandwidth_is_left_out_of_the_welcome_unless_set() -> None:
    plain = RunConfig()
    shaped = RunConfig(bandwidth="worker=10MB/s,ps=1GB/s")
    assert "bandwidth" not in plain.to_wire()  # an unshaped welcome is byte-identical
    assert shaped.to_wire()["bandwidth"] == "worker=10MB/s,ps=1GB/s"
    assert RunConfig.from_wire(plain.to_wire()) == plain
    assert RunConfig.from_wire(shaped.to_wire()) == shaped
    assert shaped.comm == parse_bandwidth("worker=10MB/s,ps=1GB/s")
    with pytest.raises(ConfigError, match="bandwidth"):
        RunConfig(bandwidth="worker=10Mb/s")


def test_live_shaped_run_agrees_with_its_replay(tmp_path: Path) -> None:
    """A loopback run at ``worker=20KB/s,ps=20KB/s`` (frames of ~460 B: the links, not the
    compute, set the round time) at K=10. Its fidelity section replays the run's schedule
    through the fast path with the same links: live / simulated must lie in [0.97, 1.6).
    The bound means something: the same schedule without the links simulates to well under
    half the shaped time, so a run that did not shape would land near 0.4, and one that
    charged each frame twice near 2. No wall time is asserted."""
    bw = "worker=20KB/s,ps=20KB/s"
    cfg = RunConfig(workers=6, delta=2, rounds=6, delay="exp:0.02", seed=1, task="linreg",
                    heartbeat_s=None, dead_after_s=None, time_scale=10.0, bandwidth=bw)
    schedule = materialise_for(cfg, ["partial"])
    free = simulate_fast(cfg, ["partial"], schedule=schedule, dim=50)["partial"]
    shaped = simulate_fast(cfg, ["partial"], schedule=schedule, dim=50,
                           comm=cfg.comm)["partial"]
    assert shaped.completion_s.mean() > 2.0 * free.completion_s.mean()
    res = run_live(cfg, ["partial"], RunOptions(out_dir=tmp_path, plots=False, loop="asyncio"),
                   schedule=schedule)
    part = res.summary["fidelity"]["schemes"]["partial"]
    assert part["rounds_compared"] == 6
    assert part["sim_mean_s"] == pytest.approx(shaped.completion_s.mean(), rel=1e-9)
    assert 0.97 <= part["ratio"] < 1.6, part
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["config"]["bandwidth"] == bw
