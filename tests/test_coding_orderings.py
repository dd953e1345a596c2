"""Q_max closed form vs brute force, the spec's reference values, and ordering quality."""

from __future__ import annotations

import numpy as np
import pytest

from aiogc.coding import (
    cyclic_assignment,
    fractional_repetition_assignment,
    natural_order,
    optimal_order,
    q_max,
    q_max_bruteforce,
    random_order,
    regular_assignment,
)
from aiogc.errors import CodingError

REFERENCE = {
    (5, 3): [10, 13, 15],
    (20, 4): [71, 75, 78, 80],
    (20, 6): [100, 106, 111, 115, 118, 120],
}


@pytest.mark.parametrize(("m", "delta"), sorted(REFERENCE))
def test_reference_values_cyclic_natural(m: int, delta: int) -> None:
    A = cyclic_assignment(m, delta)
    got = [q_max(A, natural_order(A), ell) for ell in range(1, delta + 1)]
    assert got == REFERENCE[(m, delta)]


@pytest.mark.parametrize(("m", "delta"), [(20, 4), (20, 6)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_values_regular_optimal(m: int, delta: int, seed: int) -> None:
    A = regular_assignment(m, delta, np.random.default_rng(seed))
    opt = optimal_order(A, rng=np.random.default_rng(seed))
    nat = natural_order(A)
    got = [q_max(A, opt, ell) for ell in range(1, delta + 1)]
    assert got == REFERENCE[(m, delta)]
    # index order on a random regular graph is not a proper colouring: measurably worse
    assert sum(q_max(A, nat, ell) for ell in range(1, delta + 1)) > sum(got)


def _small_cases() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    cases = [
        ("cyc5-3", cyclic_assignment(5, 3)),
        ("cyc6-2", cyclic_assignment(6, 2)),
        ("cyc6-3", cyclic_assignment(6, 3)),
        ("fr6-2", fractional_repetition_assignment(6, 2)),
        ("reg6-3", regular_assignment(6, 3, rng)),
        ("reg7-2", regular_assignment(7, 2, rng)),
    ]
    M = np.array([[1, 1, 0, 0, 1], [0, 1, 1, 0, 0], [1, 0, 1, 1, 0], [0, 0, 0, 1, 1]], bool)
    cases.append(("irregular", M))
    return cases


@pytest.mark.parametrize(
    ("label", "A"), _small_cases(), ids=lambda x: x if isinstance(x, str) else ""
)
def test_closed_form_equals_bruteforce(label: str, A: np.ndarray) -> None:
    rng = np.random.default_rng(3)
    lo = int(A.sum(axis=1).min())
    for orders in (natural_order(A), random_order(A, rng), random_order(A, rng)):
        for ell in range(1, lo + 1):
            assert q_max(A, orders, ell) == q_max_bruteforce(A, orders, ell), (label, ell)


@pytest.mark.parametrize(
    ("label", "A"), _small_cases(), ids=lambda x: x if isinstance(x, str) else ""
)
def test_optimal_never_worse(label: str, A: np.ndarray) -> None:
    rng = np.random.default_rng(5)
    lo = int(A.sum(axis=1).min())
    for ell in range(1, lo + 1):
        opt = q_max(A, optimal_order(A, ell, np.random.default_rng(1)), ell)
        assert opt <= q_max(A, natural_order(A), ell)
        for _ in range(5):
            assert opt <= q_max(A, random_order(A, rng), ell)


def test_optimal_is_exhaustive_minimum_on_tiny_regular() -> None:
    import itertools

    A = regular_assignment(5, 3, np.random.default_rng(11))
    chunks = [np.flatnonzero(A[:, j]) for j in range(5)]
    best = {ell: 10**9 for ell in (1, 2, 3)}
    for perms in itertools.product(*(list(itertools.permutations(c)) for c in chunks[:4])):
        orders = [np.array(p) for p in perms] + [chunks[4]]
        for ell in best:
            best[ell] = min(best[ell], q_max(A, orders, ell))
    opt = optimal_order(A)
    assert [q_max(A, opt, ell) for ell in (1, 2, 3)] == [best[1], best[2], best[3]]


def test_n_parts_out_of_range() -> None:
    A = cyclic_assignment(5, 3)
    with pytest.raises(CodingError, match="n_parts=4"):
        q_max(A, natural_order(A), 4)
