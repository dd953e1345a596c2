"""The PS's admission of connections without an authenticated worker (aiogc.net.admission).

The caps' arithmetic and the eviction order are checked on fake connections (no sockets). The
flood test holds 520 connections that never authenticate (a host preamble alone, a preamble
and OPENs, OPEN/CLOSE churn, nothing at all) against a PS whose file limit is lowered, while
honest workers join and train: every flooding connection is closed by the PS and every honest
round is exact. The flood runs in its own process (its sockets are not the PS's files); it
ends each connection once the PS closed it, or after a generous guard that only a connection
the PS never closed reaches. No assertion on a duration.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
from typing import Any

import pytest

from aiogc.net.admission import (
    FD_RESERVE,
    MIN_UNAUTHENTICATED,
    OPENS_PER_SLOT,
    Admission,
    unauthenticated_cap,
)
from aiogc.protocol.hostmux import (
    CLOSE,
    OPEN,
    ROLE_HOST,
    MuxFrameDecoder,
    encode_control,
    encode_preamble,
)
from tests.netkit import (
    GUARD_S,
    STEP_S,
    Runner,
    assert_exact_rounds,
    cfg,
    loop_factories,
    make_ps,
    make_runner,
    spaced_schedule,
    start_cluster,
)


@pytest.fixture(params=loop_factories())
def run(request: pytest.FixtureRequest) -> Runner:
    return make_runner(request.param)


# ------------------------------------------------------------------ the caps, without sockets


def test_the_cap_fits_the_file_budget() -> None:
    # plenty of files: the core's cap
    assert unauthenticated_cap(8, 64, 1 << 20, 20) == (64, 32)
    # a file limit of 256 with 20 open and 8 workers: still room for the core's 64
    assert unauthenticated_cap(8, 64, 256, 20)[0] == 64
    # a tight limit: what is left after the open files, one per worker and the reserve
    total, per_source = unauthenticated_cap(8, 64, 120, 20)
    assert total == 120 - 20 - 8 - FD_RESERVE
    assert per_source == max(total // 2, 8 + MIN_UNAUTHENTICATED)
    # never below the floor, however tight
    assert unauthenticated_cap(8, 64, 40, 20)[0] == MIN_UNAUTHENTICATED
    # a large run: every worker may be mid-handshake from one address
    total, per_source = unauthenticated_cap(1000, 2000, 1 << 20, 20)
    assert (total, per_source) == (2000, 1008)


#: the admission recognises a host connection by its decoder's type
_MUX = MuxFrameDecoder(lambda dec, slot: None)


class _Conn:
    """A fake transport connection: its source address and whether it was closed."""

    def __init__(self, addr: str, port: int) -> None:
        self.peername = (addr, port)
        self.decoder: Any = None
        self.closed_with: str | None = None
        self.aborted = False

    def close(self, code: str | None = None, reason: str = "") -> None:
        self.closed_with = code

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted


def _admission(total: int, per_source: int) -> tuple[asyncio.AbstractEventLoop, Admission]:
    loop = asyncio.new_event_loop()
    return loop, Admission(loop, 60.0, total, per_source)


def test_a_remote_source_is_capped_and_evicts_its_own_oldest() -> None:
    loop, adm = _admission(total=10, per_source=4)
    try:
        flood = [_Conn("10.0.0.9", p) for p in range(6)]
        honest = _Conn("10.0.0.1", 1)
        adm.admit(honest)
        for c in flood:
            adm.admit(c)
        assert [c.aborted for c in flood] == [True, True, False, False, False, False]
        assert flood[0].closed_with == "too_many_connections"
        assert not honest.aborted and adm.pending == 5
        assert adm.stats["evicted_source"] == 2
    finally:
        adm.close_all()
        loop.close()


def test_at_the_total_cap_the_busiest_source_loses_its_oldest() -> None:
    loop, adm = _admission(total=4, per_source=4)
    try:
        honest = _Conn("127.0.0.1", 1)
        adm.admit(honest)
        flood = [_Conn("127.0.0.2", p) for p in range(5)]
        for c in flood:
            adm.admit(c)
        assert not honest.aborted
        assert [c.aborted for c in flood] == [True, True, False, False, False]
        assert adm.stats["evicted_total"] == 2
        # an authenticated connection leaves the pending set: room for one more
        adm.authenticated(honest)
        assert adm.pending == 3
    finally:
        adm.close_all()
        loop.close()


def test_the_deadline_closes_what_did_not_authenticate() -> None:
    loop = asyncio.new_event_loop()
    try:
        adm = Admission(loop, 0.01, 8, 8)
        silent, honest = _Conn("127.0.0.1", 1), _Conn("127.0.0.1", 2)
        silent.decoder = honest.decoder = _MUX  # host connections: no core deadline first
        adm.admit(silent)
        adm.admit(honest)
        adm.authenticated(honest)
        loop.run_until_complete(asyncio.sleep(0.05))
        assert silent.aborted and silent.closed_with == "auth_timeout"
        assert not honest.aborted and adm.stats["expired"] == 1
    finally:
        loop.close()


def test_opens_are_bounded_until_a_slot_authenticates() -> None:
    loop, adm = _admission(total=8, per_source=8)
    try:
        conn = _Conn("127.0.0.1", 1)
        adm.admit(conn)
        allowed = [adm.may_open(conn, 3) for _ in range(OPENS_PER_SLOT * 3 + 2)]
        assert allowed == [True] * (OPENS_PER_SLOT * 3) + [False, False]
        assert adm.stats["open_flood"] == 2
    finally:
        adm.close_all()
        loop.close()




# ------------------------------------------------------------------ the flood, on loopback

#: The flood: waves of connections from 127.0.0.2, each wave opened at once and held until
#: the PS closed all of them (or, for a connection the PS never closes, until the guard).
_FLOOD = r"""
import asyncio, json, resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
port, waves, per_wave = (int(a) for a in sys.argv[1:4])
guard = float(sys.argv[4])
preamble, opens, churn = (bytes.fromhex(a) for a in sys.argv[5:8])
out = {"opened": 0, "closed": 0, "still_open": 0, "refused": 0}

async def one(kind):
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
    except OSError:
        out["refused"] += 1
        return
    out["opened"] += 1
    try:
        if kind == 1:
            w.write(preamble)
        elif kind == 2:
            w.write(preamble + opens)
        elif kind == 3:
            w.write(preamble)
        async def read_all():
            while True:
                if kind == 3:
                    w.write(churn)  # OPEN then CLOSE of slot 0, again and again
                    try:
                        data = await asyncio.wait_for(r.read(65536), 0.02)
                    except TimeoutError:
                        continue
                else:
                    data = await r.read(65536)
                if not data:
                    return
        try:
            await asyncio.wait_for(read_all(), guard)
            out["closed"] += 1
        except TimeoutError:
            out["still_open"] += 1
    except (ConnectionError, OSError):
        out["closed"] += 1
    finally:
        w.close()

async def main():
    for wave in range(waves):
        await asyncio.gather(*[one((wave + i) % 4) for i in range(per_wave)])
    print(json.dumps(out))

asyncio.run(main())
"""


def test_a_flood_that_never_authenticates_is_closed_and_honest_rounds_complete(
        run: Runner) -> None:
    """520 connections that never authenticate (host preamble only, preamble + OPENs,
    OPEN/CLOSE churn, silent), in waves of 130 held open at once, against a PS whose file
    limit leaves it 250 descriptors, while 4 honest workers join and train 10 rounds."""
    config = cfg(workers=4, delta=2, n_parts=1, rounds=10)
    ps = make_ps(config, schedule=spaced_schedule(config, gap_s=0.08))
    waves, per_wave = 4, 130
    hex_args = [encode_preamble(ROLE_HOST, 0, 4).hex(),
                b"".join(encode_control(OPEN, s) for s in range(4)).hex(),
                (encode_control(OPEN, 0) + encode_control(CLOSE, 0)).hex()]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    async def scenario() -> tuple[dict[str, Any], Any, dict[str, int]]:
        open_now = len(os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, open_now + 250), hard))
        try:
            cl = await start_cluster(ps, workers=0)
            flood = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _FLOOD, str(cl.server.port), str(waves), str(per_wave),
                str(STEP_S), *hex_args, stdout=asyncio.subprocess.PIPE)
            for j in range(config.workers):
                cl.add_worker(j)
            async with asyncio.timeout(GUARD_S):
                out, _ = await flood.communicate()
            async with asyncio.timeout(GUARD_S):
                await cl.finish()
            assert cl.server._admission is not None
            return json.loads(out), cl, dict(cl.server._admission.stats)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    got, cl, stats = run(scenario)
    assert got["opened"] + got["refused"] == waves * per_wave
    assert got["opened"] >= 500
    assert got["still_open"] == 0  # the PS closed every one of them
    assert got["closed"] == got["opened"]
    assert stats["expired"] + stats["evicted_total"] > 0
    assert_exact_rounds(cl.ps.records, config.rounds, tol=1e-9)
    assert all(not r.dropped for r in cl.ps.records)
