"""The shared PS ingress in the protocol engine: the hand-computed case (trial-by-trial
agreement with the fast path is tests/test_comm.py::test_protocol_engine_agrees_trial_by_trial)."""

from __future__ import annotations

import pytest

from aiogc.config import RunConfig, parse_bandwidth
from aiogc.sim.protocol import record_arrays, simulate_protocol


def test_ingress_engine_hand_computed() -> None:
    """m = 4, delta = 2, 1 s chunks, d = 10**6, ps = 8 MB/s, ell = 2: four reports per wave
    (3.5 us each) and four half vectors (0.500004375 s each) queue at the ingress:
    2 + 4 x 3.5e-6 + 4 x 0.500004375 = 4.0000315 s (the fast path's number in test_comm.py).
    The engine processes tied sends one at a time, so this is the same number."""
    cfg = RunConfig(workers=4, delta=2, n_parts=2, rounds=1, delay="const:1.0", seed=0)
    p = simulate_protocol(cfg, ["partial"], comm=parse_bandwidth("ps=8MB/s"), dim=1_000_000,
                          gradients="gaussian")
    ra = record_arrays(p["partial"], mode="exact")
    assert ra["completion_s"][0] == pytest.approx(4.0000315, rel=1e-12)
