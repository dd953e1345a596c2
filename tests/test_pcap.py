"""Wire capture (issue 20 item 7): ``aiogc run --pcap`` writes a pcap of the PS's frames and
the Wireshark dissector ``tools/aiogc.lua`` names every frame kind.

The writer is checked on its own (pcap records, IPv4 / TCP checksums, sequence numbers that
count the bytes of each direction). With ``tshark`` (Debian's package; .ci/run installs it,
and the tests fail rather than skip under CI when it is missing): a synthetic capture of
every one of the 15 kinds, tagged and untagged, and the capture of a real live run, whose
dissected frames must be exactly the frames the PS recorded in events.jsonl, kind by kind.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aiogc.net.pcap import LINKTYPE_RAW, MAX_SEGMENT, PcapWriter, _checksum
from aiogc.protocol.headers import KIND_CODES
from aiogc.protocol.messages import (
    Bye,
    Challenge,
    ChunkReport,
    CodedGradient,
    EncodeAndTransmit,
    Error,
    Hello,
    Ping,
    Pong,
    Ready,
    Resume,
    RoundEnd,
    RoundStart,
    Shutdown,
    Welcome,
    state_digest,
)
from aiogc.protocol.wire import encode_frame_bytes

LUA = Path(__file__).resolve().parent.parent / "tools" / "aiogc.lua"


class _Conn:
    def __init__(self, port: int) -> None:
        self.peername = ("127.0.0.1", port)
        self.sockname = ("127.0.0.1", 7000)  # registered to AFS: the heuristic must win


def _records(path: Path) -> tuple[int, list[bytes]]:
    """``(link type, [packet bytes])`` of a nanosecond pcap file."""
    data = path.read_bytes()
    magic, _, _, _, _, _, link = struct.unpack_from("<IHHiIII", data)
    assert magic == 0xA1B23C4D
    out, pos = [], 24
    while pos < len(data):
        _, _, incl, orig = struct.unpack_from("<IIII", data, pos)
        assert incl == orig
        out.append(data[pos + 16:pos + 16 + incl])
        pos += 16 + incl
    return link, out


def test_writer_builds_valid_tcp_flows(tmp_path: Path) -> None:
    path = tmp_path / "c.pcap"
    big = bytes(range(256)) * 600  # 153600 bytes: three segments
    with PcapWriter(path, clock=iter(range(10**9, 10**9 + 100)).__next__) as cap:
        a, b = _Conn(50001), _Conn(50002)
        cap.tap(a, False, b"hello")
        cap.tap(a, True, big)
        cap.tap(b, True, b"x")
    link, pkts = _records(path)
    assert link == LINKTYPE_RAW
    # per flow: SYN, SYN/ACK, ACK, data..., FIN, FIN
    assert len(pkts) == (3 + 1 + 3 + 2) + (3 + 1 + 2)
    seq_next: dict[tuple[int, int], int] = {}
    payloads: dict[tuple[int, int], bytes] = collections.defaultdict(bytes)
    for p in pkts:
        assert p[0] == 0x45 and _checksum(p[:20]) == 0
        total = struct.unpack(">H", p[2:4])[0]
        assert total == len(p) and total - 40 <= MAX_SEGMENT
        src, dst = p[12:16], p[16:20]
        pseudo = src + dst + struct.pack(">BBH", 0, 6, total - 20)
        assert _checksum(pseudo + p[20:]) == 0
        sport, dport, seq = struct.unpack(">HHI", p[20:28])
        flags = p[33]
        key = (sport, dport)
        if key in seq_next:
            assert seq == seq_next[key]
        seq_next[key] = seq + len(p) - 40 + (1 if flags & 0x03 else 0)  # SYN / FIN: 1
        payloads[key] += p[40:]
    assert payloads[(50001, 7000)] == b"hello"
    assert payloads[(7000, 50001)] == big
    assert payloads[(7000, 50002)] == b"x"


def _tshark() -> str:
    path = shutil.which("tshark")
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail("tshark is required in CI (.ci/run installs Debian's tshark)")
    pytest.skip("no tshark on this machine (apt-get install tshark)")


def _dissect(pcap: Path) -> tuple[list[str], list[str]]:
    """The kind names tshark's aiogc dissector finds, in order, and its error messages."""
    out = subprocess.run(
        # heuristics first: an ephemeral PS port may be one another dissector registered
        [_tshark(), "-n", "-o", "tcp.try_heuristic_first:TRUE", "-X", f"lua_script:{LUA}",
         "-r", str(pcap), "-T", "fields",
         "-E", "occurrence=a", "-e", "aiogc.kind_name", "-e", "_ws.expert.message"],
        capture_output=True, text=True, check=True, timeout=300,
        env={**os.environ, "HOME": str(pcap.parent)})  # tshark's profile dir: not ours
    kinds: list[str] = []
    errors: list[str] = []
    for line in out.stdout.splitlines():
        k, _, e = line.partition("\t")
        kinds += [x for x in k.split(",") if x]
        errors += [x for x in e.split(",") if "aiogc.lua" in x]  # the dissector's own errors
    return kinds, errors


def _every_kind() -> list[tuple[bool, Any]]:
    """One message of every kind, as (sent by the PS, message), in a plausible order."""
    model = np.linspace(-1, 1, 5)
    return [
        (True, Challenge(nonce=b"n" * 16, epoch=3)),
        (False, Hello(worker=2, nonce=b"w" * 16, mac=b"m" * 32, epoch=3)),
        (True, Welcome(epoch=3, worker=2, mac=b"p" * 32,
                       config={"workers": 4, "scheme": "partial", "lr": 0.5, "x": None,
                               "flag": True})),
        (False, Ready(epoch=3)),
        (True, RoundStart(epoch=3, round=0, delays_s=(0.5, float("inf")), net_delay_s=0.25,
                          model=model)),
        (False, ChunkReport(epoch=3, round=0, count=1, t_worker=1.5, elapsed_s=0.25)),
        (True, EncodeAndTransmit(epoch=3, round=0, attempt=0, state=(1, 2, 0, 2))),
        (True, Resume(epoch=3, round=0, attempt=1)),
        (False, CodedGradient(epoch=3, round=0, attempt=1, state_digest=state_digest([1, 2]),
                              compute_s=0.75, payload=model.astype(np.float32))),
        (True, RoundEnd(epoch=3, round=0, status="exact")),
        (False, Ping(seq=9)),
        (True, Pong(seq=9)),
        (True, Ping(seq=10)),
        (False, Pong(seq=10)),
        (False, Bye(reason="done")),
        (True, Error(code="bad_tag", reason="tag mismatch é")),
        (True, Shutdown(reason="all rounds done")),
    ]


@pytest.mark.parametrize("tagged", [False, True])
def test_dissector_names_every_kind(tmp_path: Path, tagged: bool) -> None:
    """All 15 kinds, every compact layout and msgpack map, with and without frame tags
    (after the handshake, as §2.1 says); big frames split over several TCP segments."""
    msgs = _every_kind()
    path = tmp_path / "all.pcap"
    with PcapWriter(path) as cap:
        conn = _Conn(50003)
        for from_ps, msg in msgs:
            if not tagged and msg.kind in ("hello", "welcome"):
                msg = type(msg)(**{**{f: getattr(msg, f) for f in msg._names}, "mac": b""})
            frame = encode_frame_bytes(msg)
            if tagged and msg.kind not in ("challenge", "hello", "welcome"):
                frame += bytes(range(16))  # shown, not verified
            # split every frame in two writes: the dissector must reassemble
            cut = len(frame) // 2
            cap.tap(conn, from_ps, frame[:cut])
            cap.tap(conn, from_ps, frame[cut:])
    kinds, errors = _dissect(path)
    assert kinds == [m.kind for _, m in msgs]
    assert set(kinds) == set(KIND_CODES)
    assert errors == []


def test_live_run_capture_is_dissected(tmp_path: Path) -> None:
    """A real run (coroutines on loopback, port 0, with a secret: tagged frames) captured
    with --pcap: tshark finds exactly the frames the PS recorded, kind by kind."""
    _tshark()
    from aiogc.config import RunConfig
    from aiogc.harness.local import run_live
    from aiogc.harness.options import RunOptions

    cfg = RunConfig(workers=4, delta=2, rounds=3, seed=1, task="linreg:samples=200,dim=8",
                    delay="exp:0.002")
    pcap = tmp_path / "run.pcap"
    run_live(cfg, ["partial", "original"], RunOptions(
        mode="coroutines", out_dir=tmp_path / "run", plots=False, loop="asyncio", pcap=pcap))
    kinds, errors = _dissect(pcap)
    recorded = collections.Counter(
        e["kind"] for e in map(json.loads, (tmp_path / "run" / "events.jsonl").open())
        if e["direction"] in ("in", "out"))
    assert collections.Counter(kinds) == recorded
    assert {"challenge", "hello", "welcome", "ready", "round_start", "chunk_report",
            "encode_and_transmit", "coded_gradient", "shutdown"} <= set(kinds)
    assert errors == []
