"""One connection per worker host (docs/protocol.md §2.6), on loopback, port 0.

A host's workers keep their own handshakes, keys and tags; the host only multiplexes. These
tests run whole rounds through a :class:`HostClient`, drop a host mid-run, rejoin a worker,
and send what a host must not: frames for a slot outside its block, a hello naming another
worker, a wrong key, a malformed preamble. No timing assertion anywhere: every wait is on an
event, under the hang guard of test_net's runner.
"""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any

import numpy as np
import pytest

from aiogc.core import PeerClosed, Worker, WorkerJoined
from aiogc.errors import MalformedFrame
from aiogc.net.drivers import ClientOptions, PSServer
from aiogc.net.hostclient import HostClient, HostScheduler
from aiogc.protocol.auth import derive_worker_key
from aiogc.protocol.hostmux import (
    CLOSE,
    HOST_SLOT,
    OPEN,
    Control,
    MuxFrameDecoder,
    Preamble,
    encode_control,
    encode_preamble,
    slot_prefix,
)
from aiogc.protocol.messages import PROTOCOL_VERSION, Error, Hello
from aiogc.protocol.wire import encode_frame_bytes
from tests.netkit import (
    FAST_BACKOFF,
    GUARD_S,
    HOST,
    STEP_S,
    EventLog,
    Runner,
    cfg,
    loop_factories,
    make_ps,
    make_runner,
    read_until_closed,
    spaced_schedule,
    start_cluster,
)

SECRET = b"host-link-secret"


@pytest.fixture(params=loop_factories())
def run(request: pytest.FixtureRequest) -> Runner:
    return make_runner(request.param)


def _host(ids: range, port: int, *, secret: bytes | None = SECRET,
          keys: dict[int, bytes] | None = None, give_up_after_s: float = 10.0,
          logs: list[EventLog] | None = None) -> HostClient:
    workers = [Worker(j, worker_key=(keys or {}).get(j, derive_worker_key(secret, j)
                                                    if secret is not None else None))
               for j in ids]
    sinks = [EventLog() for _ in ids]
    if logs is not None:
        logs.extend(sinks)
    return HostClient(workers, HOST, port, on_events=sinks, give_up_after_s=give_up_after_s,
                      options=ClientOptions(backoff_s=FAST_BACKOFF))


async def _serve(ps: Any) -> tuple[PSServer, EventLog, asyncio.Task[None]]:
    log = EventLog()
    server = PSServer(ps, host=HOST, port=0, on_event=log)
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(STEP_S):
        await server.started.wait()
    return server, log, task


def _summary(records: list[Any]) -> list[tuple[Any, ...]]:
    return [(r.round, r.status, r.state, r.end_reason) for r in records]


def test_hosts_run_the_same_rounds_as_per_worker_connections(run: Runner) -> None:
    """Two hosts (blocks 0-2 and 3-5) over one connection each: every round exact, with the
    same trigger states and decoded gradients as the same run over six worker connections."""
    config = cfg(rounds=4)
    schedule = spaced_schedule(config, gap_s=0.02)

    async def hosted() -> tuple[list[Any], list[HostClient], int]:
        ps = make_ps(config, schedule=schedule, secret=SECRET)
        server, log, task = await _serve(ps)
        hosts = [_host(range(0, 3), server.port), _host(range(3, 6), server.port)]
        results = await asyncio.gather(task, *(h.run() for h in hosts))
        assert results[1:] == [[None] * 3, [None] * 3]
        return ps.records, hosts, len(log.of(WorkerJoined))

    records, hosts, joined = run(hosted)
    assert [r.round for r in records] == list(range(4))
    assert all(r.status == "exact" and r.rel_error < 1e-9 for r in records)
    assert joined == 6  # every worker its own session, none lost
    assert all(h.connections == 1 for h in hosts)
    # everything due at one wake-up left in one write: never more writes than wake-ups + reads
    assert all(h.sched is not None and h.sched.fired >= h.sched.wakes for h in hosts)

    async def reference() -> list[Any]:
        ps = make_ps(config, schedule=schedule, secret=SECRET)
        cl = await start_cluster(ps, secret=SECRET)
        return await cl.finish()

    ref = run(reference)
    assert _summary(records) == _summary(ref)
    for a, b in zip(records, ref, strict=True):
        assert a.gradient is not None and b.gradient is not None
        np.testing.assert_allclose(a.gradient, b.gradient, rtol=0, atol=1e-12)


def test_the_drivers_read_the_clock_they_are_given(run: Runner) -> None:
    """PSServer and HostClient take their clock as a constructor argument (no module global,
    no monkeypatching): with one 10^9 s ahead of ``time.monotonic``, every ``now`` the cores
    are fed and every timer is on that line (the chunk deadlines fire, the rounds end), and
    the rounds are the ones the default clock runs."""
    config = cfg(rounds=3)
    schedule = spaced_schedule(config, gap_s=0.02)
    ahead = 1e9

    def fake() -> float:
        return time.monotonic() + ahead

    async def scenario() -> tuple[list[Any], EventLog, list[EventLog]]:
        ps = make_ps(config, schedule=schedule, secret=SECRET)
        log = EventLog()
        server = PSServer(ps, host=HOST, port=0, on_event=log, clock=fake)
        task = asyncio.create_task(server.serve())
        async with asyncio.timeout(STEP_S):
            await server.started.wait()
        sinks = [EventLog() for _ in range(config.workers)]
        workers = [Worker(j, worker_key=derive_worker_key(SECRET, j))
                   for j in range(config.workers)]
        host = HostClient(workers, HOST, server.port, on_events=sinks, give_up_after_s=10.0,
                          options=ClientOptions(backoff_s=FAST_BACKOFF, clock=fake))
        await asyncio.gather(task, host.run())
        return ps.records, log, sinks

    records, log, sinks = run(scenario)
    assert [(r.round, r.status) for r in records] == [(0, "exact"), (1, "exact"), (2, "exact")]
    assert all(ahead <= r.t_start <= r.t_end for r in records)
    timed = [e for e in log.events if hasattr(e, "time")]
    timed += [e for s in sinks for e in s.events if hasattr(e, "time")]
    assert timed and all(e.time >= ahead for e in timed)

    async def reference() -> list[Any]:
        ps = make_ps(config, schedule=schedule, secret=SECRET)
        server, _, task = await _serve(ps)
        await asyncio.gather(task, _host(range(config.workers), server.port).run())
        return ps.records

    assert _summary(records) == _summary(run(reference))


def test_a_dropped_host_loses_its_workers_and_rejoins(run: Runner) -> None:
    """The host connection is cut mid-run: its three workers count as lost (the PS keeps
    running with the other host), the host reconnects and reopens every session, and the run
    ends with every round done."""
    config = cfg(rounds=6, dead_after_s=30.0)
    schedule = spaced_schedule(config, gap_s=0.01)

    async def scenario() -> tuple[list[Any], HostClient, EventLog]:
        ps = make_ps(config, schedule=schedule, secret=SECRET)
        server, log, task = await _serve(ps)
        victim = _host(range(3, 6), server.port)
        hosts = [_host(range(0, 3), server.port), victim]
        runs = [asyncio.create_task(h.run()) for h in hosts]
        async with asyncio.timeout(STEP_S):
            await log.wait_for(lambda: log.rounds_completed() >= 2)
        assert victim.conn is not None
        victim.conn.abort()  # the host connection drops
        async with asyncio.timeout(GUARD_S):
            await task
            results = await asyncio.gather(*runs)
        assert results == [[None] * 3, [None] * 3]
        return ps.records, victim, log

    records, victim, log = run(scenario)
    assert victim.connections == 2
    # three of six workers lost at once exceed what δ=3 tolerates: the round running then
    # fails (docs/protocol.md §7.1); the run goes on, and the last round is exact again
    assert [r.round for r in records] == list(range(6))
    assert records[-1].status == "exact"
    joined = [e.worker for e in log.of(WorkerJoined)]
    assert sorted(joined.count(j) for j in range(3, 6)) == [2, 2, 2]  # each rejoined once


def test_a_worker_rejoins_its_slot_after_the_ps_closed_it(run: Runner) -> None:
    """The PS ends one worker's session (a newer connection authenticated as it): the slot
    closes with CLOSE both ways, the worker reopens it on the same host connection after its
    backoff and is welcomed again; the run completes."""
    config = cfg(rounds=5, dead_after_s=30.0)
    schedule = spaced_schedule(config, gap_s=0.01)

    async def scenario() -> tuple[list[Any], HostClient, EventLog]:
        ps = make_ps(config, schedule=schedule, secret=SECRET)
        server, log, task = await _serve(ps)
        host = _host(range(0, 6), server.port)
        running = asyncio.create_task(host.run())
        async with asyncio.timeout(STEP_S):
            await log.wait_for(lambda: log.rounds_completed() >= 1)
        ep = host.slots[4].ep
        assert ep is not None
        ep.close()  # the worker ends its own session: CLOSE; the PS answers CLOSE
        async with asyncio.timeout(GUARD_S):
            await log.wait_for(lambda: [e.worker for e in log.of(WorkerJoined)].count(4) == 2)
            await task
            assert await running == [None] * 6
        return ps.records, host, log

    records, host, _ = run(scenario)
    assert host.connections == 1  # the host connection itself never dropped
    assert host.slots[4].client.connections == 2
    assert [r.round for r in records] == list(range(5))


# ------------------------------------------------------------------ what a host must not send


async def _raw_host(port: int, data: bytes) -> tuple[bytes, bytes]:
    """Send ``data`` on a fresh connection; return (everything the PS sent, until it closed)
    split at the accept-time challenge: (challenge frame, the rest)."""
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(data)
    await writer.drain()
    got = await _read_all(reader)
    writer.close()
    (h,) = struct.unpack_from(">I", got, 0)
    return got[:4 + h], got[4 + h:]


async def _read_all(reader: asyncio.StreamReader) -> bytes:
    return await read_until_closed(reader)


def _records(stream: bytes) -> list[tuple[int | None, Any]]:
    """Decode a PS->host stream after the challenge: [(slot, message or control)]."""
    out: list[tuple[int | None, Any]] = []

    def select(dec: MuxFrameDecoder, slot: int) -> None:
        dec.auth = None  # only untagged frames in these tests (challenges, errors)

    dec = MuxFrameDecoder(select, plain_first=True)
    for msg in dec.feed(stream):
        out.append((None if isinstance(msg, Preamble | Control) else dec.slot, msg))
    return out


def _hostile(run: Runner, payload: Any, *, m: int = 6) -> tuple[list[Any], EventLog]:
    """Serve a PS (with honest workers elsewhere: none needed) and let one hostile host talk."""
    config = cfg(workers=m)

    async def scenario() -> tuple[list[Any], EventLog]:
        ps = make_ps(config, secret=SECRET)
        server, log, task = await _serve(ps)
        async with asyncio.timeout(STEP_S):
            data = await payload(server.port) if callable(payload) else payload
            _, rest = await _raw_host(server.port, data)
        server.stop("test over")
        await task
        return _records(rest), log

    out: tuple[list[Any], EventLog] = run(scenario)
    return out


def _error_of(records: list[Any]) -> Error:
    errs = [m for _, m in records if isinstance(m, Error)]
    assert errs, records
    return errs[-1]


@pytest.mark.parametrize(("data", "code"), [
    (encode_preamble(0, 4, 5), "bad_block"),  # ids 4..8 of a 6-worker run
    (b"AGCH" + bytes([PROTOCOL_VERSION - 1, 0]) + struct.pack(">IH", 0, 2), "bad_version"),
    (b"AGCH" + bytes([PROTOCOL_VERSION, 7]) + struct.pack(">IH", 0, 2), "bad_preamble"),
    (b"AGCH" + bytes([PROTOCOL_VERSION, 0]) + struct.pack(">IH", 0, 0), "bad_preamble"),
    (encode_preamble(1, 0, 2), "bad_preamble"),  # the PS's role
])
def test_malformed_preamble_is_refused_with_a_reason(run: Runner, data: bytes,
                                                     code: str) -> None:
    records, _ = _hostile(run, data)
    assert _error_of(records).code == code


@pytest.mark.parametrize(("records_after", "code"), [
    (encode_control(OPEN, 2), "bad_slot"),  # outside the 2-slot block
    (slot_prefix(1) + encode_frame_bytes(Error(code="x", reason="y")), "slot_closed"),
    (encode_control(OPEN, 0) + encode_control(OPEN, 0), "slot_busy"),
    (encode_control(CLOSE, 1), "slot_closed"),
    (encode_control(9, 0), "bad_control"),
])
def test_a_host_speaking_outside_its_block_is_closed(run: Runner, records_after: bytes,
                                                      code: str) -> None:
    records, _ = _hostile(run, encode_preamble(0, 0, 2) + records_after)
    assert records[0][1] == Preamble(1, 0, 2)  # accepted first
    err = _error_of(records)
    assert err.code == code
    slot_of_error = [s for s, m in records if m is err]
    assert slot_of_error == [HOST_SLOT]


def test_a_hello_for_another_worker_closes_the_host(run: Runner) -> None:
    """Slot 0 of block 2..3 is worker 2: a hello naming worker 5 (even with 5's valid MAC)
    closes the host connection with slot_mismatch before the PS core sees it."""

    async def payload(port: int) -> bytes:
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.write(encode_preamble(0, 2, 2) + encode_control(OPEN, 0))
        await writer.drain()
        dec = MuxFrameDecoder(lambda d, s: None, plain_first=True)
        challenge: Any = None
        while challenge is None:
            chunk = await reader.read(65536)
            assert chunk
            for msg in dec.feed(chunk):
                if dec.slot == 0 and getattr(msg, "kind", "") == "challenge":
                    challenge = msg
        from aiogc.protocol.auth import hello_mac

        key = derive_worker_key(SECRET, 5)
        nonce = b"n" * 16
        hello = Hello(worker=5, epoch=challenge.epoch, nonce=nonce,
                      mac=hello_mac(key, challenge.nonce, nonce, 5, challenge.epoch))
        writer.write(slot_prefix(0) + encode_frame_bytes(hello))
        await writer.drain()
        rest = await read_until_closed(reader)
        writer.close()
        return rest

    config = cfg()

    async def scenario() -> tuple[bytes, EventLog]:
        ps = make_ps(config, secret=SECRET)
        server, log, task = await _serve(ps)
        async with asyncio.timeout(STEP_S):
            rest = await payload(server.port)
        server.stop("test over")
        await task
        return rest, log

    rest, log = run(scenario)
    # the rest of the stream: the remaining records end with the host-slot error
    assert rest.endswith(encode_frame_bytes(Error(code="slot_mismatch",
                                                  reason="slot 0 carries worker 2, not 5")))
    assert not log.of(WorkerJoined)


def test_a_wrong_key_in_a_host_fails_only_that_worker(run: Runner) -> None:
    """Worker 1's key in the host is wrong: its sessions are refused (auth_failed) and it ends
    with ConnectionError once the PS is gone (no authenticated session for give_up_after_s);
    workers 0 and 2 on the same connection are welcomed and shut down cleanly."""
    config = cfg(workers=3, delta=1, rounds=1, join_timeout_s=60.0)

    async def scenario() -> tuple[list[Any], EventLog]:
        ps = make_ps(config, secret=SECRET)
        server, log, task = await _serve(ps)
        host = _host(range(0, 3), server.port, keys={1: b"\x00" * 32}, give_up_after_s=0.3)
        running = asyncio.create_task(host.run())
        async with asyncio.timeout(GUARD_S):
            await log.wait_for(lambda: len(log.of(WorkerJoined)) >= 2
                               and any(e.code == "auth_failed" for e in log.of(PeerClosed)))
        server.stop("test over")  # 0 and 2 are told to shut down; 1 is still refused
        await task
        results = await running
        return results, log

    results, log = run(scenario)
    assert isinstance(results[1], ConnectionError) and "auth_failed" in str(results[1])
    assert results[0] is None and results[2] is None
    assert sorted(e.worker for e in log.of(WorkerJoined)) == [0, 2]


def test_the_scheduler_wakes_once_for_everything_due() -> None:
    """Deadlines due together are handed over in one call; stale entries are skipped."""

    async def main() -> list[list[int]]:
        woke: list[list[int]] = []
        done = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_wake(due: list[int]) -> None:
            woke.append(sorted(due))
            if len(woke) == 2:
                done.set()

        s = HostScheduler(loop, 4, on_wake)
        from aiogc.net.loops import MONOTONIC

        t = MONOTONIC()
        s.arm(0, t + 0.01)
        s.arm(1, t + 0.01)
        s.arm(2, t + 0.5)
        s.arm(2, t + 0.01)  # moved earlier: the 0.5 entry is stale
        s.arm(3, t + 0.02)
        s.arm(3, None)  # withdrawn
        s.arm(3, t + 0.03)
        await asyncio.wait_for(done.wait(), GUARD_S)
        s.cancel()
        return woke

    woke = asyncio.run(main())
    assert woke[0] == [0, 1, 2]
    assert woke[1] == [3]


def test_mux_decoder_delivers_records_in_order() -> None:
    """Preamble, control records and slot frames parse from any split of the stream."""
    frames = encode_preamble(1, 7, 3) + encode_control(CLOSE, 2) + slot_prefix(1) \
        + encode_frame_bytes(Error(code="a", reason="b")) + encode_control(CLOSE, 0)
    seen: list[int] = []

    def select(dec: MuxFrameDecoder, slot: int) -> None:
        seen.append(slot)
        dec.auth = None

    for step in (1, 2, 5, len(frames)):
        seen.clear()
        dec = MuxFrameDecoder(select)
        out: list[Any] = []
        for i in range(0, len(frames), step):
            out.extend(dec.feed(frames[i:i + step]))
        assert out[0] == Preamble(1, 7, 3)
        assert out[1] == Control(CLOSE, 2)
        assert isinstance(out[2], Error) and out[2].code == "a"
        assert out[3] == Control(CLOSE, 0)
        assert seen == [1]
    with pytest.raises(MalformedFrame) as err:
        MuxFrameDecoder(select).feed(b"XXXX" + b"\x00" * 8)
    assert err.value.code == "bad_preamble"


def test_a_hosts_workers_see_the_frames_of_one_read_when_the_read_arrived() -> None:
    """The frames of one read reach their workers as of the read's arrival, not as of the
    moment the host's one loop gets to each (a worker's round clock must not start later for
    being the 64th frame of the batch); the next read has its own arrival time."""
    from aiogc.net import hostclient

    clock = [100.0]
    workers = [Worker(i, worker_key=derive_worker_key(b"s" * 32, i)) for i in range(3)]
    hc = HostClient(workers, "127.0.0.1", 1, options=ClientOptions(clock=lambda: clock[0]))
    seen: list[tuple[int, float | None]] = []

    class _Client:
        def __init__(self, i: int) -> None:
            self.i = i

        def _on_message(self, ep: Any, msg: Any, now: float | None = None) -> None:
            seen.append((self.i, now))
            clock[0] += 0.001  # handling a frame takes the loop a millisecond

    dec = MuxFrameDecoder(lambda d, s: None)

    class _Conn:
        decoder = dec

    conn: Any = _Conn()
    hc.conn = conn
    for i, st in enumerate(hc.slots):
        st.client = _Client(i)  # type: ignore[assignment]
        st.state = hostclient._State.OPEN
        st.ep = object()  # type: ignore[assignment]
    msg = Error(code="x", reason="y")
    for slot in (0, 1, 2):  # one read of three frames
        dec.slot = slot
        hc._on_message(conn, msg)
    hc._end_batch()
    clock[0] = 200.0
    dec.slot = 1  # the next read
    hc._on_message(conn, msg)
    assert seen == [(0, 100.0), (1, 100.0), (2, 100.0), (1, 200.0)]
