"""stream-chunks against brute force: its decode time is the first instant every chunk has
arrived from some holder, and its one-shot decode is exact exactly then."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from aiogc.coding import (
    SchemeBase,
    StreamChunksScheme,
    cyclic_assignment,
    fractional_repetition_assignment,
    make_scheme,
    natural_order,
    random_order,
)


def _schemes() -> list[StreamChunksScheme]:
    rng = np.random.default_rng(4)
    A1, A2 = cyclic_assignment(5, 2), fractional_repetition_assignment(6, 2)
    return [StreamChunksScheme(A1, natural_order(A1)),
            StreamChunksScheme(A1, random_order(A1, rng)),
            StreamChunksScheme(A2, random_order(A2, rng))]


def _brute_time(sc: StreamChunksScheme, a: np.ndarray) -> float:
    """Walk the events in time order; the first instant the arrived chunks cover all."""
    events = sorted((float(a[j, k]), j, k) for j in range(sc.m) for k in range(int(sc.loads[j]))
                    if np.isfinite(a[j, k]))
    have: set[int] = set()
    for t, j, k in events:
        have.add(int(sc.orders[j][k]))
        if len(have) == sc.n_chunks:
            return t
    return float("inf")


@pytest.mark.parametrize("idx", range(3))
def test_decode_times_brute_force(idx: int) -> None:
    sc = _schemes()[idx]
    rng = np.random.default_rng(idx)
    K = int(sc.loads.max())
    a = np.cumsum(rng.exponential(1.0, (300, sc.m, K)), axis=2)
    a[rng.random((300, sc.m)) < 0.2, :] = np.inf  # dead workers
    got = sc.decode_times(a)
    want = np.array([_brute_time(sc, a[r]) for r in range(a.shape[0])])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, SchemeBase.decode_times(sc, a))


@pytest.mark.parametrize("idx", range(3))
def test_one_shot_decode_every_state(idx: int) -> None:
    sc = _schemes()[idx]
    rng = np.random.default_rng(10 + idx)
    G = rng.standard_normal((sc.n_chunks, 7))
    for c in itertools.product(*(range(int(n) + 1) for n in sc.loads)):
        state = np.array(c)
        covered = {int(i) for j in range(sc.m) for i in sc.orders[j][: c[j]]}
        coded = {j: sc.encode(j, state, G[sc.orders[j]]) for j in range(sc.m)
                 if sc.contributes(j, state)}
        r = sc.decode_result(coded, state, 7)
        np.testing.assert_allclose(r.gradient, G[sorted(covered)].sum(axis=0), atol=1e-12)
        assert sc.is_decodable(state) == (len(covered) == sc.n_chunks) == r.exact
        # every covered chunk is taken exactly once, from a holder that computed it
        des = sc.designated(state)
        assert {int(i) for i in np.flatnonzero(des >= 0)} == covered


def test_registered_with_partial_orders() -> None:
    rng1, rng2 = np.random.default_rng(7), np.random.default_rng(7)
    s = make_scheme("stream-chunks", m=9, delta=3, rng=rng1)
    p = make_scheme("partial", m=9, delta=3, n_parts=1, rng=rng2)
    assert s.uploads_per_chunk and not s.sends_when_done and s.n_parts == 1
    for o1, o2 in zip(s.orders, p.orders, strict=True):
        np.testing.assert_array_equal(o1, o2)
    assert s.q_max() == p.q_max()
