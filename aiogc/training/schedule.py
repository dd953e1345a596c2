"""The materialised delay schedule of one run, and its ``delays.csv`` file.

A :class:`DelaySchedule` is what :func:`aiogc.training.delays.materialise` draws from the delay
models up front (or what ``replay:PATH`` reads back): every compute and network delay of the
run, so every scheme in a comparison sees the same stragglers and any run can be replayed. The
invariants of the delays themselves (``>= 0`` or ``+inf``, never NaN) are in
:mod:`aiogc.training.delays`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from aiogc.errors import ConfigError

__all__ = ["CSV_COLUMNS", "DelaySchedule"]

#: Column names of ``delays.csv``, in order.
CSV_COLUMNS: Final = ("round", "worker", "chunk", "compute_s", "network_s")
#: ``format`` of the ``delays.json`` sidecar.
SCHEDULE_FORMAT: Final = "aiogc delay schedule v1"


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=np.float64, copy=True)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class DelaySchedule:
    """A materialised delay schedule: everything a run's delays depend on.

    Attributes
    ----------
    compute_s : numpy.ndarray
        Shape ``(R, m, K)`` float64: seconds for the ``k``-th chunk (by position) worker ``j``
        computes in round ``r``; ``inf`` = never finishes (dead from that position on).
        Read-only.
    network_s : numpy.ndarray
        Shape ``(R, m)`` float64: one-way seconds added to every frame worker ``j`` sends in
        round ``r``. Read-only.
    seed : int
        The seed it was drawn from.
    compute_spec, network_spec : str
        The models' canonical specs.
    """

    compute_s: np.ndarray
    network_s: np.ndarray
    seed: int = 0
    compute_spec: str = "none"
    network_spec: str = "none"

    def __post_init__(self) -> None:
        c = _frozen(self.compute_s)
        n = _frozen(self.network_s)
        if c.ndim != 3 or min(c.shape) < 1:
            raise ConfigError("compute_s", c.shape, "a non-empty (rounds, m, max_chunks) array")
        if n.shape != c.shape[:2]:
            raise ConfigError("network_s", n.shape, f"shape {c.shape[:2]} (rounds, m)")
        for name, a in (("compute_s", c), ("network_s", n)):
            if np.isnan(a).any() or (a < 0).any():
                raise ConfigError(name, "array with NaN or negative entries", ">= 0 or inf")
        object.__setattr__(self, "compute_s", c)
        object.__setattr__(self, "network_s", n)

    @property
    def rounds(self) -> int:
        """Number of rounds R."""
        return int(self.compute_s.shape[0])

    @property
    def m(self) -> int:
        """Number of workers m."""
        return int(self.compute_s.shape[1])

    @property
    def max_chunks(self) -> int:
        """Number of chunk positions K."""
        return int(self.compute_s.shape[2])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DelaySchedule):
            return NotImplemented
        return (
            self.seed == other.seed
            and self.compute_spec == other.compute_spec
            and self.network_spec == other.network_spec
            and np.array_equal(self.compute_s, other.compute_s)
            and np.array_equal(self.network_s, other.network_s)
        )

    __hash__ = None  # type: ignore[assignment]

    def dead(self) -> np.ndarray:
        """Workers dead in each round: bool array of shape ``(R, m)``.

        Dead = first chunk ``inf`` (computes nothing) or network delay ``inf`` (nothing it
        sends ever arrives, e.g. ``--latency fail:...``).
        """
        return np.asarray(np.isinf(self.compute_s[:, :, 0]) | np.isinf(self.network_s))

    def slowest_round_s(self, loads: np.ndarray | None = None, q: float = 99.0) -> float:
        """The ``q``-th percentile over rounds of the slowest worker's whole round (the sum of
        its ``loads[j]`` chunk delays, every position by default); dead positions ignored.
        Seconds; 0 for an empty or all-dead schedule."""
        c = np.where(np.isfinite(self.compute_s), self.compute_s, 0.0)
        if loads is not None:
            keep = np.arange(c.shape[2])[None, :] < np.asarray(loads)[:, None]
            c = c * keep[None, :, :]
        per_round = c.sum(axis=2).max(axis=1) + self.network_s.max(axis=1)
        return float(np.percentile(per_round, q)) if per_round.size else 0.0

    def scaled(self, k: float) -> DelaySchedule:
        """Every delay times ``k`` (time dilation: what the PS sends a run at time scale k;
        ``delays.csv`` keeps the emulated, unscaled schedule). ``k = 1``: self."""
        if k == 1.0:
            return self
        return DelaySchedule(compute_s=self.compute_s * k, network_s=self.network_s * k,
                             seed=self.seed, compute_spec=self.compute_spec,
                             network_spec=self.network_spec)

    def rows(self) -> Iterator[dict[str, float | int]]:
        """Tidy rows, one per (round, worker, chunk), keys :data:`CSV_COLUMNS`."""
        for r in range(self.rounds):
            for j in range(self.m):
                net = float(self.network_s[r, j])
                for k in range(self.max_chunks):
                    yield {
                        "round": r,
                        "worker": j,
                        "chunk": k,
                        "compute_s": float(self.compute_s[r, j, k]),
                        "network_s": net,
                    }

    @staticmethod
    def meta_path(path: str | os.PathLike[str]) -> Path:
        """The metadata sidecar of ``path``: ``delays.csv`` -> ``delays.json`` (``X.json`` ->
        ``X.json.meta.json``, never the file itself)."""
        p = Path(path)
        return p.with_suffix(".json") if p.suffix != ".json" else p.with_name(p.name + ".meta.json")

    def to_csv(self, path: str | os.PathLike[str]) -> None:
        """Write ``delays.csv``: one header line (:data:`CSV_COLUMNS`), then the rows with floats
        in ``repr`` form (exact round trip, ``inf`` allowed) -- a plain CSV
        (``pandas.read_csv`` needs no options) -- and its metadata (format, seed, specs,
        shape) to the sidecar ``delays.json`` (:meth:`meta_path`).

        Files written before the sidecar carry the metadata as ``#`` lines at the top;
        :meth:`from_csv` reads both."""
        meta = {"format": SCHEDULE_FORMAT, "seed": self.seed,
                "compute_spec": self.compute_spec, "network_spec": self.network_spec,
                "shape": [self.rounds, self.m, self.max_chunks], "columns": list(CSV_COLUMNS)}
        self.meta_path(path).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        lines = [",".join(CSV_COLUMNS)]
        comp = self.compute_s.tolist()
        net = self.network_s.tolist()
        for r in range(self.rounds):
            for j in range(self.m):
                n = repr(net[r][j])
                cr = comp[r][j]
                lines.extend(f"{r},{j},{k},{cr[k]!r},{n}" for k in range(self.max_chunks))
        Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")

    @classmethod
    def from_csv(cls, path: str | os.PathLike[str]) -> DelaySchedule:
        """Read a file written by :meth:`to_csv`.

        Every (round, worker, chunk) of the grid ``0..R-1 x 0..m-1 x 0..K-1`` must appear exactly
        once (any order), and ``network_s`` must be the same for all chunks of a (round, worker).
        The metadata comes from the sidecar ``delays.json`` next to it, or from ``#`` header
        lines (the format before the sidecar); neither: seed 0 and specs ``replay:PATH`` /
        ``none``.

        Raises
        ------
        ConfigError
            Field ``"delays_csv"``; the value names the file and line.
        OSError
            The file cannot be read.
        """
        where = str(path)
        meta, data, linenos = _read_schedule_lines(path, where)
        if not meta:
            meta = _read_sidecar(cls.meta_path(path), where)
        table = _numeric_table(data)
        _check_rows(data, linenos, table, where)
        assert table is not None  # _check_rows raised otherwise
        compute, network = _grid(table, where)
        try:
            seed = int(meta.get("seed", "0"))
        except ValueError:
            raise _csv_error(where, 0, f"an integer '# seed=' header, got {meta['seed']!r}"
                             ) from None
        return cls(
            compute_s=compute,
            network_s=network,
            seed=seed,
            compute_spec=meta.get("compute_spec", f"replay:{where}"),
            network_spec=meta.get("network_spec", "none"),
        )


def _read_sidecar(path: Path, where: str) -> dict[str, str]:
    """The sidecar's metadata as the ``#`` headers would give it ({} if there is none)."""
    try:
        meta = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise _csv_error(where, 0, f"a readable JSON sidecar {path.name} ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != SCHEDULE_FORMAT:
        return {}  # some other delays.json: not ours
    return {k: str(meta[k]) for k in ("seed", "compute_spec", "network_spec") if k in meta}


def _csv_error(where: str, line: int, allowed: str) -> ConfigError:
    return ConfigError("delays_csv", f"{where}:{line}", allowed)


def _read_schedule_lines(path: str | os.PathLike[str], where: str
                         ) -> tuple[dict[str, str], list[str], list[int]]:
    """``#`` headers (key=value), data lines and their 1-based line numbers."""
    meta: dict[str, str] = {}
    header_seen = False
    data: list[str] = []
    linenos: list[int] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = raw.strip()
            if line.startswith("#"):
                key, eq, val = line[1:].strip().partition("=")
                if eq:
                    meta[key.strip()] = val.strip()
            elif line and not header_seen:
                if tuple(c.strip() for c in line.split(",")) != CSV_COLUMNS:
                    raise _csv_error(where, lineno, f"header line {','.join(CSV_COLUMNS)}")
                header_seen = True
            elif line:
                data.append(line)
                linenos.append(lineno)
    if not data:
        raise _csv_error(where, 0, "a header line and at least one data row")
    return meta, data, linenos


def _numeric_table(data: list[str]) -> np.ndarray | None:
    """The rows as an (n, 5) float array, or None if numpy's parser refuses them."""
    try:
        # numpy's C parser (correctly rounded, accepts "inf"): ~10x faster than a Python loop
        table = np.loadtxt(data, delimiter=",", dtype=np.float64, ndmin=2)
    except ValueError:
        return None
    return table if table.shape[1] == 5 else None


def _check_rows(data: list[str], linenos: list[int], table: np.ndarray | None,
                where: str) -> None:
    """Raise naming the first bad line (Python parsing only for the suspect lines)."""
    if table is None:
        suspects = list(range(len(data)))
    else:
        ix = table[:, :3]
        good = (
            np.isfinite(ix).all(axis=1)
            & (ix >= 0).all(axis=1)
            & (ix == np.floor(ix)).all(axis=1)
            & (table[:, 3:] >= 0).all(axis=1)  # False for NaN too
        )
        suspects = np.flatnonzero(~good).tolist()
    for t in suspects:
        line = data[t]
        parts = line.split(",")
        if len(parts) != 5:
            raise _csv_error(where, linenos[t], f"5 comma-separated fields, got {line!r}")
        try:
            r, j, k = (int(p) for p in parts[:3])
            c, n = float(parts[3]), float(parts[4])
        except ValueError:
            raise _csv_error(where, linenos[t], f"int,int,int,float,float; got {line!r}"
                             ) from None
        if min(r, j, k) < 0 or math.isnan(c) or math.isnan(n) or c < 0 or n < 0:
            raise _csv_error(where, linenos[t],
                             f"indices >= 0 and delays >= 0 or inf; got {line!r}")
    if table is None:  # every line parsed one by one: numpy refused for another reason
        raise _csv_error(where, 0, "int,int,int,float,float rows")


def _grid(table: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(compute (R, m, K), network (R, m)) from validated rows covering the grid once."""
    idx = table[:, :3].astype(np.int64)
    shape = tuple(int(v) + 1 for v in idx.max(axis=0))
    if table.shape[0] != shape[0] * shape[1] * shape[2]:
        raise _csv_error(where, 0, f"every (round, worker, chunk) of a {shape} grid exactly once")
    flat = np.ravel_multi_index((idx[:, 0], idx[:, 1], idx[:, 2]), shape)
    if np.unique(flat).size != flat.size:
        raise _csv_error(where, 0, "no duplicate (round, worker, chunk) rows")
    compute = np.empty(shape[0] * shape[1] * shape[2])
    network = np.empty_like(compute)
    compute[flat] = table[:, 3]
    network[flat] = table[:, 4]
    network3 = network.reshape(shape)
    if not np.array_equal(network3, network3[:, :, :1].repeat(shape[2], axis=2)):
        raise _csv_error(where, 0, "network_s constant across the chunks of each (round, worker)")
    return compute.reshape(shape), network3[:, :, 0]
