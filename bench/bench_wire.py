"""Wire benchmark: coded-payload throughput and small-frame round trips over loopback.

Throughput: a client sends ``CodedGradient`` frames (d float32) to a receiver in another
process; the receiver's ``alloc`` hands the decoder a preallocated row, so the payload lands in
place. Baseline: the same bytes sent with a blocking socket ``sendall`` to a receiver doing
``recv_into`` a preallocated buffer. Baseline and subjects are interleaved trial by trial (the
machine is shared and noisy); medians of ``--trials`` each; the ratio is
median(subject) / median(raw). Both ends of a framed subject use the same loop.

Round trip: the client sends a ``chunk_report`` and waits for the receiver's ``pong``;
p50 / p99 over ``--rtt-n`` round trips after a warm-up.

Per-frame codec cost (``--micro``, no sockets): for each hot kind, CPU time per frame of the
send path (``FramedConnection.send``: encode, tag, queue, write into an in-memory transport)
and of the receive path (``get_buffer`` / ``buffer_updated`` in 64 KiB reads, decode, verify,
deliver), untagged and tagged. ``--ab OLD_TREE`` runs it alternately against another checkout's
``aiogc`` (e.g. the previous protocol version) and this one, one subprocess per trial, and
reports medians and new / old ratios.

    python bench/bench_wire.py --loop both --trials 7
    python bench/bench_wire.py --json > wire.json
    python bench/bench_wire.py --micro
    python bench/bench_wire.py --ab /tmp/old_checkout --trials 9
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from aiogc.net.framing import FramedConnection
from aiogc.protocol.messages import (
    ChunkReport,
    CodedGradient,
    EncodeAndTransmit,
    Message,
    Ping,
    Pong,
    RoundStart,
)
from aiogc.protocol.wire import encode_frame

HOST = "127.0.0.1"
_REQ = struct.Struct(">QQ")  # raw baseline request: frames, frame_bytes


def _loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def _coded(d: int) -> CodedGradient:
    return CodedGradient(epoch=0, round=1, attempt=0, state_digest=b"\x00" * 8, compute_s=0.0,
                         payload=np.ones(d, dtype="<f4"))


# ------------------------------------------------------------------------ receivers (children)


def _raw_receiver(ready: Any) -> None:
    lsock = socket.create_server((HOST, 0))
    ready.send(lsock.getsockname()[1])
    buf = bytearray(0)
    while True:
        sock, _ = lsock.accept()
        with sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            head = sock.recv(_REQ.size, socket.MSG_WAITALL)
            if len(head) < _REQ.size:
                continue
            frames, frame_bytes = _REQ.unpack(head)
            if frames == 0:  # round-trip baseline: echo until EOF
                while data := sock.recv(65536):
                    sock.sendall(data)
                continue
            if len(buf) < frame_bytes:
                buf = bytearray(frame_bytes)
            view = memoryview(buf)
            for _ in range(frames):
                got = 0
                while got < frame_bytes:
                    n = sock.recv_into(view[got:frame_bytes])
                    if n == 0:
                        break
                    got += n
            sock.sendall(b"k")


def _framed_receiver(ready: Any, loop_kind: str, auth_key: bytes | None = None) -> None:
    """``auth_key``: verify a per-frame tag on every frame received (protocol v2 session key;
    needs a build whose FramedConnection has ``set_auth``)."""
    rows: dict[int, np.ndarray] = {}

    def alloc(kind: str, header: dict[str, Any], dtype: np.dtype, n: int) -> np.ndarray:
        row = rows.get(n)
        if row is None or row.dtype != dtype:
            row = rows[n] = np.empty(n, dtype)  # the "PS's preallocated row", reused per trial
        return row

    def factory() -> FramedConnection:
        state = {"expect": 0, "got": 0}

        def on_message(conn: FramedConnection, msg: Message) -> None:
            if isinstance(msg, Ping):
                state["expect"], state["got"] = msg.seq, 0
            elif isinstance(msg, CodedGradient):
                state["got"] += 1
                if state["got"] == state["expect"]:
                    conn.send(Pong(seq=state["got"]))
            elif isinstance(msg, ChunkReport):
                conn.send(Pong(seq=msg.count))

        def on_close(conn: FramedConnection, exc: BaseException | None) -> None:
            pass

        conn = FramedConnection(on_message, on_close, alloc=alloc)
        if auth_key is not None:
            conn.set_auth(recv=auth_key)  # type: ignore[attr-defined,unused-ignore]
        return conn

    async def main() -> None:
        loop = asyncio.get_running_loop()
        srv = await loop.create_server(factory, HOST, 0)
        ready.send(srv.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    with asyncio.Runner(loop_factory=_loop_factory(loop_kind)) as r:
        r.run(main())


# ------------------------------------------------------------------------ senders (parent)


def raw_trial(port: int, msg: CodedGradient, frames: int) -> float:
    parts = encode_frame(msg)
    frame_bytes = sum(len(p) for p in parts)
    with socket.create_connection((HOST, port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(_REQ.pack(frames, frame_bytes))
        t0 = time.perf_counter()
        for _ in range(frames):
            for p in parts:
                sock.sendall(p)
        ack = sock.recv(1)
        dt = time.perf_counter() - t0
    assert ack == b"k"
    return frames * frame_bytes / dt


class _Client:
    def __init__(self) -> None:
        self.waiter: asyncio.Future[Pong] | None = None

    def on_message(self, conn: FramedConnection, msg: Message) -> None:
        if isinstance(msg, Pong) and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(msg)

    async def connect(self, port: int) -> FramedConnection:
        loop = asyncio.get_running_loop()
        # (both loops set TCP_NODELAY on TCP transports themselves)
        _, conn = await loop.create_connection(
            lambda: FramedConnection(self.on_message, lambda c, e: None), HOST, port)
        return conn


def has_frame_auth() -> bool:
    """Whether this build tags frames (protocol v2: ``FramedConnection.set_auth``)."""
    return hasattr(FramedConnection, "set_auth")


async def framed_trial(port: int, msg: CodedGradient, frames: int,
                       auth_key: bytes | None = None) -> float:
    """Payload bytes/s of ``frames`` frames; ``auth_key``: tag every frame sent with it."""
    client = _Client()
    conn = await client.connect(port)
    if auth_key is not None:
        conn.set_auth(send=auth_key)  # type: ignore[attr-defined,unused-ignore]
    frame_bytes = sum(len(p) for p in encode_frame(msg))
    conn.send(Ping(seq=frames))
    client.waiter = asyncio.get_running_loop().create_future()
    t0 = time.perf_counter()
    for _ in range(frames):
        conn.send(msg)
        await conn.drain()
    pong = await client.waiter
    dt = time.perf_counter() - t0
    assert pong.seq == frames
    conn.close()
    return frames * frame_bytes / dt


def _report(i: int) -> ChunkReport:
    return ChunkReport(epoch=0, round=1, count=i % 1000, t_worker=0.0, elapsed_s=0.0)


class RawRtt:
    """Baseline: the same chunk_report bytes echoed by a blocking socket peer."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection((HOST, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(_REQ.pack(0, 0))

    def run(self, n: int, start: int) -> list[float]:
        out = []
        for i in range(start, start + n):
            data = encode_frame(_report(i))[0]
            t0 = time.perf_counter_ns()
            self.sock.sendall(data)
            got = 0
            while got < len(data):
                got += len(self.sock.recv(65536))
            out.append((time.perf_counter_ns() - t0) / 1e3)
        return out

    def close(self) -> None:
        self.sock.close()


async def rtt_open(port: int) -> tuple[_Client, FramedConnection]:
    client = _Client()
    return client, await client.connect(port)


async def rtt_run(client: _Client, conn: FramedConnection, n: int, start: int) -> list[float]:
    """Each round trip includes building the message, encoding, decoding and validating it."""
    loop = asyncio.get_running_loop()
    out: list[float] = []
    for i in range(start, start + n):
        client.waiter = loop.create_future()
        t0 = time.perf_counter_ns()
        conn.send(_report(i))
        await client.waiter
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return out


async def _aclose(conn: FramedConnection) -> None:
    conn.close()


# ------------------------------------------------------------------------ socket-free micro


class _MemTransport:
    """Just enough of an asyncio transport for FramedConnection: writes go to a list."""

    def __init__(self) -> None:
        self.out: list[bytes | memoryview] = []
        self.write = self.out.append

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("mem", 0) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0


def micro_messages(m: int = 64, d: int = 100) -> dict[str, Message]:
    """One message per hot kind, shaped like an m-worker run with a d-element model."""
    rng = np.random.default_rng(0)
    return {
        "round_start": RoundStart(epoch=3, round=17, delays_s=(0.01, 0.02, 0.005, 0.03),
                                  net_delay_s=0.0, model=rng.standard_normal(d).astype("<f4")),
        "chunk_report": ChunkReport(epoch=3, round=17, count=2, t_worker=12345.678,
                                    elapsed_s=0.0123),
        "encode_and_transmit": EncodeAndTransmit(
            epoch=3, round=17, attempt=0, state=tuple(int(x) for x in rng.integers(0, 5, m))),
        "coded_gradient": CodedGradient(epoch=3, round=17, attempt=0, state_digest=b"\x01" * 8,
                                        compute_s=0.25,
                                        payload=rng.standard_normal(d).astype("<f4")),
    }


def _micro_one(msg: Message, n: int, key: bytes | None) -> tuple[float, float]:
    """CPU microseconds per frame: (send path, receive path) for ``n`` copies of ``msg``."""
    got: list[Message] = []
    arr = msg.array()
    row = None if arr is None else np.empty_like(arr)

    def conn_alloc(conn: Any, kind: str, header: Any, dtype: Any, k: int) -> Any:
        return row

    tx = FramedConnection(lambda c, x: None, lambda c, e: None)
    rx = FramedConnection(lambda c, x: got.append(x), lambda c, e: None, conn_alloc=conn_alloc)
    sink, src = _MemTransport(), _MemTransport()
    tx.connection_made(sink)  # type: ignore[arg-type]
    rx.connection_made(src)  # type: ignore[arg-type]
    if key is not None:
        tx.set_auth(send=key)
        rx.set_auth(recv=key)
    send = tx.send
    t0 = time.process_time()
    for _ in range(n):
        send(msg)
    t_send = time.process_time() - t0
    stream = memoryview(b"".join(sink.out))
    get_buffer, buffer_updated = rx.get_buffer, rx.buffer_updated
    pos, end = 0, len(stream)
    t0 = time.process_time()
    while pos < end:
        buf = get_buffer(65536)
        k = min(len(buf), end - pos)
        buf[:k] = stream[pos:pos + k]
        buffer_updated(k)
        pos += k
    t_recv = time.process_time() - t0
    assert len(got) == n and got[-1].kind == msg.kind, (len(got), n)
    return t_send / n * 1e6, t_recv / n * 1e6


def micro(n: int = 20000, m: int = 64, d: int = 100) -> dict[str, dict[str, float]]:
    """Per-frame CPU µs of each hot kind's send / receive path, untagged and tagged."""

    async def run() -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for kind, msg in micro_messages(m, d).items():
            _micro_one(msg, 500, None)  # warm-up
            for tagged in (False, True):
                s, r = _micro_one(msg, n, bytes(range(32)) if tagged else None)
                out[f"{kind}{'/tagged' if tagged else ''}"] = {"send_us": s, "recv_us": r}
        return out

    return asyncio.run(run())


def micro_ab(old_tree: str, trials: int, n: int) -> dict[str, Any]:
    """Interleaved A/B of :func:`micro`: one subprocess per trial, old tree then this one."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    samples: dict[str, list[dict[str, dict[str, float]]]] = {"old": [], "new": []}
    for _ in range(trials):
        for name, tree in (("old", old_tree), ("new", here)):
            env = {**os.environ, "PYTHONPATH": tree}
            res = subprocess.run([sys.executable, os.path.abspath(__file__), "--micro", "--json",
                                  "--micro-n", str(n)], env=env, check=True,
                                 capture_output=True, text=True)
            samples[name].append(json.loads(res.stdout))
    rows = []
    for key in samples["new"][0]:
        row: dict[str, Any] = {"case": key}
        for path in ("send_us", "recv_us"):
            old = statistics.median(s[key][path] for s in samples["old"])
            new = statistics.median(s[key][path] for s in samples["new"])
            row[path] = {"old": old, "new": new, "ratio": new / old}
        rows.append(row)
    return {"trials": trials, "n": n, "rows": rows}


def _print_ab(res: dict[str, Any]) -> None:
    print(f"per-frame CPU us, {res['trials']} interleaved trials of {res['n']} frames, medians")
    print(f"{'case':<28} {'send old':>9} {'send new':>9} {'ratio':>6} "
          f"{'recv old':>9} {'recv new':>9} {'ratio':>6}")
    for row in res["rows"]:
        s, r = row["send_us"], row["recv_us"]
        print(f"{row['case']:<28} {s['old']:>9.2f} {s['new']:>9.2f} {s['ratio']:>6.2f} "
              f"{r['old']:>9.2f} {r['new']:>9.2f} {r['ratio']:>6.2f}")


# ------------------------------------------------------------------------ driver


def _start(target: Callable[..., None], *args: Any) -> tuple[Any, int]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child, *args), daemon=True)
    proc.start()
    port = parent.recv()
    return proc, port


def _measure_rtt(raw_port: int, ports: dict[str, int], runners: dict[str, asyncio.Runner],
                 loops: list[str], rtt_n: int, rtt_warmup: int) -> list[dict[str, Any]]:
    """Round-trip rows: raw socket echo and each loop's FramedConnection."""
    out: list[dict[str, Any]] = []
    # round trips, interleaved in blocks: raw, then each loop
    raw_rtt = RawRtt(raw_port)
    clients = {kind: runners[kind].run(rtt_open(ports[kind])) for kind in loops}
    rtts: dict[str, list[float]] = {"raw": [], **{k: [] for k in loops}}
    block = 100
    for b in range(-(-rtt_warmup // block) - (-rtt_n // block)):
        keep = b * block >= rtt_warmup
        xs = raw_rtt.run(block, b * block)
        if keep:
            rtts["raw"] += xs
        for kind in loops:
            xs = runners[kind].run(rtt_run(*clients[kind], block, b * block))
            if keep:
                rtts[kind] += xs
    raw_rtt.close()
    for kind in loops:
        runners[kind].run(_aclose(clients[kind][1]))
    for name, xs in rtts.items():
        q = np.percentile(xs, [50, 99])
        out.append({
            "subject": "raw socket echo" if name == "raw" else f"FramedConnection/{name}",
            "n": len(xs), "p50_us": float(q[0]), "p99_us": float(q[1]),
            "mean_us": float(np.mean(xs))})
    return out


def _print_table(results: dict[str, Any], trials: int) -> None:
    print(f"python {results['python']}, {results['cpus']} cpus, {trials} interleaved "
          f"trials, medians")
    print(f"{'d':>10} {'frame MB':>8} {'subject':<26} {'GB/s':>6} {'min':>6} {'max':>6} "
          f"{'x raw':>6}")
    for row in results["throughput"]:
        print(f"{row['d']:>10} {row['frame_mb']:>8} {row['subject']:<26} "
              f"{row['median_gb_s']:>6.2f} {row['min_gb_s']:>6.2f} {row['max_gb_s']:>6.2f} "
              f"{row['ratio_to_raw']:>6.2f}")
    print()
    print(f"{'round trip, chunk_report -> pong':<36} {'n':>6} {'p50 us':>8} {'p99 us':>8}")
    for row in results["rtt"]:
        print(f"{row['subject']:<36} {row['n']:>6} {row['p50_us']:>8.1f} {row['p99_us']:>8.1f}")


def _micro_main(args: argparse.Namespace) -> int:
    if args.ab:
        ab = micro_ab(args.ab, args.trials, args.micro_n)
        if args.json:
            print(json.dumps(ab, indent=2))
        else:
            _print_ab(ab)
        return 0
    res = micro(args.micro_n)
    if args.json:
        print(json.dumps(res))
    else:
        for case, v in res.items():
            print(f"{case:<28} send {v['send_us']:6.2f} us  recv {v['recv_us']:6.2f} us")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loop", choices=["uvloop", "asyncio", "both"], default="both")
    ap.add_argument("--d", type=float, nargs="+", default=[1e6, 1e7],
                    help="payload lengths (float32 elements)")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--mb-per-trial", type=float, default=200.0,
                    help="payload megabytes per throughput trial (frames = this / frame size)")
    ap.add_argument("--rtt-n", type=int, default=2000)
    ap.add_argument("--rtt-warmup", type=int, default=200)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--micro", action="store_true",
                    help="socket-free per-frame codec cost of the hot kinds")
    ap.add_argument("--micro-n", type=int, default=20000, help="frames per micro case")
    ap.add_argument("--ab", metavar="OLD_TREE",
                    help="interleaved A/B of --micro: OLD_TREE's aiogc vs this one")
    args = ap.parse_args(argv)
    if args.ab or args.micro:
        return _micro_main(args)
    loops = ["uvloop", "asyncio"] if args.loop == "both" else [args.loop]

    procs = []
    raw_proc, raw_port = _start(_raw_receiver)
    procs.append(raw_proc)
    ports: dict[str, int] = {}
    for kind in loops:
        p, ports[kind] = _start(_framed_receiver, kind)
        procs.append(p)
    runners = {kind: asyncio.Runner(loop_factory=_loop_factory(kind)) for kind in loops}

    results: dict[str, Any] = {
        "python": sys.version.split()[0], "platform": platform.platform(),
        "cpus": os.cpu_count(), "trials": args.trials, "throughput": [], "rtt": []}
    try:
        for d_f in args.d:
            d = int(d_f)
            msg = _coded(d)
            frames = max(1, round(args.mb_per_trial * 1e6 / msg.payload.nbytes))
            # warm-up (page faults in the receivers' rows, connection paths)
            raw_trial(raw_port, msg, 1)
            for kind in loops:
                runners[kind].run(framed_trial(ports[kind], msg, 1))
            samples: dict[str, list[float]] = {"raw": [], **{k: [] for k in loops}}
            for _ in range(args.trials):  # interleaved: raw, then each loop, every trial
                samples["raw"].append(raw_trial(raw_port, msg, frames))
                for kind in loops:
                    samples[kind].append(runners[kind].run(framed_trial(ports[kind], msg,
                                                                        frames)))
            raw_med = statistics.median(samples["raw"])
            for name, xs in samples.items():
                med = statistics.median(xs)
                results["throughput"].append({
                    "d": d, "frame_mb": round(msg.payload.nbytes / 1e6, 1), "frames": frames,
                    "subject": "raw socket" if name == "raw" else f"FramedConnection/{name}",
                    "median_gb_s": med / 1e9, "min_gb_s": min(xs) / 1e9,
                    "max_gb_s": max(xs) / 1e9, "ratio_to_raw": med / raw_med})
        results["rtt"] = _measure_rtt(raw_port, ports, runners, loops, args.rtt_n,
                                      args.rtt_warmup)
    finally:
        for r in runners.values():
            r.close()
        for p in procs:
            p.terminate()
            p.join()

    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    _print_table(results, args.trials)
    return 0


if __name__ == "__main__":
    sys.exit(main())
