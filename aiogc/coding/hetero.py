"""Heterogeneous clusters: worker speeds, chunk sizes, the speed-aware assignment and order.

The paper's assignments and orders assume equal workers and equal chunks.
Here a worker ``j`` has a relative **speed** ``s_j > 0`` (2 = twice as fast as 1) and a chunk
``i`` a relative **size** ``z_i > 0`` (samples; normalised to mean 1), and worker ``j``
spends ``base * z_i / s_j`` on chunk ``i``, where ``base`` is the delay model's draw for a
unit chunk (:mod:`aiogc.training.cluster` applies it to a run's schedule).

Spec strings (``--worker-speeds``, ``--chunk-sizes``; a ``RunConfig`` field each)
------------------------------------------------------------------------------------
``uniform``
    every factor 1 (the default: nothing changes, not even the welcome's bytes).
``V1,V2,...``
    one positive number per worker (per chunk), in order.
``VxK`` items
    run-length shorthand inside the list: ``1x6,0.25x2`` is six 1s then two 0.25s. The
    canonical form (:func:`canonical_factors`) is this run-length text.
``file:PATH``
    numbers separated by commas, blanks or new lines (``#`` starts a comment); read by the
    CLI (this module does no I/O) and put in the configuration in canonical form, so the
    workers never read a file.

The speed-aware assignment (``assignment="speed-aware"``)
----------------------------------------------------------
``N = m`` chunks, each on exactly ``delta`` distinct workers, as in the cyclic assignment;
worker ``j`` gets work (the sum of its chunks' sizes) close to its share ``s_j / Σ s`` of the
total ``delta Σ z``, capped at ``Σ z`` (every chunk once; the excess goes to the others in
proportion to their speeds). Construction: walk ``delta`` laps around the ring of chunks
(element ``t`` of the walk is chunk ``t mod N``) and cut the walk into ``m`` consecutive
windows at the cumulative work closest to each worker's cumulative target; a window holds at
least one and at most ``N`` elements, so it never holds a chunk twice and every chunk lands on
exactly ``delta`` distinct workers. Uniform speeds and sizes give the cyclic assignment itself.

The speed-aware order (what ``ordering="optimal"`` means on a heterogeneous cluster)
-------------------------------------------------------------------------------------
The static optimum minimises ``Q_max``, the worst-case *count* of chunk computations, which
is the right target only when every chunk costs every worker the same. The heuristic here
(list scheduling): walk the workers in order of their expected busy time
``Σ z / s`` so far, and give the next free worker, among its remaining chunks, the one with
the fewest holders already scheduled to compute it (ties: the one whose ``ell``-th coverage
is expected latest, then the lowest index). The candidate orders are this one and the static
optimum; the one with the smaller expected cover time (:func:`cover_time`: the time by
which every chunk has ``ell`` holders through it when each chunk takes exactly ``z_i /
s_j``) wins, the static optimum on a tie, so uniform clusters keep the paper's order. The
optimal order under random delays is unknown; this is a stated heuristic.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Sequence

import numpy as np

from aiogc.coding.assignments import cyclic_assignment
from aiogc.coding.orderings import optimal_order, validate_orders
from aiogc.errors import CodingError, ConfigError

__all__ = [
    "MAX_FACTOR_SPEC",
    "canonical_factors",
    "cover_time",
    "hetero_order",
    "loads_work",
    "parse_factor_list",
    "parse_factors",
    "speed_aware_assignment",
    "speed_aware_order",
]

#: Longest factor spec a configuration carries (run-length text; 4096 workers fit easily).
MAX_FACTOR_SPEC = 16384

_ITEM = re.compile(r"^([^x]+)(?:x(\d+))?$")


def parse_factor_list(text: str, *, field: str) -> np.ndarray:
    """Numbers of a ``V,VxK,...`` list (commas, blanks or new lines separate items).

    Returns
    -------
    ndarray of float64, shape (n,)
        Every entry finite and ``> 0``.
    """
    out: list[float] = []
    items = [t for t in re.split(r"[,\s]+", text.strip()) if t]
    if not items:
        raise ConfigError(field, text, "a non-empty list of positive numbers")
    for item in items:
        mt = _ITEM.match(item)
        try:
            v = float(mt.group(1)) if mt else math.nan
        except ValueError:
            v = math.nan
        if mt is None or not math.isfinite(v) or v <= 0:
            raise ConfigError(field, text, f"positive numbers V or VxK; bad item {item!r}")
        k = int(mt.group(2)) if mt.group(2) is not None else 1
        if not 1 <= k <= 1 << 20:
            raise ConfigError(field, text, f"VxK with 1 <= K; bad item {item!r}")
        out.extend([v] * k)
    return np.asarray(out, dtype=np.float64)


def parse_factors(spec: str, n: int, *, field: str) -> np.ndarray | None:
    """The ``n`` factors of a spec (module docstring); ``None`` for ``uniform``.

    Parameters
    ----------
    spec : str
        ``uniform`` or a ``V,VxK,...`` list (``file:`` is resolved by the CLI first).
    n : int
        How many factors the list must hold (workers, or chunks).
    field : str
        The configuration field named in errors.

    Returns
    -------
    ndarray of float64, shape (n,), or None
    """
    if not isinstance(spec, str) or not spec.strip() or len(spec) > MAX_FACTOR_SPEC:
        raise ConfigError(field, spec, f"uniform or a list of positive numbers "
                          f"(at most {MAX_FACTOR_SPEC} characters)")
    if spec.strip() == "uniform":
        return None
    if spec.strip().startswith("file:"):
        raise ConfigError(field, spec, "a list of numbers (file: is read by the CLI)")
    arr = parse_factor_list(spec, field=field)
    if arr.size != n:
        raise ConfigError(field, spec, f"exactly {n} factors (got {arr.size})")
    return arr


def canonical_factors(values: Sequence[float] | np.ndarray) -> str:
    """Run-length text of ``values`` (``1.0x6,0.25x2``; a lone value without ``x1``)."""
    vals = [float(v) for v in np.asarray(values, dtype=np.float64).reshape(-1)]
    parts: list[str] = []
    i = 0
    while i < len(vals):
        k = i
        while k < len(vals) and vals[k] == vals[i]:
            k += 1
        parts.append(repr(vals[i]) if k - i == 1 else f"{vals[i]!r}x{k - i}")
        i = k
    return ",".join(parts)


def _norm_sizes(sizes: np.ndarray | None, n: int) -> np.ndarray:
    z = np.ones(n) if sizes is None else np.asarray(sizes, dtype=np.float64)
    out: np.ndarray = z * (n / float(z.sum()))
    return out


def _cuts(work: np.ndarray, targets: np.ndarray, n_chunks: int) -> np.ndarray:
    """Window boundaries ``b_0 = 0 < b_1 < ... < b_m = len(work)`` with ``b_{j+1} - b_j`` in
    ``[1, n_chunks]``, each as close as allowed to the cumulative ``targets[j]``."""
    cum = np.concatenate([[0.0], np.cumsum(work)])
    total, m = cum.size - 1, targets.size - 1
    idx = np.clip(np.searchsorted(cum, targets), 1, total)
    # the closer of the two neighbours of each target
    b = np.where(np.abs(cum[idx - 1] - targets) <= np.abs(cum[idx] - targets), idx - 1, idx)
    j = np.arange(m + 1)
    lo = np.maximum(j, total - (m - j) * n_chunks)
    hi = np.minimum(j * n_chunks, total - (m - j))
    b = np.clip(b, lo, hi)
    b[0], b[-1] = 0, total
    for _ in range(2 * m + 2):  # forward then backward repair; a few passes settle it
        changed = False
        for k in range(1, m):
            v = min(max(int(b[k]), int(b[k - 1]) + 1, int(b[k + 1]) - n_chunks),
                    int(b[k - 1]) + n_chunks, int(b[k + 1]) - 1)
            if v != b[k]:
                b[k], changed = v, True
        if not changed:
            break
    d = np.diff(b)
    if (d < 1).any() or (d > n_chunks).any():  # pragma: no cover - the ranges are feasible
        raise CodingError(f"no speed-aware windows for loads {d.tolist()}")
    return b


def _capped_shares(speeds: np.ndarray, total: float, cap: float) -> np.ndarray:
    """Work per worker proportional to its speed, none above ``cap`` (a worker can hold each
    chunk once): water-filling, the capped workers' excess shared by the others in
    proportion to their speeds. Shape (m,), sums to ``total`` (``total <= m * cap``)."""
    w = np.zeros_like(speeds)
    free = np.ones(speeds.size, dtype=bool)
    left = total
    while free.any():
        share = left * speeds / speeds[free].sum()
        over = free & (share >= cap)
        if not over.any():
            w[free] = share[free]
            break
        w[over] = cap
        free &= ~over
        left = total - w[~free].sum()
    return w


def speed_aware_assignment(m: int, delta: int, speeds: np.ndarray | None,
                           sizes: np.ndarray | None = None) -> np.ndarray:
    """Assignment giving faster workers more work, every chunk on ``delta`` workers.

    Parameters
    ----------
    m, delta : int
        Workers (= chunks) and replication, ``1 <= delta <= m``.
    speeds : ndarray, shape (m,), or None
        Relative worker speeds (None: all 1).
    sizes : ndarray, shape (m,), or None
        Relative chunk sizes (None: all 1).

    Returns
    -------
    A : ndarray of bool, shape (m, m)
        ``A.sum(axis=1) == delta`` for every chunk (module docstring: the construction).
    """
    if not 1 <= delta <= m:
        raise CodingError(f"delta={delta} is out of range: expected 1..{m}")
    s = np.ones(m) if speeds is None else np.asarray(speeds, dtype=np.float64)
    z = _norm_sizes(sizes, m)
    if s.shape != (m,) or z.shape != (m,):
        raise CodingError(f"speeds {s.shape} and sizes {z.shape}: expected ({m},) each")
    if np.all(s == s[0]) and np.all(z == z[0]):
        return cyclic_assignment(m, delta)
    walk = np.tile(np.arange(m), delta)  # element t is chunk t mod m
    work = z[walk]
    targets = np.concatenate([[0.0], np.cumsum(_capped_shares(s, delta * float(z.sum()),
                                                                 float(z.sum())))])
    b = _cuts(work, targets, m)
    A = np.zeros((m, m), dtype=bool)
    for j in range(m):
        A[walk[b[j]:b[j + 1]], j] = True
    return A


def cover_time(A: np.ndarray, orders: Sequence[np.ndarray], n_parts: int,
               speeds: np.ndarray | None, sizes: np.ndarray | None = None) -> float:
    """Expected time by which every chunk has ``n_parts`` holders through it, when worker
    ``j`` takes exactly ``z_i / s_j`` on chunk ``i`` (no noise).

    Parameters
    ----------
    A : ndarray of bool, shape (N, m)
    orders : list of m int arrays
    n_parts : int
    speeds : ndarray (m,) or None
    sizes : ndarray (N,) or None

    Returns
    -------
    float
    """
    N, m = A.shape
    s = np.ones(m) if speeds is None else np.asarray(speeds, dtype=np.float64)
    z = _norm_sizes(sizes, N)
    fin = np.full((N, m), np.inf)
    for j, o in enumerate(orders):
        o = np.asarray(o, dtype=np.int64)
        fin[o, j] = np.cumsum(z[o]) / s[j]
    fin.sort(axis=1)
    return float(fin[:, n_parts - 1].max())


def speed_aware_order(A: np.ndarray, n_parts: int, speeds: np.ndarray | None,
                      sizes: np.ndarray | None = None) -> list[np.ndarray]:
    """List-scheduling order for heterogeneous workers (module docstring).

    Returns
    -------
    orders : list of m int64 arrays
    """
    N, m = A.shape
    s = np.ones(m) if speeds is None else np.asarray(speeds, dtype=np.float64)
    z = _norm_sizes(sizes, N)
    left = [set(np.flatnonzero(A[:, j]).tolist()) for j in range(m)]
    planned = [0] * N                      # holders already scheduled to compute chunk i
    cover: list[list[float]] = [[] for _ in range(N)]  # their expected finish times
    orders: list[list[int]] = [[] for _ in range(m)]
    heap = [(0.0, j) for j in range(m) if left[j]]
    heapq.heapify(heap)
    while heap:
        t, j = heapq.heappop(heap)

        def key(i: int) -> tuple[int, float, int]:
            ci = sorted(cover[i])
            ell_th = ci[n_parts - 1] if len(ci) >= n_parts else math.inf
            return planned[i], -ell_th, i

        i = min(left[j], key=key)
        left[j].discard(i)
        done = t + float(z[i]) / float(s[j])
        planned[i] += 1
        cover[i].append(done)
        orders[j].append(i)
        if left[j]:
            heapq.heappush(heap, (done, j))
    return validate_orders(A, orders)


def hetero_order(A: np.ndarray, n_parts: int, rng: np.random.Generator,
                 speeds: np.ndarray | None, sizes: np.ndarray | None = None
                 ) -> list[np.ndarray]:
    """``ordering="optimal"`` on a cluster: the static optimum (:func:`optimal_order`) when
    speeds and sizes are uniform (the paper's order, bit for bit), else the better of it and
    :func:`speed_aware_order` by :func:`cover_time` (the static optimum on a tie).

    Returns
    -------
    orders : list of m int64 arrays
    """
    static = optimal_order(A, n_parts, rng)
    uniform_s = speeds is None or bool(np.all(speeds == speeds[0]))
    uniform_z = sizes is None or bool(np.all(sizes == sizes[0]))
    if uniform_s and uniform_z:
        return static
    cand = speed_aware_order(A, n_parts, speeds, sizes)
    if cover_time(A, cand, n_parts, speeds, sizes) < cover_time(A, static, n_parts, speeds,
                                                                 sizes):
        return cand
    return static


def loads_work(A: np.ndarray, sizes: np.ndarray | None = None) -> np.ndarray:
    """Each worker's work ``Σ_{i held} z_i`` (sizes normalised to mean 1): shape (m,)."""
    z = _norm_sizes(sizes, A.shape[0])
    return np.asarray(z @ A.astype(np.float64))
