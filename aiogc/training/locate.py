"""Locate, exclude, continue; and the per-round rounding bound of a compressed upload.

**Locating a liar.** The redundancy check (:func:`aiogc.coding.consistency.redundancy_check`)
detects an inconsistent vector where a fixed code (the original scheme) received a spare. With
*two* spares it can also say whose: leave each received worker out in turn; the set without the
liar still has a spare and passes the redundancy check, every set that keeps the liar fails it
(its vector enters the two decodes with different coefficients). When one leave-one-out set is
consistent and :data:`LOCATE_MARGIN` times more so than any other (a lie can nearly cancel
between the two decodes of a set that keeps it, at the tolerance of a compressed upload),
its worker is located, the round is decoded exactly from the rest (and
checked again, by every check of the guard), and the round completes. With one spare, or no
leave-one-out set that stands out (two liars, which this does not claim to handle), the round
is rejected as before.

**Eviction.** Each located round is one piece of evidence against its worker. After
:data:`EVICT_AFTER` located rounds (by default 3: a single round could be the PS's own
confusion, three independent rounds in which the same vector alone breaks consistency are
not) the aggregator asks the PS core to evict the worker: its connection is closed, its key is
refused on reconnect for the rest of the run, and an event and a summary line say so.

**After an eviction.** A worker is *cross-checked* once it took part in a round that passed a
content check (the oracle, or the redundancy check with a spare) with every received vector,
together with every other worker holding one of its chunks. After an eviction, the chunks
whose remaining holders were never cross-checked rest on the locator's bound alone: their
holders may be the very liars that outvoted the evicted worker (two colluders beyond that
bound frame an honest one exactly so), and the redundancy check sees them agree. A round the
oracle did not vouch for is then recorded as ``unverified`` (:meth:`LiarLocator.unvouched`),
and so is a located round decoded without a worker whose chunks are left that way.

The PS waits for two spare vectors (``PSOptions(spares=2)``, with ``spare_wait`` > 0) so that
location has the redundancy it needs (cyclic ``delta >= 3``: ``m - delta + 1`` vectors decode,
two more locate one liar). :func:`check_locate` refuses a configuration that cannot locate
(naming why), and :func:`locate_spares` turns ``--locate N`` into those PS options
(``aiogc run --locate N``, ``aiogc ps --locate N``).

**Cost.** Nothing in an honest round; in a round that fails the redundancy check, one
redundancy check per received worker, with one factorisation per decoded subset for a fixed
code (:mod:`aiogc.coding.leave_one_out`; ``bench/bench_locate.py`` reports it at m=64).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass
from typing import Final

import numpy as np

from aiogc.coding.base import Scheme
from aiogc.coding.compress import rounding_bound
from aiogc.coding.consistency import (
    REDUNDANCY_SAFETY,
    redundancy_check,
    redundancy_tolerance,
)
from aiogc.coding.leave_one_out import leave_one_out_values
from aiogc.config import RunConfig
from aiogc.errors import ConfigError

__all__ = ["EVICT_AFTER", "LOCATE_SPARE_WAIT", "MAX_LOCATE", "LiarLocator", "check_locate",
           "decoding_coefficients", "fully_consistent", "liars_supported", "locate_spare_count",
           "locate_spares",
           "payload_rounding_bound"]

#: located rounds against one worker before it is evicted
EVICT_AFTER = 3
#: how much more consistent the located leave-one-out set must be than the next best
LOCATE_MARGIN = 10.0
#: ``--locate N``: N in [0, MAX_LOCATE] (0: locate and exclude, never evict)
MAX_LOCATE: Final = 1000
#: the spare wait ``--locate`` implies when none is given: up to the round's own elapsed time
#: again (a round that decoded after 40 ms waits at most 40 ms more for its two spares). It
#: only bounds the wait: a round ends as soon as the two spares are in, so an honest round
#: costs the gap to the two next finishers, and at most twice its time (docs/security.md)
LOCATE_SPARE_WAIT: Final = 1.0
#: discrepancies below this are exact agreement (the margin is not taken of 0)
_TINY = 1e-300


def check_locate(locate: int | None, config: RunConfig) -> None:
    """Refuse ``--locate N`` where it cannot work, naming the field, the value and why.

    N is an integer in [0, :data:`MAX_LOCATE`]. Location needs a scheme whose workers send a
    fixed-code vector when done (a subset of them decodes: the original scheme) that decodes
    exactly, an assignment whose workers' vectors differ (not fractional repetition), and two
    spare vectors beyond a decodable set: ``stragglers_tolerated`` (delta - ell for the
    original scheme) at least 2. ``config`` is one scheme's configuration.
    """
    if locate is None:
        return
    if isinstance(locate, bool) or not isinstance(locate, int) or not 0 <= locate <= MAX_LOCATE:
        raise ConfigError("locate", locate, f"an integer in [0, {MAX_LOCATE}] (located rounds "
                          "before eviction; 0: locate and exclude, never evict)")
    spec = config.spec
    if not spec.sends_when_done:
        raise ConfigError("locate", locate, f"schemes whose workers send a fixed-code vector when "
                          f"done (original); {config.scheme}'s vectors are encoded for the "
                          "broadcast state, so no subset of them decodes and a leave-one-out "
                          "check does not exist (its liars are rejected, by --verify's oracle, "
                          "not located)")
    if spec.uses_k:
        raise ConfigError("locate", locate, f"a scheme that decodes exactly; {config.scheme} "
                          "decodes approximately by design (no redundancy to cross-check)")
    if config.assignment == "fr":
        raise ConfigError("locate", locate, "a cyclic or regular assignment; with fractional "
                          "repetition (assignment fr) a group's workers send equal vectors, so "
                          "every two-way decode reads a lying vector with the same weight and "
                          "no leave-one-out set stands out (measured: tests/"
                          "test_payload_locate.py)")
    s = config.stragglers_tolerated
    if s < 2:
        raise ConfigError("locate", locate, f"two spare vectors beyond a decodable set, i.e. a "
                          f"code that tolerates >= 2 stragglers; {config.scheme} with "
                          f"m={config.workers}, delta={config.delta}, ell={config.n_parts} "
                          f"tolerates {s} (delta - ell >= 2 needed, e.g. "
                          f"--delta {config.n_parts + 2})")


def locate_spares(locate: int | None, spare_wait: float | None, *,
                  tolerated: int = 2) -> tuple[float, int]:
    """``(spare_wait, spares)`` of the PS (:class:`aiogc.core.PSOptions`).

    Without ``locate``: ``spare_wait`` (None: 0) and one spare. With it: ``spare_wait``, or
    :data:`LOCATE_SPARE_WAIT` when None, and :func:`locate_spare_count` spares for a code that
    tolerates ``tolerated`` stragglers; an explicit 0 cannot locate (no spare is ever waited
    for) and is refused, naming ``spare_wait``.
    """
    spares = locate_spare_count(tolerated)
    if locate is None:
        return (0.0 if spare_wait is None else float(spare_wait)), 1
    if spare_wait is None:
        return LOCATE_SPARE_WAIT, spares
    if spare_wait <= 0:
        raise ConfigError("spare_wait", spare_wait, f"a number in (0, 100] with --locate {locate} "
                          "(locating needs two spare vectors; leave --spare-wait out for the "
                          f"default {LOCATE_SPARE_WAIT:g})")
    return float(spare_wait), spares


def locate_spare_count(tolerated: int) -> int:
    """Spares ``--locate`` waits for: four (two liars located uniquely) where the code
    tolerates four stragglers, else two (one liar)."""
    return 4 if tolerated >= 4 else 2


def liars_supported(spares: int) -> int:
    """Liars that ``spares`` spare vectors locate uniquely: a set of ``t`` liars is told apart
    from every other set of at most ``t`` only when ``2 t`` vectors beyond a decodable set
    arrived (two explanations then still leave a decodable, honest rest in common)."""
    return max(0, int(spares)) // 2


def fully_consistent(scheme: Scheme, rows64: np.ndarray, subset: list[int],
                     eps: float | None = None) -> float | None:
    """How far the decodes of the sum from ``subset``'s vectors disagree, relative to their
    rounding tolerance (at most 1: every decode agrees). The vectors' component in the left
    null space of the subset's encoding rows (where every difference of two decoders lies),
    over ``sqrt(k) ||V||_F`` (what honest rounding can put there), over the redundancy
    check's tolerance; inf when not finite. None when the subset has no redundancy or the
    scheme no fixed code.

    Parameters
    ----------
    scheme : Scheme
        A scheme with an ``encoding_tensor()`` (a fixed code).
    rows64 : ndarray, shape (m, p)
    subset : list of int
    eps : float, optional
        The payloads' rounding unit when compressed (as the redundancy check's).
    """
    E = scheme.encoding_tensor()
    if E is None or len(subset) < 2:
        return None
    m = int(scheme.m)
    Es = np.asarray(E, dtype=np.float64).reshape(m, -1)[subset]
    U, sv, _ = np.linalg.svd(Es, full_matrices=True)
    if sv.size == 0 or sv[0] == 0:
        return None
    rank = int(np.sum(sv > sv[0] * 1e-10))
    N = U[:, rank:]  # (r, r - rank): n^T Es = 0
    if N.shape[1] == 0:
        return None
    V = np.asarray(rows64, dtype=np.float64)[subset]
    with np.errstate(over="ignore", invalid="ignore"):
        resid = float(np.linalg.norm(N.T @ V))
        # the honest rounding E (|E| <= eps |V| entrywise) moves it by at most
        # ||N^T E||_F <= sqrt(k) eps ||V||_F (N has k orthonormal columns)
        scale = float(np.sqrt(N.shape[1]) * np.linalg.norm(V))
    if not (math.isfinite(resid) and math.isfinite(scale)):
        return math.inf
    kappa = float(sv[0] / sv[rank - 1])
    tol = redundancy_tolerance(rows64.dtype, kappa, REDUNDANCY_SAFETY, eps)
    if scale <= 0:
        return 0.0 if resid == 0 else math.inf
    return resid / scale / tol


def decoding_coefficients(scheme: Scheme, state: np.ndarray) -> np.ndarray:
    """The decoding coefficients ``D`` (ell, m) the scheme uses at ``state``.

    Decoding is linear in the payloads: decoding the identity (payload length m) returns them.
    """
    m, ell = int(scheme.m), int(scheme.n_parts)
    r = scheme.decode_result(np.eye(m), np.asarray(state, dtype=np.int64), ell * m)
    return np.asarray(r.gradient, dtype=np.float64).reshape(ell, m)


def payload_rounding_bound(scheme: Scheme, state: np.ndarray, rows64: np.ndarray,
                           coded: str, payload_dtype: np.dtype) -> float:
    """:func:`aiogc.coding.compress.rounding_bound` of one round: the most a compressed upload's
    rounding can move the decoded gradient (absolute, in gradient units).

    Parameters
    ----------
    scheme : Scheme
    state : ndarray of int64, shape (m,)
    rows64 : ndarray, shape (m, p)
        The round's payload rows widened to float64.
    coded : {"float16", "bfloat16"}
    payload_dtype : numpy dtype
    """
    D = decoding_coefficients(scheme, state)
    return rounding_bound(D, rows64, coded, payload_dtype)


@dataclass
class LiarLocator:
    """Leave-one-out location and the evidence count (see the module docstring).

    Parameters
    ----------
    evict_after : int
        Located rounds against one worker before it is evicted (0: never evict).
    eps : float, optional
        The payloads' rounding unit when compressed (see ``redundancy_check``).
    """

    evict_after: int = EVICT_AFTER
    eps: float | None = None
    #: the most liars location must tell apart (:func:`liars_supported` of the spares the PS
    #: waits for); a round whose received set has fewer than twice as many spares, or whose
    #: evidence another set of at most this many workers explains as well, locates nobody
    liars: int = 1
    #: the fewest received vectors that decode (``m - stragglers_tolerated``); None: the
    #: spare count of a round is not checked
    min_finished: int | None = None
    #: one factorisation per decoded subset for fixed codes (False: the scheme's decoder,
    #: three solves per subset; kept for the bench's before/after and the equivalence test)
    fast: bool = True

    def __post_init__(self) -> None:
        self.evidence: Counter[int] = Counter()
        #: worker -> the rounds it was located in
        self.rounds: dict[int, list[int]] = {}
        self.evicted: list[int] = []
        #: located rounds in total
        self.located = 0
        #: workers seen agreeing with every other holder of their chunks (module docstring)
        self.cross_checked: set[int] = set()
        #: the orders last seen and their chunk -> holders map
        self._holders: tuple[list[list[int]] | None, dict[int, set[int]]] = (None, {})

    def _holders_of(self, orders: list[list[int]]) -> dict[int, set[int]]:
        if self._holders[0] is not orders:
            self._holders = (orders, _holders(orders))
        return self._holders[1]

    def vouched(self, orders: list[list[int]], received: np.ndarray) -> None:
        """A round passed a content check with every vector of ``received`` in it: each of
        those workers that took part together with every other holder of its chunks (evicted
        ones included, who can take part no more) is now cross-checked.

        Parameters
        ----------
        orders : list of list of int
            The chunks each worker holds (the scheme's orders), ``m`` lists.
        received : ndarray of int, shape (k,)
            The workers whose vectors the round used.
        """
        got = {int(w) for w in received}
        holders = self._holders_of(orders)
        for w in got - self.cross_checked:
            if all(holders[c] <= got for c in orders[w]):
                self.cross_checked.add(w)

    def unvouched(self, orders: list[list[int]],
                  excluded: tuple[int, ...] = ()) -> dict[int, list[int]]:
        """Without the evicted workers and ``excluded``: each chunk whose remaining holders
        were never cross-checked, with those holders (empty when nobody is gone, or when
        every such chunk has a cross-checked holder left).

        Parameters
        ----------
        orders : list of list of int
            The chunks each worker holds, ``m`` lists.
        excluded : tuple of int
            The worker a located round is decoded without.
        """
        gone = {*self.evicted, *excluded}
        if not gone:
            return {}
        out: dict[int, list[int]] = {}
        for c, who in sorted(self._holders_of(orders).items()):
            left = sorted(who - gone)
            if left and not self.cross_checked.intersection(left):
                out[c] = left
        return out

    def locate(self, scheme: Scheme, rows64: np.ndarray, state: np.ndarray,
               dim: int) -> int | None:
        """The one worker whose removal leaves a clearly most consistent received set, or None.

        Parameters
        ----------
        scheme : Scheme
        rows64 : ndarray, shape (m, p)
        state : ndarray of int64, shape (m,)
            The round's state (send-when-done: the loads of the workers whose vectors arrived).
        dim : int
        """
        rec = [int(w) for w in np.flatnonzero(np.asarray(state) > 0)]
        if not scheme.sends_when_done or len(rec) < 4:
            return None
        values = self._values(scheme, rows64, rec, dim)
        if values is None:
            return None  # no spare left without one worker: nothing can be located
        values.sort()
        (best, j), (second, _) = values[0], values[1]
        # the set without the liar is consistent to its rounding; a set that keeps the liar
        # can pass too where the lie nearly cancels between its two decodes, so the located
        # set must also stand out: LOCATE_MARGIN times more consistent than any other
        if not (math.isfinite(best) and (not math.isfinite(second)
                                         or second > LOCATE_MARGIN * max(best, _TINY))):
            return None
        return j if self._unique(scheme, rows64, rec, j, dim) else None

    def _unique(self, scheme: Scheme, rows64: np.ndarray, rec: list[int], j: int,
                dim: int) -> bool:
        """Whether "``j`` lied" is the only explanation of the round with at most
        :attr:`liars` liars: the round has ``2 * liars`` spares, every decode of the set
        without ``j`` agrees (not only the two the redundancy check compares), and no set of
        at most ``liars`` other workers leaves a consistent rest. Two colluders can make the
        set without an honest worker consistent; with four spares the rest without them
        still decodes and contradicts it, with two nothing can tell the two apart."""
        if self.min_finished is not None and len(rec) - self.min_finished < 2 * self.liars:
            return False
        rest = [w for w in rec if w != j]
        mine = fully_consistent(scheme, rows64, rest, self.eps)
        if mine is None or mine > 1:
            return False
        for size in range(1, self.liars + 1):
            for others in itertools.combinations(rest, size):
                keep = [w for w in rec if w not in others]
                alt = fully_consistent(scheme, rows64, keep, self.eps)
                if alt is not None and alt <= 1 and alt <= LOCATE_MARGIN * max(mine, _TINY):
                    return False  # "these lied" explains the round as well as "j lied"
        return True

    def _values(self, scheme: Scheme, rows64: np.ndarray, rec: list[int],
                dim: int) -> list[tuple[float, int]] | None:
        """``(discrepancy, j)`` of the redundancy check of ``rec`` without each ``j`` (inf:
        failed), or None when a set has no spare. A fixed code: one factorisation per decoded
        subset (:mod:`aiogc.coding.leave_one_out`); else the scheme's own decoder."""
        if self.fast and scheme.encoding_tensor() is not None:
            fast = leave_one_out_values(scheme, rows64, rec, dim, eps=self.eps)
            return None if fast is None else list(zip(fast, rec, strict=True))
        values: list[tuple[float, int]] = []
        for j in rec:
            with np.errstate(over="ignore", invalid="ignore"):  # a blown-up vector: inf
                v = redundancy_check(scheme, rows64, [w for w in rec if w != j], dim,
                                     eps=self.eps)
            if v is None:
                return None
            values.append((v.value if v.ok else math.inf, j))
        return values

    def record(self, worker: int, round_: int | None = None) -> bool:
        """One located round (``round_``) against ``worker``; True when it is now to be
        evicted."""
        self.located += 1
        self.evidence[worker] += 1
        if round_ is not None:
            self.rounds.setdefault(worker, []).append(int(round_))
        if (self.evict_after > 0 and self.evidence[worker] >= self.evict_after
                and worker not in self.evicted):
            self.evicted.append(worker)
            return True
        return False

    def describe(self, worker: int) -> str:
        n = self.evidence[worker]
        return (f"worker {worker} located as inconsistent (leave-one-out decodes; "
                f"{n} round{'s' if n != 1 else ''} of evidence) and excluded")


def _holders(orders: list[list[int]]) -> dict[int, set[int]]:
    """chunk -> the workers holding it."""
    out: dict[int, set[int]] = {}
    for w, chunks in enumerate(orders):
        for c in chunks:
            out.setdefault(int(c), set()).add(w)
    return out


def relative(bound: float, scale: float) -> float:
    """``bound / scale``, 0 when either is not a positive finite number."""
    return bound / scale if scale > 0 and math.isfinite(bound) and math.isfinite(scale) else 0.0
