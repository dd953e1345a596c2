"""The Ray actors of the Ray backend (:mod:`aiogc.harness.ray_backend`): one runs a scheme's
:class:`~aiogc.net.drivers.PSServer`, one per worker runs its
:class:`~aiogc.net.drivers.WorkerClient`. A worker actor holds only its own key, never the
run's master secret (:class:`Secret` keeps keys out of reprs and logs)."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from aiogc.config import RunConfig
from aiogc.core import Event, Finished, RoundCompleted, RoundRecord, Worker
from aiogc.errors import AiogcError
from aiogc.harness.fidelity import (
    LAG_INTERVAL_S,
    CpuSnapshot,
    LoopLagMonitor,
    emulated,
)
from aiogc.harness.kit import (
    make_ps,
)
from aiogc.net.drivers import PSServer, WorkerClient
from aiogc.protocol.messages import Message
from aiogc.training.schedule import DelaySchedule
from aiogc.training.setup import TaskPolicy


class ClusterError(AiogcError):
    """The cluster could not be reached, could not place the run, or lost an actor."""


class Secret:
    """The run's shared secret, with a repr that never shows it (errors, logs, dashboards)."""

    __slots__ = ("value",)

    def __init__(self, value: bytes) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<secret redacted>"

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return (Secret, (self.value,))


def node_info() -> dict[str, Any]:
    """Where the calling actor runs (its node as Ray names it, IP, host name, process id) and
    on which event loop (Ray runs async actors on uvloop when it is installed)."""
    import ray

    # ray's helper is untyped; bound to a typed name so strict mypy accepts the call
    node_ip: Callable[[], str] = ray.util.get_node_ip_address
    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "node_ip": node_ip(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
    }


class PSActor:
    """Runs one scheme's :class:`PSServer` inside an async Ray actor.

    The driver calls :meth:`start` (bind, report the address), then :meth:`wait` (returns when
    the PS finished) while polling :meth:`drain`; :meth:`stop` aborts the run gracefully.
    """

    def __init__(self, config: RunConfig, schedule: DelaySchedule, secret: Secret,
                 verify: bool, epoch: int, bind: str | None) -> None:
        self._config = config
        self._schedule = schedule
        self._secret = secret
        self._verify = verify
        self._epoch = epoch
        self._bind = bind
        self._frames: list[dict[str, Any]] = []
        self._rounds: list[RoundRecord] = []
        self._placements: list[dict[str, Any]] = []
        self._incarnations: Counter[int] = Counter()
        self._server: PSServer | None = None
        self._serving: asyncio.Task[None] | None = None
        self._end_reason = "PS ended without a reason"
        self._end_t_ns = 0
        self._lag = LoopLagMonitor(interval_s=LAG_INTERVAL_S)
        self._cpu0: CpuSnapshot | None = None

    async def start(self) -> dict[str, Any]:
        ps, _ = make_ps(self._config, schedule=self._schedule, verify=self._verify,
                        secret=self._secret.value, epoch=self._epoch)
        host = self._bind or node_info()["node_ip"]
        frames = self._frames
        rounds = self._rounds
        k = self._config.time_scale  # every time recorded is emulated: the PS clock / K

        def frame_log(direction: str, peer: Any, msg: Message, nbytes: int) -> None:
            # the same clock as the PS's `now` (time.monotonic), as RunRecorder.frame requires
            frames.append({"t_ns": int(time.monotonic_ns() / k), "direction": direction,
                           "kind": msg.kind, "round": getattr(msg, "round", None),
                           "worker": ps.worker_of(peer), "nbytes": nbytes})

        def on_event(ev: Event) -> None:
            if isinstance(ev, RoundCompleted):
                rounds.append(emulated(ev.record, k))
            elif isinstance(ev, Finished):
                # the PS's clock, like every frame time it records
                self._end_reason, self._end_t_ns = ev.reason, int(time.monotonic_ns() / k)

        # the join deadline starts once every worker actor exists (register), not at listen:
        # placing and starting m actors on a loaded cluster can take longer than the whole
        # join timeout (0 of 32 joined in 30 s)
        server = PSServer(ps, host=host, port=0, frame_log=frame_log, on_event=on_event,
                          join_clock=False)
        serving = asyncio.create_task(server.serve())
        started = asyncio.create_task(server.started.wait())
        await asyncio.wait({serving, started}, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            started.cancel()
            serving.result()  # the bind error, with the address in it
            raise ClusterError(f"PS on {host} stopped before listening")
        self._server, self._serving = server, serving
        self._lag.start()
        self._cpu0 = CpuSnapshot.take()
        info = {**node_info(), "role": "ps", "worker": None, "incarnation": 1,
                "address": f"{host}:{server.port}", "ps_time": time.monotonic()}
        self._placements.append(info)
        return info

    async def register(self, info: dict[str, Any]) -> int:
        """A worker actor (re)started: note where it runs; returns its incarnation (1, 2...)."""
        j = int(info["worker"])
        self._incarnations[j] += 1
        if self._server is not None and len(self._incarnations) == self._server.ps.m:
            self._server.workers_launched()
        self._placements.append({**info, "incarnation": self._incarnations[j], "address": None,
                                 "ps_time": time.monotonic()})
        return self._incarnations[j]

    async def drain(self) -> dict[str, list[Any]]:
        """Frames, round records and placements since the previous call."""
        out: dict[str, list[Any]] = {"frames": self._frames[:], "rounds": self._rounds[:],
                                     "placements": self._placements[:]}
        del self._frames[:], self._rounds[:], self._placements[:]
        return out

    async def wait(self) -> dict[str, Any]:
        """Return when the PS finished, with every round record."""
        assert self._serving is not None and self._server is not None
        await self._serving
        self._lag.stop()
        cpu1 = CpuSnapshot.take()
        k = self._config.time_scale
        return {"records": [emulated(r, k) for r in self._server.ps.records],
                "end_reason": self._end_reason, "end_t_ns": self._end_t_ns,
                "loop_lag_s": self._lag.lags,
                "cpu": cpu1.since(self._cpu0) if cpu1 is not None and self._cpu0 else None}

    async def workers_launched(self) -> None:
        """Start the join deadline now (the driver's fallback when some actor never
        registers within the placement timeout)."""
        if self._server is not None:
            self._server.workers_launched()

    async def stop(self, reason: str) -> None:
        if self._server is not None:
            self._server.stop(reason)


class WorkerActor:
    """Runs worker ``worker_id``'s :class:`WorkerClient` inside an async Ray actor.

    It holds only its own key k_j, never the run's master secret, and builds only the task the
    driver (its operator) names: no code is taken from the wire.
    """

    def __init__(self, worker_id: int, worker_key: Secret, task: str,
                 give_up_after_s: float) -> None:
        self._id = worker_id
        self._key = worker_key
        self._task = task
        self._give_up = give_up_after_s

    async def run(self, host: str, port: int, ps: Any) -> dict[str, Any]:
        info = {**node_info(), "role": "worker", "worker": self._id}
        incarnation = await ps.register.remote(info)
        client = WorkerClient(Worker(self._id, worker_key=self._key.value), host, port,
                              give_up_after_s=self._give_up,
                              policy=TaskPolicy(task=self._task))
        await client.run()  # a fatal handshake error raises ConnectionError: the driver says so
        return {**info, "incarnation": incarnation, "connections": client.connections}


