"""Straggler / delay models, their spec strings, and :func:`materialise` (a run's schedule).

Two kinds of delay act on a round of gradient coding:

* **compute delay** ``compute_s[r, j, k]``: seconds worker ``j`` spends on the ``k``-th chunk it
  computes in round ``r``. Indexed by *position* in the worker's processing order, not by chunk
  id, so every scheme in a comparison sees the same slow workers whatever its ordering.
* **network delay** ``network_s[r, j]``: one-way seconds added to every frame worker ``j`` sends
  in round ``r``.

Invariants
----------
* Every delay is a float64 ``>= 0`` or ``+inf``; never NaN.
* ``+inf`` marks a dead worker: a worker whose ``k``-th chunk is ``inf`` never finishes that chunk
  nor any later one in that round (the cumulative sum stays ``inf``). A worker is *dead in round
  r* when its first chunk is ``inf``.
* A schedule is drawn once, up front, from a seed (:func:`materialise`), so every scheme in a
  comparison sees the same stragglers and any run can be replayed from ``delays.csv``.
* Compute and network delays come from independent streams spawned from the seed
  (:class:`numpy.random.SeedSequence`), so changing the latency model leaves compute delays
  unchanged, and vice versa.
* No global randomness and no clock: models take an ``rng: np.random.Generator``.

Spec strings (CLI flags ``--delay`` and ``--latency``)
-----------------------------------------------------
Numbers are seconds unless noted. Base models, drawn i.i.d. per (round, worker, chunk):

``none``
    zero delay.
``const:T``
    exactly ``T >= 0``.
``exp:MEAN``
    exponential with mean ``MEAN > 0``.
``shiftexp:SHIFT,MEAN``
    ``SHIFT + Exp(MEAN)``; ``SHIFT >= 0``, ``MEAN > 0``.
``pareto:ALPHA[,SCALE]``
    classic (type I) Pareto with shape ``ALPHA > 0`` and minimum ``x_m = SCALE > 0``: the density
    is ``ALPHA x_m^ALPHA / x^(ALPHA+1)`` on ``x >= x_m``. When ``SCALE`` is omitted the scale is
    chosen so that the **mean is 1 second**, ``x_m = (ALPHA - 1) / ALPHA``, which needs
    ``ALPHA > 1``.
``lognormal:MU,SIGMA``
    ``exp(N(MU, SIGMA^2))``; ``SIGMA >= 0``.

Combinators wrap a base model ``BASE`` (any spec, itself possibly a combinator; it is the text
after the combinator's fixed number of parameters, so it may contain commas):

``straggle:FRAC,FACTOR,BASE``
    *persistent partial stragglers*: ``round(FRAC * m)`` workers (round half up), chosen once with
    the seed, have every delay multiplied by ``FACTOR > 0`` in every round.
    ``FRAC`` in ``[0, 1]``. Example: ``straggle:0.25,5,exp:0.02``.
``fail:FRAC,BASE``
    *i.i.d. failures*: in each round, independently, exactly ``round(FRAC * m)`` workers chosen
    uniformly at random are dead (all their delays ``inf``).
``fail:FRAC@K,BASE``
    *permanent failures*: ``round(FRAC * m)`` workers chosen once are dead from round ``K``
    (0-based, ``K >= 0``) on; alive before.
``markov:P_SLOW,P_RECOVER,FACTOR,BASE``
    *two-state bursts*: every worker is fast or slow in each round; fast -> slow with probability
    ``P_SLOW``, slow -> fast with ``P_RECOVER`` between consecutive rounds; the state in round 0 is
    drawn from the stationary law (slow with probability ``P_SLOW / (P_SLOW + P_RECOVER)``, fast
    if both are 0). A slow worker's delays are multiplied by ``FACTOR > 0`` in that round.

Replay:

``replay:PATH``
    the schedule recorded in ``PATH`` (a ``delays.csv`` written by :meth:`DelaySchedule.to_csv`).
    Used as ``--delay`` it replays the compute column, as ``--latency`` the network column. The
    recording must have the requested number of workers and at least the requested rounds and
    chunk positions (extra rounds / positions are ignored); **fewer rounds raise ConfigError**
    rather than cycling, because silently repeating stragglers would bias a comparison.

Fail-slow traces:

``trace:FILE[,BASE]``
    slow-downs by time window and worker set, read from ``FILE`` (lines
    ``start,end,workers,factor``, see :class:`Trace`), applied on top of ``BASE``: every chunk a
    worker of ``workers`` *starts* in the window ``[start, end)`` takes ``factor`` times its
    ``BASE`` delay (``factor = inf``: the worker is dead from that chunk on, fail-stop). Times
    are **schedule seconds**: the clock on which round ``r`` starts when round ``r - 1``'s
    slowest worker finished all its chunk positions (the sum of its finite delays, slow-downs
    included), and a worker's ``k``-th chunk starts when its previous ones are done. ``BASE`` is
    the spec after the first comma, or else a ``# base=SPEC`` line of the file. Example:
    ``trace:slow.csv,exp:0.02``.

Combinators draw their own choices (which workers straggle, fail or burst) from a stream
independent of the base model's, so changing ``BASE`` does not change who straggles.

Known imperfections: compute delays of a chunk do not depend on the chunk's size or on the model;
network delay is per (round, worker), the same for every frame of that round.
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from aiogc.errors import ConfigError
from aiogc.training.schedule import DelaySchedule

# DelaySchedule (defined in schedule.py: what materialise returns, what Replay replays) is
# re-exported: harness/kit.py imports it from here.
__all__ = [
    "Constant",
    "DelayModel",
    "DelaySchedule",
    "Exponential",
    "Failures",
    "LogNormal",
    "MarkovBursts",
    "NoDelay",
    "Pareto",
    "Replay",
    "ShiftedExponential",
    "Stragglers",
    "Trace",
    "materialise",
    "parse_delay",
    "read_trace",
]

#: Refuse to materialise more delay cells than this (R * m * K): 8 bytes each, so 800 MB. A
#: larger request is almost surely a typo in rounds / workers / chunks.
MAX_SCHEDULE_CELLS: Final = 100_000_000


# --------------------------------------------------------------------------- models


class DelayModel(ABC):
    """A law of per-chunk delays.

    Subclasses implement :meth:`sample`; ``spec`` is the canonical string :func:`parse_delay`
    rebuilds the model from.
    """

    spec: str

    @abstractmethod
    def sample(self, rng: np.random.Generator, rounds: int, m: int, max_chunks: int) -> np.ndarray:
        """Draw delays for a whole run.

        Parameters
        ----------
        rng : numpy.random.Generator
            The only source of randomness.
        rounds, m, max_chunks : int
            Shape of the result: rounds R, workers m, chunk positions K.

        Returns
        -------
        numpy.ndarray
            Shape ``(R, m, K)``, float64 seconds ``>= 0``; ``np.inf`` marks a dead worker.
        """

    def sample_network(self, rng: np.random.Generator, rounds: int, m: int) -> np.ndarray:
        """Draw one network delay per (round, worker): shape ``(R, m)`` float64 seconds."""
        return self.sample(rng, rounds, m, 1)[:, :, 0]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"


@dataclass(frozen=True, repr=False)
class NoDelay(DelayModel):
    """Zero delay everywhere (``none``)."""

    spec: str = field(default="none", init=False)

    def sample(self, rng: np.random.Generator, rounds: int, m: int, max_chunks: int) -> np.ndarray:
        return np.zeros((rounds, m, max_chunks))


@dataclass(frozen=True, repr=False)
class Constant(DelayModel):
    """Exactly ``seconds`` per chunk (``const:T``)."""

    seconds: float
    spec: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "spec", f"const:{self.seconds!r}")

    def sample(self, rng: np.random.Generator, rounds: int, m: int, max_chunks: int) -> np.ndarray:
        return np.full((rounds, m, max_chunks), float(self.seconds))


@dataclass(frozen=True, repr=False)
class Exponential(DelayModel):
    """Exponential delays with the given mean (``exp:MEAN``)."""

    mean: float
    spec: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "spec", f"exp:{self.mean!r}")

    def sample(self, rng: np.random.Generator, rounds: int, m: int, max_chunks: int) -> np.ndarray:
        return rng.exponential(self.mean, size=(rounds, m, max_chunks))


@dataclass(frozen=True, repr=False)
class ShiftedExponential(DelayModel):
    """``shift + Exp(mean)`` (``shiftexp:SHIFT,MEAN``)."""

    shift: float
    mean: float
    spec: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "spec", f"shiftexp:{self.shift!r},{self.mean!r}")

    def sample(self, rng: np.random.Generator, rounds: int, m: int, max_chunks: int) -> np.ndarray:
        return self.shift + rng.exponential(self.mean, size=(rounds, m, max_chunks))


@dataclass(frozen=True, repr=False)
class Pareto(DelayModel):
    """Classic Pareto with shape ``alpha`` and minimum ``scale`` (``pareto:ALPHA[,SCALE]``).

    With ``scale=None`` the minimum is ``(alpha - 1) / alpha`` so that the mean is 1 s.
    """

    alpha: float
    scale: float | None = None
    spec: str = field(init=False)

    def __post_init__(self) -> None:
        tail = "" if self.scale is None else f",{self.scale!r}"
        object.__setattr__(self, "spec", f"pareto:{self.alpha!r}{tail}")

    @property
    def x_m(self) -> float:
        """The minimum value (scale) actually used, seconds."""
        if self.scale is None:
            return (self.alpha - 1.0) / self.alpha
        return self.scale

    def sample(self, rng: np.random.Generator, rounds: int, m: int, max_chunks: int) -> np.ndarray:
        # numpy's pareto() is the Lomax law (classic Pareto with x_m = 1, minus 1).
        return self.x_m * (1.0 + rng.pareto(self.alpha, size=(rounds, m, max_chunks)))


@dataclass(frozen=True, repr=False)
class LogNormal(DelayModel):
    """``exp(N(mu, sigma^2))`` (``lognormal:MU,SIGMA``)."""

    mu: float
    sigma: float
    spec: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "spec", f"lognormal:{self.mu!r},{self.sigma!r}")

    def sample(self, rng: np.random.Generator, rounds: int, m: int, max_chunks: int) -> np.ndarray:
        return rng.lognormal(self.mu, self.sigma, size=(rounds, m, max_chunks))


def _count(frac: float, m: int) -> int:
    """``round(frac * m)`` with halves rounded up (Python's round() is banker's rounding)."""
    return min(m, math.floor(frac * m + 0.5))


@dataclass(frozen=True, repr=False)
class Stragglers(DelayModel):
    """Persistent partial stragglers (``straggle:FRAC,FACTOR,BASE``).

    ``round(frac * m)`` workers, chosen once per :meth:`sample` call, have every delay of
    ``base`` multiplied by ``factor``.
    """

    frac: float
    factor: float
    base: DelayModel
    spec: str = field(init=False)

    def __post_init__(self) -> None:
        spec = f"straggle:{self.frac!r},{self.factor!r},{self.base.spec}"
        object.__setattr__(self, "spec", spec)

    def stragglers(self, rng: np.random.Generator, m: int) -> np.ndarray:
        """The straggling workers for a given choice stream: sorted int array of length
        ``round(frac * m)``."""
        return np.sort(rng.choice(m, size=_count(self.frac, m), replace=False))

    def sample(self, rng: np.random.Generator, rounds: int, m: int, max_chunks: int) -> np.ndarray:
        choice_rng, base_rng = rng.spawn(2)
        slow = self.stragglers(choice_rng, m)
        out = self.base.sample(base_rng, rounds, m, max_chunks)
        out[:, slow, :] *= self.factor
        return out


@dataclass(frozen=True, repr=False)
class Failures(DelayModel):
    """Dead workers (``fail:FRAC,BASE`` or ``fail:FRAC@K,BASE``).

    With ``from_round=None`` exactly ``round(frac * m)`` workers, drawn independently in each
    round, are dead in that round. With ``from_round=K`` the same ``round(frac * m)`` workers,
    chosen once, are dead in every round ``r >= K``. Dead means every chunk delay is ``inf``.
    """

    frac: float
    base: DelayModel
    from_round: int | None = None
    spec: str = field(init=False)

    def __post_init__(self) -> None:
        at = "" if self.from_round is None else f"@{self.from_round}"
        object.__setattr__(self, "spec", f"fail:{self.frac!r}{at},{self.base.spec}")

    def dead_mask(self, rng: np.random.Generator, rounds: int, m: int) -> np.ndarray:
        """Which workers are dead: bool array of shape ``(R, m)``."""
        k = _count(self.frac, m)
        dead = np.zeros((rounds, m), dtype=bool)
        if self.from_round is None:
            for r in range(rounds):
                dead[r, rng.choice(m, size=k, replace=False)] = True
        else:
            who = rng.choice(m, size=k, replace=False)
            dead[self.from_round :, who] = True
        return dead

    def sample(self, rng: np.random.Generator, rounds: int, m: int, max_chunks: int) -> np.ndarray:
        choice_rng, base_rng = rng.spawn(2)
        dead = self.dead_mask(choice_rng, rounds, m)
        out = self.base.sample(base_rng, rounds, m, max_chunks)
        out[dead, :] = np.inf
        return out


@dataclass(frozen=True, repr=False)
class MarkovBursts(DelayModel):
    """Two-state (fast/slow) Markov bursts per worker across rounds
    (``markov:P_SLOW,P_RECOVER,FACTOR,BASE``)."""

    p_slow: float
    p_recover: float
    factor: float
    base: DelayModel
    spec: str = field(init=False)

    def __post_init__(self) -> None:
        spec = f"markov:{self.p_slow!r},{self.p_recover!r},{self.factor!r},{self.base.spec}"
        object.__setattr__(self, "spec", spec)

    @property
    def stationary_slow(self) -> float:
        """Long-run fraction of rounds a worker spends slow."""
        total = self.p_slow + self.p_recover
        return 0.0 if total == 0 else self.p_slow / total

    def slow_mask(self, rng: np.random.Generator, rounds: int, m: int) -> np.ndarray:
        """Slow state per (round, worker): bool array of shape ``(R, m)``."""
        u = rng.random((rounds, m))
        slow = np.empty((rounds, m), dtype=bool)
        slow[0] = u[0] < self.stationary_slow
        for r in range(1, rounds):
            prev = slow[r - 1]
            slow[r] = np.where(prev, u[r] >= self.p_recover, u[r] < self.p_slow)
        return slow

    def sample(self, rng: np.random.Generator, rounds: int, m: int, max_chunks: int) -> np.ndarray:
        choice_rng, base_rng = rng.spawn(2)
        slow = self.slow_mask(choice_rng, rounds, m)
        out = self.base.sample(base_rng, rounds, m, max_chunks)
        out[slow, :] *= self.factor
        return out


@dataclass(frozen=True, repr=False)
class Replay(DelayModel):
    """Replay a recorded schedule (``replay:PATH``); ignores the rng."""

    path: str
    schedule: DelaySchedule = field(compare=False)
    spec: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "spec", f"replay:{self.path}")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Replay:
        """Read ``path`` (see :meth:`DelaySchedule.from_csv`)."""
        return cls(str(path), DelaySchedule.from_csv(path))

    def _check(self, rounds: int, m: int, max_chunks: int) -> None:
        s = self.schedule
        if rounds > s.rounds:
            raise ConfigError(
                "rounds", rounds, f"<= {s.rounds}, the rounds recorded in {self.path}"
            )
        if m != s.m:
            raise ConfigError("m", m, f"{s.m}, the workers recorded in {self.path}")
        if max_chunks > s.max_chunks:
            raise ConfigError(
                "max_chunks", max_chunks, f"<= {s.max_chunks}, the positions in {self.path}"
            )

    def sample(self, rng: np.random.Generator, rounds: int, m: int, max_chunks: int) -> np.ndarray:
        self._check(rounds, m, max_chunks)
        return self.schedule.compute_s[:rounds, :, :max_chunks].copy()

    def sample_network(self, rng: np.random.Generator, rounds: int, m: int) -> np.ndarray:
        self._check(rounds, m, 1)
        return self.schedule.network_s[:rounds].copy()


def _parse_workers(text: str) -> frozenset[int] | None:
    """``*`` (every worker: None), or ids and ranges ``A-B`` separated by ``;`` or spaces."""
    text = text.strip()
    if text == "*":
        return None
    ids: set[int] = set()
    for part in text.replace(";", " ").split():
        lo, dash, hi = part.partition("-")
        a, b = int(lo), int(hi) if dash else int(lo)
        if a < 0 or b < a:
            raise ValueError(part)
        ids.update(range(a, b + 1))
    if not ids:
        raise ValueError(text)
    return frozenset(ids)


#: One slow-down of a trace: ``(start_s, end_s, workers or None = all, factor, line)``.
TraceWindow = tuple[float, float, frozenset[int] | None, float, int]

_TRACE_USAGE: Final = (
    "trace:FILE[,BASE] with FILE lines start,end,workers,factor: 0 <= start < end (seconds, "
    "end may be inf), workers * or ids/ranges like 0-3;7, factor > 0 or inf; BASE a delay spec "
    "(or a '# base=SPEC' line in FILE)")


def read_trace(path: str, *, fld: str = "delay", whole: str | None = None
               ) -> tuple[tuple[TraceWindow, ...], str | None]:
    """The windows of a trace file and its ``# base=SPEC`` (or None).

    Blank lines, ``#`` comments and a header line ``start,end,workers,factor`` are skipped.

    Raises
    ------
    ConfigError
        Naming ``fld``, the spec and ``FILE:LINE`` with what is allowed there.
    """
    whole = whole if whole is not None else f"trace:{path}"
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise ConfigError(fld, whole, f"{_TRACE_USAGE}; FILE readable ({exc})") from None
    windows: list[TraceWindow] = []
    base: str | None = None
    for n, raw in enumerate(lines, start=1):
        line = raw.strip()
        if line.startswith("#"):
            key, eq, val = line[1:].strip().partition("=")
            if eq and key.strip() == "base":
                base = val.strip()
            continue
        if not line or line.replace(" ", "") == "start,end,workers,factor":
            continue
        parts = [p.strip() for p in line.split(",")]
        try:
            if len(parts) != 4:
                raise ValueError(line)
            start, end, factor = float(parts[0]), float(parts[1]), float(parts[3])
            workers = _parse_workers(parts[2])
        except ValueError:
            raise ConfigError(fld, whole, f"{_TRACE_USAGE}; {path}:{n} is {line!r}") from None
        if not (math.isfinite(start) and 0 <= start < end) or not factor > 0 \
                or math.isnan(end):
            raise ConfigError(fld, whole, f"{_TRACE_USAGE}; {path}:{n} is {line!r}")
        windows.append((start, end, workers, factor, n))
    return tuple(windows), base


@dataclass(frozen=True, repr=False)
class Trace(DelayModel):
    """Fail-slow injection from a trace file (``trace:FILE[,BASE]``, module docstring).

    ``windows`` are ``(start_s, end_s, workers, factor, line)``; overlapping windows multiply.
    A chunk's start time is on the schedule clock: round ``r`` starts at ``T_r``, with
    ``T_0 = 0`` and ``T_{r+1} = T_r + max_j sum_k compute_s[r, j, k]`` (finite entries, after
    the slow-downs); worker ``j``'s ``k``-th chunk starts at ``T_r + sum_{k' < k}
    compute_s[r, j, k']``. The live run's clock differs (a scheme may end a round before its
    slowest worker is done, and the protocol adds its own time), so windows are positions in
    the *schedule*, the same for every scheme of a comparison.
    """

    path: str
    windows: tuple[TraceWindow, ...]
    base: DelayModel
    spec: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "spec", f"trace:{self.path},{self.base.spec}")

    def sample(self, rng: np.random.Generator, rounds: int, m: int, max_chunks: int) -> np.ndarray:
        for _, _, workers, _, line in self.windows:
            if workers is not None and max(workers) >= m:
                raise ConfigError("delay", self.spec,
                                  f"worker ids < m={m} in the trace; {self.path}:{line} names "
                                  f"worker {max(workers)}")
        out = np.array(self.base.sample(rng, rounds, m, max_chunks), dtype=np.float64)
        masks = [(s, e, np.ones(m, bool) if w is None else np.isin(np.arange(m), list(w)), f)
                 for s, e, w, f, _ in self.windows]
        t_round = 0.0
        for r in range(rounds):
            t = np.full(m, t_round)
            for k in range(max_chunks):
                mult = np.ones(m)
                for s, e, who, f in masks:
                    mult[who & (t >= s) & (t < e)] *= f
                out[r, :, k] *= mult
                d = out[r, :, k]
                t = t + np.where(np.isfinite(d), d, 0.0)
            t_round = float(t.max())
        out[np.isnan(out)] = np.inf  # 0 * inf: a dead chunk stays dead
        return out


# --------------------------------------------------------------------------- parsing

_SYNTAX: Final = (
    "none | const:T | exp:MEAN | shiftexp:SHIFT,MEAN | pareto:ALPHA[,SCALE] | "
    "lognormal:MU,SIGMA | straggle:FRAC,FACTOR,BASE | fail:FRAC[@K],BASE | "
    "markov:P_SLOW,P_RECOVER,FACTOR,BASE | replay:PATH | trace:FILE[,BASE]"
)


def parse_delay(spec: str, *, field: str = "delay") -> DelayModel:
    """Build a :class:`DelayModel` from a spec string (syntax in the module docstring).

    Parameters
    ----------
    spec : str
        E.g. ``"exp:0.02"`` or ``"straggle:0.25,5,exp:0.02"``.
    field : str
        Name reported in errors (``"delay"`` for ``--delay``, ``"latency"`` for ``--latency``).

    Returns
    -------
    DelayModel
        Its ``spec`` is the canonical form of ``spec`` (numbers in ``repr`` form).

    Raises
    ------
    ConfigError
        Bad syntax or a parameter out of range; names ``field``, the whole spec and what is
        allowed. A missing or malformed replay file raises too.

    Examples
    --------
    >>> parse_delay("straggle:0.25,5,exp:0.02").spec
    'straggle:0.25,5.0,exp:0.02'
    """
    if not isinstance(spec, str):
        raise ConfigError(field, spec, f"a string: {_SYNTAX}")
    return _parse(spec.strip(), spec, field)


@dataclass(frozen=True)
class _Param:
    """One numeric parameter of a spec: its name and the rule it must satisfy."""

    name: str
    ok: Callable[[float], bool]


@dataclass(frozen=True)
class _Syntax:
    """How to read ``NAME:P1,...,Pn[,BASE]`` for one model (one row of :data:`_MODELS`).

    ``optional`` trailing parameters may be omitted; ``takes_base`` means the text after the
    parameters is itself a spec (commas allowed); ``extra`` validates the parameter list as a
    whole (e.g. pareto's ``ALPHA > 1`` when ``SCALE`` is omitted).
    """

    usage: str
    params: tuple[_Param, ...]
    build: Callable[..., DelayModel]
    optional: int = 0
    takes_base: bool = False
    extra: Callable[[list[float]], bool] = lambda v: True


def _nonneg(x: float) -> bool:
    return x >= 0


def _pos(x: float) -> bool:
    return x > 0


def _unit(x: float) -> bool:
    return 0 <= x <= 1


def _any(x: float) -> bool:
    return True


_MODELS: Final[dict[str, _Syntax]] = {
    "const": _Syntax("const:T with T >= 0", (_Param("T", _nonneg),), Constant),
    "exp": _Syntax("exp:MEAN with MEAN > 0", (_Param("MEAN", _pos),), Exponential),
    "shiftexp": _Syntax("shiftexp:SHIFT,MEAN with SHIFT >= 0 and MEAN > 0",
                        (_Param("SHIFT", _nonneg), _Param("MEAN", _pos)), ShiftedExponential),
    "pareto": _Syntax(
        "pareto:ALPHA[,SCALE] with SCALE > 0 and ALPHA > 0 (ALPHA > 1 if SCALE is omitted)",
        (_Param("ALPHA", _pos), _Param("SCALE", _pos)), Pareto, optional=1,
        extra=lambda v: len(v) == 2 or v[0] > 1),
    "lognormal": _Syntax("lognormal:MU,SIGMA with SIGMA >= 0",
                         (_Param("MU", _any), _Param("SIGMA", _nonneg)), LogNormal),
    "straggle": _Syntax(
        "straggle:FRAC,FACTOR,BASE with 0 <= FRAC <= 1, FACTOR > 0, BASE a delay spec",
        (_Param("FRAC", _unit), _Param("FACTOR", _pos)), Stragglers, takes_base=True),
    "markov": _Syntax(
        "markov:P_SLOW,P_RECOVER,FACTOR,BASE with probabilities in [0, 1], FACTOR > 0, "
        "BASE a delay spec",
        (_Param("P_SLOW", _unit), _Param("P_RECOVER", _unit), _Param("FACTOR", _pos)),
        MarkovBursts, takes_base=True),
}

_FAIL_USAGE: Final = "fail:FRAC,BASE or fail:FRAC@K,BASE with 0 <= FRAC <= 1, integer K >= 0"


class _Parser:
    """Parses one spec string; every error names the field and the whole spec."""

    def __init__(self, whole: str, fld: str) -> None:
        self.whole, self.fld = whole, fld

    def bad(self, allowed: str) -> ConfigError:
        return ConfigError(self.fld, self.whole, allowed)

    def num(self, s: str, p: _Param, usage: str) -> float:
        try:
            x = float(s)
        except ValueError:
            raise self.bad(f"{usage}; {p.name}={s.strip()!r} is not a number") from None
        if not math.isfinite(x) or not p.ok(x):
            raise self.bad(f"{usage}; got {p.name}={x!r}")
        return x

    def parse(self, text: str) -> DelayModel:
        name, sep, rest = text.partition(":")
        name = name.strip().lower()
        if name == "none":
            if sep and rest.strip():
                raise self.bad("'none' takes no parameters")
            return NoDelay()
        if not sep:
            raise self.bad(_SYNTAX)
        if name == "fail":
            return self.fail(rest)
        if name == "replay":
            return self.replay(rest)
        if name == "trace":
            return self.trace(rest)
        syntax = _MODELS.get(name)
        if syntax is None:
            raise self.bad(f"one of {_SYNTAX}; unknown model {name!r}")
        return self.table(syntax, rest)

    def table(self, syn: _Syntax, rest: str) -> DelayModel:
        n = len(syn.params)
        if syn.takes_base:
            parts = rest.split(",", n)  # the base spec keeps its own commas
            if len(parts) != n + 1 or any(not p.strip() for p in parts):
                raise self.bad(syn.usage)
            values = [self.num(s, p, syn.usage) for s, p in zip(parts[:n], syn.params,
                                                                strict=True)]
            return syn.build(*values, self.parse(parts[-1].strip()))
        parts = [p.strip() for p in rest.split(",")]
        if not n - syn.optional <= len(parts) <= n or any(not p for p in parts):
            raise self.bad(syn.usage)
        values = [self.num(s, p, syn.usage) for s, p in zip(parts, syn.params, strict=False)]
        if not syn.extra(values):
            raise self.bad(f"{syn.usage}; got {','.join(parts)}")
        return syn.build(*values)

    def fail(self, rest: str) -> DelayModel:
        parts = rest.split(",", 1)
        if len(parts) != 2 or any(not p.strip() for p in parts):
            raise self.bad(_FAIL_USAGE)
        frac_s, at, k_s = parts[0].partition("@")
        frac = self.num(frac_s, _Param("FRAC", _unit), _FAIL_USAGE)
        k: int | None = None
        if at:
            try:
                k = int(k_s.strip())
            except ValueError:
                raise self.bad(f"{_FAIL_USAGE}; K={k_s.strip()!r} is not an integer") from None
            if k < 0:
                raise self.bad(f"{_FAIL_USAGE}; got K={k}")
        return Failures(frac, self.parse(parts[1].strip()), k)

    def replay(self, rest: str) -> DelayModel:
        path = rest.strip()
        if not path:
            raise self.bad("replay:PATH with PATH a delays.csv file")
        try:
            return Replay.load(path)
        except OSError as exc:
            raise self.bad(f"replay:PATH with PATH a readable delays.csv file ({exc})") from None


    def trace(self, rest: str) -> DelayModel:
        path, _, base_spec = rest.partition(",")
        path = path.strip()
        if not path:
            raise self.bad(_TRACE_USAGE)
        windows, file_base = read_trace(path, fld=self.fld, whole=self.whole)
        spec = base_spec.strip() or file_base
        if not spec:
            raise self.bad(f"{_TRACE_USAGE}; no BASE given and no '# base=' line in {path}")
        return Trace(path, windows, self.parse(spec))


def _parse(text: str, whole: str, fld: str) -> DelayModel:
    return _Parser(whole, fld).parse(text)


def _as_model(model: str | DelayModel, fld: str) -> DelayModel:
    if isinstance(model, DelayModel):
        return model
    return parse_delay(model, field=fld)


def _check_sample(a: np.ndarray, shape: tuple[int, ...], who: str) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    if a.shape != shape:
        raise ConfigError(who, a.shape, f"a sample of shape {shape}")
    if np.isnan(a).any() or (a < 0).any():
        raise ConfigError(who, "sample with NaN or negative delays", "delays >= 0 or inf")
    return a


def materialise(
    compute: str | DelayModel,
    network: str | DelayModel = "none",
    *,
    rounds: int,
    m: int,
    max_chunks: int,
    seed: int,
) -> DelaySchedule:
    """Draw a whole run's delays up front.

    Parameters
    ----------
    compute : str or DelayModel
        Per-chunk compute delay model (``--delay``).
    network : str or DelayModel
        Per-(round, worker) one-way network delay model (``--latency``); only its first chunk
        position is used.
    rounds, m, max_chunks : int
        R >= 1, m >= 1, K >= 1 (K = the largest load of any worker).
    seed : int
        ``>= 0``. ``SeedSequence(seed).spawn(2)`` gives independent compute and network
        streams, so changing one model never changes the other's delays.

    Returns
    -------
    DelaySchedule
        ``compute_s`` of shape ``(R, m, K)``, ``network_s`` of shape ``(R, m)``.

    Examples
    --------
    >>> s = materialise("exp:0.02", "const:0.001", rounds=3, m=4, max_chunks=2, seed=7)
    >>> s.compute_s.shape, s.network_s.shape
    ((3, 4, 2), (3, 4))
    """
    for name, v in (("rounds", rounds), ("m", m), ("max_chunks", max_chunks)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
            raise ConfigError(name, v, "an integer >= 1")
    if rounds * m * max_chunks > MAX_SCHEDULE_CELLS:
        raise ConfigError(
            "rounds*m*max_chunks", rounds * m * max_chunks, f"<= {MAX_SCHEDULE_CELLS}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ConfigError("seed", seed, "an integer >= 0")
    cmodel = _as_model(compute, "delay")
    nmodel = _as_model(network, "latency")
    c_ss, n_ss = np.random.SeedSequence(int(seed)).spawn(2)
    comp = cmodel.sample(np.random.default_rng(c_ss), rounds, m, max_chunks)
    net = nmodel.sample_network(np.random.default_rng(n_ss), rounds, m)
    return DelaySchedule(
        compute_s=_check_sample(comp, (rounds, m, max_chunks), "delay"),
        network_s=_check_sample(net, (rounds, m), "latency"),
        seed=int(seed),
        compute_spec=cmodel.spec,
        network_spec=nmodel.spec,
    )
