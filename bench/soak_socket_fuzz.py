"""Socket fuzz soak: malformed connections against a PS while honest workers train.

The goal (reliability.md, "Measurable goals"): while >= 4 honest workers train, >= 10^4
malformed connections -> 0 PS crashes, 0 lost or wrong rounds for the honest workers, every bad
connection closed within 2 s.

Setup: one PS (with a shared secret, as a PS reachable by others must have) and ``--workers``
honest :class:`~aiogc.net.drivers.WorkerClient` coroutines in this process, on one event loop.
A separate process opens ``--connections`` malformed connections to the PS's port with at most
``--concurrency`` open at once, of these kinds (seeded):

=================  ==============================================================================
random             random bytes (1 B .. 4 KiB), then EOF
mutated            a valid frame of any kind with bytes flipped / inserted / deleted / duplicated
truncated          a valid frame cut short, then EOF
oversized          a length prefix above the pre-auth cap (up to 0xFFFFFFFF), then some bytes
http / tls         an HTTP request / a TLS ClientHello
wrong_state        a well-formed frame the PS does not accept before authentication
                   (coded_gradient, chunk_report, round_start, ...)
bad_mac            a well-formed hello for an in-range worker id with a wrong MAC
bad_id             a well-formed hello for a worker id >= m
eof                connect, then EOF at once
slowloris          one byte of a length prefix, then silence
trickle            one byte every 200 ms (never a complete frame)
=================  ==============================================================================

Each fuzz connection records the time from connect to EOF (or reset) as seen by the client.
The PS's auth deadline is 2 s, so a slowloris / trickle / silent peer is closed at 2 s plus
timer latency; everything else is closed as soon as it is parsed.

Afterwards a clean run (no fuzz, same seed, same schedule, same number of rounds) is made and
every fuzzed-run round is compared with it: status, decoded gradient (bit-identical expected;
``--rtol`` tolerance reported), trigger state, loss. Report: PS crashes (serve task failed or an
unhandled exception in the loop), rounds lost or wrong, honest workers dropped, close-time
percentiles by kind, the PS's close-reason counters, total time.

    python bench/soak_socket_fuzz.py                       # 10000 connections
    python bench/soak_socket_fuzz.py --connections 1000 --json soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from aiogc.config import RunConfig
from aiogc.core import Finished, ParameterServer, RoundCompleted, RoundRecord, Worker
from aiogc.harness.kit import make_ps
from aiogc.net.drivers import ClientOptions, PSServer, WorkerClient
from aiogc.net.loops import loop_factory
from aiogc.protocol.messages import (
    Bye,
    ChunkReport,
    CodedGradient,
    EncodeAndTransmit,
    Error,
    Hello,
    Message,
    Ping,
    Pong,
    Ready,
    Resume,
    RoundEnd,
    RoundStart,
    Shutdown,
    state_digest,
)
from aiogc.protocol.wire import encode_frame_bytes
from aiogc.training.schedule import DelaySchedule

HOST = "127.0.0.1"
#: The goal: every bad connection closed within this many seconds.
CLOSE_GOAL_S = 2.0
#: A fuzz connection still open after this long counts as not closed (a failure).
CLIENT_GIVE_UP_S = 10.0

KINDS: dict[str, float] = {  # kind -> weight
    "random": 16, "mutated": 30, "truncated": 10, "oversized": 8, "http": 4, "tls": 4,
    "wrong_state": 10, "bad_mac": 6, "bad_id": 4, "eof": 4, "slowloris": 2, "trickle": 2,
}
SLOW_KINDS = frozenset({"slowloris", "trickle"})


# ------------------------------------------------------------------ the honest side


def spaced_schedule(config: RunConfig, *, gap_s: float, rounds: int) -> DelaySchedule:
    """Chunk completions on distinct multiples of ``gap_s`` within each round, so the trigger
    state of each round does not depend on scheduling jitter below ``gap_s``."""
    scheme = config.build_scheme()
    loads = [int(x) for x in scheme.loads]
    rng = np.random.default_rng([config.seed, 0x5ACED])
    comp = np.zeros((rounds, scheme.m, max(loads)))
    for r in range(rounds):
        slots = (rng.permutation(sum(loads)) + 1) * gap_s
        i = 0
        for j, load in enumerate(loads):
            finish = np.sort(slots[i:i + load])
            i += load
            comp[r, j, :load] = np.diff(np.concatenate(([0.0], finish)))
    return DelaySchedule(compute_s=comp, network_s=np.zeros((rounds, scheme.m)),
                         seed=config.seed, compute_spec=f"scripted-gap:{gap_s}",
                         network_spec="none")


class Training:
    """A PS and its honest workers on the running loop; counts loop errors."""

    def __init__(self, config: RunConfig, schedule: DelaySchedule, secret: bytes) -> None:
        self.ps: ParameterServer = make_ps(config, schedule=schedule, secret=secret,
                                           keep_gradients=True)[0]
        self.secret = secret
        self.rounds_done = 0
        self.progress = asyncio.Event()
        self.server = PSServer(self.ps, host=HOST, port=0, on_event=self._on_event)
        self.serve_task: asyncio.Task[None] | None = None
        self.clients: list[asyncio.Task[None]] = []
        self.finished_reason: str | None = None

    def _on_event(self, ev: Any) -> None:
        if isinstance(ev, RoundCompleted):
            self.rounds_done += 1
            self.progress.set()
        elif isinstance(ev, Finished):
            self.finished_reason = ev.reason
            self.progress.set()

    async def start(self) -> int:
        self.serve_task = asyncio.create_task(self.server.serve())
        await self.server.started.wait()
        for j in range(self.ps.m):
            client = WorkerClient(Worker(j, secret=self.secret), HOST, self.server.port,
                                  options=ClientOptions(backoff_s=(0.01, 0.2)))
            self.clients.append(asyncio.create_task(client.run()))
        return self.server.port

    async def wait_rounds(self, n: int) -> None:
        while self.rounds_done < n and self.finished_reason is None:
            self.progress.clear()
            await self.progress.wait()

    async def stop(self) -> list[BaseException]:
        """Stop the PS; return the errors of the serve task and the clients (none expected).
        Unbounded: the caller puts it under a timeout."""
        self.server.stop("soak done")
        errors: list[BaseException] = []
        assert self.serve_task is not None
        for t in [self.serve_task, *self.clients]:
            try:
                await t
            except Exception as exc:
                errors.append(exc)
        return errors


def run_on_loop(kind: str, main: Callable[[], Any]) -> tuple[Any, list[dict[str, Any]]]:
    """Run ``main()`` on a fresh loop; also return what the loop's exception handler saw."""
    errors: list[dict[str, Any]] = []
    _, factory = loop_factory(kind)
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.get_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx))
        result = runner.run(main())
    return result, errors


# ------------------------------------------------------------------ the fuzz side (a process)


def _valid_frames(rng: random.Random, m: int) -> list[bytes]:
    def b(n: int) -> bytes:
        return rng.randbytes(n)

    d = rng.choice([1, 12, 100])
    payload = np.frombuffer(b(8 * d), dtype="<f8").copy()
    payload[~np.isfinite(payload)] = 0.0
    msgs: list[Message] = [
        Hello(worker=rng.randrange(m), nonce=b(16), mac=b(32), epoch=0),
        Ready(epoch=0),
        ChunkReport(epoch=0, round=rng.randrange(5), count=1, t_worker=0.5, elapsed_s=0.1),
        CodedGradient(epoch=0, round=0, attempt=0, state_digest=state_digest([1] * m),
                      compute_s=0.1, payload=payload),
        Ping(seq=rng.randrange(1 << 30)),
        Pong(seq=1),
        Bye(reason="bye"),
        Error(code="x", reason="y" * rng.randrange(50)),
        RoundStart(epoch=0, round=0, delays_s=(0.1,) * 2, net_delay_s=0.0,
                   model=payload),
        EncodeAndTransmit(epoch=0, round=0, attempt=0, state=tuple([1] * m)),
        Resume(epoch=0, round=0, attempt=1),
        RoundEnd(epoch=0, round=0, status="exact"),
        Shutdown(reason="now"),
    ]
    return [encode_frame_bytes(x) for x in msgs]


def _mutate(rng: random.Random, frame: bytes) -> bytes:
    data = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        if op == 0 and data:  # flip bytes
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif op == 1:  # insert
            at = rng.randrange(len(data) + 1)
            data[at:at] = rng.randbytes(rng.randint(1, 64))
        elif op == 2 and len(data) > 1:  # delete a range
            a = rng.randrange(len(data))
            del data[a:a + rng.randint(1, 32)]
        elif op == 3:  # duplicate the frame / append another
            data += frame
        elif op == 4 and len(data) >= 4:  # rewrite the length prefix
            data[0:4] = rng.randrange(1 << 32).to_bytes(4, "big")
        elif op == 5 and len(data) > 5:  # a msgpack "poison" byte somewhere in the header
            data[rng.randrange(4, len(data))] = rng.choice([0xC1, 0xC7, 0xD4, 0xDD, 0xDF, 0xFF])
    return bytes(data)


def make_case(rng: random.Random, kind: str, m: int) -> tuple[bytes, bool]:
    """(bytes to send, send EOF afterwards)."""
    frames = _valid_frames(rng, m)
    if kind == "random":
        return rng.randbytes(rng.randint(1, 4096)), True
    if kind == "mutated":
        return _mutate(rng, rng.choice(frames)), rng.random() < 0.5
    if kind == "truncated":
        f = rng.choice(frames)
        return f[:rng.randrange(1, len(f))], True
    if kind == "oversized":
        return rng.randint(513, (1 << 32) - 1).to_bytes(4, "big") + rng.randbytes(
            rng.randint(0, 2048)), rng.random() < 0.5
    if kind == "http":
        return (f"{rng.choice(['GET', 'POST', 'OPTIONS'])} /{rng.randrange(999)} HTTP/1.1\r\n"
                f"Host: {HOST}\r\nContent-Length: 5\r\n\r\nhello").encode(), rng.random() < 0.5
    if kind == "tls":
        return bytes.fromhex("16030100a5010000a10303") + rng.randbytes(170), False
    if kind == "wrong_state":
        return rng.choice(frames[1:]), rng.random() < 0.5
    if kind == "bad_mac":
        return encode_frame_bytes(Hello(worker=rng.randrange(m), nonce=rng.randbytes(16),
                                        mac=rng.randbytes(32), epoch=0)), False
    if kind == "bad_id":
        return encode_frame_bytes(Hello(worker=m + rng.randrange(1000), nonce=rng.randbytes(16),
                                        mac=rng.randbytes(32), epoch=0)), False
    if kind == "eof":
        return b"", True
    if kind in SLOW_KINDS:
        # the start of a well-formed hello: never completed (slowloris) or completed one byte
        # per 200 ms (trickle, ~20 s for the frame): only the auth deadline ends either
        hello = encode_frame_bytes(Hello(worker=rng.randrange(m), nonce=rng.randbytes(16),
                                         mac=rng.randbytes(32), epoch=0))
        return (hello[:1] if kind == "slowloris" else hello), False
    raise ValueError(kind)


async def _read_to_close(reader: asyncio.StreamReader) -> str:
    try:
        while await reader.read(65536):
            pass
    except ConnectionResetError:
        return "reset"
    return "eof"


async def one_connection(port: int, kind: str, payload: bytes, eof: bool
                         ) -> tuple[str, float | None, str]:
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
    except OSError as exc:
        return kind, None, f"connect_error:{type(exc).__name__}"
    t0 = time.monotonic()
    trickle: asyncio.Task[None] | None = None
    rest = b""
    try:
        try:
            if kind == "trickle":
                payload, rest = payload[:1], payload[1:]
            if payload:
                writer.write(payload)
            if eof:
                writer.write_eof()
            await writer.drain()
        except (ConnectionResetError, BrokenPipeError):
            pass
        if kind == "trickle":
            async def drip() -> None:
                try:
                    for i in range(len(rest)):
                        await asyncio.sleep(0.2)
                        writer.write(rest[i:i + 1])
                        await writer.drain()
                except (ConnectionResetError, BrokenPipeError, RuntimeError):
                    return

            trickle = asyncio.create_task(drip())
        try:
            async with asyncio.timeout(CLIENT_GIVE_UP_S):
                how = await _read_to_close(reader)
        except TimeoutError:
            return kind, None, "not_closed"
        return kind, time.monotonic() - t0, how
    finally:
        if trickle is not None:
            trickle.cancel()
            await asyncio.gather(trickle, return_exceptions=True)
        writer.transport.abort()


async def fuzz(port: int, n: int, concurrency: int, seed: int, m: int
               ) -> list[tuple[str, float | None, str]]:
    rng = random.Random(seed)
    kinds = list(KINDS)
    weights = [KINDS[k] for k in kinds]
    sem = asyncio.Semaphore(concurrency)
    results: list[tuple[str, float | None, str]] = []

    async def guarded(kind: str, payload: bytes, eof: bool) -> None:
        try:
            results.append(await one_connection(port, kind, payload, eof))
        finally:
            sem.release()

    async with asyncio.TaskGroup() as tg:
        for _ in range(n):
            kind = rng.choices(kinds, weights)[0]
            payload, eof = make_case(rng, kind, m)
            await sem.acquire()
            tg.create_task(guarded(kind, payload, eof))
    return results


def fuzz_process(port: int, n: int, concurrency: int, seed: int, m: int, loop: str,
                 conn: Any) -> None:
    results, errors = run_on_loop(loop, lambda: fuzz(port, n, concurrency, seed, m))
    conn.send((results, len(errors)))
    conn.close()


# ------------------------------------------------------------------ the soak


async def fuzzed_run(a: argparse.Namespace, config: RunConfig, schedule: DelaySchedule,
                     secret: bytes) -> dict[str, Any]:
    tr = Training(config, schedule, secret)
    port = await tr.start()
    await tr.wait_rounds(a.warmup_rounds)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=fuzz_process, args=(port, a.connections, a.concurrency, a.seed,
                                                  config.workers, a.loop, child))
    t0 = time.monotonic()
    rounds_before = tr.rounds_done
    proc.start()
    child.close()
    results, fuzz_loop_errors = await asyncio.to_thread(parent.recv)
    await asyncio.to_thread(proc.join)
    fuzz_s = time.monotonic() - t0
    rounds_during = tr.rounds_done - rounds_before
    # a few more rounds after the flood, then stop
    await tr.wait_rounds(tr.rounds_done + 2)
    crashed = tr.finished_reason is not None or (tr.serve_task is not None
                                                 and tr.serve_task.done())
    async with asyncio.timeout(30.0):
        errors = await tr.stop()
    return {"ps": tr.ps, "results": results, "fuzz_s": fuzz_s, "rounds_during": rounds_during,
            "task_errors": errors, "crashed_early": crashed,
            "fuzz_loop_errors": fuzz_loop_errors}


async def clean_run(config: RunConfig, schedule: DelaySchedule, secret: bytes
                    ) -> list[RoundRecord]:
    tr = Training(config, schedule, secret)
    await tr.start()
    assert tr.serve_task is not None
    await tr.serve_task
    await asyncio.gather(*tr.clients)
    return tr.ps.records


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def timing(xs: list[float]) -> dict[str, Any]:
    return {"n": len(xs), "p50_s": pct(xs, 50), "p99_s": pct(xs, 99),
            "max_s": max(xs) if xs else float("nan"),
            "mean_s": statistics.fmean(xs) if xs else float("nan"),
            "over_goal": sum(1 for x in xs if x > CLOSE_GOAL_S),
            "over_goal_by_50ms": sum(1 for x in xs if x > CLOSE_GOAL_S + 0.05)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--connections", type=int, default=10_000, help="malformed connections")
    p.add_argument("--concurrency", type=int, default=48,
                   help="fuzz connections open at once (the PS caps unauthenticated "
                        "connections at 64; beyond that they are refused at once)")
    p.add_argument("--workers", type=int, default=4, help="honest workers (m)")
    p.add_argument("--delta", type=int, default=2)
    p.add_argument("--gap", type=float, default=0.02,
                   help="seconds between chunk completions in the scripted schedule")
    p.add_argument("--warmup-rounds", type=int, default=3)
    p.add_argument("--max-rounds", type=int, default=200_000,
                   help="schedule length (the run is stopped after the flood)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--loop", default="uvloop", help="uvloop | asyncio (both sides)")
    p.add_argument("--rtol", type=float, default=1e-9,
                   help="tolerance when comparing decoded gradients with the clean run")
    p.add_argument("--json", default=None, help="also write the report as JSON here")
    a = p.parse_args(argv)

    t_start = time.monotonic()
    secret = os.urandom(32)
    config = RunConfig(scheme="partial", workers=a.workers, delta=a.delta, n_parts=1,
                       rounds=a.max_rounds, seed=a.seed, task="linreg:samples=240,dim=12",
                       heartbeat_s=1.0, dead_after_s=5.0, round_timeout_s=30.0)
    schedule = spaced_schedule(config, gap_s=a.gap, rounds=a.max_rounds)

    fz, loop_errors = run_on_loop(a.loop, lambda: fuzzed_run(a, config, schedule, secret))
    dirty: ParameterServer = fz["ps"]
    k = len(dirty.records)
    ref, ref_loop_errors = run_on_loop(
        a.loop, lambda: clean_run(config.replace(rounds=k), schedule, secret))

    # ---- honest rounds: lost or wrong?
    lost = [r.round for r in dirty.records if r.status != "exact"]
    dropped = [(r.round, r.dropped) for r in dirty.records if r.dropped]
    wrong, state_diff, bit_identical = [], 0, 0
    for x, y in zip(dirty.records, ref, strict=True):
        assert x.gradient is not None and y.gradient is not None
        if not np.allclose(x.gradient, y.gradient, rtol=a.rtol,
                           atol=a.rtol * float(np.linalg.norm(y.gradient))):
            wrong.append(x.round)
        bit_identical += int(np.array_equal(x.gradient, y.gradient))
        state_diff += int(x.state != y.state)
    max_rel = max((r.rel_error for r in dirty.records), default=float("nan"))

    # ---- bad connections
    results = fz["results"]
    by_kind: dict[str, list[float]] = defaultdict(list)
    outcomes: Counter[str] = Counter()
    for kind, dt, how in results:
        outcomes[how] += 1
        if dt is not None:
            by_kind[kind].append(dt)
    fast = [dt for kd, xs in by_kind.items() if kd not in SLOW_KINDS for dt in xs]
    slow = [dt for kd, xs in by_kind.items() if kd in SLOW_KINDS for dt in xs]
    closed_all = [dt for xs in by_kind.values() for dt in xs]
    stats = dict(dirty.stats)
    crashes = (len(fz["task_errors"]) + len(loop_errors) + int(fz["crashed_early"]))
    report = {
        "command": " ".join([sys.executable, *sys.argv]),
        "loop": a.loop,
        "connections": len(results),
        "kinds": {kd: sum(1 for r in results if r[0] == kd) for kd in KINDS},
        "outcomes": dict(outcomes),
        "not_closed": outcomes.get("not_closed", 0),
        "connect_errors": sum(v for kd, v in outcomes.items() if kd.startswith("connect")),
        "close_time_all": timing(closed_all),
        "close_time_fast_kinds": timing(fast),
        "close_time_slow_kinds": timing(slow),
        "close_time_by_kind": {kd: timing(xs) for kd, xs in sorted(by_kind.items())},
        "ps_crashes": crashes,
        "ps_loop_errors": [str(c.get("message")) for c in loop_errors][:5],
        "fuzz_loop_errors": fz["fuzz_loop_errors"],
        "ps_close_counters": {kd: v for kd, v in sorted(stats.items())
                              if kd.startswith("closed_")},
        "ps_statistics": dict(sorted(stats.items())),
        "honest": {
            "workers": a.workers, "rounds": k, "rounds_during_flood": fz["rounds_during"],
            "rounds_not_exact": lost, "workers_dropped": dropped,
            "rounds_wrong_vs_clean": wrong, "bit_identical_rounds": bit_identical,
            "trigger_state_differences": state_diff, "max_rel_error": max_rel,
            "clean_run_loop_errors": len(ref_loop_errors),
        },
        "flood_s": fz["fuzz_s"],
        "total_s": time.monotonic() - t_start,
    }
    ok = (crashes == 0 and not lost and not wrong and not dropped
          and report["not_closed"] == 0 and report["connect_errors"] == 0
          and len(results) == a.connections)
    report["ok"] = ok

    def f(x: float) -> str:
        return f"{x * 1e3:8.1f} ms"

    print(f"soak: {len(results)} malformed connections ({a.concurrency} at once) while "
          f"{a.workers} honest workers trained, loop {a.loop}")
    print(f"  PS crashes / unhandled loop errors:  {crashes}")
    print(f"  honest rounds: {k} ({fz['rounds_during']} during the flood); not exact: "
          f"{len(lost)}; wrong vs clean run: {len(wrong)} (bit-identical {bit_identical}/{k}, "
          f"trigger-state differences {state_diff}); honest workers dropped: {len(dropped)}; "
          f"max rel error {max_rel:.1e}")
    print(f"  bad connections closed: {len(closed_all)}/{len(results)}  outcomes "
          f"{dict(outcomes)}")
    for name, xs in (("all", closed_all), ("fast kinds", fast),
                     ("slowloris+trickle", slow)):
        t = timing(xs)
        print(f"  time to close [{name:>17}] n={t['n']:5d}  p50 {f(t['p50_s'])}  "
              f"p99 {f(t['p99_s'])}  max {f(t['max_s'])}  over {CLOSE_GOAL_S:.0f} s: "
              f"{t['over_goal']} (by > 50 ms: {t['over_goal_by_50ms']})")
    print(f"  PS close counters: {report['ps_close_counters']}")
    print(f"  flood {report['flood_s']:.1f} s, total {report['total_s']:.1f} s  ->  "
          f"{'OK' if ok else 'FAILED'}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(report, fh, indent=2, sort_keys=True, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
