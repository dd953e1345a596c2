"""Run the real protocol state machines on the virtual clock for a comparison of schemes.

For each scheme: one :class:`~aiogc.core.ParameterServer` and ``m`` :class:`~aiogc.core.Worker`
objects wired by :class:`~aiogc.sim.engine.Simulation`, all fed the *same* materialised
:class:`~aiogc.training.delays.DelaySchedule`; one round of the schedule is one trial. The
result is the
PS's per-round :class:`~aiogc.core.RoundRecord` list of every scheme.

Simulation settings. The engine's clock is virtual, so the wall-clock safety timers of a live run
would only truncate heavy-tailed rounds: :func:`simulation_config` switches heartbeats off
(``heartbeat_s = dead_after_s = None``) and raises ``round_timeout_s`` and
``collect_timeout_s`` to their maxima (1e6 s, 3600 s: a bandwidth-limited upload may take
longer than the 5 s default, and the fast path has no such timer). Everything else
(trigger, encoding, decoding, faults) is the live system's code.

Gradients: ``"task"`` uses the configured learning task (``config.task``); ``"gaussian"`` gives
i.i.d. ``N(0, I_dim)`` chunk gradients keyed by (seed, round) via
:func:`aiogc.sim.fast.gaussian_chunk_gradients`, with a zero learning rate, and the PS's
``rel_error_plain`` (``||ĝ - g|| / ||g||``) is then measured against their exact sum:
``mse = rel_error_plain ** 2``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from aiogc.coding.base import Scheme
from aiogc.coding.registry import scheme_spec
from aiogc.config import CommModel, RunConfig, scheme_digest
from aiogc.core import ParameterServer, PSOptions, RoundRecord, Setup, Worker, WorkerCache
from aiogc.errors import ConfigError
from aiogc.protocol.status import RoundStatus
from aiogc.sim.comm import engine_ingress, engine_latency
from aiogc.sim.engine import NO_NETWORK_DELAY, SimNetwork, Simulation
from aiogc.sim.fast import build_schemes, gaussian_chunk_gradients, schedule_for
from aiogc.training.aggregator import Aggregator
from aiogc.training.cluster import cluster_schedule
from aiogc.training.ps_aggregator import task_aggregator
from aiogc.training.schedule import DelaySchedule
from aiogc.training.tasks import Task, make_task

__all__ = ["record_arrays", "simulate_protocol", "simulation_config", "task_ps"]

GRADIENTS = ("task", "gaussian")


def simulation_config(config: RunConfig) -> RunConfig:
    """``config`` with the wall-clock safety timers off (see the module docstring)."""
    return config.replace(heartbeat_s=None, dead_after_s=None, round_timeout_s=1e6,
                          collect_timeout_s=3600.0)


def _nonces(salt: int) -> Callable[[], bytes]:
    state = [0]

    def nonce() -> bytes:
        state[0] += 1
        return (salt * 1_000_003 + state[0]).to_bytes(16, "big")

    return nonce


class _GaussianGradients:
    """Chunk gradients of the current round, shared by the PS and all workers of one run."""

    def __init__(self, seed: int, n_chunks: int, dim: int) -> None:
        self.seed, self.n_chunks, self.dim = seed, n_chunks, dim
        self._round = -1
        self._G = np.zeros((n_chunks, dim))

    def of_round(self, rnd: int) -> np.ndarray:
        if rnd != self._round:
            self._G = gaussian_chunk_gradients(self.seed, rnd, self.n_chunks, self.dim)
            self._round = rnd
        return self._G


def task_ps(cfg: RunConfig, scheme: Scheme, schedule: DelaySchedule, *,
            verify: bool = True) -> tuple[ParameterServer, Task]:
    """The engine's PS for ``cfg.task``, its aggregator built as a live run's
    (:func:`aiogc.training.ps_aggregator.task_aggregator`, the builder ``harness/kit.make_ps``
    uses): the same oracle, or without ``verify`` the same data bound, norm and model guards."""
    task = make_task(cfg.task, scheme.n_chunks, cfg.seed, chunk_sizes=cfg.sizes)
    model = task.initial_model()
    agg = task_aggregator(cfg, scheme, task, model=model, verify=verify)
    ps = ParameterServer(cfg, scheme=scheme, model=model, aggregator=agg, schedule=schedule,
                         options=PSOptions(nonce_fn=_nonces(1000)))
    return ps, task


def _run_one(cfg: RunConfig, scheme: Scheme, schedule: DelaySchedule, *, network: SimNetwork,
             gradients: str, dim: int, comm: CommModel | None, verify: bool
             ) -> list[RoundRecord]:
    m = scheme.m
    latency, bandwidth_Bps = float(network.latency), network.bandwidth_Bps  # type: ignore[arg-type]
    workers: list[Worker] = []
    # one Setup per worker (its own gradient function) of one scheme: its digest once
    digest = scheme_digest(scheme)
    if gradients == "gaussian":
        # synthetic per-round gradients, no task: no data bound (as a plug-in task), the
        # oracle unless verify is off
        gg = _GaussianGradients(cfg.seed, scheme.n_chunks, dim)
        agg_box: list[Aggregator] = []

        def oracle(w: np.ndarray) -> np.ndarray:
            # the round of the work item the aggregator runs (decode or analysis)
            return np.asarray(gg.of_round(agg_box[0].round))

        def setup_for(j: int) -> Callable[[RunConfig], Setup]:
            def chunk_gradient(chunk: int, w: np.ndarray) -> np.ndarray:
                return np.asarray(gg.of_round(workers[j].round)[chunk])

            return lambda c: Setup(c, scheme, chunk_gradient, digest)

        agg = Aggregator(cfg, scheme, model=np.zeros(dim), learning_rate=0.0,
                         verify_fn=oracle if verify else None)
        agg_box.append(agg)
        ps = ParameterServer(cfg, scheme=scheme, model=np.zeros(dim), aggregator=agg,
                             schedule=schedule, options=PSOptions(nonce_fn=_nonces(1000)))
    else:
        ps, task = task_ps(cfg, scheme, schedule, verify=verify)

        def setup_for(j: int) -> Callable[[RunConfig], Setup]:
            return lambda c: Setup(c, scheme, task.chunk_gradient, digest)

    cache = WorkerCache()  # what the m workers of this simulation share
    workers.extend(Worker(j, setup=setup_for(j), nonce_fn=_nonces(j), cache=cache)
                   for j in range(m))
    if comm is not None and comm.limited:
        box: list[Simulation] = []
        shared = comm.ps_Bps is not None
        lat = engine_latency(comm, latency, lambda: box[0].now, ingress=shared)
        sim = Simulation(ps, workers, network=SimNetwork(
            lat, bandwidth_Bps, engine_ingress(comm, latency) if shared else None))
        box.append(sim)
    else:
        sim = Simulation(ps, workers, network=SimNetwork(latency, bandwidth_Bps))
    sim.run()
    return list(ps.records)


def simulate_protocol(
    config: RunConfig,
    schemes: Sequence[str],
    *,
    schedule: DelaySchedule | None = None,
    network: SimNetwork = NO_NETWORK_DELAY,
    gradients: str = "task",
    dim: int = 120,
    built: dict[str, Scheme] | None = None,
    comm: CommModel | None = None,
    verify: bool = True,
) -> dict[str, list[RoundRecord]]:
    """Simulate ``config.rounds`` rounds of each scheme with the real PS and worker cores.

    Parameters
    ----------
    config : RunConfig
        Base configuration; each scheme runs with :meth:`RunConfig.for_scheme` (its forced
        ``ell`` applied). ``mode`` / ``deadline_s`` apply to every scheme.
    schemes : sequence of str
    schedule : DelaySchedule, optional
        Shared by every scheme; default drawn from ``config`` (``delay``, ``latency``, ``seed``)
        with ``config.rounds`` rounds.
    network : SimNetwork, optional
        ``latency``: one-way latency of every frame in the engine (seconds, a float here);
        ``bandwidth_Bps``: adds array bytes / bandwidth to array-carrying frames. Its
        ``ingress`` must be None (``comm`` provides the shared PS ingress).
    gradients : {"task", "gaussian"}
    dim : int
        Gradient length for ``gradients="gaussian"``.
    built : dict, optional
        Pre-built ``{name: scheme}`` matching ``config``.
    comm : CommModel, optional
        Per-worker upload / download rates (:func:`aiogc.sim.comm.engine_latency`: the same
        FIFO links as the fast path, frames sized by the wire codec) and the shared PS
        ingress (:func:`aiogc.sim.comm.engine_ingress`, the engine's ``ingress``).
    verify : bool
        The PS's oracle (default, as ``aiogc run``; the records carry the decode error). False:
        as ``--no-verify``, every round is guarded by the task's data bound instead (the live
        PS's guard: :func:`task_ps`) and ``rel_error`` is NaN.

    Returns
    -------
    dict name -> list of RoundRecord (one per round, in order)
    """
    if gradients not in GRADIENTS:
        raise ConfigError("gradients", gradients, "one of " + ", ".join(GRADIENTS))
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ConfigError("dim", dim, "an integer >= 1")
    sch = built if built is not None else build_schemes(config, schemes)
    for name in schemes:
        if not scheme_spec(name).live:
            raise ConfigError("schemes", name, "schemes the protocol core can run "
                              "(use the fast engine)")
    if callable(network.latency) or network.ingress is not None:
        raise ConfigError("network", network, "a float latency and no ingress (comm= models "
                          "the links and the PS ingress)")
    if schedule is None:
        schedule = schedule_for(config, sch)
    if schedule.rounds < config.rounds:
        raise ConfigError("schedule", schedule.rounds, f">= config.rounds={config.rounds} rounds")
    out: dict[str, list[RoundRecord]] = {}
    for name in schemes:
        cfg = simulation_config(config.for_scheme(name))
        # a heterogeneous cluster: this scheme's chunks on its workers
        out[name] = _run_one(cfg, sch[name], cluster_schedule(schedule, cfg, sch[name]),
                             network=network, gradients=gradients, dim=dim, comm=comm,
                             verify=verify)
    return out


def record_arrays(records: Sequence[RoundRecord], *, mode: str) -> dict[str, np.ndarray]:
    """Per-round arrays of a record list.

    Parameters
    ----------
    records : sequence of RoundRecord
    mode : {"exact", "approx"}
        The run's mode. In exact mode a failed round never completes (its gradient step never
        happens, whatever ended it: the workers able to decode are gone or the round timed
        out), so its completion is ``inf``, as in the fast path; in approx mode a failed round
        ends at its deadline with nothing decoded.

    Returns
    -------
    dict with keys
        ``trigger_s`` (t_trigger - t_start, ``inf`` if none), ``completion_s``
        (t_end - t_start, see ``mode``), ``status`` (str), ``mse`` (``rel_error_plain**2``;
        1.0 for a failed round, whose estimate is 0).
    """
    if mode not in ("exact", "approx"):
        raise ConfigError("mode", mode, "exact or approx")
    trig, comp, mse, status = [], [], [], []
    for r in records:
        t0 = r.t_start
        failed = r.status == RoundStatus.FAILED
        trig.append(np.inf if r.t_trigger is None else r.t_trigger - t0)
        never = failed and mode == "exact"
        comp.append(np.inf if never or r.t_end is None else r.t_end - t0)
        mse.append(1.0 if failed else r.rel_error_plain**2)
        status.append(str(r.status))
    return {"trigger_s": np.array(trig), "completion_s": np.array(comp),
            "mse": np.array(mse), "status": np.array(status)}
