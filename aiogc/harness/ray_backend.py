"""``aiogc run --backend ray``: the PS and the workers as Ray actors.

Ray only places and supervises processes; the PS and the workers are the very same
:class:`~aiogc.net.drivers.PSServer` / :class:`~aiogc.net.drivers.WorkerClient` drivers as in a
local run and speak aiogc's own authenticated TCP protocol to each other, so records, delay
models and debugging tools are the same on a laptop and on a cluster.

Per scheme of a comparison:

* one placement group of ``m + 1`` bundles with strategy ``SPREAD`` (Ray puts the bundles on
  different nodes as far as it can); each bundle asks for :func:`cpus_per_actor` CPUs;
* the PS actor (bundle ``m``, never restarted: a PS restart would be a different run) binds the
  IP address Ray knows its node by (reachable from the other nodes, not loopback), port 0, and
  reports ``host:port`` to the driver;
* one async worker actor per worker id (bundle ``j``) runs the worker driver against that
  address. A worker actor whose process dies is restarted by Ray (``max_restarts``) and its
  ``run`` call is retried (``max_task_retries``): the new process connects and joins through the
  normal handshake, and the PS treats it as any reconnect;
* the driver polls the PS actor for frames, round records and worker placements and writes them
  into the usual run directory as they come (a crashed run keeps every finished round), plus
  ``nodes.csv``: which node, host and process each PS / worker incarnation ran on.

A fresh random secret is generated per run (unless the caller passes one) and handed to the PS
actor; worker actor j gets only its own key k_j derived from it (so it cannot authenticate as
another worker), and the task spec the driver runs (the only task it may build). Neither is
printed or logged (:class:`Secret` has a redacted repr).

Clocks: every time in the records is taken on one host's monotonic clock and only differences
on that same clock are ever formed. Round times, trigger / arrival times, ``reports.csv``'s
``ps_time`` and ``events.jsonl``'s ``t_ns`` are the PS process's ``time.monotonic`` (the PS's
``now``); a worker's ``compute_s`` / ``elapsed_s`` are durations on the worker's own monotonic
clock, sent as numbers; ``nodes.csv``'s ``ps_time`` is when the PS actor received the
registration; ``wall_s`` is the driver's monotonic clock. No wall clock is subtracted across hosts.

Ctrl-C / SIGTERM on the driver: the PS is told to stop (it tells every worker to shut down),
the records so far are written, every actor is killed and the placement group removed; a local
Ray instance started by this run is shut down.
"""

from __future__ import annotations

import contextlib
import csv
import math
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from aiogc.coding.base import Scheme
from aiogc.config import RunConfig
from aiogc.core import RoundRecord
from aiogc.harness.fidelity import (
    live_fidelity,
)
from aiogc.harness.kit import (
    PROCESS_GRACE_S,
    Progress,
    RunResult,
    build_manifest,
    close_run,
    run_schemes,
)
from aiogc.harness.options import RayOptions, RunOptions
from aiogc.harness.ray_actors import ClusterError, PSActor, Secret, WorkerActor
from aiogc.net.loops import loop_factory
from aiogc.protocol.auth import derive_worker_key
from aiogc.training.schedule import DelaySchedule

__all__ = [
    "NODE_COLUMNS",
    "ClusterError",
    "RaySchemeRun",
    "cpus_per_actor",
    "run_ray",
]

#: Seconds between two polls of the PS actor (records reach the run directory this often).
POLL_S: Final = 0.25
#: nodes.csv columns.
NODE_COLUMNS: Final = ("scheme", "role", "worker", "incarnation", "node_id", "node_ip",
                       "hostname", "pid", "loop", "address", "ps_time")







def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ClusterError("--backend ray needs the ray extra: pip install 'aiogc[ray]' "
                           f"({exc})") from exc
    return ray




# ------------------------------------------------------------------ actors






# ------------------------------------------------------------------ driver


def cpus_per_actor(node_cpus: Sequence[float], n_actors: int) -> float:
    """CPUs each actor asks for: one, or the largest equal share that still packs ``n_actors``
    bundles onto nodes with these CPU counts.

    Workers mostly wait (on injected delays and the network), so a share below one CPU is
    fine; asking for whole CPUs would make a 2-CPU cluster refuse 4 workers. The share is
    chosen per node, not from the cluster total: three 1-CPU nodes hold five actors of 0.5
    CPU, but only three of 0.6. Ray accounts resources in units of 1e-4.

    Raises
    ------
    ClusterError
        The nodes cannot hold ``n_actors`` actors of at least 1e-4 CPU each.
    """
    n = max(1, n_actors)

    def fits(share: float) -> bool:
        return sum(math.floor(c / share + 1e-9) for c in node_cpus) >= n

    # the best share is 1 or some node's CPUs divided by a whole number of actors on it
    candidates = sorted({1.0, *(c / k for c in node_cpus if c > 0 for k in range(1, n + 1))},
                        reverse=True)
    for share in candidates:
        share = math.floor(min(1.0, share) * 1e4) / 1e4
        if share >= 1e-4 and fits(share):
            return share
    raise ClusterError(f"the Ray cluster's nodes have {list(node_cpus)} CPUs; they cannot hold "
                       f"{n} actors of at least 0.0001 CPU each")


def _node_cpus(ray: Any) -> list[float]:
    return [float(n.get("Resources", {}).get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive")]


def _dead_nodes(ray: Any) -> dict[str, str]:
    """Node id -> why Ray says it is dead, for every node of the cluster that died."""
    try:
        nodes = ray.nodes()
    except Exception:  # a report only: the run's outcome does not depend on it
        return {}
    return {str(n.get("NodeID")): str(n.get("DeathReasonMessage") or "node died")
            for n in nodes if not n.get("Alive")}


@dataclass
class RaySchemeRun:
    """One scheme on the cluster, as seen by ``on_round`` callbacks (fault-injection hooks)."""

    scheme: str
    ps: Any
    workers: list[Any]
    address: str = ""
    placements: list[dict[str, Any]] = field(default_factory=list)


@contextlib.contextmanager
def _stop_signals(interrupted: list[str]) -> Iterator[None]:
    """SIGINT / SIGTERM append their name to ``interrupted`` (polled by the driver loop)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old: dict[signal.Signals, Any] = {}

    def handler(signum: int, _frame: Any) -> None:
        interrupted.append(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM):
        old[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _connect(ray: Any, address: str | None) -> bool:
    """Connect to ``address`` (None: a new local instance); True if this call connected."""
    if ray.is_initialized():
        return False  # the caller (a library user, a test) already chose the cluster
    kwargs: dict[str, Any] = {"log_to_driver": True}
    if address in (None, "local"):
        kwargs["include_dashboard"] = False
    elif address == "auto":
        resolved = _resolve_auto()
        if resolved is not None:  # else ray.init says why it found none
            _check_reachable(resolved, shown=f"'auto' (resolved to {resolved})")
    else:
        _check_reachable(address)
    try:
        ray.init(address=address or "local", **kwargs)
    except Exception as exc:
        hint = ""
        if "token" in str(exc).lower() or "auth" in str(exc).lower():
            hint = (" -- the cluster uses Ray's token authentication: set RAY_AUTH_TOKEN (or "
                    "RAY_AUTH_MODE=disabled on every node), see docs/cluster.md")
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ClusterError(f"cannot reach the Ray cluster at address={address!r} "
                           f"(expected auto, HOST:PORT of its GCS, or none for a local "
                           f"instance): {first}{hint}") from exc
    return True


#: Seconds to wait for a TCP connection to an explicit GCS address before ray.init (which
#: otherwise retries an unreachable address for minutes).
REACH_TIMEOUT_S: Final = 5.0


def _resolve_auto() -> str | None:
    """``--address auto`` as Ray resolves it (``RAY_ADDRESS``, else the cluster this machine
    last started), so that the address can be checked before ``ray.init``; None when Ray
    finds none (``ray.init`` then says so)."""
    try:
        from ray._private.services import canonicalize_bootstrap_address

        resolved = canonicalize_bootstrap_address("auto")
    except Exception:  # Ray's own lookup failed: ray.init reports it
        return None
    return str(resolved) if resolved else None


def _check_reachable(address: str, *, shown: str | None = None) -> None:
    """Fail fast, in one line, when ``HOST:PORT`` accepts no TCP connection (``shown``: how
    the address is named, e.g. what ``auto`` resolved to)."""
    name = repr(address) if shown is None else shown
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"address={name} is not auto or HOST:PORT of the cluster's GCS")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S):
            pass
    except OSError as exc:
        raise ClusterError(f"cannot reach the Ray cluster at address={name}: no TCP "
                           f"connection within {REACH_TIMEOUT_S:g} s "
                           f"({exc.strerror or type(exc).__name__})") from None


def _await(ray: Any, ref: Any, *, timeout_s: float, interrupted: list[str], what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        ready, _ = ray.wait([ref], timeout=POLL_S)
        if ready:
            try:
                return ray.get(ref)
            except Exception as exc:
                raise ClusterError(f"{what} failed: {exc}") from exc
        if interrupted:
            raise KeyboardInterrupt(f"run stopped by {interrupted[0]}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{what}: not done within {timeout_s:g} s")


def _guard_s(config: RunConfig) -> float:
    """An upper bound on one scheme's run: the PS's own timeouts end it well before."""
    per_round = config.round_timeout_s + config.collect_timeout_s + (config.dead_after_s or 0)
    return config.join_timeout_s + config.rounds * per_round + 60.0


def _write_nodes(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(NODE_COLUMNS)
        for row in rows:
            w.writerow(["" if row.get(c) is None else
                        (repr(row[c]) if isinstance(row[c], float) else row[c])
                        for c in NODE_COLUMNS])


class _Drain:
    """At most one ``drain`` call to the PS in flight: a call that has not answered yet is
    waited for again, never replaced (its answer holds records the PS already handed over)."""

    def __init__(self, ray: Any, ps: Any) -> None:
        self._ray = ray
        self._ps = ps
        self._ref: Any | None = None

    def poll(self, *, timeout_s: float) -> dict[str, list[Any]] | None:
        if self._ref is None:
            self._ref = self._ps.drain.remote()
        ready, _ = self._ray.wait([self._ref], timeout=timeout_s)
        if not ready:
            return None
        ref, self._ref = self._ref, None
        try:
            return dict(self._ray.get(ref))
        except Exception as exc:  # the PS actor is gone; wait() says why
            print(f"aiogc: ray: could not collect records from the PS: {exc}", file=sys.stderr)
            return None


class _Driver:
    """One run on a connected Ray cluster (all schemes)."""

    def __init__(self, ray: Any, options: RunOptions, ray_options: RayOptions, *,
                 schedule: DelaySchedule, recorder: Any | None, cpus: float,
                 interrupted: list[str],
                 on_round: Callable[[RoundRecord, RaySchemeRun], None] | None) -> None:
        """``options`` resolved by :func:`run_ray`: ``secret`` set, ``loop`` the kind used."""
        assert options.secret is not None
        self.ray = ray
        self.schedule = schedule
        self.secret = Secret(options.secret)
        self.verify = options.verify
        self.recorder = recorder
        self.progress = options.progress
        self.cpus = cpus
        self.max_restarts = ray_options.max_restarts
        self.placement_timeout_s = ray_options.placement_timeout_s
        self.bind = ray_options.bind
        self.loop = options.loop
        self.interrupted = interrupted
        #: scheme -> the PS's own reason for finishing (its ``Finished`` event)
        self.end_reasons: dict[str, str] = {}
        self.on_round = on_round
        self.placements: list[dict[str, Any]] = []
        self.ps_cls = ray.remote(PSActor)
        self.worker_cls = ray.remote(WorkerActor)
        # for the fidelity section: the run's base configuration (set by run_ray), the
        # verdict's threshold, and what each scheme's PS actor measured of itself
        self.config: RunConfig | None = None
        self.threshold = options.fidelity_threshold
        self.loop_lag_s: list[float] = []
        self.cpu: list[dict[str, Any]] = []
        #: what :meth:`say` printed (``RunResult.notes``)
        self.notes: list[str] = []

    def say(self, line: str) -> None:
        """A line about the run's outcome: on stderr now, and kept for the closing lines."""
        print(line, file=sys.stderr, flush=True)
        self.notes.append(line)

    def run_scheme(self, cfg: RunConfig, scheme: Scheme) -> list[RoundRecord]:
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        ray = self.ray
        m = scheme.m
        pg = placement_group([{"CPU": self.cpus}] * (m + 1), strategy="SPREAD")
        actors: list[Any] = []
        bar = Progress(cfg.rounds, cfg.scheme, enabled=self.progress)
        try:
            _await(ray, pg.ready(), timeout_s=self.placement_timeout_s,
                   interrupted=self.interrupted,
                   what=f"placing {m + 1} actors of {self.cpus} CPU (strategy SPREAD)")

            # No runtime_env by default: Ray then reuses its pre-started worker processes (a
            # runtime_env made workers join ~10 s later here), it already sets
            # OMP_NUM_THREADS to the actor's CPUs (checked: 1 for actors of 0.4 and of 1 CPU),
            # so BLAS is single-threaded as in a local run, and it runs async actors on uvloop.
            # Only --loop asyncio needs one: RAY_USE_UVLOOP=0 in fresh actor processes.
            def opts(bundle: int, restarts: int) -> dict[str, Any]:
                o: dict[str, Any] = {
                    "num_cpus": self.cpus,
                    "max_restarts": restarts,
                    # a restarted actor's ``run`` is resubmitted for as long as Ray restarts
                    # the actor (max_restarts bounds it): with a finite count, a node loss
                    # spent the retries and the restarted actors sat idle
                    "max_task_retries": -1 if restarts else 0,
                    "scheduling_strategy": PlacementGroupSchedulingStrategy(
                        placement_group=pg, placement_group_bundle_index=bundle),
                }
                if self.loop == "asyncio":
                    o["runtime_env"] = {"env_vars": {"RAY_USE_UVLOOP": "0"}}
                return o

            ps = self.ps_cls.options(**opts(m, 0)).remote(
                cfg, self.schedule, self.secret, self.verify, 0, self.bind)
            actors.append(ps)
            info = _await(ray, ps.start.remote(), timeout_s=self.placement_timeout_s,
                          interrupted=self.interrupted, what=f"starting the {cfg.scheme} PS")
            print(f"aiogc: ray: {cfg.scheme} PS listening on {info['address']} "
                  f"(node {info['node_ip']}), {m} worker actors", file=sys.stderr, flush=True)
            host, port = info["address"].rsplit(":", 1)
            give_up = max(30.0, cfg.join_timeout_s)
            workers = [self.worker_cls.options(**opts(j, self.max_restarts)).remote(
                j, Secret(derive_worker_key(self.secret.value, j)), cfg.task, give_up)
                for j in range(m)]
            actors.extend(workers)
            ctx = RaySchemeRun(cfg.scheme, ps, workers, info["address"])
            runs = [w.run.remote(host, int(port), ps) for w in workers]
            done = ps.wait.remote()
            result = self._follow(cfg, scheme, ps, done, ctx, bar)
            self._join_workers(runs, ctx)
            records = list(result["records"])
            self.loop_lag_s += result.get("loop_lag_s") or []
            if result.get("cpu"):
                self.cpu.append(result["cpu"])
            self.end_reasons[cfg.scheme] = reason = str(result["end_reason"])
            if self.recorder is not None:
                self.recorder.run_event(t_ns=int(result["end_t_ns"]), kind="run_end",
                                        scheme=cfg.scheme, reason=reason, rounds=len(records))
            return records
        finally:
            bar.close()
            for a in actors:
                with contextlib.suppress(Exception):
                    ray.kill(a, no_restart=True)
            with contextlib.suppress(Exception):
                remove_placement_group(pg)

    def _follow(self, cfg: RunConfig, scheme: Scheme, ps: Any, done: Any, ctx: RaySchemeRun,
                bar: Progress) -> dict[str, Any]:
        """Poll the PS until it finished; write what it reports as it comes."""
        ray = self.ray
        guard = time.monotonic() + _guard_s(cfg) + self.placement_timeout_s
        # the PS starts its join deadline when every worker actor registered; an actor Ray
        # never starts must not hold it off for ever
        launch_deadline: float | None = time.monotonic() + self.placement_timeout_s
        stop_deadline: float | None = None
        drain = _Drain(ray, ps)
        while True:
            ready, _ = ray.wait([done], timeout=POLL_S)
            self._write(drain.poll(timeout_s=0.0), cfg, scheme, ctx, bar)
            if launch_deadline is not None and time.monotonic() > launch_deadline:
                ps.workers_launched.remote()
                launch_deadline = None
            if ready:
                # the pending poll may predate the end: collect it, then everything after it
                self._write(drain.poll(timeout_s=30.0), cfg, scheme, ctx, bar)
                self._write(drain.poll(timeout_s=30.0), cfg, scheme, ctx, bar)
                try:
                    return dict(ray.get(done))
                except Exception as exc:
                    raise ClusterError(f"the {cfg.scheme} PS actor failed: {exc}") from exc
            now = time.monotonic()
            if self.interrupted and stop_deadline is None:
                # the PS tells every worker to shut down, then finishes
                ps.stop.remote(f"runner interrupted ({self.interrupted[0]})")
                stop_deadline = now + PROCESS_GRACE_S
            if stop_deadline is not None and now > stop_deadline:
                raise ClusterError(f"the {cfg.scheme} PS did not stop within "
                                   f"{PROCESS_GRACE_S} s of {self.interrupted[0]}")
            if now > guard:
                raise ClusterError(f"the {cfg.scheme} PS ran past {_guard_s(cfg):.0f} s, longer "
                                   "than its own timeouts allow")

    def _write(self, got: dict[str, list[Any]] | None, cfg: RunConfig, scheme: Scheme,
               ctx: RaySchemeRun, bar: Progress) -> None:
        if got is None:
            return
        for row in got["placements"]:
            row = {**row, "scheme": cfg.scheme}
            self.placements.append(row)
            ctx.placements.append(row)
        if self.recorder is not None:
            for f in got["frames"]:
                self.recorder.frame(scheme=cfg.scheme, **f)
        for rec in got["rounds"]:
            if self.recorder is not None:
                self.recorder.round(cfg.scheme, rec, m=scheme.m, loads=list(scheme.loads),
                                    trigger_scheme=not (scheme.sends_when_done
                                                        or scheme.uploads_per_chunk))
            bar.update(record=rec)
            if self.on_round is not None:
                self.on_round(rec, ctx)

    def _join_workers(self, runs: list[Any], ctx: RaySchemeRun) -> None:
        """Workers exit on the PS's shutdown; say which did not, or failed, and why."""
        ray = self.ray
        _, pending = ray.wait(runs, num_returns=len(runs), timeout=PROCESS_GRACE_S)
        dead = _dead_nodes(ray) if pending else {}
        last = {int(p["worker"]): p for p in ctx.placements if p.get("role") == "worker"}
        for j, ref in enumerate(runs):
            if ref in pending:
                where = last.get(j, {})
                if where.get("node_id") in dead:
                    # the actor died with its node and Ray found no room to restart it
                    self.say(f"aiogc: ray: worker {j} was lost with its node "
                             f"{where.get('node_ip')} (dead: {dead[where['node_id']]}) and "
                             "never restarted (no node had room for its placement-group "
                             "bundle)")
                else:
                    self.say(f"aiogc: ray: worker {j} still running {PROCESS_GRACE_S} s after "
                             "the PS finished; killed")
                continue
            try:
                ray.get(ref)
            except Exception as exc:
                self.say(f"aiogc: ray: worker {j} failed: {exc}")


def run_ray(
    config: RunConfig,
    schemes: Sequence[str],
    options: RunOptions | None = None,
    *,
    schedule: DelaySchedule | None = None,
    ray_options: RayOptions | None = None,
    on_round: Callable[[RoundRecord, RaySchemeRun], None] | None = None,
) -> RunResult:
    """Run each scheme on a Ray cluster over the same schedule; write the run directory.

    Parameters
    ----------
    config : RunConfig
        Base configuration; ``scheme`` is replaced by each entry of ``schemes``.
    options : RunOptions, optional
        ``address``, ``out_dir``, ``verify``, ``progress``, ``argv``, ``secret``, ``plots`` and
        ``loop`` apply (:class:`~aiogc.harness.options.RunOptions`). The run directory holds
        the files of a local run plus ``nodes.csv`` (:data:`NODE_COLUMNS`: where each PS /
        worker incarnation ran). ``loop``: uvloop is Ray's own default (when installed);
        asyncio starts the actors with ``RAY_USE_UVLOOP=0``; ``nodes.csv`` records the loop
        each actor ran.
    schedule : DelaySchedule, optional
        The delays of every scheme; default drawn from ``config`` (its seed).
    ray_options : RayOptions, optional
        ``max_restarts``, ``placement_timeout_s``, ``bind``
        (:class:`~aiogc.harness.options.RayOptions`).
    on_round : callable, optional
        ``on_round(record, run)`` in the driver after each round was written.

    Raises
    ------
    ClusterError
        Ray missing, cluster unreachable, placement impossible, PS actor lost.
    KeyboardInterrupt
        SIGINT or SIGTERM stopped the run; what was recorded is written (no plots).
    """
    options = options if options is not None else RunOptions()
    ray_options = ray_options if ray_options is not None else RayOptions()
    out_dir, max_restarts = options.out_dir, ray_options.max_restarts
    if max_restarts < 0:
        from aiogc.errors import ConfigError

        raise ConfigError("max_restarts", max_restarts, "an integer >= 0")
    loop_kind, _ = loop_factory(options.loop)  # validates the name
    if options.auto_time_scale:
        from aiogc.errors import ConfigError

        raise ConfigError("time-scale", "auto", "a number with --backend ray (the calibration "
                                                "run of auto is local; run it locally at the "
                                                "same m and pass the K it chose)")
    ray = _import_ray()
    # resolved: the secret of this run, the loop actually used
    secret = options.secret if options.secret is not None else secrets.token_bytes(32)
    options = replace(options, loop=loop_kind, secret=secret)
    backend = _RayBackend(ray, schemes, options, ray_options, on_round)
    return run_schemes(config, schemes, backend, schedule=schedule, out_dir=out_dir,
                       plots=options.plots)


class _RayBackend:
    """The Ray runner's side of the skeleton (:class:`~aiogc.harness.kit.RunnerBackend`): a
    connected cluster, one PS actor and m worker actors per scheme."""

    def __init__(self, ray: Any, schemes: Sequence[str], options: RunOptions,
                 ray_options: RayOptions,
                 on_round: Callable[[RoundRecord, RaySchemeRun], None] | None) -> None:
        self.ray = ray
        self.schemes = list(schemes)
        self.options = options
        self.ray_options = ray_options
        self.on_round = on_round
        self.config: RunConfig | None = None
        self.schedule: DelaySchedule | None = None
        self.started = False
        self.recorder: Any = None
        self.driver: _Driver | None = None
        self.built: Mapping[str, Scheme] = {}

    def prepare(self, config: RunConfig, schedule: DelaySchedule,
                built: Mapping[str, Scheme]) -> RunConfig:
        self.config, self.schedule, self.built = config, schedule, built
        return config

    @contextlib.contextmanager
    def session(self, result: RunResult, interrupted: list[str]) -> Iterator[None]:
        from aiogc.harness.records import FLUSH_EVERY_S, RunRecorder

        assert self.config is not None and self.schedule is not None
        ray, options, config, schedule = self.ray, self.options, self.config, self.schedule
        address, out_dir = options.address, options.out_dir
        with _stop_signals(interrupted):
            self.started = _connect(ray, address)
            cpus = cpus_per_actor(_node_cpus(ray), config.workers + 1)
            if out_dir is not None:
                manifest = build_manifest(config, self.schemes, schedule, mode="ray",
                                          loop=options.loop, verify=options.verify,
                                          argv=options.argv, built=self.built)
                manifest["cluster"] = _cluster_manifest(ray, address, cpus,
                                                        self.ray_options.max_restarts)
                self.recorder = RunRecorder(Path(out_dir), manifest,
                                            flush_every_s=FLUSH_EVERY_S)
                self.recorder.write_schedule(schedule)
                result.out_dir = Path(out_dir)
            self.driver = _Driver(ray, options, self.ray_options, schedule=schedule,
                                  recorder=self.recorder, cpus=cpus, interrupted=interrupted,
                                  on_round=self.on_round)
            self.driver.config = config
            yield

    def run_scheme(self, cfg: RunConfig, scheme: Scheme, result: RunResult
                   ) -> list[RoundRecord]:
        assert self.driver is not None
        return self.driver.run_scheme(cfg, scheme)

    def halted(self) -> bool:
        return False  # the Ray PS actor ends its own run on a failing task or write

    def close(self, result: RunResult, interrupted: Sequence[str]) -> None:
        try:
            _close_ray_run(result, self.driver, self.built, interrupted, self.recorder,
                           self.options.out_dir)
        finally:
            if self.started:
                self.ray.shutdown()


def _close_ray_run(result: RunResult, driver: _Driver | None, built: Mapping[str, Scheme],
                   interrupted: Sequence[str], recorder: Any, out_dir: str | Path | None
                   ) -> None:
    """Fill ``result.summary`` and write it, and ``nodes.csv``: the same summary keys as a
    local run, even when the run stopped early."""
    if driver is not None:
        result.notes = list(driver.notes)
    if driver is not None and driver.config is not None:
        result.end_reasons = dict(driver.end_reasons)
        # the PS actor's own loop lag and CPU (the driver process only polls); the worst
        # scheme's CPU share stands for the run
        cpu = min(driver.cpu, key=lambda c: c.get("share_when_runnable", 1.0), default=None)
        result.extra_summary["fidelity"] = live_fidelity(
            driver.config, driver.schedule, result.records, built=built,
            loop_lag_s=driver.loop_lag_s,
            cpu=cpu, threshold=driver.threshold)
    close_run(result, interrupted, recorder)
    if driver is not None and out_dir is not None:
        _write_nodes(Path(out_dir) / "nodes.csv", driver.placements)


def _cluster_manifest(ray: Any, address: str | None, cpus: float,
                      max_restarts: int) -> dict[str, Any]:
    """The manifest's ``cluster`` entry: Ray version, address, actor sizing, the nodes."""
    return {
        "backend": "ray",
        "ray_version": ray.__version__,
        "address": address or "local",
        "cpus_per_actor": cpus,
        "max_restarts": max_restarts,
        "nodes": [{"node_id": n.get("NodeID"), "node_ip": n.get("NodeManagerAddress"),
                   "alive": n.get("Alive"), "cpus": n.get("Resources", {}).get("CPU")}
                  for n in ray.nodes()],
    }
