"""How a live run runs: the options of :func:`aiogc.harness.local.run_live` and
:func:`aiogc.harness.ray_backend.run_ray`, as values (the CLI's ``aiogc run`` flags).

:class:`RunOptions` is shared by both backends (a Ray run ignores the local-only fields);
:class:`RayOptions` holds what only a Ray cluster needs. Both are frozen: one instance serves
every scheme of a run, and a caller changes a field with :func:`dataclasses.replace`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["DEFAULT_MAX_RESTARTS", "PLACEMENT_TIMEOUT_S", "RayOptions", "RunOptions"]

#: Times Ray restarts a worker actor whose process died (and retries its ``run`` call).
DEFAULT_MAX_RESTARTS: Final = 3
#: Seconds to wait for the placement group and the PS actor to come up.
PLACEMENT_TIMEOUT_S: Final = 120.0


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
