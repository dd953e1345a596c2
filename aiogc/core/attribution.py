"""Per-round attribution: whose work entered a round's decoded gradient, with what weight.

The PS's decode (``aiogc.training.aggregator``) combines the coded vectors ``v_j`` of one
round linearly: part ``k`` of the estimate is ``sum_j W[k, j] * v_j`` with ``W`` the
decoding coefficients of the round's state (``ell x m``; a zero column is a vector the decode
did not read). Worker ``j``'s vector encodes the first ``state[j]`` chunks of its processing
order (``orders[j]``), so the chunks that *entered* the gradient through worker ``j`` are
those when ``W[:, j] != 0`` and the round's step was applied. Everything else a worker
computed that round (as far as the PS knows: its largest reported count, or its whole load
when a send-when-done vector arrived) was *wasted*.

Pure data and arithmetic (no clock, no I/O): the aggregator builds an :class:`Attribution`
per round, the recorder turns it into ``workers.csv`` columns and ``attribution.csv`` rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Attribution", "ChunkCover", "chunk_cover", "entered_counts", "used_workers"]


@dataclass(frozen=True, slots=True)
class Attribution:
    """A round's decoding coefficients, and the orders that say which chunks they weigh.

    Attributes
    ----------
    weights : ndarray of float64, shape (ell, m)
        ``W``: the decoded gradient's part ``k`` is ``sum_j W[k, j] * v_j``. All zeros when
        the round decoded nothing.
    orders : sequence of m int sequences
        Each worker's processing order (the scheme's; shared, never copied).
    n_chunks : int
        ``N``.
    """

    weights: np.ndarray
    orders: Sequence[Sequence[int]]
    n_chunks: int


def used_workers(weights: np.ndarray) -> list[bool]:
    """Whether each worker's vector entered the decode: a nonzero column of ``weights``.

    Parameters
    ----------
    weights : ndarray, shape (ell, m)

    Returns
    -------
    list of m bool
    """
    return [bool(x) for x in np.any(np.asarray(weights) != 0, axis=0)]


def entered_counts(state: Sequence[int], weights: np.ndarray, applied: bool) -> list[int]:
    """Chunks of each worker that entered the applied gradient: ``state[j]`` if its vector
    was used and the step applied, else 0; length m."""
    if not applied:
        return [0] * len(state)
    used = used_workers(weights)
    return [int(c) if j < len(used) and used[j] else 0 for j, c in enumerate(state)]


@dataclass(frozen=True, slots=True)
class ChunkCover:
    """One chunk of one round: which workers' work on it entered the gradient, which was
    computed, which wasted (``computed_by`` minus ``covered_by``)."""

    chunk: int
    covered_by: tuple[int, ...]
    computed_by: tuple[int, ...]
    wasted_by: tuple[int, ...]


def chunk_cover(orders: Sequence[Sequence[int]], n_chunks: int, entered: Sequence[int],
                done: Sequence[int]) -> list[ChunkCover]:
    """Per chunk, the workers whose entered prefix covers it and those that computed it.

    Parameters
    ----------
    orders : sequence of m int sequences
        Processing orders.
    n_chunks : int
        ``N``.
    entered : sequence of int, length m
        :func:`entered_counts`.
    done : sequence of int, length m
        Chunks each worker computed (as the PS knows it), ``>= entered``.

    Returns
    -------
    list of N :class:`ChunkCover`, by chunk index; workers in increasing order.
    """
    covered: list[list[int]] = [[] for _ in range(n_chunks)]
    computed: list[list[int]] = [[] for _ in range(n_chunks)]
    for j, order in enumerate(orders):
        e, d = int(entered[j]), max(int(done[j]), int(entered[j]))
        for pos, i in enumerate(order[:d]):
            computed[i].append(j)
            if pos < e:
                covered[i].append(j)
    out = []
    for i in range(n_chunks):
        cov = tuple(covered[i])
        comp = tuple(computed[i])
        out.append(ChunkCover(i, cov, comp, tuple(j for j in comp if j not in cov)))
    return out
