"""aiogc.protocol.wire: round trips (property-based, any split) and every bad input of the
framing, msgpack and schema groups (docs/protocol.md §2.4), in protocol version 5 (each body
one msgpack array ``[version, kind, fields...]``, an array kind's payload a bin32 last).
No sockets."""

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
from aiogc.protocol.headers import (
    DEFAULT_LIMITS,
    KIND_CODES,
    PREAUTH_LIMITS,
    WIRE_FIELDS,
    FrameLimits,
)
from aiogc.protocol.messages import (
    KINDS,
    MAX_BLOB,
    MAX_INT,
    MAX_WORKERS,
    PROTOCOL_VERSION,
    ChunkGradient,
    ChunkReport,
    CodedGradient,
    EncodeAndTransmit,
    Hello,
    Message,
    Ping,
    Pong,
    Ready,
    Resume,
    RoundStart,
)
from aiogc.protocol.tags import FrameAuth
from aiogc.protocol.wire import FrameDecoder, decode_frame_bytes, encode_frame, encode_frame_bytes

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
    "chunk": st.integers(0, MAX_WORKERS - 1),
    "count": st.integers(0, MAX_WORKERS),
    "t_worker": _small_float,
    "elapsed_s": _small_float,
    "compute_s": _small_float,
    "net_delay_s": _small_float,
    "delays_s": st.lists(st.floats(min_value=0.0, allow_nan=False, allow_infinity=True),
                         max_size=20).map(tuple),
    "state": st.lists(st.integers(0, MAX_WORKERS), max_size=20).map(tuple),
    # round_start's adaptive-order extension (empty: absent on the wire)
    "orders": st.lists(st.integers(0, MAX_WORKERS - 1), max_size=20).map(tuple),
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


def raw_frame(head: bytes, payload: bytes = b"", *, claim: int | None = None) -> bytes:
    """A frame around arbitrary body bytes: ``head`` then ``payload``; the prefix counts both,
    or ``len(head) + claim`` (a payload of ``claim`` bytes announced, ``payload`` sent)."""
    size = len(head) + (len(payload) if claim is None else claim)
    return struct.pack(">I", size) + head + payload


def mp_frame(kind: str, obj: Any = None, body: bytes = b"", *, packed: bytes | None = None,
             version: int = V) -> bytes:
    """A frame of ``kind`` whose values after the kind code are ``obj`` (a list, one value per
    field) or the pre-packed bytes ``packed`` (the array header counts the kind's fields)."""
    if packed is None:
        values = obj if isinstance(obj, list) else [obj]
        packed_values: bytes = msgpack.packb([version, KIND_CODES[kind], *values],
                                              use_bin_type=True)
        return raw_frame(packed_values, body)
    count = len(WIRE_FIELDS[kind]) + 2
    return raw_frame(bytes([0x90 | count, version, KIND_CODES[kind]]) + packed, body)


def head_of(kind: str, values: dict[str, Any]) -> bytes:
    """The body of ``kind`` up to its payload from raw values (any value msgpack can carry,
    in range or not): ``values`` names every field before the payload (an array kind's
    ``dtype`` code included); an array kind's head ends with a bin32 of ``values["nbytes"]``."""
    names = [n for n, c in WIRE_FIELDS[kind] if c.tag != "payload"]
    head: bytes = msgpack.packb([V, KIND_CODES[kind], *(values[n] for n in names)],
                                use_bin_type=True)
    if len(names) == len(WIRE_FIELDS[kind]):
        return head
    return bytes([head[0] + 1]) + head[1:] + struct.pack(">BI", 0xC6, values["nbytes"])


def cg_frame(body: bytes = b"", digest: bytes = b"12345678", **over: Any) -> bytes:
    values = {"epoch": 0, "round": 3, "attempt": 0, "compute_s": 0.25, "dtype": 4, "n": 4,
              "state_digest": digest, **over}
    itemsize = {2: 2, 0x82: 2, 8: 8}.get(values["dtype"], 4)
    values["nbytes"] = values["n"] * itemsize
    return raw_frame(head_of("coded_gradient", values), body, claim=values["nbytes"])


def bye_map(**extra: Any) -> bytes:
    """The packed values of a bye after its kind code (``extra``: values after them)."""
    packed: bytes = msgpack.packb("x", use_bin_type=True)
    return packed + b"".join(msgpack.packb(v, use_bin_type=True) for v in extra.values())


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


@pytest.mark.parametrize("module", ["wire", "headers", "tags"])
def test_wire_is_sans_io(module: str) -> None:
    import importlib

    mod = importlib.import_module(f"aiogc.protocol.{module}")
    tree = ast.parse(Path(str(mod.__file__)).read_text())
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
    ok = encode_frame_bytes(Ping(seq=1))
    assert decode_frame_bytes(ok, limits).kind == "ping"
    big = mp_frame("bye", "x" * 600)
    rejects(big, "header_too_large", limits, FrameTooLarge)
    # from the prefix and the kind alone (a body that large could be an array kind's)
    rejects(big[:7], "header_too_large", limits, FrameTooLarge)
    rejects(big[:4], "header_too_large", PREAUTH_LIMITS, FrameTooLarge)  # no arrays: prefix


def test_array_over_the_cap_rejected_before_body() -> None:
    limits = FrameLimits(max_header_bytes=1000, max_array_bytes=400)
    assert decode_frame_bytes(encode_frame_bytes(cg(100)), limits).kind == "coded_gradient"
    data = encode_frame_bytes(cg(101))
    h = struct.unpack(">I", data[:4])[0]
    dec = FrameDecoder(limits)
    with pytest.raises(FrameTooLarge) as info:
        dec.feed(data[:4 + h])  # header only: refused before any body byte / allocation
    assert info.value.code == "array_too_large"
    # a head claiming 2^32 - 8 bytes of float64 elements allocates nothing (its prefix,
    # which must count them, is refused first; a prefix that fits, by the payload's bound)
    rejects(cg_frame(dtype=8, n=2**29 - 16)[:64], exc=FrameTooLarge)
    rejects(cg_frame(dtype=8, n=150)[:80], "array_too_large", limits, FrameTooLarge)


def test_preauth_limits() -> None:
    hello = Hello(worker=65535, nonce=b"n" * MAX_BLOB, mac=b"m" * MAX_BLOB, epoch=MAX_INT)
    assert decode_frame_bytes(encode_frame_bytes(hello), PREAUTH_LIMITS).kind == "hello"
    rejects(encode_frame_bytes(cg(0)), "array_too_large", PREAUTH_LIMITS, FrameTooLarge)
    rejects(encode_frame_bytes(cg(4)), "array_too_large", PREAUTH_LIMITS, FrameTooLarge)
    rejects(mp_frame("bye", "x" * 600), "header_too_large",
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
@pytest.mark.parametrize("blob", [_HTTP, _TLS_HELLO, b"SSH-2.0-OpenSSH_9.6\r\n",
                                  b"\r\n\r\n\r\n\r\n"])
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
    rejects(mp_frame("bye", packed=b"\xc1"), "bad_msgpack")
    rejects(mp_frame("bye", packed=bye_map()[:-1] + b"\xc1"), "bad_msgpack")


def test_trailing_bytes_in_header() -> None:
    rejects(mp_frame("bye", packed=bye_map() + b"\x00"), "trailing_bytes")
    rejects(mp_frame("bye", packed=bye_map() + bye_map()), "trailing_bytes")


def test_header_truncated_inside_msgpack() -> None:
    rejects(mp_frame("bye", packed=bye_map()[:-1]), "bad_msgpack")
    rejects(mp_frame("bye", packed=b""), "bad_msgpack")  # preamble only


_BYE_KEY = b""  # a bye's values start right after its kind code


def test_deep_nesting() -> None:
    depth = 100_000
    nested = b"\x91" * depth + b"\x00"  # [[[[...0]]]]
    rejects(mp_frame("bye", packed=_BYE_KEY + nested), "bad_msgpack")
    shallow = b"\x91" * 50 + b"\x00"
    rejects(mp_frame("bye", packed=_BYE_KEY + shallow), "bad_field")


def test_array32_claiming_huge_count_in_tiny_body() -> None:
    for claim in (b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff",
                  b"\xc6\xff\xff\xff\xff"):
        rejects(mp_frame("bye", packed=_BYE_KEY + claim + b"\x00"), "bad_msgpack")
        rejects(mp_frame("bye", packed=claim), "bad_msgpack")


def test_non_str_map_keys() -> None:
    rejects(mp_frame("bye", ["x", {1: 1, "reason": "x"}]), "bad_msgpack")
    # strict_map_key lets bytes keys through msgpack; the exact schema refuses them
    welcome = [0, 0, b"", {b"reason": "x"}]
    rejects(mp_frame("welcome", welcome), "bad_field")
    rejects(mp_frame("bye", [{"reason": "x", b"reason": "x"}]), "bad_field")
    rejects(mp_frame("welcome", [0, 0, b"", {2: 3}]), "bad_msgpack")


def test_thousands_of_map_keys() -> None:
    many = {f"k{i}": i for i in range(5000)}
    rejects(mp_frame("welcome", [0, 0, b"", many]), "bad_msgpack")
    rejects(mp_frame("bye", ["x", {f"k{i}": i for i in range(20)}]), "bad_schema")
    rejects(mp_frame("welcome", [0, 0, b"", {f"k{i}": i for i in range(65)}]), "bad_field")


def test_invalid_utf8() -> None:
    rejects(mp_frame("bye", packed=_BYE_KEY + b"\xa2\xff\xfe"), "bad_msgpack")
    rejects(mp_frame("welcome", packed=b"\x00\x00\xc4\x00\x81\xa6r\xffason\xa0"),
            "bad_msgpack")


def test_ext_types() -> None:
    for ext in (msgpack.ExtType(5, b"abc"), msgpack.ExtType(0, b""),
                msgpack.Timestamp(1, 0)):
        err = rejects(mp_frame("bye", packed=msgpack.packb(ext)))
        assert err.code in {"ext_type", "bad_msgpack"}
    rejects(mp_frame("bye", ["x", msgpack.ExtType(1, b"x")]), "ext_type")
    for raw_ext in (b"\xd6\xff\x00\x00\x00\x01", b"\xc7\x00\xff", b"\xc7\x00\x05"):
        rejects(mp_frame("bye", packed=_BYE_KEY + raw_ext))


def test_oversized_str_and_bin_in_header() -> None:
    rejects(mp_frame("bye", "x" * 5000), "bad_msgpack")
    rejects(mp_frame("bye", ["x", b"y" * 100]), "bad_msgpack")
    rejects(mp_frame("bye", "x" * 2000), "bad_field")


# ----------------------------------------------------------------------------- schema


def test_wrong_top_level_type() -> None:
    for obj in ("bye", 7, None, b"\x01", 1.5):
        rejects(raw_frame(msgpack.packb(obj) + b"\x00\x00"), "bad_header")


def test_missing_and_unknown_fields() -> None:
    rejects(mp_frame("bye", []), "bad_schema")
    rejects(mp_frame("bye", ["x", 1]), "bad_schema")
    rejects(mp_frame("hello", [0, b"n" * 16, b""]), "bad_schema")
    # no dtype or payload after a kind without an array
    rejects(mp_frame("bye", ["x", V]), "bad_schema")
    rejects(mp_frame("bye", ["x", 4, b""]), "bad_schema")


@pytest.mark.parametrize("value", [True, False, 1.0, -1, 2**53 + 1, "1", None, [1]])
def test_wrong_int_values_in_a_msgpack_kind(value: Any) -> None:
    err = rejects(mp_frame("hello", [0, b"n" * 16, b"", value]), "bad_field")
    assert "hello.epoch" in str(err)


def test_float_fields_accept_int_but_not_bool() -> None:
    # in the constructor (messages built from values not yet checked) and on the wire (NaN,
    # inf and negatives: test_hot_* below)
    msg = ChunkReport(epoch=0, round=1, count=1, t_worker=3, elapsed_s=0.5)
    assert msg.t_worker == 3.0 and type(msg.t_worker) is float
    back = decode_frame_bytes(encode_frame_bytes(msg))
    assert isinstance(back, ChunkReport) and type(back.t_worker) is float
    wire_int = decode_frame_bytes(mp_frame("chunk_report", [0, 1, 1, 3, 0.5]))
    assert isinstance(wire_int, ChunkReport) and type(wire_int.t_worker) is float
    rejects(mp_frame("chunk_report", [0, 1, 1, True, 0.5]), "bad_field")
    for bad in (True, float("nan"), -0.5, float("inf")):
        with pytest.raises(MalformedFrame):
            ChunkReport(epoch=0, round=1, count=1, t_worker=bad, elapsed_s=0.5)


def test_unknown_kind_and_versions() -> None:
    ping = encode_frame_bytes(Ping(seq=1))
    for code in (0, 17, 99, 255):
        err = rejects(raw_frame(bytes([0x93, V, code]) + ping[7:]), "unknown_kind")
        assert str(code) in str(err)
    for version in (V + 1, 2, 1, 0, 255):
        rejects(raw_frame(bytes([0x93, version]) + ping[6:]), "bad_version")
    # a version-2 peer's header (a msgpack map with "v": 2) is a version error, not garbage
    err = rejects(raw_frame(msgpack.packb({"v": 2, "kind": "ping", "seq": 1})), "bad_version")
    assert "version 1/2" in str(err)
    # a version-4 frame (its body starts with the version byte) likewise
    err = rejects(raw_frame(bytes([4, KIND_CODES["ping"]]) + bytes(8)), "bad_version")
    assert "version 4" in str(err)
    rejects(raw_frame(bytes([0x93, V])), "bad_header")  # a body of 2 bytes: no kind


def test_kind_codes_are_fixed() -> None:
    """The kind bytes are part of the wire format (docs/protocol.md): never renumbered."""
    assert KIND_CODES == {
        "challenge": 1, "hello": 2, "welcome": 3, "ready": 4, "round_start": 5,
        "chunk_report": 6, "encode_and_transmit": 7, "coded_gradient": 8, "resume": 9,
        "round_end": 10, "bye": 11, "error": 12, "shutdown": 13, "ping": 14, "pong": 15,
        "chunk_gradient": 16}
    assert PROTOCOL_VERSION == 5


def test_chunk_gradient_carries_full_payloads_only() -> None:
    """A streamed chunk travels in the payload dtype: a 16-bit one is refused even where
    coded_gradient may carry it, and one chunk index outside the range is a bad field."""
    half = FrameLimits(1 << 20, 1 << 20, half_payloads=True)
    ok = ChunkGradient(epoch=1, round=2, chunk=5, compute_s=0.5, elapsed_s=0.75,
                       payload=np.arange(3.0))
    assert same(decode_frame_bytes(encode_frame_bytes(ok), half), ok)
    raw = bytearray(encode_frame_bytes(ok))
    at = raw.index(bytes([8, 0xC6]))  # the dtype code before the payload's bin32
    raw[at] = 2
    raw[at + 2:at + 6] = (12).to_bytes(4, "big")  # the same bytes as 6 float16 values
    err = rejects(bytes(raw), "bad_dtype", limits=half)
    assert "chunk_gradient.dtype" in str(err)
    with pytest.raises(MalformedFrame, match="chunk"):
        ChunkGradient(epoch=1, round=2, chunk=MAX_WORKERS, compute_s=0.5, elapsed_s=0.75,
                      payload=np.arange(3.0))


@pytest.mark.parametrize("code", [0, 1, 2, 3, 5, 16, 255, 0x82])
def test_array_dtype_not_whitelisted(code: int) -> None:
    err = rejects(cg_frame(b"\x00" * 16, dtype=code), "bad_dtype")
    assert "coded_gradient.dtype" in str(err)


def test_body_length_mismatch() -> None:
    body = np.arange(4, dtype="<f4").tobytes()
    assert decode_frame_bytes(cg_frame(body)).kind == "coded_gradient"
    rejects(cg_frame(body[:-1]), "truncated")  # short body, then EOF
    dec = FrameDecoder()
    assert dec.feed(cg_frame(body, n=5)) == [] and not dec.at_frame_boundary()
    # a long body: the extra bytes are read as the next frame's prefix
    rejects(cg_frame(body, n=3))
    dec = FrameDecoder()
    out = dec.feed(cg_frame(body, n=3))
    assert [m.kind for m in out] == ["coded_gradient"]
    assert not dec.at_frame_boundary()  # the last 4 body bytes: a bogus prefix
    with pytest.raises(MalformedFrame):  # the ping is read as that bogus frame's body
        dec.feed(encode_frame_bytes(Ping(seq=1)))


def test_context_free_ranges() -> None:
    base = {"worker": 0, "nonce": b"n" * 16, "mac": b"", "epoch": 0}
    assert decode_frame_bytes(mp_frame("hello", list(base.values()))).kind == "hello"
    rejects(mp_frame("hello", list({**base, "nonce": b"short"}.values())), "bad_field")
    rejects(mp_frame("hello", list({**base, "worker": MAX_WORKERS}.values())), "bad_field")
    rejects(mp_frame("hello", list({**base, "nonce": "text"}.values())), "bad_field")
    rejects(mp_frame("hello", list({**base, "epoch": -1}.values())), "bad_field")


# ------------------------------------------------------------------- the per-round kinds, per field

#: one valid message per per-round kind (array kinds with a 3-element body)
_VALID: dict[str, Message] = {
    "ready": Ready(epoch=5),
    "ping": Ping(seq=5),
    "pong": Pong(seq=5),
    "resume": Resume(epoch=1, round=2, attempt=3),
    "chunk_report": ChunkReport(epoch=1, round=2, count=3, t_worker=4.5, elapsed_s=0.25),
    "encode_and_transmit": EncodeAndTransmit(epoch=1, round=2, attempt=0, state=(1, 0, 2)),
    "round_start": RoundStart(epoch=1, round=2, delays_s=(0.5, float("inf")), net_delay_s=0.0,
                              model=np.arange(3, dtype="<f8")),
    "coded_gradient": CodedGradient(epoch=1, round=2, attempt=0, state_digest=b"d" * 8,
                                    compute_s=0.5, payload=np.arange(3, dtype="<f4")),
}
HOT = sorted(_VALID)
#: out-of-range values msgpack can carry, by the field's wire form
_U53_BAD: list[Any] = [2**53 + 1, 2**63, 2**64 - 1, -1]
_F64_BAD: list[Any] = [float("nan"), float("inf"), -float("inf"), -1.0, -5e-324]


def _fixed_values(msg: Message) -> dict[str, Any]:
    """The wire values of a valid message, by field name (an array kind's ``dtype`` code and
    payload ``nbytes`` included)."""
    out: dict[str, Any] = {n: list(v) if isinstance(v, tuple) else v
                           for n in msg._names if (v := getattr(msg, n)) is not msg.array()}
    arr = msg.array()
    if arr is not None:
        out["dtype"] = arr.dtype.itemsize
        out["nbytes"] = arr.nbytes
    return out


def _body(msg: Message) -> bytes:
    arr = msg.array()
    return b"" if arr is None else arr.tobytes()


@pytest.mark.parametrize("kind", HOT)
def test_hot_helpers_rebuild_the_encoder_bytes(kind: str) -> None:
    """The test's own table-driven builder (plain msgpack) agrees byte for byte with
    encode_frame_bytes, and plain msgpack reads the whole frame back."""
    msg = _VALID[kind]
    built = raw_frame(head_of(kind, _fixed_values(msg)), _body(msg))
    assert built == encode_frame_bytes(msg)
    assert same(decode_frame_bytes(built), msg)
    back = msgpack.unpackb(built[4:])
    assert back[:2] == [V, KIND_CODES[kind]] and len(back) == len(WIRE_FIELDS[kind]) + 2
    if msg.array() is not None:
        assert back[-1] == _body(msg)


def _bad_cases() -> list[Any]:
    cases: list[Any] = []
    for kind in HOT:
        for name, checker in WIRE_FIELDS[kind]:
            if checker.tag not in ("uint", "float"):
                continue
            if checker.tag == "float":
                bad = _F64_BAD
            elif name == "count":
                bad = [MAX_WORKERS + 1, 2**32 - 1]
            else:
                bad = _U53_BAD
            cases += [pytest.param(kind, name, v, id=f"{kind}.{name}={v!r}") for v in bad]
    return cases


@pytest.mark.parametrize(("kind", "name", "value"), _bad_cases())
def test_hot_field_out_of_range_names_the_field(kind: str, name: str, value: Any) -> None:
    msg = _VALID[kind]
    values = {**_fixed_values(msg), name: value}
    err = rejects(raw_frame(head_of(kind, values), _body(msg)), "bad_field")
    assert f"{kind}.{name}=" in str(err)
    # the schema (the validating constructor) refuses the same value
    with pytest.raises(MalformedFrame):
        type(msg)(**{**{f: getattr(msg, f) for f in msg._names}, name: value})


@pytest.mark.parametrize(("kind", "field", "entry"), [
    ("encode_and_transmit", "state", MAX_WORKERS + 1),
    ("encode_and_transmit", "state", 2**32 - 1),
    ("encode_and_transmit", "state", -1),
    ("round_start", "delays_s", float("nan")),
    ("round_start", "delays_s", -1.0),
    ("round_start", "delays_s", -float("inf")),
    ("round_start", "orders", MAX_WORKERS),
])
def test_hot_list_entry_out_of_range(kind: str, field: str, entry: Any) -> None:
    msg = _VALID[kind]
    values = {**_fixed_values(msg), field: [entry]}
    err = rejects(raw_frame(head_of(kind, values), _body(msg)), "bad_field")
    assert f"{kind}.{field}=" in str(err)


@pytest.mark.parametrize("kind", HOT)
def test_hot_wrong_field_count_names_the_kind_or_field(kind: str) -> None:
    msg = _VALID[kind]
    values = _fixed_values(msg)
    body = _body(msg)
    head = head_of(kind, values)
    if msg.array() is None:  # one value fewer, one more
        wrong = [head[:-len(msgpack.packb(list(values.values())[-1]))],
                 bytes([head[0] + 1]) + head[1:] + msgpack.packb(0)]
        wrong[0] = bytes([wrong[0][0] - 1]) + wrong[0][1:]
    else:  # no dtype code; a second one
        code = msgpack.packb(values["dtype"])
        cut = head.index(code + b"\xc6")
        wrong = [bytes([head[0] - 1]) + head[1:cut] + head[cut + 1:],
                 bytes([head[0] + 1]) + head[1:cut] + code + head[cut:]]
    for cut_head in wrong:
        err = rejects(raw_frame(cut_head, body), "bad_schema")
        assert kind in str(err)
    for field, longest in (("state", MAX_WORKERS), ("delays_s", MAX_WORKERS),
                           ("state_digest", MAX_BLOB)):
        if field in values:
            too_long: Any = (b"d" if field == "state_digest" else [0]) * (longest + 1)
            err = rejects(raw_frame(head_of(kind, {**values, field: too_long}), body),
                          "bad_msgpack" if field == "state_digest" else "bad_field")
            assert (kind if field == "state_digest" else f"{kind}.{field}") in str(err)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(data=st.data())
def test_hot_decode_agrees_with_the_schema(data: st.DataObject) -> None:
    """Any wire values of a per-round kind (edge values included) decode iff the validating
    constructor accepts the same field values: the codec's bounds are the schema's."""
    kind = data.draw(st.sampled_from(HOT))
    msg = _VALID[kind]
    values = _fixed_values(msg)
    for name, checker in WIRE_FIELDS[kind]:
        if checker.tag == "uint":
            values[name] = data.draw(st.sampled_from([0, 1, MAX_WORKERS, MAX_WORKERS + 1,
                                                      MAX_INT - 1, MAX_INT, MAX_INT + 1,
                                                      2**64 - 1, -1]))
        elif checker.tag == "float":
            values[name] = data.draw(st.floats(width=64) | st.sampled_from([0.0, -0.0, 5e-324,
                                                                            -5e-324, 0, 7]))
    try:
        type(msg)(**{**{f: getattr(msg, f) for f in msg._names},
                     **{k: v for k, v in values.items() if k in msg._names
                        and not isinstance(v, list)}})
        ok = True
    except MalformedFrame:
        ok = False
    frame_ = raw_frame(head_of(kind, values), _body(msg))
    if ok:
        back = decode_frame_bytes(frame_)
        for k in msg._names:
            if k in values and not isinstance(values[k], list):
                assert getattr(back, k) == values[k] or values[k] != values[k]
    else:
        rejects(frame_, "bad_field")


def test_array_kind_refused_before_auth() -> None:
    for kind in ("round_start", "coded_gradient"):
        rejects(encode_frame_bytes(_VALID[kind]), "array_too_large", PREAUTH_LIMITS,
                FrameTooLarge)


def test_encoding_refuses_what_the_wire_cannot_carry() -> None:
    bad = ChunkReport.trusted(0, -1, 1, 0.0, 0.0)  # a bug in the sender: negative round
    with pytest.raises(LocalProtocolError):
        encode_frame(bad)
    big_endian = CodedGradient.trusted(0, 0, 0, b"", 0.0, np.arange(3, dtype=">f4"))
    with pytest.raises(LocalProtocolError):
        encode_frame(big_endian)


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


def test_frame_auth_verify_and_verify_one_agree_with_tag() -> None:
    key = bytes(range(32))
    frames = [encode_frame_bytes(Ping(seq=1)), encode_frame_bytes(_VALID["coded_gradient"]),
              encode_frame_bytes(CodedGradient(epoch=0, round=0, attempt=0, state_digest=b"",
                                               compute_s=0.0, payload=np.ones(40_000, "<f4")))]
    sender = FrameAuth(key)
    tags = [sender.tag([f]) for f in frames]
    one, parts = FrameAuth(key), FrameAuth(key)
    for f, t in zip(frames, tags, strict=True):
        assert one.verify_one(f, t)
        assert parts.verify([f[:7], memoryview(f)[7:]], t)  # split anywhere: same tag
    # a wrong tag, a wrong sequence number (replay), a flipped bit: all refused
    fresh = FrameAuth(key)
    assert not fresh.verify_one(frames[0], bytes(16))
    assert not fresh.verify_one(frames[0], tags[0])  # seq 1 now: the seq-0 tag is a replay
    flipped = bytearray(frames[0])  # seq 0, its own tag, one bit of the header flipped
    flipped[6] ^= 1
    assert not FrameAuth(key).verify_one(flipped, tags[0])
    assert not FrameAuth(key).verify([bytes(flipped)], tags[0])


def test_whole_buffered_frames_take_one_step_and_refuse_a_bad_tag_before_the_copy() -> None:
    """The decoder's fast path (a whole tagged array frame in one read) delivers what the
    byte-at-a-time path delivers, and a bad tag leaves alloc's destination untouched."""
    key = bytes(range(32))
    cg = _VALID["coded_gradient"]
    assert isinstance(cg, CodedGradient)
    msgs = [cg, Ping(seq=3), cg]
    frames = [encode_frame_bytes(m) for m in msgs]
    tagger, parts = FrameAuth(key), FrameAuth(key)
    stream = b"".join(f + tagger.tag_one(f) for f in frames)
    assert stream == b"".join(f + parts.tag([f[:5], f[5:]]) for f in frames)
    dest = np.full(cg.payload.shape[0], -1.0, "<f4")
    whole = FrameDecoder(alloc=lambda *a: dest)
    whole.auth = FrameAuth(key)
    got = whole.feed(stream)
    assert [m.kind for m in got] == [m.kind for m in msgs]
    assert isinstance(got[0], CodedGradient) and got[0].payload is dest
    assert np.array_equal(dest, cg.payload)
    bytewise = FrameDecoder()
    bytewise.auth = FrameAuth(key)
    slow = [m for i in range(len(stream)) for m in bytewise.feed(stream[i:i + 1])]
    assert slow == got
    bad = bytearray(stream[:len(frames[0]) + 16])
    bad[-1] ^= 1
    dest[:] = -1.0
    refused = FrameDecoder(alloc=lambda *a: dest)
    refused.auth = FrameAuth(key)
    with pytest.raises(MalformedFrame) as info:
        refused.feed(bad)
    assert info.value.code == "bad_tag"
    assert (dest == -1.0).all()
