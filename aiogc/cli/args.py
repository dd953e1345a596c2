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

#: Where ``aiogc run`` writes when no ``--out`` is given: a new ``runs/<UTC timestamp>`` each
#: time, with the link ``runs/latest`` pointing at it (:func:`new_run_dir`).
RUNS_ROOT = "runs"
#: The files and figures a run writes into its directory (what ``--overwrite`` removes first, so
#: nothing of a previous run is left beside the new one's files).
RUN_FILE_PATTERNS = ("manifest.json", "summary.json", "trace.json", "events.jsonl",
                     "whatif.json", "delays.csv", "delays.json", "rounds.csv", "workers.csv",
                     "reports.csv", "attribution.csv", "nodes.csv", "report.html", "*.png",
                     "*.svg", "*.pdf")

EXIT_OK = 0
EXIT_INCOMPLETE = 1
EXIT_CONFIG = 2
EXIT_UNREACHABLE = 3
#: worker: the PS evicted it (its vectors located as inconsistent; its key refused)
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


def new_run_dir(root: str | Path = RUNS_ROOT) -> Path:
    """A fresh ``ROOT/<UTC timestamp>`` directory, with ``ROOT/latest`` pointing at it.

    Never an existing directory: a second run within the same second gets a ``-2`` suffix.
    """
    import time

    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    d, n = base / stamp, 1
    while True:
        try:
            d.mkdir()
            break
        except FileExistsError:
            n += 1
            d = base / f"{stamp}-{n}"
    latest = base / "latest"
    if latest.is_symlink() or not latest.exists():
        tmp = base / f".latest-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(d.name, target_is_directory=True)
        os.replace(tmp, latest)
    else:
        log.warning("%s is a directory, not a link: left as it is (this run: %s)", latest, d)
    return d


def previous_run_files(path: str | Path) -> list[Path]:
    """The files of an earlier run in directory ``path`` (:data:`RUN_FILE_PATTERNS`)."""
    d = Path(path)
    if not d.is_dir():
        return []
    return sorted({f for pat in RUN_FILE_PATTERNS for f in d.glob(pat) if f.is_file()})


def claim_run_dir(path: str | Path, *, overwrite: bool, flag: str = "out") -> None:
    """Make ``path`` a writable run directory that holds no earlier run's files.

    A directory holding any file a run writes (:data:`RUN_FILE_PATTERNS`) is refused
    (ConfigError naming ``flag``) unless ``overwrite``; then those files are removed first, so
    neither the new run's report nor a reader sees a file the new run did not write.
    """
    old = previous_run_files(path)
    if old and not overwrite:
        raise ConfigError(flag, str(path), "a directory without an earlier run (it holds "
                          f"{len(old)} file(s) of one; --overwrite, overwrite=True in Python, "
                          "replaces them; without --out a run gets a new runs/<timestamp>)")
    for f in old:
        f.unlink()
    _writable_dir(flag, str(path))


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    return v


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
    warn_cautions(config.delay, config.latency)
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


def warn_cautions(delay: str, latency: str | None = None) -> None:
    """Log a warning for each part of the delay specs that is easy to misread
    (:func:`aiogc.training.delays.delay_cautions`)."""
    from aiogc.training.delays import delay_cautions

    for spec, fld in ((delay, "delay"), (latency, "latency")):
        if spec:
            for c in delay_cautions(spec, field=fld):
                log.warning("%s", c)


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
    if path is not None and not Path(path).expanduser().is_file():
        raise ConfigError("task", task, "a task whose data file exists on this worker")
    module = task.partition(":")[0].strip()
    if module in ("torch", "jax"):  # torch:FILE.py:ATTR
        module = task.partition(":")[2].partition(":")[0].strip()
    if kind == "plugin" and module.endswith(".py") and not Path(module).expanduser().is_file():
        raise ConfigError("task", task, "a FILE.py:ATTR plug-in whose file exists on this worker")
