"""The benchmark suite's smoke mode: every record present, in the agreed schema.

Runs ``bench/run.py --smoke`` as a subprocess (tiny sizes: a few seconds of real runs, sockets
on loopback port 0) and checks the JSON it writes. It never asserts on the measured numbers:
those depend on the machine, and the smoke sizes are not the goals' configurations.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "bench" / "run.py"

NAMES = {
    "round_vs_sim_m64", "speedup_vs_sim_m64", "round_vs_sim_m256",
    "round_vs_sim_m64_processes", "core_us_per_worker_round", "ready_s_m1024",
    "report_p99_ms_1024_workers", "wire_payload_vs_raw_socket", "bulk_round_vs_raw",
    "decode_vs_gemv", "simulate_m100_seconds", "ps_peak_rss_mb_m64_d1e6",
    "wire_payload_vs_raw_socket_auth", "frames_per_worker_round", "wire_auth_vs_gmac_bound",
    "round_vs_sim_m64_worker_hosts", "report_p99_ms_1024_worker_hosts",
    "floor_round_vs_sim_m64", "floor_round_vs_sim_m256", "loop_cpu_vs_floor_m64",
    "floor_mux_round_vs_sim_m64", "floor_mux_round_vs_sim_m256", "loop_cpu_vs_floor_per_conn_m64",
    "loop_cpu_vs_work_floor_m64",
    "round_vs_sim_m256_auto", "speedup_vs_sim_m256_auto", "round_vs_sim_m1024_auto",
    "fidelity_flag_agrees", "coded_bytes_f16_vs_f32", "locate_round_vs_honest_m64",
    "kernel_shaped_live_vs_sim",
}
KEYS = {"name", "value", "unit", "baseline", "baseline_value", "ratio", "goal", "holds",
        "trials", "note", "detail"}


def _number_or_null(x: object) -> bool:
    return x is None or (isinstance(x, int | float) and not isinstance(x, bool)
                         and math.isfinite(x))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "smoke.json"
    proc = subprocess.run([sys.executable, str(RUN), "--smoke", "--silent", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # strict JSON: no NaN / Infinity tokens
    data: dict[str, Any] = json.loads(out.read_text(),
                                      parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    return data


def test_every_record_present_once(smoke: dict[str, Any]) -> None:
    names = [r["name"] for r in smoke["records"]]
    assert sorted(names) == sorted(NAMES)
    assert smoke["mode"] == "smoke"


def test_record_schema(smoke: dict[str, Any]) -> None:
    for r in smoke["records"]:
        assert set(r) == KEYS, r["name"]
        assert isinstance(r["unit"], str) and r["unit"]
        assert isinstance(r["baseline"], str) and r["baseline"]
        for k in ("value", "baseline_value", "ratio"):
            assert _number_or_null(r[k]), (r["name"], k, r[k])
        on, op, target = r["goal"].split()
        assert on in ("value", "ratio") and op in ("<=", "<", ">=", ">")
        # a number, or relative to a floor record of the same run ("floor64+0.08")
        if target.startswith("floor"):
            base, _, extra = target.partition("+")
            assert base in ("floor64", "floor256"), target
            float(extra or 0)
        else:
            float(target)
        assert isinstance(r["holds"], bool)
        assert isinstance(r["trials"], int) and r["trials"] >= 0
        assert isinstance(r["note"], str) and isinstance(r["detail"], dict)
        # nothing silent: a record that does not hold says why
        if not r["holds"]:
            assert r["note"], r["name"]
        if r["value"] is None:
            assert r["holds"] is False and r["note"], r["name"]


def test_live_table_mode(tmp_path: Path) -> None:
    """``--table`` (the live-vs-sim table) at a tiny size: one row per m, in markdown."""
    out = tmp_path / "table.json"
    proc = subprocess.run([sys.executable, str(RUN), "--table", "--table-m", "4",
                           "--table-processes", "--table-rounds", "2", "--silent",
                           "--json", str(out)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tab = json.loads(out.read_text())
    assert [(r["m"], r["mode"]) for r in tab["rows"]] == [(4, "coroutines")]
    assert "| m | partial live round ÷ simulated |" in proc.stdout
    assert "\n| 4 |" in proc.stdout


def test_record_helpers() -> None:
    from importlib import util

    spec = util.spec_from_file_location("bench_run", RUN)
    assert spec is not None and spec.loader is not None
    mod = util.module_from_spec(spec)
    sys.modules["bench_run"] = mod  # dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules["bench_run"]
    recs = [mod.record("decode_vs_gemv", 2.0, baseline="b", baseline_value=1.0, trials=5),
            mod.failed("ready_s_m1024", "b", "no run")]
    assert recs[0]["ratio"] == 2.0 and recs[0]["holds"] is False
    assert recs[1]["value"] is None and recs[1]["holds"] is False
    assert "not measured: no run" in recs[1]["note"]
    text = mod.format_table(recs)
    assert "decode_vs_gemv" in text and "ready_s_m1024" in text and "NO" in text
    assert mod.json_safe({"a": float("nan"), "b": (1, float("inf"))}) == {"a": None,
                                                                          "b": [1, None]}
