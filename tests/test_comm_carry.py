"""Late vectors carried into the next round (aiogc/sim/carry.py): a send-when-done straggler
that finished before the next round start reached it still occupies its uplink and the shared
PS ingress; one still computing drops the round. By hand, and trial by trial against the
protocol engine (whose links persist across rounds, as live ones do)."""

from __future__ import annotations

import numpy as np
import pytest

from aiogc.config import RunConfig, parse_bandwidth
from aiogc.sim.carry import fifo_served
from aiogc.sim.engine import SimNetwork
from aiogc.sim.fast import simulate_fast
from aiogc.sim.protocol import record_arrays, simulate_protocol
from aiogc.training.delays import materialise
from aiogc.training.schedule import DelaySchedule

#: d = 1000 float64: a coded vector is 8035 bytes on the wire, so at 8035 B/s it takes 1 s
DIM, ONE_S = 1000, "8035B/s"


def test_fifo_served_is_the_sequential_rule() -> None:
    rng = np.random.default_rng(3)
    for free in (-np.inf, 0.4, 2.0):
        e = np.sort(rng.uniform(0.0, 3.0, size=9))
        e[-2:] = np.inf  # never sent: last, served at inf
        want, f = [], free
        for x in e:
            f = max(f, x) + 0.25
            want.append(f)
        np.testing.assert_allclose(fifo_served(e, 0.25, free), want, rtol=1e-13)


def _schedule(rows: list[list[float]]) -> DelaySchedule:
    c = np.array(rows, dtype=np.float64)[:, :, None]  # (R, m, 1): one chunk per worker
    return DelaySchedule(c, np.zeros(c.shape[:2]))


def _both(bw: str, sched: DelaySchedule) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ignore-stragglers, m = 3, k = 2: fast path, engine, and the fast path one round at a
    time (independent rounds: what it computed before the carry)."""
    cfg = RunConfig(workers=3, delta=2, rounds=sched.rounds, seed=0, k=2)
    comm = parse_bandwidth(bw)
    name = ["ignore-stragglers"]
    fast = simulate_fast(cfg, name, schedule=sched, comm=comm, dim=DIM, mse=False)
    eng = simulate_protocol(cfg, name, schedule=sched, comm=comm, dim=DIM, gradients="gaussian")
    alone = [simulate_fast(cfg.replace(rounds=1), name, comm=comm, dim=DIM, mse=False,
                           schedule=DelaySchedule(sched.compute_s[r:r + 1],
                                                  sched.network_s[r:r + 1])
                           )[name[0]].completion_s[0] for r in range(sched.rounds)]
    return (fast[name[0]].completion_s, record_arrays(eng[name[0]], mode="exact")["completion_s"],
            np.array(alone))


def test_late_vector_holds_the_shared_ingress_by_hand() -> None:
    """ps at 1 s per vector, workers unlimited. Round 0: vectors leave at 1.0 / 1.1 / 1.2,
    served until 2, 3, 4; the round ends at 3 (k = 2) and worker 2's vector (sent at 1.2)
    holds the ingress until 4, i.e. 1 s into round 1. Round 1: vectors at 0.5 / 0.6 / 0.7 are
    served from 1 on: 2, 3 -> ends at 3 (2.5 with an idle ingress)."""
    fast, eng, alone = _both(f"ps={ONE_S}", _schedule([[1.0, 1.1, 1.2], [0.5, 0.6, 0.7]]))
    np.testing.assert_allclose(fast, [3.0, 3.0], rtol=1e-12)
    np.testing.assert_allclose(eng, fast, rtol=0, atol=1e-12)
    np.testing.assert_allclose(alone, [3.0, 2.5], rtol=1e-12)


def test_late_vector_holds_its_uplink_and_a_dropped_one_does_not_by_hand() -> None:
    """worker_up at 1 s per vector, no ingress, an unlimited download (the round start
    arrives at once). Round 0 (1.0, 1.1, 1.5): arrivals 2.0, 2.1, 2.5, ends at 2.1; worker 2
    sent at 1.5, its uplink busy until 0.4 into round 1. Round 1 (0.1, 0.9, 0.2): worker 2's
    vector leaves at max(0.2, 0.4) + 1 = 1.4 (not 1.2), so the round ends at 1.4; worker 1,
    done at 0.9 < 1.4, sent too (busy until 0.5 into round 2). Round 2 (2.0, 0.3, 0.1):
    worker 1's vector leaves at max(0.3, 0.5) + 1 = 1.5, worker 2's at 1.1: ends at 1.5;
    worker 0, still computing at 1.5, drops its vector. Round 3 (0.1, 0.2, 0.3): every
    uplink is idle again: 1.2."""
    sched = _schedule([[1.0, 1.1, 1.5], [0.1, 0.9, 0.2], [2.0, 0.3, 0.1], [0.1, 0.2, 0.3]])
    fast, eng, alone = _both(f"worker_up={ONE_S}", sched)
    np.testing.assert_allclose(fast, [2.1, 1.4, 1.5, 1.2], rtol=1e-12)
    np.testing.assert_allclose(eng, fast, rtol=0, atol=1e-12)
    np.testing.assert_allclose(alone, [2.1, 1.2, 1.3, 1.2], rtol=1e-12)


@pytest.mark.parametrize(("bw", "mode", "deadline", "latency", "seed"), [
    ("ps=1MB/s", "exact", None, 0.0, 1),
    ("worker_up=1MB/s", "exact", None, 0.004, 2),
    ("worker=4MB/s,ps=1MB/s", "exact", None, 0.002, 3),
    ("ps=1MB/s", "approx", 0.3, 0.0, 4),
    ("worker_up=2MB/s,worker_down=8MB/s,ps=1MB/s", "approx", 0.2, 0.002, 5),
])
def test_engine_agrees_trial_by_trial_when_vectors_carry(bw: str, mode: str,
                                                         deadline: float | None,
                                                         latency: float, seed: int) -> None:
    """m = 8, δ = 3, 20 ms chunks, 80 kB vectors (80 ms per vector at 1 MB/s): upload-bound,
    so the send-when-done stragglers' vectors carry into the next round. Fast path and engine
    agree on every round's time, trigger, status (and MSE in approx mode), for every scheme;
    and the carry matters here: in exact mode ignore-stragglers' rounds are never shorter,
    some longer, than the same rounds computed one at a time (behind a shared ingress > 3 %
    in the mean; per-worker uplinks alone drain while the next round computes, so less
    there); in approximate mode they decode with fewer vectors."""
    dim = 10_000
    cfg = RunConfig(workers=8, delta=3, rounds=25, delay="exp:0.02", seed=seed, mode=mode,
                    deadline_s=deadline)
    comm = parse_bandwidth(bw)
    names = ["partial", "original", "uncoded", "ignore-stragglers", "stream-chunks"]
    sched = materialise(cfg.delay, cfg.latency, rounds=cfg.rounds, m=8, max_chunks=3,
                        seed=seed)
    f = simulate_fast(cfg, names, schedule=sched, comm=comm, dim=dim, latency=latency)
    p = simulate_protocol(cfg, names, schedule=sched, comm=comm, dim=dim, gradients="gaussian",
                          network=SimNetwork(latency=latency))
    for n in names:
        ra = record_arrays(p[n], mode=mode)
        np.testing.assert_allclose(ra["completion_s"], f[n].completion_s, rtol=0, atol=1e-9,
                                   err_msg=n)
        np.testing.assert_array_equal(ra["status"], f[n].status, err_msg=n)
        # a failed approximate round has no trigger in the engine's record (the fast path
        # puts it at the deadline, where the round ended): compare the others
        ok = ra["status"] != "failed"
        np.testing.assert_allclose(ra["trigger_s"][ok], f[n].trigger_s[ok], rtol=0, atol=1e-9,
                                   err_msg=n)
        mse = f[n].mse
        if mse is not None:
            np.testing.assert_allclose(ra["mse"], mse, rtol=1e-6, atol=1e-12, err_msg=n)
    alone = [simulate_fast(
        cfg.replace(rounds=1), ["ignore-stragglers"], comm=comm, dim=dim, latency=latency,
        mse=False, schedule=DelaySchedule(sched.compute_s[r:r + 1], sched.network_s[r:r + 1]),
    )["ignore-stragglers"] for r in range(cfg.rounds)]
    carried = f["ignore-stragglers"]
    if mode == "exact":
        t_alone = np.array([a.completion_s[0] for a in alone])
        assert np.all(carried.completion_s >= t_alone - 1e-12)
        assert np.any(carried.completion_s > t_alone + 1e-6)
        if "ps=" in bw:  # every late vector queues at the shared ingress: a gap in the mean
            assert carried.completion_s.mean() > 1.03 * t_alone.mean()
    else:  # every round ends at T: the carry shows in how many vectors it decodes with
        n_alone = sum(int(a.states.astype(bool).sum()) for a in alone)
        assert int(carried.states.astype(bool).sum()) < n_alone


# ------------------------------------------------------------ stream-chunks: the same rule


def _stream_reference(cfg: RunConfig, sched: DelaySchedule, bw: str, dim: int,
                      latency: float) -> np.ndarray:
    """stream-chunks' round times from scratch, in absolute time: every round's frames join
    one list of every frame ever sent, and the ingress is re-served FIFO by exit time over the
    whole list each round (no relative-time bookkeeping); a frame a worker finished after the
    next round start reached it is struck off the list (it was never sent)."""
    from aiogc.sim.comm import FrameBytes

    scheme = cfg.for_scheme("stream-chunks").build_scheme()
    comm = parse_bandwidth(bw)
    fb = FrameBytes.of(scheme, dim, cfg.coded_wire_dtype, cfg.payload_dtype)
    b = float(fb.chunk_vector)
    m, loads = scheme.m, [int(x) for x in scheme.loads]
    K = max(loads)
    t0, up_free = 0.0, [-np.inf] * m
    sent: list[tuple[float, int]] = []  # (exit, serial) of every frame ever sent
    out = []
    for r in range(sched.rounds):
        rs = [latency + (fb.round_start[j] / comm.down_Bps if comm.down_Bps else 0.0)
              for j in range(m)]
        frames = []  # (send_abs, exit_abs, j, k)
        for j in range(m):
            done, prev = 0.0, up_free[j]
            for k in range(loads[j]):
                done += float(sched.compute_s[r, j, k])
                s = t0 + rs[j] + done + float(sched.network_s[r, j])
                e = (max(s, prev) + b / comm.up_Bps) if comm.up_Bps else s
                prev = e
                frames.append((s, e, j, k))
        pool = sent + [(e, 10**9 + i) for i, (_, e, _, _) in enumerate(frames)]
        order = sorted(range(len(pool)), key=lambda i: pool[i])
        served, f = {}, -np.inf
        for i in order:
            f = (max(f, pool[i][0]) + b / comm.ps_Bps) if comm.ps_Bps else pool[i][0]
            served[i] = f
        a = np.full((1, m, K), np.inf)
        for i, (_, _, j, k) in enumerate(frames):
            a[0, j, k] = served[len(sent) + i] + latency - t0
        end = float(scheme.decode_times(a)[0])
        out.append(end)
        for s, e, j, _ in frames:
            if s - float(sched.network_s[r, j]) < t0 + end + rs[j]:
                sent.append((e, len(sent) + 10**6 * (r + 1)))
                up_free[j] = max(up_free[j], e)
        t0 += end
    return np.array(out)


@pytest.mark.parametrize(("bw", "latency", "seed"), [
    ("ps=1MB/s", 0.0, 1),
    ("worker_up=1MB/s", 0.003, 2),
    ("worker=4MB/s,ps=1MB/s", 0.002, 3),
    ("worker_up=2MB/s,worker_down=8MB/s,ps=600KB/s", 0.001, 4),
])
def test_stream_chunks_frames_carry_by_the_same_rule(bw: str, latency: float,
                                                     seed: int) -> None:
    """m = 8, δ = 3, 20 ms chunks, 80 kB chunk vectors: every chunk vector a worker finished
    before the next round start reached it (duplicates included) keeps its uplink and the
    ingress busy into the next round. The fast path equals the from-scratch reference round
    by round, and the carry matters: no round is shorter than on idle links, and behind the
    shared ingress the mean is longer."""
    dim = 10_000
    cfg = RunConfig(workers=8, delta=3, rounds=20, delay="exp:0.02", seed=seed,
                    scheme="stream-chunks")
    comm = parse_bandwidth(bw)
    sched = materialise(cfg.delay, cfg.latency, rounds=cfg.rounds, m=8, max_chunks=3,
                        seed=seed)
    f = simulate_fast(cfg, ["stream-chunks"], schedule=sched, comm=comm, dim=dim,
                      latency=latency, mse=False)["stream-chunks"]
    want = _stream_reference(cfg, sched, bw, dim, latency)
    np.testing.assert_allclose(f.completion_s, want, rtol=1e-12, atol=1e-12)
    alone = np.array([simulate_fast(
        cfg.replace(rounds=1), ["stream-chunks"], comm=comm, dim=dim, latency=latency,
        mse=False, schedule=DelaySchedule(sched.compute_s[r:r + 1], sched.network_s[r:r + 1]),
    )["stream-chunks"].completion_s[0] for r in range(cfg.rounds)])
    assert np.all(f.completion_s >= alone - 1e-12)
    if comm.ps_Bps is not None:
        assert f.completion_s.mean() > 1.03 * alone.mean()


def test_stream_chunks_by_hand() -> None:
    """m = 2, δ = 2 (both workers hold both chunks, in opposite orders), ps at 1 s per chunk
    vector, workers unlimited, round start at once. Round 0, chunk times (0.1, 0.1) for
    worker 0 and (0.2, 0.2) for worker 1: worker 0's frames leave at 0.1 and 0.2, worker 1's
    at 0.2 and 0.4; served 1.1 (w0 c0), 2.1 (w0 c1): the round ends at 2.1 with every chunk
    in, and worker 1's two duplicates, sent long before, hold the ingress until 4.1, i.e.
    2.0 into round 1. Round 1 (0.1, 0.1 / 0.1, 0.1): four frames leave at 0.1, 0.1, 0.2, 0.2,
    queued behind the carried ones: served 3.0, 4.0 -> the round ends at 4.0 (2.0 on idle
    links)."""
    c = np.array([[[0.1, 0.1], [0.2, 0.2]], [[0.1, 0.1], [0.1, 0.1]]])
    sched = DelaySchedule(c, np.zeros((2, 2)))
    cfg = RunConfig(workers=2, delta=2, rounds=2, seed=0, scheme="stream-chunks")
    from aiogc.sim.comm import FrameBytes

    scheme = cfg.build_scheme()
    b = FrameBytes.of(scheme, DIM).chunk_vector
    comm = parse_bandwidth(f"ps={b}B/s")
    f = simulate_fast(cfg, ["stream-chunks"], schedule=sched, comm=comm, dim=DIM,
                      mse=False)["stream-chunks"]
    assert [list(o) for o in scheme.orders] == [[0, 1], [1, 0]]
    np.testing.assert_allclose(f.completion_s, [2.1, 4.0], rtol=1e-12)
