"""Runner benchmark: worker start-up, protocol rounds and bulk rounds through ``run_live``.

Everything goes through the public :func:`aiogc.harness.local.run_live` with
``mode="processes"`` (and,
for the protocol round, also ``"coroutines"`` as a single-process reference), ``verify=False``,
``out_dir=None``, ``plots=False``. Times come from the PS's :class:`RoundRecord` (``t_start``,
``t_trigger``, ``t_end`` on the ``time.monotonic()`` clock of this process). The machine is
shared and noisy, so subjects and baselines are **interleaved trial by
trial** and medians are reported, with ratios against baselines measured in the same run.

1. start   time from calling ``run_live`` to round 0's ``t_start`` (all m workers started,
           connected, authenticated, configured and ready), rounds=1, delay none, small linreg
           task; forkserver vs spawn interleaved. A first (cold) forkserver run also starts the
           fork server itself; it is reported separately and left out of the medians.
2. protocol  m=64, d=10^3, delay none, scheme partial l=1: median round duration
           (t_end - t_start, round 0 skipped), uvloop vs the default asyncio loop.
3. bulk    d=10^6 float32, partial l=1 and uncoded, delay none: median round time, bytes per
           round (coded payloads up + model down), aggregate throughput, and its ratio to a raw
           blocking loopback socket (bench_wire.raw_trial, 4 MB frames) measured interleaved.
           Task: bench/bulk_task.py (cheap precomputed chunk gradients).

Round boundaries: round r+1 starts at the PS time round r ended (t_end = arrival of the last
needed coded vector); the PS's decode / model update then happen *inside* round r+1, so
consecutive durations add up to the wall time of the rounds.

    python bench/bench_runner.py                 # full (~10 min on 2 cores)
    python bench/bench_runner.py --quick --json /tmp/runner.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# Keep the module light: worker processes (forkserver and spawn) re-import the main script.
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

SMALL_TASK = "linreg:samples=640,dim=50"
#: rounds that did not end exact (excluded from the medians)
FAILURES: list[dict[str, Any]] = []


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover
        return None


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _one_run(cfg: Any, scheme: str, *, mode: str = "processes", loop: str = "uvloop",
             start_method: str = "forkserver") -> tuple[list[Any], float]:
    from aiogc.harness.local import run_live
    from aiogc.harness.options import RunOptions

    t0 = time.monotonic()
    res = run_live(cfg, [scheme], RunOptions(mode=mode, out_dir=None, verify=False, loop=loop,
                   start_method=start_method, plots=False))
    recs = res.records[scheme]
    if not recs:
        raise RuntimeError(f"no round completed ({scheme}, {mode}, {loop}, {start_method})")
    for r in recs:
        if r.status != "exact":  # kept out of the medians, reported
            FAILURES.append({"scheme": scheme, "workers": cfg.workers, "mode": mode,
                             "loop": loop, "round": r.round, "status": r.status,
                             "end_reason": r.end_reason, "duration_s": r.duration_s,
                             "dropped": {str(k): v for k, v in r.dropped.items()}})
    return recs, t0


def _exact(recs: list[Any]) -> list[Any]:
    """Rounds 1.. that ended exact (round 0 includes first-round effects)."""
    return [r for r in recs[1:] if r.status == "exact"]


# ------------------------------------------------------------------------ 1. start-up


def bench_start(m: int, trials: int, log: Any) -> dict[str, Any]:
    from aiogc.config import RunConfig

    cfg = RunConfig(scheme="partial", workers=m, rounds=1, delay="none", task=SMALL_TASK)
    methods = ["forkserver", "spawn"]
    # cold forkserver run: starts the fork server (once per parent process), preloading modules
    recs, t0 = _one_run(cfg, "partial", start_method="forkserver")
    cold = recs[0].t_start - t0
    log(f"  start: cold forkserver {cold:.2f} s")
    samples: dict[str, list[float]] = {k: [] for k in methods}
    for t in range(trials):
        order = methods if t % 2 == 0 else methods[::-1]  # alternate who goes first
        for sm in order:
            recs, t0 = _one_run(cfg, "partial", start_method=sm)
            samples[sm].append(recs[0].t_start - t0)
            log(f"  start trial {t}: {sm} {samples[sm][-1]:.2f} s")
    med = {k: _med(v) for k, v in samples.items()}
    return {
        "workers": m, "trials": trials, "task": SMALL_TASK, "cold_forkserver_s": cold,
        "samples_s": samples, "median_s": med,
        "per_worker_ms": {k: 1e3 * v / m for k, v in med.items()},
        "ratio_spawn_over_forkserver": med["spawn"] / med["forkserver"],
        "reference_s": {"forkserver": 0.52, "spawn": 4.46},
    }


# ------------------------------------------------------------------------ 2. protocol round


def bench_protocol(m: int, d: int, rounds: int, trials: int, task: str | None,
                   modes: list[str], log: Any) -> dict[str, Any]:
    import bulk_task

    from aiogc.config import RunConfig

    spec = task or bulk_task.spec(d)
    cfg = RunConfig(scheme="partial", workers=m, delta=3, n_parts=1, rounds=rounds,
                    delay="none", task=spec)
    subjects = [(mode, loop) for mode in modes for loop in ("uvloop", "asyncio")]
    durs: dict[str, list[float]] = {f"{a}/{b}": [] for a, b in subjects}
    trig: dict[str, list[float]] = {k: [] for k in durs}
    per_trial: dict[str, list[float]] = {k: [] for k in durs}
    for t in range(trials):
        order = subjects if t % 2 == 0 else subjects[::-1]
        for mode, loop in order:
            key = f"{mode}/{loop}"
            recs, _ = _one_run(cfg, "partial", mode=mode, loop=loop)
            xs = [r.duration_s for r in _exact(recs)]
            durs[key] += xs
            trig[key] += [r.t_trigger - r.t_start for r in _exact(recs)
                          if r.t_trigger is not None]
            per_trial[key].append(_med(xs))
            log(f"  protocol trial {t}: {key} median {1e3 * per_trial[key][-1]:.2f} ms")
    out: dict[str, Any] = {"workers": m, "d": d, "rounds": rounds, "trials": trials,
                           "task": spec, "subjects": {}}
    for key in durs:
        med = _med(durs[key])
        out["subjects"][key] = {
            "median_round_ms": 1e3 * med,
            "p90_round_ms": 1e3 * sorted(durs[key])[int(0.9 * (len(durs[key]) - 1))],
            "median_trigger_ms": 1e3 * _med(trig[key]),
            "per_trial_median_ms": [1e3 * x for x in per_trial[key]],
            "per_worker_us": 1e6 * med / m,
            "n_rounds": len(durs[key]),
        }
    for mode in modes:
        s = out["subjects"]
        out[f"ratio_asyncio_over_uvloop/{mode}"] = (
            s[f"{mode}/asyncio"]["median_round_ms"] / s[f"{mode}/uvloop"]["median_round_ms"])
    out["reference_ms"] = {"uvloop": 1.2, "asyncio": 1.5}
    return out


# ------------------------------------------------------------------------ 3. bulk round


def bench_bulk(ms: list[int], d: int, rounds: int, trials: int, raw_mb: float,
               log: Any, schemes: tuple[str, ...] = ("partial", "uncoded")) -> dict[str, Any]:
    import bulk_task
    from bench_wire import _coded, _raw_receiver, _start, raw_trial

    from aiogc.config import RunConfig

    spec = bulk_task.spec(d)
    msg = _coded(d)
    frame_bytes = msg.payload.nbytes
    frames = max(1, round(raw_mb * 1e6 / frame_bytes))
    raw_proc, raw_port = _start(_raw_receiver)
    raw: list[float] = []
    rows: dict[str, dict[str, list[float]]] = {}
    try:
        raw_trial(raw_port, msg, 1)  # warm-up: page faults in the receiver's buffer
        for t in range(trials):
            raw.append(raw_trial(raw_port, msg, frames))
            log(f"  bulk trial {t}: raw socket {raw[-1] / 1e9:.2f} GB/s")
            for m in ms:
                for scheme in (schemes if t % 2 == 0 else schemes[::-1]):  # alternate
                    cfg = RunConfig(scheme=scheme, workers=m, delta=3, n_parts=1,
                                    rounds=rounds, delay="none", task=spec, dtype="float32")
                    recs, _ = _one_run(cfg, scheme)
                    itemsize = cfg.payload_dtype.itemsize
                    payload_len = cfg.build_scheme().payload_len(d)
                    key = f"m={m}/{scheme}"
                    row = rows.setdefault(key, {"dur": [], "bytes": [], "up": [], "tput": [],
                                                "trial_med": []})
                    xs = []
                    for r in _exact(recs):
                        up = len(r.arrivals) * payload_len * itemsize
                        down = m * d * itemsize  # round_start carries the model to every worker
                        row["dur"].append(r.duration_s)
                        row["up"].append(len(r.arrivals))
                        row["bytes"].append(up + down)
                        row["tput"].append((up + down) / r.duration_s)
                        xs.append(r.duration_s)
                    row["trial_med"].append(_med(xs))
                    log(f"  bulk trial {t}: {key} median {1e3 * row['trial_med'][-1]:.1f} ms")
    finally:
        raw_proc.terminate()
        raw_proc.join()
    raw_med = _med(raw)
    out: dict[str, Any] = {"d": d, "dtype": "float32", "rounds": rounds, "trials": trials,
                           "task": spec, "raw_frame_mb": frame_bytes / 1e6,
                           "raw_mb_per_trial": frames * frame_bytes / 1e6,
                           "raw_gb_s": [x / 1e9 for x in raw], "raw_median_gb_s": raw_med / 1e9,
                           "subjects": {}}
    for key, row in rows.items():
        tput = _med(row["tput"])
        out["subjects"][key] = {
            "median_round_ms": 1e3 * _med(row["dur"]),
            "min_round_ms": 1e3 * min(row["dur"]),
            "max_round_ms": 1e3 * max(row["dur"]),
            "per_trial_median_ms": [1e3 * x for x in row["trial_med"]],
            "median_coded_vectors": _med(row["up"]),
            "median_mb_per_round": _med(row["bytes"]) / 1e6,
            "median_gb_s": tput / 1e9,
            "ratio_to_raw": tput / raw_med,
            "n_rounds": len(row["dur"]),
        }
    return out


# ------------------------------------------------------------------------ report


def _task_name(spec: str) -> str:
    return Path(spec.rsplit(":", 1)[0]).name + ":" + spec.rsplit(":", 1)[1] if "/" in spec \
        else spec


def format_report(res: dict[str, Any]) -> str:
    lines = [f"$ {res['command']}",
             f"python {res['python']}, {res['cpus']} cpus, loadavg before {res['loadavg_before']}"
             f" after {res['loadavg_after']}; medians, subjects interleaved per trial", ""]
    s = res.get("start")
    if s:
        lines.append(f"1. process start, m={s['workers']}, rounds=1, delay none, {s['task']}, "
                     f"{s['trials']} trials each (+1 cold forkserver: "
                     f"{s['cold_forkserver_s']:.2f} s)")
        lines.append(f"   {'start method':<12} {'median s':>9} {'min s':>7} {'max s':>7} "
                     f"{'ms/worker':>10} {'ref s':>6}")
        for k in ("forkserver", "spawn"):
            xs = s["samples_s"][k]
            lines.append(f"   {k:<12} {s['median_s'][k]:>9.2f} {min(xs):>7.2f} {max(xs):>7.2f} "
                         f"{s['per_worker_ms'][k]:>10.1f} {s['reference_s'][k]:>6.2f}")
        lines.append(f"   spawn / forkserver = {s['ratio_spawn_over_forkserver']:.2f} "
                     f"(reference {4.46 / 0.52:.2f})")
        lines.append("")
    p = res.get("protocol")
    if p:
        lines.append(f"2. protocol round, m={p['workers']}, d={p['d']}, partial l=1, delay none, "
                     f"{p['rounds'] - 1} rounds x {p['trials']} trials (round 0 skipped), "
                     f"task {_task_name(p['task'])}")
        lines.append(f"   {'mode/loop':<22} {'median ms':>9} {'p90 ms':>7} {'trigger ms':>10} "
                     f"{'us/worker':>9}  per-trial medians ms")
        for k, v in p["subjects"].items():
            per = " ".join(f"{x:.1f}" for x in v["per_trial_median_ms"])
            lines.append(f"   {k:<22} {v['median_round_ms']:>9.2f} {v['p90_round_ms']:>7.2f} "
                         f"{v['median_trigger_ms']:>10.2f} {v['per_worker_us']:>9.0f}  {per}")
        for k, v in p.items():
            if k.startswith("ratio_"):
                lines.append(f"   {k.replace('ratio_', '')}: {v:.2f}")
        lines.append("   reference (an earlier measurement, not this run): 1.2 ms uvloop, "
                     "1.5 ms default loop")
        lines.append("")
    b = res.get("bulk")
    if b:
        raw = b["raw_gb_s"]
        lines.append(f"3. bulk round, d={b['d']} {b['dtype']}, delay none, "
                     f"{b['rounds'] - 1} rounds x {b['trials']} trials (round 0 skipped)")
        lines.append(f"   raw loopback socket ({b['raw_frame_mb']:.0f} MB frames, "
                     f"{b['raw_mb_per_trial']:.0f} MB/trial): median {b['raw_median_gb_s']:.2f} "
                     f"GB/s (min {min(raw):.2f}, max {max(raw):.2f})")
        lines.append(f"   {'subject':<16} {'median ms':>9} {'min':>7} {'max':>7} {'vectors':>7} "
                     f"{'MB/round':>8} {'GB/s':>6} {'x raw':>6}  per-trial medians ms")
        for k, v in b["subjects"].items():
            per = " ".join(f"{x:.0f}" for x in v["per_trial_median_ms"])
            lines.append(f"   {k:<16} {v['median_round_ms']:>9.1f} {v['min_round_ms']:>7.1f} "
                         f"{v['max_round_ms']:>7.1f} {v['median_coded_vectors']:>7.0f} "
                         f"{v['median_mb_per_round']:>8.0f} {v['median_gb_s']:>6.2f} "
                         f"{v['ratio_to_raw']:>6.2f}  {per}")
        lines.append("   MB/round = coded payloads received (up) + m models sent (down); GB/s = "
                     "median over rounds of MB/round / round time")
    fails = res.get("failed_rounds") or []
    if fails:
        lines.append("")
        lines.append(f"rounds not exact (left out of the medians): {len(fails)}")
        for f in fails[:10]:
            dropped = ", ".join(f"w{k}: {v}" for k, v in list(f["dropped"].items())[:4])
            lines.append(f"   m={f['workers']} {f['scheme']} {f['mode']}/{f['loop']} round "
                         f"{f['round']}: {f['status']} ({f['end_reason']}; "
                         f"{f['duration_s']:.2f} s) dropped: {dropped or '-'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="fewer trials and rounds; bulk at m=16 only")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    ap.add_argument("--workers", type=int, default=64, help="m for start-up and protocol (64)")
    ap.add_argument("--only", nargs="+", choices=["start", "protocol", "bulk"],
                    default=["start", "protocol", "bulk"])
    ap.add_argument("--start-trials", type=int, help="default 5 (quick: 3)")
    ap.add_argument("--protocol-trials", type=int, help="default 5 (quick: 3)")
    ap.add_argument("--protocol-rounds", type=int, help="rounds per run incl. round 0; "
                    "default 31 (quick: 16)")
    ap.add_argument("--protocol-d", type=int, default=1000)
    ap.add_argument("--protocol-task", default=None,
                    help="task spec (default: bench/bulk_task.py with d=--protocol-d; e.g. "
                         "linreg:samples=640,dim=1000, whose per-worker setup costs ~0.2 s)")
    ap.add_argument("--protocol-modes", nargs="+", choices=["processes", "coroutines"],
                    default=["processes", "coroutines"])
    ap.add_argument("--bulk-workers", type=int, nargs="+", help="default 16 64 (quick: 16)")
    ap.add_argument("--bulk-d", type=int, default=1_000_000)
    ap.add_argument("--bulk-trials", type=int, help="default 5 (quick: 3)")
    ap.add_argument("--bulk-rounds", type=int, help="rounds per run incl. round 0; "
                    "default 11 (quick: 6)")
    ap.add_argument("--raw-mb", type=float, default=256.0, help="MB per raw-socket trial")
    ap.add_argument("-q", "--silent", action="store_true", help="no per-trial progress on stderr")
    args = ap.parse_args(argv)
    q = args.quick
    start_trials = args.start_trials or (3 if q else 5)
    protocol_trials = args.protocol_trials or (3 if q else 5)
    protocol_rounds = args.protocol_rounds or (16 if q else 31)
    bulk_workers = args.bulk_workers or ([16] if q else [16, 64])
    bulk_trials = args.bulk_trials or (3 if q else 5)
    bulk_rounds = args.bulk_rounds or (6 if q else 11)

    def log(text: str) -> None:
        if not args.silent:
            print(text, file=sys.stderr, flush=True)

    res: dict[str, Any] = {
        "command": shlex.join([sys.executable.split("/")[-1], *sys.argv]) if argv is None
        else shlex.join(["bench_runner.py", *argv]),
        "python": sys.version.split()[0], "platform": platform.platform(),
        "cpus": os.cpu_count(), "loadavg_before": _loadavg(),
    }
    t0 = time.monotonic()
    if "start" in args.only:
        res["start"] = bench_start(args.workers, start_trials, log)
    if "protocol" in args.only:
        res["protocol"] = bench_protocol(args.workers, args.protocol_d, protocol_rounds,
                                         protocol_trials, args.protocol_task,
                                         args.protocol_modes, log)
    if "bulk" in args.only:
        res["bulk"] = bench_bulk(bulk_workers, args.bulk_d, bulk_rounds, bulk_trials,
                                 args.raw_mb, log)
    res["failed_rounds"] = FAILURES
    res["loadavg_after"] = _loadavg()
    res["elapsed_s"] = time.monotonic() - t0
    print(format_report(res))
    print(f"(elapsed {res['elapsed_s']:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
