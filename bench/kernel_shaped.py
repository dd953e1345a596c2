"""Live runs whose links the kernel shapes, against the communication model of the simulator.

aiogc's live fidelity is otherwise measured against its own simulator on links shaped by its
own user-space shaper (``--bandwidth``). Here the links are Linux's: a PS and its worker hosts
in network namespaces joined by veth pairs through a bridge, the shared PS ingress a token
bucket (``tc qdisc ... tbf``) on the bridge port that leads to the PS, and aiogc's own shaper
off. The live run's schedule (``RUN/delays.csv``) is then replayed by ``aiogc simulate
--delay replay:RUN/delays.csv --bandwidth SPEC`` at the same rate, and the record
``kernel_shaped_live_vs_sim`` (bench/run.py) is the ratio of the mean round times, live /
simulated, the worst over m = 8 and 16.

Topology (created and removed here; 198.18.0.0/15 is RFC 2544's benchmarking range, nothing
is routed outside the namespaces)::

    ns "ps"  198.18.0.1 e0 --veth-- p0 -+
    ns "w1"  198.18.0.2 e0 --veth-- p1 -+- bridge br0 in ns "hub";  tbf on p0: -> the PS
    ns "wH"  198.18.0.H+1 e0 --veth-- pH -+

Worker host ``h`` runs workers ``(h-1) m/H .. h m/H - 1`` as one ``aiogc worker --id A-B``
process (one worker-host connection). The schedule is pinned by default
(:func:`pinned_schedule`): the live run decodes the same states as its replay whatever the
timing, so the two differ only in what the links and the system add.

Where the kernel and the model disagree, and what the record's model (:func:`kernel_model`)
does about it:

* **per-segment headers**: the simulator's ``ps=R`` serves frame bytes; the token bucket
  counts Ethernet frames, each TCP segment of MSS payload bytes with ``ETH_OVERHEAD`` bytes of
  Ethernet, IPv4 and TCP (timestamps) headers: the bucket carries payload at
  ``R MSS / (MSS + 66)`` (4.6 % less at MTU 1500). Modelled (``ps=`` the goodput rate). GSO is
  off on the veths (``gso_max_segs 1``) so that every packet is one segment, as assumed.
* **acknowledgements**: the round starts (the model, ``8 d`` bytes per worker) go the other
  way, unshaped, but their ACKs cross the bucket and clock the downloads: at most
  ``ACK_SEGMENTS`` segments per 66-byte ACK, so the ``m`` downloads of a round start share
  ``R ACK_SEGMENTS MSS / 66``. Modelled (``worker_down=`` a 1/m share of it); the measured
  segments per ACK are in the detail (Linux acknowledges less often behind GRO).
* **the CPU**: the round starts' bytes through Python (tagging, copying, parsing) on the
  shared cores, which no link model has: the rest of the time until the trigger. Stated as
  measured (``offset_ms_until_trigger``), not modelled.
* **TCP slow start and ACK clocking of the uploads**: the bucket's round trip is tens of
  microseconds, so a 10-segment initial window already fills it; with a queue deep enough
  that nothing is dropped (``drops`` in the detail is 0) the bucket stays busy while vectors
  wait, as the model's FIFO does. What is left after the trigger is in
  ``offset_ms_after_trigger``.
* **liveness**: a worker host's pings queue behind the vectors at the bucket (and behind its
  own on its connection): at m = 16 and 4 MB/s for over 5 s, so the PS runs with a long
  ``--dead-after`` here. The model has no heartbeats; a live run behind a slow shared ingress
  needs ``dead_after_s`` above its longest upload phase.
* **burst**: the bucket's ``BURST`` bytes can go at line rate after an idle spell: at most
  ``BURST / R`` per spell (``burst_bound_s``).

Usage (root, Linux, iproute2 with tc)::

    python bench/kernel_shaped.py [--m 8 16] [--rounds 12] [--dim 250000] [--rate 10MB/s]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiogc.protocol.tags import TAG_BYTES

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: Hang guard of every process wait (not a measurement).
GUARD_S = 300.0
SUBNET = "198.18.0"
MTU = 1500
#: TCP payload per segment at MTU 1500 with the timestamp option (Linux's default).
MSS = MTU - 20 - 20 - 12
#: Bytes per segment the token bucket counts beyond the payload: Ethernet 14, IPv4 20, TCP 32.
ETH_OVERHEAD = 14 + 20 + 32
#: Segments a receiver acknowledges per ACK at most before it must send one (delayed ACK,
#: RFC 5681 section 4.2: every second full-sized segment).
ACK_SEGMENTS = 2
#: Token bucket depth (bytes): a few segments, so the bucket is nearly a pure rate.
BURST = 8 * (MSS + ETH_OVERHEAD)
#: Queue of the token bucket (bytes): deep enough that the senders' TCP never loses a segment
#: to it (a drop would be the kernel's congestion control, not the link, in the comparison).
LIMIT = 64 * 1024 * 1024


class Unavailable(RuntimeError):
    """Namespaces or the token bucket were refused by this machine (the reason in the text)."""


def unavailable() -> str | None:
    """Why kernel-shaped namespaces cannot be made here, or None."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the `{tool}` command (iproute2) is not installed"
    return None


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30, check=False)


def parse_rate(spec: str) -> float:
    """``25MB/s`` -> 25e6 bytes per second (decimal units, as ``--bandwidth``)."""
    from aiogc.config import parse_bandwidth

    rate = parse_bandwidth(f"ps={spec}").ps_Bps
    assert rate is not None
    return float(rate)


def kernel_model(rate_Bps: float, m: int) -> str:
    """The ``--bandwidth`` spec that models a token bucket of ``rate_Bps`` on the PS's ingress.

    * ``ps=``: the goodput rate (:func:`goodput_rate`): every segment's headers counted;
    * ``worker_down=``: the round starts' downloads are not shaped, but their acknowledgements
      cross the bucket, at most ``ACK_SEGMENTS`` segments acknowledged per 66-byte ACK: all
      ``m`` downloads of a round start together, so each gets ``1/m`` of the ACK-clocked rate
      ``rate * ACK_SEGMENTS * MSS / ETH_OVERHEAD``. (Linux acknowledges less often behind GRO:
      the measured ratio is in the record's detail; fewer ACKs leave the downloads to the
      CPU, which the model has no term for.)
    """
    down = rate_Bps * ACK_SEGMENTS * MSS / ETH_OVERHEAD / m
    return f"worker_down={down:.0f}B/s,ps={goodput_rate(rate_Bps):.0f}B/s"


def goodput_rate(rate_Bps: float) -> float:
    """The rate at which a token bucket of ``rate_Bps`` on Ethernet frames carries TCP payload
    (full segments): ``rate * MSS / (MSS + ETH_OVERHEAD)``."""
    return rate_Bps * MSS / (MSS + ETH_OVERHEAD)


@dataclass
class Net:
    """The namespaces of one measurement: ``ns[name]`` for "hub", "ps", "w1".."wH"."""

    ns: dict[str, str]
    hosts: int

    def prefix(self, host: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns[host]]

    def addr(self, host: str) -> str:
        return f"{SUBNET}.1" if host == "ps" else f"{SUBNET}.{int(host[1:]) + 1}"

    def pids(self) -> set[int]:
        out: set[int] = set()
        for name in self.ns.values():
            out |= {int(x) for x in _run("ip", "netns", "pids", name).stdout.split()}
        return out

    def shape(self, rate_Bps: float | None) -> None:
        """The token bucket on the bridge port to the PS (none: unshaped)."""
        _run("ip", "netns", "exec", self.ns["hub"], "tc", "qdisc", "del", "dev", "p0", "root")
        if rate_Bps is None:
            return
        r = _run("ip", "netns", "exec", self.ns["hub"], "tc", "qdisc", "add", "dev", "p0",
                 "root", "tbf", "rate", f"{int(rate_Bps * 8)}bit", "burst", str(BURST),
                 "limit", str(LIMIT))
        if r.returncode != 0:
            raise Unavailable(f"`tc qdisc add ... tbf` refused: {r.stderr.strip()}")

    def qdisc_stats(self) -> dict[str, int]:
        """``bytes``, ``packets``, ``drops``, ``overlimits`` of the token bucket on p0."""
        r = _run("ip", "netns", "exec", self.ns["hub"], "tc", "-j", "-s", "qdisc", "show",
                 "dev", "p0")
        for q in json.loads(r.stdout or "[]"):
            if q.get("kind") == "tbf":
                return {k: int(q.get(k, 0)) for k in ("bytes", "packets", "drops",
                                                      "overlimits")}
        return {}


@contextlib.contextmanager
def network(hosts: int) -> Iterator[Net]:
    """The namespaces, veths and bridge; everything removed (and every process left in them
    killed by its id) on the way out."""
    why = unavailable()
    if why is not None:
        raise Unavailable(why)
    tag = f"aks{os.getpid() % 100000}{secrets.token_hex(2)}"
    names = ["hub", "ps", *[f"w{h}" for h in range(1, hosts + 1)]]
    net = Net({n: f"{tag}{n}" for n in names}, hosts)
    made: list[str] = []
    try:
        for n in names:
            r = _run("ip", "netns", "add", net.ns[n])
            if r.returncode != 0:
                raise Unavailable(f"`ip netns add` refused: {r.stderr.strip()}")
            made.append(net.ns[n])
        hub = net.ns["hub"]
        steps = [("-n", hub, "link", "add", "br0", "type", "bridge"),
                 ("-n", hub, "link", "set", "br0", "up")]
        for i, host in enumerate(names[1:]):
            steps += [
                ("link", "add", "e0", "netns", net.ns[host], "mtu", str(MTU), "type", "veth",
                 "peer", "name", f"p{i}", "netns", hub, "mtu", str(MTU)),
                # one TCP segment per packet (no GSO/TSO super-packets), so the token bucket
                # counts every segment's headers as the model's per-segment overhead assumes
                ("-n", net.ns[host], "link", "set", "e0", "gso_max_segs", "1"),
                ("-n", hub, "link", "set", f"p{i}", "gso_max_segs", "1"),
                ("-n", hub, "link", "set", f"p{i}", "master", "br0"),
                ("-n", hub, "link", "set", f"p{i}", "up"),
                ("-n", net.ns[host], "addr", "add", f"{net.addr(host)}/24", "dev", "e0"),
                ("-n", net.ns[host], "link", "set", "e0", "up"),
                ("-n", net.ns[host], "link", "set", "lo", "up"),
            ]
        for step in steps:
            r = _run("ip", *step)
            if r.returncode != 0:
                raise RuntimeError(f"ip {' '.join(step)}: {r.stderr.strip()}")
        yield net
    finally:
        for pid in net.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for name in made:
            _run("ip", "netns", "del", name)


def live_run(net: Net, out: Path, *, m: int, delta: int, dim: int, rounds: int, delay: str,
             seed: int) -> dict[str, Any]:
    """``aiogc ps`` in "ps" (no ``--bandwidth``: the kernel shapes) and one ``aiogc worker
    --id A-B`` per worker host; returns the PS's summary."""
    secret = out.parent / f"{out.name}.secret"
    secret.write_bytes(secrets.token_hex(32).encode())
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("AIOGC_SECRET", None)
    task = f"{HERE / 'bulk_task.py'}:bulk_{dim}"
    ps_cmd = [*net.prefix("ps"), sys.executable, "-m", "aiogc", "ps", "--host", net.addr("ps"),
              "--port", "0", "--workers", str(m), "--delta", str(delta), "--rounds",
              str(rounds), "--seed", str(seed), "--delay", delay, "--task", task,
              "--secret-file", str(secret), "--out", str(out), "--no-verify", "--epoch", "1",
              "--join-timeout", str(GUARD_S / 2), "--no-progress", "-q",
              # a host's pings wait behind its own and everyone's queued vectors at the
              # bucket (m = 16 at 4 MB/s: over 5 s), which the default liveness (dead after
              # 5 s of silence) takes for a dead host
              "--dead-after", str(GUARD_S / 2)]
    ps = subprocess.Popen(ps_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env)
    workers: list[subprocess.Popen[str]] = []
    try:
        assert ps.stderr is not None
        line = ps.stderr.readline()
        match = re.search(r"listening on ([\d.]+):(\d+)", line)
        if not match:
            raise RuntimeError(f"aiogc ps did not start: {line}{ps.stderr.read()[-2000:]}")
        addr = f"{match.group(1)}:{match.group(2)}"
        per = m // net.hosts
        for h in range(1, net.hosts + 1):
            ids = f"{(h - 1) * per}-{h * per - 1}"
            workers.append(subprocess.Popen(
                [*net.prefix(f"w{h}"), sys.executable, "-m", "aiogc", "worker", "--connect",
                 addr, "--id", ids, "--secret-file", str(secret), "--task", task,
                 "--give-up-after", str(GUARD_S / 2), "-q"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        _, err = ps.communicate(timeout=GUARD_S)
        werr = [w.communicate(timeout=GUARD_S)[1] for w in workers]
    finally:
        for p in [ps, *workers]:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=GUARD_S)
        secret.unlink(missing_ok=True)
    if ps.returncode != 0:
        raise RuntimeError(f"aiogc ps exited {ps.returncode}: {err[-2000:]}")
    bad = [(i, w.returncode, e[-500:]) for i, (w, e) in enumerate(zip(workers, werr,
                                                                       strict=True))
           if w.returncode != 0]
    if bad:
        raise RuntimeError(f"worker hosts failed: {bad}")
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text("utf-8"))
    return summary


def live_round_s(run_dir: Path) -> list[float]:
    """The completed rounds' live durations (seconds), from ``rounds.csv``."""
    with (run_dir / "rounds.csv").open(newline="") as fh:
        return [float(r["duration_s"]) for r in csv.DictReader(fh)
                if r["status"] == "exact"]


def simulated_rounds(run_dir: Path, *, m: int, delta: int, dim: int, seed: int,
                     bandwidth: str) -> Any:
    """The fast path's result (:class:`~aiogc.sim.fast.FastResult`) on the live run's own
    schedule (``RUN/delays.csv``) with the communication model ``bandwidth`` at ``dim``
    values: what :func:`simulate_cli` averages."""
    from aiogc.config import RunConfig, parse_bandwidth
    from aiogc.sim.fast import simulate_fast
    from aiogc.training.schedule import DelaySchedule

    sched = DelaySchedule.from_csv(run_dir / "delays.csv")
    cfg = RunConfig(workers=m, delta=delta, rounds=sched.rounds, seed=seed)
    return simulate_fast(cfg, ["partial"], schedule=sched, comm=parse_bandwidth(bandwidth),
                         dim=dim, mse=False)["partial"]


def simulate_cli(run_dir: Path, *, m: int, delta: int, dim: int, rounds: int, seed: int,
                 bandwidth: str) -> float:
    """``aiogc simulate --delay replay:RUN/delays.csv --bandwidth SPEC --dim d``: the mean
    round time it prints."""
    cmd = [sys.executable, "-m", "aiogc", "simulate", "--workers", str(m), "--delta",
           str(delta), "--schemes", "partial", "--delay", f"replay:{run_dir / 'delays.csv'}",
           "--trials", str(rounds), "--seed", str(seed), "--dim", str(dim), "--bandwidth",
           bandwidth, "-q"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT),
                                                        os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=GUARD_S, env=env,
                       check=False)
    if r.returncode != 0:
        raise RuntimeError(f"aiogc simulate exited {r.returncode}: {r.stderr[-2000:]}")
    res = next(x for x in json.loads(r.stdout)["results"] if x["scheme"] == "partial")
    return float(res["completion_mean"])


def pinned_schedule(workdir: Path, *, m: int, delta: int, rounds: int, seed: int,
                    gap_s: float) -> Path:
    """A schedule whose trigger states cannot depend on timing
    (:func:`tests.helpers.pinned_trigger_schedule`: the chunks of a minimal decodable state
    finish ``gap_s`` apart, the others never), as CSV: the live run and its replay then decode
    the same states, so their round times differ only by what the links and the system add."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from aiogc.config import RunConfig
    from tests.helpers import pinned_trigger_schedule

    path = workdir / f"pinned_m{m}.csv"
    pinned_trigger_schedule(RunConfig(workers=m, delta=delta, rounds=rounds, seed=seed),
                            gap_s=gap_s, seed=seed).to_csv(path)
    return path


#: A generous bound on a worker's or a host connection's handshake bytes through the bucket
#: (hello, its records, their segments).
HANDSHAKE_BOUND = 4096


def _frame_bytes(m: int, delta: int, dim: int, seed: int) -> Any:
    from aiogc.config import RunConfig
    from aiogc.sim.comm import FrameBytes

    scheme = RunConfig(workers=m, delta=delta, seed=seed).build_scheme()
    return FrameBytes.of(scheme, dim)


def live_trigger_s(run_dir: Path) -> list[float]:
    """The completed rounds' trigger times after their start (seconds), from ``rounds.csv``."""
    with (run_dir / "rounds.csv").open(newline="") as fh:
        return [float(r["trigger_s"]) - float(r["start_s"]) for r in csv.DictReader(fh)
                if r["status"] == "exact"]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def measure(m: int, *, hosts: int, delta: int = 3, dim: int = 250_000, rounds: int = 12,
            rate: str = "10MB/s", delay: str = "pinned:0.02", seed: int = 1,
            workdir: Path) -> dict[str, Any]:
    """One kernel-shaped live run at ``m`` workers on ``hosts`` worker hosts, and its replay.

    Returns
    -------
    dict
        ``live_mean_s``; ``sim_mean_s`` (the simulator with :func:`kernel_model`) and
        ``ratio`` (live / it); ``sim_goodput_mean_s`` / ``ratio_goodput`` (the ingress at the
        goodput rate only) and ``sim_nominal_mean_s`` / ``ratio_nominal`` (at the tc rate
        itself, no overheads); ``offset_ms_until_trigger`` / ``offset_ms_after_trigger``
        (live - modelled per round, min / median / max, ms: before the trigger the round
        starts' downloads and the CPU, after it the vectors through the bucket);
        ``upload_share`` (the simulated round's ingress-busy share, how upload-bound it is);
        ``qdisc`` (the token bucket's counters: bytes, packets, drops, overlimits);
        ``per_round`` (live, sim) pairs; the sizes.
    """
    rate_Bps = parse_rate(rate)
    good = goodput_rate(rate_Bps)
    out = workdir / f"kernel_m{m}"
    if delay.startswith("pinned:"):
        gap = float(delay.split(":", 1)[1])
        pinned = pinned_schedule(workdir, m=m, delta=delta, rounds=rounds, seed=seed, gap_s=gap)
        delay = f"replay:{pinned}"
    with network(hosts) as net:
        net.shape(rate_Bps)
        live_run(net, out, m=m, delta=delta, dim=dim, rounds=rounds, delay=delay, seed=seed)
        qd = net.qdisc_stats()
    live = live_round_s(out)
    kw: dict[str, Any] = {"m": m, "delta": delta, "dim": dim, "seed": seed}
    spec = kernel_model(rate_Bps, m)
    res = simulated_rounds(out, bandwidth=spec, **kw)
    sim = [float(x) for x in res.completion_s]

    def mean_at(bandwidth: str) -> float:
        return _mean([float(x) for x in simulated_rounds(out, bandwidth=bandwidth, **kw)
                      .completion_s])

    nm, gm = mean_at(f"ps={rate_Bps:.0f}B/s"), mean_at(f"ps={good:.0f}B/s")
    fm = mean_at("ps=1000GB/s")
    cli = simulate_cli(out, rounds=len(sim), bandwidth=spec, **kw)
    if abs(cli - _mean(sim)) > 1e-9 * max(1.0, cli):
        raise RuntimeError(f"aiogc simulate's mean {cli} differs from the replay's {_mean(sim)}")
    if len(live) != len(sim):
        raise RuntimeError(f"{len(live)} live exact rounds against {len(sim)} in the schedule")
    n = len(live)
    lm, sm = _mean(live), _mean(sim)
    trig = live_trigger_s(out)
    phase = {"until_trigger": sorted(a - float(b) for a, b in zip(trig, res.trigger_s,
                                                                  strict=True)),
             "after_trigger": sorted((a - t) - float(c - u) for a, t, c, u in zip(
                 live, trig, res.completion_s, res.trigger_s, strict=True))}
    vector_bytes = int(res.upload_bytes.sum())
    frames = _frame_bytes(m, delta, dim, seed)
    # what crosses the other way: every round start (and encode request), tagged; each of
    # their segments is acknowledged at most once through the bucket
    down = n * (int(frames.round_start.sum()) + m * frames.encode + 2 * TAG_BYTES * m)
    small = n * m * (delta + 2)  # reports, pings: at most a segment each
    acks = qd.get("packets", 0) - math.ceil(vector_bytes / MSS) - small
    return {"m": m, "hosts": hosts, "delta": delta, "dim": dim, "rounds": rounds,
            "rounds_compared": n, "rate": rate, "model": spec, "delay": delay,
            "live_mean_s": lm, "sim_mean_s": sm, "ratio": lm / sm,
            "sim_goodput_mean_s": gm, "ratio_goodput": lm / gm,
            "sim_nominal_mean_s": nm, "ratio_nominal": lm / nm,
            "upload_share": 1.0 - fm / sm,
            "burst_bound_s": BURST / rate_Bps, "qdisc": qd,
            **{f"offset_ms_{k}": [round(1e3 * v[0], 1), round(1e3 * v[n // 2], 1),
                                  round(1e3 * v[-1], 1)] for k, v in phase.items()},
            "vector_bytes": vector_bytes,
            "tc_bytes_per_vector_byte": qd.get("bytes", 0) / vector_bytes,
            "segment_overhead": (MSS + ETH_OVERHEAD) / MSS,
            "segments_per_ack_measured": (down / MSS) / acks if acks > 0 else None,
            "ack_bound_bytes": (down / MSS + 2 * n * m) * ETH_OVERHEAD,
            # reports, pings, the handshakes: each at most a segment of its own with headers
            "small_frames_bound_bytes": (small * (frames.report + TAG_BYTES + ETH_OVERHEAD)
                                         + (m + hosts) * HANDSHAKE_BOUND),
            "sim_states": res.states.tolist(),
            "per_round": [[round(a, 5), round(b, 5)] for a, b in zip(live, sim, strict=True)]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--hosts", type=int, default=4, help="worker hosts (divides every m)")
    ap.add_argument("--delta", type=int, default=3)
    ap.add_argument("--dim", type=int, default=250_000)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--rate", default="10MB/s")
    ap.add_argument("--delay", default="pinned:0.02",
                    help="pinned:GAP (a schedule whose trigger states cannot depend on timing, "
                         "chunks GAP seconds apart) or any --delay spec")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", metavar="DIR", help="keep the run directories here")
    a = ap.parse_args(argv)
    why = unavailable()
    if why is not None:
        print(f"kernel_shaped: not measured: {why}", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        if a.keep:
            workdir = Path(a.keep)
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="aiogc-k-")))
        res = []
        for m in a.m:
            t0 = time.monotonic()
            r = measure(m, hosts=a.hosts, delta=a.delta, dim=a.dim, rounds=a.rounds,
                        rate=a.rate, delay=a.delay, seed=a.seed, workdir=workdir)
            r["wall_s"] = round(time.monotonic() - t0, 1)
            res.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "per_round"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
