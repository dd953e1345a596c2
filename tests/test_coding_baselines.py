"""Original gradient coding, uncoded, ignore-stragglers and make_scheme.

``test_polynomial_error_growth_record`` prints the table quoted in docs/coding.md
(run with ``pytest -s tests/test_coding_baselines.py -k record``).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from aiogc.coding import (
    IgnoreStragglersScheme,
    OriginalScheme,
    Scheme,
    SchemeChoices,
    UncodedScheme,
    cyclic_assignment,
    fractional_repetition_assignment,
    make_scheme,
    scheme_names,
)
from aiogc.errors import CodingError, ConfigError

SMALL = [
    ("tandon", cyclic_assignment(7, 3), 2, 1),
    ("fr", cyclic_assignment(6, 1), 0, 1),  # identity: FR with groups of 1
    ("fr", fractional_repetition_assignment(6, 2), 2, 1),
    ("polynomial", cyclic_assignment(7, 4), 2, 2),
    ("polynomial", cyclic_assignment(8, 4), 1, 3),
    ("polynomial", cyclic_assignment(6, 3), 0, 3),
]


def _encode_all(sc: OriginalScheme, c: np.ndarray, G: np.ndarray) -> dict[int, np.ndarray]:
    out = {}
    for j in range(sc.m):
        if sc.contributes(j, c):
            out[j] = sc.encode(j, c, G[sc.orders[j]])
    return out


@pytest.mark.parametrize(("construction", "A", "s", "ell"), SMALL)
def test_every_subset_decodes(construction: str, A: np.ndarray, s: int, ell: int) -> None:
    sc = OriginalScheme(A, s, ell, np.random.default_rng(0))
    assert sc.construction == construction and sc.s == s
    m, d = sc.m, 11
    G = np.random.default_rng(1).standard_normal((sc.n_chunks, d))
    truth = G.sum(axis=0)
    for k in (m - s, m):
        for F in itertools.combinations(range(m), k):
            c = np.zeros(m, dtype=int)
            c[list(F)] = sc.loads[list(F)]
            # unfinished workers may have partial progress: it is wasted
            for j in set(range(m)) - set(F):
                c[j] = sc.loads[j] - 1
            assert sc.is_decodable(c)
            r = sc.decode_result(_encode_all(sc, c, G), c, d)
            assert r.exact
            assert np.linalg.norm(r.gradient - truth) / np.linalg.norm(truth) < 1e-9


@pytest.mark.parametrize(("construction", "A", "s", "ell"), SMALL)
def test_approximate_is_least_squares(construction: str, A: np.ndarray, s: int, ell: int) -> None:
    sc = OriginalScheme(A, s, ell, np.random.default_rng(0))
    m, d = sc.m, 6
    G = np.random.default_rng(2).standard_normal((sc.n_chunks, d))
    F = list(range(max(0, m - s - 2)))
    c = np.zeros(m, dtype=int)
    c[F] = sc.loads[F]
    assert not sc.is_decodable(c)
    V = np.full((m, sc.payload_len(d)), np.nan)
    for j, v in _encode_all(sc, c, G).items():
        V[j] = v
    r = sc.decode_result(V, c, d)
    assert np.isfinite(r.gradient).all() and r.n_contributions == len(F)
    # no other combination of the received vectors has a smaller worst-case residual
    assert 0.0 <= r.residual <= 1.0


def test_encode_requires_finished_and_shapes() -> None:
    sc = OriginalScheme(cyclic_assignment(5, 3), 2)
    with pytest.raises(CodingError, match="has not finished"):
        sc.encode(0, [1, 3, 3, 3, 3], np.zeros((3, 4)))
    with pytest.raises(CodingError, match="construction='tandon' needs"):
        OriginalScheme(cyclic_assignment(5, 3), 1, construction="tandon")
    with pytest.raises(CodingError, match="s\\+n_parts=4"):
        OriginalScheme(cyclic_assignment(5, 3), 2, 2)
    assert isinstance(sc, Scheme) and sc.sends_when_done


def test_uncoded_and_ignore_stragglers() -> None:
    G = np.arange(12.0).reshape(4, 3)
    u = UncodedScheme(4)
    c = np.array([1, 1, 1, 0])
    coded = {j: u.encode(j, c, G[[j]]) for j in range(3)}
    r = u.decode_result(coded, c, 3)
    assert not u.is_decodable(c) and not r.exact
    np.testing.assert_allclose(r.gradient, G[:3].sum(axis=0))
    assert r.residual == pytest.approx(np.sqrt(1 / 4))
    ig = IgnoreStragglersScheme(4, 3)
    r = ig.decode_result(coded, c, 3)
    assert ig.is_decodable(c) and not r.exact
    np.testing.assert_allclose(r.gradient, G[:3].sum(axis=0) * 4 / 3)
    full = np.ones(4, dtype=int)
    r = ig.decode_result({j: G[j] for j in range(4)}, full, 3)
    assert r.exact and r.residual == 0.0
    assert u.q_max() == 4 and ig.q_max() == 3


def test_make_scheme() -> None:
    rng = np.random.default_rng(0)
    for name in scheme_names():
        sc = make_scheme(name, m=8, delta=4, n_parts=2, rng=rng)
        assert isinstance(sc, Scheme) and sc.name == name
    p = make_scheme("partial", m=12, delta=3, assignment="regular",
                    choices=SchemeChoices(ordering="random"), rng=rng)
    assert p.n_parts == 1
    o = make_scheme("original", m=8, delta=4, assignment="fr", rng=rng)
    assert isinstance(o, OriginalScheme) and o.construction == "fr" and o.s == 3
    with pytest.raises(ConfigError, match="scheme='bogus'"):
        make_scheme("bogus", m=8, delta=4)
    with pytest.raises(ConfigError, match="n_parts=5"):
        make_scheme("partial", m=8, delta=4, n_parts=5)
    with pytest.raises(ConfigError, match="ordering='sorted'"):
        make_scheme("partial", m=8, delta=4, choices=SchemeChoices(ordering="sorted"))
    with pytest.raises(ConfigError, match="delta=3"):
        make_scheme("partial", m=8, delta=3, assignment="fr")


def _poly_error(m: int, ell: int, s: int, dtype: type) -> tuple[float, float]:
    """Worst relative decode error over 20 random (m-s)-subsets, and the amplification."""
    sc = OriginalScheme(cyclic_assignment(m, s + ell), s, ell)
    rng = np.random.default_rng(m)
    d = 64 * ell
    G: np.ndarray = rng.standard_normal((m, d)).astype(dtype)
    truth = G.astype(np.float64).sum(axis=0)
    worst, amp = 0.0, 0.0
    for _ in range(20):
        F = np.sort(rng.choice(m, m - s, replace=False))
        c = np.zeros(m, dtype=int)
        c[F] = sc.loads[F]
        r = sc.decode_result(_encode_all(sc, c, G), c, d)
        err = np.linalg.norm(r.gradient.astype(np.float64) - truth) / np.linalg.norm(truth)
        worst, amp = max(worst, float(err)), max(amp, r.amplification)
    return worst, amp


def test_polynomial_error_growth_record() -> None:
    """Record (not hide) how Ye-Abbe's Vandermonde decoding degrades with m (ell=2, s=2)."""
    rows = []
    for m in (8, 12, 16, 24, 32, 48):
        e32, amp = _poly_error(m, 2, 2, np.float32)
        e64, _ = _poly_error(m, 2, 2, np.float64)
        rows.append((m, e32, e64, amp))
    print("\n  m | rel.err float32 | rel.err float64 | amplification")
    for m, e32, e64, amp in rows:
        print(f"{m:3d} | {e32:15.2e} | {e64:15.2e} | {amp:13.2e}")
    assert rows[0][2] < 1e-10  # exact in float64 for small m
    assert rows[-1][1] > 100 * rows[0][1]  # and it grows by orders of magnitude with m
    assert rows[-1][3] > 100 * rows[0][3]
