"""The communication model (aiogc/sim/comm.py): spec parsing, the FIFO links, hand-computed
round times in the fast path, and trial-by-trial agreement with the protocol engine."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from aiogc.coding.registry import register_scheme, scheme_spec, unregister_scheme
from aiogc.config import CommModel, RunConfig, parse_bandwidth
from aiogc.errors import ConfigError
from aiogc.protocol.messages import ChunkGradient, ChunkReport, CodedGradient
from aiogc.sim.comm import (
    FrameBytes,
    frame_bytes,
    link_exits,
    ps_ingress,
)
from aiogc.sim.engine import SimNetwork
from aiogc.sim.fast import simulate_fast
from aiogc.sim.protocol import record_arrays, simulate_protocol


def test_parse_bandwidth() -> None:
    assert parse_bandwidth("worker=100MB/s,ps=1GB/s") == CommModel(1e8, 1e8, 1e9)
    assert parse_bandwidth("worker_up=2.5KB/s, worker_down=3e3 B/s") == CommModel(2500.0, 3000.0)
    assert parse_bandwidth(None) == parse_bandwidth("none") == CommModel()
    assert not CommModel().limited and parse_bandwidth("ps=1GB/s").limited
    assert parse_bandwidth(parse_bandwidth("worker_up=1MB/s,ps=2MB/s").spec()) == CommModel(
        1e6, None, 2e6)
    with pytest.raises(ConfigError, match=r"bandwidth.worker='10Mb'.*MB/s"):
        parse_bandwidth("worker=10Mb")
    assert parse_bandwidth("worker=100MB/s,ps=1GB/s").spec() == (
        "worker_up=100MB/s,worker_down=100MB/s,ps=1GB/s")
    with pytest.raises(ConfigError, match=r"bandwidth.worker='10Mb/s'.*bits"):
        parse_bandwidth("worker=10Mb/s")
    with pytest.raises(ConfigError, match=r"bandwidth.ps='0B/s'"):
        parse_bandwidth("ps=0B/s")
    with pytest.raises(ConfigError, match="keys worker, worker_up, worker_down, ps"):
        parse_bandwidth("uplink=1MB/s")
    with pytest.raises(ConfigError, match="not both"):
        parse_bandwidth("worker=1MB/s,worker_up=2MB/s")
    with pytest.raises(ConfigError, match="each key once"):
        parse_bandwidth("ps=1MB/s,ps=2MB/s")


def test_frame_bytes_are_the_wire_sizes() -> None:
    # msgpack arrays: a 28-byte report, a 35-byte coded-vector head, a 34-byte streamed-chunk
    # head (small ints are one byte)
    assert frame_bytes(ChunkReport(epoch=1, round=7, count=2, t_worker=0.0, elapsed_s=0.0)) == 28
    v = CodedGradient(epoch=1, round=1, attempt=0, state_digest=b"\0" * 8, compute_s=0.0,
                      payload=np.zeros(1000))
    assert frame_bytes(v) == 35 + 8000
    sc = RunConfig(workers=4, delta=2, n_parts=2).build_scheme()
    fb = FrameBytes.of(sc, 1000, "float32")
    # a streamed chunk travels in the payload dtype, the model's (float64 here), never in a
    # 16-bit upload type
    assert (fb.report, fb.vector, fb.chunk_vector) == (28, 35 + 4 * 500, 34 + 8 * 1000)
    chunk = ChunkGradient(epoch=1, round=1, chunk=3, compute_s=0.5, elapsed_s=0.75,
                          payload=np.zeros(1000))
    assert frame_bytes(chunk) == fb.chunk_vector
    assert fb.round_start.tolist() == [26 + 9 * 2 + 8 * 1000] * 4
    # the extrapolation from one value equals the whole frames
    from aiogc.protocol.messages import RoundStart

    whole = frame_bytes(RoundStart(epoch=1, round=3, delays_s=(0.1, 0.2), net_delay_s=0.0,
                                   model=np.zeros(1000)))
    assert whole == fb.round_start[0]
    v32 = CodedGradient(epoch=1, round=1, attempt=0, state_digest=b"\1" * 8, compute_s=2.0,
                        payload=np.zeros(500, dtype=np.float32))
    assert frame_bytes(v32) == fb.vector


def test_fifo_links_by_hand() -> None:
    # one worker, frames of 10 and 20 bytes at t = 0 and 0.5 on a 10 B/s link: exits 1, 3
    send = np.array([[[0.0, 0.5, np.inf]]])
    np.testing.assert_allclose(link_exits(send, np.array([10, 20, 5]), 10.0),
                               [[[1.0, 3.0, np.inf]]])
    # two workers' frames leave at 1.0 and 0.5 into a 10 B/s ingress: served 0.5 first
    ex = np.array([[[1.0], [0.5]]])
    np.testing.assert_allclose(ps_ingress(ex, np.array([10.0]), 10.0), [[[2.5], [1.5]]])
    np.testing.assert_array_equal(ps_ingress(ex, 10.0, None), ex)


# ---- hand-computed rounds -------------------------------------------------------------------
#
# m = 4, delta = 2, cyclic, every chunk takes exactly 1 s, d = 1_250_000 float64, latency 0.
# Frames: report 28 B, a full vector 10_000_035 B, an ell = 2 vector 5_000_035 B, a streamed
# chunk 10_000_034 B.
# worker_up = 10 MB/s: a report takes 2.8 us, a full vector 1.0000035 s, half 0.5000035 s, a
#   streamed chunk 1.0000034 s.
#   partial ell=1: every chunk covered at t = 1 (optimal orders start on distinct chunks);
#     trigger 1 + 2.8e-6; every worker sends a full vector: end 2.0000063.
#   partial ell=2: needs both chunks of every worker: trigger 2.0000028, end 2.5000063.
#   stream-chunks: first chunks cover everything, streamed at t = 1: end 2.0000034.
# worker_up = 1 MB/s (ten times slower): ell=1 ends 1.000028 + 10.000035 = 11.000063,
#   ell=2 2.000028 + 5.000035 = 7.000063: ell = 2 gains as bandwidth falls.
# ps = 10 MB/s (shared ingress, workers unlimited): 4 reports queue (11.2 us per wave);
#   ell=1: 1.0000112 + 4 x 1.0000035 = 5.0000252; ell=2: 2.0000112 + 4 x 0.5000035 =
#   4.0000252; stream-chunks: 1 + 4 x 1.0000034 = 5.0000136; original (Tandon, needs 3 of
#   4 full vectors sent at t = 2): 2 + 3 x 1.0000035 = 5.0000105.
HAND = {
    ("worker_up=10MB/s", 1): {"partial": 2.0000063, "stream-chunks": 2.0000034},
    ("worker_up=10MB/s", 2): {"partial": 2.5000063},
    ("worker_up=1MB/s", 1): {"partial": 11.000063, "stream-chunks": 11.000034},
    ("worker_up=1MB/s", 2): {"partial": 7.000063},
    ("ps=10MB/s", 1): {"partial": 5.0000252, "stream-chunks": 5.0000136,
                       "original": 5.0000105},
    ("ps=10MB/s", 2): {"partial": 4.0000252},
}


@pytest.mark.parametrize(("bw", "ell"), list(HAND))
def test_hand_computed_round_times(bw: str, ell: int) -> None:
    cfg = RunConfig(workers=4, delta=2, n_parts=ell, rounds=1, delay="const:1.0", seed=0)
    want = HAND[(bw, ell)]
    res = simulate_fast(cfg, list(want), comm=parse_bandwidth(bw), dim=1_250_000, mse=False)
    for name, t in want.items():
        assert res[name].completion_s[0] == pytest.approx(t, rel=1e-12, abs=1e-12), name
        assert res[name].status[0] == "exact"


def test_direction_of_the_comparison() -> None:
    """ell > 1 gains against ell = 1 as bandwidth falls; stream-chunks loses to partial when
    uploads dominate (the hand numbers above, as ratios)."""
    fast_l1 = HAND[("worker_up=10MB/s", 1)]["partial"]
    fast_l2 = HAND[("worker_up=10MB/s", 2)]["partial"]
    slow_l1 = HAND[("worker_up=1MB/s", 1)]["partial"]
    slow_l2 = HAND[("worker_up=1MB/s", 2)]["partial"]
    assert fast_l2 / fast_l1 > 1.2 and slow_l2 / slow_l1 < 0.7
    assert HAND[("ps=10MB/s", 1)]["stream-chunks"] > HAND[("ps=10MB/s", 2)]["partial"]


def test_unlimited_comm_changes_nothing() -> None:
    cfg = RunConfig(workers=8, delta=3, n_parts=2, rounds=40, delay="exp:1.0", seed=2)
    names = ["partial", "original", "uncoded", "stream-chunks"]
    a = simulate_fast(cfg, names, latency=0.01, mse=False)
    b = simulate_fast(cfg, names, latency=0.01, mse=False, comm=CommModel())
    for n in names:
        np.testing.assert_array_equal(a[n].completion_s, b[n].completion_s)


def test_stream_chunks_equals_partial_trigger_when_free() -> None:
    cfg = RunConfig(workers=10, delta=3, n_parts=1, rounds=200, delay="exp:1.0", seed=5)
    r = simulate_fast(cfg, ["partial", "stream-chunks"], mse=False)
    np.testing.assert_array_equal(r["stream-chunks"].completion_s, r["partial"].trigger_s)


@pytest.mark.parametrize(("bw", "mode", "latency", "seed", "dim", "deadline"), [
    ("worker=1MB/s", "exact", 0.0, 3, 50_000, None),
    ("worker_up=2MB/s,worker_down=5MB/s", "exact", 0.01, 3, 50_000, None),
    ("worker_up=2MB/s,worker_down=5MB/s", "approx", 0.01, 3, 50_000, 1.5),
    # the shared PS ingress (the engine's "enter the ingress" action)
    ("ps=3MB/s", "exact", 0.0, 4, 40_000, None),
    ("worker=2MB/s,ps=5MB/s", "exact", 0.01, 4, 40_000, None),
    ("worker_up=4MB/s,ps=6MB/s", "approx", 0.005, 4, 40_000, 2.0),
])
def test_protocol_engine_agrees_trial_by_trial(bw: str, mode: str, latency: float, seed: int,
                                               dim: int, deadline: float | None) -> None:
    cfg = RunConfig(workers=8, delta=3, n_parts=2, rounds=20, delay="exp:1.0", seed=seed,
                    mode=mode, deadline_s=deadline)
    comm = parse_bandwidth(bw)
    names = ["partial", "uncoded"] if mode == "approx" else ["partial", "original", "uncoded"]
    f = simulate_fast(cfg, names, comm=comm, dim=dim, latency=latency)
    p = simulate_protocol(cfg, names, comm=comm, dim=dim, gradients="gaussian",
                          network=SimNetwork(latency=latency))
    for n in names:
        ra = record_arrays(p[n], mode=mode)
        np.testing.assert_allclose(ra["completion_s"], f[n].completion_s, rtol=0, atol=1e-9)
        np.testing.assert_allclose(ra["trigger_s"], f[n].trigger_s, rtol=0, atol=1e-9)
        np.testing.assert_array_equal(ra["status"], f[n].status)
        mse = f[n].mse
        if mse is not None:
            np.testing.assert_allclose(ra["mse"], mse, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("bw", [bw for (bw, ell), want in HAND.items() if "stream-chunks" in want])
def test_hand_computed_stream_chunks_in_the_protocol_engine(bw: str) -> None:
    """The protocol engine's chunk_gradient frames cross the same links: the hand values."""
    cfg = RunConfig(workers=4, delta=2, rounds=1, delay="const:1.0", seed=0)
    recs = simulate_protocol(cfg, ["stream-chunks"], comm=parse_bandwidth(bw), dim=1_250_000,
                             gradients="gaussian")["stream-chunks"]
    t = record_arrays(recs, mode="exact")["completion_s"][0]
    assert t == pytest.approx(HAND[(bw, 1)]["stream-chunks"], rel=1e-12, abs=1e-12)
    assert recs[0].status == "exact"


def _not_live() -> str:
    """A copy of ``uncoded`` registered as a scheme the protocol core cannot run."""
    spec = replace(scheme_spec("uncoded"), name="uncoded-fast-only", live=False)
    register_scheme(spec)
    return spec.name


def test_protocol_engine_refuses_what_it_cannot_run() -> None:
    name = _not_live()
    try:
        cfg = RunConfig(workers=4, delta=2, rounds=2)
        built = {name: cfg.for_scheme("uncoded").build_scheme()}
        with pytest.raises(ConfigError, match="schemes the protocol core can run"):
            simulate_protocol(cfg, [name], built=built)
    finally:
        unregister_scheme(name)


def test_cli_simulate_bandwidth(capsys: pytest.CaptureFixture[str]) -> None:
    """``aiogc simulate --bandwidth``: the hand-computed case through the CLI at d = 10**6
    (--dim's cap) and 8 MB/s, so a full vector (8_000_035 B) takes 1.000004375 s, half of one
    0.500004375 s, a streamed chunk (8_000_034 B) 1.00000425 s and a report 3.5 us: partial
    ell=1 ends 1.0000035 + 1.000004375, stream-chunks 1 + 1.00000425 in the first round; its
    second chunks, handed over at 2 before that end, are sent and hold each uplink
    1.00000425 s into the next round (the carry rule of every scheme), so the second round's
    first chunks leave at 1.00000425 + 1.00000425: 2.0000085, mean 2.000006375; on a
    shared 8 MB/s ingress partial ell=2 ends
    2 + 4 x 3.5e-6 + 4 x 0.500004375 = 4.0000315. (const delays: the CLI warns about ties,
    harmless here since every tied state decodes the same.)"""
    import json
    import warnings

    from aiogc.cli import main

    base = ["simulate", "--workers", "4", "--delta", "2", "--delay", "const:1.0",
            "--trials", "2", "--dim", "1000000", "--schemes",
            "partial,original,uncoded,stream-chunks"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main([*base, "--bandwidth", "worker_up=8MB/s"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert main([*base, "--bandwidth", "ps=8MB/s", "--ell", "2", "--schemes",
                     "partial"]) == 0
        out2 = json.loads(capsys.readouterr().out)
    means = {r["scheme"]: r["completion_mean"] for r in out["results"]}
    assert means["partial"] == pytest.approx(2.000007875, rel=1e-12)
    assert means["stream-chunks"] == pytest.approx((2.00000425 + 2.0000085) / 2, rel=1e-12)
    ups = {r["scheme"]: r["uploads_mean"] for r in out["results"]}
    # stream-chunks: the second chunks are handed to the uplinks at t = 2, before the round
    # ends at 2.000004375 (the workers cannot know it is over): 8 full vectors
    assert ups == {"partial": 4, "original": 4, "uncoded": 4, "stream-chunks": 8}
    assert out["config"]["bandwidth"] == "worker_up=8MB/s"
    assert out2["results"][0]["completion_mean"] == pytest.approx(4.0000315, rel=1e-12)
    assert main([*base, "--bandwidth", "worker=10Mb/s"]) == 2
    assert "--bandwidth: '10Mb/s' is invalid" in capsys.readouterr().err


def test_live_commands_refuse_a_scheme_the_core_cannot_run(
        capsys: pytest.CaptureFixture[str]) -> None:
    from aiogc.cli import main

    name = _not_live()
    try:
        assert main(["run", "--schemes", f"partial,{name}", "--rounds", "1"]) == 2
    finally:
        unregister_scheme(name)
    err = capsys.readouterr().err
    assert name in err and "aiogc simulate --engine fast" in err
