"""The run kit shared by every runner (local and Ray): the run's result, manifest, delay
schedule, progress line, PS construction, end reasons and summary.

Both runners import this module and never each other, so a new backend needs only the kit."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from aiogc._version import __version__
from aiogc.coding.base import Scheme
from aiogc.config import RunConfig, scheme_digest
from aiogc.core import (
    AUTH_DEADLINE_S,
    Event,
    ParameterServer,
    PSOptions,
    RoundRecord,
    ShutdownRequested,
)
from aiogc.harness.evictions import eviction_lines
from aiogc.protocol.status import describe_end
from aiogc.training.cluster import cluster_schedule
from aiogc.training.delays import materialise
from aiogc.training.locate import (
    LiarLocator,
    check_locate,
    liars_supported,
    locate_spare_count,
)
from aiogc.training.ps_aggregator import task_aggregator
from aiogc.training.schedule import DelaySchedule
from aiogc.training.tasks import make_task

if TYPE_CHECKING:
    from aiogc.harness.options import RunOptions
    from aiogc.harness.records import RunRecorder


#: Seconds worker processes get to exit after the PS finished before they are terminated.
PROCESS_GRACE_S = 5.0


#: Failed rounds listed by reason in the console summary (summary.json lists more).
FAILED_ROUNDS_SHOWN = 10


BLAS_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass
class RunResult:
    """Outcome of :func:`run_live`."""

    records: dict[str, list[RoundRecord]] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    out_dir: Path | None = None
    schedule: DelaySchedule | None = None
    wall_s: dict[str, float] = field(default_factory=dict)
    #: workers the PS evicted (summary.json ``evicted``, aiogc.harness.evictions)
    evicted: list[dict[str, Any]] = field(default_factory=list)
    #: why each scheme's run ended (the PS's finish reason, e.g. "all rounds done")
    end_reasons: dict[str, str] = field(default_factory=dict)
    #: why the whole run ended: "all rounds done", or the first scheme's other reason
    end_reason: str = ""
    #: sections the runner adds to summary.json beside summarize()'s (e.g. ``fidelity``)
    extra_summary: dict[str, Any] = field(default_factory=dict)
    #: what the runner said on stderr during the run about its outcome (a Ray worker lost
    #: with its node, ...); ``aiogc run`` repeats it with its closing lines after a Ray run
    notes: list[str] = field(default_factory=list)


def materialise_for(config: RunConfig, schemes: Sequence[str], *,
                    built: Mapping[str, Scheme] | None = None) -> DelaySchedule:
    """One schedule wide enough for every scheme's largest load (``built``: the run's
    schemes by name, when it built them already)."""
    max_load = 1
    for name in schemes:
        sch = built[name] if built is not None else config.replace(scheme=name).build_scheme()
        max_load = max(max_load, int(np.max(sch.loads)))
    return materialise(config.delay, config.latency, rounds=config.rounds, m=config.workers,
                       max_chunks=max_load, seed=config.seed)


def scheme_config(config: RunConfig, name: str) -> RunConfig:
    """The run config for one scheme of a comparison (ℓ kept where the scheme allows it)."""
    return config.for_scheme(name)


def git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=Path(__file__).resolve().parent, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def build_manifest(config: RunConfig, schemes: Sequence[str], schedule: DelaySchedule,
                   *, mode: str, loop: str, verify: bool, argv: Sequence[str] | None,
                   built: Mapping[str, Scheme] | None = None) -> dict[str, Any]:
    per_scheme: dict[str, Any] = {}
    for name in schemes:
        cfg = scheme_config(config, name)
        sch = built[name] if built is not None else cfg.build_scheme()
        entry: dict[str, Any] = {
            "config": cfg.to_wire(),
            "digest": scheme_digest(sch),
            "assignment": np.asarray(sch.A, dtype=int).tolist(),
            "orders": [np.asarray(o).tolist() for o in sch.orders],
            "loads": np.asarray(sch.loads).tolist(),
            **sch.manifest_extras(),  # partial: B, its worst condition number, q_max
        }
        per_scheme[name] = entry
    return {
        "aiogc_version": __version__,
        "git_sha": git_sha(),
        "argv": list(argv) if argv is not None else None,
        "python": sys.version.split()[0],
        "seed": config.seed,
        "config": config.to_wire(),
        "schemes": per_scheme,
        "delay_model": {"compute": schedule.compute_spec, "network": schedule.network_spec},
        "mode": mode,
        "loop": loop,
        "verify": verify,
    }


#: The command line's diagnostics logger (``-v``: a line per round).
_log = logging.getLogger("aiogc")

def round_line(r: RoundRecord) -> str:
    """``round 3: exact in 0.0301 s`` (a failed round says why): the ``-v`` log of a round."""
    why = (f" ({describe_end(r.end_reason, r.end_detail)})"
           if r.status == "failed" and r.end_reason else "")
    return f"round {r.round}: {r.status}{why} in {r.duration_s:.4f} s"


class Progress:
    """A one-line progress bar on stderr (only when stderr is a terminal, or forced): rounds
    done, elapsed wall seconds, rounds per second and the time left at that rate. Given the
    round's record, :meth:`update` also logs it at INFO (``-v``) on the ``aiogc`` logger."""

    def __init__(self, total: int, label: str, *, enabled: bool,
                 clock: Any = time.monotonic) -> None:
        self.total = total
        self.label = label
        self.enabled = enabled
        self.done = 0
        self._clock = clock
        self._t0 = clock()

    def line(self) -> str:
        """The bar as it stands."""
        width = 30
        fill = int(width * self.done / max(1, self.total))
        elapsed = self._clock() - self._t0
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (f"ETA {(self.total - self.done) / rate:.0f} s" if rate > 0
               else "ETA after the first round")
        return (f"{self.label:>18} [{'#' * fill}{'.' * (width - fill)}] "
                f"{self.done}/{self.total} rounds {elapsed:5.1f} s, {rate:.1f}/s, {eta}")

    def update(self, n: int = 1, record: RoundRecord | None = None) -> None:
        self.done += n
        if record is not None and _log.isEnabledFor(logging.INFO):
            _log.info("%s %s", self.label, round_line(record))
        if not self.enabled:
            return
        sys.stderr.write("\r" + self.line())
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def make_ps(config: RunConfig, *, schedule: DelaySchedule | None, verify: bool = True,
            keep_gradients: bool = False, guard: bool = True, locate: int | None = None,
            scheme: Scheme | None = None, **kwargs: Any) -> tuple[ParameterServer, Any]:
    """A ParameterServer for ``config`` with its task, and the :class:`Aggregator` its driver
    runs its work with (``ps.aggregator``: initial model, learning rate, loss and, if
    ``verify``, the uncoded chunk gradients as oracle; ``keep_gradients`` and ``guard`` are
    the aggregator's). ``kwargs`` go to the PS (``secret``, ``epoch``,
    ``options=PSOptions(...)``). ``locate``: locate an inconsistent worker where
    two spares allow and evict it after that many located rounds (0: never evict; None: off;
    :mod:`aiogc.training.locate`); it needs ``PSOptions(spare_wait > 0, spares=2)``.

    At ``config.time_scale`` K > 1 the PS runs the dilated configuration (every timeout
    times K, :meth:`RunConfig.dilated`), sends the schedule's delays times K, and gives a
    new connection K times as long to authenticate. ``scheme``: the run's, when it built it
    already (default ``config.build_scheme()``)."""
    k = config.time_scale
    if k != 1.0:
        config = config.dilated()
        if schedule is not None:
            schedule = schedule.scaled(k)
        opts = kwargs.get("options") or PSOptions()
        if opts.auth_deadline_s is None:  # unless the caller chose one
            kwargs["options"] = replace(opts, auth_deadline_s=AUTH_DEADLINE_S * k)
    if scheme is None:
        scheme = config.build_scheme()
    task = make_task(config.task, scheme.n_chunks, config.seed, chunk_sizes=config.sizes)
    if schedule is not None:  # a heterogeneous cluster's speeds and chunk sizes
        schedule = cluster_schedule(schedule, config, scheme)
    model = task.initial_model()
    # the protocol engine builds its aggregator the same way (training/ps_aggregator.py)
    aggregator = task_aggregator(config, scheme, task, model=model, verify=verify,
                                 keep_gradients=keep_gradients, guard=guard)
    if locate is not None:
        check_locate(locate, config)
        aggregator.locator = LiarLocator(
            evict_after=locate,
            eps=None if config.coded_dtype == "same" else config.coded_eps,
            liars=liars_supported(locate_spare_count(config.stragglers_tolerated)),
            min_finished=config.workers - config.stragglers_tolerated)
    ps = ParameterServer(config, scheme=scheme, model=model, aggregator=aggregator,
                         schedule=schedule, **kwargs)
    return ps, task


#: The PS's shutdown reason when every round ran; workers stay quiet then.
ALL_ROUNDS_DONE = "all rounds done"


class ExitReason:
    """Event sink of a worker that remembers only why the PS ended the run."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def __call__(self, ev: Event) -> None:
        if isinstance(ev, ShutdownRequested):
            self.reason = ev.reason

    def describe(self) -> str:
        return "PS ended the run" + (f": {self.reason}" if self.reason else "")

    @property
    def early(self) -> bool:
        """The run ended before every round ran (or the reason is unknown)."""
        return self.reason != ALL_ROUNDS_DONE


def open_recorder(result: RunResult, config: RunConfig, schemes: Sequence[str],
                  schedule: DelaySchedule, options: RunOptions, *, mode: str,
                  loop_kind: str, built: Mapping[str, Scheme] | None = None
                  ) -> RunRecorder | None:
    """The run directory's recorder (None without ``options.out_dir``), with the manifest
    (``options.verify``, ``options.argv``) and the delay schedule written; sets
    ``result.out_dir``."""
    if options.out_dir is None:
        return None
    from aiogc.harness.records import FLUSH_EVERY_S, RunRecorder

    out = Path(options.out_dir)
    manifest = build_manifest(config, schemes, schedule, mode=mode, loop=loop_kind,
                              verify=options.verify, argv=options.argv, built=built)
    recorder = RunRecorder(out, manifest, flush_every_s=FLUSH_EVERY_S)
    recorder.write_schedule(schedule)
    result.out_dir = out
    return recorder


def close_run(result: RunResult, interrupted: Sequence[str],
              recorder: RunRecorder | None) -> None:
    """Fill ``result.summary`` (end reason, wall times, the signal if any) and write it."""
    from aiogc.harness.summary import summarize

    result.summary = summarize(result.records, end_reasons=result.end_reasons)
    if recorder is not None:
        add_membership(result.summary, recorder.membership())
    if not result.end_reason:
        result.end_reason = run_end_reason(result.end_reasons, interrupted, result.summary)
    result.summary["wall_s"] = result.wall_s
    result.summary["evicted"] = result.evicted
    result.summary["end_reason"] = result.end_reason
    result.summary["interrupted_by"] = interrupted[0] if interrupted else None
    result.summary.update(result.extra_summary)
    if recorder is not None and recorder.write_error is not None:
        result.summary["records_error"] = recorder.write_error
        result.summary["ok"] = False
    # ok only when every round of every scheme completed: never for a stopped run (nor one
    # that ended on an error before its summary); the records are final now
    if interrupted or result.end_reason.startswith("runner error"):
        result.summary["ok"] = False
    result.summary["in_progress"] = False
    if recorder is not None:
        recorder.close(result.summary)


#: The end reason of a run stopped because its records could not be written (then
#: ``summary["records_error"]`` says which file and why).
RECORDS_FAILED = "records could not be written"


def stop_on_write_error(stop: Callable[[str], None]) -> Callable[[str], None]:
    """A recorder's ``on_write_error``: ``stop(reason)`` at the loop's next iteration (the
    failed write may be inside the PS's own event delivery); nothing once the loop is gone."""

    def on_write_error(why: str) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # the run is over: close() reports it
        loop.call_soon(stop, f"{RECORDS_FAILED}: {why}")

    return on_write_error


def plot_run(out_dir: str | Path) -> None:
    try:
        from aiogc.harness.plots import plot_run

        plot_run(out_dir)
    except ImportError as exc:  # the plot extra is optional
        print(f"aiogc: plots skipped ({exc})", file=sys.stderr)


class RunInterrupted(KeyboardInterrupt):
    """SIGINT / SIGTERM stopped :func:`run_live`; ``result`` holds what was recorded."""

    def __init__(self, signal_name: str, result: RunResult) -> None:
        super().__init__(f"run stopped by {signal_name}")
        self.signal_name = signal_name
        self.result = result


def add_membership(summary: dict[str, Any], membership: dict[str, dict[str, Any]]) -> None:
    """Put the recorder's membership (:meth:`~aiogc.harness.records.RunRecorder.membership`)
    into ``summary``: ``membership`` per scheme, and ``shrunk`` -- the schemes that ran a round
    with fewer than m workers, with how many such rounds (empty when none did)."""
    summary["membership"] = membership
    summary["shrunk"] = {name: s["rounds_short"] for name, s in membership.items()
                         if s.get("rounds_short")}


def shrink_line(summary: dict[str, Any]) -> str | None:
    """One line saying which schemes ran rounds with fewer than m workers (None if none)."""
    parts = []
    for name, n in (summary.get("shrunk") or {}).items():
        mem = (summary.get("membership") or {}).get(name, {})
        parts.append(f"{name}: {n} round(s) with fewer than m={mem.get('m')} workers "
                     f"(fewest {mem.get('fewest_workers_present')}, first round "
                     f"{mem.get('first_short_round')})")
    return "; ".join(parts) or None


def run_end_reason(end_reasons: dict[str, str], interrupted: Sequence[str] = (),
                   summary: dict[str, Any] | None = None) -> str:
    """One line saying why a run ended: the signal, the first scheme that ended early, the
    first non-finite failure or failed rounds (with ``summary``), or ``"all rounds done"``."""
    if interrupted:
        return f"stopped by {interrupted[0]}"
    for name, why in end_reasons.items():
        if why != ALL_ROUNDS_DONE:
            return f"{name}: {why}"
    if not end_reasons:
        return "no scheme ran"
    for name, s in (summary or {}).get("schemes", {}).items():
        if s.get("failure"):
            return f"all rounds ran, but {name} failed: {s['failure']}"
        n_failed = s.get("rounds_failed") or 0
        if n_failed:
            first = (s.get("failed_rounds") or [{}])[0]
            return (f"all rounds ran, but {n_failed} of {n_failed + (s.get('rounds') or 0)} "
                    f"{name} rounds failed (first: round {first.get('round')}: "
                    f"{describe_end(first.get('reason'), first.get('detail'))})")
    shrunk = shrink_line(summary or {})
    if shrunk:
        return f"all rounds ran, but {shrunk}"
    return ALL_ROUNDS_DONE


def run_complete(summary: dict[str, Any], requested_rounds: int, *, mode: str = "exact") -> bool:
    """Whether every scheme completed every requested round as configured.

    True only if no round failed, each scheme ran ``requested_rounds`` rounds, no loss or
    decode error was non-finite, and, in exact mode, every round decoded exactly -- except for
    a scheme that decodes approximately by design (ignore-stragglers: it waits for k of the m
    workers and scales their sum), whose approximate rounds are rounds completed as configured.
    """
    schemes = summary.get("schemes", {})
    if not schemes or summary.get("ok") is False:
        return False
    for name, s in schemes.items():
        if s.get("rounds_failed") or s.get("rounds") != requested_rounds or s.get("failure"):
            return False
        if (mode == "exact" and s.get("rounds_exact") != requested_rounds
                and not _approximate_by_design(name)):
            return False
    return True


def _approximate_by_design(label: str) -> bool:
    """Whether scheme ``label``'s waiting rule decodes approximately (its exact mode is
    approximate rounds): the schemes that wait for ``k`` finished workers (``uses_k``)."""
    from aiogc.coding.registry import spec_of_label
    from aiogc.errors import ConfigError

    try:
        return spec_of_label(label).uses_k
    except ConfigError:
        return False


def format_summary(summary: dict[str, Any]) -> str:
    """The summary table printed at the end of a run."""
    rows = [("scheme", "rounds", "mean s", "p50 s", "p95 s", "oracle s", "speedup",
             "max rel err", "final loss")]
    schemes = summary.get("schemes", {})
    base = schemes.get("original", {}).get("round_time_mean_s")

    def f(x: Any, spec: str = ".4f") -> str:
        return "-" if x is None else format(x, spec)

    for name, s in schemes.items():
        mean = s.get("round_time_mean_s")
        speed = base / mean if base and mean else None
        rows.append((name, str(s.get("rounds")), f(mean), f(s.get("round_time_p50_s")),
                     f(s.get("round_time_p95_s")), f(s.get("oracle_time_mean_s")),
                     f(speed, ".2f"), f(s.get("max_rel_decode_error"), ".1e"),
                     f(s.get("final_loss"), ".5g")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    if summary.get("speedup") is not None:
        lines.append(f"speedup (original mean / partial mean): {summary['speedup']:.2f}x")
    for name, s in schemes.items():
        n_failed = s.get("rounds_failed") or 0
        if n_failed:
            listed = s.get("failed_rounds") or []
            lines.append(f"{name}: {n_failed} failed round(s):")
            for fr in listed[:FAILED_ROUNDS_SHOWN]:
                lines.append(f"  round {fr.get('round')}: "
                             f"{describe_end(fr.get('reason'), fr.get('detail'))}")
            if n_failed > min(len(listed), FAILED_ROUNDS_SHOWN):
                lines.append(f"  ... and {n_failed - min(len(listed), FAILED_ROUNDS_SHOWN)} more "
                             "(rounds.csv has every one)")
        if s.get("failure"):
            lines.append(f"{name}: FAILED: {s['failure']}")
        worst = s.get("worst_round")
        if worst and worst.get("rel_error") is not None:
            lines.append(f"{name}: worst round {worst['round']} "
                         f"(rel decode error {worst['rel_error']:.1e})")
        rb = s.get("rounding_bound")
        if rb:  # compressed uploads
            lines.append(f"{name}: 16-bit payload rounding bound {rb['worst']:.1e} worst "
                         f"(round {rb['worst_round']}), median {rb['median']:.1e} "
                         f"(absolute, over {rb['rounds']} rounds)")
    lines += eviction_lines(summary)
    lines += _fidelity_lines(summary.get("fidelity"))
    if summary.get("end_reason"):
        lines.append(f"end reason: {summary['end_reason']}")
    return "\n".join(lines)


def _fidelity_lines(fid: dict[str, Any] | None) -> list[str]:
    """The fidelity verdict in two or three lines (summary.json has the details)."""
    if not fid:
        return []
    ratios = ", ".join(f"{n} {s['ratio']:.2f}" for n, s in fid.get("schemes", {}).items()
                       if s.get("ratio") == s.get("ratio"))  # NaN-free
    k = fid.get("time_scale", 1.0)
    out = [f"fidelity: {fid['verdict']} (live/simulated: {ratios or '-'}; threshold "
           f"{fid['threshold']:.0%}; time scale K={k:g})"]
    out += [f"  {why}" for why in fid.get("reasons", [])]
    out += [f"  warning: {w}" for w in fid.get("warnings", [])]
    choice = fid.get("time_scale_choice")
    if choice:
        out.append(f"  K chosen by --time-scale auto: {choice.get('explanation', '')}")
    return out


def dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str)




class RunnerBackend(Protocol):
    """The seam between :func:`run_schemes` (the skeleton every runner shares) and a backend
    (``harness/local.py``'s loopback processes or coroutines, ``harness/ray_backend.py``'s
    actors). The skeleton validates every scheme's configuration, draws the schedule once,
    runs the schemes in order, stops at the first signal, writes the summary and plots."""

    def prepare(self, config: RunConfig, schedule: DelaySchedule,
                built: Mapping[str, Scheme]) -> RunConfig:
        """Before anything starts: the base configuration the run uses (e.g. its time
        scale); ``built``: the run's schemes by name, built once. The run's resources are
        not held yet."""
        ...

    def session(self, result: RunResult, interrupted: list[str]
                ) -> contextlib.AbstractContextManager[None]:
        """Holds the backend's resources (recorder, cluster, signal handlers) while the
        schemes run; ``interrupted`` collects the names of the signals that stop the run."""
        ...

    def run_scheme(self, cfg: RunConfig, scheme: Scheme, result: RunResult
                   ) -> list[RoundRecord]:
        """Run one scheme (``cfg.scheme``, built as ``scheme``) to its end; its records
        (``result`` takes the end reason, evictions and what else the backend measured)."""
        ...

    def halted(self) -> bool:
        """True once something other than a signal must end the whole run (a failing task, a
        failed write of the records): no further scheme starts."""
        ...

    def close(self, result: RunResult, interrupted: Sequence[str]) -> None:
        """Always, after the schemes ran or failed: the fidelity section, the summary
        (:func:`close_run`), whatever else the backend writes."""
        ...


def run_schemes(config: RunConfig, schemes: Sequence[str], backend: RunnerBackend, *,
                schedule: DelaySchedule | None, out_dir: str | Path | None,
                plots: bool) -> RunResult:
    """The one runner skeleton: each scheme of ``schemes`` over the same schedule, on
    ``backend``.

    Raises
    ------
    RunInterrupted
        (a KeyboardInterrupt) SIGINT or SIGTERM stopped the run: no further scheme started,
        what was recorded is written, ``summary.json`` included (no plots); the exception
        carries the partial result.
    """
    # every scheme's config validated and its scheme built once, before anything starts
    built = {name: scheme_config(config, name).build_scheme() for name in schemes}
    if schedule is None:
        schedule = materialise_for(config, schemes, built=built)
    config = backend.prepare(config, schedule, built)
    result = RunResult(schedule=schedule)
    interrupted: list[str] = []
    try:
        with backend.session(result, interrupted):
            for name in schemes:
                cfg = scheme_config(config, name)
                t0 = time.monotonic()
                result.records[name] = backend.run_scheme(cfg, built[name], result)
                result.wall_s[name] = time.monotonic() - t0
                if interrupted or backend.halted():
                    break  # a signal, a failing task or a failed write: the whole run
    except BaseException as exc:
        # a crash or Ctrl-C outside the PS's own signal handling: still say why in the files
        if not result.end_reason:
            result.end_reason = f"runner error: {type(exc).__name__}: {exc}"
        raise
    finally:
        backend.close(result, interrupted)
    if interrupted:
        # after the records were written; the CLI reports it and exits with 128 + signal
        raise RunInterrupted(interrupted[0], result)
    if out_dir is not None and plots and "records_error" not in result.summary:
        plot_run(out_dir)
    return result
