"""In-process coroutine workers (``aiogc run --as coroutines`` without ``--worker-hosts``).

The m workers run on the runner's own loop, beside the PS. By default they share one
connection to the PS, as the workers of one worker host do (:class:`~aiogc.net.hostclient.
HostClient`, docs/protocol.md §2.6): one timer heap instead of m loop timers, and the frames of
one wake-up or one read in one write, which is what the PS's loop pays for per round. With
``connection_per_worker`` each worker has its own connection and loop timer
(:class:`~aiogc.net.drivers.WorkerClient`), the path before protocol v4 (``aiogc run
--connection-per-worker``). Either way every worker keeps its own core, key and handshake.
"""

from __future__ import annotations

import sys
from collections.abc import Coroutine
from typing import Any

from aiogc.core import Worker, WorkerCache
from aiogc.net.drivers import WorkerClient
from aiogc.net.hostclient import HostClient
from aiogc.protocol.auth import derive_worker_key
from aiogc.protocol.hostmux import MAX_SLOTS

__all__ = ["in_process_workers"]


async def _guarded(client: WorkerClient) -> None:
    """Run an in-process worker; a worker that cannot reach the PS is reported, not fatal."""
    try:
        await client.run()
    except ConnectionError as exc:
        print(f"aiogc: {exc}", file=sys.stderr)


async def _guarded_host(client: HostClient) -> None:
    """Run a block of in-process workers; one that could not reach the PS is reported."""
    for res in await client.run():
        if res is not None:
            print(f"aiogc: {res}", file=sys.stderr)


def in_process_workers(m: int, port: int, secret: bytes | None, task: str | None, *,
                       connection_per_worker: bool = False
                       ) -> list[Coroutine[Any, Any, None]]:
    """The coroutines that run workers ``0..m-1`` against the PS at ``127.0.0.1:port``.

    One coroutine per :data:`~aiogc.protocol.hostmux.MAX_SLOTS` workers (one host connection
    each), or with ``connection_per_worker`` one per worker. The workers share one scheme and
    task, built once (off the loop), and one validation cache.
    """
    from aiogc.training.setup import SetupCache, TaskPolicy

    setups = SetupCache(TaskPolicy(task=task))
    cache = WorkerCache()
    workers = [Worker(j, worker_key=None if secret is None else derive_worker_key(secret, j),
                      cache=cache) for j in range(m)]
    if connection_per_worker:
        return [_guarded(WorkerClient(w, "127.0.0.1", port, setups=setups)) for w in workers]
    return [_guarded_host(HostClient(workers[i:i + MAX_SLOTS], "127.0.0.1", port,
                                     setups=setups))
            for i in range(0, m, MAX_SLOTS)]

