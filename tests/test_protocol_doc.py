"""docs/protocol.md is exact: its kind-code table, compact header layouts and frame test
vectors are generated here from the code and must appear in the document verbatim.

To regenerate the blocks after a deliberate wire change (then paste them into the document)::

    python tests/test_protocol_doc.py
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from aiogc.protocol.auth import derive_worker_key, session_keys
from aiogc.protocol.headers import COMPACT_LAYOUTS, KIND_CODES, PREFIX_BYTES
from aiogc.protocol.messages import (
    KINDS,
    PROTOCOL_VERSION,
    ChunkReport,
    CodedGradient,
    EncodeAndTransmit,
    Message,
    Ping,
    Pong,
    Ready,
    Resume,
    RoundEnd,
    RoundStart,
    state_digest,
)
from aiogc.protocol.tags import FrameAuth
from aiogc.protocol.wire import decode_frame_bytes, encode_frame_bytes

DOC = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"

#: byte width of each wire type of the layouts
_WIDTH = {"u64": 8, "u32": 4, "u8": 1, "f64": 8}


def kind_table() -> str:
    """The §2.1 table of kind codes and header encodings."""
    rows = ["| code | kind | header after the preamble |", "|---|---|---|"]
    for kind, code in sorted(KIND_CODES.items(), key=lambda kv: kv[1]):
        enc = "compact (layout below)" if kind in COMPACT_LAYOUTS else "msgpack map"
        rows.append(f"| {code} | `{kind}` | {enc} |")
    return "\n".join(rows)


def layout_table() -> str:
    """The §2.1 table of compact layouts: byte offsets within the header (preamble = 0, 1)."""
    rows = ["| kind | offset | field | wire type |", "|---|---|---|---|"]
    for kind, layout in COMPACT_LAYOUTS.items():
        off = 2
        for name, typ in layout.fixed:
            rows.append(f"| `{kind}` | {off} | `{name}` | {typ} |")
            off += _WIDTH[typ]
        if layout.tail is not None:
            name, typ = layout.tail
            count = f"len({name})"
            rows.append(f"| `{kind}` | {off} | `{name}` | {count} × {typ} |")
        tail = ""
        if layout.tail is not None:
            width = _WIDTH[layout.tail[1]]
            tail = f" + {'' if width == 1 else f'{width} × '}len({layout.tail[0]})"
        rows.append(f"| `{kind}` | | H = | {off}{tail} |")
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
        ("round_end(epoch=7, round=2, status=\"exact\")",
         RoundEnd(epoch=7, round=2, status="exact")),
    ]


def _split(frame: bytes) -> str:
    """prefix | preamble | rest of the header [| body]: spaces between the parts."""
    h = int.from_bytes(frame[:PREFIX_BYTES], "big")
    head_end = PREFIX_BYTES + h
    parts = [frame[:PREFIX_BYTES], frame[PREFIX_BYTES:PREFIX_BYTES + 2],
             frame[PREFIX_BYTES + 2:head_end]]
    if len(frame) > head_end:
        parts.append(frame[head_end:])
    return " ".join(p.hex() for p in parts)


def frame_vectors() -> str:
    """The §10 block: every hot kind's untagged frame (prefix | preamble | fields | body)."""
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


# --------------------------------------------------------------------------- tests


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def test_doc_names_this_version() -> None:
    doc = _doc()
    assert doc.startswith(f"# The aiogc wire protocol (version {PROTOCOL_VERSION})")
    assert f"`PROTOCOL_VERSION = {PROTOCOL_VERSION}`" in doc


@pytest.mark.parametrize("block", [kind_table, layout_table, frame_vectors, tag_vectors])
def test_doc_block_is_generated_from_the_code(block: object) -> None:
    text = block()  # type: ignore[operator]
    assert text in _doc(), f"docs/protocol.md is stale; regenerate with {__file__}:\n{text}"


def test_vectors_decode_back() -> None:
    for _, msg in vector_messages():
        back = decode_frame_bytes(encode_frame_bytes(msg))
        assert back.kind == msg.kind and back.header_fields() == msg.header_fields()


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
    for fn in (kind_table, layout_table, tag_vectors, frame_vectors):
        print(f"--- {fn.__name__}")
        print(fn())
    sys.exit(0)
