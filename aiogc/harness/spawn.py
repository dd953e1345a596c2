"""Local worker processes: one per worker, or worker hosts running blocks of coroutines.

What :func:`aiogc.harness.local.run_live` starts in processes mode and with ``--worker-hosts``:
the entry points (:func:`_worker_process`, :func:`_worker_host_process`), how the block of each
host is chosen (:func:`host_blocks`), the forkserver context with single-threaded BLAS, the
workers' lower priority, the parent-watch pipe (a worker whose runner died exits with
:data:`EXIT_PARENT_DIED`) and the reaping after the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from aiogc.core import Worker, WorkerCache
from aiogc.errors import EvictedError
from aiogc.harness.kit import BLAS_ENV, ExitReason
from aiogc.net.drivers import ClientOptions, WorkerClient
from aiogc.net.hostclient import HostClient
from aiogc.net.loops import run_on
from aiogc.protocol.auth import derive_worker_key

#: Exit status of a worker process whose runner died (it stops instead of reconnecting).
#: Internal to the local runner (not one of ``aiogc --help``'s codes): 7, so that it does not
#: read as the 4 of an evicted worker.
EXIT_PARENT_DIED = 7
#: Exit status of a worker (or worker-host) process the PS evicted: ``aiogc worker``'s
#: EXIT_EVICTED (the CLI's code list lives above this wing, in cli/args.py).
EXIT_EVICTED = 4






async def _watched(client: WorkerClient, parent_alive: Any, died: list[bool]) -> None:
    """Run ``client`` until it returns or the runner dies (see :func:`_watch_parent`)."""
    await _watch_parent(client.run(), parent_alive, died)


async def _watch_parent(coro: Coroutine[Any, Any, None], parent_alive: Any,
                        died: list[bool]) -> None:
    """Run ``coro`` until it returns or the runner dies.

    ``parent_alive`` is the read end of a pipe whose only write end the runner holds: it
    becomes readable (EOF) exactly when the runner exits, however it exits (SIGKILL
    included), so a worker never outlives its runner by more than one loop iteration.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(coro)
    fd = parent_alive.fileno()

    def on_parent_gone() -> None:
        died.append(True)
        task.cancel()

    loop.add_reader(fd, on_parent_gone)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        loop.remove_reader(fd)


def _say(line: str) -> None:
    """One line on stderr in one write: many worker processes share the runner's stderr."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _worker_process(worker_id: int, host: str, port: int, worker_key: bytes | None,
                    loop_kind: str, task: str | None = None, parent_alive: Any = None) -> None:
    """Entry point of one worker process (module-level so forkserver can import it).

    ``worker_key`` is this worker's own key k_j (never the run's master secret); ``task`` the
    task its operator (the runner) allows it to build. Prints why it exits on stderr: the PS's
    shutdown reason, an unreachable PS (exit 3) or a dead runner (exit
    :data:`EXIT_PARENT_DIED`).
    """
    from aiogc.training.setup import TaskPolicy

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent coordinates Ctrl-C
    _yield_cpu_to_ps()
    worker = Worker(worker_id, worker_key=worker_key)
    why = ExitReason()
    client = WorkerClient(worker, host, port, policy=TaskPolicy(task=task), on_event=why,
                          options=ClientOptions(progress_events=False))
    died: list[bool] = []
    try:
        if parent_alive is None:
            run_on(loop_kind, client.run())
        else:
            run_on(loop_kind, _watched(client, parent_alive, died))
    except EvictedError as exc:  # the PS evicted it
        _say(f"aiogc worker {worker_id}: exiting: evicted by the PS ({exc})")
        sys.exit(EXIT_EVICTED)
    except ConnectionError as exc:
        _say(f"aiogc worker {worker_id}: exiting: {exc}")
        sys.exit(3)
    if died:
        _say(f"aiogc worker {worker_id}: exiting: parent process died")
        sys.exit(EXIT_PARENT_DIED)
    if why.early:
        _say(f"aiogc worker {worker_id}: exiting: {why.describe()}")


def _worker_host_process(worker_ids: Sequence[int], host: str, port: int,
                         worker_keys: Sequence[bytes | None], loop_kind: str,
                         task: str | None = None, parent_alive: Any = None) -> None:
    """Entry point of one worker-host process: the workers ``worker_ids`` as coroutines on
    this process's loop, sharing one scheme and task (``--worker-hosts``).

    ``worker_keys[i]`` is worker ``worker_ids[i]``'s own key k_j. Exits like
    :func:`_worker_process`: 3 if a worker could not reach the PS, :data:`EXIT_PARENT_DIED`
    when the runner died; a worker that stopped early says why on stderr.
    """
    from aiogc.training.setup import SetupCache, TaskPolicy

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent coordinates Ctrl-C
    _yield_cpu_to_ps()
    setups = SetupCache(TaskPolicy(task=task))
    cache = WorkerCache()  # and what the workers validate, once per host
    whys = [ExitReason() for _ in worker_ids]
    # one connection for the whole block (docs/protocol.md §2.6), one timer heap
    client = HostClient([Worker(j, worker_key=k, cache=cache)
                         for j, k in zip(worker_ids, worker_keys, strict=True)],
                        host, port, setups=setups, on_events=whys,
                        options=ClientOptions(progress_events=False))
    died: list[bool] = []

    async def run_all() -> list[BaseException | None]:
        return await client.run()

    async def watched() -> list[BaseException | None]:
        if parent_alive is None:
            return await run_all()
        outcome: list[list[BaseException | None]] = []

        async def keep() -> None:
            outcome.append(await run_all())

        await _watch_parent(keep(), parent_alive, died)
        return outcome[0] if outcome else []

    results = run_on(loop_kind, watched())
    if died:
        _say(f"aiogc worker host {worker_ids[0]}..{worker_ids[-1]}: exiting: parent process died")
        sys.exit(EXIT_PARENT_DIED)
    code = _host_exit_code(worker_ids, results, whys)
    if code:
        sys.exit(code)


def _host_exit_code(worker_ids: Sequence[int], results: Sequence[Any],
                    whys: Sequence[Any]) -> int:
    """Say why each worker of a host process ended; its exit code: 3 if one was unreachable,
    else :data:`EXIT_EVICTED` if one was evicted, else 0."""
    unreachable = evicted = False
    for j, res, why in zip(worker_ids, results, whys, strict=False):
        if isinstance(res, EvictedError):
            _say(f"aiogc worker {j}: exiting: evicted by the PS ({res})")
            evicted = True
        elif isinstance(res, ConnectionError):
            _say(f"aiogc worker {j}: exiting: {res}")
            unreachable = True
        elif isinstance(res, BaseException):
            _say(f"aiogc worker {j}: exiting: {type(res).__name__}: {res}")
        elif why.early:
            _say(f"aiogc worker {j}: exiting: {why.describe()}")
    return 3 if unreachable else EXIT_EVICTED if evicted else 0


def host_blocks(m: int, hosts: int) -> list[list[int]]:
    """Worker ids ``0..m-1`` split into ``hosts`` contiguous, near-equal blocks (no empty one).

    >>> host_blocks(5, 2)
    [[0, 1, 2], [3, 4]]
    """
    hosts = max(1, min(hosts, m))
    size, extra = divmod(m, hosts)
    out, start = [], 0
    for h in range(hosts):
        n = size + (1 if h < extra else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out


#: Niceness added to local worker processes (``AIOGC_WORKER_NICE`` overrides; 0 disables).
WORKER_NICE = 10


def _yield_cpu_to_ps() -> None:
    """Lower this worker process's scheduling priority below the PS's.

    On a real cluster every worker has its own CPU and never delays the PS; on one machine m
    worker processes share its cores with the PS, and when they are all runnable (a broadcast
    has just reached them) a fair scheduler gives the PS one share in m+1, so its reads,
    decode and next broadcast wait behind work that a cluster would run elsewhere. With a
    higher nice value the workers still get every cycle the PS leaves idle.
    """
    try:
        nice = int(os.environ.get("AIOGC_WORKER_NICE", WORKER_NICE))
    except ValueError:
        nice = WORKER_NICE
    if nice > 0:
        with contextlib.suppress(OSError):
            os.nice(nice)


def _mp_context(start_method: str = "forkserver") -> Any:
    methods = mp.get_all_start_methods()
    if start_method not in ("forkserver", "spawn"):
        from aiogc.errors import ConfigError

        raise ConfigError("start_method", start_method, "forkserver or spawn")
    if start_method == "forkserver" and "forkserver" in methods:
        ctx = mp.get_context("forkserver")
        # preloaded once in the fork server, shared copy-on-write by every worker;
        # aiogc.coding too: build_scheme imports it lazily, which otherwise blocks each worker's
        # loop for ~0.1 s (seconds on a loaded machine) when the welcome arrives
        ctx.set_forkserver_preload(["aiogc.harness.local", "aiogc.coding", "numpy", "scipy.linalg",
                                    "msgpack"])
        return ctx
    return mp.get_context("spawn")  # pragma: no cover - platforms without forkserver


@contextlib.contextmanager
def _single_thread_blas_env() -> Any:
    """Children inherit one-thread BLAS (the parent's already-loaded BLAS is unaffected)."""
    old = {k: os.environ.get(k) for k in BLAS_ENV}
    for k in BLAS_ENV:
        os.environ[k] = "1"
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _reap(procs: list[Any], grace_s: float) -> list[int | None]:
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(1.0)
        if p.is_alive():
            p.kill()
            p.join(1.0)
    return [p.exitcode for p in procs]



def _worker_spawns(m: int, worker_hosts: int, secret: bytes | None, port: int, loop_kind: str,
                   task: str | None, parent_alive: Any
                   ) -> list[tuple[str, Callable[..., None], tuple[Any, ...]]]:
    """``(process name, target, args)`` of every worker process: one per worker, or with
    ``worker_hosts`` > 0 that many hosts, each running a block of workers as coroutines."""
    def key(j: int) -> bytes | None:
        return None if secret is None else derive_worker_key(secret, j)

    if not worker_hosts:
        return [(f"aiogc-worker-{j}", _worker_process,
                 (j, "127.0.0.1", port, key(j), loop_kind, task, parent_alive))
                for j in range(m)]
    return [(f"aiogc-worker-host-{ids[0]}-{ids[-1]}", _worker_host_process,
             (ids, "127.0.0.1", port, [key(j) for j in ids], loop_kind, task, parent_alive))
            for ids in host_blocks(m, worker_hosts)]
