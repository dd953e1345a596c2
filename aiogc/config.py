"""Run configuration: one validated, frozen value shared by the PS, workers, simulator and CLI.

Every field is checked in ``__post_init__``; a bad value raises :class:`~aiogc.errors.ConfigError`
naming the field, the value and the allowed range. ``to_wire()`` / ``from_wire()`` carry the
configuration to workers inside ``welcome`` (a flat map of scalars), and
:meth:`RunConfig.build_scheme` rebuilds *the same* scheme on every side from the seed, which the
``scheme_digest`` then confirms.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Final

import numpy as np

from aiogc.coding.base import Scheme
from aiogc.coding.compress import CODED_DTYPES, coded_eps, wire_dtype
from aiogc.coding.hetero import parse_factors
from aiogc.coding.ordering_registry import ordering_spec
from aiogc.coding.registry import (
    ASSIGNMENTS,
    DECODINGS,
    SchemeParams,
    SchemeSpec,
    scheme_names,
    scheme_spec,
)
from aiogc.errors import ConfigError

__all__ = ["ASSIGNMENTS", "DECODINGS", "DTYPES", "MAX_WORKERS", "MODES", "UNITS",
           "CommModel", "RunConfig", "parse_bandwidth", "scheme_digest"]

MODES = ("exact", "approx")
#: the run's payload dtypes by name (little-endian numpy dtypes, built once)
_PAYLOAD_DTYPES: Final[dict[str, np.dtype[Any]]] = {"float64": np.dtype("<f8"),
                                                     "float32": np.dtype("<f4")}
DTYPES = tuple(_PAYLOAD_DTYPES)

#: Largest worker count we accept: state vectors and per-worker tables stay small on the wire.
MAX_WORKERS = 4096
#: Largest time dilation (a 10 ms chunk becomes 10 s).
MAX_TIME_SCALE = 1000.0


# ------------------------------------------------------------------ the bandwidth spec


#: Rate units of a bandwidth spec (decimal multiples of bytes per second).
UNITS: dict[str, float] = {"B/s": 1.0, "KB/s": 1e3, "kB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9}
_KEYS = ("worker", "worker_up", "worker_down", "ps")
_VALUE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]+/s)\s*$")
#: Smallest / largest rate accepted (bytes per second).
MIN_RATE, MAX_RATE = 1.0, 1e15


@dataclass(frozen=True)
class CommModel:
    """Link rates in bytes per second; ``None`` is an unlimited link.

    Attributes
    ----------
    up_Bps, down_Bps : float or None
        Every worker's upload / download rate.
    ps_Bps : float or None
        The PS's shared ingress (all uploads cross it).
    """

    up_Bps: float | None = None
    down_Bps: float | None = None
    ps_Bps: float | None = None

    @property
    def limited(self) -> bool:
        """Whether any link has a finite rate."""
        return any(x is not None for x in (self.up_Bps, self.down_Bps, self.ps_Bps))

    def spec(self) -> str:
        """The canonical spec string (``""`` when unlimited)."""
        parts = [f"{k}={_fmt_rate(v)}" for k, v in (("worker_up", self.up_Bps),
                                               ("worker_down", self.down_Bps),
                                               ("ps", self.ps_Bps)) if v is not None]
        return ",".join(parts)


def _fmt_rate(v: float) -> str:
    for unit, mult in (("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if v >= mult:
            return f"{v / mult:g}{unit}"
    return f"{v:g}B/s"


def _rate(key: str, text: str) -> float:
    m = _VALUE.match(text)
    allowed = (f"a rate like 100MB/s: a number in [{MIN_RATE:g}, {MAX_RATE:g}] B/s with unit "
               "B/s, KB/s, MB/s or GB/s (bytes, decimal; Mb/s bits are not accepted)")
    if m is None or m.group(2) not in UNITS:  # case matters: Mb/s would be bits
        raise ConfigError(f"bandwidth.{key}", text, allowed)
    v = float(m.group(1)) * UNITS[m.group(2)]
    if not (math.isfinite(v) and MIN_RATE <= v <= MAX_RATE):
        raise ConfigError(f"bandwidth.{key}", text, allowed)
    return v


def parse_bandwidth(spec: str | None) -> CommModel:
    """Parse ``worker=100MB/s,ps=1GB/s`` into a :class:`CommModel` (ConfigError naming the
    field, its value and the allowed range on bad input). ``None``, ``""`` or ``"none"``:
    unlimited."""
    if spec is None or not str(spec).strip() or str(spec).strip().lower() == "none":
        return CommModel()
    vals: dict[str, float] = {}
    for part in str(spec).split(","):
        key, eq, text = part.partition("=")
        key = key.strip().lower()
        if not eq or key not in _KEYS:
            raise ConfigError("bandwidth", part.strip(),
                              "key=rate pairs with keys " + ", ".join(_KEYS))
        if key in vals:
            raise ConfigError("bandwidth", spec, f"each key once ({key} repeated)")
        vals[key] = _rate(key, text)
    if "worker" in vals and ("worker_up" in vals or "worker_down" in vals):
        raise ConfigError("bandwidth", spec, "worker= or worker_up= / worker_down=, not both")
    return CommModel(up_Bps=vals.get("worker_up", vals.get("worker")),
                     down_Bps=vals.get("worker_down", vals.get("worker")),
                     ps_Bps=vals.get("ps"))



def _check_int(name: str, value: object, lo: int, hi: int) -> None:
    if type(value) is not int or not lo <= value <= hi:
        raise ConfigError(name, value, f"an integer in [{lo}, {hi}]")


def _check_float(name: str, value: object, lo: float, hi: float, *, optional: bool) -> None:
    if value is None and optional:
        return
    allowed = f"a number in ({lo}, {hi}]" + (" or None" if optional else "")
    if type(value) not in (int, float) or isinstance(value, bool):
        raise ConfigError(name, value, allowed)
    v = float(value)  # type: ignore[arg-type]
    if math.isnan(v) or not lo < v <= hi:
        raise ConfigError(name, value, allowed)


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(name, value, "one of " + ", ".join(allowed))


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run (not where it runs).

    Attributes
    ----------
    scheme : str
        A registered scheme (:func:`aiogc.coding.scheme_names`: partial, original, uncoded,
        ignore-stragglers, and whatever else was registered); its spec checks the fields it
        constrains (forced ℓ, accepted assignment / ordering / decoding, ``k``).
    workers : int
        m, number of workers.
    delta : int
        Chunks per worker (replication of the cyclic / regular assignment). Uncoded and
        ignore-stragglers always use one chunk per worker.
    n_parts : int
        ℓ, the communication split; partial needs 1 <= ℓ <= δ, original needs ℓ < δ.
    mode : {"exact", "approx"}
        approx ends each round at ``deadline_s`` with whatever state the PS has.
    k : int or None
        ignore-stragglers: how many finished workers to wait for (default m - (δ - 1)).
    bandwidth : str
        Link rates (:func:`parse_bandwidth`, e.g. ``worker=10MB/s,ps=1GB/s``; ``""``:
        unlimited), in bytes per *emulated* second. Live runs shape their sends to them
        (:mod:`aiogc.net.shaping`: a worker its uplink, the PS each downlink and the shared
        ingress); the simulators charge the same model (:mod:`aiogc.sim.comm`).
    worker_speeds, chunk_sizes : str
        A heterogeneous cluster (:mod:`aiogc.coding.hetero`): ``uniform`` (default) or
        one relative factor per worker / per chunk (``1x6,0.25x2``). A chunk's compute delay
        is the model's draw times its size over its worker's speed; the task's chunks hold
        samples in proportion to the sizes; ``assignment="speed-aware"`` uses both.
    """

    scheme: str = "partial"
    workers: int = 8
    delta: int = 3
    n_parts: int = 1
    assignment: str = "cyclic"
    ordering: str = "optimal"
    decoding: str = "frame"
    k: int | None = None
    mode: str = "exact"
    deadline_s: float | None = None
    rounds: int = 30
    seed: int = 0
    task: str = "linreg"
    delay: str = "exp:0.02"
    latency: str = "none"
    dtype: str = "float64"
    report_every: int = 1
    max_predicted_error: float = 1e-3
    on_ill_conditioned: str = "raise"
    learning_rate: float | None = None
    heartbeat_s: float | None = 1.0
    dead_after_s: float | None = 5.0
    collect_timeout_s: float = 5.0
    round_timeout_s: float = 60.0
    join_timeout_s: float = 30.0
    time_scale: float = 1.0
    coded_dtype: str = "same"
    bandwidth: str = ""
    worker_speeds: str = "uniform"
    chunk_sizes: str = "uniform"

    def __post_init__(self) -> None:
        _check_choice("scheme", self.scheme, scheme_names())
        _check_int("workers", self.workers, 1, MAX_WORKERS)
        _check_int("delta", self.delta, 1, self.workers)
        _check_int("n_parts", self.n_parts, 1, max(1, self.delta))
        _check_choice("assignment", self.assignment, ASSIGNMENTS)
        if self.assignment == "fr" and self.workers % self.delta != 0:
            raise ConfigError(
                "delta", self.delta, f"a divisor of workers={self.workers} for assignment fr"
            )
        ordering_spec(self.ordering)  # an unknown name: ConfigError listing the known ones
        self._check_cluster()
        _check_choice("decoding", self.decoding, DECODINGS)
        if self.k is not None:
            _check_int("k", self.k, 1, self.workers)
        self.spec.check(self._scheme_params())
        _check_choice("mode", self.mode, MODES)
        _check_float("deadline_s", self.deadline_s, 0.0, 1e6, optional=True)
        if self.mode == "approx" and self.deadline_s is None:
            raise ConfigError("deadline_s", None, "a positive number when mode=approx")
        _check_int("rounds", self.rounds, 1, 10**7)
        _check_int("seed", self.seed, 0, 2**63 - 1)
        for name in ("task", "delay", "latency"):
            v = getattr(self, name)
            if type(v) is not str or not v or len(v) > 512:
                raise ConfigError(name, v, "a non-empty spec string of at most 512 chars")
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("coded_dtype", self.coded_dtype, CODED_DTYPES)
        _check_int("report_every", self.report_every, 1, 10**6)
        _check_float("max_predicted_error", self.max_predicted_error, 0.0, 1e6, optional=False)
        _check_choice("on_ill_conditioned", self.on_ill_conditioned, ("raise", "warn"))
        _check_float("learning_rate", self.learning_rate, 0.0, 1e6, optional=True)
        # timeouts: up to an hour each at real time, times the time scale (dilated runs)
        _check_float("time_scale", self.time_scale, 0.0, MAX_TIME_SCALE, optional=False)
        if self.time_scale < 1.0:
            raise ConfigError("time_scale", self.time_scale,
                              f"a number in [1, {MAX_TIME_SCALE:g}]")
        hour = 3600.0 * self.time_scale
        if type(self.bandwidth) is not str or len(self.bandwidth) > 512:
            raise ConfigError("bandwidth", self.bandwidth, "a spec string of at most 512 chars")
        parse_bandwidth(self.bandwidth)  # names the bad key / rate
        _check_float("heartbeat_s", self.heartbeat_s, 0.0, hour, optional=True)
        _check_float("dead_after_s", self.dead_after_s, 0.0, hour, optional=True)
        _check_float("collect_timeout_s", self.collect_timeout_s, 0.0, hour, optional=False)
        _check_float("round_timeout_s", self.round_timeout_s, 0.0, 1e6, optional=False)
        _check_float("join_timeout_s", self.join_timeout_s, 0.0, 1e6, optional=False)
        if self.deadline_s is not None and self.deadline_s >= self.round_timeout_s:
            raise ConfigError("deadline_s", self.deadline_s,
                              f"< round_timeout_s={self.round_timeout_s}")
        # bounded setup: refuse before anything is allocated (PS, and a worker given it in
        # welcome); the module holds no numpy state, so the import is cheap
        from aiogc.coding.registry import check_setup_budget

        check_setup_budget(self.scheme, self.workers, self.delta, self.n_parts)

    def _check_cluster(self) -> None:
        parse_factors(self.worker_speeds, self.workers, field="worker_speeds")
        if parse_factors(self.chunk_sizes, self.workers, field="chunk_sizes") is not None \
                and self.ordering == "adaptive":
            # the schedule scales delays by the chunk at each position of the static orders
            raise ConfigError("chunk_sizes", self.chunk_sizes,
                              "uniform with ordering=adaptive (orders change per round)")

    # ------------------------------------------------------------------ derived values

    @property
    def speeds(self) -> np.ndarray | None:
        """Relative worker speeds, shape (m,); None when uniform."""
        return parse_factors(self.worker_speeds, self.workers, field="worker_speeds")

    @property
    def sizes(self) -> np.ndarray | None:
        """Relative chunk sizes, shape (m,) (N = m chunks); None when uniform."""
        return parse_factors(self.chunk_sizes, self.workers, field="chunk_sizes")

    @property
    def spec(self) -> SchemeSpec:
        """The registry entry of ``scheme``."""
        return scheme_spec(self.scheme)

    @property
    def stragglers_tolerated(self) -> int:
        """Finished workers the scheme's waiting rule may miss: ``m`` minus the fewest it
        decodes with (δ - ℓ for original GC, 0 for uncoded, m - k for ignore-stragglers)."""
        return self.workers - self.spec.min_finished(self._scheme_params())

    @property
    def effective_k(self) -> int:
        """k for schemes with ``uses_k`` (default m - (δ - 1), what original GC waits for)."""
        return self.k if self.k is not None else max(1, self.workers - (self.delta - 1))

    def _scheme_params(self) -> SchemeParams:
        return SchemeParams(m=self.workers, delta=self.delta, n_parts=self.n_parts,
                            assignment=self.assignment, ordering=self.ordering,
                            decoding=self.decoding,
                            k=self.effective_k if self.spec.uses_k else None)

    def for_scheme(self, name: str) -> RunConfig:
        """This configuration for scheme ``name`` of a comparison (its forced ℓ applied)."""
        forced = scheme_spec(name).forced_n_parts
        if forced is not None:
            return self.replace(scheme=name, n_parts=forced)
        return self.replace(scheme=name)

    @property
    def comm(self) -> CommModel:
        """The parsed :attr:`bandwidth` (link rates, bytes per emulated second)."""
        return parse_bandwidth(self.bandwidth)

    @property
    def payload_dtype(self) -> np.dtype:
        """The numpy dtype of :attr:`dtype` (read for every coded vector)."""
        return _PAYLOAD_DTYPES[self.dtype]

    @property
    def coded_wire_dtype(self) -> np.dtype:
        """The coded vectors' dtype on the wire and in the PS's rows (``<f2``; ``<u2`` holding
        bfloat16 bits; else :attr:`payload_dtype`), see :mod:`aiogc.coding.compress`."""
        return wire_dtype(self.coded_dtype, self.payload_dtype)

    @property
    def coded_eps(self) -> float:
        """Machine epsilon of the coded upload (the payload dtype's unless compressed)."""
        return coded_eps(self.coded_dtype, self.payload_dtype)

    def replace(self, **changes: Any) -> RunConfig:
        """A validated copy with ``changes``."""
        return replace(self, **changes)

    def build_scheme(self) -> Scheme:
        """The coding scheme, rebuilt deterministically from ``seed`` (same on every side)."""
        from aiogc.coding import SchemeChoices, make_scheme

        rng = np.random.default_rng([self.seed, 0x5C4E3E])
        return make_scheme(
            self.scheme,
            m=self.workers,
            delta=self.delta,
            n_parts=self.n_parts,
            assignment=self.assignment,
            choices=SchemeChoices(ordering=self.ordering, decoding=self.decoding,
                                  speeds=self.speeds, sizes=self.sizes),
            k=self.effective_k if self.spec.uses_k else None,
            rng=rng,
        )

    # ------------------------------------------------------------------ wire

    def dilated(self) -> RunConfig:
        """This configuration as the PS runs it at ``time_scale`` K: every protocol timeout
        (heartbeat, dead-after, collect, round, join, the approximate-mode deadline) times K.
        The delays are scaled with the schedule (:meth:`DelaySchedule.scaled`). K = 1: self.

        The workers get the dilated timeouts (and K) in ``welcome``, under the config hash,
        so both ends of a connection run on the same emulated clock."""
        k = self.time_scale
        if k == 1.0:
            return self

        def s(x: float | None) -> float | None:
            return None if x is None else x * k

        return replace(self, heartbeat_s=s(self.heartbeat_s), dead_after_s=s(self.dead_after_s),
                       collect_timeout_s=self.collect_timeout_s * k,
                       round_timeout_s=self.round_timeout_s * k,
                       join_timeout_s=self.join_timeout_s * k, deadline_s=s(self.deadline_s))

    def to_wire(self) -> dict[str, Any]:
        """Flat map of scalars for the ``welcome`` message. ``time_scale`` is left out at its
        default 1 (the bytes of a real-time run's welcome are those of protocol v3 before
        time dilation existed); so is ``coded_dtype`` at its default ``same`` (the
        default welcome is byte-identical to the one before compressed payloads), and
        ``bandwidth`` when empty (no traffic shaping)."""
        out = asdict(self)
        if self.time_scale == 1.0:
            del out["time_scale"]
        if self.coded_dtype == "same":
            del out["coded_dtype"]
        if not self.bandwidth:  # likewise: an unshaped run's welcome is unchanged
            del out["bandwidth"]
        for name in ("worker_speeds", "chunk_sizes"):  # the same
            if out[name] == "uniform":
                del out[name]
        return out

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> RunConfig:
        """Inverse of :meth:`to_wire`; unknown keys are a ConfigError (version skew)."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names - {"scheme_digest"})
        if unknown:
            raise ConfigError("config", unknown, "known RunConfig fields")
        # time_scale, coded_dtype, bandwidth: the fields a default welcome leaves out (see to_wire)
        missing = sorted(names - set(data) - _DEFAULTED_ON_WIRE)
        if missing:  # exact schema: a default must not stand in for what the PS meant
            raise ConfigError("config", missing, "every RunConfig field present")
        return cls(**{k: v for k, v in data.items() if k in names})


#: the fields :meth:`RunConfig.to_wire` leaves out at their defaults
_DEFAULTED_ON_WIRE: Final = frozenset({"time_scale", "coded_dtype", "bandwidth", "worker_speeds",
                                       "chunk_sizes"})

#: The timeouts whose default follows the workload (:func:`workload_timeouts`), by flag.
WORKLOAD_TIMEOUTS = ("round_timeout_s", "collect_timeout_s", "join_timeout_s")


def wire_round_s(config: RunConfig, dim: int) -> float:
    """An upper estimate of the seconds one round's bytes need on ``config``'s links (emulated
    seconds; 0 when every link is unlimited): the model down one worker's downlink, its
    uploads up its uplink (``delta`` full gradients for stream-chunks, one full one for the
    uncoded baselines, ``ceil(d / ell)`` values otherwise), and all m workers' uploads through
    the shared PS ingress, each at the payload's item size. A guard, not a prediction: it
    overstates (no overlap, stream-chunks' worst case) rather than understates.

    Parameters
    ----------
    config : RunConfig
    dim : int
        The model's length d.
    """
    comm = config.comm
    if not comm.limited:
        return 0.0
    item = np.dtype(config.dtype).itemsize
    coded_item = 2 if config.coded_dtype != "same" else item
    full = config.scheme in ("uncoded", "ignore-stragglers", "stream-chunks")
    per_upload = dim * (item if full else coded_item) / (1 if full else config.n_parts)
    uploads = config.delta if config.scheme == "stream-chunks" else 1
    t = 0.0
    if comm.down_Bps is not None:
        t += dim * item / comm.down_Bps
    if comm.up_Bps is not None:
        t += uploads * per_upload / comm.up_Bps
    if comm.ps_Bps is not None:
        t += config.workers * uploads * per_upload / comm.ps_Bps
    return t


def workload_timeouts(config: RunConfig, slowest_round_s: float) -> dict[str, float]:
    """Defaults of the timeouts that guard waits on the workload, in emulated seconds (the
    time scale multiplies them later, :meth:`RunConfig.dilated`). One documented hierarchy
    (docs/guide/runs.md, "Timeouts"):

    * ``join_timeout_s = max(30, 0.05 m)``: m workers connect and handshake (about 1 s per
      1024 on one host, measured; 50 ms each leaves a CPU-starved machine 20x headroom);
    * ``round_timeout_s = max(60, 10 S)`` and ``collect_timeout_s = max(5, 2 S)``, where ``S``
      is the slowest worker's whole round in the run's schedule (its 99th percentile over the
      rounds, every chunk of its load): a round that cannot decode is given ten times what the
      slowest honest round takes, a broadcast twice its whole round (each capped at its
      field's maximum: 1e6 s, collect 3600 s). With ``--bandwidth``, ``S`` includes the
      round's bytes on the links (:func:`wire_round_s`): a slow link is workload too.

    Heartbeat (1 s), dead-after (5 s), the PS's authentication deadline (1.9 s) and the
    worker's handshake timeout (10 s) guard liveness, not the workload: fixed, times K.
    """
    s = slowest_round_s if math.isfinite(slowest_round_s) and slowest_round_s > 0 else 0.0
    # each within its field's range (a schedule may hold chunks that never finish in time)
    return {"join_timeout_s": min(1e6, max(30.0, 0.05 * config.workers)),
            "round_timeout_s": min(1e6, max(60.0, 10.0 * s)),
            "collect_timeout_s": min(3600.0, max(5.0, 2.0 * s))}


def scheme_digest(scheme: Scheme) -> str:
    """Hex digest of what every side must agree on: the name, A, the orders and every array
    the scheme draws from the seed (:meth:`~aiogc.coding.base.Scheme.digest_arrays`: B of the
    partial scheme, the encoding tensor E of the fixed codes), so a worker that drew any of
    them differently does not pass the PS-worker check."""
    h = hashlib.sha256()
    h.update(scheme.name.encode())
    h.update(np.ascontiguousarray(scheme.A, dtype=np.uint8).tobytes())
    for o in scheme.orders:
        h.update(np.ascontiguousarray(o, dtype="<i8").tobytes())
        h.update(b"|")
    for name, M in scheme.digest_arrays():
        h.update(name.encode())
        h.update(np.ascontiguousarray(M, dtype="<f8").tobytes())
    return h.hexdigest()[:32]
