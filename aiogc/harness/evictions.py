"""Liar location in a live run: ``--locate N`` as PS options, and the
evictions it causes as records.

The numerics are :mod:`aiogc.training.locate`; the PS core closes an evicted worker and refuses
its key, and emits :class:`aiogc.core.WorkerEvicted`. This module turns that event into what a
run directory and its summary say (the local runner and ``aiogc ps`` use it):

* ``events.jsonl``: a ``worker_evicted`` line (``round``, ``worker``, ``reason``,
  ``rounds_located``) at the PS time of the eviction;
* ``summary.json``: ``evicted``, a list of ``{"scheme", "worker", "round", "rounds_located"}``
  (empty when nobody was), and ``membership[scheme]["evicted"]``; an evicted worker's later rounds
  are ``absent: evicted in round R`` in ``workers.csv`` and do not count as short rounds;
* the printed summary: one line per evicted worker (:func:`eviction_lines`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from aiogc.config import RunConfig
from aiogc.core import Event, ParameterServer, PSOptions, WorkerEvicted
from aiogc.errors import ConfigError
from aiogc.training.locate import check_locate, locate_spares

__all__ = ["NO_VERIFY_SPARE_WAIT", "check_run_locate", "default_spare_wait", "eviction_lines",
           "eviction_sink", "locate_ps_options"]

#: The spare wait of a ``--no-verify`` run of the original scheme when ``--spare-wait`` is not
#: given: up to the round's own elapsed time again for one spare vector, so the redundancy
#: check cross-checks every round it can (docs/security.md measures its cost).
NO_VERIFY_SPARE_WAIT = 1.0


def default_spare_wait(config: RunConfig, verify: bool, locate: int | None,
                       spare_wait: float | None) -> float | None:
    """``spare_wait``, or :data:`NO_VERIFY_SPARE_WAIT` when none was given for a run without
    the oracle (``verify`` False) of a scheme whose redundancy check can catch a liar with one
    spare vector (a fixed code sent when done, exact, tolerating a straggler: the original
    scheme): without it such a run applies whatever decodes first, unchecked."""
    if spare_wait is not None or verify or locate is not None:
        return spare_wait
    spec = config.spec
    if spec.sends_when_done and not spec.uses_k and config.stragglers_tolerated >= 1:
        return NO_VERIFY_SPARE_WAIT
    return spare_wait


def locate_ps_options(config: RunConfig, locate: int | None, spare_wait: float | None,
                      *, backend: str = "local", verify: bool = True) -> PSOptions:
    """The PS options of one scheme's run: spare wait and spares (two, with ``locate``: see
    :func:`aiogc.training.locate.locate_spares`), after :func:`check_locate` (which names the
    field and why when the configuration cannot locate); without ``verify`` the original
    scheme waits for a spare unless told otherwise (:func:`default_spare_wait`)."""
    if locate is not None and backend != "local":
        raise ConfigError("locate", locate, "the local backend or `aiogc ps` (the Ray backend "
                          "does not pass --locate to its PS actor)")
    check_locate(locate, config)
    spare_wait = default_spare_wait(config, verify, locate, spare_wait)
    wait, spares = locate_spares(locate, spare_wait, tolerated=config.stragglers_tolerated)
    return PSOptions(spare_wait=wait, spares=spares)


def check_run_locate(config: RunConfig, schemes: Sequence[str], locate: int | None,
                     spare_wait: float | None, backend: str = "local") -> None:
    """Refuse ``locate`` before a run starts anything when any of ``schemes`` (or the
    backend) cannot locate, naming the field and why (:func:`locate_ps_options`)."""
    if locate is None:
        return
    for name in schemes:
        locate_ps_options(config.for_scheme(name), locate, spare_wait, backend=backend)


def eviction_sink(inner: Callable[[Event], None], ps: ParameterServer, scheme_name: str,
                  recorder: Any | None, evictions: list[dict[str, Any]], *,
                  time_scale: float = 1.0) -> Callable[[Event], None]:
    """Wrap the PS event callback ``inner``: a :class:`WorkerEvicted` is appended to
    ``evictions`` (the summary's ``evicted`` entries) and recorded (``recorder.evicted``,
    emulated nanoseconds: PS time / ``time_scale``); every event then goes to ``inner``."""
    def on_event(ev: Event) -> None:
        if isinstance(ev, WorkerEvicted):
            locator = getattr(ps.aggregator, "locator", None)
            rounds = list(locator.rounds.get(ev.worker, [])) if locator is not None else []
            evictions.append({"scheme": scheme_name, "worker": ev.worker, "round": ev.round,
                              "rounds_located": rounds})
            if recorder is not None:
                recorder.evicted(scheme_name, ev.worker, ev.round,
                                 t_ns=round(ev.time / time_scale * 1e9), reason=ev.reason,
                                 rounds_located=rounds)
        inner(ev)

    return on_event


def eviction_lines(summary: dict[str, Any]) -> list[str]:
    """The printed summary's lines for ``summary["evicted"]`` (none when nobody was)."""
    out = []
    for e in summary.get("evicted") or []:
        rounds = e.get("rounds_located") or []
        out.append(f"{e.get('scheme')}: worker {e.get('worker')} evicted after round "
                   f"{e.get('round')} (its vectors located as inconsistent in "
                   f"{len(rounds)} round{'s' if len(rounds) != 1 else ''}: "
                   f"{', '.join(str(r) for r in rounds) or '-'}); key refused for the rest of "
                   "the run")
    return out
