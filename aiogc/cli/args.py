"""What every ``aiogc`` command shares: the exit codes, logging, the run-configuration flags
and their parsing, secrets and small argument types."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiogc.coding.registry import scheme_names
from aiogc.config import WORKLOAD_TIMEOUTS, RunConfig, wire_round_s, workload_timeouts
from aiogc.errors import ConfigError
from aiogc.harness.assignment_file import resolve_factor_spec
from aiogc.training.cluster import slowdown

DEFAULT_OUT = "runs/latest"

EXIT_OK = 0
EXIT_INCOMPLETE = 1
EXIT_CONFIG = 2
EXIT_UNREACHABLE = 3
#: worker: the PS evicted it (issue 21: its vectors located as inconsistent; its key refused)
EXIT_EVICTED = 4
EXIT_SHRUNK = 5
#: --fidelity strict: the run completed but its fidelity verdict is "unfaithful" (its round
#: times or speedups differ from the simulator's replay of its own schedule by more than the
#: threshold): its timings are not a result
EXIT_UNFAITHFUL = 6
#: run / ps: a write of the run's records failed (a full disk): the run was stopped, its
#: workers told to shut down, and what was written before is kept
EXIT_RECORDS = 8
#: run / ps: a worker's task raised, or returned a non-finite gradient (summary.json's
#: task_error names the worker, the round and the error): the run was stopped
EXIT_TASK = 9


#: Exit status of a run stopped by SIGINT or SIGTERM (both mean "the operator stopped it").
EXIT_STOPPED = 130

#: ``aiogc --help`` / ``aiogc run --help`` (and every command's help) list these: what each
#: exit status means (the module docstring says it at length).
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "done: run / ps: every requested round of every scheme completed as "
              "configured; worker: the PS ended the run after all its rounds"),
    (EXIT_INCOMPLETE, "the run ended early or incompletely (join timeout, failed or non-exact "
                      "rounds, a non-finite loss), a worker whose PS ended early, or an "
                      "internal error"),
    (EXIT_CONFIG, "bad configuration or usage (the message names the flag, value and range)"),
    (EXIT_UNREACHABLE, "worker: the PS was unreachable for --give-up-after seconds or refused "
                       "it for good"),
    (EXIT_EVICTED, "worker: the PS evicted it (its coded vectors were located as inconsistent, "
                   "--locate; its key is refused for the rest of the run)"),
    (EXIT_SHRUNK, "run: every round completed, but some with fewer than m workers "
                  "(--allow-shrink accepts that)"),
    (EXIT_UNFAITHFUL, "run --fidelity strict: every round completed, but the fidelity verdict "
                      "is unfaithful (live round times or speedups off the simulator's replay "
                      "of the run's own schedule by more than --fidelity-threshold)"),
    (EXIT_RECORDS, "run / ps: the run's records could not be written (a full disk or another "
                   "write error, named on stderr and in summary.json's records_error): the "
                   "run was stopped, what was written before is kept"),
    (EXIT_TASK, "run / ps: a worker's task raised or returned a non-finite gradient (worker, "
                "round and error on stderr and in summary.json's task_error): the run was "
                "stopped"),
    (EXIT_STOPPED, "stopped by SIGINT or SIGTERM (run / ps still write summary.json)"),
)

#: The diagnostics logger of the command line (``-v`` / ``-q`` set its level).
log = logging.getLogger("aiogc")


def settle_ok(summary: dict[str, Any], out_dir: str | None, rc: int) -> int:
    """Make ``summary.json`` agree with the exit status ``rc`` and return it: ``exit_code``
    is recorded, and ``ok`` is false whenever ``rc`` is not 0 (a run that shrank, was
    unfaithful under --fidelity strict, ... is not ok). Best effort on a disk that failed."""
    summary["exit_code"] = rc
    if rc != EXIT_OK:
        summary["ok"] = False
    path = Path(out_dir) / "summary.json" if out_dir else None
    if path is not None and path.is_file() and not summary.get("records_error"):
        from aiogc.harness.records import write_json_atomic

        try:
            write_json_atomic(path, summary)
        except OSError as exc:
            print(f"aiogc: summary.json could not be rewritten: {exc.strerror or exc}",
                  file=sys.stderr)
    return rc


def task_line(task_error: dict[str, Any]) -> str:
    """The stderr line of a run stopped by a failing task (``summary["task_error"]``)."""
    worker = task_error.get("worker")
    who = "on the PS" if worker == "PS" else f"on worker {worker}"
    return (f"the task failed {who}, round {task_error.get('round')} "
            f"({task_error.get('scheme')}): {task_error.get('error')}; the run was stopped")


def exit_codes_epilog() -> str:
    """The ``exit codes:`` section of the help texts, from :data:`EXIT_CODES`."""
    import textwrap

    lines = ["exit codes:"]
    lines += [textwrap.fill(text, 79, initial_indent=f"  {code:<4} ", subsequent_indent=" " * 7)
              for code, text in EXIT_CODES]
    return "\n".join(lines)


def _help_with_exit_codes(p: argparse.ArgumentParser) -> None:
    """Make ``p --help`` end with the exit codes (kept as written: one per line)."""
    p.epilog = exit_codes_epilog()
    p.formatter_class = argparse.RawDescriptionHelpFormatter


def add_log_args(p: argparse.ArgumentParser) -> None:
    """``-v`` / ``-q``: more or fewer diagnostics on stderr (stdlib logging)."""
    g = p.add_argument_group("diagnostics")
    g.add_argument("-v", "--verbose", action="count", default=0,
                   help="more diagnostics on stderr (-v: per round, -vv: debug)")
    g.add_argument("-q", "--quiet", action="count", default=0,
                   help="only errors on stderr (no warnings, no progress line)")


def setup_logging(verbose: int = 0, quiet: int = 0) -> None:
    """Route the ``aiogc`` logger to stderr at WARNING, -v INFO, -vv DEBUG, -q ERROR."""
    level = (logging.ERROR if quiet else logging.WARNING if not verbose
             else logging.INFO if verbose == 1 else logging.DEBUG)
    log.setLevel(level)
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        log.addHandler(handler)
    log.propagate = False


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler writing to whatever ``sys.stderr`` is when a record is emitted."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _signal_exit(name: str) -> int:
    """The exit status after a stop signal: 130 for SIGINT and SIGTERM alike."""
    return EXIT_STOPPED


def _port(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port={s!r} is not an integer in [0, 65535]") from None
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"port={v} is out of range: expected an integer in "
                                         "[0, 65535] (0 = any free port)")
    return v


def _writable_dir(flag: str, path: str) -> None:
    """Create ``path`` if needed and check a file can be written there, or raise ConfigError."""
    d = Path(path)
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / ".aiogc-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(flag, path, f"a writable directory ({exc.strerror or exc})") from None


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    return v


def add_config_args(p: argparse.ArgumentParser, *, defaults: RunConfig | None = None) -> None:
    """Flags shared by ``run`` and ``ps`` (everything that defines the run)."""
    d = defaults or RunConfig()
    g = p.add_argument_group("run configuration")
    g.add_argument("--workers", "-m", type=_positive_int, default=d.workers,
                   help="number of workers m (default %(default)s)")
    g.add_argument("--delta", type=_positive_int, default=d.delta,
                   help="chunks per worker δ (default %(default)s)")
    g.add_argument("--ell", type=_positive_int, default=d.n_parts,
                   help="communication split ℓ, 1 <= ℓ <= δ (default %(default)s)")
    g.add_argument("--assignment", default=d.assignment,
                   help="cyclic | fr | regular | speed-aware (faster workers hold more chunks)")
    g.add_argument("--ordering", default=d.ordering,
                   help="optimal | natural | random | adaptive (partial: speed-aware orders "
                   "chosen by the PS each round)")
    g.add_argument("--decoding", default=d.decoding, help="B construction: frame | gaussian")
    g.add_argument("--k", type=_positive_int, default=None,
                   help="ignore-stragglers: finished workers to wait for (default m-δ+1)")
    g.add_argument("--mode", default=d.mode, help="exact | approx (approx needs --deadline)")
    g.add_argument("--deadline", type=float, default=None,
                   help="approx mode: seconds after round start at which the PS decodes")
    g.add_argument("--rounds", type=_positive_int, default=d.rounds, help="gradient steps")
    g.add_argument("--seed", type=_positive_int, default=d.seed, help="seed of everything")
    g.add_argument("--task", default=d.task,
                   help="linreg[:samples=N,dim=D,noise=S] | logreg:PATH|builtin | module:factory "
                        "| torch:module:factory[,optimizer=sgd|adam][,lr=F] | jax:...")
    g.add_argument("--delay", default=d.delay,
                   help="per-chunk compute delay model, e.g. exp:0.02, shiftexp:0.01,0.02, "
                        "pareto:2.5, lognormal:-4,0.5, straggle:0.25,5,exp:0.02, "
                        "fail:0.1,exp:0.02, markov:0.1,0.5,5,exp:0.02, replay:delays.csv, none")
    g.add_argument("--latency", default=d.latency,
                   help="per-frame artificial one-way delay of the workers' frames (same syntax)")
    g.add_argument("--dtype", default=d.dtype, help="payload dtype: float64 | float32")
    g.add_argument("--payload-dtype", default=d.coded_dtype, dest="coded_dtype",
                   help="coded upload type: same (default) | float16 | bfloat16 (workers round "
                        "the coded vector, the PS decodes in float64; docs/coding.md)")
    g.add_argument("--worker-speeds", default=d.worker_speeds,
                   help="heterogeneous cluster: uniform | one relative speed per worker, "
                        "V,V,... or run-length VxK (1x6,0.25x2) | file:PATH (docs/coding.md)")
    g.add_argument("--chunk-sizes", default=d.chunk_sizes,
                   help="relative chunk sizes (samples per chunk; same syntax as "
                        "--worker-speeds); a chunk's delay is its size / its worker's speed")
    g.add_argument("--report-every", type=_positive_int, default=d.report_every,
                   help="report the chunk count after every k chunks")
    g.add_argument("--max-predicted-error", type=float, default=d.max_predicted_error,
                   help="refuse a decoding matrix B whose cond(B)*eps(dtype) exceeds this")
    g.add_argument("--on-ill-conditioned", default=d.on_ill_conditioned,
                   help="raise | warn, when --max-predicted-error is exceeded")
    g.add_argument("--lr", type=float, default=None, help="learning rate (default: the task's)")
    g.add_argument("--round-timeout", type=float, default=None,
                   help="seconds before a round that cannot decode is declared failed "
                        "(default: max(60, 10 x the slowest worker's round in the schedule))")
    g.add_argument("--collect-timeout", type=float, default=None,
                   help="seconds the PS waits for coded vectors after a broadcast "
                        "(default: max(5, 2 x the slowest worker's round in the schedule))")
    g.add_argument("--heartbeat", type=float, default=d.heartbeat_s,
                   help="seconds of silence after which a worker pings")
    g.add_argument("--dead-after", type=float, default=d.dead_after_s,
                   help="seconds of silence after which a peer is declared dead")
    g.add_argument("--join-timeout", type=float, default=None,
                   help="seconds the PS waits for all m workers to join "
                        "(default: max(30, 0.05 x m))")
    g.add_argument("--time-scale", type=_time_scale, default=d.time_scale, metavar="K|auto",
                   help="time dilation: every delay and every timeout above times K, records "
                        "in emulated seconds (emulates a machine K times faster); auto "
                        "(aiogc run): the smallest K this machine keeps faithful, from a "
                        "short calibration run (default 1)")
    g.add_argument("--bandwidth", default=d.bandwidth, metavar="SPEC",
                   help="shape live traffic to these link rates, e.g. worker=10MB/s,ps=1GB/s "
                        "(keys worker, worker_up, worker_down, ps; units B/s KB/s MB/s GB/s, "
                        "decimal; bytes per emulated second; default unlimited): see "
                        "aiogc simulate --bandwidth")


def _spare_wait(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"spare-wait={s!r}: expected a number in [0, 100]") \
            from None
    if not 0.0 <= v <= 100.0:
        raise argparse.ArgumentTypeError(f"spare-wait={v:g} is out of range: expected a "
                                         "number in [0, 100]")
    return v


def _time_scale(s: str) -> float | str:
    if s == "auto":
        return s
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"time-scale={s!r}: expected auto or a number in [1, 1000]") from None
    if not 1.0 <= v <= 1000.0:
        raise argparse.ArgumentTypeError(f"time-scale={v:g} is out of range: expected auto or "
                                         "a number in [1, 1000]")
    return v


def config_from_args(a: argparse.Namespace, scheme: str) -> RunConfig:
    """The run's configuration; a timeout flag not given takes its workload default
    (:func:`aiogc.config.workload_timeouts`, from the schedule the run draws: same delay law,
    seed and m; as wide as ``scheme``'s largest load)."""
    config = _config_from_flags(a, scheme)
    unset = [f for f in WORKLOAD_TIMEOUTS if getattr(a, _TIMEOUT_FLAGS[f]) is None]
    if not unset:
        return config
    from aiogc.harness.kit import materialise_for

    schedule = materialise_for(config, [scheme])
    slowest = schedule.slowest_round_s() * slowdown(config)
    if config.comm.limited:  # the round's bytes on the links are workload too
        from aiogc.training.tasks import make_task

        dim = int(make_task(config.task, config.build_scheme().n_chunks, config.seed).dim)
        slowest += wire_round_s(config, dim)
    derived = workload_timeouts(config, slowest)
    return config.replace(**{f: derived[f] for f in unset})


#: RunConfig field -> argparse dest of its flag
_TIMEOUT_FLAGS = {"round_timeout_s": "round_timeout", "collect_timeout_s": "collect_timeout",
                  "join_timeout_s": "join_timeout"}


def _config_from_flags(a: argparse.Namespace, scheme: str) -> RunConfig:
    d = RunConfig()
    return RunConfig(
        scheme=scheme, workers=a.workers, delta=a.delta, n_parts=a.ell,
        assignment=a.assignment, ordering=a.ordering, decoding=a.decoding, k=a.k,
        mode=a.mode, deadline_s=a.deadline, rounds=a.rounds, seed=a.seed, task=a.task,
        delay=a.delay, latency=a.latency, dtype=a.dtype, report_every=a.report_every,
        coded_dtype=a.coded_dtype,
        worker_speeds=resolve_factor_spec(a.worker_speeds, field="worker_speeds"),
        chunk_sizes=resolve_factor_spec(a.chunk_sizes, field="chunk_sizes"),
        max_predicted_error=a.max_predicted_error, on_ill_conditioned=a.on_ill_conditioned,
        learning_rate=a.lr,
        round_timeout_s=d.round_timeout_s if a.round_timeout is None else a.round_timeout,
        collect_timeout_s=d.collect_timeout_s if a.collect_timeout is None else a.collect_timeout,
        heartbeat_s=a.heartbeat, dead_after_s=a.dead_after,
        join_timeout_s=d.join_timeout_s if a.join_timeout is None else a.join_timeout,
        time_scale=1.0 if a.time_scale == "auto" else float(a.time_scale),
        bandwidth=getattr(a, "bandwidth", d.bandwidth) or "",
    )


def read_secret(path: str | None) -> bytes | None:
    """--secret-file, else $AIOGC_SECRET, else None."""
    if path:
        try:
            data = Path(path).read_bytes().strip()
        except OSError as exc:
            raise ConfigError("secret-file", path,
                              f"a readable, non-empty file ({exc.strerror or exc})") from None
        if not data:
            raise ConfigError("secret-file", path, "a non-empty file")
        return data
    env = os.environ.get("AIOGC_SECRET")
    return env.encode() if env else None

def _live_only(schemes: Sequence[str]) -> None:
    """Refuse schemes the protocol core cannot run (``SchemeSpec.live`` false)."""
    from aiogc.coding.registry import scheme_spec

    for name in schemes:
        if name in scheme_names() and not scheme_spec(name).live:
            raise ConfigError("schemes", name, "a scheme the protocol can run live: " + ", ".join(
                n for n in scheme_names() if scheme_spec(n).live) + f" ({name} runs in "
                "`aiogc simulate --engine fast` only; docs/protocol.md §1.5)")

def _check_local_task_files(task: str | None, data_dirs: Sequence[str]) -> None:
    """Fail at once, naming the flag, when a file or directory this worker's own command line
    names is missing (rather than after connecting, where it would look like a PS problem)."""
    from aiogc.training.tasks import task_kind

    for d in data_dirs:
        if not Path(d).expanduser().is_dir():
            raise ConfigError("data-dir", d, "an existing directory on this worker")
    if task is None:
        return
    kind, path = task_kind(task)
    if kind == "logreg-file" and path is not None and not Path(path).expanduser().is_file():
        raise ConfigError("task", task, "a logreg:PATH whose data file exists on this worker")
    module = task.partition(":")[0].strip()
    if module in ("torch", "jax"):  # torch:FILE.py:ATTR
        module = task.partition(":")[2].partition(":")[0].strip()
    if kind == "plugin" and module.endswith(".py") and not Path(module).expanduser().is_file():
        raise ConfigError("task", task, "a FILE.py:ATTR plug-in whose file exists on this worker")


def add_spare_wait_arg(p: argparse.ArgumentParser) -> None:
    """``--spare-wait F`` and ``--locate N`` (run and ps)."""
    p.add_argument("--spare-wait", type=_spare_wait, default=None, metavar="F",
                   help="after the vectors decode, wait up to F x the round's elapsed time for "
                        "one spare vector so the original scheme's redundancy check can "
                        "catch a liar (default 0, the paper's protocol, with --verify; 1 with "
                        "--locate, and for the original scheme with --no-verify; costs ~+23%% "
                        "round time at F=1 on the virtual clock; --spare-wait 0 turns it off)")
    p.add_argument("--locate", type=int, default=None, metavar="N",
                   help="locate a lying worker from two spare vectors (original scheme, "
                        "delta - ell >= 2), decode the round without it, and evict it after N "
                        "located rounds (0: never evict; implies two spares and --spare-wait 1 "
                        "unless given; docs/security.md)")
