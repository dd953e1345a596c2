"""The shared PS ingress in the protocol engine (engine_bandwidth.patch): trial by trial
against the fast path, and the hand-computed case."""

from __future__ import annotations

import numpy as np
import pytest

from aiogc.config import RunConfig
from aiogc.sim.comm import parse_bandwidth
from aiogc.sim.engine import SimNetwork
from aiogc.sim.fast import simulate_fast
from aiogc.sim.protocol import record_arrays, simulate_protocol


@pytest.mark.parametrize(("bw", "mode", "latency"), [
    ("ps=3MB/s", "exact", 0.0),
    ("worker=2MB/s,ps=5MB/s", "exact", 0.01),
    ("worker_up=4MB/s,ps=6MB/s", "approx", 0.005),
])
def test_ingress_engine_agrees_with_fast_path(bw: str, mode: str, latency: float) -> None:
    cfg = RunConfig(workers=8, delta=3, n_parts=2, rounds=20, delay="exp:1.0", seed=4,
                    mode=mode, deadline_s=2.0 if mode == "approx" else None)
    comm = parse_bandwidth(bw)
    names = ["partial", "uncoded"] if mode == "approx" else ["partial", "original", "uncoded"]
    f = simulate_fast(cfg, names, comm=comm, dim=40_000, latency=latency)
    p = simulate_protocol(cfg, names, comm=comm, dim=40_000, gradients="gaussian",
                          network=SimNetwork(latency=latency))
    for n in names:
        ra = record_arrays(p[n], mode=mode)
        np.testing.assert_allclose(ra["completion_s"], f[n].completion_s, rtol=0, atol=1e-9)
        np.testing.assert_allclose(ra["trigger_s"], f[n].trigger_s, rtol=0, atol=1e-9)
        np.testing.assert_array_equal(ra["status"], f[n].status)


def test_ingress_engine_hand_computed() -> None:
    """m = 4, delta = 2, 1 s chunks, d = 10**6, ps = 8 MB/s, ell = 2: four reports per wave
    (5.25 us each) and four half vectors (0.500007 s each) queue at the ingress:
    2 + 4 x 5.25e-6 + 4 x 0.500007 = 4.000049 s (the fast path's number in test_comm.py).
    The engine processes tied sends one at a time, so this is the same number."""
    cfg = RunConfig(workers=4, delta=2, n_parts=2, rounds=1, delay="const:1.0", seed=0)
    p = simulate_protocol(cfg, ["partial"], comm=parse_bandwidth("ps=8MB/s"), dim=1_000_000,
                          gradients="gaussian")
    ra = record_arrays(p["partial"], mode="exact")
    assert ra["completion_s"][0] == pytest.approx(4.000049, rel=1e-12)
