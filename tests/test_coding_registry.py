"""The scheme registry and the baselines at their strongest.

* Every baseline decodes at its earliest possible moment: brute force over all arrival orders
  of small cases, against an independent criterion (the all-ones target lies in the span of
  the finished workers' encoding rows, i.e. the best linear decoder is exact).
* The generic (binary-search) decode-time rule equals every scheme's closed form.
* A scheme defined and registered only in this module runs through the fast path, the
  protocol engine and a live loopback run, with no production file naming it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest

from aiogc.coding import (
    DecodeResult,
    IgnoreStragglersScheme,
    OriginalScheme,
    Scheme,
    SchemeBase,
    SchemeParams,
    SchemeSpec,
    UncodedScheme,
    build_assignment,
    make_scheme,
    natural_order,
    register_scheme,
    scheme_names,
    scheme_spec,
    sends_when_done,
    unregister_scheme,
)
from aiogc.coding.base import combine
from aiogc.config import RunConfig
from aiogc.errors import ConfigError

# ------------------------------------------------------------------ brute force over orders


def _span_exact(E: np.ndarray, F: tuple[int, ...]) -> bool:
    """Whether sum_i g_i^(u) (every u) is a linear combination of the rows E[F] (m, N, ell)."""
    _, N, ell = E.shape
    T = np.zeros((N * ell, ell))
    for u in range(ell):
        T[u::ell, u] = 1.0
    if not F:
        return False
    M = E[list(F)].reshape(len(F), N * ell)
    a, *_ = np.linalg.lstsq(M.T, T, rcond=None)
    return bool(np.abs(M.T @ a - T).max() < 1e-8)


def _order_arrivals(sc: SchemeBase, orders: list[tuple[int, ...]]) -> np.ndarray:
    """Arrivals (R, m, K) in which worker order[i] finishes (vector arrives) at time i + 1."""
    K = int(sc.loads.max())
    a = np.full((len(orders), sc.m, K), np.inf)
    for r, order in enumerate(orders):
        for t, j in enumerate(order):
            a[r, j, : sc.loads[j]] = 0.0  # earlier chunks: irrelevant to send-when-done
            a[r, j, sc.loads[j] - 1] = t + 1.0
    return a


BASELINES = [
    pytest.param(dict(name="original", m=6, delta=2, assignment="fr"), "fr", id="fr-m6-d2"),
    pytest.param(dict(name="original", m=6, delta=3, assignment="fr"), "fr", id="fr-m6-d3"),
    pytest.param(dict(name="original", m=6, delta=3), "tandon", id="tandon-m6-d3"),
    pytest.param(dict(name="original", m=5, delta=2), "tandon", id="tandon-m5-d2"),
    pytest.param(dict(name="original", m=6, delta=3, n_parts=2), "polynomial",
                 id="ye-abbe-cyclic-m6-l2"),
    pytest.param(dict(name="original", m=6, delta=3, n_parts=2, assignment="fr"),
                 "polynomial", id="ye-abbe-fr-m6-l2"),
    pytest.param(dict(name="original", m=6, delta=3, assignment="regular"), "polynomial",
                 id="ye-abbe-regular-m6"),
    pytest.param(dict(name="uncoded", m=5, delta=1), None, id="uncoded-m5"),
]


@pytest.mark.parametrize(("kw", "construction"), BASELINES)
def test_fixed_code_baselines_decode_at_their_earliest_moment(kw: dict[str, Any],
                                                              construction: str | None) -> None:
    """For every arrival order, the scheme's decode time is the first prefix from which the
    best linear decoder is exact, and its decode there is exact (and not before)."""
    name = kw.pop("name")
    sc = make_scheme(name, rng=np.random.default_rng(3), **kw)
    assert isinstance(sc, UncodedScheme | OriginalScheme)
    if construction is not None:
        assert isinstance(sc, OriginalScheme) and sc.construction == construction
    orders = list(itertools.permutations(range(sc.m)))
    cache: dict[frozenset[int], bool] = {}
    want = np.empty(len(orders))
    for r, order in enumerate(orders):
        for t in range(1, sc.m + 1):
            F = frozenset(order[:t])
            if F not in cache:
                cache[F] = _span_exact(sc.E, tuple(sorted(F)))
            if cache[F]:
                want[r] = t
                break
    a = _order_arrivals(sc, orders)
    np.testing.assert_array_equal(sc.decode_times(a), want)
    np.testing.assert_array_equal(SchemeBase.decode_times(sc, a), want)  # generic rule agrees
    # the PS's rule agrees on every subset, and decoding there is exact
    G = np.random.default_rng(4).standard_normal((sc.n_chunks, 5))
    for F, ok in cache.items():
        c = np.zeros(sc.m, dtype=np.int64)
        c[list(F)] = sc.loads[list(F)]
        assert sc.is_decodable(c) == ok, sorted(F)
        V = np.zeros((sc.m, sc.payload_len(5)))
        sc.encode_all(c, G, V)
        res = sc.decode_result(V, c, 5)
        assert res.exact == ok
        if ok:
            np.testing.assert_allclose(res.gradient, G.sum(axis=0), rtol=1e-8, atol=1e-8)


def test_fr_waits_for_one_worker_per_group_not_m_minus_s() -> None:
    sc = make_scheme("original", m=12, delta=3, assignment="fr")
    assert isinstance(sc, OriginalScheme) and sc.groups is not None
    c = np.zeros(12, dtype=np.int64)
    c[[0, 3, 6, 9]] = 3  # one worker of each of the 4 groups: 4 finished, m - s = 10
    assert sc.is_decodable(c)
    c[9] = 2
    assert not sc.is_decodable(c)
    # its worst case is the same as waiting for m - s (every group but one done)
    assert sc.q_max() == int(sc.loads.sum()) - sc.s


def test_ignore_stragglers_decodes_at_the_kth_arrival() -> None:
    sc = make_scheme("ignore-stragglers", m=5, delta=3, k=3)
    assert isinstance(sc, IgnoreStragglersScheme)
    orders = list(itertools.permutations(range(5)))
    a = _order_arrivals(sc, orders)
    np.testing.assert_array_equal(sc.decode_times(a), np.full(len(orders), 3.0))
    np.testing.assert_array_equal(SchemeBase.decode_times(sc, a), np.full(len(orders), 3.0))
    states = sc.states_at(a, np.full(len(orders), 3.0))
    assert (states.sum(axis=1) == 3).all()
    assert not sc.exact_states(states).any()  # approximate unless all m finished
    assert sc.exact_states(np.ones((1, 5), dtype=np.int64)).all()


@pytest.mark.parametrize("kw", [dict(m=6, delta=3, n_parts=1), dict(m=6, delta=3, n_parts=2),
                                dict(m=8, delta=3, n_parts=2, assignment="regular")])
def test_partial_closed_form_equals_generic_rule(kw: dict[str, Any]) -> None:
    sc = make_scheme("partial", rng=np.random.default_rng(5), **kw)
    assert isinstance(sc, SchemeBase)
    rng = np.random.default_rng(6)
    a = np.cumsum(rng.exponential(size=(40, sc.m, int(sc.loads.max()))), axis=2)
    np.testing.assert_array_equal(sc.decode_times(a), SchemeBase.decode_times(sc, a))


# ------------------------------------------------------------------ registry facts


def test_registry_is_the_single_source() -> None:
    assert scheme_names()[:4] == ("partial", "original", "uncoded", "ignore-stragglers")
    for name in scheme_names():
        spec = scheme_spec(name)
        cfg = RunConfig(scheme="partial", workers=6, delta=3, n_parts=2).for_scheme(name)
        built = cfg.build_scheme()
        assert built.name == name and built.sends_when_done == spec.sends_when_done
        assert sends_when_done(name) == spec.sends_when_done
        if spec.forced_n_parts is not None:
            assert cfg.n_parts == built.n_parts == spec.forced_n_parts
        assert spec.waiting and spec.exactness and spec.decoder
    with pytest.raises(ConfigError, match="scheme='nope'"):
        scheme_spec("nope")
    with pytest.raises(ConfigError, match="n_parts=2"):
        RunConfig(scheme="uncoded", n_parts=2)
    with pytest.raises(ConfigError, match="n_parts=3"):
        RunConfig(scheme="original", delta=3, n_parts=3)
    with pytest.raises(ConfigError, match="a name not registered yet"):
        register_scheme(scheme_spec("partial"))


def test_stragglers_tolerated_comes_from_the_registry() -> None:
    base = RunConfig(workers=8, delta=3, n_parts=1)
    assert base.for_scheme("original").stragglers_tolerated == 2
    assert base.for_scheme("uncoded").stragglers_tolerated == 0
    assert base.replace(scheme="ignore-stragglers", k=5).stragglers_tolerated == 3


# ------------------------------------------------------------------ a scheme from a test module


class DoubleCoverScheme(SchemeBase):
    """A trigger scheme defined only here, with a waiting rule unlike the partial scheme's:
    it waits until every chunk has been computed by *two* holders (say, to cross-check them),
    although one would do: chunk ``i`` enters with weight ``1 / cov_i`` from each of its
    ``cov_i`` covering holders, and the PS sums the vectors. A core that re-derived the
    partial trigger (every chunk covered ``ell = 1`` times) instead of asking this scheme
    would trigger too early, and the engines would disagree."""

    name = "test-double-cover"
    sends_when_done = False

    def __init__(self, A: np.ndarray) -> None:
        super().__init__(A, 1, natural_order(A))
        self._pos = np.zeros(A.shape, dtype=np.int64)  # 1-based position of chunk i at j, 0
        for j, o in enumerate(self.orders):
            self._pos[o, j] = np.arange(1, len(o) + 1)

    def _covered(self, c: np.ndarray) -> np.ndarray:
        return (self._pos > 0) & (self._pos <= c[None, :])  # (N, m)

    def is_decodable(self, state: object) -> bool:
        return bool((self._covered(self.check_state(state)).sum(axis=1) >= 2).all())

    def contributes(self, worker: int, state: object) -> bool:
        return bool(self.check_state(state)[self._check_worker(worker)] > 0)

    def encode(self, worker: int, state: object, chunk_grads: np.ndarray) -> np.ndarray:
        c = self.check_state(state)
        j = self._check_worker(worker)
        cov = self._covered(c).sum(axis=1)
        w = 1.0 / cov[self.orders[j][: c[j]]]
        X = np.asarray(chunk_grads)[: c[j]]
        return np.asarray(w @ X if X.shape[0] else np.zeros(X.shape[1]))

    def decode_result(self, coded: Mapping[int, np.ndarray] | np.ndarray, state: object,
                      dim: int) -> DecodeResult:
        c = self.check_state(state)
        rows = np.flatnonzero(c > 0)
        grad = combine(np.ones((1, self.m)), rows, coded, self._check_dim(dim))
        missing = int((self._covered(c).sum(axis=1) == 0).sum())
        return DecodeResult(grad, missing == 0, float(np.sqrt(missing / self.n_chunks)), 1.0,
                            int(rows.size))

    def q_max(self) -> int:
        return int(self.loads.sum())


@pytest.fixture
def test_scheme() -> Iterator[str]:
    spec = SchemeSpec(
        name=DoubleCoverScheme.name,
        build=lambda p: DoubleCoverScheme(build_assignment(p)),
        sends_when_done=False, waiting="every chunk computed by two holders",
        exactness="exact at the trigger", decoder="plain sum of 1/cov-weighted vectors",
        forced_n_parts=1)
    register_scheme(spec)
    try:
        yield spec.name
    finally:
        unregister_scheme(spec.name)


def _params() -> SchemeParams:
    return SchemeParams(m=6, delta=2)


@pytest.mark.parametrize("kw", [dict(name="partial", m=6, delta=3, n_parts=1),
                                dict(name="partial", m=8, delta=3, n_parts=2,
                                     assignment="regular")])
def test_progress_tracker_follows_is_decodable(kw: dict[str, Any]) -> None:
    """Random report / drop sequences: the incremental tracker (partial's coverage counters,
    or the generic one) says decodable exactly when ``is_decodable`` does."""
    name = kw.pop("name")
    built = make_scheme(name, rng=np.random.default_rng(9), **kw)
    assert isinstance(built, SchemeBase)
    schemes = [built, DoubleCoverScheme(build_assignment(SchemeParams(m=6, delta=3)))]
    rng = np.random.default_rng(10)
    for sc in schemes:
        for _ in range(20):
            tr = sc.progress_tracker()
            c = np.zeros(sc.m, dtype=np.int64)
            for _ in range(40):
                j = int(rng.integers(sc.m))
                if rng.random() < 0.1 and c[j] > 0:
                    tr.remove(j, int(c[j]))
                    c[j] = 0
                elif c[j] < sc.loads[j]:
                    new = int(rng.integers(c[j] + 1, sc.loads[j] + 1))
                    tr.add(j, int(c[j]), new)
                    c[j] = new
                assert (tr.deficit == 0) == sc.is_decodable(c), (type(sc).__name__, c)


def test_test_scheme_builds_and_is_exact(test_scheme: str) -> None:
    sc = make_scheme(test_scheme, m=6, delta=2)
    assert isinstance(sc, Scheme) and isinstance(sc, DoubleCoverScheme)
    assert scheme_spec(test_scheme).build(_params()).name == test_scheme
    G = np.random.default_rng(0).standard_normal((6, 4))
    c = np.array([2, 0, 2, 1, 2, 0])  # every chunk computed by someone (chunk 3 twice)
    assert not sc.is_decodable(c)  # its rule wants two copies of every chunk
    assert sc.progress_tracker().deficit != 0
    V = np.zeros((6, 4))
    sc.encode_all(c, G, V)
    r = sc.decode_result(V, c, 4)
    assert r.exact  # ... although one copy already decodes
    np.testing.assert_allclose(r.gradient, G.sum(axis=0))
    c = np.array([2, 2, 2, 2, 2, 2])
    assert sc.is_decodable(c)
    V = np.zeros((6, 4))
    sc.encode_all(c, G, V)
    r = sc.decode_result(V, c, 4)
    assert r.exact
    np.testing.assert_allclose(r.gradient, G.sum(axis=0))


@pytest.mark.parametrize("deadline", [None, 0.8])
def test_test_scheme_fast_path_equals_protocol_engine(test_scheme: str,
                                                      deadline: float | None) -> None:
    from aiogc.sim.fast import build_schemes, schedule_for, simulate_fast
    from aiogc.sim.protocol import record_arrays, simulate_protocol

    mode = "exact" if deadline is None else "approx"
    cfg = RunConfig(scheme=test_scheme, workers=6, delta=3, rounds=10, seed=3,
                    delay="exp:0.5", mode=mode, deadline_s=deadline)
    names = [test_scheme, "partial"]
    built = build_schemes(cfg, names)
    sched = schedule_for(cfg, built)
    fast = simulate_fast(cfg, names, schedule=sched, built=built, dim=6)
    proto = simulate_protocol(cfg, names, schedule=sched, built=built, gradients="gaussian",
                              dim=6)
    for name in names:
        f, a = fast[name], record_arrays(proto[name], mode=mode)
        np.testing.assert_allclose(a["completion_s"], f.completion_s, rtol=0, atol=1e-12)
        assert list(a["status"]) == list(f.status)
        if f.mse is not None:
            np.testing.assert_allclose(a["mse"], f.mse, rtol=1e-6, atol=1e-12)
    if mode == "exact":
        assert (fast[test_scheme].status == "exact").all()
    # its own rule, not the partial scheme's: the trigger states need two copies of each chunk
    sc = built[test_scheme]
    assert isinstance(sc, DoubleCoverScheme)
    hit = fast[test_scheme].status == "exact"
    assert hit.any()
    for st in np.array([r.state for r in proto[test_scheme]])[hit]:
        assert sc.is_decodable(st)
        assert (sc._covered(st).sum(axis=1) >= 2).all()


def test_test_scheme_trains_over_loopback(test_scheme: str) -> None:
    """PS and m workers over real loopback TCP: every round exact, triggered by the scheme's
    own rule (every chunk reported by two holders at the trigger)."""
    from aiogc.core import Worker
    from aiogc.harness.kit import make_ps, materialise_for
    from aiogc.net.drivers import ClientOptions, PSServer, WorkerClient

    config = RunConfig(scheme=test_scheme, workers=4, delta=3, rounds=3, seed=2,
                       task="linreg:samples=120,dim=6", delay="exp:0.002", heartbeat_s=1.0,
                       dead_after_s=5.0, join_timeout_s=15.0, round_timeout_s=15.0)
    ps, _ = make_ps(config, schedule=materialise_for(config, [config.scheme]), verify=True)

    async def scenario() -> None:
        # round 0 waits for every worker however slowly a loaded machine starts them
        server = PSServer(ps, host="127.0.0.1", port=0, join_clock=False)
        serve = asyncio.create_task(server.serve())
        await server.started.wait()
        fast = ClientOptions(backoff_s=(0.01, 0.1))
        clients = [asyncio.create_task(WorkerClient(Worker(j), "127.0.0.1", server.port,
                                                    options=fast).run())
                   for j in range(config.workers)]
        await serve
        await asyncio.gather(*clients)

    async def guarded() -> None:
        async with asyncio.timeout(120.0):  # hang guard, not an assertion on duration
            await scenario()

    asyncio.run(guarded())
    assert [r.round for r in ps.records] == [0, 1, 2]
    sc = config.build_scheme()
    for rec in ps.records:
        assert rec.scheme == test_scheme
        assert rec.status == "exact", (rec.status, rec.end_reason)
        assert rec.rel_error < 1e-9
        assert sc.is_decodable(np.array(rec.state))


@pytest.mark.parametrize("kw", [dict(name="partial", m=6, delta=3, n_parts=2),
                                dict(name="original", m=6, delta=3, assignment="fr"),
                                dict(name="original", m=6, delta=3, n_parts=2),
                                dict(name="uncoded", m=5, delta=1)])
def test_vectorised_exact_states_equal_is_decodable(kw: dict[str, Any]) -> None:
    name = kw.pop("name")
    sc = make_scheme(name, rng=np.random.default_rng(7), **kw)
    assert isinstance(sc, SchemeBase)
    rng = np.random.default_rng(8)
    S = rng.integers(0, sc.loads + 1, size=(300, sc.m))
    if sc.sends_when_done:  # only finished-or-nothing states occur
        S = np.where(sc.loads == S, sc.loads, 0)
    np.testing.assert_array_equal(sc.exact_states(S), SchemeBase.exact_states(sc, S))
