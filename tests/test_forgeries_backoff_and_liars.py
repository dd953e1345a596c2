"""Nothing unauthenticated ends a worker (forged frames before the handshake, a squatter on the
PS's port, an error injected after it); reconnects back off exponentially with seeded jitter;
the norm guard's round-off floor; an authenticated liar is bounded in approximate mode and
caught by a spare vector in the original scheme.

No sleeps for synchronisation: the socket scenarios wait on event logs and counters; the
backoff is observed through the delays the client asks its (injected) sleep for.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from aiogc.coding.consistency import NormGuard
from aiogc.config import RunConfig
from aiogc.core import (
    ConnectionFailed,
    PSOptions,
    ShutdownRequested,
    Welcomed,
    Worker,
)
from aiogc.core.common import UNVERIFIED, Backoff
from aiogc.harness.kit import make_ps as kit_make_ps
from aiogc.harness.kit import materialise_for
from aiogc.net.drivers import ClientOptions, WorkerClient
from aiogc.protocol.messages import Challenge, CodedGradient, Error, Shutdown
from aiogc.protocol.wire import encode_frame_bytes
from aiogc.sim.engine import Simulation
from aiogc.training.schedule import DelaySchedule
from tests.helpers import _counter_nonces, build_rig, task_workers
from tests.netkit import (
    FAST_BACKOFF,
    HOST,
    STEP_S,
    EventLog,
    Runner,
    SquatThenRelay,
    assert_exact_rounds,
    cfg,
    make_ps,
    make_runner,
    start_cluster,
)

SECRET = b"round-three-secret-0123456789abc"


@pytest.fixture
def run() -> Runner:
    return make_runner(asyncio.new_event_loop)


# ------------------------------------------------------------------ the core alone


def _worker() -> Worker:
    w = Worker(2, secret=SECRET, nonce_fn=lambda: b"w" * 16)
    w.connection_made(now=0.0)
    return w


@pytest.mark.parametrize("phase", ["connecting", "authenticating"])
@pytest.mark.parametrize("frame", [Error(code="auth_failed", reason="forged"),
                                   Error(code="config_mismatch", reason="forged"),
                                   Shutdown(reason="all rounds done")])
def test_preauth_error_or_shutdown_only_closes(phase: str, frame: Any) -> None:
    w = _worker()
    if phase == "authenticating":
        w.receive("ps", Challenge(epoch=0, nonce=b"p" * 16), now=0.1)
        w.messages_to_send()
        assert w.phase.value == "authenticating"
    w.receive("ps", frame, now=0.2)
    events = list(iter(w.next_event, None))
    assert not any(isinstance(e, ShutdownRequested) for e in events)
    failed = [e for e in events if isinstance(e, ConnectionFailed)]
    assert len(failed) == 1 and not failed[0].fatal
    assert failed[0].code.startswith("preauth_")
    assert w.phase.value == "closed"
    assert w.stats["preauth_close"] == 1
    assert w.last_preauth.startswith(frame.code if isinstance(frame, Error) else "shutdown")
    out = w.messages_to_send()
    assert out and out[-1].close and out[-1].message is None  # nothing sent back


# ------------------------------------------------------------------ backoff


def test_backoff_grows_jitters_deterministically_and_resets() -> None:
    a = Backoff(0.05, 2.0, random.Random(7))
    b = Backoff(0.05, 2.0, random.Random(7))
    da = [a.next_delay() for _ in range(12)]
    db = [b.next_delay() for _ in range(12)]
    assert da == db  # the seed decides everything
    ceilings = [min(2.0, 0.05 * 2 ** k) for k in range(12)]
    assert all(0.025 <= d <= c for d, c in zip(da, ceilings, strict=True))
    assert len(set(da)) == len(da)  # jittered: no two equal
    # growth: the mean of the later delays is far above the first ones
    assert np.mean(da[6:]) > 4 * np.mean(da[:3])
    other = [Backoff(0.05, 2.0, random.Random(8)).next_delay() for _ in range(1)]
    assert other[0] != da[0]
    a.reset()
    assert a.next_delay() <= 0.05


def test_client_reconnects_with_backoff_to_a_squatter(run: Runner) -> None:
    """A PS port answering every connection with a forged error: the client's delays follow
    the seeded backoff exactly (observed through the injected sleep, no wall time)."""

    async def scenario() -> tuple[list[float], BaseException | None, int]:
        conns = 0

        async def squat(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal conns
            conns += 1
            writer.write(encode_frame_bytes(Error(code="auth_failed", reason="squatter")))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(squat, HOST, 0)
        port = server.sockets[0].getsockname()[1]
        asked: list[float] = []
        ten = asyncio.Event()

        async def sleep(d: float) -> None:
            asked.append(d)
            if len(asked) >= 10:
                ten.set()
            await asyncio.sleep(0)

        client = WorkerClient(Worker(0, secret=SECRET), HOST, port, give_up_after_s=1e9,
                              options=ClientOptions(backoff_s=(0.05, 2.0),
                                                    rng=random.Random(3), sleep=sleep))
        task = asyncio.create_task(client.run())
        async with asyncio.timeout(STEP_S):
            await ten.wait()
        task.cancel()
        outcome: BaseException | None = None
        try:
            await task
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # pragma: no cover - reported below
            outcome = exc
        server.close()
        await server.wait_closed()
        return asked, outcome, client.worker.stats["preauth_auth_failed"]

    asked, outcome, preauth = run(scenario)
    assert outcome is None  # never fatal
    ref = Backoff(0.05, 2.0, random.Random(3))
    assert asked[:10] == [ref.next_delay() for _ in range(10)]
    assert preauth >= 9


# ------------------------------------------------------------------ squatter, then the real PS


def _both_forgeries_seen(client: WorkerClient) -> Callable[[], bool]:
    stats = client.worker.stats
    return lambda: stats["preauth_auth_failed"] >= 1 and stats["preauth_shutdown"] >= 1


def test_squatter_then_real_ps_every_round_completes(run: Runner) -> None:
    config = cfg(workers=4, delta=2, rounds=4)

    async def scenario() -> tuple[Any, list[Any], list[int]]:
        relay = SquatThenRelay()
        front = await asyncio.start_server(relay.handle, HOST, 0)
        port = front.sockets[0].getsockname()[1]
        logs = [EventLog() for _ in range(config.workers)]
        clients = [WorkerClient(Worker(j, secret=SECRET), HOST, port, on_event=logs[j],
                                options=ClientOptions(backoff_s=FAST_BACKOFF),
                                give_up_after_s=60.0)
                   for j in range(config.workers)]
        tasks = [asyncio.create_task(c.run()) for c in clients]
        # every worker gets both forged frames at least once (two retries each)
        async with asyncio.timeout(STEP_S):
            for c, log in zip(clients, logs, strict=True):
                await log.wait_for(_both_forgeries_seen(c))
        assert not any(t.done() for t in tasks)
        cl = await start_cluster(make_ps(config, secret=SECRET), workers=0, secret=SECRET)
        relay.target = cl.server.port
        relay.squatting = False
        async with asyncio.timeout(STEP_S):
            await cl.serve_task  # type: ignore[misc]
            results = await asyncio.gather(*tasks, return_exceptions=True)
        front.close()
        await front.wait_closed()
        return cl.ps.records, results, [c.worker.stats["preauth_close"] for c in clients]

    records, results, preauth = run(scenario)
    assert all(r is None for r in results), results
    assert all(p >= 2 for p in preauth)
    assert_exact_rounds(records, config.rounds, tol=1e-9)


def test_wrong_key_gives_up_naming_the_preauth_reason(run: Runner) -> None:
    """A real PS refusing a wrong key: the worker retries until its own give-up limit, then
    ends with ConnectionError naming the last unauthenticated answer (exit code 3 in the CLI)."""
    config = cfg(workers=4, delta=2, rounds=2)

    async def scenario() -> tuple[BaseException | None, int]:
        cl = await start_cluster(make_ps(config, secret=SECRET), secret=SECRET)
        bad = WorkerClient(Worker(1, secret=b"x" * 32), HOST, cl.server.port,
                           options=ClientOptions(backoff_s=FAST_BACKOFF), give_up_after_s=0.2)
        outcome: BaseException | None = None
        try:
            async with asyncio.timeout(STEP_S):
                await bad.run()
        except ConnectionError as exc:
            outcome = exc
        async with asyncio.timeout(STEP_S):
            await cl.finish()
        return outcome, bad.worker.stats["preauth_auth_failed"]

    outcome, n = run(scenario)
    assert outcome is not None
    assert "last unauthenticated answer: auth_failed" in str(outcome)
    assert n >= 1


# ------------------------------------------------------------------ norm guard floor


def test_norm_guard_ignores_round_off_sized_norms() -> None:
    """One finished worker in round 0 decodes ~1e-16: that carries no scale; the honest
    rounds after it (norm ~1) must not be rejected."""
    g = NormGuard(floor=1e-10)
    assert g.check(1e-16).ok
    g.accept(1e-16)
    for _ in range(5):
        v = g.check(1.0)
        assert v.ok, v
        g.accept(1.0)
    assert g.history[0] == 1e-16
    assert not g.check(100.0).ok  # the real scale still bounds


def test_error_injected_after_the_handshake_fails_the_tag(run: Runner) -> None:
    """A man in the middle injects an untagged ``error(auth_failed)`` after worker 0's verified
    welcome (the PS is then silent: it waits for the other workers to join). The worker's
    framing refuses it (bad tag), the worker reconnects, and the run completes normally."""
    config = cfg(workers=4, delta=2, rounds=3)

    async def scenario() -> tuple[Any, BaseException | None, int, list[Any]]:
        relay = SquatThenRelay()
        relay.squatting = False
        front = await asyncio.start_server(relay.handle, HOST, 0)
        port = front.sockets[0].getsockname()[1]
        cl = await start_cluster(make_ps(config, secret=SECRET), workers=0, secret=SECRET)
        relay.target = cl.server.port
        log = EventLog()
        victim = WorkerClient(Worker(0, secret=SECRET), HOST, port, on_event=log,
                              options=ClientOptions(backoff_s=FAST_BACKOFF),
                              give_up_after_s=60.0)
        task = asyncio.create_task(victim.run())
        async with asyncio.timeout(STEP_S):
            await log.wait_for(lambda: bool(log.of(Welcomed)))
            await relay.ready.wait()
        assert relay.down is not None
        relay.down.write(encode_frame_bytes(Error(code="auth_failed", reason="mitm")))
        async with asyncio.timeout(STEP_S):
            await log.wait_for(lambda: len(log.of(Welcomed)) >= 2)  # reconnected
        for j in range(1, config.workers):
            cl.add_worker(j, secret=SECRET)
        async with asyncio.timeout(STEP_S):
            await cl.finish()
            outcome = (await asyncio.gather(task, return_exceptions=True))[0]
        front.close()
        await front.wait_closed()
        return cl.ps.records, outcome, victim.connections, log.events

    records, outcome, connections, events = run(scenario)
    assert outcome is None
    assert connections >= 2
    assert not any(isinstance(e, ConnectionFailed) and e.code == "auth_failed" for e in events)
    assert_exact_rounds(records, config.rounds, tol=1e-9)


# ------------------------------------------------------------------ approximate mode, a liar


class _Tamper:
    """Replaces the payload of every CodedGradient worker ``w`` hands its driver."""

    def __init__(self, attack: str) -> None:
        self.attack = attack
        self.sent = 0

    def payload(self, v: np.ndarray) -> np.ndarray:
        self.sent += 1
        if self.attack == "scale3":
            out = 3 * v
        elif self.attack == "signflip":
            out = -v
        elif self.attack == "huge":
            out = np.full_like(v, 1e300)
        else:  # "bias": 1 % of its norm in one coordinate
            out = np.array(v, copy=True)
            out[0] += 0.01 * float(np.linalg.norm(v))
        return np.ascontiguousarray(out, dtype=v.dtype)

    def install(self, worker: Worker) -> None:
        polled = worker.poll

        def poll() -> Any:
            events, work, out, when = polled()
            fixed = []
            for o in out:
                if isinstance(o.message, CodedGradient):
                    o = o._replace(message=dataclasses.replace(
                        o.message, payload=self.payload(o.message.payload)))
                fixed.append(o)
            return events, work, fixed, when

        worker.poll = poll  # type: ignore[method-assign]


def _approx_schedule(config: RunConfig, seed: int = 5) -> DelaySchedule:
    """Per round a random half of the workers is fast (all chunks well before the
    deadline), the rest never finish in time: every round ends at the deadline, approximate."""
    m, delta = config.workers, config.delta
    rng = np.random.default_rng(seed)
    comp = np.full((config.rounds, m, delta), 10.0)
    for r in range(config.rounds):
        fast = rng.permutation(m)[: max(1, m // 2 - 1)]
        comp[r, fast, :] = 0.002
        comp[r, 1, :] = 0.002  # the liar always finishes: it gets its say every round
    return DelaySchedule(compute_s=comp, network_s=np.zeros((config.rounds, m)), seed=seed,
                         compute_spec="approx-test", network_spec="none")


#: the stated bound (docs: SECURITY_ADDENDUM.md): with verify, an applied approximate step is
#: within ``tol * ||sum_i |g_i| ||`` of the honest approximate step, tol = max(1e-6,
#: 1000 * cond(B) * eps(payload dtype) * amplification)
@pytest.mark.parametrize("scheme", ["partial", "original"])
@pytest.mark.parametrize("attack", ["scale3", "signflip", "huge", "bias"])
def test_authenticated_liar_in_approximate_mode_is_bounded(scheme: str, attack: str) -> None:
    config = RunConfig(scheme=scheme, workers=8, delta=3, rounds=8, seed=4, mode="approx",
                       deadline_s=0.05, task="linreg:samples=240,dim=12", heartbeat_s=None,
                       dead_after_s=None, round_timeout_s=20.0)
    rig = build_rig(config, schedule=_approx_schedule(config), secret=SECRET)
    tamper = _Tamper(attack)
    tamper.install(rig.workers[1])
    rig.sim.run()
    assert tamper.sent > 0
    recs = rig.ps.records
    assert len(recs) == config.rounds
    assert any("estimate" in r.end_detail for r in recs)  # approximate rounds were checked
    agg = rig.aggregator
    w = rig.task.initial_model().astype(np.float64)
    for rec in recs:
        if rec.status == "failed":
            assert any(c in rec.end_detail for c in ("estimate", "oracle", "norm")), rec.end_detail
            continue
        assert rec.gradient is not None
        G = np.stack([rig.task.chunk_gradient(i, w) for i in range(rig.scheme.n_chunks)])
        honest = agg.honest_estimate(np.asarray(rec.state, dtype=np.int64), G, w.size)
        scale = float(np.linalg.norm(np.abs(G).sum(axis=0)))
        rel = float(np.linalg.norm(rec.gradient - honest)) / scale
        assert rel <= 1e-6, (rec.round, rel)
        w = w - agg.learning_rate * rec.gradient
    # every round the liar sent in was rejected (its vector was read in each)
    assert sum(r.status == "failed" for r in recs) == len(recs)


@pytest.mark.parametrize("scheme", ["partial", "original"])
def test_honest_approximate_rounds_pass_the_estimate_check(scheme: str) -> None:
    config = RunConfig(scheme=scheme, workers=8, delta=3, rounds=8, seed=4, mode="approx",
                       deadline_s=0.05, task="linreg:samples=240,dim=12", heartbeat_s=None,
                       dead_after_s=None, round_timeout_s=20.0)
    rig = build_rig(config, schedule=_approx_schedule(config), secret=SECRET)
    rig.sim.run()
    recs = rig.ps.records
    assert all(r.status in ("approximate", "exact") for r in recs), [
        r.end_detail for r in recs]
    assert sum(r.status == "approximate" for r in recs) >= 3


# ------------------------------------------------------------------ original: a spare vector


def _swd_rig(config: RunConfig, *, spare_wait: float, verify: bool,
             liar: int | None = None, attack: str = "scale3") -> tuple[Any, _Tamper | None]:
    """PS and workers on the virtual clock (as tests/helpers.build_rig, with the PS's
    ``spare_wait`` and ``verify`` chosen here)."""
    schedule = materialise_for(config, [config.scheme])
    ps, task = kit_make_ps(config, schedule=schedule, verify=verify, keep_gradients=True,
                           secret=SECRET,
                           options=PSOptions(nonce_fn=_counter_nonces(), spare_wait=spare_wait))
    workers = task_workers(task, ps.m, secret=SECRET)
    tamper = None
    if liar is not None:
        tamper = _Tamper(attack)
        tamper.install(workers[liar])
    sim = Simulation(ps, workers)
    sim.run()
    return ps, tamper


ORIGINAL_CFG: dict[str, Any] = dict(scheme="original", workers=8, delta=3, rounds=24, seed=2,
                                    task="linreg:samples=240,dim=12", delay="exp:0.05",
                                    heartbeat_s=None, dead_after_s=None)


@pytest.mark.parametrize("attack", ["scale3", "signflip", "bias"])
def test_original_with_a_spare_detects_a_single_liar(attack: str) -> None:
    config = RunConfig(**ORIGINAL_CFG)
    need = config.workers - config.delta + 1  # m - s finished workers decode
    ps, tamper = _swd_rig(config, spare_wait=1.0, verify=False, liar=1, attack=attack)
    assert tamper is not None and tamper.sent > 0
    recs = ps.records
    assert len(recs) == config.rounds
    with_spare = [r for r in recs if 1 in r.arrivals and len(r.arrivals) > need]
    assert len(with_spare) >= 5  # the wait produced spares
    for r in with_spare:  # detected in every round where a spare vector exists
        assert r.status == "failed" and "redundancy" in r.end_detail, (r.round, r.end_detail)
    for r in recs:
        if r.status != "failed" and len(r.arrivals) <= need:
            assert r.end_detail.startswith(UNVERIFIED), r.end_detail


def test_original_without_a_spare_wait_is_unverified_under_no_verify() -> None:
    config = RunConfig(**ORIGINAL_CFG)
    ps, _ = _swd_rig(config, spare_wait=0.0, verify=False)
    recs = ps.records
    assert all(r.status == "exact" for r in recs)
    assert all(r.end_detail.startswith(UNVERIFIED) for r in recs)  # never a spare
    ps2, _ = _swd_rig(config, spare_wait=1.0, verify=False)
    assert all(r.status == "exact" for r in ps2.records)  # honest: no false rejection
    verified = [r for r in ps2.records if not r.end_detail.startswith(UNVERIFIED)]
    assert verified and all(len(r.arrivals) > 6 for r in verified)


def spare_wait_cost(spare_wait: float, rounds: int = 200) -> tuple[float, float]:
    """Mean round duration (virtual seconds) and share of rounds with a spare, honest run."""
    config = RunConfig(**{**ORIGINAL_CFG, "rounds": rounds})
    ps, _ = _swd_rig(config, spare_wait=spare_wait, verify=False)
    recs = ps.records
    mean = float(np.mean([r.duration_s for r in recs]))
    spare = float(np.mean([len(r.arrivals) > config.workers - config.delta + 1 for r in recs]))
    return mean, spare


def test_spare_wait_cost_is_bounded_by_its_factor() -> None:
    base, s0 = spare_wait_cost(0.0, rounds=40)
    waited, s1 = spare_wait_cost(1.0, rounds=40)
    assert s0 == 0.0 and s1 > 0.3
    assert base < waited <= 2.0 * base + 1e-9  # at most (1 + spare_wait) x each round
