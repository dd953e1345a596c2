"""The event loops the drivers run on and their clock: :func:`loop_factory` / :func:`run_on`
(uvloop or asyncio, no global policy touched), the drivers' default clock (:data:`MONOTONIC`,
``time.monotonic``; each driver takes its clock as a constructor argument) and
:class:`_Timer`, the one lazily re-armed loop timer per core that
:mod:`aiogc.net.drivers` drives ``next_deadline()`` with.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from aiogc.errors import ConfigError

log = logging.getLogger("aiogc.net")
_INF = float("inf")

def loop_factory(kind: str = "uvloop") -> tuple[str, Callable[[], asyncio.AbstractEventLoop]]:
    """``(kind actually used, factory)`` for ``asyncio.Runner(loop_factory=...)``.

    No global event-loop policy is touched, so library users and test runners keep theirs.
    """
    if kind not in ("uvloop", "asyncio"):
        raise ConfigError("loop", kind, "uvloop or asyncio")
    if kind == "uvloop":
        try:
            import uvloop

            return "uvloop", uvloop.new_event_loop
        except ImportError:  # pragma: no cover - platform without uvloop
            log.warning("uvloop not installed; using the default asyncio loop")
    return "asyncio", asyncio.new_event_loop


def run_on(kind: str, coro: Any) -> Any:
    """Run ``coro`` to completion on a fresh loop of ``kind`` (uvloop or asyncio)."""
    _, factory = loop_factory(kind)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


#: What the drivers read ``now`` from (seconds on any monotonic line): every live driver
#: takes one as a constructor argument (``PSServer(clock=...)``, ``ClientOptions.clock``).
Clock = Callable[[], float]
#: The drivers' default clock: time.monotonic(), not loop.time() (uvloop's loop clock has
#: millisecond resolution, too coarse for round times of a few ms). The builtin itself, not a
#: wrapper: it is read several times per frame (a Python frame per read was ~2 % of the loop).
MONOTONIC: Clock = time.monotonic


def _loop_offset(loop: asyncio.AbstractEventLoop, clock: Clock) -> float:
    """``loop.time() - clock()`` as a fixed offset between the two time lines.

    asyncio's and uvloop's loop clocks are both CLOCK_MONOTONIC, i.e. :data:`MONOTONIC`'s line:
    the offset is 0. It is *not* measured as ``loop.time() - clock()`` on every call: uvloop's
    ``time()`` is the millisecond clock cached at the start of the loop iteration, so a timer
    set at ``loop.time() + delay`` late in a busy iteration fired early by however long the
    iteration had run (a third of the workers' wake-ups at m=64 came before their deadline
    and did nothing). Another clock (a test's fake one) gets its measured offset.
    """
    off = loop.time() - clock()
    return 0.0 if abs(off) < 1.0 else off


#: uvloop's timers: libuv counts whole milliseconds, and ``call_at`` rounds the delay to the
#: *nearest* one, so a handle fires up to 0.5 ms before its deadline. Re-set for the rest of
#: it, it rounds to 0 ms and fires on the next loop iteration, and again, until the deadline
#: passes: a spin of several loop iterations per wake-up, a large share of the loop's CPU when
#: every worker wakes for each chunk. Half a millisecond added to the handle's time
#: makes the rounding go up: the handle fires at the first millisecond tick at or after the
#: deadline (never before it; on average ~0.5 ms after, within the loop's own resolution).
UVLOOP_TICK_BIAS_S = 0.0005


def _tick_bias(loop: asyncio.AbstractEventLoop) -> float:
    """Seconds added to a handle's time on ``loop``: :data:`UVLOOP_TICK_BIAS_S` on uvloop,
    0 elsewhere (asyncio's selector already rounds its timeout up)."""
    return UVLOOP_TICK_BIAS_S if type(loop).__module__.startswith("uvloop") else 0.0


class _Timer:
    """One re-armable loop timer; ``when`` is on ``clock``'s time line (default
    :data:`MONOTONIC`).

    Re-arming is lazy: the cores move their deadline after almost every pump, mostly *later*
    (a worker's next chunk, a round's timeout). Only a deadline earlier than the one the loop
    handle is set for needs a new handle; a later (or no) deadline is just remembered, and an
    early wake-up re-arms itself for it without calling ``fire``. So a pump costs one
    comparison, not a cancel and a ``call_at``.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, fire: Callable[[], None], *,
                 early_s: float = 0.0, clock: Clock = MONOTONIC) -> None:
        self._loop = loop
        self._clock = clock
        self._fire = fire
        #: ``early_s`` > 0: the handle is set for the deadline itself and a wake-up up to
        #: ``early_s`` before it counts as the deadline (the owner then acts as of the
        #: deadline): the loop's rounding errs both ways, so the mean error is ~0 instead of
        #: the bias's +0.5 ms, still with no spin. Else the handle is set :func:`_tick_bias`
        #: late and never fires early.
        self._early = early_s
        self._late = 0.0 if early_s > 0 else _tick_bias(loop)
        self._handle: asyncio.TimerHandle | None = None
        self._armed = _INF  # when the loop handle fires (clock's time line), inf if none
        self._when: float | None = None  # the deadline the owner wants
        #: the time the last firing counts as (the deadline, if the wake-up was early)
        self.due_at = 0.0

    def arm(self, when: float | None) -> None:
        self._when = when
        if when is not None and when < self._armed:
            if self._handle is not None:
                self._handle.cancel()
            self._set(when)

    def _set(self, when: float) -> None:
        self._armed = when
        loop = self._loop
        # a deadline already past: at once (the loop's next iteration)
        clock = self._clock
        self._handle = loop.call_at(max(when, clock()) + self._late + _loop_offset(loop, clock),
                                    self._on_fire)

    def _on_fire(self) -> None:
        self._handle = None
        self._armed = _INF
        when = self._when
        if when is None:
            return  # the deadline was withdrawn after this handle was set
        # a deadline that moved later meanwhile, or a loop timer that fired early (uvloop
        # rounds delays to whole milliseconds): sleep on. Never ask the core before its
        # deadline: it would only answer with the same deadline again
        now = self._clock()
        if when > now + self._early:
            self._set(when)
            return
        self._when = None
        self.due_at = when if when > now else now
        self._fire()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
        self._armed = _INF
        self._when = None
