"""Shared test helpers: build a PS and m workers wired back to back on the virtual clock."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from aiogc.config import RunConfig
from aiogc.core import ParameterServer, PSOptions, Setup, Worker, WorkerCache
from aiogc.harness.kit import make_ps, materialise_for
from aiogc.protocol.messages import CodedGradient
from aiogc.sim.engine import SimNetwork, Simulation
from aiogc.training.aggregator import Aggregator
from aiogc.training.schedule import DelaySchedule


@dataclass
class Rig:
    config: RunConfig
    scheme: Any
    task: Any
    schedule: DelaySchedule
    ps: ParameterServer
    workers: list[Worker]
    sim: Simulation
    aggregator: Aggregator


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
                       options=PSOptions(nonce_fn=_counter_nonces()))
    scheme = ps.scheme

    ws = worker_secret if worker_secret is not None else secret
    workers = task_workers(task, scheme.m, secret=ws)
    sim = Simulation(ps, workers, network=SimNetwork(latency=latency))
    assert isinstance(ps.aggregator, Aggregator)
    return Rig(config, scheme, task, schedule, ps, workers, sim, ps.aggregator)


def task_workers(task: Any, m: int, *, secret: bytes | None = None) -> list[Worker]:
    """m worker cores computing ``task``'s chunk gradients, with one Setup per configuration
    and one WorkerCache shared by all of them (as a real driver's process shares them), and
    deterministic nonces."""
    built: dict[RunConfig, Setup] = {}

    def setup(cfg: RunConfig) -> Setup:
        if cfg not in built:
            built[cfg] = Setup(cfg, cfg.build_scheme(), task.chunk_gradient)
        return built[cfg]

    cache = WorkerCache()
    return [Worker(j, secret=secret, setup=setup, nonce_fn=_counter_nonces(j), cache=cache)
            for j in range(m)]


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


#: A chunk that must not finish within a round (an hour): the PS triggers long before.
NEVER_S = 3600.0


def pinned_trigger_schedule(config: RunConfig, gap_s: float = 0.01,
                            seed: int = 11) -> DelaySchedule:
    """A schedule whose decisions cannot depend on timing, however loaded the machine.

    Per round, a random interleaving of chunk completions runs until the PS could decode;
    that state is then shrunk, worker by worker in random order, to a *minimal* decodable
    state s (s decodable, s - e_j not decodable for every j with s_j > 0). The positions
    below s_j finish ``gap_s`` apart; every other position takes :data:`NEVER_S`. Since
    decodability is monotone in the state, every state a run passes through before s is
    below s and so not decodable: the trigger state is s whatever order the reports arrive
    in, and so are the coded vectors, the decode and the loss.

    Returns
    -------
    DelaySchedule
        compute_s of shape (config.rounds, m, max load); network delays zero.
    """
    scheme = config.build_scheme()
    m, loads = scheme.m, np.asarray(scheme.loads, dtype=int)
    rng = np.random.default_rng(seed)
    comp = np.full((config.rounds, m, int(loads.max())), NEVER_S)
    for r in range(config.rounds):
        state = np.zeros(m, dtype=int)
        for j in rng.permutation(np.repeat(np.arange(m), loads)):
            state[j] += 1
            if scheme.is_decodable(state):
                break
        for j in rng.permutation(m):
            while state[j] > 0:
                state[j] -= 1
                if not scheme.is_decodable(state):
                    state[j] += 1
                    break
        assert scheme.is_decodable(state)
        order = rng.permutation(np.repeat(np.arange(m), state))
        finish = np.zeros((m, int(loads.max())))
        done = np.zeros(m, dtype=int)
        for slot, j in enumerate(order):
            finish[j, done[j]] = gap_s * (slot + 1)
            done[j] += 1
        for j in range(m):
            comp[r, j, : state[j]] = np.diff(finish[j, : state[j]], prepend=0.0)
    return DelaySchedule(compute_s=comp, network_s=np.zeros((config.rounds, m)), seed=seed,
                         compute_spec="pinned-trigger", network_spec="none")


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


def coded_rows(rows: np.ndarray) -> dict[int, Any]:
    """A DecodeRound's ``coded`` map holding ``rows`` (m, p): row j as worker j's accepted
    vector (the aggregator fills its rows from them)."""
    from aiogc.protocol.messages import CodedGradient

    return {j: CodedGradient(epoch=0, round=0, attempt=0, state_digest=b"\0" * 32,
                             compute_s=0.0, payload=np.ascontiguousarray(rows[j]))
            for j in range(rows.shape[0])}


class Scale3:
    """Worker ``w``'s coded vectors times 3 (authenticated: it holds its key)."""

    def __init__(self, worker: Worker) -> None:
        self.sent = 0
        polled = worker.poll

        def poll() -> Any:
            events, work, out, when = polled()
            fixed = []
            for o in out:
                if isinstance(o.message, CodedGradient):
                    self.sent += 1
                    o = o._replace(message=dataclasses.replace(
                        o.message, payload=np.ascontiguousarray(3 * o.message.payload)))
                fixed.append(o)
            return events, work, fixed, when

        worker.poll = poll  # type: ignore[method-assign]
