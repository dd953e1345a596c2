"""Shared test helpers: build a PS and m workers wired back to back on the virtual clock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from aiogc.config import RunConfig
from aiogc.core import ParameterServer, Setup, Worker
from aiogc.delays import DelaySchedule
from aiogc.runner import make_ps, materialise_for
from aiogc.sim.engine import Simulation


@dataclass
class Rig:
    config: RunConfig
    scheme: Any
    task: Any
    schedule: DelaySchedule
    ps: ParameterServer
    workers: list[Worker]
    sim: Simulation


def build_rig(
    config: RunConfig,
    *,
    schedule: DelaySchedule | None = None,
    latency: float = 0.0,
    secret: bytes | None = None,
    worker_secret: bytes | None = None,
) -> Rig:
    if schedule is None:
        schedule = materialise_for(config, [config.scheme])
    ps, task = make_ps(config, schedule=schedule, secret=secret, keep_gradients=True,
                       nonce_fn=_counter_nonces())
    scheme = ps.scheme

    built: dict[RunConfig, Setup] = {}

    def setup(cfg: RunConfig) -> Setup:
        # one Setup per configuration, shared by every worker (as the real drivers do)
        if cfg not in built:
            built[cfg] = Setup(cfg, cfg.build_scheme(), task.chunk_gradient)
        return built[cfg]

    ws = worker_secret if worker_secret is not None else secret
    workers = [
        Worker(j, secret=ws, setup=setup, nonce_fn=_counter_nonces(j)) for j in range(scheme.m)
    ]
    sim = Simulation(ps, workers, latency=latency)
    return Rig(config, scheme, task, schedule, ps, workers, sim)


def _counter_nonces(salt: int = 1000) -> Any:
    """Deterministic, distinct nonces for tests (the real default is os.urandom)."""
    state = [0]

    def nonce() -> bytes:
        state[0] += 1
        return (salt * 1_000_003 + state[0]).to_bytes(16, "big")

    return nonce


def finish_times(schedule: DelaySchedule, r: int, loads: np.ndarray) -> list[np.ndarray]:
    """Per worker, completion time (from round start) of each position in round r."""
    return [np.cumsum(schedule.compute_s[r, j, : int(loads[j])]) for j in range(len(loads))]


def partial_trigger_offset(scheme: Any, ft: list[np.ndarray]) -> float:
    """Earliest time every chunk has >= ell finished holders (spec trigger), from ft."""
    times = sorted({float(t) for f in ft for t in f if np.isfinite(t)})
    for t in times:
        state = np.array([int(np.sum(f <= t)) for f in ft])
        if scheme.is_decodable(state):
            return t
    return float("inf")
