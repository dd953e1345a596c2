"""Tests of aiogc.training.delays: model statistics, determinism, combinators, CSV round trip,
errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiogc.errors import ConfigError
from aiogc.training.delays import (
    DelayModel,
    Failures,
    MarkovBursts,
    Pareto,
    Stragglers,
    materialise,
    parse_delay,
)
from aiogc.training.schedule import DelaySchedule

N = 200_000  # samples for the statistical checks (fast: vectorised draws)


def draw(spec: str, n: int = N, seed: int = 1) -> np.ndarray:
    return parse_delay(spec).sample(np.random.default_rng(seed), 1, 1, n).ravel()


# --------------------------------------------------------------------------- base models


def test_none_and_const() -> None:
    assert np.all(draw("none", 10) == 0.0)
    assert np.all(draw("const:0.25", 10) == 0.25)
    assert np.all(draw("const:0", 10) == 0.0)


def test_exponential_statistics() -> None:
    x = draw("exp:0.02")
    assert x.min() >= 0
    assert np.mean(x) == pytest.approx(0.02, rel=0.01)
    assert np.median(x) == pytest.approx(0.02 * math.log(2), rel=0.02)
    assert np.quantile(x, 0.9) == pytest.approx(0.02 * math.log(10), rel=0.02)


def test_shifted_exponential_statistics() -> None:
    x = draw("shiftexp:0.1,0.05")
    assert x.min() >= 0.1
    assert x.min() == pytest.approx(0.1, abs=1e-4)
    assert np.mean(x) == pytest.approx(0.15, rel=0.01)
    assert np.median(x) == pytest.approx(0.1 + 0.05 * math.log(2), rel=0.01)


def test_pareto_statistics_explicit_scale() -> None:
    alpha, xm = 3.0, 0.5
    x = draw(f"pareto:{alpha},{xm}")
    assert x.min() >= xm
    assert np.median(x) == pytest.approx(xm * 2 ** (1 / alpha), rel=0.01)
    assert np.quantile(x, 0.99) == pytest.approx(xm * 100 ** (1 / alpha), rel=0.03)
    assert np.mean(x) == pytest.approx(alpha * xm / (alpha - 1), rel=0.02)


def test_pareto_default_scale_has_unit_mean() -> None:
    model = parse_delay("pareto:4")
    assert isinstance(model, Pareto)
    assert model.x_m == pytest.approx(0.75)
    x = draw("pareto:4")
    assert x.min() >= 0.75
    assert np.mean(x) == pytest.approx(1.0, rel=0.01)


def test_lognormal_statistics() -> None:
    mu, sigma = -3.0, 0.5
    x = draw(f"lognormal:{mu},{sigma}")
    assert np.median(x) == pytest.approx(math.exp(mu), rel=0.01)
    assert np.mean(x) == pytest.approx(math.exp(mu + sigma**2 / 2), rel=0.01)
    assert np.std(np.log(x)) == pytest.approx(sigma, rel=0.01)


# --------------------------------------------------------------------------- combinators


def test_straggler_fraction_exact_and_persistent() -> None:
    m = 20
    for frac, expect in [(0.25, 5), (0.0, 0), (1.0, 20), (0.125, 3), (0.1, 2)]:
        s = materialise(f"straggle:{frac},5,const:0.01", rounds=6, m=m, max_chunks=3, seed=3)
        slow = np.isclose(s.compute_s, 0.05)
        per_worker = slow.all(axis=(0, 2))
        # a worker is either slow in every round and position, or never
        assert np.array_equal(slow.any(axis=(0, 2)), per_worker)
        assert per_worker.sum() == expect
        assert np.all(s.compute_s[:, ~per_worker, :] == 0.01)


def test_straggler_choice_independent_of_base() -> None:
    a = materialise("straggle:0.3,4,exp:0.02", rounds=5, m=10, max_chunks=2, seed=11)
    b = materialise("straggle:0.3,4,const:1", rounds=5, m=10, max_chunks=2, seed=11)
    slow_b = b.compute_s[0, :, 0] == 4.0
    assert slow_b.sum() == 3
    # the same workers straggle whatever the base: check via the slow factor on exp draws
    c = materialise("straggle:0.3,1,exp:0.02", rounds=5, m=10, max_chunks=2, seed=11)
    ratio = a.compute_s / c.compute_s
    assert np.allclose(ratio[:, slow_b, :], 4.0)
    assert np.allclose(ratio[:, ~slow_b, :], 1.0)


def test_failures_iid_per_round() -> None:
    rounds, m = 400, 10
    s = materialise("fail:0.3,exp:0.02", rounds=rounds, m=m, max_chunks=4, seed=5)
    dead = s.dead()
    assert dead.shape == (rounds, m)
    assert np.all(dead.sum(axis=1) == 3)  # exactly round(0.3 * 10) per round
    # dead workers never finish anything in that round; live ones have finite delays
    assert np.all(np.isinf(s.compute_s[dead]))
    assert np.all(np.isfinite(s.compute_s[~dead]))
    # i.i.d. per round: each worker dead about 30% of rounds, and the sets change
    assert np.allclose(dead.mean(axis=0), 0.3, atol=0.08)
    assert len({tuple(row) for row in dead}) > 50


def test_failures_from_round_k() -> None:
    s = materialise("fail:0.25@3,const:0.01", rounds=8, m=8, max_chunks=2, seed=2)
    dead = s.dead()
    assert not dead[:3].any()
    assert np.all(dead[3:].sum(axis=1) == 2)
    assert np.all(dead[3:] == dead[3])  # the same workers stay dead
    ft = np.cumsum(s.compute_s[5], axis=1)  # completion times by position
    assert np.all(np.isinf(ft[dead[5]]))
    assert np.all(np.isfinite(ft[~dead[5]]))
    # from a round beyond the run: nobody dies
    assert not materialise("fail:0.5@100,none", rounds=4, m=4, max_chunks=1, seed=0).dead().any()


def test_markov_bursts_statistics() -> None:
    model = parse_delay("markov:0.1,0.4,10,const:1")
    assert isinstance(model, MarkovBursts)
    assert model.stationary_slow == pytest.approx(0.2)
    s = materialise(model, rounds=2000, m=50, max_chunks=1, seed=9)
    slow = s.compute_s[:, :, 0] == 10.0
    assert np.all((s.compute_s[:, :, 0] == 1.0) | slow)
    assert slow.mean() == pytest.approx(0.2, abs=0.01)
    # transition frequencies
    prev, nxt = slow[:-1], slow[1:]
    p_slow = (nxt & ~prev).sum() / (~prev).sum()
    p_rec = (~nxt & prev).sum() / prev.sum()
    assert p_slow == pytest.approx(0.1, abs=0.01)
    assert p_rec == pytest.approx(0.4, abs=0.02)
    # bursts: slow state persists (mean burst length 1/p_recover = 2.5 rounds > 1)
    assert (nxt & prev).sum() / prev.sum() == pytest.approx(0.6, abs=0.02)


def test_markov_degenerate() -> None:
    s = materialise("markov:0,0,3,const:1", rounds=5, m=4, max_chunks=2, seed=0)
    assert np.all(s.compute_s == 1.0)
    s = materialise("markov:1,0,3,const:1", rounds=5, m=4, max_chunks=2, seed=0)
    assert np.all(s.compute_s[1:] == 3.0)


def test_nested_combinators_parse() -> None:
    m = parse_delay("fail:0.1,straggle:0.25,5,shiftexp:0.01,0.02")
    assert isinstance(m, Failures) and isinstance(m.base, Stragglers)
    assert m.spec == "fail:0.1,straggle:0.25,5.0,shiftexp:0.01,0.02"
    assert parse_delay(m.spec).spec == m.spec


# --------------------------------------------------------------------------- schedule


def test_materialise_deterministic_and_independent_streams() -> None:
    kw = {"rounds": 5, "m": 6, "max_chunks": 3}
    a = materialise("straggle:0.5,3,exp:0.02", "exp:0.001", seed=42, **kw)
    b = materialise("straggle:0.5,3,exp:0.02", "exp:0.001", seed=42, **kw)
    c = materialise("straggle:0.5,3,exp:0.02", "exp:0.001", seed=43, **kw)
    assert a == b
    assert not np.array_equal(a.compute_s, c.compute_s)
    # changing the latency model leaves compute delays unchanged, and vice versa
    d = materialise("straggle:0.5,3,exp:0.02", "lognormal:-7,1", seed=42, **kw)
    assert np.array_equal(a.compute_s, d.compute_s)
    e = materialise("pareto:2.5", "exp:0.001", seed=42, **kw)
    assert np.array_equal(a.network_s, e.network_s)
    assert a.compute_spec == "straggle:0.5,3.0,exp:0.02" and a.network_spec == "exp:0.001"
    assert (a.rounds, a.m, a.max_chunks) == (5, 6, 3)
    assert not a.compute_s.flags.writeable


def test_dead_workers_and_arrival_times() -> None:
    """An inf delay kills the rest of the round; the fast path's arrival times (by position,
    masked beyond each worker's load) see it."""
    from aiogc.coding import UncodedScheme
    from aiogc.sim.fast import arrival_times

    comp = np.array([[[1.0, 2.0, 3.0], [0.5, np.inf, 1.0], [np.inf, np.inf, np.inf]]])
    s = DelaySchedule(comp, np.zeros((1, 3)))
    assert np.array_equal(s.dead(), [[False, False, True]])
    a = arrival_times(UncodedScheme(3), s)  # one chunk per worker
    assert a.shape == (1, 3, 1)
    assert np.array_equal(a[0, :, 0], [1.0, 0.5, np.inf])
    a2 = arrival_times(UncodedScheme(3), s, latency=0.25)
    assert np.array_equal(a2[0, :, 0], [1.5, 1.0, np.inf])


def test_schedule_validation() -> None:
    with pytest.raises(ConfigError):
        DelaySchedule(np.zeros((2, 3)), np.zeros((2,)))
    with pytest.raises(ConfigError):
        DelaySchedule(np.zeros((2, 3, 1)), np.zeros((2, 4)))
    with pytest.raises(ConfigError):
        DelaySchedule(np.full((1, 1, 1), np.nan), np.zeros((1, 1)))
    with pytest.raises(ConfigError):
        DelaySchedule(np.full((1, 1, 1), -1.0), np.zeros((1, 1)))


@pytest.mark.parametrize(
    "kw",
    [
        {"rounds": 0, "m": 2, "max_chunks": 1, "seed": 0},
        {"rounds": 1, "m": 0, "max_chunks": 1, "seed": 0},
        {"rounds": 1, "m": 2, "max_chunks": 0, "seed": 0},
        {"rounds": 1, "m": 2, "max_chunks": 1, "seed": -1},
        {"rounds": 1.5, "m": 2, "max_chunks": 1, "seed": 0},
    ],
)
def test_materialise_bad_sizes(kw: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        materialise("exp:1", **kw)  # type: ignore[arg-type]


def test_csv_round_trip_exact(tmp_path: Path) -> None:
    s = materialise(
        "fail:0.2,straggle:0.25,5,exp:0.02",
        "fail:0.2@1,exp:0.001",
        rounds=7,
        m=5,
        max_chunks=4,
        seed=123,
    )
    assert np.isinf(s.compute_s).any() and np.isinf(s.network_s).any()
    path = tmp_path / "delays.csv"
    s.to_csv(path)
    t = DelaySchedule.from_csv(path)
    assert t == s  # bit-exact arrays, seed and specs
    rows = list(s.rows())
    assert len(rows) == 7 * 5 * 4
    assert rows[5] == {
        "round": 0,
        "worker": 1,
        "chunk": 1,
        "compute_s": s.compute_s[0, 1, 1],
        "network_s": s.network_s[0, 1],
    }


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.integers(0, 2**32), st.integers(1, 4), st.integers(1, 4), st.integers(1, 3))
def test_csv_round_trip_property(seed: int, rounds: int, m: int, k: int) -> None:
    import tempfile

    s = materialise("lognormal:-3,2", "pareto:1.5", rounds=rounds, m=m, max_chunks=k, seed=seed)
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "d.csv"
        s.to_csv(p)
        assert DelaySchedule.from_csv(p) == s


def test_replay(tmp_path: Path) -> None:
    s = materialise("exp:0.02", "const:0.003", rounds=4, m=3, max_chunks=2, seed=8)
    path = tmp_path / "delays.csv"
    s.to_csv(path)
    r = materialise(f"replay:{path}", f"replay:{path}", rounds=3, m=3, max_chunks=2, seed=99)
    assert np.array_equal(r.compute_s, s.compute_s[:3])
    assert np.array_equal(r.network_s, s.network_s[:3])
    assert r.compute_spec == f"replay:{path}"
    # fewer positions than recorded: a prefix
    r1 = materialise(f"replay:{path}", rounds=4, m=3, max_chunks=1, seed=0)
    assert np.array_equal(r1.compute_s, s.compute_s[:, :, :1])
    with pytest.raises(ConfigError, match="rounds"):
        materialise(f"replay:{path}", rounds=5, m=3, max_chunks=2, seed=0)
    with pytest.raises(ConfigError, match="m=4"):
        materialise(f"replay:{path}", rounds=2, m=4, max_chunks=2, seed=0)
    with pytest.raises(ConfigError, match="max_chunks"):
        materialise(f"replay:{path}", rounds=2, m=3, max_chunks=3, seed=0)
    with pytest.raises(ConfigError, match="delay"):
        parse_delay(f"replay:{tmp_path / 'missing.csv'}")


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("", "header"),
        ("round,worker,chunk,compute_s\n", "header"),
        ("round,worker,chunk,compute_s,network_s\n0,0,0,x,0\n", ":2"),
        ("round,worker,chunk,compute_s,network_s\n0,0,0,1\n", "5 comma"),
        ("round,worker,chunk,compute_s,network_s\n0,0,0,-1,0\n", ">= 0"),
        ("round,worker,chunk,compute_s,network_s\n0,0,0,nan,0\n", ">= 0"),
        ("round,worker,chunk,compute_s,network_s\n0,0,0,1,0\n0,0,2,1,0\n", "exactly once"),
        ("round,worker,chunk,compute_s,network_s\n0,0,0,1,0\n0,0,0,1,0\n", "exactly once"),
        ("round,worker,chunk,compute_s,network_s\n0,0,0,1,0\n0,0,1,1,5\n", "constant"),
    ],
)
def test_csv_malformed(tmp_path: Path, text: str, msg: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(ConfigError, match=msg) as ei:
        DelaySchedule.from_csv(p)
    assert ei.value.field == "delays_csv"
    assert str(p) in str(ei.value)


def test_csv_without_headers_and_shuffled(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text(
        "round,worker,chunk,compute_s,network_s\n"
        "0,1,0,2.5,0.1\n0,0,0,1.5,0.2\n1,0,0,inf,0.0\n1,1,0,0.5,inf\n"
    )
    s = DelaySchedule.from_csv(p)
    assert np.array_equal(s.compute_s[:, :, 0], [[1.5, 2.5], [np.inf, 0.5]])
    assert np.array_equal(s.network_s, [[0.2, 0.1], [0.0, np.inf]])
    assert np.array_equal(s.dead(), [[False, False], [True, True]])
    assert s.seed == 0


# --------------------------------------------------------------------------- parse errors


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "bogus",
        "bogus:1",
        "exp",
        "exp:",
        "exp:-1",
        "exp:0",
        "exp:abc",
        "exp:1,2",
        "exp:inf",
        "exp:nan",
        "const:-0.1",
        "shiftexp:1",
        "shiftexp:-1,1",
        "pareto:1",
        "pareto:0.5",
        "pareto:0,1",
        "pareto:2,0",
        "pareto:2,1,3",
        "lognormal:0,-1",
        "lognormal:0",
        "straggle:1.5,2,exp:1",
        "straggle:0.5,0,exp:1",
        "straggle:0.5,2",
        "straggle:0.5,2,bogus",
        "fail:2,exp:1",
        "fail:0.5@x,exp:1",
        "fail:0.5@-1,exp:1",
        "fail:0.5",
        "markov:0.1,0.2,3",
        "markov:1.1,0.2,3,exp:1",
        "none:3",
        "replay:",
    ],
)
def test_parse_errors_name_field_and_value(spec: str) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_delay(spec)
    assert ei.value.field == "delay"
    assert ei.value.value == spec
    assert "delay=" in str(ei.value) and "expected" in str(ei.value)
    with pytest.raises(ConfigError) as ei2:
        parse_delay(spec, field="latency")
    assert ei2.value.field == "latency"


def test_parse_canonical_round_trip() -> None:
    for spec in [
        "none",
        "const:0.5",
        "exp:0.02",
        "shiftexp:0.01,0.02",
        "pareto:2.5",
        "pareto:1.5,0.01",
        "lognormal:-4,0.5",
        "straggle:0.25,5,exp:0.02",
        "fail:0.1,exp:1",
        "fail:0.1@3,exp:1",
        "markov:0.05,0.5,8,shiftexp:0.001,0.01",
        " EXP : 0.02 ",
    ]:
        model = parse_delay(spec)
        assert isinstance(model, DelayModel)
        assert parse_delay(model.spec).spec == model.spec
        a = model.sample(np.random.default_rng(0), 3, 4, 2)
        b = parse_delay(model.spec).sample(np.random.default_rng(0), 3, 4, 2)
        assert a.shape == (3, 4, 2) and a.dtype == np.float64
        assert np.array_equal(a, b)
