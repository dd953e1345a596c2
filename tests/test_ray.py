"""`aiogc run --backend ray` on a local Ray instance with 2 CPUs (the ray extra).

Skipped, with the reason, when Ray is not installed -- unless AIOGC_REQUIRE_RAY=1 (set by
.ci/run), where a missing Ray fails the test instead.
"""

from __future__ import annotations

import csv
import ipaddress
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from aiogc.cli import main
from aiogc.config import RunConfig
from aiogc.core import RoundRecord
from aiogc.harness.kit import materialise_for
from aiogc.harness.loaders import load_run
from aiogc.protocol.auth import derive_worker_key
from aiogc.sim.fast import simulate_fast
from tests.helpers import pinned_trigger_schedule

if os.environ.get("AIOGC_REQUIRE_RAY") == "1":
    import ray
else:
    ray = pytest.importorskip("ray", reason="the ray extra is not installed "
                                            "(pip install -e '.[ray]')")

from aiogc.harness.options import RayOptions, RunOptions
from aiogc.harness.ray_actors import ClusterError
from aiogc.harness.ray_backend import NODE_COLUMNS, RaySchemeRun, run_ray

pytestmark = [pytest.mark.processes, pytest.mark.slow]

RECORD_FILES = ["manifest.json", "delays.csv", "events.jsonl", "rounds.csv", "workers.csv",
                "reports.csv", "summary.json", "trace.json", "nodes.csv"]
#: Columns of rounds.csv that do not depend on timing (decisions and numerics only).
DECISION_COLUMNS = ("round", "scheme", "status", "attempts", "state", "coverage_min", "residual",
                    "amplification", "rel_error", "rel_error_plain", "loss")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Path]:
    """A local Ray instance with 2 CPUs for this module (yields its session directory, where
    its logs are); always shut down."""
    ctx = ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=True)
    try:
        yield Path(cast(Any, ctx).address_info["session_dir"])
    finally:
        ray.shutdown()
    assert not ray.is_initialized()


def decision_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "rounds.csv").open() as fh:
        return [{c: row[c] for c in DECISION_COLUMNS} for row in csv.DictReader(fh)]


def final_counts(reports: list[dict[str, Any]]) -> dict[tuple[int, int], int]:
    """(round, worker) -> the highest chunk count it reported; each worker's counts rise."""
    out: dict[tuple[int, int], int] = {}
    for row in reports:
        key = (int(row["round"]), int(row["worker"]))
        assert int(row["count"]) > out.get(key, 0), row  # strictly increasing per round
        out[key] = int(row["count"])
    return out


def frame_kinds(run_dir: Path) -> set[str]:
    with (run_dir / "events.jsonl").open() as fh:
        return {json.loads(line)["kind"] for line in fh}


def read_nodes(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "nodes.csv").open() as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) == NODE_COLUMNS
        return list(reader)


def test_cli_ray_backend_matches_local_run(local_ray: Path, tmp_path: Path) -> None:
    """4 workers x 3 rounds of partial through `aiogc run --backend ray`: the same record files
    as a local run (plus nodes.csv), the same summary keys, and -- on a schedule whose
    decisions do not depend on timing -- the same state vectors, losses and errors bit for bit."""
    m, k, rounds = 4, 2, 3
    delays = tmp_path / "delays_in.csv"
    pinned_trigger_schedule(RunConfig(workers=m, delta=k, rounds=rounds, seed=3)).to_csv(delays)
    common = ["--workers", str(m), "--delta", str(k), "--rounds", str(rounds),
              "--schemes", "partial", "--delay", f"replay:{delays}", "--seed", "3",
              "--task", "linreg:samples=120,dim=6", "--no-plots", "--no-progress"]
    out = tmp_path / "ray"
    assert main(["run", "--backend", "ray", "--out", str(out), *common]) == 0
    local = tmp_path / "local"
    assert main(["run", "--as", "coroutines", "--out", str(local), *common]) == 0

    for name in RECORD_FILES:
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    local_summary = json.loads((local / "summary.json").read_text())
    assert summary.keys() == local_summary.keys()
    s, ls = summary["schemes"]["partial"], local_summary["schemes"]["partial"]
    assert s.keys() == ls.keys()
    assert s["rounds"] == rounds and s["rounds_failed"] == 0
    assert s["max_rel_decode_error"] <= 1e-9
    assert s["final_loss"] == ls["final_loss"]  # bit for bit
    assert decision_rows(out) == decision_rows(local)

    run, local_run = load_run(out), load_run(local)
    assert len(run["rounds"]) == rounds and len(run["workers"]) == rounds * m
    # the same reports, up to coalescing: a worker woken late reports two finished chunks in
    # one frame, so the *number* of reports depends on timing; the count each worker reached
    # in each round does not (the pinned schedule fixes it), nor does the order of its counts
    assert final_counts(run["reports"]) == final_counts(local_run["reports"])
    assert len(run["reports"]) <= sum(sum(r["state"]) for r in run["rounds"])
    kinds = frame_kinds(out)
    heartbeats = {"ping", "pong"}  # sent after a silence, so they depend on timing
    assert kinds - heartbeats == frame_kinds(local) - heartbeats  # the same protocol
    assert {"challenge", "hello", "welcome", "ready", "round_start", "encode_and_transmit",
            "coded_gradient", "shutdown"} <= kinds
    # the frames are on the PS's clock, as the round records are
    first = run["rounds"][0]
    with (out / "events.jsonl").open() as fh:
        t0 = min(json.loads(line)["t_ns"] for line in fh) / 1e9
    assert t0 <= first["start_s"]

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["mode"] == "ray"
    assert manifest["cluster"]["backend"] == "ray"
    assert manifest["cluster"]["cpus_per_actor"] == 0.4  # 2 CPUs, 5 actors
    assert "secret" not in json.dumps(manifest).lower()

    assert all_placement_groups_removed()
    nodes = read_nodes(out)
    ps_rows = [r for r in nodes if r["role"] == "ps"]
    assert len(ps_rows) == 1
    host = ps_rows[0]["address"].rsplit(":", 1)[0]
    assert not ipaddress.ip_address(host).is_loopback  # the PS bound a reachable address
    workers = sorted(int(r["worker"]) for r in nodes if r["role"] == "worker")
    assert workers == list(range(m))
    for r in nodes:
        assert r["node_id"] and r["node_ip"] and int(r["pid"]) > 0 and r["incarnation"] == "1"
        assert r["loop"] == "uvloop"  # --loop's default, which is also Ray's


def test_ray_backend_streams_chunks_like_a_local_run(local_ray: Path, tmp_path: Path) -> None:
    """stream-chunks through the Ray backend: its workers send chunk_gradient frames and no
    coded vector, and on a schedule whose end states do not depend on timing the rounds'
    decisions and numerics equal a local run's bit for bit."""
    m, k, rounds = 4, 2, 2
    delays = tmp_path / "delays_in.csv"
    pinned_trigger_schedule(RunConfig(workers=m, delta=k, rounds=rounds, seed=3,
                                      scheme="stream-chunks")).to_csv(delays)
    common = ["--workers", str(m), "--delta", str(k), "--rounds", str(rounds),
              "--schemes", "stream-chunks", "--delay", f"replay:{delays}", "--seed", "3",
              "--task", "linreg:samples=120,dim=6", "--no-plots", "--no-progress"]
    out, local = tmp_path / "ray", tmp_path / "local"
    assert main(["run", "--backend", "ray", "--out", str(out), *common]) == 0
    assert main(["run", "--as", "coroutines", "--out", str(local), *common]) == 0
    rows = decision_rows(out)
    assert [r["status"] for r in rows] == ["exact"] * rounds
    assert rows == decision_rows(local)
    kinds = frame_kinds(out)
    assert "chunk_gradient" in kinds
    assert not kinds & {"coded_gradient", "chunk_report", "encode_and_transmit"}
    assert all_placement_groups_removed()


def test_ray_backend_run_with_bandwidth_is_shaped(local_ray: Path, tmp_path: Path) -> None:
    """`aiogc run --backend ray --bandwidth worker=20KB/s,ps=20KB/s --time-scale 10`, 4 workers
    x 4 rounds of partial: the actors shape their links as a loopback run does. The run's own
    fidelity section replays its schedule through the fast path with the same links, and
    live / simulated must lie in the loopback test's bound, [0.97, 1.6) (test_shaping.py). The
    bound means something: the same schedule without the links simulates to under half the
    shaped time, so a run whose actors did not shape would land near 0.15. No wall time is
    asserted."""
    bw = "worker=20KB/s,ps=20KB/s"
    cfg = RunConfig(workers=4, delta=2, rounds=4, delay="exp:0.02", seed=1, task="linreg",
                    time_scale=10.0, bandwidth=bw)
    schedule = materialise_for(cfg, ["partial"])
    delays = tmp_path / "delays_in.csv"
    schedule.to_csv(delays)
    dim = 50  # linreg's default dimension: it sizes the frames
    free = simulate_fast(cfg, ["partial"], schedule=schedule, dim=dim)["partial"]
    shaped = simulate_fast(cfg, ["partial"], schedule=schedule, dim=dim,
                           comm=cfg.comm)["partial"]
    assert shaped.completion_s.mean() > 2.0 * free.completion_s.mean()
    out = tmp_path / "ray"
    assert main(["run", "--backend", "ray", "--out", str(out), "--workers", "4", "--delta", "2",
                 "--rounds", "4", "--schemes", "partial", "--delay", f"replay:{delays}",
                 "--seed", "1", "--task", "linreg", "--bandwidth", bw, "--time-scale", "10",
                 "--no-plots", "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    part = summary["fidelity"]["schemes"]["partial"]
    assert part["rounds_compared"] == 4
    assert part["sim_mean_s"] == pytest.approx(shaped.completion_s.mean(), rel=1e-9)
    assert 0.97 <= part["ratio"] < 1.6, part
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["mode"] == "ray" and manifest["config"]["bandwidth"] == bw
    assert all_placement_groups_removed()


def test_killed_worker_actor_is_restarted_and_rejoins(local_ray: Path, tmp_path: Path,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    """SIGKILL worker 0's process after round 0: Ray restarts the actor, its run is retried,
    the new process joins through the normal handshake and sends coded vectors again. The
    secret handed to the actors appears in no output, record or Ray log."""
    secret = f"aiogc-test-secret-{os.getpid()}-{id(tmp_path):x}".encode()
    # the test stops the PS once worker 0 is back: the rounds only bound a hang (at least
    # 0.03 s each, so 3 min); the actor's restart takes ~2 s idle, over 6 s on a loaded machine
    cfg = RunConfig(workers=4, delta=2, rounds=6000, seed=5, task="linreg:samples=120,dim=6",
                    delay="const:0.03")
    killed: list[int] = []
    rejoined: list[int] = []

    def on_round(rec: RoundRecord, run: RaySchemeRun) -> None:
        zero = [p for p in run.placements if p["role"] == "worker" and p["worker"] == 0]
        if not killed and rec.round == 0:
            pid = int(zero[0]["pid"])
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        elif killed and not rejoined and len(zero) == 2 and 0 in rec.arrivals:
            rejoined.append(rec.round)
            run.ps.stop.remote("test: worker 0 rejoined")  # no need for the other rounds

    res = run_ray(cfg, ["partial"], RunOptions(out_dir=tmp_path, plots=False, secret=secret,
                  loop="asyncio"), on_round=on_round)
    assert killed and rejoined, (killed, rejoined)
    recs = res.records["partial"]
    # every round before the test stopped the PS decoded exactly, with or without worker 0
    done = [r for r in recs if r.round <= rejoined[0]]
    assert [r.status for r in done] == ["exact"] * len(done)
    assert max(r.rel_error for r in done) <= 1e-9
    assert any(0 not in r.arrivals for r in done)  # the rounds worker 0 missed
    nodes = [r for r in read_nodes(tmp_path) if r["role"] == "worker" and r["worker"] == "0"]
    assert [r["incarnation"] for r in nodes] == ["1", "2"]
    assert {r["loop"] for r in read_nodes(tmp_path)} == {"asyncio"}  # restarted one too
    assert int(nodes[0]["pid"]) == killed[0] != int(nodes[1]["pid"])
    with (tmp_path / "events.jsonl").open() as fh:
        welcomes = [e for e in map(json.loads, fh)
                    if e["kind"] == "welcome" and e["worker"] == 0]
    # the first process's handshake, then the restarted one's (more than one if its first
    # session was closed before it was ready; it reconnects through the handshake again)
    assert len(welcomes) >= 2
    captured = capfd.readouterr()
    assert secret.decode() not in captured.out + captured.err
    assert _files_containing(tmp_path, secret) == []
    assert (local_ray / "logs").is_dir()
    assert _files_containing(local_ray / "logs", secret) == []
    for j in range(cfg.workers):  # nor does any worker's own key
        key = derive_worker_key(secret, j)
        assert _files_containing(tmp_path, key) == []
        assert _files_containing(local_ray / "logs", key) == []


def test_ps_that_cannot_bind_is_a_clear_error_and_nothing_is_left(local_ray: Path,
                                                                    tmp_path: Path) -> None:
    """The PS actor cannot bind an address this host does not have (TEST-NET-2): the run
    stops with the address in the message, and every placement group is removed."""
    cfg = RunConfig(workers=2, delta=1, rounds=1, seed=1, task="linreg:samples=40,dim=3",
                    scheme="uncoded", n_parts=1)
    with pytest.raises(ClusterError, match=r"198\.51\.100\.7"):
        run_ray(cfg, ["uncoded"], RunOptions(out_dir=tmp_path, plots=False),
                ray_options=RayOptions(bind="198.51.100.7"))
    assert all_placement_groups_removed()
    assert (tmp_path / "manifest.json").exists() and (tmp_path / "nodes.csv").exists()


def all_placement_groups_removed() -> bool:
    from ray.util.placement_group import placement_group_table

    return all(pg["state"] == "REMOVED" for pg in placement_group_table().values())


def _files_containing(root: Path, needle: bytes) -> list[Path]:
    return [f for f in root.rglob("*") if f.is_file() and needle in f.read_bytes()]
