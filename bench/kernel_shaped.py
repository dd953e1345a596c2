"""Live runs whose links the kernel shapes, against the communication model of the simulator.

aiogc's live fidelity is otherwise measured against its own simulator on links shaped by its
own user-space shaper (``--bandwidth``). Here the links are Linux's: a PS and its worker hosts
in network namespaces joined by veth pairs through a bridge, the shared PS ingress a token
bucket (``tc qdisc ... tbf``) on the bridge port that leads to the PS, and aiogc's own shaper
off. The live run's schedule (``RUN/delays.csv``) is then replayed by ``aiogc simulate
--delay replay:RUN/delays.csv --bandwidth ps=R`` at the same rate, and the record is the
ratio of the mean round times, live / simulated.

Topology (created and removed here; 198.18.0.0/15 is RFC 2544's benchmarking range, nothing
is routed outside the namespaces)::

    ns "ps"  198.18.0.1 e0 --veth-- p0 -+
    ns "w1"  198.18.0.2 e0 --veth-- p1 -+- bridge br0 in ns "hub";  tbf on p0: -> the PS
    ns "wH"  198.18.0.H+1 e0 --veth-- pH -+

Worker host ``h`` runs workers ``(h-1) m/H .. h m/H - 1`` as one ``aiogc worker --id A-B``
process (one worker-host connection). The simulator's ``ps=R`` is a FIFO server of frame
bytes; the kernel's token bucket counts the bytes of Ethernet frames: every TCP segment of
MSS payload bytes carries ``ETH_OVERHEAD`` bytes of Ethernet, IPv4 and TCP (with timestamps)
headers, so the simulator at rate ``R`` is optimistic by about ``(MSS + 66) / MSS`` (4.6 % at
MTU 1500) wherever the ingress is the bottleneck. :func:`goodput_rate` is the rate that
models it: the record compares the live run with the simulator at the goodput rate, and keeps
the ratio at the nominal rate beside it (``detail``). The token bucket's burst (``BURST``
bytes) can go at line rate after an idle spell, which the model lacks: at most ``BURST / R``
seconds per idle spell, so per round (bounded in the detail).

Usage (root, Linux, iproute2 with tc)::

    python bench/kernel_shaped.py [--m 8 16] [--rounds 12] [--dim 250000] [--rate 25MB/s]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
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
#: Token bucket depth (bytes): a few segments, so the bucket is nearly a pure rate.
BURST = 8 * (MSS + ETH_OVERHEAD)
#: Queue of the token bucket (bytes): deep enough that the senders' TCP never loses a segment
#: to it (a drop would be the kernel's congestion control, not the link, in the comparison).
LIMIT = 64 * 1024 * 1024


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
            raise RuntimeError(f"tc qdisc add ... tbf refused: {r.stderr.strip()}")

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
        raise RuntimeError(why)
    tag = f"aks{os.getpid() % 100000}{secrets.token_hex(2)}"
    names = ["hub", "ps", *[f"w{h}" for h in range(1, hosts + 1)]]
    net = Net({n: f"{tag}{n}" for n in names}, hosts)
    made: list[str] = []
    try:
        for n in names:
            r = _run("ip", "netns", "add", net.ns[n])
            if r.returncode != 0:
                raise RuntimeError(f"`ip netns add` refused: {r.stderr.strip()}")
            made.append(net.ns[n])
        hub = net.ns["hub"]
        steps = [("-n", hub, "link", "add", "br0", "type", "bridge"),
                 ("-n", hub, "link", "set", "br0", "up")]
        for i, host in enumerate(names[1:]):
            steps += [
                ("link", "add", "e0", "netns", net.ns[host], "mtu", str(MTU), "type", "veth",
                 "peer", "name", f"p{i}", "netns", hub, "mtu", str(MTU)),
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
              "--join-timeout", str(GUARD_S / 2), "--no-progress", "-q"]
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


def simulated_round_s(run_dir: Path, *, m: int, delta: int, dim: int, seed: int,
                      bandwidth: str) -> list[float]:
    """The fast path's per-round times on the live run's own schedule (``RUN/delays.csv``) with
    the communication model ``bandwidth`` at ``dim`` values: what :func:`simulate_cli`
    averages."""
    from aiogc.config import RunConfig, parse_bandwidth
    from aiogc.sim.fast import simulate_fast
    from aiogc.training.schedule import DelaySchedule

    sched = DelaySchedule.from_csv(run_dir / "delays.csv")
    cfg = RunConfig(workers=m, delta=delta, rounds=sched.rounds, seed=seed)
    res = simulate_fast(cfg, ["partial"], schedule=sched, comm=parse_bandwidth(bandwidth),
                        dim=dim, mse=False)
    return [float(x) for x in res["partial"].completion_s]


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


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def measure(m: int, *, hosts: int, delta: int = 3, dim: int = 250_000, rounds: int = 12,
            rate: str = "25MB/s", delay: str = "exp:0.02", seed: int = 1,
            workdir: Path) -> dict[str, Any]:
    """One kernel-shaped live run at ``m`` workers on ``hosts`` worker hosts, and its replay.

    Returns
    -------
    dict
        ``live_mean_s``; ``sim_mean_s`` (simulator at the goodput rate) and ``ratio``
        (live / it); ``sim_nominal_mean_s`` and ``ratio_nominal`` (at the tc rate itself);
        ``upload_share`` (the simulated round's ingress-busy share, how upload-bound it is);
        ``qdisc`` (the token bucket's counters: bytes, packets, drops, overlimits);
        ``per_round`` (live, sim) pairs; the sizes.
    """
    rate_Bps = parse_rate(rate)
    good = goodput_rate(rate_Bps)
    out = workdir / f"kernel_m{m}"
    with network(hosts) as net:
        net.shape(rate_Bps)
        live_run(net, out, m=m, delta=delta, dim=dim, rounds=rounds, delay=delay, seed=seed)
        qd = net.qdisc_stats()
    live = live_round_s(out)
    kw: dict[str, Any] = {"m": m, "delta": delta, "dim": dim, "seed": seed}
    sim = simulated_round_s(out, bandwidth=f"ps={good:.0f}B/s", **kw)
    nominal = simulated_round_s(out, bandwidth=f"ps={rate_Bps:.0f}B/s", **kw)
    free = simulated_round_s(out, bandwidth="ps=1000GB/s", **kw)
    cli = simulate_cli(out, rounds=len(sim), bandwidth=f"ps={good:.0f}B/s", **kw)
    if abs(cli - _mean(sim)) > 1e-9 * max(1.0, cli):
        raise RuntimeError(f"aiogc simulate's mean {cli} differs from the replay's {_mean(sim)}")
    if len(live) != len(sim):
        raise RuntimeError(f"{len(live)} live exact rounds against {len(sim)} in the schedule")
    n = len(live)
    lm, sm, nm = _mean(live), _mean(sim), _mean(nominal)
    return {"m": m, "hosts": hosts, "delta": delta, "dim": dim, "rounds": rounds,
            "rounds_compared": n, "rate": rate, "goodput_Bps": good, "delay": delay,
            "live_mean_s": lm, "sim_mean_s": sm, "ratio": lm / sm,
            "sim_nominal_mean_s": nm, "ratio_nominal": lm / nm,
            "upload_share": 1.0 - _mean(free[:n]) / sm,
            "burst_bound_s": BURST / rate_Bps, "qdisc": qd,
            "per_round": [[round(a, 5), round(b, 5)] for a, b in zip(live[:n], sim[:n],
                                                                      strict=True)]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--hosts", type=int, default=4, help="worker hosts (divides every m)")
    ap.add_argument("--delta", type=int, default=3)
    ap.add_argument("--dim", type=int, default=250_000)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--rate", default="25MB/s")
    ap.add_argument("--delay", default="exp:0.02")
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
