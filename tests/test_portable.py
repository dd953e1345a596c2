"""aiogc.coding.portable: the arithmetic behind every float the scheme digest covers."""

from __future__ import annotations

import numpy as np
import pytest

from aiogc.coding.portable import column_norms, poly, solve

EPS = float(np.finfo(np.float64).eps)


@pytest.mark.parametrize("seed", range(5))
def test_solve_agrees_with_lapack_within_the_condition_number(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 12))
    M = rng.standard_normal((20, k, k))
    b = rng.standard_normal((20, k))
    x = solve(M, b)
    ref = np.linalg.solve(M, b[..., None])[..., 0]
    cond = np.linalg.cond(M)
    # both are backward stable: forward errors within a small multiple of cond * eps
    err = np.linalg.norm(x - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert np.all(err <= 16 * k * cond * EPS), (err, cond)


def test_a_system_solves_to_the_same_bits_whatever_else_is_in_the_batch() -> None:
    rng = np.random.default_rng(3)
    M = rng.standard_normal((6, 5, 5))
    b = rng.standard_normal((6, 5))
    together = solve(M, b)
    for i in range(6):
        assert np.array_equal(solve(M[i:i + 1], b[i:i + 1])[0], together[i])


def test_pivoting_solves_a_system_with_a_zero_leading_entry() -> None:
    M = np.array([[[0.0, 1.0], [1.0, 0.0]]])
    assert np.array_equal(solve(M, np.array([[2.0, 3.0]])), np.array([[3.0, 2.0]]))


def test_singular_and_misshapen_systems_are_refused() -> None:
    with pytest.raises(np.linalg.LinAlgError):
        solve(np.zeros((1, 2, 2)), np.ones((1, 2)))
    with pytest.raises(ValueError, match=r"expected \(1, 2, 2\)"):
        solve(np.ones((1, 3, 3)), np.ones((1, 2)))


def test_column_norms_are_the_2_norms() -> None:
    F = np.random.default_rng(0).standard_normal((4, 9))
    np.testing.assert_allclose(column_norms(F), np.linalg.norm(F, axis=0), rtol=4 * EPS)


def test_poly_is_numpys_poly() -> None:
    roots = np.random.default_rng(1).uniform(-1, 1, 7)
    np.testing.assert_allclose(poly(roots), np.poly(roots), rtol=0, atol=64 * EPS)
    assert np.array_equal(poly(np.array([])), np.ones(1))
