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
    ``ALPHA > 1``; :func:`delay_cautions` says so (the commands print it as a warning).
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
from typing import Final

import numpy as np

from aiogc.errors import ConfigError
from aiogc.training.delay_models import (
    Constant,
    DelayModel,
    DelaySyntax,
    Exponential,
    Failures,
    LogNormal,
    MarkovBursts,
    NoDelay,
    Param,
    Pareto,
    Replay,
    ShiftedExponential,
    Stragglers,
    Trace,
    delay_names,
    delay_syntax,
    delay_usage,
    read_trace,
    register_delay,
)
from aiogc.training.schedule import DelaySchedule

# The models (delay_models.py) and DelaySchedule (schedule.py: what materialise returns, what
# Replay replays) are re-exported: this module is the one import for a user's delays (a model,
# its spec string, a schedule); aiogc's own modules import each from where it is defined.
__all__ = [
    "Constant",
    "DelayModel",
    "DelaySchedule",
    "DelaySyntax",
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
    "delay_cautions",
    "delay_names",
    "delay_usage",
    "materialise",
    "parse_delay",
    "read_trace",
    "register_delay",
]

#: Refuse to materialise more delay cells than this (R * m * K): 8 bytes each, so 800 MB. A
#: larger request is almost surely a typo in rounds / workers / chunks.
MAX_SCHEDULE_CELLS: Final = 100_000_000


# --------------------------------------------------------------------------- parsing

def parse_delay(spec: str, *, field: str = "delay") -> DelayModel:
    """Build a :class:`DelayModel` from a spec string (syntax in the module docstring; the
    models are the registry of :mod:`aiogc.training.delay_models`, :func:`delay_usage`).

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
    return _parsed(spec, field).parse(spec.strip())


def delay_cautions(spec: str, *, field: str = "delay") -> list[str]:
    """Warnings about a valid spec that is easy to misread (``pareto:ALPHA`` without a
    scale: a mean of 1 second beside delays in milliseconds), ``field: ...`` each; the
    command line prints them."""
    parser = _parsed(spec, field)
    parser.parse(spec.strip())
    return [f"{field} {spec!r}: {c}" for c in parser.cautions]


def _parsed(spec: object, field: str) -> _Parser:
    if not isinstance(spec, str):
        raise ConfigError(field, spec, f"a string: {delay_usage()}")
    return _Parser(spec, field)


class _Parser:
    """Parses one spec string; every error names the field and the whole spec."""

    def __init__(self, whole: str, fld: str) -> None:
        self.whole, self.fld = whole, fld
        self.cautions: list[str] = []

    def bad(self, allowed: str) -> ConfigError:
        return ConfigError(self.fld, self.whole, allowed)

    def num(self, s: str, p: Param, usage: str) -> float:
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
        syn = delay_syntax(name)
        if syn is None:
            raise self.bad(f"one of {delay_usage()}; unknown model {name!r}" if sep
                           else delay_usage())
        if syn.parse is not None:
            return syn.parse(self, rest if sep else None)
        if not sep:
            raise self.bad(delay_usage())
        return self.table(syn, rest)

    def table(self, syn: DelaySyntax, rest: str) -> DelayModel:
        assert syn.build is not None  # register_delay: a build or a parse
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
        caution = syn.caution(values)
        if caution:
            self.cautions.append(caution)
        return syn.build(*values)


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
