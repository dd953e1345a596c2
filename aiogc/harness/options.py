"""How a live run runs: the options of :func:`aiogc.harness.local.run_live` and
:func:`aiogc.harness.ray_backend.run_ray`, as values (the CLI's ``aiogc run`` flags).

:class:`RunOptions` is shared by both backends (a Ray run ignores the local-only fields);
:class:`RayOptions` holds what only a Ray cluster needs. Both are frozen: one instance serves
every scheme of a run, and a caller changes a field with :func:`dataclasses.replace`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from aiogc.core import RoundRecord

__all__ = ["DEFAULT_MAX_RESTARTS", "PLACEMENT_TIMEOUT_S", "RayOptions", "RunOptions", "RunStop"]

#: Times Ray restarts a worker actor whose process died (and retries its ``run`` call).
DEFAULT_MAX_RESTARTS: Final = 3
#: Seconds to wait for the placement group and the PS actor to come up.
PLACEMENT_TIMEOUT_S: Final = 120.0


class RunStop:
    """A handle that stops a live run from any thread or coroutine (a notebook cell, a
    per-round callback that has seen enough): :meth:`stop` ends it as Ctrl-C does.

    The running scheme's PS tells its workers to shut down, no further scheme starts, and
    what finished is written, ``summary.json`` included: its ``end_reason`` is ``"stopped by
    the caller: REASON"``, ``interrupted_by`` is ``"the caller: REASON"`` and ``ok`` is
    false. :func:`aiogc.run` then returns the partial result (``RunResult.stopped`` is
    REASON); :func:`~aiogc.harness.local.run_live` raises
    :class:`~aiogc.harness.kit.RunInterrupted` carrying it, as after a signal. A handle
    stopped before its run started stops that run at its start; one handle serves one run.
    Local backend only.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._listeners: list[Callable[[str], None]] = []

    @property
    def reason(self) -> str | None:
        """Why :meth:`stop` was called (None: not yet)."""
        return self._reason

    @property
    def label(self) -> str | None:
        """What the run records as ``interrupted_by`` (None: not stopped)."""
        return None if self._reason is None else f"the caller: {self._reason}"

    def stop(self, reason: str = "stop() called") -> None:
        """Stop the run (thread-safe; the first reason counts, later calls change nothing)."""
        with self._lock:
            if self._reason is not None:
                return
            self._reason = str(reason)
            listeners = list(self._listeners)
        label = self.label
        assert label is not None
        for fn in listeners:
            fn(label)

    def subscribe(self, fn: Callable[[str], None]) -> Callable[[], None]:
        """Call ``fn(label)`` when the run is stopped (at once if it is already); returns the
        function that unsubscribes. ``fn`` runs on the thread that called :meth:`stop`."""
        with self._lock:
            stopped = self._reason is not None
            if not stopped:
                self._listeners.append(fn)
        if stopped:
            label = self.label
            assert label is not None
            fn(label)

        def unsubscribe() -> None:
            with self._lock:
                if fn in self._listeners:
                    self._listeners.remove(fn)

        return unsubscribe

    def __repr__(self) -> str:
        return f"RunStop(reason={self._reason!r})"


@dataclass(frozen=True)
class RunOptions:
    """Where the workers run, what the run checks, and what it records.

    Attributes
    ----------
    mode : {"coroutines", "processes"}
        Local backend: workers as coroutines (on the runner's loop, or in ``worker_hosts``
        processes) or one process each. A Ray run needs ``"processes"``.
    out_dir : path, optional
        Run directory (manifest.json, delays.csv, events.jsonl, rounds.csv, workers.csv,
        reports.csv, summary.json, trace.json, PNGs). None: no files.
    verify : bool
        Check every decoded gradient against the true one (the decode error column).
    loop : {"uvloop", "asyncio"}
        Event loop of the runner and the workers (Ray: of the actors).
    progress : bool
        A progress bar per scheme on stderr.
    argv : sequence of str, optional
        The command line, copied to the manifest.
    secret : bytes, optional
        Shared secret; default a fresh random one for this run.
    plots : bool
        Write the PNGs into ``out_dir`` at the end of a run that was not interrupted.
    start_method : {"forkserver", "spawn"}
        How worker processes start (processes mode); forkserver preloads the package.
    backend : {"local", "ray"}
        ``"ray"``: the PS and one actor per worker on a Ray cluster (``mode`` must be
        ``"processes"``; ``loop`` applies to the actors; see
        :func:`aiogc.harness.ray_backend.run_ray`, which gets ``address``).
    address : str, optional
        Ray only: ``"auto"`` (the cluster this machine belongs to), ``"HOST:PORT"`` (its GCS),
        or None: start a local Ray instance for this run and stop it at the end. When Ray is
        already initialised in this process, that cluster is used and left running.
    worker_hosts : int
        Coroutines mode: 0 runs every worker on the runner's own loop, beside the PS; ``n``
        (1..m) spreads them over ``n`` worker-host processes, each one loop of coroutine
        workers sharing one scheme and task, so the PS has a loop (and a core) of its own.
    """

    mode: str = "coroutines"
    out_dir: str | Path | None = None
    verify: bool = True
    loop: str = "uvloop"
    progress: bool = False
    argv: Sequence[str] | None = None
    secret: bytes | None = None
    plots: bool = True
    start_method: str = "forkserver"
    backend: str = "local"
    address: str | None = None
    worker_hosts: int = 0
    #: coroutines mode without ``worker_hosts``: give every in-process worker its own
    #: connection and loop timer (the path before protocol v4) instead of one shared host
    #: connection with one timer heap (:mod:`aiogc.harness.inproc`)
    connection_per_worker: bool = False
    #: choose the time scale K before the run (``--time-scale auto``): a short calibration
    #: run at K = 1 measures this machine's overhead per round, then K is the smallest that
    #: keeps the predicted overhead under a quarter of ``fidelity_threshold``
    #: (:func:`aiogc.harness.fidelity.auto_time_scale`); the config's own K is ignored
    auto_time_scale: bool = False
    #: the fidelity verdict's tolerance: every live / simulated ratio within it of 1
    fidelity_threshold: float = 0.10
    #: after a decodable set arrived, wait up to this fraction of the round's elapsed time for
    #: one spare coded vector, so the redundancy check can cross-check the original scheme
    #: (0: off, the paper's protocol; docs/security.md, "The original scheme's spare vector");
    #: None: 0, or with ``locate`` :data:`aiogc.training.locate.LOCATE_SPARE_WAIT` (two spares)
    spare_wait: float | None = None
    #: locate one inconsistent (lying) worker where two spare vectors allow, decode
    #: the round without it, and evict it after this many located rounds (0: never evict;
    #: None: off). Implies two spares and a spare wait; refused, naming why, for a scheme that
    #: cannot locate (:func:`aiogc.training.locate.check_locate`). Local backend only.
    locate: int | None = None
    #: write the PS's wire bytes to this pcap file (``aiogc.net.pcap``; local backend only):
    #: every scheme's connections, one synthetic TCP flow each
    pcap: str | Path | None = None
    #: stop the run from another thread or a callback (:class:`RunStop`; local backend only)
    stop: RunStop | None = None
    #: called with (scheme, record) after each completed round, on the run's event loop
    #: between rounds (keep it short; times in emulated seconds; local backend only)
    on_round: Callable[[str, RoundRecord], None] | None = None


@dataclass(frozen=True)
class RayOptions:
    """What only a Ray run needs.

    Attributes
    ----------
    max_restarts : int
        Times Ray restarts a worker actor whose process died (``>= 0``).
    placement_timeout_s : float
        Seconds to wait for the placement group and the PS actor to come up.
    bind : str, optional
        Address the PS binds (default: its node's IP address as Ray knows it).
    """

    max_restarts: int = DEFAULT_MAX_RESTARTS
    placement_timeout_s: float = PLACEMENT_TIMEOUT_S
    bind: str | None = None
