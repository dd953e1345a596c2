"""The PS's cap on unauthenticated connections scales with the run: every worker of a large
run may be mid-handshake at once (one host opening m connections in a burst) without any of
them being evicted, while a flood beyond the cap still evicts the oldest pending first."""

from __future__ import annotations

from aiogc.config import RunConfig
from aiogc.core import PeerClosed
from aiogc.core.ps import MAX_PENDING_CONNECTIONS, pending_cap
from aiogc.protocol.messages import Hello
from tests.helpers import build_rig


def _rig(workers: int):  # type: ignore[no-untyped-def]
    config = RunConfig(workers=workers, delta=2, rounds=1, delay="exp:0.05", seed=3,
                       task="linreg:samples=400,dim=4", heartbeat_s=None, dead_after_s=None)
    rig = build_rig(config)
    rig.ps.nonce_fn = lambda: b"n" * 16
    return rig


def test_pending_cap_is_the_floor_at_small_m_and_twice_m_beyond() -> None:
    assert pending_cap(_rig(6).ps.m) == MAX_PENDING_CONNECTIONS
    assert pending_cap(_rig(MAX_PENDING_CONNECTIONS // 2).ps.m) == MAX_PENDING_CONNECTIONS
    assert pending_cap(_rig(100).ps.m) == 200


def test_every_worker_of_a_large_run_may_be_pending_at_once() -> None:
    m = 100  # 2m > MAX_PENDING_CONNECTIONS: the old fixed cap evicted 36 of these
    ps = _rig(m).ps
    for j in range(m):
        ps.connection_made(("w", j), now=j * 1e-4)
    assert not [e for e in iter(ps.next_event, None) if isinstance(e, PeerClosed)]
    assert dict(ps.stats).get("evicted_pending", 0) == 0
    # the slowest answer (the first connection's) still gets in
    ps.receive(("w", 0), Hello(worker=0, nonce=b"w" * 16, mac=b"", epoch=0), now=0.05)
    assert ps.worker_of(("w", 0)) is not None


def test_a_flood_beyond_the_scaled_cap_evicts_the_oldest_first() -> None:
    m = 100
    ps = _rig(m).ps
    cap = pending_cap(ps.m)
    extra = 5
    for i in range(cap + extra):
        ps.connection_made(("hog", i), now=i * 1e-4)
    closed = [e for e in iter(ps.next_event, None) if isinstance(e, PeerClosed)]
    assert [(e.peer, e.code) for e in closed] == [
        (("hog", i), "too_many_connections") for i in range(extra)]
    assert dict(ps.stats)["evicted_pending"] == extra
    assert len(ps._pending) == cap
    # an honest worker arriving now still gets a slot (evicting the oldest hog) and joins
    ps.connection_made("worker", now=1.0)
    ps.receive("worker", Hello(worker=0, nonce=b"w" * 16, mac=b"", epoch=0), now=1.001)
    assert ps.worker_of("worker") is not None
    assert dict(ps.stats)["evicted_pending"] == extra + 1
