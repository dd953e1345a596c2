"""The PS and workers over loopback TCP (port 0), under the default loop and uvloop.

The same scenarios as ``test_core`` (virtual clock), here through the real asyncio drivers
(:class:`~aiogc.net.drivers.PSServer`, :class:`~aiogc.net.drivers.WorkerClient`): every scheme
trains R rounds exactly; authentication; garbage peers while honest workers train; float32
payloads. Connection-level garbage against a bare :class:`FramedConnection` is covered in
``test_framing``; here the garbage hits a *running PS* and the honest rounds are checked.

Rules: no fixed ports, no sleeps for synchronisation (waits are on core events), no
wall-clock assertions (``asyncio.timeout`` only guards against hangs), deterministic seeds, and
a test fails when its event loop logged an unhandled exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
from typing import Any

import numpy as np
import pytest

from aiogc.config import RunConfig
from aiogc.core import (
    Finished,
    PeerClosed,
    PSPhase,
    RoundCompleted,
    RoundRecord,
    Worker,
    WorkerJoined,
)
from aiogc.core.ps import MAX_PENDING_CONNECTIONS, pending_cap
from aiogc.errors import ConfigError
from aiogc.net.drivers import ClientOptions, PSServer, WorkerClient
from aiogc.net.framing import FramedConnection
from aiogc.protocol.headers import DEFAULT_LIMITS
from aiogc.protocol.messages import ChunkReport, Error, Hello, Ping, Shutdown
from aiogc.protocol.wire import FrameDecoder, encode_frame_bytes
from tests.helpers import build_rig
from tests.netkit import (
    FAST_BACKOFF,
    GUARD_S,
    HOST,
    STEP_S,
    Cluster,
    EventLog,
    Runner,
    assert_exact_rounds,
    cfg,
    loop_factories,
    make_ps,
    make_runner,
    read_until_closed,
    spaced_schedule,
    start_cluster,
)


@pytest.fixture(params=loop_factories())
def run(request: pytest.FixtureRequest) -> Runner:
    return make_runner(request.param)



SCHEMES = [
    pytest.param(dict(scheme="partial", n_parts=1), id="partial-l1"),
    pytest.param(dict(scheme="partial", n_parts=2), id="partial-l2"),
    pytest.param(dict(scheme="original", n_parts=1), id="original-l1"),
    pytest.param(dict(scheme="original", n_parts=2, delta=3), id="original-l2-d3"),
    pytest.param(dict(scheme="uncoded", delta=1), id="uncoded"),
    pytest.param(dict(scheme="ignore-stragglers", k=4), id="ignore-stragglers"),
    pytest.param(dict(scheme="stream-chunks"), id="stream-chunks"),
]


@pytest.mark.parametrize("kw", SCHEMES)
def test_scheme_trains_over_loopback(run: Runner, kw: dict[str, Any]) -> None:
    config = cfg(**kw)

    async def scenario() -> tuple[list[RoundRecord], Cluster]:
        cl = await start_cluster(make_ps(config))
        async with asyncio.timeout(GUARD_S):
            return await cl.finish(), cl

    records, cl = run(scenario)
    assert cl.ps.phase is PSPhase.FINISHED
    fin = cl.log.of(Finished)
    assert len(fin) == 1 and fin[0].reason == "all rounds done"
    assert all(t.done() and t.result() is None for t in cl.client_tasks)
    assert [r.round for r in records] == [0, 1, 2]
    if config.scheme == "ignore-stragglers":
        # k = 4 of 6 finished workers: an approximation, with a bounded, recorded error
        for rec in records:
            assert rec.status in ("approximate", "exact")
            assert np.isfinite(rec.rel_error) and np.isfinite(rec.loss)
            assert sum(1 for c in rec.state if c > 0) >= config.effective_k
    else:
        assert_exact_rounds(records, 3, tol=1e-9)
    # nobody was dropped or closed for a protocol reason in a clean run
    stats = dict(cl.ps.stats)
    assert stats.get("joined") == config.workers
    assert not any(k.startswith("closed_") for k in stats), stats
    assert not cl.log.of(PeerClosed)


def test_float32_payloads(run: Runner) -> None:
    config = cfg(scheme="partial", n_parts=2, dtype="float32")

    async def scenario() -> list[RoundRecord]:
        async with asyncio.timeout(GUARD_S):
            return await (await start_cluster(make_ps(config))).finish()

    records = run(scenario)
    assert_exact_rounds(records, 3, tol=1e-5)
    # float32 rounding is visible (the payload really was float32) but within the goal
    assert max(r.rel_error for r in records) > 1e-12


# ------------------------------------------------------------------ authentication


def test_auth_wrong_secret_rejected_while_honest_workers_train(run: Runner) -> None:
    secret = b"right-secret-0123456789abcdef-xx"
    # const delays: rounds last long enough for the impostor to arrive mid-run
    config = cfg(workers=4, delta=2, rounds=10, delay="const:0.02")

    async def scenario() -> tuple[Cluster, BaseException | None]:
        cl = await start_cluster(make_ps(config, secret=secret), secret=secret)
        async with asyncio.timeout(STEP_S):
            await cl.log.wait_for(lambda: cl.log.rounds_completed() >= 1)
        # an impostor claiming an honest worker's id, with the wrong secret
        # a pre-auth error(auth_failed) is unauthenticated (a squatter can send it),
        # so the impostor retries until its own give-up limit, then names the reason
        impostor = WorkerClient(Worker(1, secret=b"wrong-secret-0123456789abcdef-xx"), HOST,
                                cl.server.port, options=ClientOptions(backoff_s=FAST_BACKOFF),
                                give_up_after_s=0.3)
        outcome: BaseException | None = None
        try:
            async with asyncio.timeout(STEP_S):
                await impostor.run()
        except ConnectionError as exc:  # gave up after retrying; auth_failed is named
            outcome = exc
        async with asyncio.timeout(GUARD_S):
            await cl.finish()
        return cl, outcome

    cl, outcome = run(scenario)
    assert outcome is not None and "auth_failed" in str(outcome)
    assert dict(cl.ps.stats).get("closed_auth_failed", 0) >= 1
    closed = cl.log.of(PeerClosed)
    assert {e.code for e in closed} == {"auth_failed"}
    # ... while the run was going on: rounds completed after the rejection
    at = cl.log.events.index(closed[0])
    assert any(isinstance(e, RoundCompleted) for e in cl.log.events[at:])
    # the honest worker 1 was not replaced: no round lost anyone
    assert_exact_rounds(cl.ps.records, config.rounds, tol=1e-9)
    assert all(not r.dropped for r in cl.ps.records)


def test_auth_secret_everywhere_trains(run: Runner) -> None:
    secret = os.urandom(32)
    config = cfg(scheme="partial", n_parts=2)

    async def scenario() -> list[RoundRecord]:
        cl = await start_cluster(make_ps(config, secret=secret), secret=secret)
        async with asyncio.timeout(GUARD_S):
            return await cl.finish()

    assert_exact_rounds(run(scenario), 3, tol=1e-9)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1", "example.invalid"])
def test_non_loopback_bind_without_secret_refused(host: str) -> None:
    ps = make_ps(cfg())
    with pytest.raises(ConfigError, match="secret"):
        PSServer(ps, host=host, port=0)
    # with a secret the same address is accepted (nothing is bound until serve())
    PSServer(make_ps(cfg(), secret=b"k" * 32), host=host, port=0)
    # loopback needs none
    PSServer(ps, host="127.0.0.1", port=0)
    PSServer(ps, host="::1", port=0)
    PSServer(ps, host="localhost", port=0)


# ------------------------------------------------------------------ garbage peers while training


def _garbage_blobs(config: RunConfig) -> dict[str, bytes]:
    rng = np.random.default_rng(1234)
    return {
        "http": b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: curl/8\r\n\r\n",
        "tls_client_hello": bytes.fromhex("16030100a5010000a10303") + rng.bytes(160),
        "random": rng.bytes(4096),
        "hello_id_out_of_range": encode_frame_bytes(
            Hello(worker=config.workers + 7, nonce=b"n" * 16, mac=b"", epoch=0)),
        "oversized_prefix": b"\xff\xff\xff\xff" + rng.bytes(64),
        "over_preauth_cap": (100_000).to_bytes(4, "big") + rng.bytes(1000),
        "zero_length_header": b"\x00\x00\x00\x00",
        "report_before_auth": encode_frame_bytes(
            ChunkReport(epoch=0, round=0, count=1, t_worker=0.0, elapsed_s=0.0)),
        "truncated_hello_then_eof": encode_frame_bytes(
            Hello(worker=0, nonce=b"n" * 16, mac=b"", epoch=0))[:-5],
    }


async def _bad_peer(port: int, payload: bytes, *, eof_after: bool) -> bytes:
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(payload)
        if eof_after:
            writer.write_eof()
        await writer.drain()
    except ConnectionResetError:
        pass
    try:
        async with asyncio.timeout(5.0):  # auth deadline (2 s) + slack: the PS must close us
            return await read_until_closed(reader)
    finally:
        writer.close()


def test_garbage_peers_do_not_disturb_training(run: Runner) -> None:
    """Bad connections while 4 honest workers train: each is closed, with a typed reason
    counted by the PS; the honest rounds are exact and identical (trigger states and losses)
    to a clean run with the same seed, served at the same time by a second PS."""
    # ~3.6 s of training: the slowloris must be closed by the 2 s auth deadline mid-run,
    # not by the shutdown
    config = cfg(workers=4, delta=2, n_parts=1, rounds=10)
    # completions 80 ms apart: each round's trigger state is fixed by the schedule (unless
    # the machine stalls the loop for that long)
    schedule = spaced_schedule(config, gap_s=0.08)
    blobs = _garbage_blobs(config)

    async def scenario() -> tuple[Cluster, Cluster, dict[str, bytes], bool]:
        clean = await start_cluster(make_ps(config, schedule=schedule))
        dirty = await start_cluster(make_ps(config, schedule=schedule))
        async with asyncio.timeout(STEP_S):
            await dirty.log.wait_for(lambda: dirty.log.rounds_completed() >= 1)
        port = dirty.server.port
        names = list(blobs)
        coros = [_bad_peer(port, blobs[n], eof_after=n.endswith("then_eof")) for n in names]
        # slowloris: one byte of a length prefix, then nothing (closed by the auth deadline)
        names.append("slowloris")
        coros.append(_bad_peer(port, b"\x00", eof_after=False))
        # a peer that connects and says nothing at all
        names.append("silent")
        coros.append(_bad_peer(port, b"", eof_after=False))
        got = await asyncio.gather(*coros)
        during_training = dirty.ps.phase is not PSPhase.FINISHED
        async with asyncio.timeout(GUARD_S):
            await clean.finish()
        async with asyncio.timeout(GUARD_S):
            await dirty.finish()
        return clean, dirty, dict(zip(names, got, strict=True)), during_training

    clean, dirty, got, during_training = run(scenario)
    # every bad connection was closed by the PS while the honest rounds were still running
    assert during_training
    assert set(got) == set(blobs) | {"slowloris", "silent"}
    # the offenders whose bytes the PS consumed were told why (best effort for the others:
    # closing with their bytes unread may reset the connection before the Error frame is read)
    for name, code in [("hello_id_out_of_range", "bad_worker_id"),
                       ("report_before_auth", "unexpected_kind"),
                       ("slowloris", "auth_timeout"), ("silent", "auth_timeout")]:
        msgs = FrameDecoder(DEFAULT_LIMITS).feed(got[name])
        assert [m.kind for m in msgs] == ["challenge", "error"], (name, msgs)
        assert isinstance(msgs[1], Error) and msgs[1].code == code
    stats = dict(dirty.ps.stats)
    # the core closed the handshake-level offenders with typed, counted reasons
    assert stats.get("closed_bad_worker_id") == 1
    assert stats.get("closed_unexpected_kind") == 1
    assert stats.get("closed_auth_timeout") == 2  # slowloris + silent
    assert stats.get("joined") == config.workers
    # the honest rounds: exact, and the same decodes as the clean run
    assert_exact_rounds(clean.ps.records, config.rounds, tol=1e-9)
    assert_exact_rounds(dirty.ps.records, config.rounds, tol=1e-9)
    for a, b in zip(clean.ps.records, dirty.ps.records, strict=True):
        assert a.state == b.state
        assert not a.dropped and not b.dropped
        assert a.loss == b.loss
        assert a.gradient is not None and b.gradient is not None
        np.testing.assert_array_equal(a.gradient, b.gradient)
    np.testing.assert_array_equal(clean.ps.model, dirty.ps.model)
    # and the same trigger states as the virtual-clock driver on this schedule (habit 10)
    rig = build_rig(config, schedule=schedule)
    rig.sim.run()
    assert [r.state for r in rig.ps.records] == [r.state for r in clean.ps.records]


def test_large_outboxes_go_out_in_slices_in_order(run: Runner,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """With a slice of 2 frames, every broadcast to 6 workers leaves over several loop
    iterations: each peer still sees its frames in order (tags and sequence numbers verify),
    every round's round_start reaches all peers before the analytics of the round before it
    complete, and the rounds are exact with the same trigger states as the virtual clock."""
    from aiogc.net import drivers

    monkeypatch.setattr(drivers, "OUTBOX_SLICE", 2)
    secret = os.urandom(32)
    config = cfg(workers=6, delta=2, n_parts=1, rounds=5)
    schedule = spaced_schedule(config, gap_s=0.03)
    # (kind, round, events logged so far, frames still deferred) of every frame sent
    sent: list[tuple[str, int, int, int]] = []
    holder: list[Cluster] = []

    def frame_log(direction: str, peer: Any, msg: Any, nbytes: int) -> None:
        if direction == "out" and holder:
            cl = holder[0]
            sent.append((msg.kind, getattr(msg, "round", -1), len(cl.log.events),
                         len(cl.server._outq)))

    async def scenario() -> Cluster:
        ps = make_ps(config, schedule=schedule, secret=secret)
        cl = await start_cluster(ps, secret=secret, frame_log=frame_log)
        holder.append(cl)
        async with asyncio.timeout(GUARD_S):
            await cl.finish()
        return cl

    cl = run(scenario)
    assert_exact_rounds(cl.ps.records, config.rounds, tol=1e-9)
    assert any(deferred > 0 for *_, deferred in sent)  # the broadcasts really were sliced
    completed = {e.record.round: i for i, e in enumerate(cl.log.events)
                 if isinstance(e, RoundCompleted)}
    for r in range(1, config.rounds):
        starts = [n_ev for kind, rnd, n_ev, _ in sent if kind == "round_start" and rnd == r]
        assert len(starts) == config.workers
        assert max(starts) <= completed[r - 1]
    rig = build_rig(config, schedule=schedule)
    rig.sim.run()
    assert [r.state for r in rig.ps.records] == [r.state for r in cl.ps.records]


def test_connection_flood_beyond_the_pending_cap(run: Runner) -> None:
    """More silent connections at once than the PS admits unauthenticated: the oldest pending
    ones are evicted (too_many_connections), the rest closed at the auth deadline; the honest
    (authenticated) workers are not affected and every round is exact."""
    config = cfg(workers=4, delta=2, n_parts=1, rounds=10)
    schedule = spaced_schedule(config, gap_s=0.08)
    ps = make_ps(config, schedule=schedule)
    cap = pending_cap(ps.m)
    assert cap == MAX_PENDING_CONNECTIONS  # the floor at small m
    n_flood = cap + 16

    async def scenario() -> tuple[Cluster, list[bytes], bool]:
        cl = await start_cluster(ps)
        async with asyncio.timeout(STEP_S):
            await cl.log.wait_for(lambda: cl.log.rounds_completed() >= 1)
        got = await asyncio.gather(
            *[_bad_peer(cl.server.port, b"", eof_after=False) for _ in range(n_flood)])
        during_training = cl.ps.phase is not PSPhase.FINISHED
        async with asyncio.timeout(GUARD_S):
            await cl.finish()
        return cl, got, during_training

    cl, got, during_training = run(scenario)
    assert during_training and len(got) == n_flood
    stats = dict(cl.ps.stats)
    assert stats.get("closed_too_many_connections") == n_flood - cap
    assert stats.get("evicted_pending") == n_flood - cap
    assert stats.get("closed_auth_timeout") == cap
    assert stats.get("joined") == config.workers
    assert_exact_rounds(cl.ps.records, config.rounds, tol=1e-9)
    assert all(not r.dropped for r in cl.ps.records)
    rig = build_rig(config, schedule=schedule)
    rig.sim.run()
    assert [r.state for r in rig.ps.records] == [r.state for r in cl.ps.records]


def test_last_frames_survive_a_peer_still_sending(run: Runner) -> None:
    """Regression: the PS sends shutdown and closes while a straggler is still sending (its
    late report and coded vector). Closing the socket outright made the kernel answer those
    bytes with RST, the straggler's next write failed before it had read the shutdown, and it
    went on reconnecting to a PS that was gone (seen with ignore-stragglers on a loaded
    machine; deterministic on the default loop with this timing). A lingering close keeps
    reading until the peer's EOF, so the last frames always arrive."""

    async def scenario() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        lost = 0
        trials = 50
        for _ in range(trials):
            accepted: asyncio.Future[FramedConnection] = loop.create_future()
            got: list[str] = []
            closed: asyncio.Future[None] = loop.create_future()

            def on_close(c: FramedConnection, e: BaseException | None,
                         closed: asyncio.Future[None] = closed) -> None:
                if not closed.done():
                    closed.set_result(None)

            def make_server_side(accepted: asyncio.Future[FramedConnection] = accepted
                                 ) -> FramedConnection:
                c = FramedConnection(lambda c, m: None, lambda c, e: None)
                if not accepted.done():
                    accepted.set_result(c)
                return c

            server = await loop.create_server(make_server_side, HOST, 0)
            port = server.sockets[0].getsockname()[1]
            def make_client(got: list[str] = got, on_close: Any = on_close
                            ) -> FramedConnection:
                return FramedConnection(lambda c, m: got.append(m.kind), on_close)

            _, client = await loop.create_connection(make_client, HOST, port)
            async with asyncio.timeout(STEP_S):
                server_side = await accepted
                server_side.send(Shutdown(reason="all rounds done"))
                server_side.close()
                await asyncio.sleep(0)  # the close happens; the client has not read yet
                for seq in range(3):  # ... and keeps sending: late report, coded vector
                    client.send(Ping(seq=seq))
                await closed
            lost += "shutdown" not in got
            server.close()
            await server.wait_closed()
        return lost, trials

    lost, trials = run(scenario)
    assert lost == 0, f"shutdown lost in {lost} of {trials} closes"


def test_worker_refuses_a_non_loopback_ps_without_a_secret() -> None:
    with pytest.raises(ConfigError, match="secret"):
        WorkerClient(Worker(0), "192.0.2.1", 9)
    WorkerClient(Worker(0, secret=b"s" * 32), "192.0.2.1", 9)  # with one: fine
    WorkerClient(Worker(0), HOST, 9)  # loopback: fine


def test_frames_after_the_handshake_are_tagged_and_a_forgery_closes(run: Runner) -> None:
    """A man in the middle that relays the handshake untouched and then alters one byte of a
    worker's frame: the PS closes that connection with bad_tag (nothing forged is applied),
    the worker reconnects and the run completes exactly."""
    secret = b"relay-secret-0123456789abcdef-xx"
    config = cfg(workers=4, delta=2, rounds=6, delay="const:0.01")

    async def scenario() -> tuple[Cluster, int]:
        cl = await start_cluster(make_ps(config, secret=secret), workers=3, secret=secret)
        tampered = [0]

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       tamper: bool) -> None:
            seen = 0
            with contextlib.suppress(ConnectionError):
                while data := await reader.read(65536):
                    if tamper and tampered[0] == 0 and seen > 300:
                        b = bytearray(data)
                        b[-1] ^= 1  # the last byte is a tag byte (frames end with tags)
                        data = bytes(b)
                        tampered[0] += 1
                    seen += len(data)
                    writer.write(data)
                    await writer.drain()
            writer.close()

        async def relay(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
            pr, pw = await asyncio.open_connection(HOST, cl.server.port)
            await asyncio.gather(pipe(cr, pw, True), pipe(pr, cw, False))

        mitm = await asyncio.start_server(relay, HOST, 0)
        port = mitm.sockets[0].getsockname()[1]
        client = WorkerClient(Worker(3, secret=secret), HOST, port,
                              options=ClientOptions(backoff_s=FAST_BACKOFF))
        cl.clients.append(client)
        cl.client_tasks.append(asyncio.create_task(client.run()))
        cl.worker_logs.append(EventLog())
        async with asyncio.timeout(GUARD_S):
            recs = await cl.finish()
        mitm.close()
        assert recs
        return cl, tampered[0]

    cl, tampered = run(scenario)
    assert tampered == 1
    assert dict(cl.ps.stats).get("closed_bad_tag") == 1
    assert_exact_rounds(cl.ps.records, 6, tol=1e-9)


def test_closed_connections_are_freed_without_the_cyclic_gc(run: Runner) -> None:
    """A burst of connections that never authenticate (silent, garbage, EOF): once the PS has
    closed them all, none is still alive with the cyclic GC disabled (no class per
    connection, no reference cycle through a connection)."""
    config = cfg(workers=4, delta=2, rounds=1, join_timeout_s=30.0)

    async def scenario() -> tuple[int, int]:
        cl = await start_cluster(make_ps(config), workers=0)
        port = cl.server.port
        sink = cl.server._on_event
        cl.server._on_event = None  # the test's EventLog would keep PeerClosed(peer=conn)
        gc.collect()
        gc.disable()
        try:
            writers = []
            for i in range(150):
                _, w = await asyncio.open_connection(HOST, port)
                if i % 3 == 1:
                    w.write(b"\x00\x00\x00\x05garbage")
                elif i % 3 == 2:
                    w.write_eof()
                writers.append(w)
            for w in writers:
                w.close()
            # every connection is closed by the PS (cap, garbage, EOF, auth deadline): wait
            # for its table to empty (a hang guard only, no timing asserted)
            async with asyncio.timeout(GUARD_S):
                await cl.server.wait_connections(lambda: not cl.server._conns)
            await asyncio.sleep(0.05)  # the transports' last close callbacks
            alive = sum(1 for o in gc.get_objects() if isinstance(o, FramedConnection))
        finally:
            gc.enable()
            cl.server._on_event = sink
        for j in range(config.workers):
            cl.add_worker(j)
        async with asyncio.timeout(GUARD_S):
            await cl.finish()
        return alive, len(cl.ps.records)

    alive, rounds = run(scenario)
    assert alive == 0
    assert rounds == 1


def test_idle_connection_flood_does_not_lock_workers_out(run: Runner) -> None:
    """Lock-out attempt without the secret: more idle connections than the pending cap, each
    reopened as soon as the PS closes it. Eight workers still join and train, and a worker
    whose connection drops mid-run gets back in (the oldest pending connection is evicted
    for a new one, and an honest worker answers its challenge at once)."""
    config = cfg(workers=8, delta=3, rounds=40, delay="const:0.02")

    async def scenario() -> tuple[Cluster, int]:
        cl = await start_cluster(make_ps(config), workers=0)
        stop = asyncio.Event()
        opened = [0]

        async def hog() -> None:
            while not stop.is_set():
                try:
                    reader, writer = await asyncio.open_connection(HOST, cl.server.port)
                except OSError:
                    continue
                opened[0] += 1
                with contextlib.suppress(OSError):
                    await reader.read()  # idle until the PS closes it, then reopen
                writer.close()

        hogs = [asyncio.create_task(hog()) for _ in range(pending_cap(cl.ps.m) + 8)]
        async with asyncio.timeout(GUARD_S):  # hang guard: the hogs hold every slot
            await cl.server.wait_connections(
                lambda: len(cl.ps._pending) >= pending_cap(cl.ps.m))
        for j in range(config.workers):
            cl.add_worker(j)
        async with asyncio.timeout(GUARD_S):
            await cl.log.wait_for(lambda: cl.log.rounds_completed() >= 3)
        conn = cl.clients[3]._conn
        assert conn is not None
        conn.abort()  # worker 3 drops mid-run and must get back in
        async with asyncio.timeout(GUARD_S):
            await cl.log.wait_for(
                lambda: sum(1 for e in cl.log.of(WorkerJoined) if e.worker == 3) >= 2)
        async with asyncio.timeout(GUARD_S):
            await cl.finish()
        stop.set()
        for h in hogs:
            h.cancel()
        await asyncio.gather(*hogs, return_exceptions=True)
        return cl, opened[0]

    cl, opened = run(scenario)
    recs = cl.ps.records
    assert len(recs) == config.rounds
    assert all(r.status == "exact" for r in recs)
    assert opened > pending_cap(cl.ps.m)
    rejoined = [e for e in cl.log.of(WorkerJoined) if e.worker == 3][1]
    assert any(r.t_start > rejoined.time and r.state[3] > 0 for r in recs)


def test_limits_after_auth_follow_the_run() -> None:
    """The post-auth header cap fits the largest legal worker header (an error with two
    MAX_TEXT strings) and nothing much larger; the send-queue cap follows the model size."""
    from aiogc.net.limits import WORKER_MAX_HEADER, send_queue_cap
    from aiogc.protocol.messages import MAX_TEXT
    from aiogc.protocol.wire import encode_frame

    worst = Error(code="é" * MAX_TEXT, reason="é" * MAX_TEXT)
    assert len(encode_frame(worst)[0]) - 4 <= WORKER_MAX_HEADER < 16 * 1024
    config = cfg(task="linreg:samples=240,dim=600")
    server = PSServer(make_ps(config), host=HOST)
    assert server._post_auth.max_header_bytes == WORKER_MAX_HEADER
    model = 600 * 8
    assert send_queue_cap(model) <= server._max_pending <= send_queue_cap(model + 65536)


def test_a_slow_setup_never_blocks_other_handshakes(run: Runner) -> None:
    """Scheme and task are built once per configuration in an executor thread: while one
    (slow) build runs, the loop keeps serving every other worker's handshake."""
    import time as _time

    from aiogc.training.setup import SetupCache, TaskPolicy

    config = cfg(workers=6, delta=3, rounds=2)

    class SlowCache(SetupCache):
        def get(self, c: RunConfig) -> Any:
            if self.peek(c) is None:
                _time.sleep(1.5)  # a slow build (in the executor thread, not on the loop)
            return super().get(c)

    async def scenario() -> tuple[list[str], int]:
        seen: list[str] = []

        def frame_log(direction: str, peer: Any, msg: Any, nbytes: int) -> None:
            if direction == "in":
                seen.append(msg.kind)

        cl = await start_cluster(make_ps(config), workers=0, frame_log=frame_log)
        cache = SlowCache(TaskPolicy(task=config.task))
        for j in range(config.workers):
            client = WorkerClient(Worker(j), HOST, cl.server.port, setups=cache)
            cl.clients.append(client)
            cl.client_tasks.append(asyncio.create_task(client.run()))
            cl.worker_logs.append(EventLog())
        async with asyncio.timeout(GUARD_S):
            await cl.finish()
        return seen, cache.builds

    seen, builds = run(scenario)
    assert builds == 1
    first_ready = seen.index("ready")
    assert seen[:first_ready].count("hello") == 6  # every handshake before the first ready
