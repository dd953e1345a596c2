"""A worker's task that fails ends the run, named once.

A worker whose chunk gradient raises, or returns a non-finite value, closes its session with
``task_failed`` and the round and exception in the reason; the PS core closes that peer with
``task_failed`` and ``worker W: round R: Type: text`` (``aiogc.core``). :class:`TaskFailures`
watches the PS's events for it: the first one is said once on stderr, kept for
``summary.json`` (``task_error``: worker, round, error, scheme) and stops the run (the same
task fails the same way on every retry); the CLI exits with ``EXIT_TASK``. The task's code
that the PS runs itself (decode, loss, the oracle) ends the run the same way, with ``"PS"``
as the worker (``aiogc.net.drivers.PS_TASK_FAILED``).
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Callable
from typing import Any

from aiogc.core import Event, Finished, PeerClosed
from aiogc.net.drivers import PS_TASK_FAILED

__all__ = ["TASK_FAILED", "TaskFailures", "parse_task_failure"]

#: The end reason's prefix of a run stopped by a failing task.
TASK_FAILED = "task failed"

_REASON = re.compile(r"worker (\d+): round (-?\d+): (.*)", re.DOTALL)
_PS_REASON = re.compile(re.escape(PS_TASK_FAILED) + r": round (-?\d+): (.*)", re.DOTALL)


def parse_task_failure(reason: str) -> dict[str, Any]:
    """``worker W: round R: text`` -> ``{"worker": W, "round": R, "error": text}`` (the
    whole reason as ``error``, worker and round None, when it does not have that form: the
    text comes from a worker)."""
    match = _REASON.fullmatch(reason)
    if match is None:
        return {"worker": None, "round": None, "error": reason}
    return {"worker": int(match.group(1)), "round": int(match.group(2)),
            "error": match.group(3)}


class TaskFailures:
    """Watches a run's PS events for the first failing task; ``stop(reason)`` ends the run
    (called at the loop's next iteration, outside the PS's event delivery)."""

    def __init__(self) -> None:
        #: the first failure (``parse_task_failure`` plus ``scheme``), None while none
        self.first: dict[str, Any] | None = None

    def sink(self, inner: Callable[[Event], None], scheme: str,
             stop: Callable[[str], None]) -> Callable[[Event], None]:
        """``inner`` with the failing task watched for."""

        def on_event(ev: Event) -> None:
            if type(ev) is PeerClosed and ev.code == "task_failed" and self.first is None:
                self.first = {**parse_task_failure(ev.reason), "scheme": scheme}
                print(f"aiogc: {TASK_FAILED}: {ev.reason}", file=sys.stderr, flush=True)
                asyncio.get_running_loop().call_soon(stop, f"{TASK_FAILED}: {ev.reason}")
            elif type(ev) is Finished and self.first is None:
                match = _PS_REASON.fullmatch(ev.reason)
                if match is not None:  # the task's code raised on the PS (the run stopped)
                    self.first = {"worker": "PS", "round": int(match.group(1)),
                                  "error": match.group(2), "scheme": scheme}
                    print(f"aiogc: {ev.reason}", file=sys.stderr, flush=True)
            inner(ev)

        return on_event

    def add_to(self, summary: dict[str, Any]) -> None:
        """Put the failure, if any, into ``summary`` (``task_error``; ``ok`` false)."""
        if self.first is not None:
            summary["task_error"] = dict(self.first)
            summary["ok"] = False
