"""The delay models behind the spec strings of :mod:`aiogc.training.delays`: the base laws
(``none``, ``const``, ``exp``, ``sexp``, ``pareto``, ``lognormal``), the combinators that pick
slow, failed or bursty workers (:class:`Stragglers`, :class:`Failures`, :class:`MarkovBursts`),
and the file-backed ones (:class:`Replay` of a ``delays.csv``, the fail-slow :class:`Trace`).

The spec syntax, :func:`~aiogc.training.delays.parse_delay`, the invariants every model keeps
(``>= 0`` or ``+inf``, never NaN; no global randomness) and
:func:`~aiogc.training.delays.materialise` are in :mod:`aiogc.training.delays`.
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from aiogc.errors import ConfigError
from aiogc.training.schedule import DelaySchedule

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
