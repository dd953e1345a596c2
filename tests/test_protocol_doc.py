"""docs/protocol.md is exact: its kind table, field table and frame test vectors are generated
here from the code and must appear in the document verbatim; every vector is one msgpack
object that plain ``msgpack.unpackb`` reads back into the documented fields.

To regenerate the blocks after a deliberate wire change (then paste them into the document)::

    python tests/test_protocol_doc.py
"""

from __future__ import annotations

import math
import sys
import typing
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from aiogc.protocol.auth import derive_worker_key, session_keys
from aiogc.protocol.headers import KIND_CODES, PREFIX_BYTES, WIRE_FIELDS
from aiogc.protocol.messages import (
    KINDS,
    PROTOCOL_VERSION,
    Bye,
    Challenge,
    ChunkGradient,
    ChunkReport,
    CodedGradient,
    EncodeAndTransmit,
    Error,
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
from aiogc.protocol.tags import FrameAuth
from aiogc.protocol.wire import decode_frame_bytes, encode_frame_bytes

DOC = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"

def kind_table() -> str:
    """The §2.1 table: every kind's code and its fields in wire order."""
    rows = ["| code | kind | body: `[5, code, ...]` then |", "|---|---|---|"]
    for kind, code in sorted(KIND_CODES.items(), key=lambda kv: kv[1]):
        names = ", ".join(f"`{n}`" for n, _ in WIRE_FIELDS[kind])
        rows.append(f"| {code} | `{kind}` | {names} |")
    return "\n".join(rows)


def _bounds(wire: Any) -> str:
    """The msgspec constraints of a field's wire type, as text."""
    if wire is None:
        return "the last value; its length a whole number of dtype items (§2.1)"
    args = typing.get_args(wire)
    if typing.get_origin(wire) is typing.Literal:
        return "one of " + ", ".join(hex(a) if a > 9 else str(a) for a in args)
    if not args:
        return ""
    base, *metas = args
    parts = []
    for meta in metas:
        for attr, word in (("ge", ">="), ("le", "<="), ("min_length", "length >="),
                           ("max_length", "length <=")):
            v = getattr(meta, attr, None)
            if v is not None:
                parts.append(f"{word} {_num(v)}")
    inner = typing.get_args(base)
    if typing.get_origin(base) is tuple and inner:
        parts.append(f"each entry {_bounds(inner[0])}")
    return ", ".join(parts)


def _num(v: Any) -> str:
    if v == 2**53:
        return "2^53"
    if v == sys.float_info.max:
        return "the largest finite float64 (finite)"
    return str(v)


def field_table() -> str:
    """The §2.1 table of every kind's fields: position in the array, msgpack form, bounds."""
    rows = ["| kind | index | field | msgpack | bounds |", "|---|---|---|---|---|"]
    for kind, _code in sorted(KIND_CODES.items(), key=lambda kv: kv[1]):
        for i, (name, checker) in enumerate(WIRE_FIELDS[kind], start=2):
            rows.append(f"| `{kind}` | {i} | `{name}` | {checker.tag} | "
                        f"{_bounds(checker.wire)} |")
    return "\n".join(rows)


# --------------------------------------------------------------------------- frame vectors

#: the §4.2 vector's session (S = b"s3cret", j = 3, epoch = 7, nonces 00..0f and 10..1f)
_NONCE_PS = bytes(range(16))
_NONCE_W = bytes(range(16, 32))
_DIGEST = state_digest([2, 0, 3])


def vector_messages() -> list[tuple[str, Message]]:
    inf = math.inf
    return [
        ("ready(epoch=7)", Ready(epoch=7)),
        ("ping(seq=1)", Ping(seq=1)),
        ("pong(seq=1)", Pong(seq=1)),
        ("resume(epoch=7, round=2, attempt=1)", Resume(epoch=7, round=2, attempt=1)),
        ("chunk_report(epoch=7, round=2, count=3, t_worker=1.5, elapsed_s=0.25)",
         ChunkReport(epoch=7, round=2, count=3, t_worker=1.5, elapsed_s=0.25)),
        ("encode_and_transmit(epoch=7, round=2, attempt=0, state=[2, 0, 3])",
         EncodeAndTransmit(epoch=7, round=2, attempt=0, state=(2, 0, 3))),
        ("round_start(epoch=7, round=2, delays_s=[0.5, inf], net_delay_s=0.0, "
         "model=[1.0, -2.0] as <f8)",
         RoundStart(epoch=7, round=2, delays_s=(0.5, inf), net_delay_s=0.0,
                    model=np.array([1.0, -2.0], dtype="<f8"))),
        ("coded_gradient(epoch=7, round=0, attempt=0, state_digest=3fce36a7ffcfc9ba, "
         "compute_s=0.5, payload=[1.0, -2.0] as <f4)",
         CodedGradient(epoch=7, round=0, attempt=0, state_digest=_DIGEST, compute_s=0.5,
                       payload=np.array([1.0, -2.0], dtype="<f4"))),
        ("chunk_gradient(epoch=7, round=2, chunk=4, compute_s=0.75, elapsed_s=1.5, "
         "payload=[1.0, -2.0] as <f4)",
         ChunkGradient(epoch=7, round=2, chunk=4, compute_s=0.75, elapsed_s=1.5,
                       payload=np.array([1.0, -2.0], dtype="<f4"))),
        ("round_end(epoch=7, round=2, status=\"exact\")",
         RoundEnd(epoch=7, round=2, status="exact")),
        ("challenge(nonce=00..0f, epoch=7)", Challenge(nonce=_NONCE_PS, epoch=7)),
        ("error(code=\"bad_tag\", reason=\"x\")", Error(code="bad_tag", reason="x")),
        ("shutdown(reason=\"done\")", Shutdown(reason="done")),
        ("bye(reason=\"\")", Bye(reason="")),
    ]


def _split(frame: bytes) -> str:
    """prefix | array header, version, kind | the fields [| the payload's bytes]: spaces
    between the parts."""
    size = int.from_bytes(frame[:PREFIX_BYTES], "big")
    body = frame[PREFIX_BYTES:PREFIX_BYTES + size]
    obj = msgpack.unpackb(body)
    payload = obj[-1] if isinstance(obj[-1], bytes) and len(obj) > 3 \
        and WIRE_FIELDS[_KIND_OF[obj[1]]][-1][1].tag == "payload" else b""
    parts = [frame[:PREFIX_BYTES], body[:3], body[3:len(body) - len(payload)]]
    if payload:
        parts.append(payload)
    return " ".join(p.hex() for p in parts if p)


_KIND_OF = {code: kind for kind, code in KIND_CODES.items()}


def frame_vectors() -> str:
    """The §10 block: untagged frames (prefix | array header, version, kind | the fields |
    the payload's bytes)."""
    lines = []
    for label, msg in vector_messages():
        lines.append(f"{label}:")
        lines.append(f"  {_split(encode_frame_bytes(msg))}")
    return "\n".join(lines)


def tag_vectors() -> str:
    """The §2.5 block: the first two tagged frames a worker sends (K_w of §4.2)."""
    keys = session_keys(derive_worker_key(b"s3cret", 3), _NONCE_PS, _NONCE_W, 7, 3)
    auth = FrameAuth(keys.worker_to_ps)
    ready = encode_frame_bytes(Ready(epoch=7), auth)
    ping = encode_frame_bytes(Ping(seq=1), auth)
    return "\n".join([
        f"ready(epoch=7), seq 0:  {ready[:-16].hex()}  tag {ready[-16:].hex()}",
        f"ping(seq=1),    seq 1:  {ping[:-16].hex()}  tag {ping[-16:].hex()}",
    ])


def welcome_map() -> str:
    """The §4.2 block: the default configuration's welcome map (JSON notation)."""
    import json

    from aiogc.config import RunConfig, scheme_digest

    cfg = RunConfig()
    return json.dumps({**cfg.to_wire(), "scheme_digest": scheme_digest(cfg.build_scheme())})


def key_vectors() -> str:
    """The §4.2 block: keys and MACs of the documented session."""
    from aiogc.config import RunConfig, scheme_digest
    from aiogc.protocol.auth import config_hash, hello_mac, welcome_mac

    cfg = RunConfig()
    config = {**cfg.to_wire(), "scheme_digest": scheme_digest(cfg.build_scheme())}
    k3 = derive_worker_key(b"s3cret", 3)
    chash = config_hash(config)
    keys = session_keys(k3, _NONCE_PS, _NONCE_W, 7, 3)
    return "\n".join([
        f"  k_3         = {k3.hex()}",
        f"  hello_mac   = {hello_mac(k3, _NONCE_PS, _NONCE_W, 3, 7).hex()}",
        f"  config_hash = {chash.hex()}",
        f"  welcome_mac = {welcome_mac(k3, _NONCE_PS, _NONCE_W, 3, 7, chash).hex()}",
        f"  K_ps        = {keys.ps_to_worker.hex()}",
        f"  K_w         = {keys.worker_to_ps.hex()}",
    ])


# --------------------------------------------------------------------------- tests


def test_config_keys_are_the_documented_lists() -> None:
    """§4.4's required and optional welcome keys are RunConfig's."""
    from dataclasses import fields as dc_fields

    from aiogc.config import _DEFAULTED_ON_WIRE, RunConfig

    doc = _doc()
    names = [f.name for f in dc_fields(RunConfig)]
    required = [n for n in names if n not in _DEFAULTED_ON_WIRE]
    assert ("* **required** (25, always present): " in doc) and len(required) == 25
    section = doc[doc.index("* **required** (25"):doc.index("* `scheme_digest` (always sent")]
    listed = [w.strip("`,;") for w in section.split() if w.startswith("`")]
    assert [w for w in listed if w in names] == required + [
        n for n in names if n in _DEFAULTED_ON_WIRE]


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def test_doc_names_this_version() -> None:
    doc = _doc()
    assert doc.startswith(f"# The aiogc wire protocol (version {PROTOCOL_VERSION})")
    assert f"`PROTOCOL_VERSION = {PROTOCOL_VERSION}`" in doc


@pytest.mark.parametrize("block", [kind_table, field_table, frame_vectors, tag_vectors,
                                   welcome_map, key_vectors])
def test_doc_block_is_generated_from_the_code(block: object) -> None:
    text = block()  # type: ignore[operator]
    assert text in _doc(), f"docs/protocol.md is stale; regenerate with {__file__}:\n{text}"


def test_vectors_decode_back() -> None:
    for _, msg in vector_messages():
        frame = encode_frame_bytes(msg)
        back = decode_frame_bytes(frame)
        assert back.kind == msg.kind and back.header_fields() == msg.header_fields()
        # plain msgpack reads the whole body, payload included, as the documented fields
        obj = msgpack.unpackb(frame[PREFIX_BYTES:])
        assert obj[:2] == [PROTOCOL_VERSION, KIND_CODES[msg.kind]]
        names = [n for n, _ in WIRE_FIELDS[msg.kind]]
        assert len(obj) == len(names) + 2
        for name, value in zip(names, obj[2:], strict=True):
            if name == msg.array_field:
                assert value == msg.array().tobytes()  # type: ignore[union-attr]
            elif name == "dtype":
                assert value == {4: 4, 8: 8}[msg.array().dtype.itemsize]  # type: ignore[union-attr]
            else:
                want = getattr(msg, name)
                assert value == (list(want) if isinstance(want, tuple) else want), name


def test_host_example_bytes_are_the_code() -> None:
    """§2.6's example: a host of workers 4..5 opening both slots."""
    from aiogc.protocol.hostmux import OPEN, encode_control, encode_preamble

    doc = _doc()
    assert f"{encode_preamble(0, 4, 2).hex(' ')}      preamble: AGCH, version " \
        f"{PROTOCOL_VERSION}, role 0, first 4, count 2" in doc
    assert f"{encode_control(OPEN, 0).hex(' ')}                        OPEN slot 0" in doc
    assert f"{encode_control(OPEN, 1).hex(' ')}                        OPEN slot 1" in doc


def test_every_kind_has_a_code_in_the_doc_table() -> None:
    table = kind_table()
    for kind in KINDS:
        assert f"| `{kind}` |" in table


if __name__ == "__main__":
    for fn in (kind_table, field_table, tag_vectors, frame_vectors, welcome_map, key_vectors):
        print(f"--- {fn.__name__}")
        print(fn())
    sys.exit(0)
