"""Scheme setup is bounded in time and memory.

Bounds are asserted by operation counts and allocation sizes, never by wall-clock time.
"""

from __future__ import annotations

import importlib
import itertools
import tracemalloc
from typing import Any

import numpy as np
import pytest

from aiogc.coding.partial import PartialScheme
from aiogc.config import RunConfig
from aiogc.errors import ConfigError

# the package re-exports the function decoding_matrix under the module's name
dm = importlib.import_module("aiogc.coding.decoding_matrix")


class _Budget(Exception):
    pass


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count every subset the decoding-matrix code enumerates or scores; fail past a bound."""
    counts = {"enumerated": 0, "svd_matrices": 0}
    real_comb = itertools.combinations
    real_cond = dm.subset_conditions

    def comb(it: Any, r: int) -> Any:
        for c in real_comb(it, r):
            counts["enumerated"] += 1
            if counts["enumerated"] > 1_000_000:
                raise _Budget("enumerated more than 1e6 subsets")
            yield c

    def cond(mats: np.ndarray) -> np.ndarray:
        counts["svd_matrices"] += int(mats.shape[0])
        conds: np.ndarray = real_cond(mats)
        return conds

    monkeypatch.setattr(dm.itertools, "combinations", comb)
    monkeypatch.setattr(dm, "subset_conditions", cond)
    return counts


def test_64_64_8_builds_within_bounded_work_and_memory(counted: dict[str, int]) -> None:
    # the config from the issue: C(64, 8) = 4.4e9 colour subsets used to be enumerated
    cfg = RunConfig(workers=64, delta=64, n_parts=8)
    tracemalloc.start()
    try:
        scheme = cfg.build_scheme()
        assert isinstance(scheme, PartialScheme)
        pred = dm.check_conditioning(scheme.A, scheme.B, 8, np.float64, tol=1.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert counted["enumerated"] == 0  # sampled, not enumerated
    # frame search + conditioning check: a fixed number of small SVDs, whatever C(64, 8) is
    assert counted["svd_matrices"] <= 100_000, counted
    assert peak < 64 * 2**20, peak
    assert scheme.B.shape == (8, 64) and np.isfinite(scheme.B).all()
    assert pred < 1e-6  # the sampled search still finds a usable frame for float64


def test_sampled_subsets_are_valid_distinct_and_deterministic() -> None:
    A = np.ones((64, 64), dtype=bool)
    colours = np.arange(64)
    assert dm.count_colour_subsets(A, colours, 8) == 4_426_165_368
    a = dm._colour_subsets(A, colours, 8, np.random.default_rng(1))
    b = dm._colour_subsets(A, colours, 8, np.random.default_rng(1))
    np.testing.assert_array_equal(a, b)
    assert a.shape[1] == 8 and 0 < a.shape[0] <= dm._max_frame_subsets(8)
    assert (np.diff(a, axis=1) > 0).all()  # sorted, no repeated colour
    assert len({tuple(r) for r in a.tolist()}) == a.shape[0]


def test_small_configs_still_enumerate_exactly(counted: dict[str, int]) -> None:
    # below the enumeration limit nothing changed: every occurring subset is scored
    from aiogc.coding import cyclic_assignment

    A = cyclic_assignment(8, 3)
    colours = dm.colour_workers(A, np.random.default_rng(0))
    subs = dm._colour_subsets(A, colours, 2, np.random.default_rng(0))
    assert subs.shape[0] == len({tuple(r) for r in subs.tolist()})
    assert counted["enumerated"] >= subs.shape[0]


def test_worst_condition_number_sampling_is_bounded(counted: dict[str, int]) -> None:
    A = np.ones((64, 64), dtype=bool)
    B = np.random.default_rng(0).standard_normal((8, 64))
    c = dm.worst_condition_number(A, B, 8, max_subsets=2000)
    assert counted["enumerated"] == 0 and counted["svd_matrices"] == 2000
    assert np.isfinite(c) and c >= 1.0


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"workers": 4096, "delta": 4096, "n_parts": 64}, "delta"),
        ({"workers": 4096, "delta": 64, "n_parts": 8, "scheme": "original"}, "workers"),
    ],
)
def test_config_over_setup_budget_is_refused_naming_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as ei:
        RunConfig(**kw)
    assert ei.value.field == field
    msg = str(ei.value)
    assert "setup budget" in msg and "an integer in [" in msg


def test_budget_bound_is_the_largest_that_fits() -> None:
    with pytest.raises(ConfigError) as ei:
        dm.check_setup_budget("partial", 4096, 4096, 64)
    hi = int(str(ei.value).split("an integer in [64, ")[1].split("]")[0])
    assert dm.setup_bytes("partial", 4096, hi, 64) <= dm.SETUP_MEMORY_BUDGET
    assert dm.setup_bytes("partial", 4096, hi + 1, 64) > dm.SETUP_MEMORY_BUDGET
    dm.check_setup_budget("partial", 4096, hi, 64)  # the bound it names is accepted


def test_setup_estimate_tracks_measured_peak() -> None:
    # the estimate is what the budget is enforced on: it must not undershoot by much
    cfg = RunConfig(workers=128, delta=128, n_parts=4, max_predicted_error=1e6)
    tracemalloc.start()
    try:
        s = cfg.build_scheme()
        st = np.asarray(s.loads, dtype=np.int64)
        s.decode_result(np.zeros((128, s.payload_len(8))), st, 8)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    est = dm.setup_bytes("partial", 128, 128, 4)
    assert peak <= 4 * est, (peak, est)


def test_welcome_config_over_budget_is_refused_by_the_worker_side_parser() -> None:
    wire = RunConfig(workers=64, delta=64, n_parts=8).to_wire()
    wire.update(workers=4096, delta=4096, n_parts=64)
    with pytest.raises(ConfigError):
        RunConfig.from_wire(wire)
