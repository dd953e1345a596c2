"""aiogc.net.framing over loopback (port 0), under the default loop and uvloop.

No fixed ports, no sleeps for synchronisation, no wall-clock assertions: timeouts only guard
against hangs.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable, Coroutine
from typing import Any, cast

import msgpack
import numpy as np
import pytest

from aiogc.errors import MalformedFrame, RemoteProtocolError
from aiogc.net.framing import FramedConnection
from aiogc.protocol.headers import (
    DEFAULT_LIMITS,
    KIND_CODES,
    PREAUTH_LIMITS,
    FrameLimits,
)
from aiogc.protocol.messages import (
    PROTOCOL_VERSION,
    Bye,
    ChunkReport,
    CodedGradient,
    Error,
    Hello,
    Message,
    Ping,
    Pong,
    RoundStart,
)
from aiogc.protocol.tags import FrameAuth
from aiogc.protocol.wire import FrameDecoder, encode_frame_bytes

GUARD_S = 20.0  # hang guard only


def _loop_factories() -> list[Any]:
    out: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop

        out.append(pytest.param(uvloop.new_event_loop, id="uvloop"))
    except ImportError:  # pragma: no cover
        pass
    return out


@pytest.fixture(params=_loop_factories())
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, None]], None]:
    """Run a coroutine on a fresh loop of the requested kind; fail on unhandled loop errors."""

    def _run(coro: Coroutine[Any, Any, None]) -> None:
        errors: list[dict[str, Any]] = []
        with asyncio.Runner(loop_factory=request.param) as runner:
            runner.get_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx))
            runner.run(asyncio.wait_for(coro, GUARD_S))
        assert not errors, errors

    return _run


class Peer:
    """One side's view: a queue of received messages and the close outcome."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.closed: asyncio.Future[BaseException | None] = (
            asyncio.get_running_loop().create_future())
        self.conn: FramedConnection | None = None

    def on_message(self, conn: FramedConnection, msg: Message) -> None:
        self.inbox.put_nowait(msg)

    def on_close(self, conn: FramedConnection, exc: BaseException | None) -> None:
        assert not self.closed.done(), "on_close called twice"
        self.closed.set_result(exc)


class Server:
    """A loopback server answering ping with pong; records every connection."""

    def __init__(self, limits: FrameLimits = DEFAULT_LIMITS, **kw: Any) -> None:
        self.limits = limits
        self.kw = kw
        self.peers: list[Peer] = []
        self.accepted: asyncio.Queue[Peer] = asyncio.Queue()
        self.rows: dict[int, np.ndarray] = {}
        self.on_message_hook: Callable[[FramedConnection, Message], None] | None = None

    def alloc(self, kind: str, header: dict[str, Any], dtype: np.dtype, n: int) -> np.ndarray:
        row = self.rows.get(header["round"])
        if row is None or row.shape != (n,) or row.dtype != dtype:
            return None  # type: ignore[return-value]
        return row

    def factory(self) -> FramedConnection:
        peer = Peer()

        def on_message(conn: FramedConnection, msg: Message) -> None:
            if self.on_message_hook is not None:
                self.on_message_hook(conn, msg)
            if isinstance(msg, Ping):
                conn.send(Pong(seq=msg.seq))
            peer.on_message(conn, msg)

        accepted = self.accepted

        class _Conn(FramedConnection):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                super().connection_made(transport)
                accepted.put_nowait(peer)  # announce only once the transport is attached

        conn = _Conn(on_message, peer.on_close, self.limits, self.alloc, **self.kw)
        peer.conn = conn
        self.peers.append(peer)
        return conn

    async def start(self) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(self.factory, "127.0.0.1", 0)
        host, port = self.server.sockets[0].getsockname()[:2]
        return host, port

    async def stop(self) -> None:
        self.server.close()
        for p in self.peers:
            if p.conn is not None:
                p.conn.abort()
        await self.server.wait_closed()


async def connect(addr: tuple[str, int], limits: FrameLimits = DEFAULT_LIMITS) -> Peer:
    peer = Peer()
    _, conn = await asyncio.get_running_loop().create_connection(
        lambda: FramedConnection(peer.on_message, peer.on_close, limits), *addr)
    peer.conn = conn
    return peer


async def ping_pong(peer: Peer, seq: int) -> None:
    assert peer.conn is not None
    peer.conn.send(Ping(seq=seq))
    msg = await peer.inbox.get()
    assert isinstance(msg, Pong) and msg.seq == seq


async def raw_exchange(addr: tuple[str, int], blob: bytes, *, eof: bool = False) -> bytes:
    """Send raw bytes; return everything the server sent until it closed."""
    reader, writer = await asyncio.open_connection(*addr)
    writer.write(blob)
    if eof:
        writer.write_eof()
    await writer.drain()
    data = await reader.read()  # until the server closes
    writer.close()
    return data


def only_error(data: bytes) -> Error:
    (msg,) = FrameDecoder(PREAUTH_LIMITS).feed(data)
    assert isinstance(msg, Error)
    return msg


# ----------------------------------------------------------------------------- tests


def test_honest_client_frames_get_through(run: Callable[..., None]) -> None:
    async def main() -> None:
        srv = Server()
        addr = await srv.start()
        d = 1_000_003
        dest = np.zeros(d, dtype="<f4")
        srv.rows[7] = dest  # the PS's preallocated row for round 7
        client = await connect(addr)
        server_peer = await srv.accepted.get()
        assert client.conn is not None and server_peer.conn is not None

        await ping_pong(client, 1)
        report = ChunkReport(epoch=1, round=7, count=3, t_worker=1.5, elapsed_s=0.25)
        payload = np.random.default_rng(0).standard_normal(d).astype("<f4")
        client.conn.send(report)
        client.conn.send(CodedGradient(epoch=1, round=7, attempt=0, state_digest=b"s" * 8,
                                       compute_s=0.1, payload=payload))
        other = np.arange(10.0)  # round 8: no row, a fresh array
        client.conn.send(CodedGradient(epoch=1, round=8, attempt=2, state_digest=b"",
                                       compute_s=0.0, payload=other))
        await client.conn.drain()
        assert await server_peer.inbox.get() == Ping(seq=1)
        assert await server_peer.inbox.get() == report
        got = await server_peer.inbox.get()
        assert isinstance(got, CodedGradient) and got.payload is dest  # received in place
        assert np.array_equal(dest, payload)
        got2 = await server_peer.inbox.get()
        assert isinstance(got2, CodedGradient) and np.array_equal(got2.payload, other)

        # server -> client with an array, then a clean close by the client
        model = np.linspace(0, 1, 5000)
        server_peer.conn.send(RoundStart(epoch=1, round=9, delays_s=(0.5,), net_delay_s=0.0,
                                         model=model))
        rs = await client.inbox.get()
        assert isinstance(rs, RoundStart) and np.array_equal(rs.model, model)
        stats = client.conn.statistics()
        assert stats["frames_out"] == 4 and stats["frames_in"] == 2
        assert stats["bytes_out"] > payload.nbytes
        assert server_peer.conn.statistics()["bytes_in"] == stats["bytes_out"]
        client.conn.send(Bye(reason="done"))
        client.conn.close()
        assert await client.closed is None
        assert await server_peer.inbox.get() == Bye(reason="done")
        assert await server_peer.closed is None  # clean EOF at a frame boundary
        await srv.stop()

    run(main())


GARBAGE = [
    (b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", "header_too_large"),
    (bytes.fromhex("16030100f4010000f00303") + b"\xab" * 64, "header_too_large"),
    (b"\x00\x00\x00\x00", "empty_header"),
    (b"\x00\x00\x00\x03\x93\x04\x0b", "bad_version"),  # [4, bye, ...]: a version-4 array
    (b"\x00\x00\x00\x02\x04\x0b", "bad_version"),  # a version-4 frame: version byte first
    (b"\x00\x00\x00\x04\x93\x05\x0b\xc1", "bad_msgpack"),  # v5 bye, a bad value
    (encode_frame_bytes(CodedGradient(epoch=0, round=0, attempt=0, state_digest=b"",
                                      compute_s=0.0, payload=np.ones(4))), "array_too_large"),
    (b"\x00\x00\x02\x01" + b"\x00" * 513, "header_too_large"),
]


@pytest.mark.parametrize(("blob", "code"), GARBAGE)
def test_garbage_client_closed_with_typed_error(run: Callable[..., None], blob: bytes,
                                                code: str) -> None:
    async def main() -> None:
        srv = Server(limits=PREAUTH_LIMITS)
        addr = await srv.start()
        honest = await connect(addr)
        honest_server_side = await srv.accepted.get()
        await ping_pong(honest, 1)

        data = await raw_exchange(addr, blob)
        err = only_error(data)
        assert err.code == code
        bad_side = await srv.accepted.get()
        exc = await bad_side.closed
        assert isinstance(exc, MalformedFrame) and exc.code == code
        assert bad_side.inbox.empty()

        await ping_pong(honest, 2)  # the honest connection is unaffected
        assert not honest_server_side.closed.done()
        await srv.stop()

    run(main())


def _report_header(drop: int = 0, **over: Any) -> bytes:
    """A chunk_report frame from raw wire values (any value msgpack carries), its last
    ``drop`` values left out."""
    values = {"epoch": 0, "round": 1, "count": 1, "t_worker": 0.5, "elapsed_s": 0.25, **over}
    body: bytes = msgpack.packb([PROTOCOL_VERSION, KIND_CODES["chunk_report"],
                                 *list(values.values())[:len(values) - drop]])
    return struct.pack(">I", len(body)) + body


BAD_FIELDS = [
    (_report_header(round=2**53 + 1), "bad_field", "chunk_report.round="),
    (_report_header(count=70000), "bad_field", "chunk_report.count="),
    (_report_header(t_worker=float("nan")), "bad_field", "chunk_report.t_worker="),
    (_report_header(elapsed_s=-1.0), "bad_field", "chunk_report.elapsed_s="),
    (_report_header(drop=1), "bad_schema", "chunk_report: 6 values, expected 7"),
]


@pytest.mark.parametrize(("blob", "code", "named"), BAD_FIELDS)
def test_bad_field_closes_with_a_reason_naming_it(run: Callable[..., None], blob: bytes,
                                                  code: str, named: str) -> None:
    """A chunk_report field out of range: the peer gets an error frame whose reason names
    the field, then the close; the server side sees the same MalformedFrame; nothing is
    delivered."""

    async def main() -> None:
        srv = Server(limits=PREAUTH_LIMITS)
        addr = await srv.start()
        err = only_error(await raw_exchange(addr, blob))
        assert err.code == code and named in err.reason, err
        bad_side = await srv.accepted.get()
        exc = await bad_side.closed
        assert isinstance(exc, MalformedFrame) and exc.code == code and named in str(exc)
        assert bad_side.inbox.empty()
        await srv.stop()

    run(main())


def test_random_bytes_and_truncation_then_eof(run: Callable[..., None]) -> None:
    async def main() -> None:
        srv = Server(limits=PREAUTH_LIMITS)
        addr = await srv.start()
        honest = await connect(addr)
        rng = np.random.default_rng(5)
        for i in range(20):
            data = await raw_exchange(addr, rng.bytes(300))
            peer = await srv.accepted.get()
            if peer is srv.peers[0]:
                peer = await srv.accepted.get()
            assert isinstance(await peer.closed, MalformedFrame)
            assert only_error(data).code
            await ping_pong(honest, i)
        # a truncated frame, then EOF from the client: typed error, Error frame best effort
        hello = encode_frame_bytes(Hello(worker=1, nonce=b"n" * 16, mac=b"m", epoch=0))
        data = await raw_exchange(addr, hello[:-3], eof=True)
        peer = await srv.accepted.get()
        exc = await peer.closed
        assert isinstance(exc, MalformedFrame) and exc.code == "truncated"
        assert only_error(data).code == "truncated"
        # nothing sent at all, then EOF: a clean close
        await raw_exchange(addr, b"", eof=True)
        peer = await srv.accepted.get()
        assert await peer.closed is None
        await ping_pong(honest, 99)
        await srv.stop()

    run(main())


def test_limits_raised_after_authentication(run: Callable[..., None]) -> None:
    async def main() -> None:
        srv = Server(limits=PREAUTH_LIMITS)

        def on_msg(conn: FramedConnection, msg: Message) -> None:
            if isinstance(msg, Hello):  # stand-in for the core's successful handshake
                conn.set_limits(DEFAULT_LIMITS)

        srv.on_message_hook = on_msg
        addr = await srv.start()
        client = await connect(addr)
        side = await srv.accepted.get()
        assert client.conn is not None
        client.conn.send(Hello(worker=0, nonce=b"n" * 32, mac=b"m" * 32, epoch=0))
        big = np.ones(200_000, "<f8")
        client.conn.send(CodedGradient(epoch=0, round=1, attempt=0, state_digest=b"",
                                       compute_s=0.0, payload=big))
        assert isinstance(await side.inbox.get(), Hello)
        got = await side.inbox.get()
        assert isinstance(got, CodedGradient) and np.array_equal(got.payload, big)
        assert side.conn is not None and side.conn.limits == DEFAULT_LIMITS
        await srv.stop()

    run(main())


def test_on_message_remote_error_closes_with_its_code(run: Callable[..., None]) -> None:
    async def main() -> None:
        srv = Server()

        def on_msg(conn: FramedConnection, msg: Message) -> None:
            if isinstance(msg, ChunkReport):
                raise RemoteProtocolError("report before round start", code="bad_state")

        srv.on_message_hook = on_msg
        addr = await srv.start()
        client = await connect(addr)
        assert client.conn is not None
        client.conn.send(ChunkReport(epoch=0, round=0, count=1, t_worker=0.0, elapsed_s=0.0))
        client.conn.send(Ping(seq=1))  # never delivered: the connection is closing
        err = await client.inbox.get()
        assert isinstance(err, Error) and err.code == "bad_state"
        assert await client.closed is None  # the server closed cleanly after its Error frame
        side = srv.peers[0]
        exc = await side.closed
        assert isinstance(exc, RemoteProtocolError) and exc.code == "bad_state"
        assert side.inbox.empty()
        await srv.stop()

    run(main())


def test_slow_consumer_is_cut_off(run: Callable[..., None]) -> None:
    async def main() -> None:
        cap = 1 << 20
        srv = Server(max_pending_bytes=cap)
        addr = await srv.start()
        honest = await connect(addr)
        # a peer that connects and never reads
        sock = socket.create_connection(addr)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        try:
            peers = [await srv.accepted.get(), await srv.accepted.get()]
            # the slow side is the one whose peer address is our socket's
            mine = sock.getsockname()
            slow = next(p for p in peers if p.conn is not None and p.conn.peername == mine)
            assert slow.conn is not None
            model = np.ones(1 << 18, "<f4")  # 1 MiB per frame
            sent = 0
            while not slow.conn.is_closing():
                slow.conn.send(RoundStart(epoch=0, round=sent, delays_s=(), net_delay_s=0.0,
                                          model=model))
                sent += 1
                assert sent < 10_000
                await asyncio.sleep(0)  # let the loop flush what the kernel takes
            exc = await slow.closed
            assert isinstance(exc, RemoteProtocolError) and exc.code == "slow_consumer"
            slow.conn.send(Ping(seq=1))  # a no-op once closed
            await ping_pong(honest, 3)
        finally:
            sock.close()
        await srv.stop()

    run(main())


def test_drain_waits_for_the_peer(run: Callable[..., None]) -> None:
    async def main() -> None:
        srv = Server()
        addr = await srv.start()
        client = await connect(addr)
        side = await srv.accepted.get()
        assert client.conn is not None
        payload = np.ones(4_000_000, "<f4")  # 16 MB: far above the high-water mark
        for r in range(3):
            client.conn.send(CodedGradient(epoch=0, round=r, attempt=0, state_digest=b"",
                                           compute_s=0.0, payload=payload))
            await client.conn.drain()
            assert client.conn.statistics()["write_buffer_bytes"] <= 64 * 1024
        for _ in range(3):
            got = await side.inbox.get()
            assert isinstance(got, CodedGradient) and got.payload.shape == payload.shape
        client.conn.abort()
        assert isinstance(await side.closed, (ConnectionError, type(None)))
        await client.conn.drain()  # returns at once on a dead connection
        await srv.stop()

    run(main())



def test_close_with_code_sends_error_and_flushes(run: Callable[..., None]) -> None:
    async def main() -> None:
        srv = Server()
        addr = await srv.start()
        client = await connect(addr)
        side = await srv.accepted.get()
        assert side.conn is not None and client.conn is not None
        model = np.arange(300_000, dtype="<f8")  # 2.4 MB still buffered when close() is called
        side.conn.send(RoundStart(epoch=0, round=1, delays_s=(), net_delay_s=0.0, model=model))
        side.conn.close("shutdown", "run over")
        side.conn.send(Ping(seq=1))  # dropped: closing
        rs = await client.inbox.get()
        assert isinstance(rs, RoundStart) and np.array_equal(rs.model, model)
        assert await client.inbox.get() == Error(code="shutdown", reason="run over")
        assert await client.closed is None and await side.closed is None
        assert client.inbox.empty()
        await srv.stop()

    run(main())


# ------------------------------------------------------------------ frame tags (protocol v2)

KEY = bytes(range(32))


def _tagged_stream(msgs: list[Message], key: bytes = KEY) -> list[bytes]:
    auth = FrameAuth(key)
    return [encode_frame_bytes(m, auth) for m in msgs]


def _tag_msgs() -> list[Message]:
    return [
        ChunkReport(epoch=0, round=1, count=2, t_worker=0.5, elapsed_s=0.25),
        CodedGradient(epoch=0, round=1, attempt=0, state_digest=b"d" * 8, compute_s=0.1,
                      payload=np.arange(5000, dtype="<f8")),  # > 64 KiB total: streamed GMAC
        Ping(seq=3),
        CodedGradient(epoch=0, round=1, attempt=1, state_digest=b"d" * 8, compute_s=0.1,
                      payload=np.arange(7, dtype="<f4")),
    ]


def test_tagged_frames_decode_whatever_the_split() -> None:
    frames = b"".join(_tagged_stream(_tag_msgs()))
    for step in (1, 7, 4096, len(frames)):
        dec = FrameDecoder(DEFAULT_LIMITS)
        dec.auth = FrameAuth(KEY)
        out: list[Message] = []
        for i in range(0, len(frames), step):
            out.extend(dec.feed(frames[i:i + step]))
        assert [m.kind for m in out] == ["chunk_report", "coded_gradient", "ping",
                                         "coded_gradient"]
        np.testing.assert_array_equal(out[1].array(), np.arange(5000, dtype="<f8"))
        assert dec.at_frame_boundary()


@pytest.mark.parametrize("attack", ["flip_header", "flip_body", "flip_tag", "replay",
                                    "reorder", "drop", "wrong_key", "untagged", "splice"])
def test_bad_tags_are_rejected_before_delivery(attack: str) -> None:
    frames = _tagged_stream(_tag_msgs())
    if attack == "flip_header":  # a relay rewrites a field (count 2 -> 3), keeps the tag
        forged = encode_frame_bytes(ChunkReport(epoch=0, round=1, count=3, t_worker=0.5,
                                                elapsed_s=0.25))
        assert len(forged) == len(frames[0]) - 16
        frames[0] = forged + frames[0][-16:]
    elif attack == "flip_body":
        f = bytearray(frames[1])
        f[-100] ^= 0x80
        frames[1] = bytes(f)
    elif attack == "flip_tag":
        flipped = bytearray(frames[2])
        flipped[-1] ^= 1
        frames[2] = bytes(flipped)
    elif attack == "replay":
        frames = [frames[0], frames[0]]
    elif attack == "reorder":
        frames = [frames[2], frames[0]]
    elif attack == "drop":
        frames = [frames[1]]
    elif attack == "wrong_key":
        frames = _tagged_stream(_tag_msgs(), key=bytes(32))
    elif attack == "untagged":
        frames = [encode_frame_bytes(_tag_msgs()[0])]
    elif attack == "splice":  # header of one frame, tag of another
        frames = [frames[0][:-16] + frames[2][-16:]]
    dec = FrameDecoder(DEFAULT_LIMITS)
    dec.auth = FrameAuth(KEY)
    delivered: list[Message] = []
    with pytest.raises(MalformedFrame) as info:
        for frame in frames:
            delivered.extend(dec.feed(frame))
        if attack == "untagged":  # the next frame's bytes would be read as the tag
            delivered.extend(dec.feed(b"\x00" * 16))
    assert info.value.code == "bad_tag"
    ok = {"flip_header": 0, "flip_body": 1, "flip_tag": 2, "replay": 1, "reorder": 0,
          "drop": 0, "wrong_key": 0, "untagged": 0, "splice": 0}[attack]
    assert len(delivered) == ok  # the bad frame itself was never delivered
    with pytest.raises(MalformedFrame):  # poisoned
        dec.feed(b"\x00")


def test_frame_auth_is_aes_gcm_with_a_sequence_nonce() -> None:
    """Independent check of the tag definition (docs/protocol.md): GCM tag over the frame
    bytes as associated data, nonce = 4 zero bytes || u64be(seq), empty plaintext."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    msg = Ping(seq=9)
    plain = encode_frame_bytes(msg)
    auth = FrameAuth(KEY)
    auth.tag([b"x"])  # seq 0 used
    tagged = encode_frame_bytes(msg, auth)  # seq 1
    nonce = b"\x00" * 4 + (1).to_bytes(8, "big")
    assert tagged == plain + AESGCM(KEY).encrypt(nonce, b"", plain)


def test_connection_tags_both_ways_and_closes_on_a_bad_tag(
        run: Callable[[Coroutine[Any, Any, None]], None]) -> None:
    """Two FramedConnections with set_auth exchange tagged frames; a forged frame written
    raw to the socket closes the receiver with bad_tag, nothing delivered."""

    result: list[Any] = []

    async def scenario() -> None:
        got: list[str] = []
        closed: list[BaseException | None] = []
        done = asyncio.get_running_loop().create_future()

        def on_close(c: FramedConnection, e: BaseException | None) -> None:
            closed.append(e)
            if not done.done():
                done.set_result(None)

        srv_conns: list[FramedConnection] = []

        def make_srv() -> FramedConnection:
            c = FramedConnection(lambda c, m: got.append(m.kind), on_close)
            c.set_auth(send=b"s" * 32, recv=b"w" * 32)
            srv_conns.append(c)
            return c

        loop = asyncio.get_running_loop()
        server = await loop.create_server(make_srv, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        auth = FrameAuth(b"w" * 32)
        writer.write(encode_frame_bytes(Ping(seq=1), auth))
        writer.write(encode_frame_bytes(Pong(seq=1), auth))
        forged = bytearray(encode_frame_bytes(Ping(seq=2), auth))
        forged[-3] ^= 1
        writer.write(bytes(forged))
        writer.write(encode_frame_bytes(Ping(seq=3), auth))  # after the forgery: never read
        await writer.drain()
        async with asyncio.timeout(GUARD_S):
            await done
            tail = await reader.read()  # the Error frame the PS side sent, tagged
        writer.close()
        server.close()
        dec = FrameDecoder(DEFAULT_LIMITS)
        dec.auth = FrameAuth(b"s" * 32)
        errs = [m.kind + ":" + getattr(m, "code", "") for m in dec.feed(tail)]
        result.extend((got, closed[0], errs))

    run(scenario())
    got, exc, errs = result
    assert got == ["ping", "pong"]
    assert isinstance(exc, MalformedFrame) and exc.code == "bad_tag"
    assert errs == ["error:bad_tag"]


class _FailingTransport:
    """Behaves as uvloop's TCPTransport on a peer reset: the first ``write`` fails with a
    socket error, which closes the handle at once (``connection_lost`` comes later, from the
    loop); every later ``write`` raises ``RuntimeError`` ("unable to perform operation on
    <TCPTransport closed=True>")."""

    def __init__(self) -> None:
        self.closed = False
        self.writes = 0

    def write(self, data: bytes | memoryview) -> None:
        if self.closed:
            raise RuntimeError("unable to perform operation on <TCPTransport closed=True>; "
                               "the handler is closed")
        self.writes += 1
        self.closed = True  # ECONNRESET: uvloop's fatal-error path closes the handle

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def get_extra_info(self, name: str) -> Any:
        return None

    def abort(self) -> None:
        self.closed = True

    def close(self) -> None:
        self.closed = True


def test_flush_stops_writing_once_the_transport_closed() -> None:
    """A write that fails closes the transport before ``connection_lost`` runs: ``flush``
    must not write again, neither the next part of the same flush (a large payload is
    written part by part) nor a later flush to that peer in the same loop iteration. A
    256-worker run logged 95 ``RuntimeError`` tracebacks from ``flush`` before."""
    async def main() -> None:
        conn = FramedConnection(lambda c, m: None, lambda c, e: None, DEFAULT_LIMITS)
        t = _FailingTransport()
        conn.connection_made(cast(asyncio.BaseTransport, t))
        big = np.zeros(2 * 65536, dtype="<f8")  # larger than one joined write: several parts
        conn.queue(CodedGradient(epoch=0, round=1, attempt=0, state_digest=b"d" * 8,
                                 compute_s=0.0, payload=big))
        conn.flush()  # first part fails and closes; the payload part must not be written
        assert t.writes == 1
        conn.queue(Ping(seq=1))  # a no-op once closing
        conn._wq.append(b"late")  # even a part queued before the close is not written
        conn.flush()
        assert t.writes == 1

    asyncio.run(main())
