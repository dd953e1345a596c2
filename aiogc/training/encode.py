"""The worker driver's half of encoding: run the worker core's
:class:`~aiogc.core.EncodeVector` work item.

The core decided that the worker sends and with which coefficients; this module does the
numbers: the coded vector of the stored chunk gradients, in the run's payload dtype, rounded
to its 16-bit upload type when ``coded_dtype`` asks for one. Every worker driver (asyncio,
virtual clock) answers the item with ``worker.encode_done(item, encode_vector(item, config))``.

A driver that keeps one process per worker also keeps its chunk gradients in a
:class:`ChunkRows`: one float64 (load, d) array reused every round, each gradient copied into
its row as it is computed (the rows are what the core holds), so that the encode reads the
first ``c`` rows in place instead of stacking the gradients into a fresh (c, d) array (at
d = 10^6 a 24 MB copy and its page faults, on the path from the trigger to the upload).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from aiogc.coding.base import encode_rows
from aiogc.coding.compress import to_coded
from aiogc.config import RunConfig
from aiogc.core import EncodeVector

__all__ = ["ChunkRows", "encode_vector"]


class ChunkRows:
    """One worker's chunk gradients of the current round, in a float64 array reused across
    rounds.

    :meth:`store` copies the gradients of positions ``first, first + 1, ...`` into their rows
    and returns those rows (the same view objects every round), which the driver hands to the
    core (``chunks_done``); the core hands them back in an :class:`EncodeVector`, and
    :meth:`matrix` recognises them and returns the first ``c`` rows as one (c, d) view: the
    values ``np.array(grads, dtype=float64)`` would copy, without the copy.

    A new round overwrites the rows: the core answers an encode item of an earlier round as
    stale, and a driver runs the work items in the order the core queued them.
    """

    def __init__(self) -> None:
        self._array: np.ndarray | None = None  # (rows, d) float64
        self._views: list[np.ndarray] = []  # one persistent view per row

    def store(self, first: int, grads: list[np.ndarray]) -> list[np.ndarray]:
        """Copy ``grads`` (each of shape (d,)) into rows ``first, first + 1, ...``; their
        views, in order. Raises ValueError (naming the position) for a gradient that is not a
        (d,) vector of the same d as the others."""
        if not grads:
            return []
        dim = np.shape(grads[0])
        need = first + len(grads)
        arr = self._array
        if len(dim) != 1 or arr is None or arr.shape[1] != dim[0] or arr.shape[0] < need:
            if len(dim) != 1:
                raise ValueError(f"chunk gradient at position {first} has shape {dim}, "
                                 "expected (d,)")
            grown = np.empty((need, dim[0]), dtype=np.float64)
            if arr is not None and arr.shape[1] == dim[0]:
                grown[:first] = arr[:first]  # the round's rows stored so far
            self._array, arr = grown, grown
            self._views = list(grown)
        views = self._views
        for k, g in enumerate(grads, first):
            if np.shape(g) != dim:
                raise ValueError(f"chunk gradient at position {k} has shape {np.shape(g)}, "
                                 f"expected {dim}")
            views[k][...] = g
        return views[first:need]

    def matrix(self, grads: Sequence[np.ndarray]) -> np.ndarray | None:
        """``grads`` as one (c, d) float64 view when they are rows ``0 .. c-1`` of this store
        (as :meth:`store` returned them), else None."""
        c = len(grads)
        views = self._views
        if c == 0 or c > len(views) or any(
                g is not v for g, v in zip(grads, views[:c], strict=True)):
            return None
        assert self._array is not None
        return self._array[:c]


def encode_vector(item: EncodeVector, config: RunConfig,
                  rows: ChunkRows | None = None) -> np.ndarray:
    """The coded vector ``item`` asks for, ready to upload.

    Parameters
    ----------
    item : EncodeVector
        ``grads``: c chunk gradients of shape (d,), positions 0..c-1 of the worker's order.
    config : RunConfig
        Its ``payload_dtype`` and ``coded_dtype`` (16-bit upload type, or ``"same"``).
    rows : ChunkRows, optional
        The driver's store, when ``item.grads`` are its rows: encoded in place.

    Returns
    -------
    ndarray, shape (p,)
        Contiguous, of ``config.coded_wire_dtype``; never a view of ``rows``.
    """
    X = rows.matrix(item.grads) if rows is not None else None
    if X is None:
        X = np.array(item.grads, dtype=np.float64)  # (c, d): a fresh contiguous copy
    if item.theta is not None:
        # send-when-done: the coefficients do not depend on the state (computed once)
        if item.coef is not None:
            vec = item.coef.dot(X)  # encode_rows' product for ell = 1, no checks
        else:
            vec = encode_rows(item.theta, X, item.scheme.n_parts)
    elif item.fast is not None:
        vec = item.fast(item.worker, item.state, X)
    else:
        vec = item.scheme.encode(item.worker, np.asarray(item.state, dtype=np.int64), X)
    if rows is not None and np.may_share_memory(vec, X):
        vec = vec.copy()  # an encoder that returned a row as is: the next round overwrites it
    dt = config.payload_dtype
    # the encoders' products are fresh, contiguous float64 vectors: converting them only
    # when the payload dtype differs saves a numpy call per vector
    out = vec if vec.dtype is dt and vec.flags.c_contiguous else (
        np.ascontiguousarray(vec, dtype=dt))
    if config.coded_dtype != "same":  # rounded from the run's dtype for the upload
        out = to_coded(out, config.coded_dtype)
    return out
