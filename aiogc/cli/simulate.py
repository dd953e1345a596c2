"""``aiogc simulate`` and ``aiogc experiment``: argparse subcommands registered by ``aiogc.cli``.

``register(subparsers)`` adds both; each sets ``func=handler`` with ``handler(args) -> int``.
Bad values exit with code 2 and a message naming the flag, the value and the allowed range.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from aiogc.cli.args import log, warn_cautions
from aiogc.cli.knobs import add_knobs
from aiogc.coding.registry import scheme_names, scheme_spec
from aiogc.config import RunConfig
from aiogc.errors import ConfigError
from aiogc.harness.assignment_file import resolve_factor_spec

__all__ = ["register", "run_simulate", "simulate_from_args", "simulate_summary"]

#: RunConfig field -> the flag that sets it (for error messages).
_FLAGS = {
    "workers": "--workers", "m": "--workers", "delta": "--delta", "n_parts": "--ell",
    "assignment": "--assignment", "ordering": "--ordering", "decoding": "--decoding",
    "delay": "--delay", "latency": "--latency", "rounds": "--rounds (--trials)", "seed": "--seed",
    "deadline_s": "--deadline", "mode": "--mode", "k": "--k", "dtype": "--dtype",
    "coded_dtype": "--payload-dtype", "worker_speeds": "--worker-speeds",
    "chunk_sizes": "--chunk-sizes",
    "scheme": "--schemes", "schemes": "--schemes", "out": "--out", "dim": "--dim",
    "engine": "--engine",
    "bandwidth": "--bandwidth", "bandwidth.worker": "--bandwidth",
    "bandwidth.worker_up": "--bandwidth", "bandwidth.worker_down": "--bandwidth",
    "bandwidth.ps": "--bandwidth",
}

#: Largest trial count accepted (the schedule holds trials * m * delta floats).
MAX_TRIALS = 1_000_000


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``simulate`` and ``experiment`` to an argparse subparsers object."""
    p = subparsers.add_parser(
        "simulate",
        help="simulate many rounds of several schemes on one delay schedule",
        description="Simulate trials (one round each) of several schemes on the same "
        "materialised delay schedule; print completion times (exact mode) or MSE at "
        "deadlines (approx mode).",
    )
    add_knobs(p, "simulate")
    p.set_defaults(func=cmd_simulate)

    from aiogc.experiments import EXPERIMENTS

    e = subparsers.add_parser(
        "experiment",
        help="run a named experiment (CSV + PNG)",
        description="Run one of the documented experiments (docs/experiments.md) and write "
        "NAME.csv and NAME.png into --out.",
    )
    e.add_argument("name", choices=(*EXPERIMENTS, "all"))
    e.add_argument("--out", required=True, help="output directory")
    e.add_argument("--quick", action="store_true", help="small grid (< 20 s each)")
    e.add_argument("--seed", type=int, default=1)
    e.set_defaults(func=cmd_experiment)


# ------------------------------------------------------------------------------ simulate


def _flag_error(exc: ConfigError) -> str:
    flag = _FLAGS.get(exc.field, exc.field)
    return f"aiogc simulate: error: {flag}: {exc.value!r} is invalid: expected {exc.allowed}"


def _parse_schemes(text: str) -> list[str]:
    schemes = [s.strip() for s in str(text).split(",") if s.strip()]
    names = scheme_names()
    if not schemes:
        raise ConfigError("schemes", text, "a comma-separated list of " + ", ".join(names))
    for s in schemes:
        if s not in names:
            raise ConfigError("schemes", s, "one of " + ", ".join(names))
    if len(set(schemes)) != len(schemes):
        raise ConfigError("schemes", text, "distinct scheme names")
    return schemes


def _parse_latency(text: str) -> tuple[float, str]:
    """``(one-way seconds, "none")`` for a number, ``(0.0, spec)`` for a delays.py spec."""
    try:
        latency = float(text)
    except ValueError:
        from aiogc.training.delays import parse_delay

        parse_delay(str(text), field="latency")
        return 0.0, str(text)
    if not math.isfinite(latency) or latency < 0:
        raise ConfigError("latency", text, "seconds >= 0 or a delays.py spec")
    return latency, "none"


def _parse_deadlines(mode: str, text: str | None) -> list[float]:
    if mode != "approx":
        return []
    if not text:
        raise ConfigError("deadline_s", text, "T1,T2,... (seconds > 0) in approx mode")
    deadlines: list[float] = []
    for tok in str(text).split(","):
        try:
            t = float(tok)
        except ValueError:
            raise ConfigError("deadline_s", tok, "a number of seconds > 0") from None
        if not (math.isfinite(t) and t > 0):
            raise ConfigError("deadline_s", tok, "a number of seconds in (0, 1e6]")
        deadlines.append(t)
    return deadlines


def _parse_args(args: argparse.Namespace) -> tuple[RunConfig, list[str], float, list[float]]:
    from aiogc.config import parse_bandwidth

    args.comm = parse_bandwidth(getattr(args, "bandwidth", None))
    schemes = _parse_schemes(args.schemes)
    if args.engine not in ("fast", "protocol"):
        raise ConfigError("engine", args.engine, "fast or protocol")
    if type(args.trials) is not int or not 1 <= args.trials <= MAX_TRIALS:
        raise ConfigError("rounds", args.trials, f"an integer in [1, {MAX_TRIALS}]")
    if not 1 <= args.dim <= 1_000_000:
        raise ConfigError("dim", args.dim, "an integer in [1, 1000000]")
    latency, spec = _parse_latency(args.latency)
    deadlines = _parse_deadlines(args.mode, args.deadline)
    from aiogc.training.delays import parse_delay

    parse_delay(str(args.delay), field="delay")
    warn_cautions(str(args.delay), spec)
    # the base config carries the configured ell; each scheme then sees its own view
    # (RunConfig.for_scheme), so the base must be a scheme that accepts any ell
    base = next((s for s in schemes if scheme_spec(s).forced_n_parts is None), "partial")
    cfg = RunConfig(
        scheme=base,
        workers=args.workers, delta=args.delta, n_parts=args.ell, assignment=args.assignment,
        ordering=args.ordering, decoding=args.decoding, k=args.k, mode=args.mode,
        deadline_s=deadlines[0] if deadlines else None, rounds=args.trials, seed=args.seed,
        delay=str(args.delay), latency=spec, dtype=args.dtype, coded_dtype=args.coded_dtype,
        worker_speeds=resolve_factor_spec(args.worker_speeds, field="worker_speeds"),
        chunk_sizes=resolve_factor_spec(args.chunk_sizes, field="chunk_sizes"),
        heartbeat_s=None, dead_after_s=None, round_timeout_s=1e6,
    )
    for s in schemes:  # validate every scheme's view of the config up front
        cfg.for_scheme(s)
    return cfg, schemes, latency, deadlines


def _stats(x: np.ndarray) -> tuple[float | None, float | None, int]:
    fin = x[np.isfinite(x)]
    if fin.size == 0:
        return None, None, int(x.size)
    std = float(fin.std(ddof=1)) if fin.size > 1 else 0.0
    return float(fin.mean()), std, int(x.size - fin.size)


def _row(name: str, mode: str, deadline: float | None, comp: np.ndarray, status: np.ndarray,
         mse: np.ndarray | None, uploads: tuple[np.ndarray, np.ndarray] | None = None,
         ) -> dict[str, Any]:
    mean, std, unfinished = _stats(comp)
    row: dict[str, Any] = {"scheme": name, "mode": mode, "completion_mean": mean,
                           "completion_std": std, "trials": int(comp.size)}
    if unfinished:
        row["unfinished"] = unfinished
    row["exact_fraction"] = float(np.mean(status == "exact"))
    if deadline is not None:
        row["deadline"] = deadline
    if mse is not None:
        row["mse_mean"] = float(mse.mean())
        row["mse_std"] = float(mse.std(ddof=1)) if mse.size > 1 else 0.0
        row["mse_median"] = float(np.median(mse))
    if uploads is not None:
        row["uploads_mean"] = float(uploads[0].mean())
        row["upload_MB_mean"] = float(uploads[1].mean()) / 1e6
    return row


def log_rounds(name: str, deadline: float | None, completion: np.ndarray, status: np.ndarray,
               mse: np.ndarray | None = None) -> None:
    """The ``-v`` log of simulated rounds: one line per round at INFO on the ``aiogc`` logger,
    as ``aiogc run -v`` logs a live one (``partial round 3: exact in 0.0301 s``; a deadline
    and the MSE in approximate mode). ``completion`` and ``status``: shape (R,); ``mse``:
    shape (R,) or None."""
    if not log.isEnabledFor(logging.INFO):
        return
    label = name if deadline is None else f"{name} (deadline {deadline:g} s)"
    for r in range(int(completion.size)):
        t = float(completion[r])
        when = f"in {t:.4f} s" if math.isfinite(t) else "unfinished"
        err = "" if mse is None else f", mse {float(mse[r]):.4g}"
        log.info("%s round %d: %s %s%s", label, r, status[r], when, err)


def run_simulate(cfg: RunConfig, schemes: list[str], *, latency: float = 0.0,
                 deadlines: list[float] | None = None, engine: str = "fast",
                 dim: int = 120, comm: Any = None) -> list[dict[str, Any]]:
    """Result rows (one per scheme, or per scheme and deadline in approx mode).

    ``comm``: a :class:`~aiogc.config.CommModel` (link rates; frames sized at ``dim``).
    """
    from aiogc.sim.engine import SimNetwork
    from aiogc.sim.fast import (
        arrival_times,
        build_schemes,
        schedule_for,
        simulate_fast,
        tie_fraction,
    )
    from aiogc.sim.protocol import record_arrays, simulate_protocol

    built = build_schemes(cfg, schemes)
    schedule = schedule_for(cfg, built)
    if engine == "fast":
        ties = max(tie_fraction(arrival_times(s, schedule, latency=latency))
                   for s in built.values())
        if ties > 0:
            warnings.warn(
                f"--delay {cfg.delay!r}: {100 * ties:.1f}% of trials have arrival ties (a delay "
                "law with atoms); the fast engine counts tied arrivals together while the "
                "protocol engine takes them one at a time, so decoding states and statuses "
                "may differ: use --engine protocol for this law", stacklevel=2)
    rows: list[dict[str, Any]] = []
    runs = [(cfg, None)] if cfg.mode == "exact" else [
        (cfg.replace(deadline_s=t), t) for t in (deadlines or [])
    ]
    for c, t in runs:
        if engine == "fast":
            res = simulate_fast(c, schemes, schedule=schedule, latency=latency, dim=dim,
                                built=built, comm=comm)
            for name in schemes:
                r = res[name]
                ups = None if r.uploads is None or r.upload_bytes is None else (
                    r.uploads, r.upload_bytes)
                rows.append(_row(name, c.mode, t, r.completion_s, r.status, r.mse, ups))
                log_rounds(name, t, r.completion_s, r.status, r.mse)
        else:
            recs = simulate_protocol(c, schemes, schedule=schedule,
                                     network=SimNetwork(latency=latency),
                                     gradients="gaussian", dim=dim, built=built, comm=comm)
            for name in schemes:
                a = record_arrays(recs[name], mode=c.mode)
                mse = a["mse"] if c.mode == "approx" else None
                rows.append(_row(name, c.mode, t, a["completion_s"], a["status"], mse))
                log_rounds(name, t, a["completion_s"], a["status"], mse)
    return rows


def simulate_summary(cfg: RunConfig, schemes: list[str], rows: list[dict[str, Any]], *,
                     latency: float, engine: str, dim: int,
                     deadlines: list[float], bandwidth: str = "") -> dict[str, Any]:
    """The JSON object ``aiogc simulate`` prints."""
    config = {
        "assignment": cfg.assignment, "workers": cfg.workers, "delta": cfg.delta,
        "ell": cfg.n_parts, "schemes": schemes, "delay": cfg.delay,
        "latency_s": latency, "network": cfg.latency, "trials": cfg.rounds, "seed": cfg.seed,
        "mode": cfg.mode, "deadlines": deadlines or None, "dim": dim, "engine": engine,
        "ordering": cfg.ordering, "decoding": cfg.decoding, "dtype": cfg.dtype,
        "bandwidth": bandwidth or None,
    }
    speedup = None
    means = {r["scheme"]: r["completion_mean"] for r in rows if r["mode"] == "exact"}
    if means.get("partial") and means.get("original") is not None:
        speedup = means["original"] / means["partial"]
    out: dict[str, Any] = {"config": config, "results": rows, "speedup": speedup}
    if cfg.mode == "approx" and "partial" in schemes and "original" in schemes:
        ratio = {}
        for t in deadlines:
            mp = next(r["mse_mean"] for r in rows
                      if r["scheme"] == "partial" and r["deadline"] == t)
            mo = next(r["mse_mean"] for r in rows
                      if r["scheme"] == "original" and r["deadline"] == t)
            ratio[str(t)] = mo / mp if mp > 0 else None
        out["mse_ratio"] = ratio
    return out


def _fmt(v: Any, spec: str = ".4g") -> str:
    if v is None:
        return "-"
    return format(v, spec) if isinstance(v, float) else str(v)


def format_table(summary: dict[str, Any]) -> str:
    """A readable table of :func:`simulate_summary`'s object."""
    c = summary["config"]
    lines = [
        f"m={c['workers']} δ={c['delta']} ℓ={c['ell']} assignment={c['assignment']} "
        f"ordering={c['ordering']} delay={c['delay']} latency={c['latency_s']}s "
        f"network={c['network']} trials={c['trials']} seed={c['seed']} engine={c['engine']}"
        + (f" bandwidth={c['bandwidth']} dim={c['dim']}" if c.get("bandwidth") else ""),
    ]
    approx = c["mode"] == "approx"
    head = ["scheme", "mode"] + (["deadline"] if approx else []) + [
        "completion mean", "± std", "exact %"] + (["mse mean", "± std", "median"] if approx else [])
    ups = any("uploads_mean" in r for r in summary["results"])
    head += ["uploads", "MB up"] if ups else []
    body = []
    for r in summary["results"]:
        row = [r["scheme"], r["mode"]] + ([_fmt(r.get("deadline"))] if approx else []) + [
            _fmt(r["completion_mean"]), _fmt(r["completion_std"]),
            f"{100 * r['exact_fraction']:.1f}"]
        if approx:
            row += [_fmt(r["mse_mean"], ".3e"), _fmt(r["mse_std"], ".3e"),
                    _fmt(r["mse_median"], ".3e")]
        if ups:
            row += [_fmt(r.get("uploads_mean"), ".3g"), _fmt(r.get("upload_MB_mean"), ".3g")]
        body.append(row)
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(v.ljust(w) for v, w in zip(b, widths, strict=True)) for b in body)
    if summary.get("speedup") is not None:
        lines.append(f"speedup (original / partial mean completion): {summary['speedup']:.3f}")
    for t, v in (summary.get("mse_ratio") or {}).items():
        lines.append(f"T={t}: MSE original / partial = {_fmt(v, '.3g')}")
    return "\n".join(lines)


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_json_safe(v) for v in obj]
    return obj


#: Files ``aiogc simulate --out DIR`` writes.
SIM_SUMMARY, SIM_RESULTS = "summary.json", "results.csv"


def simulate_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The summary ``aiogc simulate`` prints for parsed flags ``args`` (JSON-safe: no NaN);
    with ``args.out``, also written there (:data:`SIM_SUMMARY`, :data:`SIM_RESULTS`).
    ConfigError on a bad value (field, value, allowed range)."""
    cfg, schemes, latency, deadlines = _parse_args(args)
    out = getattr(args, "out", None)
    if out is not None:
        from aiogc.cli.args import _writable_dir

        _writable_dir("out", out)
    rows = run_simulate(cfg, schemes, latency=latency, deadlines=deadlines,
                        engine=args.engine, dim=args.dim, comm=args.comm)
    summary: dict[str, Any] = _json_safe(simulate_summary(
        cfg, schemes, rows, latency=latency, engine=args.engine, dim=args.dim,
        deadlines=deadlines, bandwidth=args.comm.spec()))
    if out is not None:
        _write_sim_files(Path(out), summary)
    return summary


def _write_sim_files(out: Path, summary: dict[str, Any]) -> None:
    import csv

    (out / SIM_SUMMARY).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    rows = summary["results"]
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with (out / SIM_RESULTS).open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, columns)
        w.writeheader()
        w.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)


def cmd_simulate(args: argparse.Namespace) -> int:
    """Handler of ``aiogc simulate``."""
    try:
        summary = simulate_from_args(args)
    except ConfigError as exc:
        print(_flag_error(exc), file=sys.stderr)
        return 2
    if args.format == "table":
        print(format_table(summary))
    else:
        print(json.dumps(summary, indent=2))
    return 0


# ------------------------------------------------------------------------------ experiment


def cmd_experiment(args: argparse.Namespace) -> int:
    """Handler of ``aiogc experiment NAME --out DIR [--quick]``."""
    from aiogc.experiments import EXPERIMENTS, run_experiment

    names = list(EXPERIMENTS) if args.name == "all" else [args.name]
    for name in names:
        t0 = time.monotonic()
        try:
            summary = run_experiment(name, args.out, quick=args.quick, seed=args.seed,
                                     progress=not getattr(args, "quiet", 0))
        except ConfigError as exc:
            print(f"aiogc experiment: error: {exc}", file=sys.stderr)
            return 2
        dt = time.monotonic() - t0
        print(experiment_table(name, args.out, dt, summary))
    return 0


#: Headline rows :func:`experiment_table` prints (the rest are in NAME.json).
TABLE_ROWS = 12


def experiment_table(name: str, out: str, seconds: float, headline: dict[str, Any]) -> str:
    """What ``aiogc experiment`` prints: where the files are, then the headline as
    ``quantity  value`` rows (the first :data:`TABLE_ROWS`; all of it is in ``NAME.json``)."""
    from pathlib import Path

    d = Path(out)
    lines = [f"{name}: {seconds:.1f} s; {d / (name + '.csv')} (table), "
             f"{d / (name + '.png')} (figure), {d / (name + '.json')} (headline, grid, command)"]
    rows = list(_flatten(headline))
    if rows:
        width = min(60, max(len(k) for k, _ in rows[:TABLE_ROWS]))
        lines += [f"  {k:<{width}}  {v}" for k, v in rows[:TABLE_ROWS]]
    if len(rows) > TABLE_ROWS:
        lines.append(f"  ... {len(rows) - TABLE_ROWS} more in {d / (name + '.json')}")
    return "\n".join(lines)


def _flatten(x: Any, key: str = "") -> Any:
    """``(path, text)`` for every leaf of a headline (a list of numbers is one leaf)."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _flatten(v, f"{key}/{k}" if key else str(k))
    elif isinstance(x, list) and not all(isinstance(v, int | float) for v in x):
        for i, v in enumerate(x):
            yield from _flatten(v, f"{key}[{i}]")
    else:
        yield key, _leaf(x)


def _leaf(v: Any) -> str:
    if isinstance(v, list):
        return ", ".join(_leaf(x) for x in v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)
