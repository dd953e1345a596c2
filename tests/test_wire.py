"""aiogc.wire: round trips (property-based, any split) and every bad-input row of reliability.md
for the framing, msgpack and schema groups. No sockets."""

from __future__ import annotations

import ast
import struct
from dataclasses import fields
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aiogc.errors import FrameTooLarge, LocalProtocolError, MalformedFrame
from aiogc.messages import (
    KINDS,
    MAX_BLOB,
    MAX_INT,
    MAX_WORKERS,
    PROTOCOL_VERSION,
    ChunkReport,
    CodedGradient,
    Hello,
    Message,
    Ping,
    RoundStart,
)
from aiogc.wire import (
    DEFAULT_LIMITS,
    PREAUTH_LIMITS,
    FrameDecoder,
    FrameLimits,
    decode_frame_bytes,
    encode_frame,
    encode_frame_bytes,
)

# ----------------------------------------------------------------------------- helpers

_small_float = st.floats(min_value=0.0, max_value=1e12, allow_nan=False, allow_infinity=False)
_text = st.text(max_size=40)
_FIELD_STRATEGIES: dict[str, Any] = {
    "nonce": st.binary(min_size=16, max_size=MAX_BLOB),
    "mac": st.binary(max_size=MAX_BLOB),
    "state_digest": st.binary(max_size=MAX_BLOB),
    "epoch": st.integers(0, MAX_INT),
    "round": st.integers(0, MAX_INT),
    "attempt": st.integers(0, MAX_INT),
    "seq": st.integers(0, MAX_INT),
    "worker": st.integers(0, MAX_WORKERS - 1),
    "count": st.integers(0, MAX_WORKERS),
    "t_worker": _small_float,
    "elapsed_s": _small_float,
    "compute_s": _small_float,
    "net_delay_s": _small_float,
    "delays_s": st.lists(st.floats(min_value=0.0, allow_nan=False, allow_infinity=True),
                         max_size=20).map(tuple),
    "state": st.lists(st.integers(0, MAX_INT), max_size=20).map(tuple),
    "reason": _text,
    "code": _text,
    "status": _text,
    "config": st.dictionaries(
        st.text(max_size=64),
        st.one_of(st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), _text,
                  st.booleans(), st.none()),
        max_size=64,
    ),
}
_ARRAYS = st.one_of(
    hnp.arrays(np.dtype("<f4"), st.integers(0, 64), elements=st.floats(width=32)),
    hnp.arrays(np.dtype("<f8"), st.integers(0, 64), elements=st.floats(width=64)),
)

#: the wire version every hand-built header below carries
V = PROTOCOL_VERSION


def _message_strategy(cls: type[Message]) -> Any:
    kw = {f.name: (_ARRAYS if f.name == cls.array_field else _FIELD_STRATEGIES[f.name])
          for f in fields(cls)}
    return st.builds(cls, **kw)


ANY_MESSAGE = st.sampled_from(sorted(KINDS)).flatmap(lambda k: _message_strategy(KINDS[k]))


def same(a: Message, b: Message) -> bool:
    if type(a) is not type(b) or a.header_fields() != b.header_fields():
        return False
    x, y = a.array(), b.array()
    if x is None or y is None:
        return x is None and y is None
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def frame(header: Any, body: bytes = b"", *, packed: bytes | None = None) -> bytes:
    """A frame around an arbitrary header object (or pre-packed header bytes)."""
    if packed is None:
        packed = msgpack.packb(header, use_bin_type=True)
    return struct.pack(">I", len(packed)) + packed + body


def ping_header(**extra: Any) -> dict[str, Any]:
    return {"v": V, "kind": "ping", "seq": 1, **extra}


def cg_header(**over: Any) -> dict[str, Any]:
    h = {"v": V, "kind": "coded_gradient", "epoch": 0, "round": 3, "attempt": 0,
         "state_digest": b"12345678", "compute_s": 0.25, "dtype": "<f4", "n": 4}
    h.update(over)
    return {k: v for k, v in h.items() if v is not _DROP}


_DROP = object()


def rejects(data: bytes, code: str | None = None, limits: FrameLimits = DEFAULT_LIMITS,
            exc: type[MalformedFrame] = MalformedFrame) -> MalformedFrame:
    with pytest.raises(exc) as info:
        decode_frame_bytes(data, limits)
    if code is not None:
        assert info.value.code == code, info.value
    return info.value


def cg(n: int = 4, dtype: str = "<f4") -> CodedGradient:
    return CodedGradient(epoch=0, round=3, attempt=1, state_digest=b"d" * 8, compute_s=0.5,
                         payload=np.arange(n, dtype=dtype))


# ----------------------------------------------------------------------------- round trips


def test_every_kind_has_a_strategy() -> None:
    for cls in KINDS.values():
        for f in fields(cls):
            assert f.name == cls.array_field or f.name in _FIELD_STRATEGIES, (cls.kind, f.name)


@settings(derandomize=True, max_examples=400, deadline=None)
@given(msg=ANY_MESSAGE)
def test_round_trip_every_kind(msg: Message) -> None:
    data = encode_frame_bytes(msg)
    assert data == b"".join(bytes(p) for p in encode_frame(msg))
    assert same(decode_frame_bytes(data), msg)


@settings(derandomize=True, max_examples=200, deadline=None)
@given(msgs=st.lists(ANY_MESSAGE, min_size=1, max_size=6), data=st.data())
def test_round_trip_random_splits(msgs: list[Message], data: st.DataObject) -> None:
    stream = b"".join(encode_frame_bytes(m) for m in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    dec = FrameDecoder()
    out: list[Message] = []
    prev = 0
    for c in [*cuts, len(stream)]:
        out += dec.feed(stream[prev:c])
        prev = c
    assert dec.at_frame_boundary()
    assert len(out) == len(msgs) and all(same(a, b) for a, b in zip(out, msgs, strict=True))


@settings(derandomize=True, max_examples=200, deadline=None)
@given(msgs=st.lists(ANY_MESSAGE, min_size=1, max_size=4), data=st.data())
def test_round_trip_buffered_protocol_path(msgs: list[Message], data: st.DataObject) -> None:
    """Drive get_buffer/buffer_updated like a transport doing short reads."""
    stream = memoryview(b"".join(encode_frame_bytes(m) for m in msgs))
    dec = FrameDecoder()
    out: list[Message] = []
    while stream:
        buf = dec.get_buffer(-1)
        assert len(buf) > 0
        k = min(len(buf), len(stream), data.draw(st.integers(1, 300)))
        buf[:k] = stream[:k]
        del buf
        out += dec.buffer_updated(k)
        stream = stream[k:]
    assert dec.at_frame_boundary()
    assert all(same(a, b) for a, b in zip(out, msgs, strict=True)) and len(out) == len(msgs)


@settings(derandomize=True, max_examples=30, deadline=None)
@given(msgs=st.lists(ANY_MESSAGE, min_size=1, max_size=4))
def test_byte_at_a_time(msgs: list[Message]) -> None:
    frames = [encode_frame_bytes(m) for m in [*msgs, cg(33), cg(5, "<f8")]]
    ends = set(np.cumsum([len(f) for f in frames]).tolist())
    stream = b"".join(frames)
    dec = FrameDecoder()
    out: list[Message] = []
    for i in range(len(stream)):
        out += dec.feed(stream[i:i + 1])
        assert dec.at_frame_boundary() == (i + 1 in ends)
    assert len(out) == len(frames)
    assert all(same(a, b) for a, b in zip(out, [*msgs, cg(33), cg(5, "<f8")], strict=True))


def test_encode_does_not_copy_the_array() -> None:
    msg = cg(1000)
    head, view = encode_frame(msg)
    assert isinstance(head, bytes) and isinstance(view, memoryview)
    assert len(view) == msg.payload.nbytes
    assert np.shares_memory(np.frombuffer(view, dtype="<f4"), msg.payload)
    assert len(encode_frame(cg(0))) == 1  # empty array: no body part


def test_non_contiguous_and_empty_arrays_round_trip() -> None:
    base = np.arange(20, dtype="<f8")
    for arr in (base[::3], base[:0]):
        msg = RoundStart(epoch=1, round=2, delays_s=(0.0, float("inf")), net_delay_s=0.0,
                         model=arr)
        back = decode_frame_bytes(encode_frame_bytes(msg))
        assert isinstance(back, RoundStart)
        assert back.model.dtype == np.dtype("<f8") and np.array_equal(back.model, arr)
        assert back.delays_s == (0.0, float("inf"))


def test_alloc_receives_into_destination_zero_copy() -> None:
    dest = np.full(1000, -1.0, dtype="<f4")
    seen: list[tuple[str, dict[str, Any], np.dtype, int]] = []

    def alloc(kind: str, header: dict[str, Any], dtype: np.dtype, n: int) -> np.ndarray:
        seen.append((kind, header, dtype, n))
        return dest

    msg = cg(1000)
    head, view = encode_frame(msg)
    dec = FrameDecoder(alloc=alloc)
    assert dec.feed(head) == []
    assert seen == [("coded_gradient", {"epoch": 0, "round": 3, "attempt": 1,
                                        "state_digest": b"d" * 8, "compute_s": 0.5},
                     np.dtype("<f4"), 1000)]
    buf = dec.get_buffer(-1)  # the rest of the body goes straight into dest
    assert np.shares_memory(np.frombuffer(buf, dtype=np.uint8), dest)
    assert len(buf) == dest.nbytes
    buf[:] = view
    del buf
    (out,) = dec.buffer_updated(dest.nbytes)
    assert isinstance(out, CodedGradient) and out.payload is dest
    assert np.array_equal(dest, msg.payload)


def test_alloc_none_and_bad_alloc() -> None:
    data = encode_frame_bytes(cg(8))
    (m,) = FrameDecoder(alloc=lambda *a: None).feed(data)
    assert isinstance(m, CodedGradient) and np.array_equal(m.payload, np.arange(8))
    for bad in (np.empty(7, "<f4"), np.empty(8, "<f8"), np.empty(16, "<f4")[::2]):
        with pytest.raises(LocalProtocolError):
            FrameDecoder(alloc=lambda *a, b=bad: b).feed(data)


def test_alloc_may_refuse_and_poisons() -> None:
    def alloc(*a: Any) -> np.ndarray:
        raise MalformedFrame("wrong length for this worker", code="bad_length")

    dec = FrameDecoder(alloc=alloc)
    with pytest.raises(MalformedFrame) as info:
        dec.feed(encode_frame_bytes(cg(8)))
    assert info.value.code == "bad_length"
    with pytest.raises(MalformedFrame) as again:
        dec.feed(b"")
    assert again.value is info.value


def test_limits_can_be_raised_after_auth() -> None:
    dec = FrameDecoder(PREAUTH_LIMITS)
    hello = Hello(worker=3, nonce=b"n" * 32, mac=b"m" * 32, epoch=7)
    assert [m.kind for m in dec.feed(encode_frame_bytes(hello))] == ["hello"]
    dec.limits = DEFAULT_LIMITS
    (m,) = dec.feed(encode_frame_bytes(cg(100_000)))
    assert isinstance(m, CodedGradient)


def test_poisoned_decoder_raises_same_error_forever() -> None:
    dec = FrameDecoder()
    with pytest.raises(MalformedFrame) as first:
        dec.feed(b"\x00\x00\x00\x00")
    for call in (lambda: dec.feed(encode_frame_bytes(Ping(seq=1))), lambda: dec.get_buffer(10),
                 lambda: dec.buffer_updated(1), dec.at_frame_boundary):
        with pytest.raises(MalformedFrame) as again:
            call()
        assert again.value is first.value


def test_frame_limits_validate() -> None:
    for args in ((0, 0), (-1, 0), (10, -1), (True, 0), (2**32, 0)):
        with pytest.raises(LocalProtocolError):
            FrameLimits(*args)


def test_wire_is_sans_io() -> None:
    import aiogc.wire

    tree = ast.parse(Path(aiogc.wire.__file__).read_text())
    banned = {"asyncio", "socket", "time", "random", "multiprocessing", "selectors"}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        assert not {n.split(".")[0] for n in names} & banned, names


# ----------------------------------------------------------------------------- framing


def test_prefix_ffffffff_rejected_from_the_prefix_alone() -> None:
    dec = FrameDecoder()
    with pytest.raises(FrameTooLarge) as info:
        dec.feed(b"\xff\xff\xff\xff")  # no header byte needed: checked before buffering
    assert info.value.code == "header_too_large"


def test_header_over_the_cap() -> None:
    limits = FrameLimits(max_header_bytes=100, max_array_bytes=1000)
    ok = frame(ping_header(), packed=None)
    assert decode_frame_bytes(ok, limits).kind == "ping"
    big = frame({"v": V, "kind": "bye", "reason": "x" * 200})
    rejects(big, "header_too_large", limits, FrameTooLarge)
    rejects(big[:4], "header_too_large", limits, FrameTooLarge)  # from the prefix alone


def test_array_over_the_cap_rejected_before_body() -> None:
    limits = FrameLimits(max_header_bytes=1000, max_array_bytes=400)
    assert decode_frame_bytes(encode_frame_bytes(cg(100)), limits).kind == "coded_gradient"
    data = encode_frame_bytes(cg(101))
    h = struct.unpack(">I", data[:4])[0]
    dec = FrameDecoder(limits)
    with pytest.raises(FrameTooLarge) as info:
        dec.feed(data[:4 + h])  # header only: refused before any body byte / allocation
    assert info.value.code == "array_too_large"
    # a header claiming 2^60 float64 elements allocates nothing
    rejects(frame(cg_header(dtype="<f8", n=2**60)), "array_too_large", exc=FrameTooLarge)


def test_preauth_limits() -> None:
    hello = Hello(worker=65535, nonce=b"n" * MAX_BLOB, mac=b"m" * MAX_BLOB, epoch=MAX_INT)
    assert decode_frame_bytes(encode_frame_bytes(hello), PREAUTH_LIMITS).kind == "hello"
    rejects(encode_frame_bytes(cg(0)), "array_too_large", PREAUTH_LIMITS, FrameTooLarge)
    rejects(encode_frame_bytes(cg(4)), "array_too_large", PREAUTH_LIMITS, FrameTooLarge)
    rejects(frame({"v": V, "kind": "bye", "reason": "x" * 600}), "header_too_large",
            PREAUTH_LIMITS, FrameTooLarge)
    dec = FrameDecoder(PREAUTH_LIMITS)
    with pytest.raises(FrameTooLarge):
        dec.feed(struct.pack(">I", 513))


def test_zero_length_header() -> None:
    rejects(b"\x00\x00\x00\x00", "empty_header")
    rejects(b"\x00\x00\x00\x00" + encode_frame_bytes(Ping(seq=1)), "empty_header")


def test_truncated_frame_then_eof() -> None:
    for data in (encode_frame_bytes(Ping(seq=5)), encode_frame_bytes(cg(50))):
        for cut in (1, 3, 4, 5, len(data) - 1):
            dec = FrameDecoder()
            assert dec.feed(data[:cut]) == []
            assert not dec.at_frame_boundary()
            rejects(data[:cut], "truncated")
    assert FrameDecoder().at_frame_boundary()


def test_extra_bytes_after_one_frame() -> None:
    one = encode_frame_bytes(Ping(seq=1))
    rejects(one + one, "frame_count")
    rejects(one + b"\x00", "truncated")


_HTTP = b"GET / HTTP/1.1\r\nHost: localhost\r\nUser-Agent: curl/8\r\nAccept: */*\r\n\r\n"
_TLS_HELLO = bytes.fromhex(
    "16030100f4010000f00303" + "ab" * 32 + "20" + "cd" * 32 + "0026c02bc02fc02cc030cca9cca8"
    "c009c013c00ac014009c009d002f0035c012000a130113021303010000810000000e000c0000096c6f63"
    "616c686f7374")


@pytest.mark.parametrize("limits", [PREAUTH_LIMITS, DEFAULT_LIMITS])
@pytest.mark.parametrize("blob", [_HTTP, _TLS_HELLO, b"SSH-2.0-OpenSSH_9.6\r\n", b"\r\n\r\n"])
def test_foreign_protocols(blob: bytes, limits: FrameLimits) -> None:
    dec = FrameDecoder(limits)
    with pytest.raises(MalformedFrame):
        dec.feed(blob)


def test_random_bytes() -> None:
    rng = np.random.default_rng(1234)
    for _ in range(2000):
        data = rng.bytes(int(rng.integers(1, 200)))
        dec = FrameDecoder(PREAUTH_LIMITS if rng.random() < 0.5 else DEFAULT_LIMITS)
        try:
            out = dec.feed(data)
        except MalformedFrame:
            continue
        assert out == []  # random bytes never form a valid message (here: only a prefix)


# ----------------------------------------------------------------------------- msgpack


def test_invalid_byte_c1() -> None:
    rejects(frame(None, packed=b"\xc1"), "bad_msgpack")
    packed = msgpack.packb(ping_header())
    rejects(frame(None, packed=packed[:-1] + b"\xc1"), "bad_msgpack")


def test_trailing_bytes_in_header() -> None:
    packed = msgpack.packb(ping_header(), use_bin_type=True)
    rejects(frame(None, packed=packed + b"\x00"), "trailing_bytes")
    rejects(frame(None, packed=packed + packed), "trailing_bytes")


def test_header_truncated_inside_msgpack() -> None:
    packed = msgpack.packb(ping_header(), use_bin_type=True)
    rejects(frame(None, packed=packed[:-1]), "bad_msgpack")


def test_deep_nesting() -> None:
    depth = 100_000
    nested = b"\x91" * depth + b"\x00"  # [[[[...0]]]]
    packed = b"\x83\xa1v\x02\xa4kind\xa3bye\xa6reason" + nested
    rejects(frame(None, packed=packed), "bad_msgpack")
    shallow = b"\x91" * 50 + b"\x00"
    rejects(frame(None, packed=b"\x83\xa1v\x02\xa4kind\xa3bye\xa6reason" + shallow), "bad_field")


def test_array32_claiming_huge_count_in_tiny_body() -> None:
    for claim in (b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff",
                  b"\xc6\xff\xff\xff\xff"):
        packed = b"\x83\xa1v\x02\xa4kind\xa3bye\xa6reason" + claim + b"\x00"
        rejects(frame(None, packed=packed), "bad_msgpack")
        rejects(frame(None, packed=claim), "bad_msgpack")


def test_non_str_map_keys() -> None:
    rejects(frame({1: 1, "v": V, "kind": "ping", "seq": 1}), "bad_msgpack")
    # strict_map_key lets bytes keys through msgpack; the exact schema refuses them
    rejects(frame({b"v": V, "kind": "ping", "seq": 1}), "bad_header")
    rejects(frame({"v": V, "kind": "ping", "seq": 1, b"seq": 1}), "bad_schema")
    cfg = {"v": V, "kind": "welcome", "epoch": 0, "worker": 0, "mac": b"", "config": {2: 3}}
    rejects(frame(cfg), "bad_msgpack")


def test_thousands_of_map_keys() -> None:
    rejects(frame(ping_header(**{f"k{i}": i for i in range(5000)})), "bad_msgpack")
    rejects(frame(ping_header(**{f"k{i}": i for i in range(20)})), "bad_schema")


def test_invalid_utf8() -> None:
    packed = b"\x83\xa1v\x02\xa4kind\xa3bye\xa6reason\xa2\xff\xfe"
    rejects(frame(None, packed=packed), "bad_msgpack")
    rejects(frame(None, packed=b"\x83\xa1v\x02\xa4kind\xa3b\xffe\xa6reason\xa0"), "bad_msgpack")


def test_ext_types() -> None:
    for ext in (msgpack.ExtType(5, b"abc"), msgpack.ExtType(0, b""),
                msgpack.Timestamp(1, 0)):
        packed = msgpack.packb({"v": V, "kind": "bye", "reason": ext})
        err = rejects(frame(None, packed=packed))
        assert err.code in {"ext_type", "bad_msgpack"}
    rejects(frame(None, packed=msgpack.packb(ping_header(x=msgpack.ExtType(1, b"x")))),
            "ext_type")
    head = b"\x83\xa1v\x02\xa4kind\xa3bye\xa6reason"
    for raw_ext in (b"\xd6\xff\x00\x00\x00\x01", b"\xc7\x00\xff", b"\xc7\x00\x05"):
        rejects(frame(None, packed=head + raw_ext))


def test_oversized_str_and_bin_in_header() -> None:
    rejects(frame({"v": V, "kind": "bye", "reason": "x" * 5000}), "bad_msgpack")
    rejects(frame({"v": V, "kind": "ping", "seq": 1, "x": b"y" * 100}), "bad_msgpack")
    rejects(frame({"v": V, "kind": "bye", "reason": "x" * 2000}), "bad_field")


# ----------------------------------------------------------------------------- schema


def test_wrong_top_level_type() -> None:
    for obj in ([1, "ping", 1], "ping", 7, None, b"\x01"):
        rejects(frame(obj), "bad_header")


def test_missing_and_unknown_fields() -> None:
    rejects(frame({"v": V, "kind": "ping"}), "bad_schema")
    rejects(frame(ping_header(extra=1)), "bad_schema")
    rejects(frame(cg_header(round=_DROP)), "bad_schema", )
    rejects(frame(cg_header(payload=b"x")), "bad_schema")  # the array field is never a key


@pytest.mark.parametrize("value", [True, False, 1.0, -1, 2**53 + 1, "1", None, [1]])
def test_wrong_round_values(value: Any) -> None:
    h = {"v": V, "kind": "chunk_report", "epoch": 0, "round": value, "count": 1,
         "t_worker": 0.0, "elapsed_s": 0.0}
    rejects(frame(h), "bad_field")


def test_float_fields_accept_int_but_not_bool() -> None:
    h = {"v": V, "kind": "chunk_report", "epoch": 0, "round": 1, "count": 1,
         "t_worker": 3, "elapsed_s": 0.5}
    msg = decode_frame_bytes(frame(h))
    assert isinstance(msg, ChunkReport) and msg.t_worker == 3.0 and type(msg.t_worker) is float
    rejects(frame({**h, "t_worker": True}), "bad_field")
    rejects(frame({**h, "t_worker": float("nan")}), "bad_field")


def test_unknown_kind_and_versions() -> None:
    rejects(frame({"v": V, "kind": "launch_missiles", "seq": 1}), "unknown_kind")
    rejects(frame({"v": V, "kind": 3, "seq": 1}), "unknown_kind")
    rejects(frame({"v": V, "seq": 1}), "unknown_kind")
    rejects(frame({"v": PROTOCOL_VERSION + 1, "kind": "ping", "seq": 1}), "bad_version")
    rejects(frame({"v": 1, "kind": "ping", "seq": 1}), "bad_version")  # version 1 peers
    rejects(frame({"v": 0, "kind": "ping", "seq": 1}), "bad_version")
    rejects(frame({"kind": "ping", "seq": 1}), "bad_header")
    rejects(frame({"v": "1", "kind": "ping", "seq": 1}), "bad_header")
    rejects(frame({"v": True, "kind": "ping", "seq": 1}), "bad_header")


@pytest.mark.parametrize("dtype", ["|O", ">f8", ">f4", "<f2", "<i8", "O", "float32", "", 4])
def test_array_dtype_not_whitelisted(dtype: Any) -> None:
    rejects(frame(cg_header(dtype=dtype), b"\x00" * 16), "bad_dtype")


def test_array_header_bad_n() -> None:
    rejects(frame(cg_header(dtype=_DROP), b"\x00" * 16), "bad_dtype")
    for n in (_DROP, -1, True, 4.0, "4"):
        rejects(frame(cg_header(n=n), b"\x00" * 16), "bad_schema")


def test_body_length_mismatch() -> None:
    body = np.arange(4, dtype="<f4").tobytes()
    assert decode_frame_bytes(frame(cg_header(), body)).kind == "coded_gradient"
    rejects(frame(cg_header(), body[:-1]), "truncated")  # short body, then EOF
    dec = FrameDecoder()
    assert dec.feed(frame(cg_header(n=5), body)) == [] and not dec.at_frame_boundary()
    # a long body: the extra bytes are read as the next frame's prefix
    rejects(frame(cg_header(n=3), body))
    dec = FrameDecoder()
    out = dec.feed(frame(cg_header(n=3), body) + encode_frame_bytes(Ping(seq=1)))
    assert [m.kind for m in out] == ["coded_gradient"]  # the ping is swallowed by a bogus H
    assert not dec.at_frame_boundary()


def test_array_on_a_kind_without_array() -> None:
    rejects(frame(ping_header(dtype="<f4", n=0)), "bad_schema")
    rejects(frame(ping_header(dtype="<f4", n=4), b"\x00" * 16), "bad_schema")


def test_context_free_ranges() -> None:
    base = {"v": V, "kind": "hello", "worker": 0, "nonce": b"n" * 16, "mac": b"", "epoch": 0}
    assert decode_frame_bytes(frame(base)).kind == "hello"
    rejects(frame({**base, "nonce": b"short"}), "bad_field")
    rejects(frame({**base, "worker": MAX_WORKERS}), "bad_field")
    rejects(frame({**base, "nonce": "text"}), "bad_field")
    rejects(frame({**base, "epoch": -1}), "bad_field")
    st_ = {"v": V, "kind": "encode_and_transmit", "epoch": 0, "round": 0, "attempt": 0}
    rejects(frame({**st_, "state": [1, -2]}), "bad_field")
    rejects(frame({**st_, "state": [1, True]}), "bad_field")
    rejects(frame({**st_, "state": list(range(MAX_WORKERS + 1))}), "bad_msgpack")


def test_one_message_at_a_time_lets_the_caller_act_between_frames() -> None:
    hello = Hello(worker=3, nonce=b"n" * 32, mac=b"m" * 32, epoch=7)
    stream = encode_frame_bytes(hello) + encode_frame_bytes(cg(64)) + b"\x00\x00"
    dec = FrameDecoder(PREAUTH_LIMITS)
    buf = dec.get_buffer(len(stream))
    buf[: len(stream)] = stream
    del buf
    assert [m.kind for m in dec.buffer_updated(len(stream), max_messages=1)] == ["hello"]
    dec.limits = DEFAULT_LIMITS  # e.g. the handshake succeeded: the next frame may be large
    nxt = dec.next_message()
    assert isinstance(nxt, CodedGradient) and np.array_equal(nxt.payload, np.arange(64))
    assert dec.next_message() is None and not dec.at_frame_boundary()
    # without the pause, the second frame is judged by the pre-auth limits
    with pytest.raises(FrameTooLarge):
        FrameDecoder(PREAUTH_LIMITS).feed(stream)
