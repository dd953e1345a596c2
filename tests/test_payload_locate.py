"""Compressed coded payloads, and locate / exclude / evict a liar.

Cores back to back on the virtual clock (no sockets); one loopback run for eviction."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Any

import numpy as np
import pytest

from aiogc.coding.compress import rounding_bound, to_coded, unit_roundoff, widen
from aiogc.config import RunConfig
from aiogc.core import PSOptions, Worker
from aiogc.errors import MalformedFrame
from aiogc.harness.kit import make_ps, materialise_for
from aiogc.protocol.headers import FrameLimits
from aiogc.protocol.messages import CodedGradient
from aiogc.protocol.wire import decode_frame_bytes, encode_frame_bytes
from aiogc.sim.engine import Simulation
from tests.helpers import Scale3, _counter_nonces, task_workers

SECRET = b"payload-test-secret-0123456789ab"


# ------------------------------------------------------------------ item 3: 16-bit payloads


@pytest.mark.parametrize("coded", ["float16", "bfloat16"])
def test_rounding_is_within_the_unit_roundoff(coded: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(5000) * np.exp(rng.uniform(-8, 8, 5000))
    back = widen(to_coded(x, coded), coded)
    u = unit_roundoff(coded, np.dtype("<f8"))
    eta = 2.0**-25 if coded == "float16" else 0.0
    assert np.all(np.abs(back - x) <= u * np.abs(x) + eta + 1e-300)
    if coded == "bfloat16":  # round to nearest even, as the upper half of a float32
        assert widen(to_coded(np.array([1.0 + 2**-8]), coded), coded)[0] == 1.0
        assert widen(to_coded(np.array([1.0 + 3 * 2**-8]), coded), coded)[0] == 1.0 + 2**-6


def test_bfloat16_bound_covers_both_roundings_below_the_subnormal_floor() -> None:
    # 2^-134 + 2^-160 rounds to float32's 2^-134 (the 2^-160 is lost below float32's floor),
    # which is a tie between bfloat16's 0 and 2^-133 and goes to 0 (even): the whole entry is lost
    x = np.full(64, 2.0**-134 + 2.0**-160)
    back = widen(to_coded(x, "bfloat16"), "bfloat16")
    assert np.all(back == 0.0)
    err = float(np.linalg.norm(back - x))
    assert err <= rounding_bound(np.ones((1, 1)), back[None, :], "bfloat16", np.dtype("<f8"))
    # entry by entry, across the whole subnormal range of both roundings
    rng = np.random.default_rng(3)
    y = rng.uniform(0.0, 2.0**-120, 20000) * rng.choice([-1.0, 1.0], 20000)
    wide = widen(to_coded(y, "bfloat16"), "bfloat16")
    for one, got in zip(y, wide, strict=True):
        assert abs(got - one) <= rounding_bound(np.ones((1, 1)), np.array([[got]]), "bfloat16",
                                                np.dtype("<f8"))


@pytest.mark.parametrize("coded, byte", [("float16", 2), ("bfloat16", 0x82)])
def test_coded_gradient_frames_carry_16_bit_payloads(coded: str, byte: int) -> None:
    payload = to_coded(np.linspace(-3, 3, 7), coded)
    msg = CodedGradient(epoch=1, round=2, attempt=0, state_digest=b"\1" * 8, compute_s=0.5,
                        payload=payload)
    raw = encode_frame_bytes(msg)
    wide = encode_frame_bytes(dataclasses.replace(msg, payload=widen(payload, coded)))
    # 2 bytes an entry instead of 8; the dtype code 0x82 is a msgpack uint8 (2 bytes), 8 and
    # 2 are fixints (1 byte)
    assert len(wide) - len(raw) == 7 * 6 - (1 if byte >= 128 else 0)
    assert byte in raw[:40]
    with pytest.raises(MalformedFrame):  # a default connection refuses 16-bit payloads
        decode_frame_bytes(raw)
    got = decode_frame_bytes(raw, FrameLimits(1 << 20, 1 << 20, half_payloads=True))
    assert isinstance(got, CodedGradient)
    assert got.payload.dtype == payload.dtype and np.array_equal(got.payload, payload)


def test_default_configuration_welcome_has_no_coded_dtype() -> None:
    cfg = RunConfig()
    assert "coded_dtype" not in cfg.to_wire()
    assert RunConfig.from_wire(cfg.to_wire()) == cfg
    c16 = RunConfig(coded_dtype="bfloat16")
    assert c16.to_wire()["coded_dtype"] == "bfloat16"
    assert RunConfig.from_wire(c16.to_wire()) == c16


def _rig(config: RunConfig, *, spare_wait: float = 0.0, spares: int = 1,
         locate: int | None = None, liar: int | None = None) -> tuple[Any, Any, Any]:
    schedule = materialise_for(config, [config.scheme])
    ps, task = make_ps(config, schedule=schedule, verify=True, keep_gradients=True,
                       secret=SECRET, locate=locate,
                       options=PSOptions(nonce_fn=_counter_nonces(), spare_wait=spare_wait,
                                         spares=spares))
    workers = task_workers(task, ps.m, secret=SECRET)
    tamper = None
    if liar is not None:
        tamper = Scale3(workers[liar])
    return ps, task, (Simulation(ps, workers), tamper)


@pytest.mark.parametrize("scheme, n_parts", [("partial", 1), ("partial", 2), ("original", 1)])
@pytest.mark.parametrize("coded", ["float16", "bfloat16"])
def test_decode_error_stays_within_the_documented_bound(scheme: str, n_parts: int,
                                                        coded: str) -> None:
    config = RunConfig(scheme=scheme, workers=8, delta=3, n_parts=n_parts, rounds=12, seed=3,
                       task="linreg:samples=240,dim=24", delay="exp:0.05", heartbeat_s=None,
                       dead_after_s=None, coded_dtype=coded)
    ps, task, (sim, _) = _rig(config)
    sim.run()
    recs = ps.records
    assert len(recs) == config.rounds and all(r.status == "exact" for r in recs), [
        r.end_detail for r in recs]
    w = task.initial_model().astype(np.float64)
    n = ps.scheme.n_chunks
    for r in recs:
        G = np.stack([task.chunk_gradient(i, w) for i in range(n)])
        err = float(np.linalg.norm(r.gradient - G.sum(axis=0)))
        scale = float(np.linalg.norm(np.abs(G).sum(axis=0)))
        # the bound, plus float64's own decode error (orders of magnitude below it)
        assert r.rounding_bound > 0 and err <= r.rounding_bound + 1e-9 * scale, (r.round, err)
        if scheme == "partial":  # B's coefficients are small: a useful bound (the original
            assert r.rounding_bound <= 0.01 * scale  # scheme's decoders amplify ~10^3)
        w = w - ps.aggregator.learning_rate * r.gradient
    # the uploads were 16-bit on this run's wire type
    assert ps.aggregator.rows.dtype.itemsize == 2


@pytest.mark.parametrize("coded", ["same", "bfloat16"])
def test_summary_has_the_rounding_bound_of_compressed_runs(coded: str) -> None:
    from aiogc.harness.kit import format_summary
    from aiogc.harness.summary import summarize

    config = RunConfig(scheme="partial", workers=8, delta=3, rounds=6, seed=3,
                       task="linreg:samples=240,dim=24", delay="exp:0.05", heartbeat_s=None,
                       dead_after_s=None, coded_dtype=coded)
    ps, _, (sim, _) = _rig(config)
    sim.run()
    summary = summarize({"partial": ps.records})
    got = summary["schemes"]["partial"].get("rounding_bound")
    if coded == "same":  # a default run's summary is unchanged
        assert got is None and "rounding bound" not in format_summary(summary)
        return
    bounds = [r.rounding_bound for r in ps.records]
    assert got["rounds"] == 6 and got["worst"] == max(bounds)
    assert got["worst_round"] == bounds.index(max(bounds))
    assert got["median"] == float(np.median(bounds)) and 0 < got["median"] <= got["worst"]
    assert f"rounding bound {max(bounds):.1e} worst" in format_summary(summary)


def test_rounding_bound_is_tight_to_a_small_factor() -> None:
    rng = np.random.default_rng(1)
    V = rng.standard_normal((6, 400))
    D = rng.standard_normal((1, 6))
    for coded in ("float16", "bfloat16"):
        Vt = widen(to_coded(V.ravel(), coded), coded).reshape(V.shape)
        err = float(np.linalg.norm(D @ Vt - D @ V))
        b = rounding_bound(D, Vt, coded, np.dtype("<f8"))
        assert err <= b <= 20 * err


# ------------------------------------------------------------------ item 4: locate and evict


LOCATE_CFG: dict[str, Any] = dict(scheme="original", workers=16, delta=4, rounds=20, seed=2,
                                  task="linreg:samples=320,dim=12", delay="exp:0.05",
                                  heartbeat_s=None, dead_after_s=None)


def _check_located_run(ps: Any, liar: int) -> None:
    recs = ps.records
    assert len(recs) == LOCATE_CFG["rounds"]
    assert all(r.status == "exact" for r in recs), [(r.round, r.end_detail) for r in recs]
    located = [r for r in recs if "located as inconsistent" in r.end_detail]
    assert len(located) >= 3 and all(f"worker {liar} " in r.end_detail for r in located)
    assert liar in ps.evicted
    evicted_at = max(r.round for r in located)
    assert all(liar not in r.arrivals for r in recs if r.round > evicted_at)
    assert dict(ps.stats).get("evicted") == 1


@pytest.mark.parametrize("coded", ["same", "float16"])
def test_one_liar_is_located_excluded_and_evicted(coded: str) -> None:
    config = RunConfig(**LOCATE_CFG, coded_dtype=coded)
    ps, task, (sim, tamper) = _rig(config, spare_wait=2.0, spares=2, locate=3, liar=5)
    sim.run()
    assert tamper.sent > 0
    _check_located_run(ps, 5)
    # every applied gradient is the true one (no lie got through)
    w = task.initial_model().astype(np.float64)
    for r in ps.records:
        G = np.stack([task.chunk_gradient(i, w) for i in range(ps.scheme.n_chunks)])
        scale = float(np.linalg.norm(np.abs(G).sum(axis=0)))
        tol = 1e-9 if coded == "same" else 2 * r.rounding_bound / scale + 1e-9
        assert np.linalg.norm(r.gradient - G.sum(axis=0)) / scale <= tol
        w = w - ps.aggregator.learning_rate * r.gradient


def test_without_locate_the_liar_costs_rounds() -> None:
    config = RunConfig(**LOCATE_CFG)
    ps, _, (sim, _) = _rig(config, spare_wait=2.0, spares=2, locate=None, liar=5)
    sim.run()
    assert any(r.status == "failed" for r in ps.records)
    assert not ps.evicted


def test_honest_run_with_locate_on_is_unchanged() -> None:
    config = RunConfig(**LOCATE_CFG)
    ps, _, (sim, _) = _rig(config, spare_wait=2.0, spares=2, locate=3)
    sim.run()
    assert all(r.status == "exact" and "located" not in r.end_detail for r in ps.records)
    assert not ps.evicted


def test_evicted_worker_ends_over_loopback() -> None:
    from aiogc.net.drivers import PSServer, WorkerClient

    config = RunConfig(**{**LOCATE_CFG, "delay": "exp:0.002", "rounds": 12})

    async def main() -> tuple[Any, Any]:
        schedule = materialise_for(config, [config.scheme])
        ps, _ = make_ps(config, schedule=schedule, verify=True, keep_gradients=True,
                        secret=SECRET, locate=3,
                        options=PSOptions(spare_wait=100.0, spares=2))
        server = PSServer(ps, host="127.0.0.1", port=0)
        serving = asyncio.create_task(server.serve())
        await server.started.wait()
        clients = []
        for j in range(config.workers):
            w = Worker(j, secret=SECRET)
            if j == 5:
                Scale3(w)
            clients.append(asyncio.create_task(WorkerClient(
                w, "127.0.0.1", server.port, give_up_after_s=30.0).run()))
        await serving
        for c in clients:
            c.cancel()
        return ps, await asyncio.gather(*clients, return_exceptions=True)

    ps, results = asyncio.run(main())
    # the authenticated error(evicted) ended the liar's client (no reconnects until give-up)
    from aiogc.errors import EvictedError

    assert isinstance(results[5], EvictedError), results[5]
    assert "its vectors were located as inconsistent" in str(results[5])
    assert not any(isinstance(r, EvictedError) for j, r in enumerate(results) if j != 5)
    recs = ps.records
    assert len(recs) == config.rounds
    assert all(r.status == "exact" for r in recs), [(r.round, r.end_detail) for r in recs]
    assert 5 in ps.evicted
    st = dict(ps.stats)
    assert st.get("evicted") == 1 and st.get("closed_evicted", 0) >= 1


@pytest.mark.parametrize("assignment, n_parts, delta", [("cyclic", 1, 4), ("cyclic", 2, 4),
                                                         ("regular", 1, 3), ("fr", 1, 4)])
def test_one_factorisation_per_subset_locates_as_the_scheme_decoder(assignment: str,
                                                                    n_parts: int,
                                                                    delta: int) -> None:
    """aiogc.coding.leave_one_out against redundancy_check per leave-one-out set: the same
    failing sets, the same located worker, and the same discrepancy where a lie enters."""
    from aiogc.coding.consistency import redundancy_check
    from aiogc.coding.leave_one_out import leave_one_out_values
    from aiogc.training.locate import LiarLocator

    cfg = RunConfig(scheme="original", workers=16, delta=delta, n_parts=n_parts,
                    assignment=assignment)
    scheme = cfg.build_scheme()
    rng = np.random.default_rng(4)
    dim = 10
    G = rng.standard_normal((scheme.n_chunks, dim))
    state = np.asarray(scheme.loads, dtype=np.int64)
    rows = np.stack([scheme.encode(j, state, G[scheme.orders[j]]) for j in range(16)])
    rows[7] *= 3.0
    rec = list(range(16))
    fast = leave_one_out_values(scheme, rows, rec, dim)
    assert fast is not None
    slow = []
    for j in rec:
        v = redundancy_check(scheme, rows, [w for w in rec if w != j], dim)
        assert v is not None
        slow.append(v.value if v.ok else math.inf)
    assert [math.isinf(x) for x in fast] == [math.isinf(x) for x in slow]
    if assignment == "fr":  # equal vectors per group: no set stands out (--locate refuses fr)
        assert not any(math.isinf(x) for x in fast)
        return
    assert not math.isinf(fast[7]) and sum(math.isinf(x) for x in fast) >= 15 - 2
    for loc in (LiarLocator(fast=True), LiarLocator(fast=False)):
        assert loc.locate(scheme, rows, state, dim) == 7


def test_simulated_round_start_carries_the_model_in_the_payload_dtype() -> None:
    """The fast path's round_start bytes are the real frame's: the PS sends the model in
    ``payload_dtype`` (a float32 run's model is 4 bytes a value, not a float64's 8)."""
    from aiogc.protocol.messages import RoundStart
    from aiogc.sim.comm import FrameBytes, frame_bytes

    d = 1000
    for dtype in ("float32", "float64"):
        cfg = RunConfig(workers=8, delta=3, dtype=dtype, coded_dtype="float16", seed=1)
        s = cfg.build_scheme()
        fb = FrameBytes.of(s, d, cfg.coded_wire_dtype, cfg.payload_dtype)
        for j, n in enumerate(s.loads):
            real = frame_bytes(RoundStart(epoch=1, round=1, delays_s=(0.5,) * int(n),
                                          net_delay_s=0.0, model=np.zeros(d, cfg.payload_dtype)))
            assert fb.round_start[j] == real


# ---------------------------------------------------- an eviction ends the worker (authenticated)


def _failures(worker: Worker) -> list[Any]:
    """Collects ``worker``'s ConnectionFailed events (wraps its poll, as Scale3 does)."""
    from aiogc.core.common import ConnectionFailed

    seen: list[Any] = []
    polled = worker.poll

    def poll() -> Any:
        events, work, out, when = polled()
        seen.extend(e for e in events or () if isinstance(e, ConnectionFailed))
        return events, work, out, when

    worker.poll = poll  # type: ignore[method-assign]
    return seen


def test_authenticated_eviction_is_fatal_for_the_worker() -> None:
    """The PS's ``error(evicted)`` reaches the liar inside its authenticated session (phase
    open, after the welcome): the worker core marks it fatal, so the driver ends it (exit 4)
    instead of reconnecting until --give-up-after."""
    from aiogc.core.common import FATAL_CODES

    assert "evicted" in FATAL_CODES
    config = RunConfig(**LOCATE_CFG)
    ps, _, (sim, _) = _rig(config, spare_wait=2.0, spares=2, locate=3, liar=5)
    liar = sim.workers[5]
    assert liar.key is not None  # a keyed worker: its session is authenticated
    seen = _failures(liar)
    sim.run()
    assert 5 in ps.evicted
    assert (seen[0].code, seen[0].fatal) == ("evicted", True)
    assert "located as inconsistent" in seen[0].reason
    # the simulator reconnects every closed worker whatever the fatality (a driver would not):
    # each later attempt is refused at its hello, unauthenticated, never fatal
    assert {(f.code, f.fatal) for f in seen[1:]} <= {("preauth_evicted", False)}


def test_unauthenticated_evicted_before_the_handshake_is_not_fatal() -> None:
    """An evicted worker that reconnects is refused at its hello, before any welcome: that
    ``error(evicted)`` is unauthenticated (anyone on the path could send it), so it only closes
    the connection and the worker retries (docs/protocol.md §7.7)."""
    from aiogc.core import PS_PEER

    config = RunConfig(**LOCATE_CFG)
    ps, _, _ = _rig(config, spare_wait=2.0, spares=2, locate=3)
    ps.start(now=0.0)
    ps.evicted[5] = "its vectors were located as inconsistent (round 3)"
    w = Worker(5, secret=SECRET, nonce_fn=_counter_nonces(5))
    seen = _failures(w)
    peer = "p5"
    w.connection_made(now=0.0)
    ps.connection_made(peer, now=0.0)
    for _ in range(4):  # challenge -> hello -> error(evicted): a few hops back to back
        out, _ev, _t = ps.poll()
        for o in out:
            if o.peer == peer and o.message is not None:
                w.receive(PS_PEER, o.message, now=0.0)
        _e, _w, wout, _t2 = w.poll()
        for o in wout:
            if o.message is not None:
                ps.receive(peer, o.message, now=0.0)
        if seen:
            break
    assert [(f.code, f.fatal) for f in seen] == [("preauth_evicted", False)]
    assert w.stats["preauth_evicted"] == 1
