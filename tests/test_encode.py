"""The worker driver's encode: ChunkRows keeps a round's chunk gradients in one reused array,
and encoding from its rows gives the same vector, bit for bit, as stacking the gradients."""

from __future__ import annotations

import numpy as np
import pytest

from aiogc.config import RunConfig
from aiogc.core import EncodeVector
from aiogc.training.encode import ChunkRows, encode_vector


def _grads(n: int, d: int, seed: int, dtype: type = np.float64) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(d).astype(dtype) for _ in range(n)]


def test_rows_are_the_same_views_every_round_and_hold_the_values() -> None:
    rows = ChunkRows()
    rows.store(0, _grads(2, 7, 0))
    rows.store(2, _grads(1, 7, 1))  # the first round sizes the array (grown here)
    first = rows.store(0, _grads(3, 7, 5))
    g = _grads(3, 7, 2)
    again = rows.store(0, g[:1]) + rows.store(1, g[1:])  # the next round, other batches
    assert all(a is b for a, b in zip(first, again, strict=True))
    X = rows.matrix(again)
    assert X is not None and X.shape == (3, 7) and X.flags.c_contiguous
    assert np.array_equal(X, np.array(g))
    assert np.shares_memory(X, again[0])  # a view: no copy
    sub = rows.matrix(again[:2])
    assert sub is not None and sub.shape == (2, 7)


def test_matrix_refuses_what_is_not_its_leading_rows() -> None:
    rows = ChunkRows()
    views = rows.store(0, _grads(3, 5, 0))
    assert rows.matrix([]) is None
    assert rows.matrix(views[1:]) is None  # not rows 0 .. c-1
    assert rows.matrix([views[0], views[0].copy()]) is None  # a foreign array
    assert rows.matrix(_grads(2, 5, 1)) is None
    assert ChunkRows().matrix(views) is None  # another store's rows


def test_growing_keeps_the_rows_stored_so_far() -> None:
    rows = ChunkRows()
    g = _grads(4, 6, 3)
    a = rows.store(0, g[:1])
    b = rows.store(1, g[1:])  # more rows than the array had: reallocated
    X = rows.matrix(rows.store(0, [a[0].copy()]) + b)
    assert X is not None and np.array_equal(X, np.array(g))
    wider = rows.store(0, _grads(2, 9, 4))  # another d (a new setup): a new array
    assert wider[0].shape == (9,)


@pytest.mark.parametrize("bad, pos", [([np.zeros(5), np.zeros(4)], 1),
                                      ([np.zeros((5, 1))], 0)])
def test_a_gradient_of_the_wrong_shape_names_its_position(bad: list[np.ndarray],
                                                          pos: int) -> None:
    with pytest.raises(ValueError, match=f"position {pos} has shape"):
        ChunkRows().store(0, bad)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("scheme_name", ["partial", "original"])
def test_encoding_from_the_rows_is_bitwise_the_stacked_encoding(dtype: type,
                                                                scheme_name: str) -> None:
    cfg = RunConfig(scheme=scheme_name, workers=6, delta=2, n_parts=1, dtype="float32", seed=3)
    scheme = cfg.build_scheme()
    load = int(scheme.loads[2])
    rows = ChunkRows()
    for rnd in range(2):
        grads = _grads(load, 1001, 10 + rnd, dtype)
        views = rows.store(0, grads)
        state = list(scheme.loads)
        for fast in (None, getattr(scheme, "encode_trusted", None)):
            items = [EncodeVector(rnd, 0, 2, state, b"", gs, scheme, None, None, fast, -1)
                     for gs in (grads, views)]
            want = encode_vector(items[0], cfg)
            got = encode_vector(items[1], cfg, rows)
            assert got.dtype == want.dtype == np.float32 and got.flags.c_contiguous
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_an_encoder_returning_a_row_as_is_gets_its_own_copy() -> None:
    """The rows are overwritten next round while the vector may still be unsent."""
    cfg = RunConfig(workers=6, delta=2, dtype="float64", seed=1)
    scheme = cfg.build_scheme()
    first_row = lambda worker, state, X: X[0]  # noqa: E731 (an encoder returning a view)
    rows = ChunkRows()
    g1, g2 = _grads(3, 50, 1), _grads(3, 50, 2)
    v1 = encode_vector(EncodeVector(0, 0, 2, [3] * 6, b"", rows.store(0, g1), scheme, None,
                                    None, first_row, -1), cfg, rows)
    rows.store(0, g2)  # the next round
    assert np.array_equal(v1, g1[0])
