"""Consistency checks before a decoded gradient is applied."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from aiogc.coding.consistency import (
    REDUNDANCY_SAFETY,
    DecodedStep,
    NormGuard,
    RoundGuard,
    model_bound,
    model_check,
    oracle_check,
    redundancy_check,
)
from aiogc.config import RunConfig
from aiogc.errors import ConfigError
from aiogc.training.tasks import chunk_gradients, make_task


def _round(cfg: RunConfig, *, steps: int = 0) -> tuple[Any, np.ndarray, int, np.ndarray]:
    """Honest payloads of every worker at a model a few GD steps in; (scheme, V, dim, w)."""
    scheme = cfg.build_scheme()
    task = make_task(cfg.task, scheme.n_chunks, cfg.seed)
    w = task.initial_model()
    for _ in range(steps):
        w = w - task.learning_rate * task.full_gradient(w)
    dt = cfg.payload_dtype
    state = np.asarray(scheme.loads, dtype=np.int64)
    V = np.zeros((scheme.m, scheme.payload_len(w.size)), dtype=dt)
    for j in range(scheme.m):
        G = chunk_gradients(task, scheme.orders[j], w.astype(dt)).astype(dt)
        V[j] = scheme.encode(j, state, G)
    return scheme, V, w.size, w


ORIGINAL: dict[str, Any] = {
    "scheme": "original", "workers": 8, "delta": 3, "n_parts": 1,
    "task": "linreg:samples=400,dim=12",
}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("n_parts", [1, 2])
@pytest.mark.parametrize("steps", [0, 40])
def test_honest_payloads_pass_with_margin(dtype: str, n_parts: int, steps: int) -> None:
    worst = 0.0
    for seed in range(6):
        cfg = RunConfig(**{**ORIGINAL, "dtype": dtype, "n_parts": n_parts, "seed": seed})
        scheme, V, dim, _ = _round(cfg, steps=steps)
        v = redundancy_check(scheme, V, range(scheme.m), dim)
        assert v is not None and v.ok, v
        worst = max(worst, v.value / v.bound)
    # measured: honest discrepancies stay far inside the tolerance (no false rejections)
    assert worst < 1 / 20, worst


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("liar", [0, 3, 7])
@pytest.mark.parametrize("attack", ["scale3", "replay", "nudge"])
def test_one_lying_worker_is_caught(dtype: str, liar: int, attack: str) -> None:
    cfg = RunConfig(**{**ORIGINAL, "dtype": dtype})
    scheme, V, dim, _ = _round(cfg, steps=5)
    if attack == "scale3":
        V[liar] *= 3  # the "3x its true vector"
    elif attack == "replay":
        _, old, _, _ = _round(cfg, steps=0)  # its vector of an earlier round
        V[liar] = old[liar]
    else:  # a 1 % nudge in one direction
        V[liar, 0] += 0.01 * np.linalg.norm(V[liar])
    v = redundancy_check(scheme, V, range(scheme.m), dim)
    assert v is not None and not v.ok
    assert v.check == "redundancy" and v.value > v.bound


def test_subset_received_and_mapping_input() -> None:
    cfg = RunConfig(**ORIGINAL)
    scheme, V, dim, _ = _round(cfg)
    got = [0, 1, 2, 4, 5, 6, 7]  # need m - s = 6; one spare
    v = redundancy_check(scheme, {j: V[j] for j in got}, got, dim)
    assert v is not None and v.ok
    V2 = V.copy()
    V2[5] = -V2[5]
    v2 = redundancy_check(scheme, {j: V2[j] for j in got}, got, dim)
    assert v2 is not None and not v2.ok


def test_not_applicable_cases() -> None:
    cfg = RunConfig(**ORIGINAL)
    scheme, V, dim, _ = _round(cfg)
    assert redundancy_check(scheme, V, range(6), dim) is None  # no spare vector
    part = RunConfig(workers=8, delta=3, n_parts=2).build_scheme()
    assert redundancy_check(part, np.zeros((8, 5)), range(8), 10) is None  # state-dependent code
    ign = RunConfig(scheme="ignore-stragglers", workers=8, delta=3).build_scheme()
    assert redundancy_check(ign, np.ones((8, 4)), range(8), 4) is None  # subsets not exact


def test_nonfinite_payload_fails_redundancy() -> None:
    cfg = RunConfig(**ORIGINAL)
    scheme, V, dim, _ = _round(cfg)
    V[2, 0] = np.inf
    v = redundancy_check(scheme, V, range(scheme.m), dim)
    assert v is not None and not v.ok


# ------------------------------------------------------------------------------ norm guard


def test_norm_guard_on_an_honest_run_never_rejects() -> None:
    task = make_task("linreg:samples=400,dim=12", 8, 0)
    w = task.initial_model()
    g0 = float(np.linalg.norm(task.full_gradient(w)))
    guard = NormGuard(initial_scale=g0)
    for _ in range(200):
        g = task.full_gradient(w)
        n = float(np.linalg.norm(g))
        v = guard.check(n)
        assert v.ok, v
        guard.accept(n)
        w = w - task.learning_rate * g


def test_norm_guard_rejects_blowups_and_explains() -> None:
    guard = NormGuard(initial_scale=2.0, window=4, factor=10, min_history=2, warmup_factor=100)
    assert guard.bound() == 200.0  # warm-up: 100 x initial scale
    assert not guard.check(1e300).ok
    assert not guard.check(float("nan")).ok
    assert not guard.check(float("inf")).ok
    for n in (1.0, 2.0, 3.0):
        guard.accept(n)
    assert guard.bound() == pytest.approx(10 * 2.0)
    v = guard.check(25.0)
    assert not v.ok and "median of the last 3 accepted" in v.reason
    assert v.bound == pytest.approx(20)
    assert guard.check(19.0).ok
    for n in (1.0, 1.0, 1.0, 1.0):
        guard.accept(n)
    assert guard.history == (1.0, 1.0, 1.0, 1.0)  # window of 4
    assert guard.bound() == pytest.approx(10.0)


def test_norm_guard_without_initial_scale_and_zero_history() -> None:
    g = NormGuard()
    assert g.check(1e99).ok and not g.check(1e101).ok  # only the absolute bound at first
    for _ in range(3):
        g.accept(0.0)
    # zero norms carry no scale: still only the absolute bound, a zero gradient passes
    assert g.bound() == 1e100 and g.check(0.0).ok and g.check(5.0).ok
    g.accept(1.0)
    assert g.bound() == 100.0  # one nonzero norm: warm-up bound


@pytest.mark.parametrize(
    ("kw", "field"),
    [({"window": 0}, "window"), ({"factor": 1.0}, "factor"), ({"min_history": 20}, "min_history"),
     ({"initial_scale": float("nan")}, "initial_scale"), ({"absolute_max": -1.0}, "absolute_max")],
)
def test_norm_guard_validates(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as ei:
        NormGuard(**kw)
    assert ei.value.field == field


# ------------------------------------------------------------------------------ oracle, model


def test_oracle_check() -> None:
    assert oracle_check(1e-15, 2e-16, exact=True).ok  # type: ignore[union-attr]
    bad = oracle_check(0.44, 2e-16, exact=True)
    assert bad is not None and not bad.ok and "0.44" in bad.reason
    assert oracle_check(0.44, 2e-16, exact=False) is None  # approximate rounds differ by design
    assert oracle_check(float("nan"), 2e-16, exact=True) is None
    inf = oracle_check(float("inf"), 2e-16, exact=True)
    assert inf is not None and not inf.ok


def test_model_check_and_bound() -> None:
    w0 = np.array([0.5, -2.0])
    b = model_bound(w0)
    assert b == 2e6
    assert model_bound(np.zeros(3)) == 1e6
    assert model_check(w0, b).ok
    v = model_check(np.array([1.0, np.nan]), b)
    assert not v.ok and "entry 1" in v.reason
    assert not model_check(np.array([1e300]), b).ok
    assert not model_check(np.array([3e6]), b).ok
    with pytest.raises(ConfigError):
        model_bound(np.array([np.inf]))


def test_tolerance_follows_dtype_and_conditioning() -> None:
    from aiogc.coding.consistency import redundancy_tolerance

    eps32, eps64 = np.finfo(np.float32).eps, np.finfo(np.float64).eps
    assert redundancy_tolerance("float32") == pytest.approx(REDUNDANCY_SAFETY * (eps32 + eps64))
    assert redundancy_tolerance("float64", 1e6) == pytest.approx(
        REDUNDANCY_SAFETY * eps64 * (1 + 1e6))
    assert redundancy_tolerance("float64", float("inf")) == math.inf
    s64, V, d, _ = _round(RunConfig(**ORIGINAL))
    s32, V32, d32, _ = _round(RunConfig(**{**ORIGINAL, "dtype": "float32"}))
    v64 = redundancy_check(s64, V, range(8), d)
    v32 = redundancy_check(s32, V32, range(8), d32)
    assert v64 is not None and v32 is not None
    assert v32.bound > 100 * v64.bound  # float32 payloads get float32 room


# ------------------------------------------------------------------------------ RoundGuard


def _train(cfg: RunConfig, rounds: int, attack: dict[int, str]) -> tuple[RoundGuard, list[str],
                                                                          np.ndarray]:
    """A GD loop through encode -> decode -> RoundGuard; ``attack[r]`` corrupts worker 1."""
    scheme = cfg.build_scheme()
    task = make_task(cfg.task, scheme.n_chunks, cfg.seed)
    w = task.initial_model()
    guard = RoundGuard(w, predicted_error=1e-15)
    outcomes = []
    state = np.asarray(scheme.loads, dtype=np.int64)
    old: np.ndarray | None = None
    for r in range(rounds):
        V = np.zeros((scheme.m, scheme.payload_len(w.size)))
        for j in range(scheme.m):
            V[j] = scheme.encode(j, state, chunk_gradients(task, scheme.orders[j], w))
        kind = attack.get(r)
        if kind == "scale3":
            V[1] *= 3
        elif kind == "huge":
            V[1] = 1e300
        elif kind == "replay" and old is not None:
            V[1] = old[1]
        old = V.copy()
        res = scheme.decode_result(V, state, w.size)
        bad, new = guard.check(scheme=scheme, coded=V, received=range(scheme.m), dim=w.size,
                               decoded=DecodedStep(res.gradient, res.exact), model=w,
                               learning_rate=task.learning_rate)
        if bad is None:
            assert new is not None
            w = new
            guard.accept()
            outcomes.append("applied")
        else:
            outcomes.append(bad.check)
    return guard, outcomes, w


def test_round_guard_original_scheme_rejects_every_attack() -> None:
    cfg = RunConfig(**ORIGINAL)
    attacks = {3: "scale3", 6: "replay", 9: "huge", 12: "scale3"}
    guard, outcomes, w = _train(cfg, 15, attacks)
    for r, out in enumerate(outcomes):
        assert (out != "applied") == (r in attacks), (r, out)
    assert outcomes[9] in ("norm", "redundancy")
    assert sum(guard.rejected.values()) == 4 and np.isfinite(w).all()


def test_round_guard_partial_scheme_stops_blowup_and_keeps_model_finite() -> None:
    # the partial scheme has no redundancy check: the norm guard and the model bound remain
    cfg = RunConfig(workers=8, delta=3, n_parts=2, task="linreg:samples=400,dim=12")
    guard, outcomes, w = _train(cfg, 12, {8: "huge"})
    assert outcomes[8] == "norm" and outcomes.count("applied") == 11
    assert np.isfinite(w).all() and guard.rejected == {"norm": 1}


def test_round_guard_oracle_and_model_bound() -> None:
    cfg = RunConfig(**ORIGINAL)
    scheme = cfg.build_scheme()
    w0 = np.ones(3)
    guard = RoundGuard(w0, predicted_error=1e-16)
    V = np.zeros((8, 3))
    bad, new = guard.check(scheme=scheme, coded=V, received=range(5), dim=3,
                           decoded=DecodedStep(np.array([0.1, 0.0, 0.0]), True, 0.44),
                           model=w0, learning_rate=1.0)
    assert bad is not None and bad.check == "oracle" and new is None
    bad2, _ = guard.check(scheme=scheme, coded=V, received=range(5), dim=3,
                          decoded=DecodedStep(np.array([-5e6, 0.0, 0.0]), True), model=w0,
                          learning_rate=1.0)
    assert bad2 is not None and bad2.check == "model"
    ok, new = guard.check(scheme=scheme, coded=V, received=range(5), dim=3,
                          decoded=DecodedStep(np.array([0.5, 0.0, 0.0]), True, 1e-15),
                          model=w0, learning_rate=1.0)
    assert ok is None and new is not None and new[0] == 0.5 and w0[0] == 1.0
    assert guard.rejected == {"oracle": 1, "model": 1} and guard.checked == 3


def test_norm_guard_median_matches_numpy_bit_for_bit() -> None:
    """The guard's numpy-free median is np.median exactly (odd and even windows, wide
    magnitudes), so the norm bound did not move when it replaced np.median."""
    from aiogc.coding.consistency import _median

    rng = np.random.default_rng(7)
    for n in range(1, 33):
        for _ in range(20):
            xs = [float(x) for x in rng.standard_normal(n) * 10.0 ** rng.uniform(-8, 8, n)]
            assert _median(xs) == float(np.median(xs))


def test_model_check_one_pass_still_names_the_bad_entry() -> None:
    from aiogc.coding.consistency import model_check

    for w, bad in (([1.0, np.nan, 2.0], 1), ([np.inf, 1.0], 0), ([0.0, -np.inf], 1)):
        v = model_check(np.array(w), 1e6)
        assert not v.ok and f"entry {bad}" in v.reason and v.value == float("inf")
    v = model_check(np.array([1.0, -3.0]), 2.0)
    assert not v.ok and v.value == 3.0
    assert model_check(np.array([1.0, -3.0]), 3.0).ok and model_check(np.array([]), 1.0).ok


def test_all_finite_is_the_entrywise_test() -> None:
    """The dot shortcut never answers differently from np.isfinite(x).all(): NaN and
    infinities anywhere, sums of squares that overflow (finite entries: the entrywise
    fallback), both float widths, strided vectors, other shapes and dtypes."""
    from aiogc.coding.consistency import all_finite

    rng = np.random.default_rng(11)
    cases: list[np.ndarray] = [np.zeros(0), np.array([1e200, -1e200]),
                               np.full(4, 1e30, dtype=np.float32), np.arange(5),
                               np.ones((3, 2)), np.array([[1.0, np.nan]])]
    for dt in (np.float64, np.float32):
        for bad in (np.nan, np.inf, -np.inf):
            x = rng.standard_normal(1000).astype(dt)
            x[rng.integers(1000)] = bad
            cases += [x, x[::3], x * np.asarray(1e30, dtype=dt)]
        cases.append(rng.standard_normal(999).astype(dt))
    for x in cases:
        with np.errstate(over="ignore", invalid="ignore"):
            assert all_finite(x) == bool(np.isfinite(x).all()), x


def test_guard_step_is_model_minus_lr_times_gradient_bit_for_bit() -> None:
    rng = np.random.default_rng(5)
    scheme = RunConfig(workers=6, delta=2).build_scheme()
    for scale in (1.0, 1e-300, 1e90):
        w = rng.standard_normal(257) * scale
        g = rng.standard_normal(257) * scale
        guard = RoundGuard(np.full(257, 1e300), predicted_error=1e-16)
        ok, new = guard.check(scheme=scheme, coded=np.zeros((6, 257)), received=range(6),
                              dim=257, decoded=DecodedStep(g, True), model=w,
                              learning_rate=0.37)
        assert ok is None and new is not None
        assert np.array_equal((w - 0.37 * g).view(np.uint64), new.view(np.uint64))


def test_model_check_value_is_max_abs() -> None:
    rng = np.random.default_rng(9)
    for w in (rng.standard_normal(100), -np.abs(rng.standard_normal(7)), np.array([-0.0]),
              np.abs(rng.standard_normal(9))):
        v = model_check(w, 1e9)
        assert v.ok and v.value == float(np.abs(w).max())
