"""Noticing that the PS's own process stopped running (SIGSTOP, a long GC, a blocked loop).

A :class:`StallWatch` ticks every :data:`TICK_S` on the event loop. When a tick (or a
:meth:`StallWatch.check` from the server before it hands a lost connection or a timer to the
PS core) finds that more than :data:`STALL_S` passed beyond the expected tick, the process did
not run for that long: ``on_stall(seconds)`` is called once, and the PS core treats the
workers' silence during it as its own (``ParameterServer.handle_timer(stalled_s=...)``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from aiogc.net.loops import MONOTONIC, Clock

__all__ = ["STALL_S", "TICK_S", "StallWatch"]

#: Interval of the watch's tick (seconds).
TICK_S: Final = 0.25
#: Lateness of a tick beyond which the PS counts as stalled (seconds).
STALL_S: Final = 0.5


class StallWatch:
    """Calls ``on_stall(seconds)`` when the loop did not run for more than :data:`STALL_S`."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 on_stall: Callable[[float], None], *, clock: Clock = MONOTONIC) -> None:
        self._loop = loop
        self._on_stall = on_stall
        self._clock = clock
        self._last = clock()
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._last = self._clock()
        self._handle = self._loop.call_later(TICK_S, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def check(self) -> None:
        """Call ``on_stall`` if the loop has not run since long before now."""
        now = self._clock()
        late = now - self._last - TICK_S
        if late > STALL_S:
            self._last = now  # once per stall
            self._on_stall(late)

    def _tick(self) -> None:
        self.check()
        self._last = self._clock()
        self._handle = self._loop.call_later(TICK_S, self._tick)
