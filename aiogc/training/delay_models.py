"""The delay models behind the spec strings of :mod:`aiogc.training.delays`: the base laws
(``none``, ``const``, ``exp``, ``sexp``, ``pareto``, ``lognormal``), the combinators that pick
slow, failed or bursty workers (:class:`Stragglers`, :class:`Failures`, :class:`MarkovBursts`),
and the file-backed ones (:class:`Replay` of a ``delays.csv``, the fail-slow :class:`Trace`);
and the registry of their spec strings (:func:`register_delay`): adding a model is its class
and one :class:`DelaySyntax` row here, from which the parser, the usage text and the
``--delay`` help follow.

The spec syntax, :func:`~aiogc.training.delays.parse_delay`, the invariants every model keeps
(``>= 0`` or ``+inf``, never NaN; no global randomness) and
:func:`~aiogc.training.delays.materialise` are in :mod:`aiogc.training.delays`.
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

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


# --------------------------------------------------------------------------- the registry


class SpecParser(Protocol):
    """What a custom :attr:`DelaySyntax.parse` gets from the spec parser
    (:func:`aiogc.training.delays.parse_delay`): its error naming the field and the whole spec,
    its number reader, and the parser itself for a base spec."""

    fld: str

    def bad(self, allowed: str) -> ConfigError: ...

    def num(self, s: str, p: Param, usage: str) -> float: ...

    def parse(self, text: str) -> DelayModel: ...


@dataclass(frozen=True)
class Param:
    """One numeric parameter of a spec: its name and the rule it must satisfy."""

    name: str
    ok: Callable[[float], bool]


def _always(values: list[float]) -> bool:
    return True


def _no_caution(values: list[float]) -> str | None:
    return None


@dataclass(frozen=True)
class DelaySyntax:
    """One delay model a spec string may name: ``NAME:P1,...,Pn[,BASE]`` and how to build it.

    Attributes
    ----------
    name : str
        The spec's prefix (``exp``).
    form : str
        Its syntax (``exp:MEAN``): the usage line of ``--delay`` is these, joined.
    usage : str
        The form with the parameters' ranges (the error message of a bad spec).
    help : str
        What the model draws, one line.
    params : tuple of Param
        The numeric parameters; ``optional`` trailing ones may be omitted.
    build : callable
        ``build(*values)`` (``build(*values, base)`` with ``takes_base``) -> DelayModel.
    takes_base : bool
        The text after the parameters is itself a spec (commas allowed).
    extra : callable
        Validates the values as a whole (pareto: ``ALPHA > 1`` when ``SCALE`` is omitted).
    caution : callable
        A warning for valid values that are easy to misread (None: none); the command line
        prints it (:func:`aiogc.training.delays.delay_cautions`).
    parse : callable, optional
        A syntax of its own: ``parse(parser, rest)`` with ``rest`` the text after ``NAME:``
        (None without a colon); then ``params`` and ``build`` are unused.
    """

    name: str
    form: str
    usage: str
    help: str
    params: tuple[Param, ...] = ()
    build: Callable[..., DelayModel] | None = None
    optional: int = 0
    takes_base: bool = False
    extra: Callable[[list[float]], bool] = _always
    caution: Callable[[list[float]], str | None] = _no_caution
    parse: Callable[[SpecParser, str | None], DelayModel] | None = None


_DELAYS: dict[str, DelaySyntax] = {}


def register_delay(syntax: DelaySyntax) -> DelaySyntax:
    """Add a model to the spec strings every ``--delay`` / ``--latency`` accepts (an existing
    name is a ConfigError)."""
    if syntax.name in _DELAYS:
        raise ConfigError("delay model", syntax.name, "a name not registered yet")
    if syntax.parse is None and syntax.build is None:
        raise ConfigError("delay model", syntax.name, "a build or a parse function")
    _DELAYS[syntax.name] = syntax
    return syntax


def delay_names() -> tuple[str, ...]:
    """The registered models' names, in registration order."""
    return tuple(_DELAYS)


def delay_syntax(name: str) -> DelaySyntax | None:
    """The registry entry of ``name`` (None if unknown)."""
    return _DELAYS.get(name)


def delay_usage() -> str:
    """``none | const:T | exp:MEAN | ...``: every registered form (the usage of ``--delay``)."""
    return " | ".join(s.form for s in _DELAYS.values())


def _nonneg(x: float) -> bool:
    return x >= 0


def _pos(x: float) -> bool:
    return x > 0


def _unit(x: float) -> bool:
    return 0 <= x <= 1


def _any(x: float) -> bool:
    return True


def _parse_none(p: SpecParser, rest: str | None) -> DelayModel:
    if rest is not None and rest.strip():
        raise p.bad("'none' takes no parameters")
    return NoDelay()


_FAIL_USAGE: Final = "fail:FRAC,BASE or fail:FRAC@K,BASE with 0 <= FRAC <= 1, integer K >= 0"


def _parse_fail(p: SpecParser, rest: str | None) -> DelayModel:
    parts = (rest or "").split(",", 1)
    if len(parts) != 2 or any(not x.strip() for x in parts):
        raise p.bad(_FAIL_USAGE)
    frac_s, at, k_s = parts[0].partition("@")
    frac = p.num(frac_s, Param("FRAC", _unit), _FAIL_USAGE)
    k: int | None = None
    if at:
        try:
            k = int(k_s.strip())
        except ValueError:
            raise p.bad(f"{_FAIL_USAGE}; K={k_s.strip()!r} is not an integer") from None
        if k < 0:
            raise p.bad(f"{_FAIL_USAGE}; got K={k}")
    return Failures(frac, p.parse(parts[1].strip()), k)


def _parse_replay(p: SpecParser, rest: str | None) -> DelayModel:
    path = (rest or "").strip()
    if not path:
        raise p.bad("replay:PATH with PATH a delays.csv file")
    try:
        return Replay.load(path)
    except OSError as exc:
        raise p.bad(f"replay:PATH with PATH a readable delays.csv file ({exc})") from None


def _parse_trace(p: SpecParser, rest: str | None) -> DelayModel:
    path, _, base_spec = (rest or "").partition(",")
    path = path.strip()
    if not path:
        raise p.bad(_TRACE_USAGE)
    windows, file_base = read_trace(path, fld=p.fld, whole=getattr(p, "whole", None))
    spec = base_spec.strip() or file_base
    if not spec:
        raise p.bad(f"{_TRACE_USAGE}; no BASE given and no '# base=' line in {path}")
    return Trace(path, windows, p.parse(spec))


def _pareto_caution(values: list[float]) -> str | None:
    if len(values) == 2:
        return None
    alpha = values[0]
    scale = (alpha - 1) / alpha
    return (f"pareto:{alpha:g} has no SCALE: its scale x_m = {scale:.4g} s makes the mean "
            f"1 second; write pareto:{alpha:g},{scale:.4g} to mean that, or give the scale "
            "of your time unit (e.g. pareto:ALPHA,SCALE with the mean ALPHA*SCALE/(ALPHA-1) "
            "of your other delays)")


register_delay(DelaySyntax("none", "none", "none", "zero delay", parse=_parse_none))
register_delay(DelaySyntax("const", "const:T", "const:T with T >= 0", "exactly T seconds",
                           (Param("T", _nonneg),), Constant))
register_delay(DelaySyntax("exp", "exp:MEAN", "exp:MEAN with MEAN > 0",
                           "exponential with mean MEAN", (Param("MEAN", _pos),), Exponential))
register_delay(DelaySyntax(
    "shiftexp", "shiftexp:SHIFT,MEAN", "shiftexp:SHIFT,MEAN with SHIFT >= 0 and MEAN > 0",
    "SHIFT + an exponential of mean MEAN", (Param("SHIFT", _nonneg), Param("MEAN", _pos)),
    ShiftedExponential))
register_delay(DelaySyntax(
    "pareto", "pareto:ALPHA[,SCALE]",
    "pareto:ALPHA[,SCALE] with SCALE > 0 and ALPHA > 0 (ALPHA > 1 if SCALE is omitted)",
    "Pareto (type I) of shape ALPHA and minimum SCALE; without SCALE the mean is 1 second "
    "(a warning says so)", (Param("ALPHA", _pos), Param("SCALE", _pos)), Pareto, optional=1,
    extra=lambda v: len(v) == 2 or v[0] > 1, caution=_pareto_caution))
register_delay(DelaySyntax("lognormal", "lognormal:MU,SIGMA",
                           "lognormal:MU,SIGMA with SIGMA >= 0", "exp(N(MU, SIGMA^2))",
                           (Param("MU", _any), Param("SIGMA", _nonneg)), LogNormal))
register_delay(DelaySyntax(
    "straggle", "straggle:FRAC,FACTOR,BASE",
    "straggle:FRAC,FACTOR,BASE with 0 <= FRAC <= 1, FACTOR > 0, BASE a delay spec",
    "persistent partial stragglers: FRAC of the workers, FACTOR times slower",
    (Param("FRAC", _unit), Param("FACTOR", _pos)), Stragglers, takes_base=True))
register_delay(DelaySyntax("fail", "fail:FRAC[@K],BASE", _FAIL_USAGE,
                           "FRAC of the workers dead each round (from round K on with @K)",
                           parse=_parse_fail))
register_delay(DelaySyntax(
    "markov", "markov:P_SLOW,P_RECOVER,FACTOR,BASE",
    "markov:P_SLOW,P_RECOVER,FACTOR,BASE with probabilities in [0, 1], FACTOR > 0, "
    "BASE a delay spec", "two-state bursts: slow workers FACTOR times slower",
    (Param("P_SLOW", _unit), Param("P_RECOVER", _unit), Param("FACTOR", _pos)),
    MarkovBursts, takes_base=True))
register_delay(DelaySyntax("replay", "replay:PATH", "replay:PATH with PATH a delays.csv file",
                           "the schedule recorded in a run's delays.csv", parse=_parse_replay))
register_delay(DelaySyntax("trace", "trace:FILE[,BASE]", _TRACE_USAGE,
                           "fail-slow windows from FILE on top of BASE", parse=_parse_trace))
