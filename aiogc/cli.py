"""``aiogc`` command line: ``run``, ``ps``, ``worker``, ``simulate``, ``experiment``, ``plot``,
``inspect``, ``report``. ``main(argv) -> int``; configuration errors exit 2 with a message naming
the field, the value and the allowed range.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .config import RunConfig
from .errors import AiogcError, ConfigError

DEFAULT_OUT = "runs/latest"


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
    g.add_argument("--assignment", default=d.assignment, help="cyclic | fr | regular")
    g.add_argument("--ordering", default=d.ordering, help="optimal | natural | random")
    g.add_argument("--decoding", default=d.decoding, help="B construction: frame | gaussian")
    g.add_argument("--k", type=_positive_int, default=None,
                   help="ignore-stragglers: finished workers to wait for (default m-δ+1)")
    g.add_argument("--mode", default=d.mode, help="exact | approx (approx needs --deadline)")
    g.add_argument("--deadline", type=float, default=None,
                   help="approx mode: seconds after round start at which the PS decodes")
    g.add_argument("--rounds", type=_positive_int, default=d.rounds, help="gradient steps")
    g.add_argument("--seed", type=_positive_int, default=d.seed, help="seed of everything")
    g.add_argument("--task", default=d.task,
                   help="linreg[:samples=N,dim=D,noise=S] | logreg:PATH|builtin | module:factory")
    g.add_argument("--delay", default=d.delay,
                   help="per-chunk compute delay model, e.g. exp:0.02, shiftexp:0.01,0.02, "
                        "pareto:2.5, lognormal:-4,0.5, straggle:0.25,5,exp:0.02, "
                        "fail:0.1,exp:0.02, markov:0.1,0.5,5,exp:0.02, replay:delays.csv, none")
    g.add_argument("--latency", default=d.latency,
                   help="per-frame artificial one-way delay of the workers' frames (same syntax)")
    g.add_argument("--dtype", default=d.dtype, help="payload dtype: float64 | float32")
    g.add_argument("--report-every", type=_positive_int, default=d.report_every,
                   help="report the chunk count after every k chunks")
    g.add_argument("--max-predicted-error", type=float, default=d.max_predicted_error,
                   help="refuse a decoding matrix B whose cond(B)*eps(dtype) exceeds this")
    g.add_argument("--on-ill-conditioned", default=d.on_ill_conditioned,
                   help="raise | warn, when --max-predicted-error is exceeded")
    g.add_argument("--lr", type=float, default=None, help="learning rate (default: the task's)")
    g.add_argument("--round-timeout", type=float, default=d.round_timeout_s,
                   help="seconds before a round that cannot decode is declared failed")
    g.add_argument("--collect-timeout", type=float, default=d.collect_timeout_s,
                   help="seconds the PS waits for coded vectors after a broadcast")
    g.add_argument("--heartbeat", type=float, default=d.heartbeat_s,
                   help="seconds of silence after which a worker pings")
    g.add_argument("--dead-after", type=float, default=d.dead_after_s,
                   help="seconds of silence after which a peer is declared dead")
    g.add_argument("--join-timeout", type=float, default=d.join_timeout_s,
                   help="seconds the PS waits for all m workers to join")


def config_from_args(a: argparse.Namespace, scheme: str) -> RunConfig:
    return RunConfig(
        scheme=scheme, workers=a.workers, delta=a.delta, n_parts=a.ell,
        assignment=a.assignment, ordering=a.ordering, decoding=a.decoding, k=a.k,
        mode=a.mode, deadline_s=a.deadline, rounds=a.rounds, seed=a.seed, task=a.task,
        delay=a.delay, latency=a.latency, dtype=a.dtype, report_every=a.report_every,
        max_predicted_error=a.max_predicted_error, on_ill_conditioned=a.on_ill_conditioned,
        learning_rate=a.lr, round_timeout_s=a.round_timeout, collect_timeout_s=a.collect_timeout,
        heartbeat_s=a.heartbeat, dead_after_s=a.dead_after, join_timeout_s=a.join_timeout,
    )


def read_secret(path: str | None) -> bytes | None:
    """--secret-file, else $AIOGC_SECRET, else None."""
    if path:
        data = Path(path).read_bytes().strip()
        if not data:
            raise ConfigError("secret-file", path, "a non-empty file")
        return data
    env = os.environ.get("AIOGC_SECRET")
    return env.encode() if env else None


# ------------------------------------------------------------------ run


def add_run_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="PS + m workers on this machine, schemes side by side",
                       description="Run the schemes live on loopback over one delay schedule.")
    add_run_args(p)
    p.set_defaults(func=cmd_run)


def add_run_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    p.add_argument("--schemes", default="partial,original",
                   help="comma list of partial, original, uncoded, ignore-stragglers")
    p.add_argument("--as", dest="as_", default="processes", help="processes | coroutines")
    p.add_argument("--out", default=DEFAULT_OUT, help="run directory (default %(default)s)")
    p.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                   help="record each round's decode error against the uncoded gradient")
    p.add_argument("--loop", default="uvloop", help="uvloop | asyncio")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar (default: when stderr is a terminal)")
    p.add_argument("--plots", action=argparse.BooleanOptionalAction, default=True,
                   help="write PNGs (needs the plot extra)")


def cmd_run(a: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    from .runner import dump_json, format_summary, run_live

    schemes = [s.strip() for s in a.schemes.split(",") if s.strip()]
    if not schemes:
        raise ConfigError("schemes", a.schemes, "a comma list of scheme names")
    base = config_from_args(a, schemes[0])
    progress = sys.stderr.isatty() if a.progress is None else a.progress
    result = run_live(base, schemes, mode=a.as_, out_dir=a.out, verify=a.verify, loop=a.loop,
                      progress=progress, argv=argv, plots=a.plots)
    print(format_summary(result.summary))
    print(f"run directory: {a.out}")
    if os.environ.get("AIOGC_PRINT_SUMMARY_JSON"):
        print(dump_json(result.summary))
    failed = any(s.get("rounds_failed") for s in result.summary.get("schemes", {}).values())
    return 1 if failed else 0


# ------------------------------------------------------------------ ps / worker


def add_ps_parser(sub: Any) -> None:
    p = sub.add_parser("ps", help="run a parameter server for remote workers",
                       description="Serve one scheme to m workers started with `aiogc worker`.")
    p.add_argument("--host", default="127.0.0.1",
                   help="bind address; a non-loopback address requires a secret")
    p.add_argument("--port", type=int, default=7733, help="TCP port (0 = any free port)")
    p.add_argument("--scheme", default="partial",
                   help="partial | original | uncoded | ignore-stragglers")
    add_config_args(p)
    p.add_argument("--out", default=None, help="directory for summary.json and records")
    p.add_argument("--verify", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--secret-file", default=None, help="shared HMAC secret (or $AIOGC_SECRET)")
    p.add_argument("--loop", default="uvloop", help="uvloop | asyncio")
    p.add_argument("--epoch", type=int, default=None,
                   help="PS epoch (default: derived from the clock, so a restart is new)")
    p.set_defaults(func=cmd_ps)


def cmd_ps(a: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    import time

    from .core import RoundCompleted
    from .net.drivers import PSServer, run_on
    from .records import RunRecorder, summarize
    from .runner import build_manifest, dump_json, format_summary, make_ps, materialise_for

    config = config_from_args(a, a.scheme)
    secret = read_secret(a.secret_file)
    schedule = materialise_for(config, [a.scheme])
    epoch = a.epoch if a.epoch is not None else time.time_ns() // 1_000_000 % (2**52)
    ps, _ = make_ps(config, schedule=schedule, verify=a.verify, secret=secret, epoch=epoch)
    scheme = ps.scheme
    recorder = None
    if a.out:
        recorder = RunRecorder(a.out, build_manifest(config, [a.scheme], schedule,
                                                     mode="remote", loop=a.loop,
                                                     verify=a.verify, argv=argv))
        recorder.write_schedule(schedule)

    def on_event(ev: Any) -> None:
        if isinstance(ev, RoundCompleted):
            r = ev.record
            print(f"round {r.round}: {r.status} in {r.duration_s:.4f} s", file=sys.stderr)
            if recorder is not None:
                recorder.round(a.scheme, r, m=scheme.m, loads=list(scheme.loads),
                               trigger_scheme=not scheme.sends_when_done)

    server = PSServer(ps, host=a.host, port=a.port, on_event=on_event)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.stop, f"signal {sig.name}")
        task_ = asyncio.create_task(server.serve())
        await server.started.wait()
        print(f"aiogc ps listening on {a.host}:{server.port} (epoch {epoch})", file=sys.stderr,
              flush=True)
        await task_

    run_on(a.loop, main())
    summary = summarize({a.scheme: ps.records})
    if recorder is not None:
        recorder.close(summary)
    print(format_summary(summary))
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "summary.json").write_text(dump_json(summary))
    done = len([r for r in ps.records if r.status != "failed"])
    return 0 if done == config.rounds else 1


def add_worker_parser(sub: Any) -> None:
    p = sub.add_parser("worker", help="run one worker against a PS",
                       description="Connect to `aiogc ps`, reconnecting with backoff.")
    p.add_argument("--connect", required=True, help="HOST:PORT of the PS")
    p.add_argument("--id", type=int, required=True, help="worker id in [0, m)")
    p.add_argument("--secret-file", default=None, help="shared HMAC secret (or $AIOGC_SECRET)")
    p.add_argument("--loop", default="uvloop", help="uvloop | asyncio")
    p.add_argument("--give-up-after", type=float, default=30.0,
                   help="seconds without reaching the PS before exiting with an error")
    p.set_defaults(func=cmd_worker)


def cmd_worker(a: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    from .core import Worker
    from .net.drivers import WorkerClient, run_on

    host, _, port = a.connect.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError("connect", a.connect, "HOST:PORT")
    if a.id < 0:
        raise ConfigError("id", a.id, "an integer >= 0")
    client = WorkerClient(Worker(a.id, secret=read_secret(a.secret_file)), host, int(port),
                          give_up_after_s=a.give_up_after)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task_ = asyncio.create_task(client.run())
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task_.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task_

    try:
        run_on(a.loop, main())
    except ConnectionError as exc:
        print(f"aiogc worker: {exc}", file=sys.stderr)
        return 3
    return 0


# ------------------------------------------------------------------ plot / inspect


def add_plot_parsers(sub: Any) -> None:
    p = sub.add_parser("plot", help="regenerate the PNGs of a run directory")
    p.add_argument("run_dir")
    p.add_argument("--out", default=None, help="where to write the PNGs (default: run_dir)")
    p.set_defaults(func=cmd_plot)
    q = sub.add_parser("inspect", help="print what happened in one round, frame by frame")
    q.add_argument("run_dir")
    q.add_argument("--round", type=int, required=True)
    q.add_argument("--scheme", default=None)
    q.set_defaults(func=cmd_inspect)


def cmd_plot(a: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    from .plots import plot_run

    for path in plot_run(a.run_dir, a.out):
        print(path)
    return 0


def cmd_inspect(a: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    from .inspect_run import inspect_round

    print(inspect_round(a.run_dir, a.round, a.scheme))
    return 0


# ------------------------------------------------------------------ report


def add_report_parser(sub: Any) -> None:
    p = sub.add_parser("report", help="one self-contained HTML page for a run or experiment "
                       "directory")
    p.add_argument("dir", help="run directory (aiogc run --out) or experiment directory")
    p.add_argument("--out", default=None, help="HTML file to write (default: DIR/report.html)")
    p.set_defaults(func=cmd_report)


def cmd_report(a: argparse.Namespace) -> int:
    from .report import write_report

    print(write_report(a.dir, a.out))
    return 0


# ------------------------------------------------------------------ main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiogc", description="Gradient coding that leverages partial stragglers.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_parser(sub)
    add_ps_parser(sub)
    add_worker_parser(sub)
    try:
        from .sim import cli as sim_cli

        sim_cli.register(sub)
    except ImportError:  # pragma: no cover - during development only
        pass
    add_plot_parsers(sub)
    add_report_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(args_list)
    try:
        rc = args.func(args, args_list) if _takes_argv(args.func) else args.func(args)
        return int(rc)
    except ConfigError as exc:
        print(f"aiogc: configuration error: {exc}", file=sys.stderr)
        return 2
    except AiogcError as exc:
        print(f"aiogc: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("aiogc: interrupted", file=sys.stderr)
        return 130


def _takes_argv(func: Any) -> bool:
    import inspect

    return len(inspect.signature(func).parameters) >= 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
