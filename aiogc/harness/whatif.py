"""Counterfactual replays of a recorded run: "what if nobody straggled?" (``aiogc whatif``).

A run's mean round time splits into three factors, each measured on the run's own schedule
(``delays.csv``) with the fast simulator (:func:`aiogc.sim.fast.simulate_fast`)::

    live = clean x (actual / clean) x (live / actual)
           ^^^^^   ^^^^^^^^^^^^^^^   ^^^^^^^^^^^^^^^
           the     stragglers:       the system's own overhead (protocol, event loop, OS):
           work    the schedule's    the fidelity section's live/simulated ratio
                   slow-downs

* ``actual``: the simulated mean round time on the recorded schedule;
* ``clean``: the same on the *no-straggler* schedule (:func:`no_straggler_schedule`): every
  finite delay replaced by a typical one -- a statistic (``typical``: the median, the mean or a
  quantile) of the worker's own delays (``baseline="worker"``: removes transient slow-downs,
  bursts, heavy tails and fail-slow windows, keeps a persistently slow worker slow) or of all
  workers' (``baseline="cluster"``: nobody is slower than the typical worker). Dead entries
  (``inf``: failures, not stragglers) stay dead. The statistic matters under a skewed law: the
  median of an exponential delay is ``ln 2 ~ 0.69`` of its mean, so a median baseline also
  counts the gap between the typical and the average delay as "stragglers"; ``mean`` counts
  only the variability.
* ``live``: the run's measured mean round time in emulated seconds (the fidelity section's
  ``live_mean_s``, over the rounds it compared).

So ``actual - clean`` seconds per round are attributable to stragglers and ``live - actual``
to the system. Only completed rounds count; a scheme's rounds that fail in a schedule are
reported, not averaged. Partial's speedup over each other scheme is reported three ways, each
named: ``live`` (the measured live mean round times; absent without a fidelity section),
``simulated`` (the fast simulator on the recorded schedule) and ``clean`` (on the no-straggler
schedule).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Final

import numpy as np

from aiogc.config import RunConfig
from aiogc.errors import ConfigError
from aiogc.harness.runfiles import RunFileError, read_json
from aiogc.training.schedule import DelaySchedule

__all__ = ["BASELINES", "TYPICAL", "format_whatif", "no_straggler_schedule", "parse_typical",
           "whatif_no_stragglers"]

#: Whose delays the typical one is taken over: the worker's own, or everyone's.
BASELINES: Final = ("worker", "cluster")
#: The statistic of those delays each entry is replaced with (``quantile:Q``, ``0 <= Q <= 1``).
TYPICAL: Final = ("median", "mean", "quantile:Q")


def parse_typical(spec: str) -> tuple[str, float]:
    """``median`` / ``mean`` / ``quantile:Q`` -> (canonical name, quantile or NaN for mean).

    Raises
    ------
    ConfigError
        Anything else, or ``Q`` outside ``[0, 1]``.
    """
    if spec == "median":
        return "median", 0.5
    if spec == "mean":
        return "mean", math.nan
    head, _, q = spec.partition(":")
    if head == "quantile":
        try:
            qv = float(q)
        except ValueError:
            qv = math.nan
        if 0.0 <= qv <= 1.0:
            return f"quantile:{qv:g}", qv
        raise ConfigError("typical", spec, "quantile:Q with 0 <= Q <= 1")
    raise ConfigError("typical", spec, "one of " + ", ".join(TYPICAL))


def _stat(x: np.ndarray, typical: str) -> float:
    """The statistic of the finite values of ``x`` (NaN-free input, at least one value)."""
    _, q = parse_typical(typical)
    return float(np.mean(x)) if math.isnan(q) else float(np.quantile(x, q))


def _typical(a: np.ndarray, baseline: str, typical: str = "median") -> np.ndarray:
    """Per-worker (axis 1) or global statistic of the finite entries, broadcast to ``a``'s
    shape; NaN where a worker has no finite entry."""
    ok = np.isfinite(a)
    if not ok.any():
        return np.full_like(a, np.nan)
    if baseline == "cluster":
        return np.full_like(a, _stat(a[ok], typical))
    cols = np.array([_stat(a[:, j][ok[:, j]], typical) if ok[:, j].any() else np.nan
                     for j in range(a.shape[1])])
    shape = [1] * a.ndim
    shape[1] = a.shape[1]
    return np.broadcast_to(cols.reshape(shape), a.shape).copy()


def no_straggler_schedule(schedule: DelaySchedule, baseline: str = "worker",
                          typical: str = "median") -> DelaySchedule:
    """The schedule with every finite compute and network delay replaced by a typical one.

    Parameters
    ----------
    schedule : DelaySchedule
        ``compute_s`` (R, m, K), ``network_s`` (R, m).
    baseline : {"worker", "cluster"}
        Over worker ``j``'s own delays (its rounds and positions), or over everything.
    typical : {"median", "mean", "quantile:Q"}
        The statistic of those delays (:func:`parse_typical`).

    Returns
    -------
    DelaySchedule
        Same shapes; ``inf`` entries unchanged; specs marked
        ``no-stragglers(BASELINE,TYPICAL):...``.
    """
    if baseline not in BASELINES:
        raise ConfigError("baseline", baseline, "one of " + ", ".join(BASELINES))
    typical, _ = parse_typical(typical)
    out = []
    for a in (schedule.compute_s, schedule.network_s):
        typ = _typical(a, baseline, typical)
        out.append(np.where(np.isfinite(a), np.nan_to_num(typ, nan=0.0), a))
    tag = f"no-stragglers({baseline},{typical})"
    return DelaySchedule(compute_s=out[0], network_s=out[1], seed=schedule.seed,
                         compute_spec=f"{tag}:{schedule.compute_spec}",
                         network_spec=f"{tag}:{schedule.network_spec}")


def _mean_finite(x: np.ndarray) -> tuple[float, int]:
    f = x[np.isfinite(x)]
    return (float(f.mean()) if f.size else math.nan), int(x.size - f.size)


def _div(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) else math.nan


def whatif_no_stragglers(run_dir: str | os.PathLike[str], *, baseline: str = "worker",
                         typical: str = "median") -> dict[str, Any]:
    """Replay the run's schedule with and without its stragglers (module docstring).

    Returns
    -------
    dict
        ``baseline``, ``typical``, ``time_scale``, ``rounds`` and per scheme ``live_mean_s``
        (None without
        a fidelity section), ``sim_mean_s``, ``clean_mean_s``, ``straggler_slowdown``
        (``sim / clean``), ``system_overhead`` (``live / sim``), ``straggler_s`` and
        ``system_s`` (seconds per round), ``failed_rounds_sim`` / ``failed_rounds_clean``;
        ``speedups``: partial's speedup over each other scheme, ``live`` (None without a
        fidelity section), ``simulated`` and ``clean``.

    Raises
    ------
    ConfigError
        ``run_dir`` lacks ``manifest.json`` or ``delays.csv``.
    """
    from aiogc.sim.fast import build_schemes, simulate_fast

    d = Path(run_dir)
    for name in ("manifest.json", "delays.csv"):
        if not (d / name).is_file():
            raise ConfigError("run_dir", str(run_dir), f"a run directory with {name}")
    manifest = read_json(d / "manifest.json")
    if not isinstance(manifest.get("config"), dict):
        raise RunFileError(d / "manifest.json", "field config", "a JSON object (the run's "
                           "configuration)")
    config = RunConfig.from_wire(manifest["config"])
    schemes = list(manifest.get("schemes") or [config.scheme])
    schedule = DelaySchedule.from_csv(d / "delays.csv")
    typical, _ = parse_typical(typical)
    clean = no_straggler_schedule(schedule, baseline, typical)
    summary = {}
    if (d / "summary.json").is_file():
        summary = read_json(d / "summary.json")
    fid = (summary.get("fidelity") or {}) if isinstance(summary, dict) else {}
    live = {n: v.get("live_mean_s") for n, v in (fid.get("schemes") or {}).items()}
    built = build_schemes(config, schemes)
    cfg = config.replace(rounds=schedule.rounds)
    sim = simulate_fast(cfg, schemes, schedule=schedule, built=built, mse=False)
    sim_clean = simulate_fast(cfg, schemes, schedule=clean, built=built, mse=False)
    out: dict[str, Any] = {"baseline": baseline, "typical": typical,
                           "time_scale": fid.get("time_scale", 1.0), "rounds": schedule.rounds,
                           "schemes": {}, "speedups": {}}
    for name in schemes:
        s, fail_s = _mean_finite(sim[name].completion_s)
        c, fail_c = _mean_finite(sim_clean[name].completion_s)
        lv = live.get(name)
        lv_f = float(lv) if isinstance(lv, int | float) else math.nan
        out["schemes"][name] = {
            "live_mean_s": lv, "sim_mean_s": s, "clean_mean_s": c,
            "straggler_slowdown": _div(s, c), "system_overhead": _div(lv_f, s),
            "straggler_s": s - c, "system_s": lv_f - s if lv is not None else None,
            "failed_rounds_sim": fail_s, "failed_rounds_clean": fail_c,
        }
    if "partial" in out["schemes"]:
        p = out["schemes"]["partial"]
        for name, v in out["schemes"].items():
            if name != "partial":
                live_sp = (_div(float(v["live_mean_s"]), float(p["live_mean_s"]))
                           if v["live_mean_s"] is not None and p["live_mean_s"] is not None
                           else None)
                out["speedups"][name] = {
                    "live": live_sp,
                    "simulated": _div(v["sim_mean_s"], p["sim_mean_s"]),
                    "clean": _div(v["clean_mean_s"], p["clean_mean_s"])}
    return out


def _f(x: Any, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def format_whatif(res: dict[str, Any]) -> str:
    """The table ``aiogc whatif`` prints."""
    rows = [("scheme", "live s", "sim s", "no-straggler s", "stragglers x", "system x",
             "stragglers s/round", "system s/round")]
    for name, v in res["schemes"].items():
        rows.append((name, _f(v["live_mean_s"], ".4f"), _f(v["sim_mean_s"], ".4f"),
                     _f(v["clean_mean_s"], ".4f"), _f(v["straggler_slowdown"], ".2f"),
                     _f(v["system_overhead"], ".2f"), _f(v["straggler_s"], ".4f"),
                     _f(v["system_s"], ".4f")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    whose = "that worker's own delays" if res["baseline"] == "worker" else "all workers' delays"
    lines.append(f"no-straggler baseline: each delay -> the {res['typical']} of {whose} "
                 f"(--typical {res['typical']} --baseline {res['baseline']}; dead workers stay "
                 f"dead); {res['rounds']} rounds, emulated seconds at "
                 f"time scale K={_f(res['time_scale'], 'g')}")
    lines.append("stragglers x = sim / no-straggler (the schedule's slow-downs); "
                 "system x = live / sim (protocol, loop and OS overhead: the fidelity ratio)")
    for name, sp in res["speedups"].items():
        lines.append(f"speedup of partial over {name}: live {_f(sp['live'], '.2f')} "
                     f"(measured); simulated {_f(sp['simulated'], '.2f')} on the recorded "
                     f"delays, {_f(sp['clean'], '.2f')} on the no-straggler ones")
    return "\n".join(lines)
