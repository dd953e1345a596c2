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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np

from aiogc.errors import ConfigError
from aiogc.training.delay_models import (
    _TRACE_USAGE,
    Constant,
    DelayModel,
    Exponential,
    Failures,
    LogNormal,
    MarkovBursts,
    NoDelay,
    Pareto,
    Replay,
    ShiftedExponential,
    Stragglers,
    Trace,
    read_trace,
)
from aiogc.training.schedule import DelaySchedule

# The models (delay_models.py) and DelaySchedule (schedule.py: what materialise returns, what
# Replay replays) are re-exported: this module is the one import for a user's delays (a model,
# its spec string, a schedule); aiogc's own modules import each from where it is defined.
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
