"""Two colluding liars cannot get an honest worker located (``--locate``).

The two constructions that framed an honest worker H: two authenticated liars A and B that share
a chunk with H (1) add the same offset to that chunk's gradient, or (2) add equal and opposite
multiples of one vector, chosen so that the received set without H looks consistent (to every
decode, or only to the two the redundancy check compares). With two
spares nothing tells "H lied" from "A and B lied" (both leave a consistent rest): two spares
locate one liar, and the locator claims no more. With four spares (a code that tolerates four
stragglers) the rest without A, B and H still decodes and contradicts the framing: the locator
names nobody but a real liar, the protocol engine's run evicts nobody honest and records no
wrong round as exact, and so does a live run over loopback (coroutine workers, port 0). With
two spares (beyond the bound) the frame holds, and the rounds it leaves resting on the
colluders' agreement say ``unverified``. Several seeds; sockets only in the live run.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from aiogc.config import RunConfig
from aiogc.core import PSOptions
from aiogc.core.worker import Worker
from aiogc.core.worker_setup import Setup
from aiogc.harness.kit import make_ps, materialise_for
from aiogc.protocol.messages import CodedGradient
from aiogc.sim.engine import Simulation
from aiogc.training.locate import (
    LiarLocator,
    decoding_coefficients,
    fully_consistent,
    liars_supported,
)
from tests.helpers import _counter_nonces

DIM = 8


def _setup(m: int, delta: int, seed: int) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
    scheme = RunConfig(scheme="original", workers=m, delta=delta).build_scheme()
    rng = np.random.default_rng(seed)
    G = rng.standard_normal((scheme.n_chunks, DIM))
    state = np.asarray(scheme.loads, dtype=np.int64)
    rows = np.stack([scheme.encode(j, state, G[scheme.orders[j]]) for j in range(m)])
    return scheme, G, state, rows


def _colluders(scheme: Any, honest: int) -> tuple[int, int, int]:
    """A chunk of ``honest`` and two other workers holding it."""
    c = int(scheme.orders[honest][0])
    others = [w for w in range(scheme.m) if w != honest and c in set(scheme.orders[w])]
    return c, others[0], others[1]


def _offset(scheme: Any, G: np.ndarray, state: np.ndarray, rows: np.ndarray, honest: int,
            rng: np.random.Generator) -> tuple[np.ndarray, tuple[int, int]]:
    c, a, b = _colluders(scheme, honest)
    bad = G.copy()
    bad[c] += 5.0 * rng.standard_normal(DIM)
    out = rows.copy()
    for w in (a, b):
        out[w] = scheme.encode(w, state, bad[scheme.orders[w]])
    return out, (a, b)


def _pair(construction: str, scheme: Any, honest: int) -> tuple[int, int, float, float]:
    """``(A, B, x, y)``: A adds ``x u`` and B ``-y u`` to their vectors (``u`` any vector
    of the payload's length) so that the set without H looks consistent. ``opposite``: the
    best cancellation the set without H allows (exact where its left null space is
    one-dimensional); ``canonical``: cancelling in the two decodes the redundancy check
    compares for the set without H (without its largest id, without its smallest), so
    that check alone finds it consistent."""
    _, a, b = _colluders(scheme, honest)
    rest = [w for w in range(scheme.m) if w != honest]
    if construction == "opposite":
        E = np.asarray(scheme.encoding_tensor(), dtype=np.float64).reshape(scheme.m, -1)[rest]
        U, sv, _ = np.linalg.svd(E, full_matrices=True)
        N = U[:, int(np.sum(sv > sv[0] * 1e-10)):]
        M = np.stack([N[rest.index(a)], -N[rest.index(b)]], axis=1)  # (k, 2)
        xy = np.linalg.svd(M)[2][-1]
        return a, b, float(xy[0]), float(xy[1])
    loads = np.asarray(scheme.loads, dtype=np.int64)

    def coefficients(keep: list[int]) -> np.ndarray:
        st = np.zeros(scheme.m, dtype=np.int64)
        st[keep] = loads[keep]
        return np.asarray(decoding_coefficients(scheme, st)[0])

    d = coefficients(rest[:-1]) - coefficients(rest[1:])
    return a, b, float(d[b]), float(d[a])  # x d[a] - y d[b] = 0


def _opposite(construction: str, scheme: Any, rows: np.ndarray, honest: int,
              rng: np.random.Generator) -> tuple[np.ndarray, tuple[int, int]]:
    """x u to A, -y u to B (:func:`_pair`)."""
    a, b, x, y = _pair(construction, scheme, honest)
    u = 5.0 * rng.standard_normal(rows.shape[1])
    out = rows.copy()
    out[a] += x * u
    out[b] -= y * u
    return out, (a, b)


def _framed(construction: str, scheme: Any, G: np.ndarray, state: np.ndarray,
            rows: np.ndarray, honest: int, rng: np.random.Generator
            ) -> tuple[np.ndarray, tuple[int, int]]:
    if construction == "offset":
        return _offset(scheme, G, state, rows, honest, rng)
    return _opposite(construction, scheme, rows, honest, rng)


@pytest.mark.parametrize("construction", ["offset", "opposite", "canonical"])
@pytest.mark.parametrize("seed", range(4))
def test_four_spares_never_locate_the_framed_worker(construction: str, seed: int) -> None:
    m, delta, honest = 10, 5, 0  # delta - ell = 4: four spares, two liars told apart
    scheme, G, state, rows = _setup(m, delta, seed)
    rng = np.random.default_rng(100 + seed)
    bad, liars = _framed(construction, scheme, G, state, rows, honest, rng)
    loc = LiarLocator(liars=liars_supported(4), min_finished=m - 4)
    got = loc.locate(scheme, bad, state, DIM)
    assert got != honest
    assert got is None or got in liars
    # ... and the set without the framed worker is not consistent: the frame does not hold
    rest = [w for w in range(m) if w != honest]
    value = fully_consistent(scheme, bad, rest)
    assert value is not None and value > 1


@pytest.mark.parametrize("seed", range(4))
def test_four_spares_still_locate_one_liar(seed: int) -> None:
    m, delta = 10, 5
    scheme, _, state, rows = _setup(m, delta, seed)
    rows[3] *= 3.0
    loc = LiarLocator(liars=liars_supported(4), min_finished=m - 4)
    assert loc.locate(scheme, rows, state, DIM) == 3


@pytest.mark.parametrize("construction", ["offset", "opposite", "canonical"])
def test_two_spares_cannot_tell_the_frame_from_a_liar(construction: str) -> None:
    """The stated bound: two spares locate one liar. Two colluders make the set without H
    exactly as consistent as one liar H would (the construction is a consistent world), so
    only a configuration with four spares (or --verify's oracle) resists them."""
    m, delta, honest = 10, 3, 0
    scheme, G, state, rows = _setup(m, delta, 1)
    rng = np.random.default_rng(7)
    bad, _ = _framed(construction, scheme, G, state, rows, honest, rng)
    rest = [w for w in range(m) if w != honest]
    value = fully_consistent(scheme, bad, rest)
    assert value is not None and value <= 1
    assert liars_supported(2) == 1


class _Offset:
    """A worker setup whose chunk ``c`` gradient is off by ``shift`` (an authenticated
    colluder: its vectors are honest encodings of a wrong gradient)."""

    def __init__(self, task: Any, c: int, shift: np.ndarray) -> None:
        self.task, self.c, self.shift = task, c, shift
        self.built: dict[RunConfig, Setup] = {}

    def __call__(self, cfg: RunConfig) -> Setup:
        if cfg not in self.built:
            def grad(chunk: int, w: np.ndarray) -> np.ndarray:
                g = np.asarray(self.task.chunk_gradient(chunk, w))
                return g + self.shift if chunk == self.c else g

            self.built[cfg] = Setup(cfg, cfg.build_scheme(), grad)
        return self.built[cfg]


@pytest.mark.parametrize("seed", range(3))
def test_an_engine_run_with_two_colluders_evicts_nobody_honest(seed: int) -> None:
    config = RunConfig(scheme="original", workers=10, delta=5, rounds=12, seed=seed,
                       task="linreg:samples=200,dim=8", delay="exp:0.05", heartbeat_s=None,
                       dead_after_s=None)
    schedule = materialise_for(config, [config.scheme])
    ps, task = make_ps(config, schedule=schedule, verify=False, keep_gradients=True,
                       locate=2, options=PSOptions(nonce_fn=_counter_nonces(),
                                                   spare_wait=100.0, spares=4))
    scheme = ps.scheme
    honest = 0
    c, a, b = _colluders(scheme, honest)
    shift = np.full(task.initial_model().shape[0], 2.0)
    bad = _Offset(task, c, shift)
    good: dict[RunConfig, Setup] = {}

    def honest_setup(cfg: RunConfig) -> Setup:
        if cfg not in good:
            good[cfg] = Setup(cfg, cfg.build_scheme(), task.chunk_gradient)
        return good[cfg]

    workers = [Worker(j, setup=bad if j in (a, b) else honest_setup,
                      nonce_fn=_counter_nonces(j)) for j in range(ps.m)]
    Simulation(ps, workers).run()
    assert honest not in ps.evicted
    assert set(ps.evicted) <= {a, b}
    w = task.initial_model().astype(np.float64)
    lr = task.learning_rate
    for r in ps.records:
        if r.status != "exact":
            continue
        G = np.stack([task.chunk_gradient(i, w) for i in range(scheme.n_chunks)])
        scale = float(np.linalg.norm(np.abs(G).sum(axis=0)))
        assert np.linalg.norm(r.gradient - G.sum(axis=0)) / scale <= 1e-9, r.round
        w = w - lr * r.gradient


def _engine_run(config: RunConfig, liars: Callable[[Any], dict[int, Any]],
                spares: int) -> tuple[Any, Any]:
    """The protocol engine's run of ``config`` (original scheme, ``--locate 2
    --no-verify``, a spare wait long enough for every vector); ``liars(task)`` maps a worker
    id to its lying setup."""
    schedule = materialise_for(config, [config.scheme])
    ps, task = make_ps(config, schedule=schedule, verify=False, keep_gradients=True,
                       locate=2, options=PSOptions(nonce_fn=_counter_nonces(),
                                                   spare_wait=100.0, spares=spares))
    good: dict[RunConfig, Setup] = {}

    def honest_setup(cfg: RunConfig) -> Setup:
        if cfg not in good:
            good[cfg] = Setup(cfg, cfg.build_scheme(), task.chunk_gradient)
        return good[cfg]

    bad = liars(task)
    workers = [Worker(j, setup=bad.get(j, honest_setup), nonce_fn=_counter_nonces(j))
               for j in range(ps.m)]
    Simulation(ps, workers).run()
    return ps, task


def _wrong_rounds(ps: Any, task: Any) -> list[Any]:
    """The applied rounds whose gradient is off the true one (replayed from the start)."""
    w = task.initial_model().astype(np.float64)
    out = []
    for r in ps.records:
        if r.status == "failed" or r.gradient is None:
            continue  # not applied
        G = np.stack([task.chunk_gradient(i, w) for i in range(ps.scheme.n_chunks)])
        scale = float(np.linalg.norm(np.abs(G).sum(axis=0)))
        if np.linalg.norm(r.gradient - G.sum(axis=0)) / scale > 1e-9:
            out.append(r)
        w = w - task.learning_rate * r.gradient
    return out


@pytest.mark.parametrize("seed", range(3))
def test_two_spares_framed_rounds_are_recorded_unverified(seed: int) -> None:
    """Beyond the stated bound (two colluders, two spares) the frame holds: the honest worker
    is located and evicted and the colluders' chunk is applied wrong. Those rounds rest on
    the colluders' agreement alone (the chunk's other holder never agreed with them), so
    every one of them says ``unverified``, never a plain exact round. The shift is small
    enough that the data bound lets it through (a large one is rejected by it)."""
    config = RunConfig(scheme="original", workers=10, delta=3, rounds=12, seed=seed,
                       task="linreg:samples=200,dim=8", delay="exp:0.05", heartbeat_s=None,
                       dead_after_s=None)
    scheme = config.build_scheme()
    honest = 0
    c, a, b = _colluders(scheme, honest)

    def liars(task: Any) -> dict[int, Any]:
        bad = _Offset(task, c, np.full(task.initial_model().shape[0], 0.1))
        return {a: bad, b: bad}

    ps, task = _engine_run(config, liars, spares=2)
    assert honest in ps.evicted  # outside the bound: the test has teeth
    wrong = _wrong_rounds(ps, task)
    assert wrong
    for r in wrong:
        assert r.end_detail.startswith("unverified:"), (r.round, r.end_detail)
        assert "held only by worker(s) " in r.end_detail


class _LateLiar:
    """A worker setup whose every chunk gradient is 3x from the second round on (its model
    then differs from the initial one): honest long enough to be cross-checked."""

    def __init__(self, task: Any) -> None:
        self.task = task
        self.w0 = np.asarray(task.initial_model(), dtype=np.float64)
        self.built: dict[RunConfig, Setup] = {}

    def __call__(self, cfg: RunConfig) -> Setup:
        if cfg not in self.built:
            def grad(chunk: int, w: np.ndarray) -> np.ndarray:
                g = np.asarray(self.task.chunk_gradient(chunk, w))
                return g if np.array_equal(np.asarray(w, dtype=np.float64), self.w0) else 3 * g

            self.built[cfg] = Setup(cfg, cfg.build_scheme(), grad)
        return self.built[cfg]


@pytest.mark.parametrize("seed", range(2))
def test_a_located_liar_that_was_cross_checked_leaves_verified_rounds(seed: int) -> None:
    """One liar within the bound, honest in round 0: its chunks' other holders agreed with
    it then, so after its eviction they are cross-checked and the rounds carry no
    ``unverified`` mark; all of them are right."""
    config = RunConfig(scheme="original", workers=10, delta=3, rounds=10, seed=seed,
                       task="linreg:samples=200,dim=8", delay="exp:0.05", heartbeat_s=None,
                       dead_after_s=None)
    ps, task = _engine_run(config, lambda task: {4: _LateLiar(task)}, spares=2)
    assert list(ps.evicted) == [4]
    assert not _wrong_rounds(ps, task)
    after = [r for r in ps.records if r.round > max(ps.aggregator.locator.rounds[4])]
    assert after and all(r.status == "exact" for r in after)
    assert not any(r.end_detail.startswith("unverified") for r in ps.records)


def test_a_liar_from_the_first_round_leaves_its_chunks_unverified() -> None:
    """One liar lying from round 0: its chunks' other holders never agreed with another
    holder, so after its eviction the rounds are right (within the bound) but say
    ``unverified``: the PS cannot tell them from colluders that framed it."""
    config = RunConfig(scheme="original", workers=10, delta=3, rounds=8, seed=0,
                       task="linreg:samples=200,dim=8", delay="exp:0.05", heartbeat_s=None,
                       dead_after_s=None)

    def liars(task: Any) -> dict[int, Any]:
        return {4: _Offset(task, int(config.build_scheme().orders[4][0]),
                           np.full(task.initial_model().shape[0], 0.1))}

    ps, task = _engine_run(config, liars, spares=2)
    assert list(ps.evicted) == [4]
    assert not _wrong_rounds(ps, task)
    evicted_in = max(ps.aggregator.locator.rounds[4])
    after = [r for r in ps.records if r.round > evicted_in]
    assert after
    held = sorted(w for w in range(10) if w != 4 and set(ps.scheme.orders[w])
                  & set(ps.scheme.orders[4]))
    for r in after:
        assert r.status == "exact"
        assert r.end_detail.startswith("unverified:"), r.end_detail
        assert f"held only by worker(s) {held}" in r.end_detail


class _Shifted:
    """Worker ``w``'s coded vector of round r plus ``coef * u_r``, with ``u_r`` drawn from
    ``(seed, r)``: two colluders given the same seed add multiples of the same vector.
    Tampers with what the worker hands its driver (``poll`` and ``messages_to_send``), so it
    is what a worker holding its key can send."""

    def __init__(self, worker: Worker, coef: float, seed: int, scale: float) -> None:
        self.coef, self.seed, self.scale = coef, seed, scale
        self.sent = 0
        polled, pending = worker.poll, worker.messages_to_send

        def poll() -> Any:
            events, work, out, when = polled()
            return events, work, self._shift(out), when

        worker.poll = poll  # type: ignore[method-assign]
        worker.messages_to_send = lambda: self._shift(pending())  # type: ignore[method-assign]

    def _shift(self, outs: Any) -> list[Any]:
        res = []
        for o in outs:
            msg = o.message
            if isinstance(msg, CodedGradient):
                u = np.random.default_rng((self.seed, msg.round)).standard_normal(
                    msg.payload.shape)
                o = o._replace(message=dataclasses.replace(msg, payload=np.ascontiguousarray(
                    msg.payload + self.coef * self.scale * u, dtype=msg.payload.dtype)))
                self.sent += 1
            res.append(o)
        return res


@pytest.mark.parametrize("construction", ["offset", "opposite", "canonical"])
def test_a_live_run_with_two_colluders_evicts_nobody_honest(construction: str) -> None:
    """Two authenticated colluders built to frame worker 0, over loopback (coroutine workers
    on one loop, port 0, a shared secret), ``--locate 2 --no-verify`` with four spares
    (m 10, delta 5): nobody honest is evicted or ends, and no applied round is wrong (the
    rounds whose lie fits two explanations are rejected)."""
    from aiogc.net.drivers import PSServer, WorkerClient

    secret = b"colluders-test-secret-0123456789"
    config = RunConfig(scheme="original", workers=10, delta=5, rounds=8, seed=3,
                       task="linreg:samples=200,dim=8", delay="exp:0.002")
    scheme = config.build_scheme()
    honest = 0
    c, a, b = _colluders(scheme, honest)

    async def main() -> tuple[Any, Any, list[Any], list[Any]]:
        schedule = materialise_for(config, [config.scheme])
        # spare_wait 100: the four spares always arrive before the wait ends (no race)
        ps, task = make_ps(config, schedule=schedule, verify=False, keep_gradients=True,
                           secret=secret, locate=2,
                           options=PSOptions(spare_wait=100.0, spares=4))
        server = PSServer(ps, host="127.0.0.1", port=0)
        serving = asyncio.create_task(server.serve())
        await server.started.wait()
        offset = _Offset(task, c, np.full(task.initial_model().shape[0], 0.1))
        tampers: list[Any] = []
        clients = []
        for j in range(config.workers):
            if construction == "offset" and j in (a, b):
                w = Worker(j, secret=secret, setup=offset)
                tampers.append(offset)
            else:
                w = Worker(j, secret=secret)
                if j in (a, b):
                    _, _, x, y = _pair(construction, scheme, honest)
                    tampers.append(_Shifted(w, x if j == a else -y, seed=11, scale=0.05))
            clients.append(asyncio.create_task(WorkerClient(
                w, "127.0.0.1", server.port, give_up_after_s=30.0).run()))
        await serving
        for t in clients:
            t.cancel()
        return ps, task, await asyncio.gather(*clients, return_exceptions=True), tampers

    ps, task, results, tampers = asyncio.run(main())
    assert len(tampers) == 2
    # the lie reached the wire (the offset colluders built their lying setup)
    assert all(t.sent > 0 if isinstance(t, _Shifted) else t.built for t in tampers)
    assert len(ps.records) == config.rounds
    assert set(ps.evicted) <= {a, b}
    from aiogc.errors import EvictedError

    assert not any(isinstance(r, EvictedError) for j, r in enumerate(results)
                   if j not in (a, b))
    assert not [(r.round, r.status, r.end_detail) for r in _wrong_rounds(ps, task)]
    # the PS saw the lie: two explanations fit, so its rounds were rejected, nobody located
    assert any(r.status == "failed" and "redundancy" in r.end_detail for r in ps.records)
