"""A multi-host run without a cluster: `aiogc ps` and `aiogc worker` on three "hosts" made of
Linux network namespaces, compared bit for bit with the same run on loopback.

Topology (created and removed by the test; nothing is routed outside it):

    ns "ps"  198.18.0.1/24 --veth--+
    ns "w1"  198.18.0.2/24 --veth--+-- bridge in ns "hub"
    ns "w2"  198.18.0.3/24 --veth--+

198.18.0.0/15 is the range reserved for benchmarking network devices (RFC 2544), so the
addresses cannot collide with a real network. The PS binds 198.18.0.1 with a secret; workers
0-1 run in "w1", 2-3 in "w2".

Skips, with the reason, where namespaces cannot be made (not Linux, not root, no `ip`, or
`ip netns add` refused) -- unless AIOGC_REQUIRE_NETNS=1 (set by .ci/run, which runs as root),
where that is a failure.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aiogc.config import RunConfig
from aiogc.harness.local import run_live
from aiogc.harness.options import RunOptions
from tests.helpers import StreamWatcher, pinned_trigger_schedule, wait_pids_exit

pytestmark = [pytest.mark.processes, pytest.mark.slow]

#: Hang guard only (no assertion on durations): every wait below is bounded by it.
GUARD_S = 120
M, K, ROUNDS = 4, 2, 3
PS_ADDR = "198.18.0.1"
HOSTS = {"ps": "198.18.0.1", "w1": "198.18.0.2", "w2": "198.18.0.3"}
WORKER_HOST = {0: "w1", 1: "w1", 2: "w2", 3: "w2"}
#: Columns of rounds.csv that do not depend on timing (decisions and numerics only).
DECISION_COLUMNS = ("round", "scheme", "status", "attempts", "state", "coverage_min", "residual",
                    "amplification", "rel_error", "rel_error_plain", "loss")


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30,
                          check=False)


def _ns_pids(names: Iterable[str]) -> set[int]:
    out: set[int] = set()
    for name in names:
        out |= {int(x) for x in _ip("netns", "pids", name).stdout.split()}
    return out


def _unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    return None


@dataclass
class Hosts:
    """Names of the namespaces making up the test network."""

    ns: dict[str, str]

    def exec_prefix(self, host: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns[host]]

    def tx_bytes(self, host: str) -> int:
        out = _ip("-n", self.ns[host], "-j", "-s", "link", "show", "e0")
        return int(json.loads(out.stdout)[0]["stats64"]["tx"]["bytes"])

    def pids(self) -> set[int]:
        """Every process in the test's namespaces (only ones this test started)."""
        return _ns_pids(self.ns.values())


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    reason = _unavailable()
    required = os.environ.get("AIOGC_REQUIRE_NETNS") == "1"
    if reason is not None:
        if required:
            pytest.fail(f"AIOGC_REQUIRE_NETNS=1 but {reason}")
        pytest.skip(reason)
    tag = f"aiogc{os.getpid()}{secrets.token_hex(2)}"
    ns = {name: f"{tag}{name}" for name in ("hub", *HOSTS)}
    made: list[str] = []
    try:
        for name in ns.values():
            r = _ip("netns", "add", name)
            if r.returncode != 0:
                msg = f"`ip netns add` refused: {r.stderr.strip()}"
                if required:
                    pytest.fail(msg)
                pytest.skip(msg)
            made.append(name)
        hub = ns["hub"]
        steps = [
            ("-n", hub, "link", "add", "br0", "type", "bridge"),
            ("-n", hub, "link", "set", "br0", "up"),
        ]
        for i, (host, addr) in enumerate(HOSTS.items()):
            steps += [
                # both ends are created inside their namespaces: no name in the root namespace
                ("link", "add", "e0", "netns", ns[host], "type", "veth", "peer", "name", f"p{i}",
                 "netns", hub),
                ("-n", hub, "link", "set", f"p{i}", "master", "br0"),
                ("-n", hub, "link", "set", f"p{i}", "up"),
                ("-n", ns[host], "addr", "add", f"{addr}/24", "dev", "e0"),
                ("-n", ns[host], "link", "set", "e0", "up"),
                ("-n", ns[host], "link", "set", "lo", "up"),
            ]
        for step in steps:
            r = _ip(*step)
            assert r.returncode == 0, (step, r.stderr)
        yield Hosts(ns)
    finally:
        # a failed test may leave a process it started in a namespace: end it by its id
        for pid in _ns_pids(made):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for name in made:
            _ip("netns", "del", name)  # removes its interfaces; a veth's peer goes with it
        left = _ip("netns", "list").stdout
        assert not any(name in left for name in made), left


def run_remote(tmp: Path, out: Path, *, bind: str, hosts: Hosts | None) -> tuple[str, str]:
    """`aiogc ps` bound to ``bind`` and four `aiogc worker` processes (in their namespaces
    when ``hosts`` is given); returns the PS's stdout and stderr."""
    secret = tmp / "secret"
    if not secret.exists():
        secret.write_bytes(secrets.token_hex(32).encode())
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("AIOGC_SECRET", None)

    def prefix(host: str) -> list[str]:
        return hosts.exec_prefix(host) if hosts is not None else []

    ps_cmd = [*prefix("ps"), sys.executable, "-m", "aiogc", "ps", "--host", bind, "--port", "0",
              "--workers", str(M), "--delta", str(K), "--rounds", str(ROUNDS), "--seed", "3",
              "--delay", f"replay:{tmp / 'delays.csv'}", "--task", "linreg:samples=120,dim=6",
              "--secret-file", str(secret), "--out", str(out), "--verify", "--loop", "asyncio",
              "--epoch", "1", "--join-timeout", str(GUARD_S / 2)]
    ps = subprocess.Popen(ps_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env)
    workers: list[subprocess.Popen[str]] = []
    try:
        assert ps.stderr is not None
        line = ps.stderr.readline()  # "aiogc ps listening on HOST:PORT (epoch N)"; EOF if it died
        match = re.search(r"listening on ([\d.]+):(\d+)", line)
        assert match, line + ps.stderr.read()
        assert match.group(1) == bind
        addr = f"{bind}:{match.group(2)}"
        for j in range(M):
            cmd = [*prefix(WORKER_HOST[j]), sys.executable, "-m", "aiogc", "worker", "--connect",
                   addr, "--id", str(j), "--secret-file", str(secret), "--loop", "asyncio",
                   "--give-up-after", str(GUARD_S / 2)]
            workers.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            text=True, env=env))
        ps_out, ps_err = ps.communicate(timeout=GUARD_S)
        results = [w.communicate(timeout=GUARD_S) for w in workers]
    finally:
        for p in [ps, *workers]:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=GUARD_S)
    assert ps.returncode == 0, line + ps_err
    for j, (w, (_, err)) in enumerate(zip(workers, results, strict=True)):
        assert w.returncode == 0, (j, err)
    return ps_out, ps_err


def decision_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "rounds.csv").open() as fh:
        return [{c: row[c] for c in DECISION_COLUMNS} for row in csv.DictReader(fh)]


def test_three_namespace_hosts_equal_loopback_bit_for_bit(hosts: Hosts, tmp_path: Path) -> None:
    pinned_trigger_schedule(RunConfig(workers=M, delta=K, rounds=ROUNDS, seed=3)).to_csv(
        tmp_path / "delays.csv")
    tx_before = {h: hosts.tx_bytes(h) for h in HOSTS}
    run_remote(tmp_path, tmp_path / "netns", bind=PS_ADDR, hosts=hosts)
    tx_after = {h: hosts.tx_bytes(h) for h in HOSTS}
    run_remote(tmp_path, tmp_path / "loopback", bind="127.0.0.1", hosts=None)

    # the frames really crossed the veths: each host sent at least its handshakes and vectors
    for h in HOSTS:
        assert tx_after[h] - tx_before[h] > 1000, (h, tx_before, tx_after)
    netns = json.loads((tmp_path / "netns" / "summary.json").read_text())
    loop = json.loads((tmp_path / "loopback" / "summary.json").read_text())
    s = netns["schemes"]["partial"]
    assert s["rounds"] == ROUNDS and s["rounds_failed"] == 0
    assert s["max_rel_decode_error"] <= 1e-9
    assert s["final_loss"] == loop["schemes"]["partial"]["final_loss"]  # bit for bit
    rows = decision_rows(tmp_path / "netns")
    assert len(rows) == ROUNDS
    assert rows == decision_rows(tmp_path / "loopback")  # floats in repr form: bit for bit


# ------------------------------------------------------------------ a Ray cluster of three nodes


#: Tries at Ray's own start-up on one host (its internal deadlines can trip under load, which
#: says nothing about aiogc).
RAY_START_TRIES = 3


def _start_ray_node(hosts: Hosts, host: str, cmd: list[str],
                    env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`ray start --block` in ``host``'s namespace, retried when Ray's own start-up fails: a
    failed try's processes in that namespace are killed by id before the next."""
    text = ""
    for _ in range(RAY_START_TRIES):
        proc = subprocess.Popen([*hosts.exec_prefix(host), *cmd], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env)
        assert proc.stdout is not None
        watcher = StreamWatcher(proc.stdout)
        if watcher.wait_for("Ray runtime started", GUARD_S):
            return proc
        text = watcher.text
        proc.kill()
        proc.wait(timeout=GUARD_S)
        for pid in _ns_pids([hosts.ns[host]]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_pids_exit(_ns_pids([hosts.ns[host]]), timeout_s=GUARD_S / 2)
    pytest.fail(f"Ray did not start on {host} in {RAY_START_TRIES} tries: {text[-3000:]}")


def test_ray_backend_on_a_three_node_cluster_of_namespace_hosts(hosts: Hosts,
                                                                tmp_path: Path) -> None:
    """`ray start --head` in "ps", `ray start --address` in "w1" and "w2" (2 CPUs each), then
    `aiogc run --backend ray --address 198.18.0.1:6379` from "ps": the actors spread over the
    nodes, the PS binds its node's address, workers on other nodes reach it across the bridge,
    and the decisions equal a local run bit for bit."""
    if importlib.util.find_spec("ray") is None:
        if os.environ.get("AIOGC_REQUIRE_RAY") == "1":
            pytest.fail("AIOGC_REQUIRE_RAY=1 but ray is not installed")
        pytest.skip("the ray extra is not installed (pip install -e '.[ray]')")
    ray_bin = str(Path(sys.executable).with_name("ray"))
    pinned_trigger_schedule(RunConfig(workers=M, delta=K, rounds=ROUNDS, seed=3)).to_csv(
        tmp_path / "delays.csv")
    # Ray's own token authentication, with a token made for this test (not ~/.ray's); the
    # session directory is short because Ray's Unix socket paths must fit in 107 bytes
    temp = tempfile.mkdtemp(prefix="aiogcr")
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    # port 6379 is inside the test's own namespace: nothing else can hold it
    gcs = f"{PS_ADDR}:6379"
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        for host, addr in HOSTS.items():
            join = (["--head", "--port", "6379", "--include-dashboard", "false",
                     "--temp-dir", temp] if host == "ps" else ["--address", gcs])
            nodes.append(_start_ray_node(
                hosts, host, [ray_bin, "start", *join, "--node-ip-address", addr,
                              "--num-cpus", "2", "--block"], env))
        out = tmp_path / "ray"
        driver = subprocess.run(
            [*hosts.exec_prefix("ps"), sys.executable, "-m", "aiogc", "run", "--backend", "ray",
             "--address", gcs, "--workers", str(M), "--delta", str(K), "--rounds", str(ROUNDS),
             "--schemes", "partial", "--seed", "3", "--delay", f"replay:{tmp_path / 'delays.csv'}",
             "--task", "linreg:samples=120,dim=6", "--out", str(out), "--no-plots",
             "--no-progress"],
            capture_output=True, text=True, env=env, timeout=GUARD_S * 2)
        assert driver.returncode == 0, driver.stderr[-3000:]
    finally:
        for proc in nodes:  # `ray start --block` stops its node's processes on SIGTERM
            proc.terminate()
        for proc in nodes:
            try:
                proc.wait(timeout=GUARD_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=GUARD_S)
        wait_pids_exit(hosts.pids(), timeout_s=GUARD_S / 2)
        left = hosts.pids()
        shutil.rmtree(temp, ignore_errors=True)
    assert not left, f"processes left in the namespaces: {sorted(left)}"

    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(n["node_ip"] for n in manifest["cluster"]["nodes"]) == sorted(HOSTS.values())
    assert manifest["cluster"]["cpus_per_actor"] == 1.0  # 5 actors on 3 nodes of 2 CPUs
    with (out / "nodes.csv").open() as fh:
        placed = list(csv.DictReader(fh))
    ps_row = next(r for r in placed if r["role"] == "ps")
    # the PS binds the address of whichever node Ray put it on
    assert ps_row["address"].rsplit(":", 1)[0] == ps_row["node_ip"] in HOSTS.values()
    ips = {r["node_ip"] for r in placed}
    assert ips <= set(HOSTS.values()) and len(ips) >= 2, placed  # spread over nodes
    assert any(r["node_ip"] != ps_row["node_ip"] for r in placed if r["role"] == "worker")

    local = run_live(RunConfig(workers=M, delta=K, rounds=ROUNDS, seed=3,
                               task="linreg:samples=120,dim=6",
                               delay=f"replay:{tmp_path / 'delays.csv'}"),
                     ["partial"], RunOptions(mode="coroutines", out_dir=tmp_path / "local",
                     plots=False, loop="asyncio"))
    assert local.summary["schemes"]["partial"]["rounds_failed"] == 0
    assert decision_rows(out) == decision_rows(tmp_path / "local")  # bit for bit


# ------------------------------------------------------------------ a worker node dies mid-run

#: Ray's GCS declares a node dead after this many missed health checks this far apart (the
#: defaults, 5 x 3 s, only make the test slower: a killed node refuses connections at once).
RAY_FAST_HEALTH = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3",
                   "RAY_health_check_timeout_ms": "1000"}
#: The node-loss runs: m=4 workers with delta=3, so that the 2 workers a killed node may hold
#: are a tolerated loss (with delta=2 losing both ends the round in flight as WORKERS_GONE),
#: and enough rounds of CHUNK_S per chunk that the run outlasts the node's recovery (measured:
#: the lost workers were back ~4 s after the kill, ~20 s under two CPU hogs beside the test on
#: 2 cores, while 300 rounds last ~50 s, ~100 s under the hogs; the heal test runs 600).
NODE_M, NODE_DELTA, CHUNK_S = 4, 3, 0.15
#: The node is killed once this many rounds are on disk.
KILL_AFTER = 3


def _need_ray() -> str:
    if importlib.util.find_spec("ray") is None:
        if os.environ.get("AIOGC_REQUIRE_RAY") == "1":
            pytest.fail("AIOGC_REQUIRE_RAY=1 but ray is not installed")
        pytest.skip("the ray extra is not installed (pip install -e '.[ray]')")
    return str(Path(sys.executable).with_name("ray"))


def _rounds_on_disk(path: Path) -> int:
    if not path.exists():
        return 0
    with path.open() as fh:
        return sum(1 for _ in csv.DictReader(fh))


def _wait_rounds(path: Path, n: int, driver: subprocess.Popen[str]) -> None:
    """Poll ``rounds.csv`` until ``n`` rounds are written (the driver flushes each round)."""
    deadline = time.monotonic() + GUARD_S
    while _rounds_on_disk(path) < n:
        assert driver.poll() is None, f"the run ended (rc {driver.returncode}) before round {n}"
        assert time.monotonic() < deadline, f"round {n} not recorded within {GUARD_S} s"
        time.sleep(0.1)  # a poll interval, not a synchronisation: the loop re-checks the file


@dataclass
class RayCluster:
    """`ray start --block` nodes in the test's namespaces."""

    hosts: Hosts
    ray_bin: str
    env: dict[str, str]
    temp: str
    cpus: dict[str, int]
    nodes: dict[str, subprocess.Popen[bytes]]

    def start(self, host: str) -> None:
        join = (["--head", "--port", "6379", "--include-dashboard", "false",
                 "--temp-dir", self.temp] if host == "ps" else ["--address", f"{PS_ADDR}:6379"])
        self.nodes[host] = _start_ray_node(
            self.hosts, host, [self.ray_bin, "start", *join, "--node-ip-address", HOSTS[host],
                               "--num-cpus", str(self.cpus[host]), "--block"], self.env)

    def kill(self, host: str) -> None:
        """SIGKILL every process in ``host``'s namespace: the node dies with its actors."""
        pids = _ns_pids([self.hosts.ns[host]])
        assert pids, host
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_pids_exit(pids, timeout_s=GUARD_S / 2)
        self.nodes.pop(host).wait(timeout=GUARD_S)

    def stop(self) -> None:
        for proc in self.nodes.values():  # `ray start --block` stops its node on SIGTERM
            proc.terminate()
        for proc in self.nodes.values():
            try:
                proc.wait(timeout=GUARD_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=GUARD_S)
        wait_pids_exit(self.hosts.pids(), timeout_s=GUARD_S / 2)
        shutil.rmtree(self.temp, ignore_errors=True)


@contextlib.contextmanager
def _ray_cluster(hosts: Hosts, cpus: dict[str, int]) -> Iterator[RayCluster]:
    ray_bin = _need_ray()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "PYTHONUNBUFFERED": "1", **RAY_FAST_HEALTH}
    env.pop("RAY_ADDRESS", None)
    cluster = RayCluster(hosts, ray_bin, env, tempfile.mkdtemp(prefix="aiogcr"), cpus, {})
    try:
        for host in HOSTS:
            cluster.start(host)
        yield cluster
    finally:
        cluster.stop()
    left = hosts.pids()
    assert not left, f"processes left in the namespaces: {sorted(left)}"


def _node_loss_run(cluster: RayCluster, out: Path, rounds: int, *,
                   allow_shrink: bool) -> tuple[subprocess.CompletedProcess[str], str]:
    """`aiogc run --backend ray` from "ps"; once round KILL_AFTER is on disk, kill the worker
    node that does not hold the PS (w2 unless Ray put the PS there). Returns the finished
    driver and the killed host."""
    cmd = [*cluster.hosts.exec_prefix("ps"), sys.executable, "-m", "aiogc", "run",
           "--backend", "ray", "--address", f"{PS_ADDR}:6379", "--workers", str(NODE_M),
           "--delta", str(NODE_DELTA), "--rounds", str(rounds), "--schemes", "partial",
           "--seed", "3", "--delay", f"const:{CHUNK_S}", "--task", "linreg:samples=120,dim=6",
           "--round-timeout", str(GUARD_S), "--join-timeout", str(GUARD_S), "--out", str(out),
           "--no-plots", "--no-progress", *(["--allow-shrink"] if allow_shrink else [])]
    driver = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=cluster.env)
    try:
        assert driver.stderr is not None and driver.stdout is not None
        err = StreamWatcher(driver.stderr)
        out_text = StreamWatcher(driver.stdout)
        assert err.wait_for("PS listening on", GUARD_S), err.text[-3000:]
        match = re.search(r"PS listening on [\d.]+:\d+ \(node ([\d.]+)\)", err.text)
        assert match, err.text[-3000:]
        victim = "w1" if match.group(1) == HOSTS["w2"] else "w2"
        _wait_rounds(out / "rounds.csv", KILL_AFTER, driver)
        cluster.kill(victim)
        driver.wait(timeout=GUARD_S * 8)  # hang guard only: 600 rounds under load
        err.wait_eof(GUARD_S)
        out_text.wait_eof(GUARD_S)
        return subprocess.CompletedProcess(cmd, driver.returncode, out_text.text, err.text), victim
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=GUARD_S)


def _placements(out: Path) -> list[dict[str, str]]:
    with (out / "nodes.csv").open() as fh:
        return list(csv.DictReader(fh))


def test_killed_worker_node_workers_come_back(hosts: Hosts, tmp_path: Path) -> None:
    """A Ray head in "ps" with 4 CPUs, worker nodes in "w1" and "w2" with 2 CPUs each (5
    actors of 1 CPU, spread). Once round KILL_AFTER is recorded, every process of the worker
    node not holding the PS is SIGKILLed: the node dies with its actors (one or two workers).
    Ray marks the node dead, reschedules the placement group's lost bundles onto the spare CPUs
    of the surviving nodes (the head alone has room for two), restarts the actors there
    (max_restarts) and resubmits their ``run`` (max_task_retries=-1); they register as
    incarnation 2, rejoin the PS and contribute again. The spare capacity is there before the
    kill, rather than a fresh `ray start` in the dead node's namespace afterwards, so that the
    recovery does not wait on a Ray node's start-up (seconds to tens of seconds under load),
    only on Ray noticing the death (RAY_FAST_HEALTH) and starting an actor process: the run's
    rounds outlast that by an order of magnitude. With delta=3 the two workers a node may hold
    are a tolerated loss, so no round fails; the rounds run while they are gone have fewer than
    m workers: --allow-shrink accepts that (exit 0), the summary still counts them."""
    # 600 rounds (~100 s quiet): 6-12x the slowest recovery measured (round 78 under load)
    rounds = 600
    out = tmp_path / "run"
    with _ray_cluster(hosts, {"ps": 4, "w1": 2, "w2": 2}) as cluster:
        driver, victim = _node_loss_run(cluster, out, rounds, allow_shrink=True)
    assert driver.returncode == 0, driver.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    s = summary["schemes"]["partial"]
    assert s["rounds"] == rounds and s["rounds_failed"] == 0, s
    placed = _placements(out)
    lost = {int(r["worker"]) for r in placed if r["role"] == "worker"
            and r["incarnation"] == "1" and r["node_ip"] == HOSTS[victim]}
    assert lost, placed  # SPREAD puts a bundle on every node; the victim's is a worker's
    back = {int(r["worker"]) for r in placed if r["role"] == "worker" and r["incarnation"] == "2"}
    mem = summary["membership"]["partial"]
    assert lost <= back, ("the run ended before every lost worker came back", placed, mem)
    assert {w for _, w in mem["left"]} == lost, mem
    rejoined = {w: r for r, w in mem["rejoined"]}
    assert set(rejoined) == lost, mem
    with (out / "workers.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    for w in lost:  # after coming back, each one computes chunks the PS counts
        assert any(int(r["worker"]) == w and int(r["round"]) >= rejoined[w]
                   and int(r["chunks_done"]) > 0 for r in rows), w


def test_workers_lost_for_good_exit_non_zero(hosts: Hosts, tmp_path: Path) -> None:
    """As above but the node stays dead and the survivors have no spare CPU (5 actors of 1 CPU
    on 2 + 2 + 1 CPUs): its workers never come back. The rounds complete with fewer than m
    workers, so `aiogc run` (without --allow-shrink) exits 5 and says why."""
    rounds = 60  # the kill comes a second or so of rounds after round KILL_AFTER
    out = tmp_path / "run"
    with _ray_cluster(hosts, {"ps": 2, "w1": 2, "w2": 1}) as cluster:
        driver, victim = _node_loss_run(cluster, out, rounds, allow_shrink=False)
    assert driver.returncode == 5, driver.stderr[-3000:]
    assert "with fewer than m=4 workers" in driver.stderr, driver.stderr[-3000:]
    assert f"was lost with its node {HOSTS[victim]}" in driver.stderr, driver.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["shrunk"]["partial"] > 0, summary
    assert "fewer than m=4" in summary["end_reason"], summary["end_reason"]
    placed = _placements(out)
    lost = {int(r["worker"]) for r in placed if r["role"] == "worker"
            and r["node_ip"] == HOSTS[victim]}
    assert lost and {w for _, w in summary["membership"]["partial"]["left"]} == lost, placed
    assert not summary["membership"]["partial"]["rejoined"], summary["membership"]
