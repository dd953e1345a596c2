"""Assignments, decoding matrices and conditioning checks."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from aiogc.coding import (
    assignment_from_matrix,
    check_conditioning,
    cyclic_assignment,
    decoding_matrix,
    fractional_repetition_assignment,
    regular_assignment,
    validate_assignment,
    worst_condition_number,
)
from aiogc.errors import CodingError
from aiogc.harness.assignment_file import load_assignment


def test_cyclic_layout() -> None:
    A = cyclic_assignment(6, 3)
    for j in range(6):
        assert set(np.flatnonzero(A[:, j])) == {j, (j + 1) % 6, (j + 2) % 6}


@pytest.mark.parametrize(("m", "delta"), [(6, 3), (20, 4), (16, 16), (9, 1)])
def test_regular_is_regular_and_seeded(m: int, delta: int) -> None:
    A = regular_assignment(m, delta, np.random.default_rng(1))
    assert (A.sum(axis=0) == delta).all() and (A.sum(axis=1) == delta).all()
    assert np.array_equal(A, regular_assignment(m, delta, np.random.default_rng(1)))


def test_fr_and_errors() -> None:
    A = fractional_repetition_assignment(6, 1)
    assert A.sum() == 12
    with pytest.raises(CodingError, match="s\\+1=4 does not divide m=6"):
        fractional_repetition_assignment(6, 3)
    with pytest.raises(CodingError, match="delta=7"):
        cyclic_assignment(6, 7)


def test_validate_rejects_and_warns(tmp_path: object) -> None:
    with pytest.raises(CodingError, match="ndim=1"):
        validate_assignment([1, 0])
    with pytest.raises(CodingError, match="not 0 or 1"):
        validate_assignment([[2, 0], [0, 1]])
    with pytest.raises(CodingError, match="chunk 1 is held by no worker"):
        validate_assignment([[1, 1], [0, 0]])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        validate_assignment([[1, 0], [1, 0]])
    assert any("hold no chunk" in str(x.message) for x in w)
    A = assignment_from_matrix(np.array([[1, 0], [0, 1]]))
    assert A.dtype == bool


def test_load_csv_and_npy(tmp_path) -> None:  # type: ignore[no-untyped-def]
    A = cyclic_assignment(5, 2)
    np.save(tmp_path / "a.npy", A)
    np.savetxt(tmp_path / "a.csv", A.astype(int), delimiter=",", fmt="%d")
    assert np.array_equal(load_assignment(tmp_path / "a.npy"), A)
    assert np.array_equal(load_assignment(tmp_path / "a.csv"), A)
    with pytest.raises(CodingError, match="suffix"):
        load_assignment(tmp_path / "a.txt")


@pytest.mark.parametrize(("m", "delta", "ell"), [(20, 6, 3), (40, 8, 4)])
def test_frame_beats_gaussian(m: int, delta: int, ell: int) -> None:
    A = cyclic_assignment(m, delta)
    F = decoding_matrix(A, ell, "frame", np.random.default_rng(0))
    G = decoding_matrix(A, ell, "gaussian", np.random.default_rng(0))
    cf, cg = worst_condition_number(A, F, ell), worst_condition_number(A, G, ell)
    assert cf < 60 and cf < cg / 10, (cf, cg)


def test_ones_and_conditioning_check() -> None:
    A = cyclic_assignment(8, 3)
    assert np.array_equal(decoding_matrix(A, 1, "gaussian"), np.ones((1, 8)))
    with pytest.raises(CodingError, match="n_parts=2"):
        decoding_matrix(A, 2, "ones")
    B = decoding_matrix(A, 2)
    pred = check_conditioning(A, B, 2, np.float32, tol=1e-3)
    assert 0 < pred < 1e-3
    bad = np.ones((2, 8))
    with pytest.raises(CodingError, match="ill-conditioned"):
        check_conditioning(A, bad, 2, np.float64, tol=1e-3)
    with pytest.warns(UserWarning, match="ill-conditioned"):
        check_conditioning(A, bad, 2, np.float64, tol=1e-3, on_fail="warn")
