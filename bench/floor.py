"""The floor: the simplest live system that could run a partial round, on this machine, now.

One uvloop PS and m coroutine workers on one event loop, over loopback TCP, exchanging a
partial round's frames with their real sizes -- round start (the model), one report per chunk
finished, the encode broadcast, one coded vector per contributor -- and nothing else: no
protocol logic (the PS triggers after the number of reports the simulator says arrive before
the trigger), no authentication, no validation, no records, no gradients. Workers finish
their chunks on the run's schedule (absolute deadlines from the round start they received).

Its live / simulated round-time ratio is the honest lower bound of what any single-loop Python
system reaches here: ``python bench/floor.py --workers 64`` prints it; bench/run.py records it
as ``floor_round_vs_sim_m64`` / ``_m256`` beside aiogc's own ratio, measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import math
import statistics
import struct
import sys
import time
from functools import partial
from typing import Any

import numpy as np

from aiogc.config import RunConfig
from aiogc.sim.fast import build_schemes, schedule_for, simulate_fast

_HDR = struct.Struct("!IB")  # length of what follows the length, kind
START, REPORT, ENCODE, CODED = 1, 2, 3, 4


class _Conn(asyncio.Protocol):
    """Length-prefixed frames; ``on_frame(kind, body)`` per complete frame."""

    def __init__(self, on_frame: Any) -> None:
        self.on_frame = on_frame
        self.buf = bytearray()
        self.t: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while len(buf) >= 5:
            n, kind = _HDR.unpack_from(buf)
            if len(buf) < 4 + n:
                return
            body = bytes(buf[5:4 + n])
            del buf[:4 + n]
            self.on_frame(self, kind, body)

    def send(self, kind: int, body: bytes = b"") -> None:
        assert self.t is not None
        self.t.write(_HDR.pack(len(body) + 1, kind) + body)


class _FloorPS:
    """The PS: round start to all, trigger after the simulated number of reports, then wait
    for a vector from every worker that reported."""

    def __init__(self, m: int, trigger_reports: list[int], dim: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.m = m
        self.trigger_reports = trigger_reports
        self.model = bytes(8 * dim)
        self.conns: list[_Conn] = []
        self.all_connected = asyncio.Event()
        self.done = self.loop.create_future()
        self.durations: list[float] = []
        self.r = -1
        self.reports = self.coded = self.expect = 0
        self.reported: set[int] = set()
        self.t0 = 0.0

    def connected(self, conn: _Conn) -> None:
        self.conns.append(conn)
        if len(self.conns) == self.m:
            self.all_connected.set()

    def start_round(self) -> None:
        self.r += 1
        self.reports = self.coded = 0
        self.reported.clear()
        if self.r >= len(self.trigger_reports):
            self.done.set_result(None)
            return
        self.t0 = self.loop.time()
        for c in self.conns:
            c.send(START, self.model)

    def on_frame(self, conn: _Conn, kind: int, body: bytes) -> None:
        if struct.unpack("!I", body[:4])[0] != self.r:
            return  # a late frame of an earlier round
        if kind == REPORT:
            self.reports += 1
            self.reported.add(id(conn))
            if self.reports == self.trigger_reports[self.r]:
                self.expect = len(self.reported)
                for c in self.conns:
                    c.send(ENCODE, struct.pack("!I", self.r))
        elif kind == CODED:
            self.coded += 1
            if self.coded == self.expect:
                self.durations.append(self.loop.time() - self.t0)
                self.start_round()


class _FloorWorker:
    """A worker: finish chunks on the schedule (absolute deadlines from the round start it
    received), report each, answer the encode broadcast with one coded vector."""

    def __init__(self, j: int, delays: np.ndarray, payload_len: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.j = j
        self.delays = delays
        self.coded = bytes(8 * payload_len)
        self.r = -1
        self.done = 0
        self.due: np.ndarray = np.empty(0)
        self.timer: asyncio.TimerHandle | None = None

    def on_frame(self, conn: _Conn, kind: int, body: bytes) -> None:
        if kind == START:
            self.r += 1
            self.done = 0
            self.due = self.loop.time() + np.cumsum(self.delays[self.r, self.j])
            self._next(conn)
        elif kind == ENCODE:
            if self.timer is not None:
                self.timer.cancel()
            if self.done:
                conn.send(CODED, struct.pack("!I", self.r) + self.coded)

    def _next(self, conn: _Conn) -> None:
        if self.done < len(self.due) and np.isfinite(self.due[self.done]):
            self.timer = self.loop.call_at(float(self.due[self.done]), self._finished, conn)

    def _finished(self, conn: _Conn) -> None:
        self.done += 1
        conn.send(REPORT, struct.pack("!II", self.r, self.done))
        self._next(conn)


# -- the same exchange over one multiplexed connection -------------------------------------
#
# The simplest design with aiogc's default shape in-process (docs/protocol.md §2.6): every
# frame carries its worker's slot, the workers' deadlines live in one heap behind one loop
# timer, and what one read or one wake-up produces leaves in one write.

_MHDR = struct.Struct("!IBH")  # length of what follows the length, kind, slot


class _MuxConn(asyncio.Protocol):
    """Length-prefixed ``kind | slot | body`` frames; ``on_frame(kind, slot, body)`` per frame;
    everything sent while handling one read leaves in one write."""

    def __init__(self, on_frame: Any, on_made: Any = None) -> None:
        self.on_frame = on_frame
        self.on_made = on_made
        self.buf = bytearray()
        self.out: list[bytes] = []
        self.t: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport  # type: ignore[assignment]
        if self.on_made is not None:
            self.on_made(self)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while len(buf) >= 7:
            n, kind, slot = _MHDR.unpack_from(buf)
            if len(buf) < 4 + n:
                break
            body = bytes(buf[7:4 + n])
            del buf[:4 + n]
            self.on_frame(kind, slot, body)
        self.flush()

    def send(self, kind: int, slot: int, body: bytes = b"") -> None:
        self.out.append(_MHDR.pack(len(body) + 3, kind, slot) + body)

    def flush(self) -> None:
        if self.out:
            assert self.t is not None
            self.t.write(b"".join(self.out))
            self.out.clear()


class _MuxPS(_FloorPS):
    """:class:`_FloorPS` over one connection carrying every worker's frames."""

    def __init__(self, m: int, trigger_reports: list[int], dim: int) -> None:
        super().__init__(m, trigger_reports, dim)
        self.mux: _MuxConn | None = None

    def made(self, conn: _MuxConn) -> None:
        self.mux = conn
        self.all_connected.set()

    def start_round(self) -> None:
        self.r += 1
        self.reports = self.coded = 0
        self.reported.clear()
        if self.r >= len(self.trigger_reports):
            self.done.set_result(None)
            return
        self.t0 = self.loop.time()
        assert self.mux is not None
        for j in range(self.m):
            self.mux.send(START, j, self.model)

    def on_mux_frame(self, kind: int, slot: int, body: bytes) -> None:
        if struct.unpack("!I", body[:4])[0] != self.r:
            return
        assert self.mux is not None
        if kind == REPORT:
            self.reports += 1
            self.reported.add(slot)
            if self.reports == self.trigger_reports[self.r]:
                self.expect = len(self.reported)
                enc = struct.pack("!I", self.r)
                for j in range(self.m):
                    self.mux.send(ENCODE, j, enc)
        elif kind == CODED:
            self.coded += 1
            if self.coded == self.expect:
                self.durations.append(self.loop.time() - self.t0)
                self.start_round()


class _MuxHost:
    """The m workers of :class:`_FloorWorker` behind one connection and one timer: a heap of
    ``(deadline, slot, generation)``; a round start or encode bumps the slot's generation.
    Deadlines are on ``time.monotonic()``, which is uvloop's and asyncio's loop clock line."""

    def __init__(self, m: int, delays: np.ndarray, payload_len: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.delays = delays
        self.coded = bytes(8 * payload_len)
        self.r = [-1] * m
        self.done = [0] * m
        self.gen = [0] * m
        self.due: list[list[float]] = [[] for _ in range(m)]
        self.heap: list[tuple[float, int, int]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.armed = math.inf
        self.conn: _MuxConn | None = None

    def on_frame(self, kind: int, slot: int, body: bytes) -> None:
        self.gen[slot] += 1
        if kind == START:
            self.r[slot] += 1
            self.done[slot] = 0
            self.due[slot] = (time.monotonic()
                              + np.cumsum(self.delays[self.r[slot], slot])).tolist()
            self._push(slot)
        elif kind == ENCODE and self.done[slot]:
            assert self.conn is not None
            self.conn.send(CODED, slot, struct.pack("!I", self.r[slot]) + self.coded)
        self._arm()

    def _push(self, slot: int) -> None:
        due, k = self.due[slot], self.done[slot]
        if k < len(due) and math.isfinite(due[k]):
            heapq.heappush(self.heap, (due[k], slot, self.gen[slot]))

    def _arm(self) -> None:
        heap = self.heap
        if heap and heap[0][0] < self.armed:
            if self.timer is not None:
                self.timer.cancel()
            self.armed = heap[0][0]
            self.timer = self.loop.call_at(self.armed, self._fire)

    def _fire(self) -> None:
        self.timer, self.armed = None, math.inf
        # time.monotonic(), not uvloop's millisecond loop.time(): with the coarse clock a timer
        # set for a deadline fires "before" it and re-arms at once, spinning until the tick
        heap, now = self.heap, time.monotonic()
        assert self.conn is not None
        while heap and heap[0][0] <= now:
            _, slot, gen = heapq.heappop(heap)
            if gen != self.gen[slot]:
                continue  # stale: a round start or encode came since
            self.done[slot] += 1
            self.conn.send(REPORT, slot, struct.pack("!II", self.r[slot], self.done[slot]))
            self._push(slot)
        self.conn.flush()
        self._arm()


async def _run(m: int, delays: np.ndarray, trigger_reports: list[int], dim: int,
               payload_len: int, mux: bool = False) -> list[float]:
    """Round times (seconds) of ``len(trigger_reports)`` rounds; ``mux``: one connection."""
    loop = asyncio.get_running_loop()
    if mux:
        mps = _MuxPS(m, trigger_reports, dim)
        server = await loop.create_server(lambda: _MuxConn(mps.on_mux_frame, mps.made),
                                          "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        host = _MuxHost(m, delays, payload_len)
        _, host.conn = await loop.create_connection(partial(_MuxConn, host.on_frame),
                                                    "127.0.0.1", port)
        await mps.all_connected.wait()
        mps.start_round()
        assert mps.mux is not None
        mps.mux.flush()
        await mps.done
        server.close()
        return mps.durations
    ps = _FloorPS(m, trigger_reports, dim)
    server = await loop.create_server(lambda: _PSConn(ps), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    for j in range(m):
        on_frame = _FloorWorker(j, delays, payload_len).on_frame
        await loop.create_connection(partial(_Conn, on_frame), "127.0.0.1", port)
    await ps.all_connected.wait()
    ps.start_round()
    await ps.done
    server.close()
    return ps.durations


class _PSConn(_Conn):
    def __init__(self, ps: _FloorPS) -> None:
        super().__init__(ps.on_frame)
        self._ps = ps

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._ps.connected(self)


def floor_round_vs_sim(m: int, *, rounds: int = 20, delta: int = 4, delay: str = "exp:0.01",
                       seed: int = 1, dim: int = 50, time_scale: float = 1.0,
                       mux: bool = False) -> dict[str, Any]:
    """The floor's live / simulated mean round time for partial (cyclic, ell = 1); ``mux``:
    every worker's frames over one connection, one timer heap, one write per read or wake."""
    import uvloop

    cfg = RunConfig(workers=m, delta=delta, n_parts=1, delay=delay, rounds=rounds, seed=seed)
    built = build_schemes(cfg, ["partial"])
    schedule = schedule_for(cfg, built)
    sim = simulate_fast(cfg, ["partial"], schedule=schedule, built=built, mse=False)["partial"]
    states = np.asarray(sim.states)
    trigger_reports = [int(s.sum()) for s in states]
    loads = int(np.max(built["partial"].loads))
    delays = np.asarray(schedule.compute_s[:, :, :loads]) * time_scale
    t0 = time.monotonic()
    durations = uvloop.run(_run(m, delays, trigger_reports, dim,
                                built["partial"].payload_len(dim), mux))
    live = statistics.fmean(durations) / time_scale
    simm = float(np.mean(sim.completion_s))
    return {"m": m, "rounds": rounds, "time_scale": time_scale, "mux": mux, "live_mean_s": live,
            "sim_mean_s": simm, "ratio": live / simm, "wall_s": time.monotonic() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mux", action="store_true",
                    help="every worker's frames over one connection (one timer heap, one write "
                         "per read or wake-up) instead of one connection per worker")
    a = ap.parse_args(argv)
    out = floor_round_vs_sim(a.workers, rounds=a.rounds, seed=a.seed, time_scale=a.time_scale,
                             mux=a.mux)
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
