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
import json
import statistics
import struct
import sys
import time
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


async def _run(m: int, delays: np.ndarray, trigger_reports: list[int], dim: int,
               payload_len: int) -> list[float]:
    """Round times (seconds) of ``len(trigger_reports)`` rounds."""
    loop = asyncio.get_running_loop()
    rounds = len(trigger_reports)
    durations: list[float] = []
    state = {"r": -1, "reports": 0, "coded": 0, "t0": 0.0, "expect": 0}
    reported: set[int] = set()  # connections that reported this round (the contributors)
    done = loop.create_future()
    conns: list[_Conn] = []
    model = bytes(8 * dim)

    def start_round() -> None:
        state["r"] += 1
        state["reports"] = state["coded"] = 0
        reported.clear()
        if state["r"] >= rounds:
            done.set_result(None)
            return
        state["t0"] = loop.time()
        for c in conns:
            c.send(START, model)

    def on_ps(conn: _Conn, kind: int, body: bytes) -> None:
        r = int(state["r"])
        if kind == REPORT and struct.unpack("!I", body[:4])[0] == r:
            state["reports"] += 1
            reported.add(id(conn))
            if state["reports"] == trigger_reports[r]:
                state["expect"] = len(reported)
                for c in conns:
                    c.send(ENCODE, struct.pack("!I", r))
        elif kind == CODED and struct.unpack("!I", body[:4])[0] == r:
            state["coded"] += 1
            if state["coded"] == state["expect"]:
                durations.append(loop.time() - state["t0"])
                start_round()

    server = await loop.create_server(lambda: _PSConn(on_ps, conns), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    coded = bytes(8 * payload_len)

    async def worker(j: int) -> None:
        rnd = {"r": -1, "done": 0, "timer": None}

        def on_w(conn: _Conn, kind: int, body: bytes) -> None:
            if kind == START:
                rnd["r"] += 1
                rnd["done"] = 0
                t0 = loop.time()
                due = t0 + np.cumsum(delays[int(rnd["r"]), j])
                schedule_next(conn, due)
            elif kind == ENCODE:
                if rnd["timer"] is not None:
                    rnd["timer"].cancel()  # type: ignore[attr-defined]
                if rnd["done"]:
                    conn.send(CODED, struct.pack("!I", int(rnd["r"])) + coded)

        def schedule_next(conn: _Conn, due: np.ndarray) -> None:
            k = int(rnd["done"])
            if k < len(due) and np.isfinite(due[k]):
                rnd["timer"] = loop.call_at(float(due[k]), finished, conn, due)

        def finished(conn: _Conn, due: np.ndarray) -> None:
            rnd["done"] += 1
            conn.send(REPORT, struct.pack("!II", int(rnd["r"]), int(rnd["done"])))
            schedule_next(conn, due)

        await loop.create_connection(lambda: _Conn(on_w), "127.0.0.1", port)

    await asyncio.gather(*(worker(j) for j in range(m)))
    while len(conns) < m:
        await asyncio.sleep(0.001)
    start_round()
    await done
    server.close()
    return durations


class _PSConn(_Conn):
    def __init__(self, on_frame: Any, conns: list[_Conn]) -> None:
        super().__init__(on_frame)
        self._conns = conns

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._conns.append(self)


def floor_round_vs_sim(m: int, *, rounds: int = 20, delta: int = 4, delay: str = "exp:0.01",
                       seed: int = 1, dim: int = 50, time_scale: float = 1.0) -> dict[str, Any]:
    """The floor's live / simulated mean round time for partial (cyclic, ell = 1)."""
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
                                built["partial"].payload_len(dim)))
    live = statistics.fmean(durations) / time_scale
    simm = float(np.mean(sim.completion_s))
    return {"m": m, "rounds": rounds, "time_scale": time_scale, "live_mean_s": live,
            "sim_mean_s": simm, "ratio": live / simm, "wall_s": time.monotonic() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    out = floor_round_vs_sim(a.workers, rounds=a.rounds, seed=a.seed, time_scale=a.time_scale)
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
