"""The work floor (bench/floor.py --mux --work) does real work: its frames carry per-worker tags
that a flipped byte fails, and its decode equals the true full gradient. No sockets: the
connections' frame handling is driven directly with a recording transport."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import floor


class _Transport:
    """Records what a connection writes; ``close`` is remembered."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data.append(bytes(data))

    def close(self) -> None:
        self.closed = True


def _pair(m: int) -> tuple[Any, Any, list[tuple[int, int, bytes]], _Transport]:
    """A PS-side sender and a host-side receiver with the floor's keys; the receiver's frames
    land in the returned list."""
    down, up = floor.work_keys(m, seed=1)
    got: list[tuple[int, int, bytes]] = []
    ps = floor._AuthMuxConn(lambda *f: None, down, up)
    host = floor._AuthMuxConn(lambda k, s, b: got.append((k, s, b)), up, down)
    ps.t, host.t = _Transport(), _Transport()
    return ps, host, got, host.t


def _sent(conn: Any, frames: list[tuple[int, int, bytes]]) -> bytes:
    for kind, slot, body in frames:
        conn.send(kind, slot, body)
    conn.flush()
    return b"".join(conn.t.data)


def test_tagged_frames_arrive_per_worker() -> None:
    ps, host, got, t = _pair(3)
    frames = [(floor.START, 0, b"model-0"), (floor.START, 2, b"model-2"),
              (floor.ENCODE, 0, b"\x00\x00\x00\x00state")]
    wire = _sent(ps, frames)
    host.data_received(wire[:5])  # split reads reassemble
    host.data_received(wire[5:])
    assert got == frames
    assert host.refused == 0 and not t.closed


def test_a_flipped_byte_fails_verification() -> None:
    for pos in (0, 4, 5, 8, -1):  # length, kind, slot, body, tag
        ps, host, got, t = _pair(3)
        wire = bytearray(_sent(ps, [(floor.START, 1, b"model-bytes")]))
        wire[pos] ^= 0x01
        if pos == 0:
            # a longer length is an incomplete frame, never delivered; make it complete
            wire += bytes(1 << 24)
        host.data_received(bytes(wire))
        assert got == [], pos
        assert host.refused == 1 and t.closed, pos


def test_a_frame_under_another_workers_key_fails() -> None:
    ps, host, got, t = _pair(3)
    wire = bytearray(_sent(ps, [(floor.START, 1, b"model-bytes")]))
    wire[6] = 2  # slot 1's frame relabelled as slot 2's: slot 2's key does not verify it
    host.data_received(bytes(wire))
    assert got == [] and host.refused == 1 and t.closed


def test_replayed_frame_fails() -> None:
    ps, host, got, _ = _pair(2)
    wire = _sent(ps, [(floor.REPORT, 0, b"\x00" * 8)])
    host.data_received(wire)
    host.data_received(wire)  # the sequence number moved on
    assert len(got) == 1 and host.refused == 1


def test_work_floor_decodes_the_full_gradient() -> None:
    """A short live run on loopback (port 0): every round's decode against the oracle, and the
    full-gradient check on rounds 0 and 10, both inside the floor (it raises otherwise)."""
    out = floor.floor_round_vs_sim(16, rounds=12, seed=3, work=True)
    assert out["work"] and out["checked_rounds"] == 2
    assert out["max_rel_error"] <= 1e-9
    assert np.isfinite(out["final_loss"])
