"""Property tests of the partial-straggler scheme (aiogc/coding/partial.py)."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiogc.coding import (
    PartialScheme,
    Scheme,
    cyclic_assignment,
    fractional_repetition_assignment,
    regular_assignment,
)
from aiogc.errors import CodingError

SETTINGS = settings(derandomize=True, max_examples=40, deadline=None)


@cache
def _scheme(kind: str, ell: int) -> PartialScheme:
    if kind == "cyclic":
        A = cyclic_assignment(8, 4)
    elif kind == "fr":
        A = fractional_repetition_assignment(8, 3)
    else:
        A = regular_assignment(9, 4, np.random.default_rng(2))
    return PartialScheme(A, ell, rng=np.random.default_rng(ell))


CASES = [(k, ell) for k in ("cyclic", "fr", "regular") for ell in range(1, 5)]


def _projection_sum(s: PartialScheme, c: np.ndarray, G: np.ndarray, d: int) -> np.ndarray:
    """sum_i (B_U pinv(B_U)) applied blockwise to the zero-padded g_i (reference, numpy pinv)."""
    ell = s.n_parts
    p = s.payload_len(d)
    out = np.zeros((ell, p))
    pos = np.zeros(s.A.shape, dtype=int)
    for j, o in enumerate(s.orders):
        pos[o, j] = np.arange(1, len(o) + 1)
    for i in range(s.n_chunks):
        U = [j for j in range(s.m) if 0 < pos[i, j] <= c[j]]
        if not U:
            continue
        BU = s.B[:, U]
        P = BU @ np.linalg.pinv(BU)
        gi = np.zeros(ell * p)
        gi[:d] = G[i]
        out += P @ gi.reshape(ell, p)
    return out.reshape(-1)[:d]


def _run(s: PartialScheme, c: np.ndarray, G: np.ndarray, stacked: bool) -> object:
    d = G.shape[1]
    coded = {}
    for j in range(s.m):
        if s.contributes(j, c):
            rows = np.full(
                (s.loads[j] + 2, d), np.nan, dtype=G.dtype
            )  # NaN beyond c_j: must never be read
            rows[: c[j]] = G[s.orders[j][: c[j]]]
            coded[j] = s.encode(j, c, rows)
            assert np.isfinite(coded[j]).all()
    if not stacked:
        return s.decode_result(coded, c, d)
    V = np.full((s.m, s.payload_len(d)), np.nan, dtype=G.dtype)  # non-contributing rows are garbage
    for j, v in coded.items():
        V[j] = v
    return s.decode_result(V, c, d)


@pytest.mark.parametrize(("kind", "ell"), CASES)
@SETTINGS
@given(data=st.data())
def test_decode_exact_or_projection(kind: str, ell: int, data: st.DataObject) -> None:
    s = _scheme(kind, ell)
    c = np.array([data.draw(st.integers(0, int(x))) for x in s.loads])
    d = data.draw(st.integers(1, 9))
    stacked = data.draw(st.booleans())
    G = np.random.default_rng(int(c.sum()) * 31 + d).standard_normal((s.n_chunks, d))
    r = _run(s, c, G, stacked)
    truth = G.sum(axis=0)
    assert r.gradient.shape == (d,)  # type: ignore[attr-defined]
    if s.is_decodable(c):
        assert r.exact and r.residual == 0.0  # type: ignore[attr-defined]
        err = np.linalg.norm(r.gradient - truth) / np.linalg.norm(truth)  # type: ignore[attr-defined]
        assert err <= 1e-12
    else:
        assert not r.exact and r.residual > 0  # type: ignore[attr-defined]
        ref = _projection_sum(s, c, G, d)
        np.testing.assert_allclose(r.gradient, ref, rtol=1e-9, atol=1e-9)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("kind", "ell"), CASES)
def test_trigger_state_and_float32(kind: str, ell: int) -> None:
    s = _scheme(kind, ell)
    rng = np.random.default_rng(0)
    G = rng.standard_normal((s.n_chunks, 101)).astype(np.float32)
    for _ in range(10):  # random completion orders, stop at the exact trigger
        c = np.zeros(s.m, dtype=int)
        while not s.is_decodable(c):
            j = rng.choice(np.flatnonzero(c < s.loads))
            c[j] += 1
        r = _run(s, c, G, stacked=True)
        assert r.gradient.dtype == np.float32  # type: ignore[attr-defined]
        truth = G.astype(np.float64).sum(axis=0)
        err = np.linalg.norm(r.gradient - truth) / np.linalg.norm(truth)  # type: ignore[attr-defined]
        assert err <= 50 * r.amplification * np.finfo(np.float32).eps  # type: ignore[attr-defined]


def test_all_coefficients_match_and_min_norm() -> None:
    s = _scheme("regular", 3)
    c = np.array([2, 3, 1, 4, 0, 2, 3, 1, 2])
    allc = s.all_coefficients(c)
    for j in range(s.m):
        np.testing.assert_allclose(allc[j], s.coefficients(j, c), rtol=1e-13, atol=1e-13)
        assert allc[j].shape == (c[j], 3)


def test_residual_formula_and_empty_state() -> None:
    s = _scheme("cyclic", 2)
    c = np.zeros(s.m, dtype=int)
    r = s.decode_result({}, c, 5)
    assert r.residual == pytest.approx(1.0) and r.n_contributions == 0
    assert np.array_equal(r.gradient, np.zeros(5))


def test_interface_and_errors() -> None:
    s = _scheme("cyclic", 2)
    assert isinstance(s, Scheme) and not s.sends_when_done
    assert s.payload_len(7) == 4 and s.q_max() > 0
    with pytest.raises(CodingError, match="state\\[0\\]=9"):
        s.coverage([9] + [0] * 7)
    with pytest.raises(CodingError, match="shape"):
        s.coverage([0, 0])
    with pytest.raises(CodingError, match="worker=8"):
        s.contributes(8, [0] * 8)
    with pytest.raises(CodingError, match="n_parts=5"):
        PartialScheme(cyclic_assignment(8, 4), 5)
    c = np.full(8, 2)
    with pytest.raises(CodingError, match="no coded vector from worker 0"):
        s.decode({}, c, 4)
    with pytest.raises(CodingError, match="expected \\(8, 2\\)"):
        s.decode(np.zeros((8, 3)), c, 4)
