"""Every flag of ``aiogc run``, ``ps``, ``worker`` and ``simulate``, declared once.

One row (:class:`Knob`) per concept: its flag, type (the validator argparse calls), default,
unit, help and the commands that take it, with what differs on one command (``simulate``'s
larger defaults, its ``--rounds`` alias ``--trials``) in :attr:`Knob.per`. The parsers are built
from this table (:func:`add_knobs`); the experiment-file keys and the Python keywords
(:mod:`aiogc.api`) are the flags' names, so they follow; every ``--help`` line ends with the
default (and unit). ``tests/test_knobs.py`` fails if one of these commands has a flag that is
not a row here.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["COMMANDS", "Knob", "add_diagnostics", "add_knobs", "knob_table"]

#: The commands whose flags are all rows of the table.
COMMANDS = ("run", "ps", "worker", "simulate")
RUN, PS, WORKER, SIM = (frozenset({c}) for c in COMMANDS)
LIVE = RUN | PS
CONFIG = LIVE | SIM
ALL = frozenset(COMMANDS)

#: Groups of ``--help``, in order.
GROUPS = ("run configuration", "run", "diagnostics")


@dataclass(frozen=True)
class Knob:
    """One flag.

    Attributes
    ----------
    flag : str
        The long flag without dashes; also the experiment-file key and (``-`` as ``_``) the
        Python keyword.
    help : str
        What it sets, without the default (added from :attr:`default`).
    commands : frozenset of str
        The commands that take it.
    type : callable, optional
        The validator: text -> value (argparse's ``type``).
    default : object
        The value when the flag is not given.
    unit : str
        Appended to the default in ``--help`` (``s``, ``x``...).
    shown : str, optional
        How ``--help`` states the default when it is computed later (``None`` defaults).
    action : str or type, optional
        argparse action (``store_true``, ``count``, ``append``, BooleanOptionalAction).
    dest, aliases, metavar, choices, required
        As argparse's.
    group : str
        The ``--help`` section.
    per : mapping
        Command -> fields that differ on that command.
    """

    flag: str
    help: str
    commands: frozenset[str]
    type: Callable[[str], Any] | None = None
    default: Any = None
    unit: str = ""
    shown: str | None = None
    action: Any = None  # str, an argparse.Action class, or None
    dest: str | None = None
    aliases: tuple[str, ...] = ()
    metavar: str | None = None
    choices: tuple[Any, ...] | None = None
    required: bool = False
    group: str = "run"
    per: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def on(self, command: str) -> Knob:
        """This knob as ``command`` has it (its :attr:`per` entry applied)."""
        return replace(self, per={}, **self.per[command]) if command in self.per else self

    def help_text(self) -> str:
        """The ``--help`` line: the help, then the default (and unit)."""
        text = self.help.replace("%", "%%")
        if self.required:
            return text
        if self.action in ("store_true", "count", "append"):
            return text + (f" (default: {self.shown})" if self.shown else "")
        if self.shown is not None:
            shown = self.shown
        elif self.action is argparse.BooleanOptionalAction:
            shown = "on" if self.default else "off"
        else:
            shown = "%(default)s" if self.default not in (None, "") else "none"
        unit = f" {self.unit}" if self.unit and self.default is not None else ""
        return f"{text} (default: {shown}{unit})"


def add_knobs(p: argparse.ArgumentParser, command: str) -> None:
    """Add ``command``'s flags to ``p`` (the diagnostics aside: :func:`add_diagnostics`), each
    marked with its row (``action.knob``)."""
    seen: dict[str, Any] = {}
    for knob in knob_table():
        if command not in knob.commands or knob.group == "diagnostics":
            continue
        k = knob.on(command)
        target = seen.get(k.group)
        if target is None:
            target = p.add_argument_group(k.group) if k.group != "run" else p
            seen[k.group] = target
        _add(target, k)


def add_diagnostics(p: argparse.ArgumentParser) -> None:
    """``-v`` / ``-q`` (every command has them)."""
    g = p.add_argument_group("diagnostics")
    for k in knob_table():
        if k.group == "diagnostics":
            _add(g, k)


def _add(target: Any, k: Knob) -> None:
    default = False if k.action == "store_true" and k.default is None else k.default
    kwargs: dict[str, Any] = {"help": k.help_text(), "default": default}
    if k.action is not None:
        kwargs["action"] = k.action
    if k.type is not None:
        kwargs["type"] = k.type
    for name in ("dest", "metavar", "choices"):
        if getattr(k, name) is not None:
            kwargs[name] = getattr(k, name)
    if k.required:
        kwargs["required"] = True
        del kwargs["default"]
    act = target.add_argument(f"--{k.flag}", *k.aliases, **kwargs)
    act.knob = k


@functools.cache
def knob_table() -> tuple[Knob, ...]:
    """The table (built on first use: its defaults and lists come from the configuration and
    the registries)."""
    from aiogc.cli.args import (
        EXIT_SHRUNK,
        EXIT_UNFAITHFUL,
        _port,
        _positive_int,
        _spare_wait,
        _time_scale,
    )
    from aiogc.coding.ordering_registry import ordering_help
    from aiogc.coding.registry import ASSIGNMENTS, DECODINGS, scheme_names, scheme_spec
    from aiogc.config import DTYPES, MODES, RunConfig
    from aiogc.training.delay_models import delay_usage
    from aiogc.training.tasks import task_usage

    d = RunConfig()
    i = _positive_int
    cfg = "run configuration"
    schemes_help = "comma list of " + ", ".join(scheme_names())
    return (
        # ---------------------------------------------------------------- run configuration
        Knob("workers", "number of workers m", CONFIG, i, d.workers, aliases=("-m",),
             group=cfg, per={"simulate": {"default": 20}}),
        Knob("delta", "chunks per worker δ", CONFIG, i, d.delta, group=cfg,
             per={"simulate": {"default": 4}}),
        Knob("ell", "communication split ℓ, 1 <= ℓ <= δ", CONFIG, i, d.n_parts, group=cfg),
        Knob("assignment", " | ".join(ASSIGNMENTS) + " (speed-aware: faster workers hold "
             "more chunks)", CONFIG, None, d.assignment, group=cfg),
        Knob("ordering", ordering_help(), CONFIG, None, d.ordering, group=cfg),
        Knob("decoding", "B construction: " + " | ".join(DECODINGS), CONFIG, None, d.decoding,
             group=cfg),
        Knob("k", "ignore-stragglers: finished workers to wait for", CONFIG, i, None,
             shown="m-δ+1", group=cfg),
        Knob("mode", " | ".join(MODES) + " (approx needs --deadline)", CONFIG, None, d.mode,
             group=cfg),
        Knob("deadline", "approx mode: seconds after round start at which the PS decodes",
             CONFIG, float, None, unit="s", group=cfg,
             per={"simulate": {"type": None, "help": "approx mode: T1,T2,... seconds after "
                               "round start at which the PS decodes (one result per T)"}}),
        Knob("rounds", "gradient steps", CONFIG, i, d.rounds, group=cfg,
             per={"simulate": {"default": 500, "dest": "trials", "aliases": ("--trials",),
                               "help": "rounds (trials) simulated"}}),
        Knob("seed", "seed of everything", CONFIG, i, d.seed, group=cfg,
             per={"simulate": {"default": 1}}),
        Knob("task", task_usage(), LIVE | WORKER,
             None, d.task, group=cfg,
             per={"worker": {"default": None, "group": "run", "help": "a task this worker "
                             "may build (plug-ins and data files are never taken from the PS "
                             "otherwise): " + task_usage()}}),
        Knob("delay", "per-chunk compute delay model, seconds: " + delay_usage()
             + " (e.g. straggle:0.25,5,exp:0.02)", CONFIG, None, d.delay, group=cfg,
             per={"simulate": {"default": "exp:1.0"}}),
        Knob("latency", "per-frame artificial one-way delay of the workers' frames (the "
             "--delay syntax)", CONFIG, None, d.latency, group=cfg,
             per={"simulate": {"default": "0", "unit": "s", "help": "seconds of one-way "
                               "latency per frame, or a --delay spec for the per-(round, "
                               "worker) network hold"}}),
        Knob("dtype", "payload dtype: " + " | ".join(DTYPES), CONFIG, None, d.dtype, group=cfg),
        Knob("payload-dtype", "coded upload type: same | float16 | bfloat16 (workers round the "
             "coded vector, the PS decodes in float64; docs/coding.md)", CONFIG, None,
             d.coded_dtype, dest="coded_dtype", group=cfg),
        Knob("worker-speeds", "heterogeneous cluster: uniform | one relative speed per worker, "
             "V,V,... or run-length VxK (1x6,0.25x2) | file:PATH (docs/coding.md)", CONFIG,
             None, d.worker_speeds, group=cfg),
        Knob("chunk-sizes", "relative chunk sizes (samples per chunk; the --worker-speeds "
             "syntax); a chunk's delay is its size / its worker's speed", CONFIG, None,
             d.chunk_sizes, group=cfg),
        Knob("report-every", "report the chunk count after every k chunks", LIVE, i,
             d.report_every, unit="chunks", group=cfg),
        Knob("max-predicted-error", "refuse a decoding matrix B whose cond(B)*eps(dtype) "
             "exceeds this", LIVE, float, d.max_predicted_error, group=cfg),
        Knob("on-ill-conditioned", "raise | warn, when --max-predicted-error is exceeded",
             LIVE, None, d.on_ill_conditioned, group=cfg),
        Knob("lr", "learning rate", LIVE, float, None, shown="the task's", group=cfg),
        Knob("round-timeout", "seconds before a round that cannot decode is declared failed",
             LIVE, float, None, shown="max(60, 10 x the slowest worker's round in the "
             "schedule) s", group=cfg),
        Knob("collect-timeout", "seconds the PS waits for coded vectors after a broadcast",
             LIVE, float, None, shown="max(5, 2 x the slowest worker's round in the "
             "schedule) s", group=cfg),
        Knob("heartbeat", "seconds of silence after which a worker pings", LIVE, float,
             d.heartbeat_s, unit="s", group=cfg),
        Knob("dead-after", "seconds of silence after which a peer is declared dead", LIVE,
             float, d.dead_after_s, unit="s", group=cfg),
        Knob("join-timeout", "seconds the PS waits for all m workers to join", LIVE, float,
             None, shown="max(30, 0.05 x m) s", group=cfg),
        Knob("time-scale", "time dilation: every delay and every timeout above times K, "
             "records in emulated seconds (emulates a machine K times faster); auto (aiogc "
             "run): the smallest K this machine keeps faithful, from a short calibration run",
             LIVE, _time_scale, d.time_scale, unit="x", metavar="K|auto", group=cfg),
        Knob("bandwidth", "shape traffic to these link rates, e.g. worker=10MB/s,ps=1GB/s "
             "(keys worker, worker_up, worker_down, ps; units B/s KB/s MB/s GB/s, decimal; "
             "bytes per emulated second)", CONFIG, None, d.bandwidth, metavar="SPEC",
             shown="unlimited", group=cfg,
             per={"simulate": {"default": None, "metavar": None, "help": "link rates, e.g. "
                               "worker=100MB/s,ps=1GB/s (keys worker, worker_up, worker_down, "
                               "ps; units B/s KB/s MB/s GB/s, decimal). Frames are counted at "
                               "their wire size with --dim values; both engines run every "
                               "key (ps=: the shared PS ingress)"}}),
        # ---------------------------------------------------------------- what runs, where
        Knob("config", "read these flags from a TOML file (keys: the long flag names without "
             "dashes); flags given here override it (aiogc.cli.sweep)", RUN, None, None,
             metavar="FILE.toml"),
        Knob("schemes", schemes_help, RUN | SIM, None, "partial,original",
             per={"simulate": {"help": "comma-separated subset of: " + "; ".join(
                 f"{n} (waits for {scheme_spec(n).waiting})" for n in scheme_names())}}),
        Knob("scheme", " | ".join(scheme_names()), PS, None, "partial"),
        Knob("as", "processes | coroutines", RUN, None, "processes", dest="as_"),
        Knob("worker-hosts", "with --as coroutines: run the workers in N worker-host "
             "processes (coroutines sharing one loop each) instead of beside the PS on its "
             "loop", RUN, int, 0, metavar="N"),
        Knob("connection-per-worker", "with --as coroutines and no --worker-hosts: one "
             "connection and loop timer per worker, instead of one shared connection for all "
             "of them (docs/protocol.md 2.6)", RUN | WORKER, action="store_true", shown="off",
             per={"worker": {"help": "with a range of ids: one connection per worker instead "
                             "of one worker-host connection for the whole range "
                             "(docs/protocol.md §2.6)"}}),
        Knob("host", "bind address; a non-loopback address requires a secret", PS, None,
             "127.0.0.1"),
        Knob("port", "TCP port in [0, 65535] (0 = any free port)", PS, _port, 7733),
        Knob("connect", "HOST:PORT of the PS", WORKER, required=True),
        Knob("id", "worker id j in [0, m), or a range A-B (inclusive) of ids to run as "
             "coroutines in this process (needs the master secret)", WORKER, required=True),
        Knob("out", "run directory; one holding an earlier run is refused without "
             "--overwrite", RUN | PS | SIM, None, None, shown="a new runs/<UTC timestamp>, with "
             "runs/latest pointing at it",
             per={"ps": {"help": "directory for summary.json and records", "shown": "no "
                         "files"},
                  "simulate": {"metavar": "DIR", "help": "also write DIR/summary.json (what "
                               "is printed as json) and DIR/results.csv (one row per result)",
                               "shown": "no files"}}
             ),
        Knob("overwrite", "replace the earlier run in --out (its files are removed first)",
             LIVE, action="store_true", shown="off"),
        Knob("pcap", "write the PS's frames to FILE (pcap, synthetic TCP/IPv4 flows; decode "
             "with the Wireshark dissector shipped with aiogc, whose path `python -m "
             "aiogc.protocol.dissector --path` prints; local backend only)", LIVE, None, None,
             metavar="FILE"),
        Knob("spare-wait", "after the vectors decode, wait up to F x the round's elapsed time "
             "for one spare vector so the original scheme's redundancy check can catch a liar "
             "(0: off, the paper's protocol; costs ~+23% round time at F=1 on the virtual "
             "clock; bench/spare_cost.py)", LIVE, _spare_wait, None, metavar="F",
             shown="0 with --verify; 1 with --locate, and for the original scheme with "
                   "--no-verify"),
        Knob("locate", "locate a lying worker from two spare vectors (original scheme, delta - "
             "ell >= 2), decode the round without it, and evict it after N located rounds (0: "
             "never evict; implies two spares and --spare-wait 1 unless given; "
             "docs/security.md)", LIVE, int, None, metavar="N", shown="off"),
        Knob("verify", "record each round's decode error against the uncoded gradient", LIVE,
             action=argparse.BooleanOptionalAction, default=True,
             per={"ps": {"help": "compute the uncoded gradient too: record each round's "
                         "decode error and refuse to apply a gradient that does not match "
                         "it"}}),
        Knob("secret-file", "shared HMAC secret", PS | WORKER, None, None,
             shown="$AIOGC_SECRET"),
        Knob("worker-key-file", "this worker's own key k_j (hex) instead of the master secret",
             WORKER, shown="the master secret"),
        Knob("data-dir", "directory whose data files a logreg:PATH task may name (repeatable)",
             WORKER, action="append", shown="none"),
        Knob("loop", "uvloop | asyncio", LIVE | WORKER, None, "uvloop"),
        Knob("epoch", "PS epoch", PS, int, None, shown="derived from the clock, so a restart "
             "is new"),
        Knob("give-up-after", "seconds without reaching the PS before exiting with an error",
             WORKER, float, 30.0, unit="s"),
        Knob("progress", "progress bar", LIVE, action=argparse.BooleanOptionalAction,
             shown="when stderr is a terminal",
             per={"ps": {"help": "one progress line on stderr (-v logs every round "
                         "instead)"}}),
        Knob("plots", "write PNGs (needs the plot extra)", RUN,
             action=argparse.BooleanOptionalAction, default=True),
        Knob("backend", "local (processes on this machine) | ray (actors on a Ray cluster, "
             "needs the ray extra; see docs/cluster.md)", RUN, None, "local"),
        Knob("address", "--backend ray: auto | HOST:PORT of the cluster's GCS", RUN, None,
             None, shown="start a local Ray instance for this run"),
        Knob("allow-shrink", "exit 0 even if some rounds ran with fewer than m workers (the "
             "summary and stderr still say so)", LIVE, action="store_true",
             shown=f"off: exit {EXIT_SHRUNK}"),
        Knob("fidelity", "report: summary.json's fidelity section and a line on stdout; "
             f"strict: also exit {EXIT_UNFAITHFUL} when the verdict is unfaithful", RUN, None,
             "report", choices=("report", "strict")),
        Knob("fidelity-threshold", "the verdict's tolerance: every live/simulated ratio "
             "within F of 1", RUN, float, 0.10, metavar="F"),
        Knob("dim", "gradient length for the MSE and the frame sizes", SIM, i, 120),
        Knob("engine", "fast (vectorised) or protocol (state machines on the virtual clock)",
             SIM, None, "fast"),
        Knob("format", "what is printed", SIM, None, "json", choices=("json", "table")),
        # ---------------------------------------------------------------- diagnostics
        Knob("verbose", "more diagnostics on stderr (-v: per round, -vv: debug)", ALL,
             action="count", default=0, aliases=("-v",), group="diagnostics",
             shown="warnings only"),
        Knob("quiet", "only errors on stderr (no warnings, no progress line)", ALL,
             action="count", default=0, aliases=("-q",), group="diagnostics",
             shown="off"),
    )
