"""The asyncio drivers' lazy timer, on a fake loop and a fake clock (no sockets, no sleeps)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from aiogc.net import loops


class _Handle:
    def __init__(self, when: float, cb: Callable[[], None]) -> None:
        self.when = when
        self.cb = cb
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _Loop:
    """call_at / time only; the loop clock runs 1000 s ahead of the drivers' clock."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.handles: list[_Handle] = []

    def time(self) -> float:
        return self.clock[0] + 1000.0

    def call_at(self, when: float, cb: Callable[[], None]) -> _Handle:
        h = _Handle(when, cb)
        self.handles.append(h)
        return h

    def live(self) -> list[_Handle]:
        return [h for h in self.handles if not h.cancelled]

    def run_until(self, t: float) -> None:
        """Advance the clock to ``t`` firing due, uncancelled handles in time order."""
        while True:
            due = sorted((h for h in self.live() if h.when <= t + 1000.0),
                         key=lambda h: h.when)
            if not due:
                break
            h = due[0]
            self.clock[0] = max(self.clock[0], h.when - 1000.0)
            h.cancelled = True  # a fired handle is spent
            h.cb()
        self.clock[0] = t


@pytest.fixture
def rig() -> tuple[Any, _Loop, list[float], list[float]]:
    clock = [0.0]
    loop = _Loop(clock)
    fired: list[float] = []
    timer = loops._Timer(loop, lambda: fired.append(clock[0]),  # type: ignore[arg-type]
                         clock=lambda: clock[0])
    return timer, loop, clock, fired


def test_later_deadline_keeps_the_handle_earlier_one_replaces_it(rig: Any) -> None:
    timer, loop, _, fired = rig
    timer.arm(10.0)
    assert [h.when for h in loop.live()] == [1010.0]
    for later in (12.0, 10.0, 30.0):  # the usual case: no cancel, no call_at
        timer.arm(later)
    assert len(loop.handles) == 1
    timer.arm(8.0)  # earlier: a new handle, the old one cancelled
    assert [h.when for h in loop.live()] == [1008.0]
    assert loop.handles[0].cancelled
    loop.run_until(8.0)
    assert fired == [8.0]


def test_an_early_wake_up_sleeps_on_to_the_moved_deadline(rig: Any) -> None:
    timer, loop, _, fired = rig
    timer.arm(5.0)
    timer.arm(9.0)  # moved later after the handle was set
    loop.run_until(5.0)
    assert fired == []  # woke at 5, the owner wants 9: re-armed, not fired
    assert [h.when for h in loop.live()] == [1009.0]
    loop.run_until(9.0)
    assert fired == [9.0]
    loop.run_until(100.0)
    assert fired == [9.0]  # fired once; nothing armed since


def test_withdrawn_or_cancelled_deadline_never_fires(rig: Any) -> None:
    timer, loop, _, fired = rig
    timer.arm(20.0)
    timer.arm(None)
    loop.run_until(50.0)
    assert fired == []
    timer.arm(60.0)
    timer.cancel()
    assert loop.live() == []
    loop.run_until(100.0)
    assert fired == []
    timer.arm(120.0)  # usable again after a cancel
    loop.run_until(130.0)
    assert fired == [120.0]


def test_a_deadline_in_the_past_fires_at_once(rig: Any) -> None:
    timer, loop, clock, fired = rig
    clock[0] = 40.0
    timer.arm(35.0)
    assert [h.when for h in loop.live()] == [1040.0]  # now, not in the past
    loop.run_until(40.0)
    assert fired == [40.0]


def test_an_early_loop_timer_never_wakes_the_owner_before_its_deadline(rig: Any) -> None:
    """uvloop rounds delays to whole milliseconds, so its timers may fire a little early; the
    owner (a core that answers "not yet" with the same deadline) is not asked until then."""
    timer, loop, clock, fired = rig
    timer.arm(10.0)
    (handle,) = loop.live()
    clock[0] = 9.9996  # the loop fires 0.4 ms early
    handle.cancelled = True
    handle.cb()
    assert fired == []
    assert [h.when for h in loop.live()] == [1010.0]  # set again for the deadline itself
    loop.run_until(10.0)
    assert fired == [10.0]


class _StaleLoop(_Loop):
    """uvloop-like: the loop clock is the drivers' clock line, read once per iteration (here
    3 ms stale)."""

    def time(self) -> float:
        return self.clock[0] - 0.003


def test_deadlines_map_onto_a_stale_loop_clock_without_firing_early() -> None:
    clock = [100.0]
    loop = _StaleLoop(clock)
    timer = loops._Timer(loop, lambda: None, clock=lambda: clock[0])  # type: ignore[arg-type]
    timer.arm(100.010)
    # the deadline itself, not the stale loop time + 10 ms (which is 3 ms early)
    assert [h.when for h in loop.live()] == [100.010]


def test_an_early_tolerant_timer_counts_a_wake_up_within_its_tolerance_as_the_deadline(
        ) -> None:
    """``early_s``: the handle is set for the deadline itself (no bias) and a wake-up up to
    ``early_s`` early fires the owner at once, without a re-arm (no spin to the tick); one
    earlier than that sleeps on."""
    clock = [0.0]
    loop = _Loop(clock)
    fired: list[float] = []
    timer = loops._Timer(loop, lambda: fired.append(clock[0]),  # type: ignore[arg-type]
                         early_s=0.0005, clock=lambda: clock[0])
    timer.arm(10.0)
    (handle,) = loop.live()
    assert handle.when == 1010.0
    clock[0] = 9.9996  # 0.4 ms early: within the tolerance
    handle.cancelled = True
    handle.cb()
    assert fired == [9.9996]
    assert timer.due_at == 10.0  # the firing counts as the deadline
    assert loop.live() == []
    timer.arm(20.0)
    (handle,) = loop.live()
    clock[0] = 19.999  # 1 ms early: beyond it, set again for the deadline
    handle.cancelled = True
    handle.cb()
    assert fired == [9.9996]
    assert [h.when for h in loop.live()] == [1020.0]


def test_a_host_scheduler_hands_each_due_slot_the_time_its_wake_up_counts_as(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Slots due within the tolerance are woken with their own deadline (not the early clock),
    slots already past with the clock; later ones wait for the next wake-up."""
    from aiogc.net import hostclient

    clock = [0.0]
    monkeypatch.setattr(hostclient, "_tick_bias", lambda loop: 0.0005)
    loop = _Loop(clock)
    woke: list[list[tuple[int, float]]] = []
    sched: Any = None

    def on_wake(due: list[int]) -> None:
        woke.append([(i, sched.due_at[i]) for i in due])

    sched = hostclient.HostScheduler(loop, 3, on_wake,  # type: ignore[arg-type]
                                     clock=lambda: clock[0])
    sched.arm(0, 5.0)
    sched.arm(1, 5.0003)
    sched.arm(2, 5.002)
    (handle,) = loop.live()
    assert handle.when == 1005.0  # the first deadline itself
    clock[0] = 5.0001  # the loop woke 0.1 ms late for slot 0, 0.2 ms early for slot 1
    handle.cancelled = True
    handle.cb()
    assert woke == [[(0, 5.0001), (1, 5.0003)]]
    assert [h.when for h in loop.live()] == [1005.002]
