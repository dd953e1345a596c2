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

``--mux``: the same exchange with every worker's frames over one connection (one timer heap,
one write per read or wake-up), the shape of aiogc's default in-process path.

``--mux --work``, the *work floor*: the mux exchange plus exactly the work the protocol needs,
done with aiogc's own primitives, and nothing else:

* every frame tagged on send and verified on receipt (``aiogc.protocol.tags.FrameAuth``, one
  key per worker per direction, implicit sequence numbers; a frame that fails closes the
  connection undelivered);
* the round start carries the PS's current model (float64); before each report the worker
  computes that chunk's real gradient at it (``task.chunk_gradient`` of the run's task, built
  as aiogc builds it for the RunConfig: linreg, 2000 x 50, ``make_task``) and keeps it in a
  (load, d) block in processing order;
* the PS keeps the state from the reports and broadcasts encode (round, state as u16) when the
  scheme's coverage tracker says decodable (aiogc's trigger rule, not the simulator's count);
  each worker the state counts answers with its real coded vector (``encode_trusted``);
* the PS decodes (``decode_trusted``), runs the verify oracle of aiogc's default config
  (``verify`` on: every chunk gradient at the model sent, ``chunk_grads_fn``, and the scaled
  and plain decode errors as ``Aggregator._verify``; ``--no-verify`` leaves it out) and takes
  the SGD step (``task.learning_rate``) that the next round start carries.

Not included (aiogc does them, the protocol's numbers do not need them): the handshake and
configuration exchange, message codecs (msgpack headers), validation of peer input, the
round guard's norm / redundancy / model checks, loss, per-round records and analytics
(oracle timing, coverage, attribution), heartbeats, reconnects, shaping, logs. Checks that the
work is real (outside the per-round work, their CPU reported as ``check_cpu_s`` and left out
of the CPU-per-round measurement): the oracle's decode error is asserted <= 1e-9 every round,
and every 10th round the decode is compared with ``task.full_gradient`` (error <= 1e-9 of
``||sum_i |g_i|||``); tests/test_bench_floor.py checks that a flipped byte, a relabelled slot
or a replayed frame fails the tags.

Measured (2-core shared VM, m=64, delta 4, exp:0.01; bench/RESULTS.md, "work floor"): CPU per
round aiogc 7.9 ms, mux floor 2.7 ms, work floor 4.7 ms (1.8x the mux floor), so aiogc / work
floor 1.7 against aiogc / mux floor 3.3 (``python bench/run.py --quick --only
loop_cpu_vs_floor_m64 loop_cpu_vs_work_floor_m64``, medians of 3); live / simulated round
1.08 (mux floor 1.04; ``python bench/floor.py --mux --work --workers 64``, medians of 3).
``python bench/floor.py --ablate 5`` splits the work floor's CPU (tags, gradients, oracle, the
rest), each left out in turn (ablation only: without gradients nothing is checked).
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
#: a mux host's wake-up this close before a deadline counts as the deadline (uvloop's timers
#: round to the nearest millisecond; aiogc.net.loops.UVLOOP_TICK_BIAS_S, the same tolerance)
EARLY_S = 0.0005
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
        self._send_starts()

    def _send_starts(self) -> None:
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

    def _send_starts(self) -> None:
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
        # time.monotonic(), not uvloop's millisecond loop.time(); and a wake-up up to
        # EARLY_S before a deadline counts as it (uvloop rounds a timer's delay to the nearest
        # millisecond, so it fires up to 0.5 ms early: re-armed for the rest, the rest rounds to
        # 0 and the loop spins to the tick -- ~1.1 ms CPU of the floor's ~2.3 per m=64 round
        # until round 8; aiogc's host scheduler does the same since then)
        heap, now = self.heap, time.monotonic() + EARLY_S
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


# -- the work floor: the mux exchange plus exactly the work the protocol needs -------------
#
# ``--mux --work``: every frame tagged on send and verified on receipt (aiogc's FrameAuth, one
# key per worker per direction), each report preceded by the real chunk gradient at the model
# the round start carried, each reporting worker's real coded vector on encode (the scheme's
# encode_trusted against the broadcast state), and the PS's trigger on decodability (the
# scheme's coverage tracker), decode (decode_trusted), verify oracle (every chunk gradient at
# the model sent, as aiogc's Aggregator with verify on) and gradient step. Nothing else.

_TAG = 16
_U32 = struct.Struct("!I")
_U32X2 = struct.Struct("!II")


def work_keys(m: int, seed: int) -> tuple[list[bytes], list[bytes]]:
    """Per-worker 32-byte keys, PS -> worker and worker -> PS (derived from ``seed``)."""
    import hashlib

    def key(direction: bytes, j: int) -> bytes:
        return hashlib.sha256(b"floor|%s|%d|%d" % (direction, seed, j)).digest()

    return [key(b"down", j) for j in range(m)], [key(b"up", j) for j in range(m)]


class _NullAuth:
    """Ablation only (``skip=("tags",)``): 16 constant bytes in place of a tag, never refused."""

    def __init__(self, key: bytes) -> None:
        self.seq = 0

    def tag_one(self, frame: Any) -> bytes:
        return bytes(_TAG)

    def verify_one(self, frame: Any, tag: Any) -> bool:
        return True


class _AuthMuxConn(_MuxConn):
    """:class:`_MuxConn` whose frames carry an AES-GCM tag (16 bytes after the body) over
    ``length | kind | slot | body``, from the slot's own :class:`FrameAuth` per direction. A
    frame whose tag fails is not delivered: the connection closes (``refused`` counts it)."""

    def __init__(self, on_frame: Any, send_keys: list[bytes], recv_keys: list[bytes],
                 on_made: Any = None, tags: bool = True) -> None:
        from aiogc.protocol.tags import FrameAuth

        super().__init__(on_frame, on_made)
        auth: Any = FrameAuth if tags else _NullAuth
        self.tx = [auth(k) for k in send_keys]
        self.rx = [auth(k) for k in recv_keys]
        self.refused = 0

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while len(buf) >= 7 and not self.refused:
            n, kind, slot = _MHDR.unpack_from(buf)
            end = 4 + n
            if len(buf) < end:
                break
            mv = memoryview(buf)
            ok = slot < len(self.rx) and self.rx[slot].verify_one(mv[:end - _TAG],
                                                                   mv[end - _TAG:end])
            body = bytes(mv[7:end - _TAG])
            mv.release()
            del buf[:end]
            if not ok:
                self.refused += 1
                if self.t is not None:
                    self.t.close()
                break
            self.on_frame(kind, slot, body)
        self.flush()

    def send(self, kind: int, slot: int, body: bytes = b"") -> None:
        frame = _MHDR.pack(len(body) + 3 + _TAG, kind, slot) + body
        self.out.append(frame + self.tx[slot].tag_one(frame))


class _WorkPS(_MuxPS):
    """:class:`_MuxPS` doing the PS's work: the state from the reports, the encode broadcast
    (round and state) once the scheme's coverage tracker says decodable, the coded vectors into
    one (m, p) block, then decode, verify oracle, check and step; the next round start carries
    the new model. ``check_every``: compare the decode with the true full gradient
    (``task.full_gradient``) every that many rounds, outside the per-round work (0: never)."""

    def __init__(self, m: int, rounds: int, scheme: Any, task: Any, *, verify: bool = True,
                 check_every: int = 10) -> None:
        from aiogc.training.tasks import chunk_grads_fn

        super().__init__(m, [0] * rounds, task.dim)
        self.scheme, self.task = scheme, task
        self.w = np.array(task.initial_model(), dtype=np.float64)
        self.model = self.w.tobytes()
        self.lr = float(task.learning_rate)
        self.oracle = chunk_grads_fn(task, np.float64) if verify else None
        self.check_every = check_every
        self.state = [0] * m
        self.tracker: Any = None
        self.rows = np.zeros((m, scheme.payload_len(task.dim)))
        self.rel_errors: list[float] = []
        self.plain_errors: list[float] = []
        self.checked = 0
        self.check_cpu = 0.0

    def start_round(self) -> None:
        self.state = [0] * self.m
        self.tracker = self.scheme.progress_tracker()
        self.expect = -1  # no encode sent yet
        super().start_round()

    def on_mux_frame(self, kind: int, slot: int, body: bytes) -> None:
        if _U32.unpack_from(body)[0] != self.r:
            return
        assert self.mux is not None
        if kind == REPORT:
            count = _U32X2.unpack_from(body)[1]
            old = self.state[slot]
            if self.expect >= 0 or count <= old:
                return
            self.state[slot] = count
            self.tracker.add(slot, old, count)
            if self.tracker.deficit == 0:
                self.expect = sum(1 for c in self.state if c)
                enc = _U32.pack(self.r) + np.asarray(self.state, dtype=">u2").tobytes()
                for j in range(self.m):
                    self.mux.send(ENCODE, j, enc)
        elif kind == CODED and self.state[slot]:
            self.rows[slot] = np.frombuffer(body, dtype=np.float64, offset=4)
            self.coded += 1
            if self.coded == self.expect:
                try:
                    self._step()
                except Exception as exc:  # a failed check ends the run, not just the read
                    self.done.set_exception(exc)
                    return
                self.durations.append(self.loop.time() - self.t0)
                self.start_round()

    def _step(self) -> None:
        c = np.asarray(self.state, dtype=np.int64)
        res = self.scheme.decode_trusted(self.rows, c, self.task.dim)
        grad = np.asarray(res.gradient, dtype=np.float64)
        if self.oracle is not None:  # the PS's verify oracle: every chunk at the model sent
            # as aiogc's Aggregator._verify: error scaled by ||sum_i |g_i||| (and plain)
            G = self.oracle(self.w)
            true = G.sum(axis=0)
            diff = grad - true
            absum = np.abs(G).sum(axis=0)
            err = math.sqrt(diff.dot(diff))
            plain_den, scale_den = math.sqrt(true.dot(true)), math.sqrt(absum.dot(absum))
            self.rel_errors.append(err / scale_den if scale_den > 0 else err)
            self.plain_errors.append(err / plain_den if plain_den > 0 else err)
        if self.check_every and self.r % self.check_every == 0:
            self._check(grad)
        self.w = self.w - self.lr * grad
        self.model = self.w.tobytes()
        self.rows[:] = 0.0

    def _check(self, grad: np.ndarray) -> None:
        """The decode is the true full gradient (the work is real): ``||grad - g|| <= 1e-9
        ||sum_i |g_i|||``, the scale the float64 sums work at (as aiogc's ``rel_error``; near
        the optimum ``g`` itself cancels towards 0). Its CPU is kept in ``check_cpu``."""
        from aiogc.training.tasks import chunk_gradients

        t0 = time.process_time()
        G = chunk_gradients(self.task, np.arange(self.task.n_chunks), self.w)
        full = self.task.full_gradient(self.w)
        absum = np.abs(G).sum(axis=0)
        err = float(np.linalg.norm(grad - full))
        if not err <= 1e-9 * float(np.linalg.norm(absum)):
            raise AssertionError(f"round {self.r}: decoded gradient differs from the full "
                                 f"gradient (error {err:.3g})")
        self.checked += 1
        self.check_cpu += time.process_time() - t0


class _WorkHost(_MuxHost):
    """:class:`_MuxHost` doing the workers' work: the model from the round start, each chunk's
    real gradient (``task.chunk_gradient``, in processing order, kept in a (load, d) block per
    worker) before its report, and on encode the real coded vector against the broadcast state
    (``scheme.encode_trusted``)."""

    def __init__(self, m: int, delays: np.ndarray, scheme: Any, task: Any,
                 grads: bool = True) -> None:
        super().__init__(m, delays, scheme.payload_len(task.dim))
        self.scheme = scheme
        zero = np.zeros(task.dim)
        # ablation only (grads=False): a constant vector in place of each chunk gradient
        self.grad = task.chunk_gradient if grads else (lambda i, w: zero)
        self.orders = [[int(i) for i in o] for o in scheme.orders]
        loads = [len(o) for o in self.orders]
        self.grads = [np.empty((n, task.dim)) for n in loads]
        self.w: list[np.ndarray] = [np.empty(0)] * m

    def on_frame(self, kind: int, slot: int, body: bytes) -> None:
        if kind == START:
            self.w[slot] = np.frombuffer(body, dtype=np.float64)
            super().on_frame(kind, slot, body)
            return
        self.gen[slot] += 1
        k = self.done[slot]
        if kind == ENCODE and k:
            c = np.frombuffer(body, dtype=">u2", offset=4).tolist()
            if c[slot]:  # a worker contributes iff the broadcast state counts its chunks
                v = self.scheme.encode_trusted(slot, c, self.grads[slot][:k])
                assert self.conn is not None
                self.conn.send(CODED, slot, _U32.pack(self.r[slot]) + v.tobytes())
        self._arm()

    def _fire(self) -> None:
        self.timer, self.armed = None, math.inf
        heap, now = self.heap, time.monotonic() + EARLY_S  # as _MuxHost._fire
        assert self.conn is not None
        while heap and heap[0][0] <= now:
            _, slot, gen = heapq.heappop(heap)
            if gen != self.gen[slot]:
                continue
            k = self.done[slot]
            self.grads[slot][k] = self.grad(self.orders[slot][k], self.w[slot])
            self.done[slot] = k + 1
            self.conn.send(REPORT, slot, _U32X2.pack(self.r[slot], k + 1))
            self._push(slot)
        self.conn.flush()
        self._arm()


async def _run_work(m: int, delays: np.ndarray, rounds: int, scheme: Any, task: Any,
                    verify: bool, seed: int, skip: frozenset[str] = frozenset()) -> _WorkPS:
    """The work floor's PS after ``rounds`` rounds (its durations, errors, checks); ``skip``
    (ablation only): leave out ``"tags"`` and/or ``"grads"`` (then no oracle, no checks)."""
    loop = asyncio.get_running_loop()
    down, up = work_keys(m, seed)
    grads, tags = "grads" not in skip, "tags" not in skip
    wps = _WorkPS(m, rounds, scheme, task, verify=verify and grads,
                  check_every=10 if grads else 0)
    server = await loop.create_server(
        lambda: _AuthMuxConn(wps.on_mux_frame, down, up, wps.made, tags), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    host = _WorkHost(m, delays, scheme, task, grads)
    _, host.conn = await loop.create_connection(
        lambda: _AuthMuxConn(host.on_frame, up, down, None, tags), "127.0.0.1", port)
    await _drive_mux(wps, server)
    return wps


async def _drive_mux(ps: Any, server: asyncio.AbstractServer) -> None:
    """Once the host is connected: the first round start, then every round until ``ps.done``."""
    await ps.all_connected.wait()
    ps.start_round()
    assert ps.mux is not None
    ps.mux.flush()
    await ps.done
    server.close()


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
        await _drive_mux(mps, server)
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


_TASKS: dict[tuple[str, int, int], Any] = {}


def _task(cfg: RunConfig, n_chunks: int) -> Any:
    """The run's task as aiogc builds it (``make_task``), built once per process and kept with
    its learning rate: its setup (a multi-threaded eigenvalue solve, whose process time varies
    by tens of ms under load) is not round work, and would swamp a CPU-per-round difference."""
    from aiogc.training.tasks import make_task

    key = (cfg.task, n_chunks, cfg.seed)
    if key not in _TASKS:
        task = make_task(cfg.task, n_chunks, cfg.seed, chunk_sizes=cfg.sizes)
        task.learning_rate  # noqa: B018 -- computed (and cached by the task) here, once
        _TASKS[key] = task
    return _TASKS[key]


def floor_round_vs_sim(m: int, *, rounds: int = 20, delta: int = 4, delay: str = "exp:0.01",
                       seed: int = 1, dim: int = 50, time_scale: float = 1.0,
                       mux: bool = False, work: bool = False,
                       verify: bool = True, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The floor's live / simulated mean round time for partial (cyclic, ell = 1); ``mux``:
    every worker's frames over one connection, one timer heap, one write per read or wake;
    ``work`` (implies ``mux``): the work floor (tags, gradients, encode, decode, step and,
    with ``verify``, the PS's oracle); ``skip`` (ablation only): ``"tags"``, ``"grads"``."""
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
    extra: dict[str, Any] = {}
    if work:
        scheme = built["partial"]
        task = _task(cfg, scheme.n_chunks)
        wps = uvloop.run(_run_work(m, delays, rounds, scheme, task, verify, seed,
                                   frozenset(skip)))
        durations = wps.durations
        if wps.rel_errors and not max(wps.rel_errors) <= 1e-9:
            raise AssertionError(f"the work floor's oracle saw a decode error of "
                                 f"{max(wps.rel_errors):.3g}")
        extra = {"work": True, "verify": wps.oracle is not None, "skip": list(skip),
                 "checked_rounds": wps.checked,
                 "check_cpu_s": wps.check_cpu,
                 "max_rel_error": max(wps.rel_errors, default=math.nan),
                 "final_loss": float(task.loss(wps.w))}
    else:
        durations = uvloop.run(_run(m, delays, trigger_reports, dim,
                                    built["partial"].payload_len(dim), mux))
    live = statistics.fmean(durations) / time_scale
    simm = float(np.mean(sim.completion_s))
    return {"m": m, "rounds": rounds, "time_scale": time_scale, "mux": mux or work,
            "live_mean_s": live, "sim_mean_s": simm, "ratio": live / simm,
            "wall_s": time.monotonic() - t0, **extra}


#: the ablation's variants: (name, work, verify, skip); "mux" is the mux floor itself
ABLATION: tuple[tuple[str, bool, bool, tuple[str, ...]], ...] = (
    ("mux", False, False, ()), ("work", True, True, ()), ("-oracle", True, False, ()),
    ("-oracle-tags", True, False, ("tags",)), ("-oracle-grads", True, False, ("grads",)),
    ("-oracle-tags-grads", True, False, ("tags", "grads")))


def ablation(m: int, trials: int, short: int = 6, long: int = 30) -> dict[str, Any]:
    """CPU per round of the mux floor and the work floor without some of its work (tags
    replaced by 16 constant bytes, chunk gradients by a constant vector): medians of
    ``trials`` interleaved measurements, each the difference of a ``long`` and a ``short``
    run after a warm-up (bench_fidelity's method)."""
    from bench_fidelity import _cpu_per_round

    runs: dict[str, list[float]] = {name: [] for name, *_ in ABLATION}
    for _ in range(trials):
        for name, work, verify, skip in ABLATION:
            def fn(n: int, work: bool = work, verify: bool = verify,
                   skip: tuple[str, ...] = skip) -> dict[str, Any]:
                return floor_round_vs_sim(m, rounds=n, mux=True, work=work, verify=verify,
                                          skip=skip)
            runs[name].append(_cpu_per_round(fn, short, long))
    return {"m": m, "rounds": (short, long), "trials": trials,
            "cpu_ms_per_round": {k: 1e3 * statistics.median(v) for k, v in runs.items()},
            "runs_ms": {k: [round(1e3 * x, 3) for x in v] for k, v in runs.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mux", action="store_true",
                    help="every worker's frames over one connection (one timer heap, one write "
                         "per read or wake-up) instead of one connection per worker")
    ap.add_argument("--work", action="store_true",
                    help="the work floor (with --mux): per-worker frame tags, real chunk "
                         "gradients, coded vectors, decode, step and the PS's verify oracle")
    ap.add_argument("--no-verify", action="store_true",
                    help="with --work: leave out the PS's verify oracle")
    ap.add_argument("--ablate", type=int, metavar="TRIALS", default=0,
                    help="print the CPU per round of the mux floor and the work floor without "
                         "its oracle, tags and/or gradients (medians of TRIALS interleaved)")
    a = ap.parse_args(argv)
    if a.ablate:
        json.dump(ablation(a.workers, a.ablate), sys.stdout, indent=1)
        print()
        return 0
    if a.work and not a.mux:
        ap.error("--work is a variant of the mux floor: give --mux --work")
    out = floor_round_vs_sim(a.workers, rounds=a.rounds, seed=a.seed, time_scale=a.time_scale,
                             mux=a.mux, work=a.work, verify=not a.no_verify)
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
