"""Shared test helpers: build a PS and m workers wired back to back on the virtual clock."""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
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


def interleaved_schedule(m: int, k: int, rounds: int, gap_s: float) -> DelaySchedule:
    """Chunk completions on a grid ``gap_s`` apart, no two at once, so the decisions do not
    depend on timing jitter well below ``gap_s``; the order of all ``m * k`` completions is a
    random interleaving, so fast and slow workers (and the state vectors) vary by round."""
    rng = np.random.default_rng(11)
    comp = np.empty((rounds, m, k))
    for r in range(rounds):
        order = rng.permutation(np.repeat(np.arange(m), k))  # which worker completes next
        finish = np.empty((m, k))
        done = np.zeros(m, dtype=int)
        for slot, j in enumerate(order):
            finish[j, done[j]] = gap_s * (slot + 1)
            done[j] += 1
        comp[r] = np.diff(np.concatenate([np.zeros((m, 1)), finish], axis=1), axis=1)
    return DelaySchedule(compute_s=comp, network_s=np.zeros((rounds, m)), seed=11,
                         compute_spec="spaced", network_spec="none")


def wait_pids_exit(pids: set[int], timeout_s: float) -> None:
    """Wait on pidfds (not by sleeping) until every pid exited or ``timeout_s`` passed."""
    fds: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            fds[os.pidfd_open(pid)] = pid
    deadline = time.monotonic() + timeout_s
    try:
        while fds and time.monotonic() < deadline:
            ready, _, _ = select.select(list(fds), [], [], deadline - time.monotonic())
            for fd in ready:
                os.close(fd)
                del fds[fd]
    finally:
        for fd in fds:
            os.close(fd)


class StreamWatcher:
    """Collects a process's output stream in a thread; :meth:`wait_for` blocks (on a condition,
    not by sleeping) until the text appears or the stream ends."""

    def __init__(self, stream: Any) -> None:
        self.text = ""
        self._cond = threading.Condition()
        self._eof = False
        self._fd = stream.fileno()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        while chunk := os.read(self._fd, 65536):
            with self._cond:
                self.text += chunk.decode(errors="replace")
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def wait_for(self, needle: str, timeout_s: float) -> bool:
        with self._cond:
            self._cond.wait_for(lambda: needle in self.text or self._eof, timeout_s)
            return needle in self.text

    def wait_eof(self, timeout_s: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._eof, timeout_s)
