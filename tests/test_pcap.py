"""Wire capture: ``aiogc run --pcap`` writes a pcap of the PS's frames and the Wireshark
dissector shipped in the package (``aiogc/protocol/aiogc.lua``) names every frame kind.

The writer is checked on its own (pcap records, IPv4 / TCP checksums, sequence numbers that
count the bytes of each direction). With ``tshark`` (Debian's package; .ci/run installs it,
and the tests fail rather than skip under CI when it is missing): a synthetic capture of
every one of the 15 kinds, tagged and untagged, and the capture of a real live run, whose
dissected frames must be exactly the frames the PS recorded in events.jsonl, kind by kind.
Worker hosts (§2.6): a synthetic host connection (preambles, the stray challenge, control
records, per-session tags, a refusal) and a real ``--worker-hosts 2`` run, whose capture is
also decoded in Python (the tap must hold every byte once) and dissected worker by worker.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aiogc.net.pcap import LINKTYPE_RAW, MAX_SEGMENT, PcapWriter, _checksum
from aiogc.protocol.headers import DEFAULT_LIMITS, KIND_CODES
from aiogc.protocol.hostmux import (
    CLOSE,
    HOST_SLOT,
    OPEN,
    ROLE_HOST,
    ROLE_PS,
    Control,
    MuxFrameDecoder,
    Preamble,
    encode_control,
    encode_preamble,
    slot_prefix,
)
from aiogc.protocol.messages import (
    Bye,
    Challenge,
    ChunkGradient,
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
from aiogc.protocol.wire import HOST_MAGIC, encode_frame_bytes
from tests.netkit import CLI_JOIN_TIMEOUT_S, cli, listening

LUA = Path(__file__).resolve().parent.parent / "aiogc" / "protocol" / "aiogc.lua"


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


def test_a_connection_gone_ends_its_flow_and_the_next_is_a_new_one(tmp_path: Path) -> None:
    """Connections that come and go, one at a time, on one port (as a refused peer and then a
    worker host can, when the kernel reuses the ephemeral port, and when a new connection
    object gets a freed one's ``id()``): each is its own flow, SYN ... FIN, in order."""
    path = tmp_path / "reuse.pcap"
    n = 50
    with PcapWriter(path, clock=iter(range(10**9, 10**9 + 10**4)).__next__) as cap:
        for k in range(n):
            conn = _Conn(50020)
            cap.tap(conn, False, b"in%d" % k)
            cap.tap(conn, True, b"out%d" % k)
            del conn  # gone: its flow ends here, not at close()
    flags = [p[33] for p in _records(path)[1] if struct.unpack(">H", p[20:22])[0] == 50020]
    per_flow = [0x02, 0x10, 0x18, 0x11]  # SYN, ACK, data (PSH|ACK), FIN|ACK from the worker
    assert flags == per_flow * n
    streams = _streams(path)
    assert [streams[50020, 7000, k + 1] for k in range(n)] == [b"in%d" % k for k in range(n)]
    assert [streams[7000, 50020, k + 1] for k in range(n)] == [b"out%d" % k for k in range(n)]


def test_dissector_is_generated_from_the_field_table() -> None:
    """The shipped aiogc.lua is exactly what the generator writes from the codec's table, and
    ``--path`` names that file."""
    from aiogc.protocol.dissector import LUA_PATH, render

    assert LUA.read_text(encoding="utf-8") == render(), \
        "aiogc/protocol/aiogc.lua is stale: python -m aiogc.protocol.dissector --write"
    out = subprocess.run([sys.executable, "-m", "aiogc.protocol.dissector", "--path"],
                         capture_output=True, text=True, check=True, cwd=Path(__file__).parent)
    assert Path(out.stdout.strip()).resolve() == LUA_PATH.resolve() == LUA.resolve()


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
        (False, ChunkGradient(epoch=3, round=0, chunk=2, compute_s=0.5, elapsed_s=0.625,
                              payload=model)),
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
    """Every kind, every compact layout and msgpack map, with and without frame tags
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


#: What a worker sends unprompted: a capture may hold some that the PS read but did not decode
#: (in flight when it closed the session after its last round: §2.3's lingering close reads
#: and discards, a host's closed slot drops them), which events.jsonl therefore lacks.
_UNPROMPTED = {"chunk_report", "coded_gradient", "chunk_gradient"}


def _pdus(pcap: Path) -> list[tuple[int, int, str]]:
    """``(source port, destination port, summary)`` of every aiogc PDU, in capture order."""
    lines = _tshark_run(pcap, "-Y", "aiogc", "-T", "fields", "-e", "tcp.srcport",
                        "-e", "tcp.dstport", "-e", "_ws.col.Info")
    out = []
    for line in lines:
        sport, dport, info = line.split("\t")
        out += [(int(sport), int(dport), item) for item in info.split("; ")]
    return out


def _named_worker(fields: str) -> int:
    match = re.search(r"\bworker=(\d+)", fields)
    assert match is not None, fields
    return int(match[1])


_Sent = collections.Counter[tuple[str, str, "int | None"]]
_Received = dict[tuple[str, "int | None"], list[str]]


def _by_worker(pdus: list[tuple[int, int, str]], scheme_of: dict[int, str]
               ) -> tuple[collections.Counter[str], _Sent, _Received]:
    """The dissected frames' kinds; ``(scheme, kind, worker)`` of the frames the PS sent; the
    kinds each ``(scheme, worker)`` sent, in order. A plain connection's worker is its hello's,
    a host record's first + slot (``wN``); None for challenge and hello (as events.jsonl)."""
    stream_worker: dict[tuple[str, int], int] = {}
    kinds: collections.Counter[str] = collections.Counter()
    sent: _Sent = collections.Counter()
    received: _Received = collections.defaultdict(list)
    for sport, dport, info in pdus:
        head, _, fields = info.partition("(")
        if head in ("OPEN", "CLOSE", "host preamble"):
            continue
        from_ps = sport in scheme_of
        scheme, client = (scheme_of[sport], dport) if from_ps else (scheme_of[dport], sport)
        who, _, kind = head.rpartition(" ")
        kinds[kind] += 1
        worker: int | None
        if who:  # a host connection's record
            assert who.startswith("w"), info
            worker = int(who[1:])
            if kind in ("hello", "welcome"):
                assert _named_worker(fields) == worker, info  # the slot is the named worker's
        else:
            if kind == "hello":
                stream_worker[(scheme, client)] = _named_worker(fields)
            worker = stream_worker.get((scheme, client))
        if kind in ("challenge", "hello"):
            worker = None  # the PS names a worker once it is authenticated
        if from_ps:
            sent[(scheme, kind, worker)] += 1
        else:
            received[(scheme, worker)].append(kind)
    return kinds, sent, received


def _check_against_events(pcap: Path, run_dir: Path,
                          schemes: list[str]) -> collections.Counter[str]:
    """The dissected capture against the PS's events.jsonl, scheme by scheme (one PS port
    each) and worker by worker: every frame the PS sent, per kind; and per worker the frames
    the PS received, in order, plus at most frames that were in flight when the PS closed the
    session. Returns the dissected frames' kinds."""
    pdus = _pdus(pcap)
    ps_ports: list[int] = []
    for sport, _, info in pdus:  # every connection starts with the PS's challenge
        if info.startswith("challenge(") and sport not in ps_ports:
            ps_ports.append(sport)
    assert len(ps_ports) == len(schemes)
    kinds, sent, received = _by_worker(pdus, dict(zip(ps_ports, schemes, strict=True)))
    events = [e for e in map(json.loads, (run_dir / "events.jsonl").open())
              if e["direction"] in ("in", "out")]
    assert sent == collections.Counter((e["scheme"], e["kind"], e["worker"]) for e in events
                                       if e["direction"] == "out")
    recorded: _Received = collections.defaultdict(list)
    for e in events:
        if e["direction"] == "in":
            recorded[(e["scheme"], e["worker"])].append(e["kind"])
    assert set(received) == set(recorded)
    for key, seq in recorded.items():
        assert received[key][:len(seq)] == seq, key
        assert set(received[key][len(seq):]) <= _UNPROMPTED, key
    return kinds


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
    # the frames the PS recorded, kind by kind and worker by worker (plus frames read after
    # its last shutdown, which it discards unread)
    assert collections.Counter(kinds) == _check_against_events(
        pcap, tmp_path / "run", ["partial", "original"])
    assert {"challenge", "hello", "welcome", "ready", "round_start", "chunk_report",
            "encode_and_transmit", "coded_gradient", "shutdown"} <= set(kinds)
    assert errors == []


# ---------------------------------------------------------------------------- worker hosts


def _tshark_run(pcap: Path, *args: str) -> list[str]:
    out = subprocess.run(
        [_tshark(), "-n", "-o", "tcp.try_heuristic_first:TRUE", "-X", f"lua_script:{LUA}",
         "-r", str(pcap), *args],
        capture_output=True, text=True, check=True, timeout=300,
        env={**os.environ, "HOME": str(pcap.parent)})
    return [line for line in out.stdout.splitlines() if line]


def _infos(pcap: Path, two_pass: bool = False) -> list[str]:
    """The dissector's one-line summaries (Info column), PDU by PDU, in capture order."""
    lines = _tshark_run(pcap, *(["-2"] if two_pass else []), "-Y", "aiogc",
                        "-T", "fields", "-e", "_ws.col.Info")
    return [item for line in lines for item in line.split("; ")]


def _malformed(pcap: Path) -> list[str]:
    """Packets with the dissector's malformed expert, a malformed or a Lua error."""
    return _tshark_run(pcap, "-Y", "aiogc.malformed || _ws.malformed || _ws.lua")


def _host_frames(from_ps: bool, kinds: list[tuple[int, Any]], tagged: set[int]) -> bytes:
    """Records of ``(slot, message)``; a slot in ``tagged`` gets a (dummy) tag."""
    out = b""
    for slot, msg in kinds:
        out += slot_prefix(slot) + encode_frame_bytes(msg)
        if slot in tagged and msg.kind not in ("challenge", "hello", "welcome"):
            out += bytes(range(16))
    return out


def test_dissector_follows_a_host_connection(tmp_path: Path) -> None:
    """§2.6 by hand: the stray challenge, both preambles, OPEN / CLOSE, per-session tags
    (worker 4 has a secret, worker 5's reopened session has none), a record split over
    writes, the host slot's error; and a refused host (a plain error instead of the PS's
    preamble). Every PDU is named with its worker id, nothing is malformed, a second pass
    (Wireshark's revisits) dissects alike."""
    ch = Challenge(nonce=b"n" * 16, epoch=3)
    model = np.linspace(-1, 1, 5)
    secret, plain = {0, 1}, {0}
    with PcapWriter(tmp_path / "host.pcap") as cap:
        conn = _Conn(50010)
        cap.tap(conn, True, encode_frame_bytes(ch))  # sent at accept, before the preamble
        cap.tap(conn, False, encode_preamble(ROLE_HOST, 4, 2) + encode_control(OPEN, 0)
                + encode_control(OPEN, 1))
        cap.tap(conn, True, encode_preamble(ROLE_PS, 4, 2) + _host_frames(
            True, [(0, ch), (1, ch)], set()))
        cap.tap(conn, False, _host_frames(False, [
            (0, Hello(worker=4, nonce=b"w" * 16, mac=b"m" * 32, epoch=3)),
            (1, Hello(worker=5, nonce=b"w" * 16, mac=b"m" * 32, epoch=3))], set()))
        cap.tap(conn, True, _host_frames(True, [
            (s, Welcome(epoch=3, worker=4 + s, mac=b"p" * 32, config={"workers": 6}))
            for s in (0, 1)], set()))
        cap.tap(conn, False, _host_frames(False, [(1, Ready(epoch=3)), (0, Ready(epoch=3))],
                                          secret))
        cap.tap(conn, True, _host_frames(True, [(0, RoundStart(
            epoch=3, round=0, delays_s=(0.5,), net_delay_s=0.0, model=model))], secret))
        grad = _host_frames(False, [(1, CodedGradient(
            epoch=3, round=0, attempt=0, state_digest=b"", compute_s=0.5,
            payload=model.astype(np.float32)))], secret)
        cap.tap(conn, False, grad[:9])
        cap.tap(conn, False, grad[9:])
        cap.tap(conn, True, _host_frames(True, [(1, Error(code="stale", reason="x"))], secret)
                + encode_control(CLOSE, 1))
        cap.tap(conn, False, encode_control(CLOSE, 1) + encode_control(OPEN, 1))
        cap.tap(conn, True, _host_frames(True, [(1, ch)], set()))
        cap.tap(conn, False, _host_frames(False, [
            (1, Hello(worker=5, nonce=b"w" * 16, mac=b"", epoch=3))], set()))
        cap.tap(conn, True, _host_frames(True, [
            (1, Welcome(epoch=3, worker=5, mac=b"", config={})), (0, Ping(seq=1)),
            (1, Ping(seq=2))], plain))
        cap.tap(conn, True, slot_prefix(HOST_SLOT) + encode_frame_bytes(
            Error(code="bad_tag", reason="host")))
        refused = _Conn(50011)
        cap.tap(refused, True, encode_frame_bytes(ch))
        cap.tap(refused, False, encode_preamble(ROLE_HOST, 0, 9))
        cap.tap(refused, True, encode_frame_bytes(Error(code="bad_block", reason="0..8")))
    infos = _infos(tmp_path / "host.pcap")
    names = [i.split("(")[0] for i in infos]
    assert names == [
        "challenge", "host preamble", "OPEN", "OPEN", "host preamble", "w4 challenge",
        "w5 challenge", "w4 hello", "w5 hello", "w4 welcome", "w5 welcome", "w5 ready",
        "w4 ready", "w4 round_start", "w5 coded_gradient", "w5 error", "CLOSE", "CLOSE", "OPEN",
        "w5 challenge", "w5 hello", "w5 welcome", "w4 ping", "w5 ping", "host error",
        "challenge", "host preamble", "error"]
    assert infos[2] == "OPEN(slot=0, worker=4)" and infos[16] == "CLOSE(slot=1, worker=5)"
    assert infos[1] == "host preamble(host, workers 4..5)"
    assert infos[4] == "host preamble(PS, workers 4..5)"
    tags = _tshark_run(tmp_path / "host.pcap", "-T", "fields", "-e", "aiogc.tag")
    assert sum(len(line.split(",")) for line in tags) == 6  # the secret session's frames
    assert _malformed(tmp_path / "host.pcap") == []
    assert _infos(tmp_path / "host.pcap", two_pass=True) == infos


def test_dissector_flags_a_bad_control_record(tmp_path: Path) -> None:
    """The malformed check of the tests below does find a malformed record."""
    with PcapWriter(tmp_path / "bad.pcap") as cap:
        conn = _Conn(50012)
        cap.tap(conn, False, encode_preamble(ROLE_HOST, 0, 2) + encode_control(7, 0))
    assert len(_malformed(tmp_path / "bad.pcap")) == 1


def _streams(pcap: Path) -> dict[tuple[int, int, int], bytes]:
    """Every direction of every connection, its TCP payload reassembled, keyed by (source
    port, destination port, n): the n-th connection on those ports, each begun by a SYN (a
    closed connection's ephemeral port can be reused)."""
    out: dict[tuple[int, int, int], bytes] = collections.defaultdict(bytes)
    opened: collections.Counter[tuple[int, int]] = collections.Counter()
    for p in _records(pcap)[1]:
        sport, dport = struct.unpack(">HH", p[20:24])
        if p[33] & 0x02:  # SYN
            opened[sport, dport] += 1
        out[sport, dport, opened[sport, dport]] += p[40:]
    return out


class _AnyTag:
    """Accepts every tag: the capture is decoded without the session keys."""

    def verify(self, parts: Any, tag: bytes) -> bool:
        return True

    def verify_one(self, frame: Any, tag: bytes) -> bool:
        return True


def _decode_host_stream(data: bytes, secret: bool) -> list[tuple[int | None, Any]]:
    """A host connection's direction as aiogc decodes it: ``(slot, message)`` (slot None: a
    plain frame, a preamble or a control record). With a ``secret``, a session's frames are
    tagged after its hello (host to PS) or welcome (PS to host), §2.5."""
    from_ps = data[:4] != HOST_MAGIC.to_bytes(4, "big")
    tagged: set[int] = set()

    def select(dec: MuxFrameDecoder, slot: int) -> None:
        dec.limits = DEFAULT_LIMITS
        dec.auth = _AnyTag() if slot in tagged else None  # type: ignore[assignment]

    dec = MuxFrameDecoder(select, plain_first=from_ps)
    out: list[tuple[int | None, Any]] = []
    src = memoryview(data)
    while src:  # one message at a time, as the connection does: a hello changes the state
        buf = dec.get_buffer(len(src))
        k = min(len(buf), len(src))
        buf[:k] = src[:k]
        del buf
        src = src[k:]
        batch = dec.buffer_updated(k, max_messages=1)
        msg = batch[0] if batch else None
        while msg is not None:
            if isinstance(msg, Preamble | Control):
                out.append((None, msg))
            else:
                slot = dec.slot
                out.append((slot, msg))
                if slot is not None and msg.kind in ("challenge", "hello", "welcome"):
                    tagged.discard(slot)  # a new session's handshake
                    if secret and msg.kind == ("welcome" if from_ps else "hello"):
                        tagged.add(slot)
            msg = dec.next_message()
    assert dec.at_frame_boundary()
    return out


def test_worker_hosts_run_capture(tmp_path: Path) -> None:
    """A real ``--worker-hosts 2`` run (two host processes on loopback, port 0, with a secret),
    captured with --pcap. Decoded in Python, the host connections hold the frames the PS
    recorded in events.jsonl (the tap sees a host's first read once, though the host link
    re-feeds it to its own decoder); dissected by tshark, every PDU is named, slot frames carry
    their worker id (first + slot), and they are the frames events.jsonl records, worker by
    worker; the dissector and aiogc's decoder agree frame for frame; nothing is malformed."""
    _tshark()
    from aiogc.config import RunConfig
    from aiogc.harness.local import run_live
    from aiogc.harness.options import RunOptions

    m, schemes = 4, ["partial", "original"]
    cfg = RunConfig(workers=m, delta=2, rounds=3, seed=1, task="linreg:samples=200,dim=8",
                    delay="exp:0.002")
    pcap = tmp_path / "hosts.pcap"
    run_live(cfg, schemes, RunOptions(
        mode="coroutines", out_dir=tmp_path / "run", plots=False, loop="asyncio", pcap=pcap,
        worker_hosts=2))
    events = [e for e in map(json.loads, (tmp_path / "run" / "events.jsonl").open())
              if e["direction"] in ("in", "out")]

    # 1. the tap: aiogc's own host decoder reads every direction to its end
    decoded = {True: collections.Counter[str](), False: collections.Counter[str]()}
    opened: collections.Counter[int] = collections.Counter()
    firsts = {}
    for (sport, _, _), data in _streams(pcap).items():
        host_side = data[:4] == HOST_MAGIC.to_bytes(4, "big")
        for slot, msg in _decode_host_stream(data, secret=True):
            if isinstance(msg, Preamble):
                firsts[sport] = msg.first
            elif isinstance(msg, Control):
                if msg.op == OPEN:
                    opened[firsts[sport] + msg.slot] += 1
            else:
                assert slot != HOST_SLOT
                decoded[not host_side][msg.kind] += 1
    sent = collections.Counter(e["kind"] for e in events if e["direction"] == "out")
    got = collections.Counter(e["kind"] for e in events if e["direction"] == "in")
    assert decoded[True] == sent
    assert decoded[False] - got <= collections.Counter(
        dict.fromkeys(_UNPROMPTED, 2 * m)) and not got - decoded[False]
    assert sorted(opened) == list(range(m)) and sum(opened.values()) == got["hello"]

    # 2. the dissector
    kinds = _check_against_events(pcap, tmp_path / "run", schemes)
    assert kinds == decoded[True] + decoded[False]
    assert {"challenge", "hello", "welcome", "ready", "round_start", "chunk_report",
            "encode_and_transmit", "coded_gradient", "shutdown"} <= set(kinds)
    # one challenge per session, and one per host connection (sent before the PS knew)
    assert kinds["challenge"] == got["hello"] + 2 * len(schemes)
    infos = [i for _, _, i in _pdus(pcap)]
    assert sum(i.startswith("host preamble(host") for i in infos) == 2 * len(schemes)
    assert sum(i.startswith("host preamble(PS") for i in infos) == 2 * len(schemes)
    assert sorted({int(i.split(" ")[0][1:]) for i in infos if i.startswith("w")}) \
        == list(range(m))
    assert _tshark_run(pcap, "-Y", "aiogc.tag")  # the run has a secret: tagged frames
    assert _malformed(pcap) == []


def test_standalone_ps_capture(tmp_path: Path) -> None:
    """``aiogc ps --pcap`` (loopback, port 0) with a worker host (``--id 0-2``) and a plain
    worker (``--id 3``): one capture holds both kinds of connection, and the dissected frames
    are those the PS recorded, worker by worker."""

    _tshark()
    secret = tmp_path / "secret"
    secret.write_bytes(b"0123456789abcdef0123456789abcdef")
    out, pcap = tmp_path / "run", tmp_path / "ps.pcap"
    ps = cli("ps", "--port", "0", "--workers", "4", "--delta", "2", "--rounds", "3",
             "--delay", "exp:0.003", "--task", "linreg:samples=120,dim=6",
             "--secret-file", str(secret), "--out", str(out), "--loop", "asyncio",
             "--pcap", str(pcap), "--join-timeout", CLI_JOIN_TIMEOUT_S)
    workers: list[subprocess.Popen[str]] = []
    try:
        addr = listening(ps)
        workers = [cli("worker", "--connect", addr, "--id", ids, "--secret-file", str(secret))
                   for ids in ("0-2", "3")]
        _, ps_err = ps.communicate(timeout=120)  # hang guard only
        for w in workers:
            w.communicate(timeout=120)
    finally:
        for p in [ps, *workers]:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert ps.returncode == 0, ps_err
    kinds = _check_against_events(pcap, out, ["partial"])
    assert {"challenge", "hello", "welcome", "ready", "round_start", "coded_gradient",
            "shutdown"} <= set(kinds)
    infos = [i for _, _, i in _pdus(pcap)]
    assert any(i.startswith("w2 hello(") for i in infos)  # the host's records
    assert any(i.startswith("hello(") and "worker=3" in i for i in infos)  # the plain one
    assert _malformed(pcap) == []


# ---------------------------------------------------------------------------- plain msgpack


#: what a field of each msgpack form decodes to with plain ``msgpack.unpackb`` (§2.1)
_PLAIN_TYPES: dict[str, Any] = {"uint": int, "float": float, "str": str, "bin": bytes,
                                "uint_array": list, "float_array": list, "map": dict,
                                "dtype": int, "payload": bytes}


def _plain_frames(data: bytes, secret: bool) -> list[tuple[int | None, str, dict[str, Any]]]:
    """One direction of a captured connection split by docs/protocol.md alone (§2.1 frames,
    §2.5 which frames carry a tag, §2.6 a host connection's preamble and records), each
    frame's body decoded by plain ``msgpack.unpackb`` (no options) into its documented
    fields: ``(slot or None, kind, {field: value})``; a host connection's preambles and
    control records as ``(None, "preamble" / "control", {...})``."""
    import msgpack

    from aiogc.protocol.headers import WIRE_FIELDS

    names = {code: kind for kind, code in KIND_CODES.items()}
    from_ps = data[:4] != b"AGCH"
    out: list[tuple[int | None, str, dict[str, Any]]] = []
    host, pos = False, 0
    tagged: set[int | None] = set()  # sessions whose frames carry a tag from now on
    while pos < len(data):
        if not host and data[pos:pos + 4] == b"AGCH":
            _, version, role, first, count = struct.unpack_from(">IBBIH", data, pos)
            out.append((None, "preamble", {"version": version, "role": role, "first": first,
                                           "count": count}))
            host, pos = True, pos + 12
            continue
        slot = None
        if host:
            (slot,) = struct.unpack_from(">H", data, pos)
            if slot == 0xFFFF:
                op, arg = struct.unpack_from(">HH", data, pos + 2)
                out.append((None, "control", {"op": op, "slot": arg}))
                pos += 6
                continue
            pos += 2
        (size,) = struct.unpack_from(">I", data, pos)
        obj = msgpack.unpackb(data[pos + 4:pos + 4 + size])  # the whole body, payload included
        pos += 4 + size
        assert type(obj) is list and obj[0] == 5, obj[:2]
        kind = names[obj[1]]
        fields = WIRE_FIELDS[kind]
        assert len(obj) == len(fields) + 2, (kind, len(obj))
        values = dict(zip((n for n, _ in fields), obj[2:], strict=True))
        for (name, checker), v in zip(fields, obj[2:], strict=True):
            assert isinstance(v, _PLAIN_TYPES[checker.tag]), (kind, name, v)
        if kind in ("challenge", "hello", "welcome"):
            # a new session's handshake (a slot reopened after its session ended, too): its
            # frames carry no tag, and the ones after it do once it authenticated
            tagged.discard(slot)
        elif slot != HOST_SLOT and slot in tagged:
            pos += 16
        if secret and kind == ("welcome" if from_ps else "hello"):
            tagged.add(slot)
        out.append((slot, kind, values))
    assert pos == len(data)
    return out


def test_live_capture_decodes_with_plain_msgpack(tmp_path: Path) -> None:
    """A real run (worker hosts and plain sessions' frames, every live scheme, a secret:
    tagged frames; chunks slower than the heartbeat: pings and pongs) captured with --pcap:
    every frame's body is one msgpack object that plain ``msgpack.unpackb`` returns whole,
    as the documented positional fields, payloads included; the frames are those the PS
    recorded in events.jsonl."""
    from aiogc.config import RunConfig
    from aiogc.harness.local import run_live
    from aiogc.harness.options import RunOptions
    from aiogc.protocol.headers import DTYPE_CODES

    schemes = ["partial", "original", "uncoded", "ignore-stragglers", "stream-chunks"]
    cfg = RunConfig(workers=4, delta=2, rounds=2, seed=1, task="linreg:samples=200,dim=8",
                    delay="const:0.12", heartbeat_s=0.03)
    pcap = tmp_path / "plain.pcap"
    run_live(cfg, schemes, RunOptions(mode="coroutines", out_dir=tmp_path / "run", plots=False,
                                      loop="asyncio", pcap=pcap, worker_hosts=2))
    seen: collections.Counter[str] = collections.Counter()
    from_ps: collections.Counter[str] = collections.Counter()
    for data in _streams(pcap).values():
        frames = _plain_frames(data, secret=True)
        for _slot, kind, values in frames:
            seen[kind] += 1
            if data[:4] != b"AGCH" and kind not in ("preamble", "control"):
                from_ps[kind] += 1
            if "payload" in values or "model" in values:
                arr = values["payload"] if "payload" in values else values["model"]
                dtype = DTYPE_CODES[values["dtype"]]
                assert len(arr) % dtype.itemsize == 0
                assert np.isfinite(np.frombuffer(arr, dtype)).all()
    assert {"challenge", "hello", "welcome", "ready", "round_start", "chunk_report",
            "encode_and_transmit", "coded_gradient", "chunk_gradient", "ping", "pong",
            "shutdown", "preamble", "control"} <= set(seen), seen
    events = [e for e in map(json.loads, (tmp_path / "run" / "events.jsonl").open())
              if e["direction"] == "out"]
    assert from_ps == collections.Counter(e["kind"] for e in events)


def test_standalone_capture_with_a_refused_peer_decodes_with_plain_msgpack(
        tmp_path: Path) -> None:
    """``aiogc ps --pcap`` with a worker host (``--id 0-1``) and a peer whose ``hello`` carries
    a wrong MAC: the capture holds the PS's ``error`` to that peer, and every body of every
    connection decodes with plain ``msgpack.unpackb`` into the documented fields."""
    import socket

    import msgpack

    secret = tmp_path / "secret"
    secret.write_bytes(b"0123456789abcdef0123456789abcdef")
    out, pcap = tmp_path / "run", tmp_path / "ps.pcap"
    ps = cli("ps", "--port", "0", "--workers", "2", "--delta", "2", "--rounds", "2",
             "--delay", "exp:0.003", "--task", "linreg:samples=80,dim=4",
             "--secret-file", str(secret), "--out", str(out), "--loop", "asyncio",
             "--pcap", str(pcap), "--join-timeout", CLI_JOIN_TIMEOUT_S)
    worker: subprocess.Popen[str] | None = None
    try:
        addr = listening(ps)
        host, port = addr.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=60) as peer:
            buf = b""
            while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
                buf += peer.recv(4096)
            challenge = msgpack.unpackb(buf[4:4 + int.from_bytes(buf[:4], "big")])
            hello = msgpack.packb([5, KIND_CODES["hello"], 1, bytes(16), bytes(32),
                                   challenge[3]])
            peer.sendall(len(hello).to_bytes(4, "big") + hello)
            while peer.recv(4096):  # the PS's error, then its close
                pass
        worker = cli("worker", "--connect", addr, "--id", "0-1", "--secret-file", str(secret))
        _, ps_err = ps.communicate(timeout=120)  # hang guard only
        worker.communicate(timeout=120)
    finally:
        for p in [ps, worker]:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert ps.returncode == 0, ps_err
    kinds: collections.Counter[str] = collections.Counter()
    for data in _streams(pcap).values():
        for _slot, kind, values in _plain_frames(data, secret=True):
            kinds[kind] += 1
            if kind == "error":
                assert values["code"] and isinstance(values["reason"], str)
    assert {"challenge", "hello", "welcome", "ready", "round_start", "chunk_report",
            "encode_and_transmit", "coded_gradient", "shutdown", "error", "preamble",
            "control"} <= set(kinds), kinds
